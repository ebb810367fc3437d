"""Issue #27 item 1: one vocabulary of cost across readings. ``plan`` books a composite call
(``F.linear``, ``F.scaled_dot_product_attention``) as one event priced by its handler, as
``count_flops`` does, instead of the aten ops it runs inside.

Before, on a 7-layer transformers LLaMA (batch 2 x 16 tokens, GQA 4 heads over 2 KV heads), the
plan's forward was 7,680 FLOPs above ``count_flops(backward=True)``'s: the ``aten::where`` that
SDPA runs inside itself to turn the (materialised, boolean) causal mask into an additive one,
``B * 1 * S * S`` elements per layer (7 x 512 = 3,584), which count_flops mutes inside the SDPA
composite, plus the default loss's sum (4,096, below)."""

from __future__ import annotations

import warnings
from typing import Any, Dict

import pytest

pytest.importorskip("transformers")
import _plan_gloo as gloo

import flopcount

L = 7  # tiny_llama7's layers
B, S, V = gloo.BATCH, gloo.SEQ, gloo.VOCAB


@pytest.fixture(scope="module")
def readings(llama7_one_rank_plan: Any) -> Dict[str, Any]:
    x = gloo.example_input("llama7")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # fsdp=1: conftest's session plan (tests/tracers/test_hf_tracing.py reads the same one)
        plans = {1: llama7_one_rank_plan, 2: flopcount.plan(gloo.tiny_llama7, (x,), fsdp=2, on=None)}
        count = flopcount.count_flops(gloo.tiny_llama7(), (x,), backward=True)
    return {"plans": plans, "count": count}


@pytest.mark.parametrize("fsdp", [1, 2])
def test_plan_forward_and_backward_equal_count_flops(readings: Dict[str, Any], fsdp: int) -> None:
    planned, counted = readings["plans"][fsdp], readings["count"].by_phase()
    # The one documented difference (docs/conventions.md, "The default loss"): plan's step calls
    # backward() on the sum of the logits, an aten::sum over B x S x V elements (one add per
    # element summed, flopcount's reduction rule), while count_flops seeds autograd.grad with ones
    # and counts no sum. FSDP shards parameters, not the batch: the per-rank compute is the same.
    loss_sum = B * S * V
    assert planned.flops["forward"] == counted["forward"] + loss_sum
    assert planned.flops["backward"] == counted["backward"]


@pytest.mark.parametrize("fsdp", [1, 2])
def test_plan_books_composites_as_count_flops_does(readings: Dict[str, Any], fsdp: int) -> None:
    planned, counted = readings["plans"][fsdp].by_operator, readings["count"].by_operator()
    # no mask conversion inside SDPA (it was L x B x S x S = 3,584 FLOPs of aten::where)
    assert "aten::where" not in planned
    for op in ("aten::linear", "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu_backward"):
        assert planned[op] == counted[op]
    # the attention composite by hand: QK^T and PV, B x heads x S x S x head_dim MACs each, 2 FLOPs a MAC
    heads, head_dim = 4, 64 // 4
    assert planned["aten::scaled_dot_product_attention"] == L * 2 * 2 * B * heads * S * S * head_dim


def test_under_autocast_the_kernels_dtypes_are_booked() -> None:
    """Under ``autocast=`` a composite is not booked as one call: autocast casts its inputs below
    the torch-function level, so F.linear's arguments still say float32 while the matmul reads
    bfloat16 copies. The aten ops are booked: the casts and the matmul on bfloat16."""
    import sys

    import torch
    from torch import nn

    from flopcount.core.analysis import cost_events
    from flopcount.handlers import default_registry

    batch, d_in, d_out = 4, 16, 8
    events = []
    plan_module = sys.modules["flopcount.planning.plan"]  # the package re-exports plan()
    original = plan_module.cost_events

    def spy(evs: Any, registry: Any) -> Any:
        events.extend(evs)
        return original(evs, registry)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plan_module, "cost_events", spy)
        result = flopcount.plan(lambda: nn.Linear(d_in, d_out, bias=False), (torch.randn(batch, d_in),),
                                optimizer="sgd", autocast="bfloat16", on=None)
    assert "aten::linear" not in result.by_operator
    forward_mm = [e for e in events if e.phase == "forward" and e.call.op == "aten::mm"]
    assert [tuple(m.dtype for m in e.call.args.values() if hasattr(m, "dtype")) for e in forward_mm] == [("bfloat16", "bfloat16")]
    # x (B x d_in) @ W^T (d_in x d_out): B x d_in x d_out MACs, 2 FLOPs each
    assert sum(c.flops for _, c in cost_events(tuple(forward_mm), default_registry()) if c) == 2 * batch * d_in * d_out
