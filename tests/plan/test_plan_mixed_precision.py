"""Plan memory under FSDP2 mixed precision against real gloo steady-state steps (issue #28 item 7).

Oracle: torch's FSDPMemTracker on rank 0 of a real 2- or 4-process gloo run of the same model
(its recorded step is the second one, as the plan's steady state), with FSDP2's
``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``, for a Qwen2- and a
Mistral-style decoder at a short and a long sequence.

Finding: at short sequences the real peak is the moment a block's gradients are reduce-scattered,
and gloo's ``_reduce_scatter_base_`` copies its whole input (the block's float32 gradients: twice
its bfloat16 parameters) into a buffer of its own for the collective's duration. The plan, whose
fake process group (like NCCL) works in place, peaked later, at the next block's bfloat16
all-gather: 6.8 % under for the Qwen2 case (1,192,240 planned against 1,278,896 real bytes; the
difference, 173,056 - 86,528 + 128, is what looked like "one block's bfloat16 parameters").
``plan(backend="gloo")`` holds that copy; the default ``"nccl"`` does not (NCCL reduces in place).
Before the fix the plan had no ``backend`` and was 3.7-7.1 % under at the short sequences."""

from __future__ import annotations

from typing import Any, Dict

import pytest

pytest.importorskip("transformers")
import torch.distributed as dist

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

import _plan_gloo as gloo

import flopcount

pytestmark = pytest.mark.serial  # real gloo ranks: their peak moves when other tests share the cores

#: (model, fsdp, tp, sequence): 2 and 4 processes, both families, a short and a long sequence
CASES = [
    ("qwen2", 2, 1, 16), ("qwen2", 2, 1, 128), ("qwen2", 2, 2, 16),
    ("mistral", 2, 1, 16), ("mistral", 4, 1, 16), ("mistral", 4, 1, 128),
]


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{f}x{t}-seq{s}" for m, f, t, s in CASES])
def pair(request: Any, tmp_path_factory: Any) -> Dict[str, Any]:
    name, fsdp, tp, seq = request.param
    example = gloo.example_input(name, seq)
    planned = flopcount.plan(
        gloo.BUILDERS[name], (example,), fsdp=fsdp, tp=tp, on=None, mixed_precision="bfloat16", backend="gloo"
    )
    real = gloo.run_real_settled(
        name, fsdp, tp, str(tmp_path_factory.mktemp("gloo")), planned.peak_bytes, tolerance=0.005, timeout=200,
        mixed_precision="bfloat16", seq=seq,
    )
    return {"real": real, "plan": planned}


def test_peak_within_half_a_percent_of_fsdpmemtracker(pair: Dict[str, Any]) -> None:
    real = pair["real"]["peak"]
    assert abs(pair["plan"].peak_bytes - real) <= 0.005 * real


# The categories of a real gloo rank's peak are not asserted: FSDPMemTracker's snapshot of them
# is not reproducible run to run (in about one run in five here it comes from another moment of
# the step, with a block's all-gathered parameters and gradient buckets booked differently and a
# different transient sum), depending on when gloo's background thread finishes a collective.
# The peak total (above) and the state bytes (below) are stable and asserted; docs/parallel.md
# shows one run's categories beside the plan's.


def test_state_bytes_equal(pair: Dict[str, Any]) -> None:
    assert dict(pair["plan"].state_bytes) == pair["real"]["state_bytes"]
