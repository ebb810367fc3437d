"""Issue #32: a plan whose repeated layers were replayed (flopcount.step.replay) against the
same step run for real by 2 gloo processes on CPU (FSDP2 over a 7-layer LLaMA): rank 0 watched
by torch's MemTracker, CommDebugMode and the collectives' real tensors, as
tests/plan/test_plan_gloo.py checks a plan traced in full. (FLOPs: the replayed plan's equal the
plan traced in full, tests/plan/test_plan_layers.py, and the real ranks' dispatch count by phase,
now that the fake step takes transformers' real mask path, docs/parallel.md "Known differences".)"""

from __future__ import annotations

from typing import Any, Dict

import pytest

pytest.importorskip("transformers")
import torch.distributed as dist

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

import _plan_gloo as gloo
from _layer_stacks import spy_on_plan_replay
from conftest import REPLAY_TESTS_MIN_LAYERS

import flopcount

pytestmark = pytest.mark.serial  # real gloo ranks: processes of their own, bounded by wall-clock timeouts

KIND = {"c10d._allgather_base_": "all_gather", "c10d._reduce_scatter_base_": "reduce_scatter"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: Any) -> Dict[str, Any]:
    with pytest.MonkeyPatch.context() as patch:
        used = spy_on_plan_replay(patch)
        patch.setattr("flopcount.step.replay.MIN_LAYERS", REPLAY_TESTS_MIN_LAYERS)  # 7 layers replayed
        planned = flopcount.plan(gloo.tiny_llama7, (gloo.example_input("llama7"),), fsdp=2, on=None)
    real = gloo.run_real_settled("llama7", 2, 1, str(tmp_path_factory.mktemp("gloo")), planned.peak_bytes, tolerance=0.05, timeout=100)
    return {"real": real, "plan": planned, "used": used}


def test_the_plan_was_replayed(pair: Dict[str, Any]) -> None:
    assert pair["used"] == [True]


def test_state_bytes_equal(pair: Dict[str, Any]) -> None:
    assert dict(pair["plan"].state_bytes) == pair["real"]["state_bytes"]


def test_peak_within_5_percent_of_memtracker(pair: Dict[str, Any]) -> None:
    real = pair["real"]["peak"]
    assert abs(pair["plan"].peak_bytes - real) <= 0.05 * real


def test_collectives_equal_the_real_ones(pair: Dict[str, Any]) -> None:
    counts = {KIND[op]: n for op, n in pair["real"]["comm_counts"].items()}
    assert {row.kind: row.calls for row in pair["plan"].comm} == counts
    sizes: Dict[str, int] = {}
    for op, size in pair["real"]["collective_bytes"]:
        sizes[KIND[op]] = sizes.get(KIND[op], 0) + size
    assert {row.kind: row.tensor_bytes for row in pair["plan"].comm} == sizes


def test_flops_equal_the_real_ranks(pair: Dict[str, Any]) -> None:
    """docs/parallel.md "Known differences": on real tensors transformers reads
    ``(packed_sequence_mask[:, -1] == 0).all()`` (B elements: 2 FLOPs) and runs SDPA with
    ``is_causal`` and ``enable_gqa``; on fakes it used to materialise the mask and repeat key and
    value to all query heads, whose backward sums the repeats (per layer 2 (key, value) x B x H x S
    x D elements: the plan's backward was 28,672 FLOPs above the real ranks', its forward 2 below:
    this test failed). flopcount/tracers/fake/hf_tracing.py answers transformers' probe as a real
    run does, with the inputs' values."""
    real, planned = pair["real"]["flops"], pair["plan"].flops
    assert {k: planned[k] for k in ("forward", "backward", "optimizer")} == {
        k: real[k] for k in ("forward", "backward", "optimizer")
    }
