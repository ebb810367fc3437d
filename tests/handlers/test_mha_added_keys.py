"""``nn.MultiheadAttention`` with ``add_bias_kv`` / ``add_zero_attn`` in cross-attention: the
added key positions join *after* the in-projection (``k = cat([k, bias_k])``, a zero row), so
the key/value projections run over the S given keys and attention over S + added. The
dispatch tracer's handler (``flopcount::multi_head_attention_forward``) projected S + added
rows (+1,024 MACs here for bias_kv, jit had it right), and with a key padding mask and an attn
mask both given it failed on the masks' merge (the masks are padded with the added keys first).
Oracle: ``FlopCounterMode`` live (it counts the projections' ``mm``/``addmm`` and, with
``need_weights=True``, the attention's ``bmm``) and the hand count of docs/conventions.md."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops

E, HEADS, L, S, B = 16, 4, 5, 7, 2
TRACERS = ["auto", "dispatch", "jit"]


class Cross(nn.Module):
    def __init__(self, mha: nn.MultiheadAttention, **kwargs: object) -> None:
        super().__init__()
        self.mha, self.kwargs = mha, kwargs

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.mha(q, k, v, **self.kwargs)[0]


def _live(model: nn.Module, *args: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        model(*args)
    return counter.get_total_flops()


def _hand_macs(added: int) -> int:
    """q, k, v and output projections (rows x E x E each; k and v over the S given keys) +
    QK^T and AV over S + added keys per head (head dim E / HEADS)."""
    projections = (2 * B * L + 2 * B * S) * E * E
    return projections + 2 * B * HEADS * L * (S + added) * (E // HEADS)


def _inputs() -> tuple:
    torch.manual_seed(0)
    return torch.randn(B, L, E), torch.randn(B, S, E), torch.randn(B, S, E)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("bias_kv, zero_attn", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("key_is_value", [True, False])
def test_added_keys_are_not_projected(tracer: str, bias_kv: bool, zero_attn: bool, key_is_value: bool) -> None:
    mha = nn.MultiheadAttention(E, HEADS, batch_first=True, add_bias_kv=bias_kv, add_zero_attn=zero_attn).eval()
    q, k, v = _inputs()
    v = k if key_is_value else v
    added = bias_kv + zero_attn
    with_weights, without = Cross(mha, need_weights=True), Cross(mha, need_weights=False)
    before = snapshot(mha)
    r = count_flops(with_weights, (q, k, v), tracer=tracer)
    assert 2 * r.macs == _live(with_weights, q, k, v) == 2 * _hand_macs(added)
    r = count_flops(without, (q, k, v), tracer=tracer)
    # FlopCounterMode counts no CPU flash attention: the projections only
    assert 2 * r.by_operator("macs")["aten::linear"] == _live(without, q, k, v) == 2 * (2 * B * L + 2 * B * S) * E * E
    assert r.macs == _hand_macs(added)
    assert_same_state(mha, before)


@pytest.mark.parametrize("tracer", TRACERS)
def test_both_masks_with_added_keys(tracer: str) -> None:
    mha = nn.MultiheadAttention(E, HEADS, batch_first=True, add_bias_kv=True, add_zero_attn=True).eval()
    q, k, _ = _inputs()
    padding = torch.zeros(B, S, dtype=torch.bool)
    padding[0, 5:] = True
    mask = torch.zeros(L, S, dtype=torch.bool)
    mask[:, 6] = True
    model = Cross(mha, need_weights=True, key_padding_mask=padding, attn_mask=mask)
    r = count_flops(model, (q, k, k), tracer=tracer)
    assert 2 * r.macs == _live(model, q, k, k) == 2 * _hand_macs(2)
    ops = r.by_operator("flops")
    # each bool mask made float (1 FLOP per element), then merged over (B x heads, L, S + 2)
    assert ops["aten::masked_fill_"] == B * S + L * S
    assert ops["aten::add"] == B * HEADS * L * (S + 2)
