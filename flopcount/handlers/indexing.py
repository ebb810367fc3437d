"""Index-accumulate ops: embedding bags, index_add, scatter_add/reduce, index_put with
accumulate, and the embedding backward. One FLOP per accumulated element; plain
gathers and scatters without a reduction are copies (see zero_cost.py)."""

from __future__ import annotations

from typing import Optional

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import first_output, maybe_tensor, per_grad_output
from flopcount.types import Cost, Handler, OpCall

__all__ = ["register"]

MEAN_MODE = 1  # embedding_bag's modes: 0 sum, 1 mean, 2 max


def _bag_elements(call: OpCall, width: int) -> int:
    return call.tensor("indices").numel * width


def _embedding_bag(call: OpCall) -> Cost:
    """indices x dim adds (sum) or compares (max); mean adds a divide per output element;
    per_sample_weights adds a multiply per looked-up element."""
    width = call.tensor("weight").shape[-1]
    rows = _bag_elements(call, width)
    flops = rows + rows * (maybe_tensor(call, "per_sample_weights") is not None)
    if call.arg("mode") == MEAN_MODE:
        out = first_output(call)
        flops += out.numel if out is not None else call.tensor("offsets").numel * width
    return Cost.from_flops(flops)


def _embedding_bag_backward(call: OpCall) -> Cost:
    rows = _bag_elements(call, call.tensor("grad").shape[-1])
    return Cost.from_flops(rows + rows * (maybe_tensor(call, "per_sample_weights") is not None))


def _per_sample_weights_backward(call: OpCall) -> Cost:
    """The gradient of each per-sample weight: its bag's gradient row dotted with the looked-up
    weight row, D multiplies and D adds per index."""
    return Cost.from_flops(2 * _bag_elements(call, call.tensor("grad").shape[-1]))


def _per(name: str, flag: Optional[str] = None) -> Handler:
    """One FLOP per element of the tensor argument ``name``; with ``flag``, only when that
    argument is set (else a copy: 0)."""
    return lambda call: Cost.from_flops(call.tensor(name).numel) if flag is None or call.arg(flag) else Cost()


def _scatter_reduce(call: OpCall) -> Cost:
    flops = call.tensor("index").numel
    if call.arg("reduce") == "mean":
        flops += call.tensor("self").numel
    return Cost.from_flops(flops)


def _index_reduce(call: OpCall) -> Cost:
    """One reduction op per source element; "mean" + a divide per element of ``self`` (as scatter_reduce)."""
    flops = call.tensor("source").numel
    if call.arg("reduce") == "mean":
        flops += call.tensor("self").numel
    return Cost.from_flops(flops)


def register(registry: HandlerRegistry) -> None:
    registry.register(["aten::embedding_bag", "aten::_embedding_bag", "aten::_embedding_bag_forward_only"], _embedding_bag)
    registry.register(["aten::_embedding_bag_backward", "aten::_embedding_bag_dense_backward"], _embedding_bag_backward)
    registry.register("aten::_embedding_bag_per_sample_weights_backward", _per_sample_weights_backward)
    # index-add of every grad_output row into the weight gradient
    registry.register("aten::embedding_dense_backward", per_grad_output(1))
    registry.register("aten::index_add", _per("source"))
    registry.register("aten::scatter_add", _per("index"))  # one add per index element (index may be smaller than src)
    # plain scatter is a copy; scatter(..., reduce="add"/"multiply") accumulates
    registry.register("aten::scatter", _per("index", "reduce"))
    registry.register("aten::scatter_reduce", _scatter_reduce)
    registry.register("aten::index_reduce", _index_reduce)
    registry.register(["aten::index_put", "aten::_index_put_impl"], _per("values", "accumulate"))
    # put(..., accumulate=True) (autograd's backward of take) adds one element per index
    registry.register("aten::put", _per("index", "accumulate"))
