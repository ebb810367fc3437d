"""plan() of a model whose forward never calls some of its modules, against a real FSDP2
training step on 2 gloo ranks (tests/plan/_plan_gloo.py: rank 0 watched by CommDebugMode,
FSDPMemTracker and the collectives' real tensors): (a) ``SkippedLayer`` (block 6 of 8 skipped),
(b) ``UnusedHead`` (a pooler the forward never calls). Real FSDP2 trains both: the never-run
block stays sharded and gets no gradient and no reduce-scatter; the pooler is all-gathered with
the root and gets no gradient, and the root's reduce-scatter holds the head's only; AdamW makes
no state for either. Before: (a) plan failed (``'FSDPParam' object has no attribute
'_unsharded_param'``), (b) planned optimizer state (and peak) for the pooler."""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch.distributed as dist

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

import _plan_gloo as gloo

import flopcount

pytestmark = pytest.mark.serial  # real gloo ranks: processes of their own, bounded by wall-clock timeouts

#: CommDebugMode's op names -> plan()'s collective kinds
KIND = {"c10d._allgather_base_": "all_gather", "c10d._reduce_scatter_base_": "reduce_scatter"}


@pytest.mark.parametrize("name", ["skipped_layer", "unused_head"])
def test_fsdp2_plan_equals_a_real_gloo_step(name: str, tmp_path: Any) -> None:
    planned = flopcount.plan(gloo.BUILDERS[name], (gloo.example_input(name),), fsdp=2, on=None)
    real = gloo.run_real_settled(name, 2, 1, str(tmp_path), planned.peak_bytes, tolerance=0.05, timeout=100)
    assert dict(planned.state_bytes) == real["state_bytes"]
    assert {row.kind: row.calls for row in planned.comm} == {KIND[op]: n for op, n in real["comm_counts"].items()}
    moved: Dict[str, int] = {}
    for op, size in real["collective_bytes"]:
        moved[KIND[op]] = moved.get(KIND[op], 0) + size
    assert {row.kind: row.tensor_bytes for row in planned.comm} == moved
    assert abs(planned.peak_bytes - real["peak"]) <= 0.05 * real["peak"]
    assert real["unsupported"] == {}
    assert dict(planned.flops) == real["flops"]
