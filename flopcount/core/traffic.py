"""Memory traffic of one op call: the bytes it reads and writes (the roofline's memory side).

The general rule: an op reads every tensor argument it is given (each as passed, ``numel x
element size``) and writes every tensor it returns; a view or an allocation that fills nothing
moves nothing; a fused composite moves its own inputs and outputs only. Op families whose
traffic is not their arguments' size (gathers, in-place indexed writes, identities, factories
of another's options, a gather's backward in place: :data:`BACKWARD_IN_PLACE`) have their own
rule in :data:`RULES`, one small function each. The formulas: docs/conventions.md, "Bytes".

No torch here (:func:`is_floating` asks torch on first use): whether an op is a view is told
by the caller; a tensor whose dtype a tracer could not see is taken as float32 (4 bytes).
"""

from __future__ import annotations

import functools
from math import prod
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple

from flopcount.types import OpCall, TensorMeta

__all__ = ["BACKWARD_IN_PLACE", "GATHER_SOURCES", "ITEMSIZE", "RULES", "broadcast", "call_traffic", "element_size", "first_output", "general_traffic", "is_complex", "is_floating", "maybe_tensor"]

#: Bytes per element, by the dtype names tracers give (``str(torch.float32)`` less ``torch.``).
ITEMSIZE: Dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "bool": 1, "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
}
_DEFAULT_ITEMSIZE = 4

#: Factories that allocate without writing a value.
ALLOCATIONS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
    "aten::empty_permuted",
})

Traffic = Tuple[int, int]
#: A byte rule: ``(bytes_read, bytes_written)`` of a call, or None to use the general rule.
ByteRule = Callable[[OpCall], Optional[Traffic]]


def element_size(dtype: Any) -> int:
    """Bytes per element of a dtype name; float32's 4 when unknown."""
    return ITEMSIZE.get(dtype, _DEFAULT_ITEMSIZE) if dtype is not None else _DEFAULT_ITEMSIZE


def is_floating(dtype: Optional[str]) -> bool:
    """Whether a dtype name is a real floating dtype: torch's ``dtype.is_floating_point``
    ("float32", "bfloat16", "float8_e4m3fn"...; complex, integer, bool, quantized and
    unknown names are not)."""
    found = _torch_dtype(dtype)
    return found is not None and bool(found.is_floating_point)


def is_complex(dtype: Optional[str]) -> bool:
    """Whether a dtype name is a complex dtype: torch's ``dtype.is_complex``."""
    found = _torch_dtype(dtype)
    return found is not None and bool(found.is_complex)


@functools.cache  # a handful of names, looked up per tensor on predict's per-op path
def _torch_dtype(name: Optional[str]) -> Any:
    import torch

    found = getattr(torch, name, None) if name else None
    return found if isinstance(found, torch.dtype) else None


def _nbytes(meta: TensorMeta) -> int:
    return element_size(meta.dtype) * prod(meta.shape)


def _tensor_bytes(values: Iterable[Any]) -> int:
    total = 0
    for value in values:
        if isinstance(value, TensorMeta):
            total += _nbytes(value)
        elif isinstance(value, tuple):
            total += _tensor_bytes(value)
    return total


def call_traffic(call: OpCall, *, view: bool, phase: str = "forward") -> Traffic:
    """``(bytes_read, bytes_written)`` of ``call`` by the convention above; ``view`` says
    the op's result aliases an input (told by the op's schema); ``phase`` is the pass it
    ran in (autograd's scatters into fresh zeros are priced in place: :data:`BACKWARD_IN_PLACE`)."""
    rule = (BACKWARD_IN_PLACE.get(call.op) if phase == "backward" else None) or RULES.get(call.op)
    if rule is not None:
        answer = rule(call)
        if answer is not None:
            return answer
    return general_traffic(call, view=view)


def general_traffic(call: OpCall, *, view: bool) -> Traffic:
    """The general rule alone (every tensor argument read, every output written; views and
    bare allocations 0), without the family rules: what :func:`call_traffic` gives an op
    that has no rule of its own."""
    if view or call.op in ALLOCATIONS:
        return 0, 0
    read = _tensor_bytes(call.args.values())
    written = _tensor_bytes(call.outputs)
    if not written and not any(isinstance(o, TensorMeta) for o in call.outputs):
        written = _tensor_bytes((call.args.get("self"),))
    return read, written


# -- helpers of the rules ----------------------------------------------------------------

def maybe_tensor(call: OpCall, name: str) -> Optional[TensorMeta]:
    """The tensor argument ``name`` or None when absent (an optional weight, bias...)."""
    value = call.args.get(name)
    return value if isinstance(value, TensorMeta) else None


def first_output(call: OpCall) -> Optional[TensorMeta]:
    """The op's first output when the tracer saw it as a tensor, else None."""
    first = call.outputs[0] if call.outputs else None
    return first if isinstance(first, TensorMeta) else None


def _arg_bytes(call: OpCall, *names: str) -> int:
    """Bytes of the named tensor (or tensor-list) arguments that are present."""
    return _tensor_bytes(call.args.get(name) for name in names)


def _elements(count: int, like: Optional[TensorMeta]) -> int:
    """``count`` elements of ``like``'s dtype, in bytes."""
    return count * element_size(like.dtype if like is not None else None)


def _gathered(source: str, *indices: str) -> ByteRule:
    """A gather from ``source``: reads the index tensors and one source element per output
    element; writes its outputs."""

    def rule(call: OpCall) -> Optional[Traffic]:
        out, table = first_output(call), maybe_tensor(call, source)
        if out is None or table is None:
            return None
        return _arg_bytes(call, *indices) + _elements(out.numel, table), _tensor_bytes(call.outputs)

    rule.__doc__ = f"read {', '.join(indices)} + numel(out) elements of {source}; write the output"
    return rule


def _embedding_bag(call: OpCall) -> Optional[Traffic]:
    """read indices, offsets, per_sample_weights + numel(indices) rows of weight; write
    the outputs (the bags and the bookkeeping tensors the kernel returns)."""
    weight, indices = maybe_tensor(call, "weight"), maybe_tensor(call, "indices")
    if weight is None or indices is None or not weight.shape:
        return None
    rows = indices.numel * weight.shape[-1]
    read = _arg_bytes(call, "indices", "offsets", "per_sample_weights") + _elements(rows, weight)
    return read, _tensor_bytes(call.outputs)


def _embedding_renorm(call: OpCall) -> Optional[Traffic]:
    """read indices + the rows they name; write those rows back (at most)."""
    weight, indices = maybe_tensor(call, "self"), maybe_tensor(call, "indices")
    if weight is None or indices is None or not weight.shape:
        return None
    rows = _elements(indices.numel * weight.shape[-1], weight)
    return _nbytes(indices) + rows, rows


def _updated(count: int, call: OpCall, index_names: Sequence[str], source: Optional[str], accumulate: bool) -> Traffic:
    """``count`` elements of ``self`` updated: the indices read, ``count`` source elements
    read, the updated elements written (and read first when accumulating into them)."""
    self_meta = maybe_tensor(call, "self")
    read = _arg_bytes(call, *index_names)
    src = maybe_tensor(call, source) if source is not None else None
    if src is not None:
        read += _elements(min(count, src.numel), src)
    updated = _elements(count, self_meta)
    return read + (updated if accumulate else 0), updated


def _updating(counted: str, source: str, accumulate: bool) -> ByteRule:
    """numel(``counted``) elements of self updated from ``source`` (:func:`_updated`)."""

    def rule(call: OpCall) -> Optional[Traffic]:
        tensor = maybe_tensor(call, counted)
        return None if tensor is None else _updated(tensor.numel, call, ("index",), source, accumulate)

    rule.__doc__ = (f"read index + numel({counted}) elements of {source}" + (" and of self" if accumulate else "")
                    + f"; write numel({counted}) elements of self")
    return rule


_index_copy = _updating("source", "source", accumulate=False)
_index_add = _updating("source", "source", accumulate=True)
_scatter_add = _updating("index", "src", accumulate=True)


def _index_fill(call: OpCall) -> Optional[Traffic]:
    """read index (and a tensor value); write numel(self) / size(dim) x numel(index) elements."""
    self_meta, index = maybe_tensor(call, "self"), maybe_tensor(call, "index")
    if self_meta is None or index is None:
        return None
    dim = call.args.get("dim")
    size = self_meta.shape[dim] if isinstance(dim, int) and self_meta.shape else 1
    slab = self_meta.numel // size if size else 0
    read, written = _updated(slab * index.numel, call, ("index",), None, accumulate=False)
    return read + _arg_bytes(call, "value"), written


def _indexed(source: str, accumulating: str) -> ByteRule:
    """numel(index) elements of self updated from ``source`` (:func:`_updated`), read too
    when the ``accumulating`` argument is set; a tensor ``value`` read whole."""

    def rule(call: OpCall) -> Optional[Traffic]:
        index = maybe_tensor(call, "index")
        if index is None:
            return None
        read, written = _updated(index.numel, call, ("index",), source, accumulate=bool(call.args.get(accumulating)))
        return read + _arg_bytes(call, "value"), written

    rule.__doc__ = (f"read index + numel(index) elements of {source} (and of self with ``{accumulating}``); "
                    "write numel(index) elements of self")
    return rule


_scatter = _indexed("src", "reduce")
_put = _indexed("source", "accumulate")


def _scatter_reduce(call: OpCall) -> Optional[Traffic]:
    """as scatter_add_; ``reduce="mean"`` then divides all of self (the general rule)."""
    return None if call.args.get("reduce") == "mean" else _scatter_add(call)


def broadcast(*shapes: Sequence[int]) -> Tuple[int, ...]:
    """The broadcast shape of ``shapes`` (numpy rules); raises ValueError when incompatible."""
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(-ndim, 0):
        sizes = {s[axis] for s in shapes if len(s) >= -axis} - {1}
        if len(sizes) > 1:
            raise ValueError(f"shapes {list(shapes)} do not broadcast")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def _index_put(call: OpCall) -> Optional[Traffic]:
    """read the index tensors + values (+ the selected elements of self when
    ``accumulate``); write the selected elements: broadcast(indices) x the dims no index
    covers. A boolean index selects as many as its data says: at least numel(values)."""
    self_meta = maybe_tensor(call, "self")
    indices = call.args.get("indices")
    values = maybe_tensor(call, "values")
    if self_meta is None or values is None or not isinstance(indices, tuple):
        return None
    tensors = [i for i in indices if isinstance(i, TensorMeta)]
    if any(t.dtype in ("bool", "uint8") for t in tensors):
        count = values.numel
    else:
        free = [size for d, size in enumerate(self_meta.shape) if d >= len(indices) or not isinstance(indices[d], TensorMeta)]
        count = prod(broadcast(*(t.shape for t in tensors))) * prod(free)
    read = _tensor_bytes(indices) + _nbytes(values)
    updated = _elements(count, self_meta)
    return read + (updated if call.args.get("accumulate") else 0), updated


def _masked(call: OpCall) -> Optional[Traffic]:
    """read the mask (and a tensor value); the elements it selects are data: none at the least."""
    return None if maybe_tensor(call, "mask") is None else (_arg_bytes(call, "mask", "value"), 0)


def _overwriting(source: str) -> ByteRule:
    """``self`` overwritten from ``source`` (``copy_(self, src)``; ``fill_``/``zero_`` from a
    tensor value): read it, write self (a slice's own size); self is not read."""

    def rule(call: OpCall) -> Optional[Traffic]:
        self_meta = maybe_tensor(call, "self")
        return None if self_meta is None else (_arg_bytes(call, source), _nbytes(self_meta))

    rule.__doc__ = f"read {source}; write self, not read"
    return rule


def _dropout(call: OpCall) -> Optional[Traffic]:
    """eval-mode dropout returns its input: 0. In training the general rule."""
    return (0, 0) if call.args.get("train") is False else None


def _same_dtype_identity(call: OpCall) -> Traffic:
    """``to``/``type_as``: returns ``self`` when the dtype is unchanged (0); else a copy
    (self read, output written). A device move is not seen (one device per trace)."""
    self_meta, out = maybe_tensor(call, "self"), first_output(call)
    if self_meta is None or out is None or (out.dtype == self_meta.dtype and out.shape == self_meta.shape and not call.args.get("copy")):
        return 0, 0
    return _nbytes(self_meta), _nbytes(out)


def _rnn_layer(call: OpCall) -> Traffic:
    """oneDNN's RNN layer (``mkldnn_rnn_layer``, its backward): the general rule less the
    ``workspace`` the forward returns and its backward reads, a buffer only the real kernel
    sizes (empty on fake tensors), as the composite layer that writes it (``aten::lstm``)
    books only its own inputs and outputs."""
    args = {name: value for name, value in call.args.items() if name != "workspace"}
    outputs = call.outputs[:3] if call.op == "aten::mkldnn_rnn_layer" else call.outputs
    return general_traffic(OpCall(call.op, args, outputs), view=False)


def _nothing(call: OpCall) -> Traffic:
    """a size or shape query: no tensor data moves."""
    return 0, 0


def _written_only(call: OpCall) -> Optional[Traffic]:
    """a factory that reads only its argument's options: write the output."""
    return 0, _tensor_bytes(call.outputs)


_QUERIES = (
    "size", "sym_size", "numel", "sym_numel", "stride", "sym_stride", "sym_storage_offset", "dim", "len",
    "is_contiguous", "is_floating_point", "is_complex", "is_same_size", "is_nonzero", "_shape_as_tensor",
    "_assert_tensor_metadata", "_has_compatible_shallow_copy_type", "record_stream", "_version", "output_nr",
    "requires_grad_", "retain_grad",
)
_LIKE_FACTORIES = (
    "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like", "new_zeros", "new_ones",
    "new_full",
)
_DROPOUTS = ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")

#: gathers: op -> (the source it picks elements of, its index arguments); ``narrow_copy``
#: picks a slice by its scalar arguments
_GATHERS: Dict[str, Tuple[str, ...]] = {
    "aten::embedding": ("weight", "indices"),
    "aten::index_select": ("self", "index"),
    "aten::gather": ("self", "index"),
    "aten::take": ("self", "index"),
    "aten::take_along_dim": ("self", "indices"),
    "aten::index": ("self", "indices"),
    "aten::_unsafe_index": ("self", "indices"),
    "aten::narrow_copy": ("self",),
}
_BAGS = ("aten::embedding_bag", "aten::_embedding_bag", "aten::_embedding_bag_forward_only")

#: op -> the argument of which it reads only the elements (rows) it picks, never the whole:
#: the gathers and the embedding bags
GATHER_SOURCES: Dict[str, str] = {**{op: spec[0] for op, spec in _GATHERS.items()}, **dict.fromkeys(_BAGS, "weight")}

#: op -> its byte rule, for the families whose traffic is not "arguments + outputs".
RULES: Dict[str, ByteRule] = {
    **{op: _gathered(*spec) for op, spec in _GATHERS.items()},
    "aten::embedding_bag": _embedding_bag,
    "aten::embedding_renorm_": _embedding_renorm,
    "aten::index_copy_": _index_copy,
    "aten::index_add_": _index_add,
    "aten::index_fill_": _index_fill,
    "aten::scatter_": _scatter,
    "aten::scatter_add_": _scatter_add,
    "aten::scatter_reduce_": _scatter_reduce,
    "aten::put_": _put,
    "aten::index_put_": _index_put,
    "aten::_index_put_impl_": _index_put,
    "aten::masked_fill_": _masked,
    "aten::masked_scatter_": _masked,
    "aten::copy_": _overwriting("src"),
    "aten::fill_": _overwriting("value"),
    "aten::zero_": _overwriting("value"),
    "aten::to": _same_dtype_identity,
    "aten::mkldnn_rnn_layer": _rnn_layer,
    "aten::mkldnn_rnn_layer_backward": _rnn_layer,
    "aten::type_as": _same_dtype_identity,
    **{f"aten::{name}": _dropout for name in _DROPOUTS},
    **{f"aten::{name}": _nothing for name in _QUERIES},
    **{f"aten::{name}": _written_only for name in _LIKE_FACTORIES},
}

#: Backward-phase ops that autograd's gather formulas run in place on fresh zeros (torch's
#: ``index_select_backward``, ``gather_backward``, ``take``'s and ``index``'s formulas): the
#: traced out-of-place spelling is an artefact of tracing under a dispatch mode.
BACKWARD_IN_PLACE: Dict[str, ByteRule] = {
    "aten::index_add": _index_add,
    "aten::scatter_add": _scatter_add,
    "aten::put": _put,
    "aten::index_put": _index_put,
    "aten::_index_put_impl": _index_put,
}
