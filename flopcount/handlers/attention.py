"""Scaled dot-product attention: the composite op and every fused kernel.

MACs = B*H*Lq*Lk*(E + Ev) with H the query heads (grouped-query attention counts with
the query heads); masks, dropout and ``is_causal`` do not change the count, and the
softmax is part of the kernel, not counted separately, so FLOPs = 2 * MACs exactly as
``torch.utils.flop_counter`` counts SDPA. Backward kernels cost twice the forward MACs
(dQ, dK, dV and dP: four matmuls of the forward's two sizes).
"""

from __future__ import annotations

from math import prod

from ..registry import HandlerRegistry
from ..types import Cost, OpCall

__all__ = ["register", "sdpa_macs"]


def sdpa_macs(batch_heads: int, lq: int, lk: int, e: int, ev: int) -> int:
    """QK^T (Lq x E x Lk) plus PV (Lq x Lk x Ev) per batch x query head."""
    return batch_heads * lq * lk * (e + ev)


def _bhsd(call: OpCall) -> int:
    # query (*, H, Lq, E), key (*, Hkv, Lk, E), value (*, Hkv, Lk, Ev)
    q, k, v = call.tensor("query").shape, call.tensor("key").shape, call.tensor("value").shape
    return sdpa_macs(prod(q[:-2]), q[-2], k[-2], q[-1], v[-1])


def _bshd(call: OpCall) -> int:
    """The flash/efficient kernels' (B, L, H, E) layout; a packed varlen call
    ((total, H, E) with cumulative lengths) is counted as total_q x max_k per head,
    an upper bound since the sequence lengths are tensor data."""
    q, k, v = call.tensor("query").shape, call.tensor("key").shape, call.tensor("value").shape
    if len(q) == 3:
        max_k = call.arg("max_k") or call.arg("max_seqlen_k") or call.arg("max_seqlen_batch_k") or k[0]
        return sdpa_macs(q[1], q[0], int(max_k), q[2], v[2])
    return sdpa_macs(q[0] * q[2], q[1], k[1], q[3], v[3])


def _forward_bhsd(call: OpCall) -> Cost:
    return Cost.from_macs(_bhsd(call))


def _forward_bshd(call: OpCall) -> Cost:
    return Cost.from_macs(_bshd(call))


def _backward_bhsd(call: OpCall) -> Cost:
    return Cost.from_macs(2 * _bhsd(call))


def _backward_bshd(call: OpCall) -> Cost:
    return Cost.from_macs(2 * _bshd(call))


def register(registry: HandlerRegistry) -> None:
    registry.register(
        [
            "aten::scaled_dot_product_attention",
            "aten::_scaled_dot_product_attention_math",
            "aten::_scaled_dot_product_flash_attention",
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::_scaled_dot_product_efficient_attention",
            "aten::_scaled_dot_product_cudnn_attention",
            "aten::_scaled_dot_product_fused_attention_overrideable",
        ],
        _forward_bhsd,
    )
    registry.register(["aten::_flash_attention_forward", "aten::_efficient_attention_forward"], _forward_bshd)
    registry.register(
        [
            "aten::_scaled_dot_product_flash_attention_backward",
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
            "aten::_scaled_dot_product_efficient_attention_backward",
            "aten::_scaled_dot_product_cudnn_attention_backward",
            "aten::_scaled_dot_product_fused_attention_overrideable_backward",
        ],
        _backward_bhsd,
    )
    registry.register(["aten::_flash_attention_backward", "aten::_efficient_attention_backward"], _backward_bshd)
