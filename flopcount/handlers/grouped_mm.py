"""Grouped matrix multiplies (mixture-of-experts kernels) and ``histc``.

``aten::_grouped_mm(mat_a, mat_b, offs)`` multiplies groups of rows (or columns) by one
matrix each; ``offs`` holds the group ends. Whatever the split, every row meets exactly
one group's matrix, so the MACs depend on the shapes only (tensors shapes as torch's meta
kernel reads them):

* 2-D x 3-D (forward of MoE experts): a (S, K), b (G, K, N) -> (S, N): S x K x N
* 2-D x 2-D (weight gradient): a (M, K_total), b (K_total, N) -> (G, M, N): M x K_total x N
* 3-D x 2-D: a (G, M, K), b (K, N_total) -> (M, N_total): M x K x N_total
* 3-D x 3-D (batched): a (G, M, K), b (G, K, N): G x M x K x N

Rows past ``offs[-1]`` (expert-parallel sentinels) are skipped by the kernel but cannot be
seen from shapes; flopcount counts them (no transformers model leaves such rows on one device).
"""

from __future__ import annotations

from ..registry import HandlerRegistry
from ..types import Cost, OpCall, TensorMeta

__all__ = ["register", "grouped_mm_macs"]


def grouped_mm_macs(a: TensorMeta, b: TensorMeta) -> int:
    """MACs of a grouped matmul of ``a`` by ``b`` (shapes as in the module docstring)."""
    if a.ndim == 2 and b.ndim == 2:
        return a.shape[0] * a.shape[1] * b.shape[1]
    if a.ndim == 2:
        return a.shape[0] * a.shape[1] * b.shape[-1]
    if b.ndim == 2:
        return a.shape[-2] * a.shape[-1] * b.shape[-1]
    return a.shape[0] * a.shape[-2] * a.shape[-1] * b.shape[-1]


def _grouped_mm(call: OpCall) -> Cost:
    # the optional bias add is not counted, as for addmm; _scaled_grouped_mm's scaling neither
    return Cost.from_macs(grouped_mm_macs(call.tensor("self"), call.tensor("mat2")))


def _histc(call: OpCall) -> Cost:
    # one bin computation per input element, like a reduction
    return Cost.from_flops(call.tensor("self").numel)


def register(registry: HandlerRegistry) -> None:
    registry.register(["aten::_grouped_mm", "aten::_scaled_grouped_mm"], _grouped_mm)
    registry.register("aten::histc", _histc)
