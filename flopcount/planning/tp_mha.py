"""``nn.TransformerEncoderLayer`` made tensor-parallel: its ``nn.MultiheadAttention`` becomes
:class:`SplitSelfAttention`, the same attention with separate q, k, v Linears.

``nn.MultiheadAttention`` packs q, k, v in one ``in_proj_weight`` (a rank's rows are not one
contiguous ``Shard(0)``) and ``F.multi_head_attention_forward`` derives the head width from the
full width, so ``parallelize_module`` cannot shard it. :func:`encoder_tp_plan` swaps each layer's
``self_attn`` for a :class:`SplitSelfAttention` (weights copied when they have values) whose
``num_heads`` is one rank's share, then returns the Megatron plan: q/k/v and ``linear1``
column-parallel, ``out_proj`` and ``linear2`` row-parallel, the attention input replicated once.
The attention is ``F.scaled_dot_product_attention``, the op ``nn.MultiheadAttention`` itself calls
in training, so the MACs are the same and split by ``tp``.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from flopcount.errors import TensorParallelPlanError, UsageError


def _one_input(module: nn.Module, args: Tuple[Any, ...]) -> Optional[Tuple[Any, ...]]:
    """Self-attention ``(x, x, x)`` -> ``(x,)``: one input for ``PrepareModuleInput`` to
    replicate, so backward all-reduces its gradient once (not once per projection)."""
    if len(args) == 3 and args[1] is args[0] and args[2] is args[0]:
        return (args[0],)
    return None


def _additive(mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """``nn.MultiheadAttention``'s mask convention (bool ``True`` = masked out, float added)."""
    if mask is None or mask.is_floating_point():
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))


class SplitSelfAttention(nn.Module):
    """``nn.MultiheadAttention`` (``batch_first`` or not) with ``q_proj``/``k_proj``/``v_proj``/
    ``out_proj`` Linears. ``in_proj_weight``/``in_proj_bias`` are ``None``, so an encoder layer in
    eval mode skips its fused fast path. ``forward`` returns ``(output, None)``: no weights."""

    _qkv_same_embed_dim = True

    def __init__(self, mha: nn.MultiheadAttention, heads: int) -> None:
        super().__init__()
        width = mha.embed_dim
        self.embed_dim, self.num_heads, self.head_dim = width, heads, width // mha.num_heads
        self.batch_first, self.dropout = mha.batch_first, mha.dropout
        self.in_proj_weight: Optional[torch.Tensor] = None
        self.in_proj_bias: Optional[torch.Tensor] = None
        weight, bias = mha.in_proj_weight, mha.in_proj_bias
        self.q_proj, self.k_proj, self.v_proj = (
            linear_from(weight[i * width:(i + 1) * width], None if bias is None else bias[i * width:(i + 1) * width])
            for i in range(3)
        )
        self.out_proj = linear_from(mha.out_proj.weight, mha.out_proj.bias)
        self.register_forward_pre_hook(_one_input)

    def forward(
        self,
        query: torch.Tensor,
        key: Optional[torch.Tensor] = None,
        value: Optional[torch.Tensor] = None,
        key_padding_mask: Optional[torch.Tensor] = None,
        need_weights: bool = True,
        attn_mask: Optional[torch.Tensor] = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> Tuple[torch.Tensor, None]:
        key = query if key is None else key
        value = query if value is None else value
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = (t.unsqueeze(0 if self.batch_first else 1) for t in (query, key, value))
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        q, k, v = (self._heads(proj(t)) for proj, t in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))
        mask = _additive(attn_mask, q.dtype)
        if mask is not None and mask.dim() != 2:
            raise UsageError("SplitSelfAttention takes a 2-D attn_mask [target, source] only (no per-head masks)")
        padding = _additive(key_padding_mask, q.dtype)
        if padding is not None:
            padding = padding.reshape(padding.shape[0] if padding.dim() == 2 else 1, 1, 1, padding.shape[-1])
            mask = padding if mask is None else mask + padding
        causal = is_causal and mask is None
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=causal,
            scale=1.0 / math.sqrt(self.head_dim),
        )
        out = self.out_proj(out.transpose(1, 2).flatten(2))
        if not self.batch_first:
            out = out.transpose(0, 1)
        return (out.squeeze(0 if self.batch_first else 1) if unbatched else out), None

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, width]`` -> ``[b, heads, s, head_dim]`` (heads: this rank's share)."""
        return x.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)


def linear_from(weight: torch.Tensor, bias: Optional[torch.Tensor]) -> nn.Linear:
    """The ``nn.Linear`` of ``weight`` (``[out, in]``) and ``bias``; values copied unless on meta."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
    for made, given in ((linear.weight, weight), (linear.bias, bias)):
        if given is not None:
            if given.device.type != "meta":
                with torch.no_grad():
                    made.copy_(given)
            made.requires_grad_(given.requires_grad)
    return linear


#: the Megatron split of an encoder layer whose attention is a :class:`SplitSelfAttention`, as
#: ``(path, style)`` (``planning.world.tp_styles``)
ENCODER_SPLIT: Tuple[Tuple[str, str], ...] = (
    ("self_attn", "replicate"), ("self_attn.q_proj", "colwise"), ("self_attn.k_proj", "colwise"),
    ("self_attn.v_proj", "colwise"), ("self_attn.out_proj", "rowwise"), ("linear1", "colwise"), ("linear2", "rowwise"),
)


def encoder_tp_plan(where: str, layers: List[Any], tp: int) -> Tuple[Tuple[str, str], ...]:
    """Swap ``layers``' (``nn.TransformerEncoderLayer``) ``self_attn`` for
    :class:`SplitSelfAttention` with ``num_heads / tp`` heads, in place, and return their
    split, :data:`ENCODER_SPLIT`."""
    for index, layer in enumerate(layers):
        mha = layer.self_attn
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise TensorParallelPlanError(
                f"the built-in nn.TransformerEncoderLayer tensor-parallel plan needs self_attn without kdim/vdim, "
                f"add_bias_kv or add_zero_attn ({where} item {index})"
            )
        if mha.num_heads % tp:
            raise TensorParallelPlanError(
                f"the built-in nn.TransformerEncoderLayer tensor-parallel plan needs num_heads divisible by tp={tp} "
                f"({where} item {index}: num_heads={mha.num_heads})"
            )
    for layer in layers:  # all checked before any is rewritten
        layer.self_attn = SplitSelfAttention(layer.self_attn, layer.self_attn.num_heads // tp)
    return ENCODER_SPLIT
