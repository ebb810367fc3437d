"""plan() against a real training step: the same tiny LLaMA run for real by 2 gloo
processes on CPU (FSDP2, then TP), rank 0 watched by torch's CommDebugMode and
MemTracker and by the collectives' real tensors. The 4-process 2-D case is
benchmarks/bench_plan_gloo.py."""

from __future__ import annotations

from typing import Any, Dict

import pytest

pytest.importorskip("transformers")
import torch.distributed as dist

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

import _plan_gloo as gloo

import flopcount

pytestmark = pytest.mark.serial  # real gloo ranks: processes of their own, bounded by wall-clock timeouts

#: CommDebugMode's op names -> plan()'s collective kinds
KIND = {
    "c10d._allgather_base_": "all_gather",
    "c10d._reduce_scatter_base_": "reduce_scatter",
    "c10d_functional.all_reduce": "all_reduce",
    "_c10d_functional.all_reduce": "all_reduce",
}


@pytest.fixture(scope="module", params=[(2, 1), (1, 2)], ids=["fsdp2", "tp2"])
def pair(request: Any, tmp_path_factory: Any) -> Dict[str, Any]:
    fsdp, tp = request.param
    planned = flopcount.plan(gloo.tiny_llama, (gloo.example_input("llama"),), fsdp=fsdp, tp=tp, on=None)
    real = gloo.run_real_settled(
        "llama", fsdp, tp, str(tmp_path_factory.mktemp("gloo")), planned.peak_bytes, tolerance=0.05, timeout=100
    )
    return {"real": real, "plan": planned}


def test_state_bytes_equal(pair: Dict[str, Any]) -> None:
    assert dict(pair["plan"].state_bytes) == pair["real"]["state_bytes"]


def test_peak_within_5_percent_of_memtracker(pair: Dict[str, Any]) -> None:
    real = pair["real"]["peak"]
    assert abs(pair["plan"].peak_bytes - real) <= 0.05 * real


def test_collective_kinds_and_counts_equal_commdebugmode(pair: Dict[str, Any]) -> None:
    real = {KIND[op]: n for op, n in pair["real"]["comm_counts"].items()}
    planned = {row.kind: row.calls for row in pair["plan"].comm}
    assert planned == real


def test_collective_bytes_equal_the_real_tensors(pair: Dict[str, Any]) -> None:
    real: Dict[str, int] = {}
    for op, size in pair["real"]["collective_bytes"]:
        kind = KIND[op]
        real[kind] = real.get(kind, 0) + size
    assert {row.kind: row.tensor_bytes for row in pair["plan"].comm} == real


def test_flops_equal_a_real_dispatch_count(pair: Dict[str, Any]) -> None:
    assert pair["real"]["unsupported"] == {}
    assert dict(pair["plan"].flops) == pair["real"]["flops"]
    assert dict(pair["plan"].macs) == pair["real"]["macs"]
