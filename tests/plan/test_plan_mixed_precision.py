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
Before the fix the plan had no ``backend`` and was 3.7-7.1 % under at the short sequences.

A flaky oracle (branch glooflake, 2026-11-27). Once in CI the Mistral 2x1 case at 16 tokens read
1,474,552 real bytes in all three tries against 1,380,216 planned (+6.8 %, the real peak's
categories: a block's unsharded parameters and sharded gradients more, 94,464 B each, a
temporary of 94,464 B and an unsharded gradient of 128 B fewer). Not a moment of the step the plan
misses: a gloo worker thread keeps the collective it ran, and its tensors (the reduce-scatter's
copy of the block's gradients, a block's all-gather buffer), for a moment after marking it
complete; when the rank's main thread has let go of them first, they are freed by the worker,
which first waits for the GIL, and MemTracker books the free ops later, in the next block's
backward. On a loaded machine that moment stretches. With each rank's gloo workers starved of CPU
(:func:`_plan_gloo.starve_gloo_workers`: the rank on one CPU, the workers at nice 19) 5 runs in 6 of
this case read the CI's 1,474,552. The oracle now waits, before each op of the recorded step, until
gloo's workers have let go of what they finished (:class:`_plan_gloo.GlooSettled`: it allocates and
issues nothing): starved, every run equals the plan to the byte, category by category, which is
now asserted."""

from __future__ import annotations

from typing import Any, Dict

import pytest

pytest.importorskip("transformers")
import torch.distributed as dist

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

import _plan_gloo as gloo

import flopcount
from flopcount.planning.plan import _MEMORY_KEYS

pytestmark = pytest.mark.serial  # real gloo ranks: processes of their own, bounded by wall-clock timeouts

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


def under_plan_names(real: Dict[str, Any]) -> Dict[str, int]:
    """The real rank's FSDPMemTracker categories at its peak under plan's names (``Total`` left out)."""
    named: Dict[str, int] = {}
    for category, size in real["peak_categories"].items():
        if category != "Total":
            key = _MEMORY_KEYS[category]
            named[key] = named.get(key, 0) + size
    return named


def test_peak_categories_equal_fsdpmemtracker(pair: Dict[str, Any]) -> None:
    """The same moment of the step, category by category. Before the oracle waited for gloo's
    worker threads (:class:`_plan_gloo.GlooSettled`) about one run in five snapshotted another
    moment, with a block's all-gathered parameters and gradient buckets booked differently."""
    assert under_plan_names(pair["real"]) == dict(pair["plan"].memory)


def test_state_bytes_equal(pair: Dict[str, Any]) -> None:
    assert dict(pair["plan"].state_bytes) == pair["real"]["state_bytes"]


#: cases whose real peak read too high when gloo's worker threads were starved, before the oracle
#: waited for them: (model, fsdp, tp, sequence, mixed precision), the CI's case first
STARVED = [("mistral", 2, 1, 16, "bfloat16"), ("gpt2_tied", 2, 1, gloo.SEQ, None), ("encoder", 2, 1, gloo.SEQ, None)]


@pytest.mark.parametrize(
    ("name", "fsdp", "tp", "seq", "mixed_precision"), STARVED, ids=["mistral-2x1-seq16-bf16", "gpt2_tied-2x1", "encoder-2x1"]
)
def test_peak_equals_fsdpmemtracker_with_gloo_workers_starved(
    name: str, fsdp: int, tp: int, seq: int, mixed_precision: Any, tmp_path: Any
) -> None:
    """Regression (the CI's flake, see the module's docstring): each rank's gloo worker threads
    starved of CPU, as on a loaded machine, and one run, no retry: the real peak and its
    categories equal the plan's to the byte. Before :class:`_plan_gloo.GlooSettled`, starved, the
    Mistral case read 1,474,552 against 1,380,216 in 5 runs of 6, the tied GPT-2 too high in 8 of 8
    and the encoder in 7 of 8; this test failed 8 times in 8 (17 of its 24 cases)."""
    example = gloo.example_input(name, seq)
    planned = flopcount.plan(
        gloo.BUILDERS[name], (example,), fsdp=fsdp, tp=tp, on=None, mixed_precision=mixed_precision, backend="gloo"
    )
    real = gloo.run_real(
        name, fsdp, tp, str(tmp_path), timeout=200, mixed_precision=mixed_precision, seq=seq, starved=True
    )
    assert real["peak"] == planned.peak_bytes
    assert under_plan_names(real) == dict(planned.memory)
