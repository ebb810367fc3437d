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
from typing import Callable, List, Tuple

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import broadcast, maybe_tensor
from flopcount.handlers.matmul import linear_macs
from flopcount.handlers.norm import normalize_flops
from flopcount.handlers.pointwise import DROPOUT, GELU, elementwise_flops
from flopcount.handlers.reduce import mean_flops, softmax_flops
from flopcount.types import Cost, OpCall, TensorMeta

__all__ = ["MHA_OP", "register", "sdpa_macs", "sdpa_backward_macs", "mha_parts"]

Dims = Tuple[int, int, int, int, int]  # batch x query heads, Lq, Lk, E, Ev

#: What the dispatch tracer records for ``F.multi_head_attention_forward`` (no aten op
#: exists for it); its cost is booked under the operations it performs.
MHA_OP = "flopcount::multi_head_attention_forward"


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
    return lambda call: Cost.from_macs(macs(*dims(call)))


_LINEAR, _SDPA = "aten::linear", "aten::scaled_dot_product_attention"


def _linear(rows: int, in_features: int, out_features: int) -> Tuple[str, Cost]:
    return _LINEAR, Cost.from_macs(linear_macs((rows, in_features), (out_features, in_features)))


def _flops(op: str, flops: int) -> Tuple[str, Cost]:
    return op, Cost.from_flops(flops)


def mha_parts(
    lq: int,
    lk: int,
    batch: int,
    embed_dim: int,
    heads: int,
    *,
    projections: int,
    need_weights: bool,
    average_weights: bool,
    masked: bool,
    dropout: bool,
    kv_features: Tuple[int, int] = (0, 0),
    added_keys: int = 0,
) -> List[Tuple[str, Cost]]:
    """The operations ``F.multi_head_attention_forward`` performs, one entry per op, as
    jit records them: the in-projection as ``projections`` linears (1 packed q/k/v, 2 for
    q and packed k/v, 3 separate), then with ``need_weights`` q * scale, QK^T (``baddbmm``
    when a mask is added, else ``bmm``), softmax, dropout, AV ``bmm`` and the mean over
    heads; without it one ``scaled_dot_product_attention``; then the output linear.
    ``kv_features`` are the key and value input features of separate projections (0 =
    ``embed_dim``). ``added_keys`` key positions join after the projection (``bias_k``, a
    zero-attention row): attended to, not projected. Biases are not counted (as for every linear)."""
    rows_q, rows_k = lq * batch, lk * batch
    lk += added_keys
    e = embed_dim
    if projections == 1:
        parts = [_linear(rows_q, e, 3 * e)]
    elif projections == 2:
        parts = [_linear(rows_q, e, e), _linear(rows_k, e, 2 * e)]
    else:
        kdim, vdim = (f or e for f in kv_features)
        parts = [_linear(rows_q, e, e), _linear(rows_k, kdim, e), _linear(rows_k, vdim, e)]
    head_dim = e // heads
    scores = batch * heads * lq * lk
    if need_weights:
        parts.append(_flops("aten::mul", elementwise_flops("aten::mul", rows_q * e)))
        parts.append(("aten::baddbmm" if masked else "aten::bmm", Cost.from_macs(scores * head_dim)))
        parts.append(_flops("aten::softmax", softmax_flops(scores)))
        if dropout:
            parts.append(_flops("aten::dropout", DROPOUT * scores))
        parts.append(("aten::bmm", Cost.from_macs(scores * head_dim)))
    else:
        parts.append((_SDPA, Cost.from_macs(sdpa_macs(batch * heads, lq, lk, head_dim, head_dim))))
    parts.append(_linear(rows_q, e, e))
    if need_weights and average_weights:
        parts.append(_flops("aten::mean", mean_flops(scores, batch * lq * lk)))
    return parts


def _mha_forward(call: OpCall) -> Cost:
    """``F.multi_head_attention_forward`` (the dispatch tracer records it as one call;
    inputs sequence-first ``(L, N, E)`` or unbatched ``(L, E)``): the ops it runs, plus a
    bool mask's conversion to float (``masked_fill_``) and the merge of both masks (``add``)."""
    q, k = call.tensor("query"), call.tensor("key")
    batch = q.shape[1] if q.ndim == 3 else 1
    lq, lk = q.shape[0], k.shape[0]
    heads = int(call.arg("num_heads"))
    added_keys = (maybe_tensor(call, "bias_k") is not None) + bool(call.arg("add_zero_attn"))
    kpm, mask = maybe_tensor(call, "key_padding_mask"), maybe_tensor(call, "attn_mask")
    need_weights = bool(call.arg("need_weights"))
    if call.arg("is_causal") and kpm is None and not need_weights:
        mask = None
    parts = [_flops("aten::masked_fill_", elementwise_flops("aten::masked_fill", m.numel))
             for m in (kpm, mask) if m is not None and m.dtype == "bool"]
    if kpm is not None and mask is not None:
        padded = mask.shape[:-1] + (mask.shape[-1] + added_keys,)  # F.pad'ed with each added key
        merged = broadcast(padded if mask.ndim == 3 else (1,) + padded, (batch * heads, 1, lk + added_keys))
        parts.append(_flops("aten::add", elementwise_flops("aten::add", prod(merged))))
    kv_features = (0, 0)
    if call.arg("use_separate_proj_weight"):
        projections = 3
        kv_features = (call.tensor("k_proj_weight").shape[-1], call.tensor("v_proj_weight").shape[-1])
    elif call.arg("query_is_key") and call.arg("key_is_value"):
        projections = 1
    else:
        projections = 2 if call.arg("key_is_value") else 3
    dropout = bool(call.arg("training")) and float(call.arg("dropout_p") or 0.0) > 0.0
    parts += mha_parts(
        lq, lk, batch, q.shape[-1], heads,
        projections=projections, need_weights=need_weights, average_weights=bool(call.arg("average_attn_weights")),
        masked=kpm is not None or mask is not None, dropout=dropout, kv_features=kv_features,
        added_keys=added_keys,
    )
    return Cost.split(*parts)


def _packing(q: TensorMeta, k: TensorMeta, v: TensorMeta) -> int:
    """How many in-projection linears a fused kernel stands for (it sees no tensor identity:
    equal shapes are taken as self-attention, as in ``nn.MultiheadAttention``'s fast path)."""
    if q.shape == k.shape == v.shape:
        return 1
    return 2 if k.shape == v.shape else 3


def _native_mha(call: OpCall) -> Cost:
    """jit's fused ``nn.MultiheadAttention`` (batch-first, eval): the same operations as
    ``F.multi_head_attention_forward`` on the same call, so both tracers agree."""
    q, k, v = call.tensor("query"), call.tensor("key"), call.tensor("value")
    need_weights = bool(call.arg("need_weights"))
    parts = mha_parts(
        q.shape[-2], k.shape[-2], q.numel // (q.shape[-2] * q.shape[-1]), int(call.arg("embed_dim")),
        int(call.arg("num_head")), projections=_packing(q, k, v), need_weights=need_weights,
        average_weights=bool(call.arg("average_attn_weights")), masked=maybe_tensor(call, "mask") is not None,
        dropout=False,
    )
    return Cost.split(*parts)


def _encoder_layer(call: OpCall) -> Cost:
    """jit's fused ``nn.TransformerEncoderLayer`` (eval): self-attention without weights,
    two residual adds, two layer norms (with affine), the feed-forward linears and their
    activation -- the operations its unfused forward runs, under their own names."""
    x = call.tensor("src")
    e = int(call.arg("embed_dim"))
    lq = x.shape[-2]
    rows = x.numel // e
    ffn = call.tensor("ffn_weight_1").shape[0]
    parts = mha_parts(
        lq, lq, rows // lq, e, int(call.arg("num_heads")), projections=1, need_weights=False,
        average_weights=False, masked=maybe_tensor(call, "mask") is not None, dropout=False,
    )
    act = ("aten::gelu", GELU["none"]) if call.arg("use_gelu") else ("aten::relu", elementwise_flops("aten::relu", 1))
    norm = normalize_flops(x.numel, rows, True, True, True)
    parts += [
        _flops("aten::add", elementwise_flops("aten::add", x.numel)),
        _flops("aten::layer_norm", norm),
        _linear(rows, e, ffn),
        _flops(act[0], act[1] * rows * ffn),
        _linear(rows, ffn, e),
        _flops("aten::add", elementwise_flops("aten::add", x.numel)),
        _flops("aten::layer_norm", norm),
    ]
    return Cost.split(*parts)


def register(registry: HandlerRegistry) -> None:
    registry.register("aten::_native_multi_head_attention", _native_mha)
    registry.register("aten::_transformer_encoder_layer_fwd", _encoder_layer)
    registry.register(MHA_OP, _mha_forward)
    # each fused kernel's backward is the kernel's name + "_backward"; the composite and math ops have none
    fused = ["aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
             "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
             "aten::_scaled_dot_product_fused_attention_overrideable"]
    registry.register(["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math", *fused],
                      _handler(_bhsd, sdpa_macs))
    registry.register([f"{op}_backward" for op in fused], _handler(_bhsd, sdpa_backward_macs))
    registry.register(["aten::_flash_attention_forward", "aten::_efficient_attention_forward"], _handler(_bshd, sdpa_macs))
    registry.register(["aten::_flash_attention_backward", "aten::_efficient_attention_backward"], _handler(_bshd, sdpa_backward_macs))
