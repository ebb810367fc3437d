"""GPT-2 (transformers ``Conv1D``) under the built-in Megatron TP plan, against hand-derived
formulas: per-rank block MACs 1/tp, two all-reduces of b·s·h activations per layer each way,
the tensor-parallel shards of the parameters; and the Linear rewrite computing what Conv1D does."""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

import flopcount
from flopcount.errors import UsageError
from flopcount.planning.tp_conv1d import FusedQKV, linear_of

H, HEADS, L, V, B, S = 64, 4, 2, 128, 3, 16
INNER = 4 * H  # GPT-2's n_inner default
#: CommDebugMode's op names -> plan()'s collective kinds
KIND = {
    "c10d._allgather_base_": "all_gather",
    "c10d._reduce_scatter_base_": "reduce_scatter",
    "c10d_functional.all_reduce": "all_reduce",
    "_c10d_functional.all_reduce": "all_reduce",
}


def tiny_gpt2(tied: bool = False, heads: int = HEADS) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=L, n_embd=H, n_head=heads, vocab_size=V, n_positions=64, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=tied,
    )
    return GPT2LMHeadModel(config)


@pytest.fixture(scope="module")
def plans() -> Dict[int, Any]:
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(0))
    return {tp: flopcount.plan(tiny_gpt2, (ids,), tp=tp, on=None) for tp in (1, 2)}


def test_per_rank_block_macs_are_one_over_tp(plans: Dict[int, Any]) -> None:
    tokens = B * S
    linears = tokens * (H * 3 * H + H * H + H * INNER + INNER * H)  # c_attn, attn c_proj, c_fc, mlp c_proj
    attention = 2 * B * HEADS * S * S * (H // HEADS)  # QK^T and attention x V
    head = tokens * H * V
    assert plans[1].macs["forward"] == L * (linears + attention) + head
    assert plans[2].macs["forward"] == L * (linears + attention) // 2 + head
    # backward: the head's two matmuls stay whole on each rank, the blocks' work halves
    assert plans[2].macs["backward"] - 2 * head == (plans[1].macs["backward"] - 2 * head) // 2


def test_two_all_reduces_of_bsh_per_layer_each_way(plans: Dict[int, Any]) -> None:
    rows = [r for r in plans[2].comm if r.kind == "all_reduce"]
    assert len(rows) == 1 and rows[0].dim == "tp"
    assert dict(rows[0].calls_by_phase) == {"forward": 2 * L, "backward": 2 * L}
    assert rows[0].tensor_bytes == 4 * L * B * S * H * 4
    assert not plans[1].comm


def test_parameter_bytes_per_rank_are_the_tp_shards(plans: Dict[int, Any]) -> None:
    # a layer: ln_1, ln_2 (2H each) and the row-parallel biases (H each) are replicated;
    # c_attn (H x 3H + 3H), c_fc (H x 4H + 4H) and the row-parallel weights are split in two
    replicated = 2 * H + 2 * H + H + H
    split = (H * 3 * H + 3 * H) + H * H + (H * INNER + INNER) + INNER * H
    outside = V * H + 64 * H + 2 * H + V * H  # wte, wpe, ln_f, lm_head (untied)
    assert plans[1].state_bytes["parameters"] == 4 * (outside + L * (replicated + split))
    assert plans[2].state_bytes["parameters"] == 4 * (outside + L * (replicated + split // 2))
    assert plans[2].state_bytes["gradients"] == plans[2].state_bytes["parameters"]


def test_the_linear_rewrite_computes_what_conv1d_does() -> None:
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    conv = Conv1D(3 * H, H)
    nn.init.normal_(conv.bias)
    x = torch.randn(B, S, H)
    fused = FusedQKV(*(linear_of(conv, i * H, (i + 1) * H) for i in range(3)))
    torch.testing.assert_close(fused(x), conv(x))
    torch.testing.assert_close(linear_of(conv)(x), x @ conv.weight + conv.bias)


def test_heads_not_divisible_by_tp_is_a_usage_error() -> None:
    ids = torch.randint(0, V, (B, S))
    with pytest.raises(UsageError, match="num_heads divisible by tp=2"):
        flopcount.plan(lambda: tiny_gpt2(heads=1), (ids,), tp=2, on=None)


def test_tied_embedding_and_head_are_one_parameter() -> None:
    """Regression: the fake step's ``to_empty`` untied ``lm_head.weight`` from ``wte.weight``,
    counting it twice (parameters, gradients, optimizer state). Oracle: the live model's
    parameters (deduplicated by ``nn.Module.parameters``)."""
    ids = torch.randint(0, V, (B, S))
    params = 4 * sum(p.numel() for p in tiny_gpt2(tied=True).parameters())
    assert params == 4 * (V * H + 64 * H + 2 * H + L * (12 * H * H + 13 * H))  # wte, wpe, ln_f, the blocks
    planned = flopcount.plan(lambda: tiny_gpt2(tied=True), (ids,), on=None)
    assert planned.state_bytes["parameters"] == planned.state_bytes["gradients"] == params


@pytest.mark.serial  # real gloo ranks (pyproject: markers)
@pytest.mark.parametrize(("name", "fsdp", "tp"), [("gpt2", 1, 2), ("gpt2_tied", 1, 2), ("gpt2_tied", 2, 1)])
def test_a_real_two_process_run_agrees(name: str, fsdp: int, tp: int, tmp_path: Any) -> None:
    """The same GPT-2 run for real by 2 gloo processes (tests/plan/_plan_gloo.py): under TP
    the same output as one process; CommDebugMode's collectives, the real shards, the real
    peak and a real dispatch count equal to the plan's (tied weights too)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    import _plan_gloo as gloo

    planned = flopcount.plan(gloo.BUILDERS[name], (gloo.example_input(name),), fsdp=fsdp, tp=tp, on=None)
    real = gloo.run_real_settled(name, fsdp, tp, str(tmp_path), planned.peak_bytes, tolerance=0.0, timeout=100)
    if tp > 1:
        torch.manual_seed(0)
        whole = gloo.BUILDERS[name]().train()
        with torch.no_grad():
            expected = float(whole(gloo.example_input(name)).logits.double().square().sum())
        assert real["first_output"] == pytest.approx(expected, rel=1e-5)
    assert dict(planned.state_bytes) == real["state_bytes"]
    assert planned.peak_bytes == real["peak"]
    assert {r.kind: r.calls for r in planned.comm} == {KIND[op]: n for op, n in real["comm_counts"].items()}
    real_bytes: Dict[str, int] = {}
    for op, size in real["collective_bytes"]:
        real_bytes[KIND[op]] = real_bytes.get(KIND[op], 0) + size
    assert {r.kind: r.tensor_bytes for r in planned.comm} == real_bytes
    assert real["unsupported"] == {}
    assert (dict(planned.flops), dict(planned.macs)) == (real["flops"], real["macs"])
