"""GPT-2-style blocks made tensor-parallel: their ``Conv1D`` projections become ``nn.Linear``.

transformers' ``Conv1D`` computes ``x @ W + b`` with ``W`` of shape ``[in, out]``; torch's
``ColwiseParallel``/``RowwiseParallel`` only shard ``nn.Linear`` (``W`` of shape ``[out, in]``).
:func:`gpt2_tp_plan` swaps each block's ``Conv1D`` for the ``nn.Linear`` of the transposed
weight (the same computation, weights copied when they have values), splits the fused
``c_attn`` into q, k, v Linears whose outputs are concatenated again (so each rank's
``split`` sees ``[q_local, k_local, v_local]``), and sets the attention's ``split_size`` and
``num_heads`` to one rank's share, as Megatron does. transformers is never imported: a
``Conv1D`` is recognised by its class name and its ``nf``/``nx`` attributes.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from torch import nn

from flopcount.errors import TensorParallelPlanError
from flopcount.planning.tp_mha import linear_from


def _is_conv1d(module: Optional[nn.Module]) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2
        and isinstance(getattr(module, "nf", None), int) and isinstance(getattr(module, "nx", None), int)
    )


class FusedQKV(nn.Module):
    """GPT-2's fused ``c_attn`` as three Linears: ``cat([q(x), k(x), v(x)], -1)``."""

    def __init__(self, q: nn.Linear, k: nn.Linear, v: nn.Linear) -> None:
        super().__init__()
        self.q, self.k, self.v = q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)


def linear_of(conv: Any, start: int = 0, stop: Optional[int] = None) -> nn.Linear:
    """The ``nn.Linear`` computing output columns ``start:stop`` of the ``Conv1D`` ``conv``
    (its weight's columns, transposed)."""
    weight, bias = conv.weight, conv.bias
    stop = weight.shape[1] if stop is None else stop
    return linear_from(weight[:, start:stop].t(), None if bias is None else bias[start:stop])


def is_gpt2_block(block: nn.Module) -> bool:
    """A GPT-2-style block: ``attn.{c_attn,c_proj}`` and ``mlp.{c_fc,c_proj}`` all Conv1D."""
    attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
    return (
        attn is not None and mlp is not None
        and all(_is_conv1d(getattr(attn, n, None)) for n in ("c_attn", "c_proj"))
        and all(_is_conv1d(getattr(mlp, n, None)) for n in ("c_fc", "c_proj"))
    )


#: the Megatron split of a rewritten GPT-2 block, as ``(path, style)`` (``planning.world.tp_styles``):
#: q/k/v and ``mlp.c_fc`` column-parallel, ``attn.c_proj`` and ``mlp.c_proj`` row-parallel, the
#: attention and MLP inputs replicated once
GPT2_SPLIT: Tuple[Tuple[str, str], ...] = (
    ("attn", "replicate"), ("attn.c_attn.q", "colwise"), ("attn.c_attn.k", "colwise"), ("attn.c_attn.v", "colwise"),
    ("attn.c_proj", "rowwise"), ("mlp", "replicate"), ("mlp.c_fc", "colwise"), ("mlp.c_proj", "rowwise"),
)


def gpt2_tp_plan(where: str, blocks: List[Any], tp: int) -> Tuple[Tuple[str, str], ...]:
    """Rewrite ``blocks`` (GPT-2-style, see :func:`is_gpt2_block`) in place for ``tp`` ranks
    and return their split, :data:`GPT2_SPLIT`."""
    for index, block in enumerate(blocks):
        attn = block.attn
        if hasattr(attn, "q_attn") or hasattr(block, "crossattention"):
            raise TensorParallelPlanError(
                f"no built-in tensor-parallel plan for GPT-2 blocks with cross-attention ({where} item {index})"
            )
        heads, width = getattr(attn, "num_heads", None), attn.c_attn.nx
        if not isinstance(heads, int) or heads % tp or attn.c_attn.nf != 3 * width or getattr(attn, "split_size", None) != width:
            raise TensorParallelPlanError(
                f"the built-in GPT-2 tensor-parallel plan needs num_heads divisible by tp={tp} and c_attn of "
                f"width 3 x {width} ({where} item {index}: num_heads={heads}, c_attn nf={attn.c_attn.nf})"
            )
    for block in blocks:  # all checked before any is rewritten
        attn, mlp = block.attn, block.mlp
        fused, width, heads = attn.c_attn, attn.c_attn.nx, attn.num_heads
        attn.c_attn = FusedQKV(*(linear_of(fused, i * width, (i + 1) * width) for i in range(3)))
        attn.c_proj = linear_of(attn.c_proj)
        mlp.c_fc, mlp.c_proj = linear_of(mlp.c_fc), linear_of(mlp.c_proj)
        attn.split_size, attn.num_heads = width // tp, heads // tp
    return GPT2_SPLIT
