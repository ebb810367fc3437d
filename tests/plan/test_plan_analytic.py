"""plan() in the fake world against hand-derived formulas (docs/parallel.md): FSDP2's
all-gathers and reduce-scatters, Megatron TP's all-reduces, per-rank matmul MACs under
TP, the ring wire factors, the step-time bounds; and the process left as found."""

from __future__ import annotations

import math
from typing import Any, Dict

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytest.importorskip("transformers")
import _plan_gloo as gloo

import flopcount
from flopcount.errors import UsageError
from flopcount.planning.result import LINKS, ring_factor
from flopcount.planning.world import PRIVATE, PlanError, private

H, I, HEADS, KV, V, L = 64, 128, 4, 2, gloo.VOCAB, 2
B, S = gloo.BATCH, gloo.SEQ
D = H // HEADS


def _plan(**options: Any) -> Any:
    options.setdefault("on", None)
    return flopcount.plan(gloo.tiny_llama, (gloo.example_input("llama"),), **options)


@pytest.fixture(scope="module")
def plans() -> Dict[str, Any]:
    return {"tp1": _plan(), "fsdp2": _plan(fsdp=2), "tp2": _plan(tp=2), "2d": _plan(fsdp=2, tp=2)}


def _padded_bytes(model: nn.Module, world: int) -> int:
    """FSDP2 pads each parameter's dim 0 to a multiple of the world size (float32)."""
    return sum(math.ceil(p.shape[0] / world) * world * (p.numel() // p.shape[0]) * 4 for p in model.parameters())


def test_fsdp2_gathers_blocks_twice_root_once_and_scatters_every_grad_byte_once(plans: Dict[str, Any]) -> None:
    model = gloo.tiny_llama()
    blocks = sum(_padded_bytes(layer, 2) for layer in model.model.layers)
    root = _padded_bytes(model, 2) - blocks
    result = plans["fsdp2"]
    gather, scatter = result.comm_totals("all_gather", "dp"), result.comm_totals("reduce_scatter", "dp")
    assert (gather.calls, gather.tensor_bytes) == (2 * L + 1, 2 * blocks + root)
    assert (scatter.calls, scatter.tensor_bytes) == (L + 1, blocks + root)
    assert gather.wire_bytes == gather.tensor_bytes // 2  # ring (n-1)/n on 2 ranks


def test_megatron_tp_all_reduces_bsh_twice_per_layer_each_way(plans: Dict[str, Any]) -> None:
    row = plans["tp2"].comm_totals("all_reduce", "tp")
    rows = [r for r in plans["tp2"].comm if r.kind == "all_reduce"]
    assert len(rows) == 1 and dict(rows[0].calls_by_phase) == {"forward": 2 * L, "backward": 2 * L}
    assert row.tensor_bytes == 4 * L * B * S * H * 4
    assert row.wire_bytes == 2 * row.tensor_bytes // 2  # all-reduce 2(n-1)/n


def test_per_rank_block_macs_are_one_over_tp(plans: Dict[str, Any]) -> None:
    tokens = B * S
    linears = tokens * (H * H + 2 * H * KV * D + H * H + 3 * H * I)  # q, k, v, o, gate/up/down per layer
    attention = 2 * B * HEADS * S * S * D  # QK^T and attention x V per layer
    head = tokens * H * V
    one, two = plans["tp1"].macs["forward"], plans["tp2"].macs["forward"]
    assert one == L * (linears + attention) + head
    assert two == L * (linears + attention) // 2 + head


def test_state_bytes_are_the_shards(plans: Dict[str, Any]) -> None:
    model = gloo.tiny_llama()
    params = sum(p.numel() for p in model.parameters()) * 4
    steps = len(list(model.parameters())) * 4  # AdamW's float32 step counter per parameter
    assert plans["tp1"].state_bytes == {"parameters": params, "gradients": params, "optimizer_state": 2 * params + steps}
    sharded = plans["fsdp2"].state_bytes["parameters"]
    assert sharded == sum(min(math.ceil(p.shape[0] / 2), p.shape[0]) * (p.numel() // p.shape[0]) * 4 for p in model.parameters())
    assert plans["fsdp2"].state_bytes["optimizer_state"] == 2 * sharded + steps


def test_step_time_bounds_are_sum_and_max() -> None:
    result = flopcount.plan(
        gloo.tiny_llama, (gloo.example_input("llama"),), fsdp=2, tp=2, on="h100", link=1e9
    )
    bounds = result.step_time
    comm = sum(r.wire_bytes for r in result.comm) / 1e9
    assert bounds.comm_s == pytest.approx(comm)
    assert bounds.no_overlap_s == pytest.approx(bounds.compute_s + comm)
    assert bounds.overlap_s == pytest.approx(max(bounds.compute_s, comm))
    # MFU: model FLOPs (test_plan_utilisation.py derives them); HFU: every FLOP the rank ran
    assert bounds.mfu_overlap == pytest.approx(result.model_flops / (bounds.overlap_s * 67e12))
    assert bounds.hfu_overlap == pytest.approx(result.total_flops / (bounds.overlap_s * 67e12))
    assert bounds.hfu_no_overlap == pytest.approx(result.total_flops / (bounds.no_overlap_s * 67e12))
    # a compute bound is at least the FLOPs at the fastest float32 peak its ops reach: attention's
    # 3xTF32 (494.5 / 3 TFLOP/s, branch fp32math: SDPA's efficient kernel), the rest at FP32, so
    # below FLOPs / 67 TFLOP/s (the tiny model's working sets fit the H100's 50 MB L2, whose
    # bandwidth is unpublished, so no memory term is claimed)
    assert result.total_flops / (494.5e12 / 3) * (1 - 1e-12) <= bounds.compute_s < result.total_flops / 67e12


def test_ring_factors_and_links() -> None:
    assert ring_factor("all_gather", 8) == 7 / 8 and ring_factor("reduce_scatter", 8) == 7 / 8
    assert ring_factor("all_reduce", 8) == 2 * 7 / 8 and ring_factor("all_reduce", 1) == 0
    assert LINKS["nvlink4"] == 450e9
    with pytest.raises(UsageError, match="unknown link"):
        _plan(fsdp=2, link="carrier-pigeon")


def test_no_process_group_left_and_an_existing_one_left_alone(tmp_path: Any) -> None:
    _plan(fsdp=2)
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(UsageError, match="already initialised"):
            _plan(fsdp=2)
        assert dist.is_initialized() and dist.get_world_size() == 1 and dist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()


def test_private_torch_pieces_are_present() -> None:
    """Canary: a torch upgrade that drops one fails here first, naming it."""
    for name in PRIVATE:
        assert private(name) is not None


def test_a_missing_private_piece_is_named(monkeypatch: Any) -> None:
    name, (module, _) = next(iter(PRIVATE.items()))
    monkeypatch.setitem(PRIVATE, name, (module, "NoSuchPiece"))
    with pytest.raises(PlanError, match=f"{module}.NoSuchPiece"):
        _plan(fsdp=2)
    assert not dist.is_initialized()


def test_user_tp_plan_and_encoder() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    x = gloo.example_input("encoder")
    given = flopcount.plan(
        gloo.tiny_encoder, (x,), tp=2, on=None, tp_plan={"layers.*.linear1": ColwiseParallel(), "layers.*.linear2": RowwiseParallel()}
    )
    row = given.comm_totals("all_reduce", "tp")
    assert row.calls == 2 * L and row.tensor_bytes == 2 * L * B * S * 64 * 4  # MLP only: 1 forward + 1 backward
    # the built-in encoder plan (attention too) is tests/plan/test_plan_encoder.py
    with pytest.raises(UsageError, match="built-in tensor-parallel plan"):
        flopcount.plan(lambda: nn.Sequential(nn.Linear(4, 4)), (torch.randn(2, 4),), tp=2, on=None)


def test_bad_arguments() -> None:
    with pytest.raises(UsageError, match="fsdp must be"):
        _plan(fsdp=0)
    with pytest.raises(UsageError, match="build must be a callable"):
        flopcount.plan(nn.Linear(2, 2), (torch.randn(1, 2),))
    with pytest.raises(UsageError, match="unknown part .abacus.; known parts: H100 SXM"):
        _plan(on="abacus")


def test_a_failing_build_or_step_leaves_no_group_and_the_rng_as_found(caplog: Any) -> None:
    x4, x5 = torch.randn(2, 4), torch.randn(2, 5)
    state = torch.get_rng_state()

    def broken() -> nn.Module:
        raise RuntimeError("no weights today")

    with pytest.raises(flopcount.TraceError, match="no weights today"):
        flopcount.plan(broken, (x4,), fsdp=2, on=None)
    assert not dist.is_initialized()
    with pytest.raises(flopcount.TraceError, match="training step failed"):
        flopcount.plan(lambda: nn.Sequential(nn.Linear(4, 4)), (x5,), fsdp=2, on=None)
    assert not dist.is_initialized()
    assert not [r for r in caplog.records if r.name.startswith("torch._subclasses")]  # the library never prints
    _plan(fsdp=2)
    assert torch.equal(torch.get_rng_state(), state)


def test_renderings_agree_with_the_numbers(plans: Dict[str, Any]) -> None:
    import json

    result = plans["2d"]
    data = json.loads(json.dumps(result.to_dict()))
    assert data["total_flops"] == sum(result.flops.values()) == sum(data["flops"].values())
    assert data["world_size"] == 4 and len(data["comm"]) == 3
    assert sum(row["wire_bytes"] for row in data["comm"]) == sum(r.wire_bytes for r in result.comm)
    for text in (result.table(), result.to_markdown()):
        assert "fsdp=2 x tp=2 = 4 ranks" in text and "all_reduce" in text and "reduce_scatter" in text


def test_an_op_without_a_handler_is_reported_never_zero() -> None:
    from flopcount.core.registry import HandlerRegistry

    empty = HandlerRegistry()
    with pytest.warns(flopcount.FlopcountWarning, match="without a handler"):
        result = flopcount.plan(gloo.tiny_encoder, (gloo.example_input("encoder"),), fsdp=2, on=None, registry=empty)
    assert result.unsupported.get("aten::mm", 0) > 0 and result.total_flops == 0
