"""Scaled dot-product attention: the composite op and every fused kernel.

MACs = B*H*Lq*Lk*(E + Ev) with H the query heads (grouped-query attention counts with
the query heads); masks, dropout and ``is_causal`` do not change the count, and the
softmax is part of the kernel, not counted separately, so FLOPs = 2 * MACs exactly as
``torch.utils.flop_counter`` counts SDPA. A fused backward kernel (flash, efficient,
cuDNN, CPU flash) keeps no attention matrix, so it recomputes the scores QK^T and then
runs dP, dV, dQ and dK: B*H*Lq*Lk*(3E + 2Ev) MACs, 2.5x the forward when E = Ev
(torch's ``sdpa_backward_flop_count``). The math path's backward is the backward of its
decomposed bmm ops (4 matmuls, 2x the forward), recorded op by op.
"""

from __future__ import annotations

from math import prod
from typing import Callable, Tuple

from ..registry import HandlerRegistry
from ..types import Cost, OpCall, TensorMeta
from .matmul import linear_macs
from .norm import normalize_flops
from .pointwise import GELU, elementwise_flops

__all__ = ["register", "sdpa_macs", "sdpa_backward_macs"]

Dims = Tuple[int, int, int, int, int]  # batch x query heads, Lq, Lk, E, Ev


def sdpa_macs(batch_heads: int, lq: int, lk: int, e: int, ev: int) -> int:
    """QK^T (Lq x E x Lk) plus PV (Lq x Lk x Ev) per batch x query head."""
    return batch_heads * lq * lk * (e + ev)


def sdpa_backward_macs(batch_heads: int, lq: int, lk: int, e: int, ev: int) -> int:
    """A fused backward kernel: recomputed scores QK^T (E), dP = dO V^T (Ev), dV = P^T dO
    (Ev), dQ = dS K (E), dK = dS^T Q (E), each Lq x Lk per batch x query head."""
    return batch_heads * lq * lk * (3 * e + 2 * ev)


def _bhsd(call: OpCall) -> Dims:
    # query (*, H, Lq, E), key (*, Hkv, Lk, E), value (*, Hkv, Lk, Ev)
    q, k, v = call.tensor("query").shape, call.tensor("key").shape, call.tensor("value").shape
    return prod(q[:-2]), q[-2], k[-2], q[-1], v[-1]


def _bshd(call: OpCall) -> Dims:
    """The flash/efficient kernels' (B, L, H, E) layout; a packed varlen call
    ((total, H, E) with cumulative lengths) is counted as total_q x max_k per head,
    an upper bound since the sequence lengths are tensor data."""
    q, k, v = call.tensor("query").shape, call.tensor("key").shape, call.tensor("value").shape
    if len(q) == 3:
        max_k = call.arg("max_k") or call.arg("max_seqlen_k") or call.arg("max_seqlen_batch_k") or k[0]
        return q[1], q[0], int(max_k), q[2], v[2]
    return q[0] * q[2], q[1], k[1], q[3], v[3]


def _handler(dims: Callable[[OpCall], Dims], macs: Callable[..., int]) -> Callable[[OpCall], Cost]:
    def handler(call: OpCall) -> Cost:
        return Cost.from_macs(macs(*dims(call)))

    return handler


_forward_bhsd = _handler(_bhsd, sdpa_macs)
_forward_bshd = _handler(_bshd, sdpa_macs)
_backward_bhsd = _handler(_bhsd, sdpa_backward_macs)
_backward_bshd = _handler(_bshd, sdpa_backward_macs)


def _mha_core(x: TensorMeta, kv_len: int, embed_dim: int, heads: int) -> Cost:
    """q/k/v projections, attention, output projection of a fused MHA kernel. Its biases
    are not counted, as for the ``aten::linear`` calls of MHA's composite path (which
    dispatch and jit-with-grad record), so both paths cost the same."""
    rows, kv_rows = x.numel // embed_dim, (x.numel // embed_dim // x.shape[-2]) * kv_len
    macs = linear_macs((rows, embed_dim), (embed_dim, embed_dim))
    macs += 2 * linear_macs((kv_rows, embed_dim), (embed_dim, embed_dim))
    batch = x.numel // (x.shape[-2] * embed_dim)
    head_dim = embed_dim // heads
    macs += sdpa_macs(batch * heads, x.shape[-2], kv_len, head_dim, head_dim)
    macs += linear_macs((rows, embed_dim), (embed_dim, embed_dim))
    return Cost.from_macs(macs)


def _native_mha(call: OpCall) -> Cost:
    q, k = call.tensor("query"), call.tensor("key")
    return _mha_core(q, k.shape[-2], int(call.arg("embed_dim")), int(call.arg("num_head")))


def _encoder_layer(call: OpCall) -> Cost:
    """The fused nn.TransformerEncoderLayer: attention block, two residual adds, two layer
    norms (with affine), the feed-forward linears and their activation -- the same
    formulas as the ops it decomposes into."""
    x = call.tensor("src")
    e = int(call.arg("embed_dim"))
    rows = x.numel // e
    ffn = call.tensor("ffn_weight_1").shape[0]
    cost = _mha_core(x, x.shape[-2], e, int(call.arg("num_heads")))
    cost += Cost.from_macs(linear_macs((rows, e), (ffn, e)) + linear_macs((rows, ffn), (e, ffn)))
    act = GELU["none"] if call.arg("use_gelu") else elementwise_flops("aten::relu", 1)
    residual = 2 * elementwise_flops("aten::add", x.numel)
    norms = 2 * normalize_flops(x.numel, rows, True, True, True)
    return cost + Cost.from_flops(act * rows * ffn + residual + norms)


def register(registry: HandlerRegistry) -> None:
    registry.register("aten::_native_multi_head_attention", _native_mha)
    registry.register("aten::_transformer_encoder_layer_fwd", _encoder_layer)
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
