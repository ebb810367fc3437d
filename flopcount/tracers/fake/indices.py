"""The real kernels' index range checks, for index tensors whose value a meta or fake run knows.

A real ``embedding`` asked for a row beyond its table raises (``IndexError: index out of range
in self``); its meta kernel sees shapes only, so a meta or fake run of GPT-2 with 2,048 tokens
(its position table has 1,024 rows) ran to the end and was counted. Many index tensors have a
value such a run knows: the caller's token ids (a real CPU tensor behind the fake copy), and
what the shapes decide (position ids made by ``arange``, followed by
:class:`~flopcount.tracers.fake.hf_tracing.FakeValues` on a fake copy of a transformers model and
by :class:`~flopcount.tracers.fake.values.KnownValues` on meta and on a fake copy of any other). Before an op that reads
through an index runs, :func:`check_indices` applies the range the real CPU kernel checks to
each index whose value is known, and where the real forward raises, raises the real kernel's
exception type (``IndexError`` or ``RuntimeError``) with the op, the index and the table, caused
by an :class:`IndexOutOfRange` (a :class:`~flopcount.tracers.fake.meta_kernels.RealKernelError`:
the dispatch tracer names the module). An index whose value is not known is not checked
(nothing is refused on a guess); real CPU index tensors are checked on real runs too (the
kernel would raise the same; the message is the same on every path).

Ranges, as the CPU kernels check them (torch 2.x): ``embedding``, ``embedding_bag``,
``index_select``, ``gather``, ``scatter*``, ``index_add`` and ``index_copy`` take
``0 <= i < n``; ``index``, ``index_put``, ``index_fill`` and ``take`` also take negative
indices, ``-n <= i < n`` (``n``: the table's rows, the size of the indexed dimension, or the
number of elements for ``take``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from flopcount.tracers.fake.meta_kernels import RealKernelError
from flopcount.tracers.fake.values import INTEGRAL, KnownValues

__all__ = ["INDEXED", "IndexChecks", "IndexOutOfRange", "IndexValues", "check_indices", "known_value", "version_of"]

_aten = torch.ops.aten

#: how an op indexes: ``rows`` (``weight``'s first dimension by ``indices``), ``dim`` (``self``'s
#: dimension ``dim`` by ``index``), ``flat`` (``self``'s elements by ``index``), ``list``
#: (``self``'s leading dimensions by the tensors of ``indices``); and whether negative indices count
#: from the end
_RULES: Dict[str, Tuple[str, bool]] = {
    "embedding": ("rows", False), "embedding_bag": ("rows", False), "_embedding_bag": ("rows", False),
    "_embedding_bag_forward_only": ("rows", False),
    "index_select": ("dim", False), "gather": ("dim", False), "scatter": ("dim", False), "scatter_": ("dim", False),
    "scatter_add": ("dim", False), "scatter_add_": ("dim", False), "scatter_reduce": ("dim", False),
    "scatter_reduce_": ("dim", False), "index_add": ("dim", False), "index_add_": ("dim", False),
    "index_copy": ("dim", False), "index_copy_": ("dim", False), "index_fill": ("dim", True),
    "index_fill_": ("dim", True), "take": ("flat", True), "index": ("list", True), "index_put": ("list", True),
    "index_put_": ("list", True), "_index_put_impl_": ("list", True),
}
#: the real kernel's exception type (the others raise RuntimeError)
_INDEX_ERROR = frozenset({
    "embedding", "index_select", "index", "index_put", "index_put_", "_index_put_impl_", "take", "index_add",
    "index_add_", "index_copy", "index_copy_", "index_fill", "index_fill_",
})


def _overloads() -> Dict[Any, Tuple[str, str, bool, Tuple[str, ...]]]:
    """op overload -> (its op name, its rule, whether negative indices count, its argument names):
    every overload of the ops of ``_RULES`` that takes tensors to index with (not ``out=`` ones, nor
    ``index.str``)."""
    found: Dict[Any, Tuple[str, str, bool, Tuple[str, ...]]] = {}
    for name, (rule, negative) in _RULES.items():
        packet = getattr(_aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            names = {a.name for a in op._schema.arguments}
            wanted = {"rows": "indices", "dim": "index", "flat": "index", "list": "indices"}[rule]
            if wanted in names and "out" not in names and op._schema.arguments[0].name in ("self", "weight"):
                found[op] = (name, rule, negative, tuple(a.name for a in op._schema.arguments))
    return found


_OPS = _overloads()
#: the ops :func:`check_indices` checks, by ``id`` (an op overload is one object per process, kept
#: alive by ``_OPS``; hashing one runs Python code, ~100 ns, asked for every op of a run)
INDEXED = frozenset(map(id, _OPS))


class IndexOutOfRange(RealKernelError):
    """The mark of an index the real kernel refuses: the cause of :attr:`error`, the exception
    raised (the kernel's type, ``IndexError`` or ``RuntimeError``, and our message)."""


def known_value(tensor: Any, followed: Callable[[Any], Optional[torch.Tensor]]) -> Optional[torch.Tensor]:
    """``tensor``'s value: itself for a real CPU tensor, else what ``followed`` knows (None: unknown)."""
    if type(tensor) is torch.Tensor or type(tensor) is nn.Parameter:
        if tensor.device.type == "cpu" and tensor.layout == torch.strided and not tensor.is_nested:
            return tensor
        if tensor.device.type != "meta":
            return None  # a real accelerator tensor: its kernel checks it (reading it would synchronise)
    return followed(tensor)


def version_of(tensor: Any) -> Optional[int]:
    """``tensor``'s version counter (it moves at each write into it or a view of it); None for an
    inference tensor, which keeps none."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return None


class IndexValues:
    """The values an index check can read on one run: real CPU tensors; meta tensors that
    ``known`` follows (:class:`~flopcount.tracers.fake.values.KnownValues`); fakes that
    :attr:`followed` follows (a :class:`~flopcount.tracers.fake.hf_tracing.FakeValues`'s ``value``:
    fake copies of transformers models), and the caller's integral CPU input tensors each fake
    input stands for (:meth:`seed`: fake copies of any model)."""

    def __init__(self, known: Any) -> None:
        self._known = known
        self.followed: Optional[Callable[[Any], Optional[torch.Tensor]]] = None
        self._inputs: Any = None
        #: whether a seed is an inference tensor (no version counter): the run's in-place ops
        #: are then shown to :meth:`written`, which lets go of the seeds they write
        self.unversioned = False

    def seed(self, fakes: Any, reals: Any) -> None:
        """Each integral fake of ``fakes`` stands for the real CPU tensor at its place in ``reals``,
        until the fake is written (its version moves; an inference tensor, which keeps no
        version, until an in-place op shown to :meth:`written` writes its storage)."""
        inputs = WeakIdKeyDictionary()
        for fake, real in zip(fakes, reals):
            if (
                type(real) is torch.Tensor and real.device.type == "cpu" and real.dtype in INTEGRAL
                and real.layout == torch.strided and tuple(real.shape) == tuple(fake.shape)
            ):
                version = version_of(fake)
                inputs[fake] = (real, version)
                self.unversioned = self.unversioned or version is None
        self._inputs = inputs if len(inputs) else None

    def written(self, func: Any, args: Tuple[Any, ...], kwargs: Optional[Mapping[str, Any]]) -> None:
        """An in-place op ran (``func``, mutable): each seed that keeps no version and shares its
        storage with a tensor ``func`` writes no longer holds the caller's value (forgotten). By
        storage, not ``_base``: a view of an inference tensor made in inference mode has none."""
        if self._inputs is None:
            return
        for index, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[index] if index < len(args) else (kwargs or {}).get(argument.name)
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(tensor, torch.Tensor):
                    storage = tensor.untyped_storage()  # one Python object per storage: compared by identity
                    for seeded in [fake for fake, (_, version) in self._inputs.items()
                                   if version is None and fake.untyped_storage() is storage]:
                        del self._inputs[seeded]

    def __call__(self, tensor: Any) -> Optional[torch.Tensor]:
        if type(tensor) is torch.Tensor:
            return self._known.value(tensor) if tensor.device.type == "meta" else None
        found = self.followed(tensor) if self.followed is not None else self._known.value(tensor)
        if found is None and self._inputs is not None and tensor.dtype in INTEGRAL:  # seeds: integral only
            seeded = self._inputs.get(tensor)
            # a fake written since (in place, or through a view: one version counter) no longer holds it
            if seeded is not None and seeded[1] == version_of(tensor):
                found = seeded[0]
        return found


class IndexChecks:
    """The index checks of a fake run that no recorder watches (``estimate_memory``'s fake step of
    a model without transformers modules; for one with them,
    :class:`~flopcount.tracers.fake.hf_tracing.FakeValues` follows the values and checks): the mode
    that runs each op there (``meta_kernels.KernelStandIns``) shows it each indexing op
    :meth:`before` it runs and each op :meth:`after`. Follows the integral fakes the shapes decide (position
    ids made by ``arange``: :class:`~flopcount.tracers.fake.values.KnownValues`) and the caller's
    integral inputs (:meth:`seed`), as the recorder does on a count's fake copies."""

    #: the ops :meth:`before` checks, by ``id`` (the caller asks before calling it: once per op)
    indexed = INDEXED

    def __init__(self) -> None:
        self.known = KnownValues(fakes=True)
        self.values = IndexValues(self.known)
        #: id(op) -> whether its schema writes an argument (asked once per op: the schema's
        #: property builds its answer each time)
        self._mutable: Dict[int, bool] = {}

    def seed(self, fakes: Any, reals: Any) -> None:
        self.values.seed(fakes, reals)

    def before(self, func: Any, args: Tuple[Any, ...], kwargs: Optional[Mapping[str, Any]]) -> None:
        """Raise what the real kernel raises for a known index out of range (:func:`check_indices`);
        ``func`` is one of :attr:`indexed`."""
        check_indices(func, args, kwargs, self.values)

    def after(self, func: Any, args: Tuple[Any, ...], kwargs: Optional[Dict[str, Any]], out: Any) -> None:
        """Follow the value of ``out`` where decided; let go of what an in-place op wrote."""
        known, fake = self.known, type(out) is self.known.fake
        if fake and out.dtype in INTEGRAL:
            known.note(func, args, kwargs, out)
        mutable = self._mutable.get(id(func))
        if mutable is None:
            mutable = self._mutable[id(func)] = bool(func._schema.is_mutable)
        if mutable:
            # a float output cannot have written into the (integral) tensors whose values are known
            if not fake and known:
                known.note(func, args, kwargs, out)
            if self.values.unversioned:
                self.values.written(func, args, kwargs)


def check_indices(func: Any, args: Tuple[Any, ...], kwargs: Optional[Mapping[str, Any]], values: Callable[[Any], Optional[torch.Tensor]]) -> bool:
    """Raise what the real kernel of ``func`` (an op of :data:`INDEXED`) raises, caused by an
    :class:`IndexOutOfRange`, where it refuses an index whose value is known (``values``: see
    :func:`known_value`); whether an index value was known and checked."""
    name, rule, negative, names = _OPS[func]
    bound = dict(zip(names, args))
    if kwargs:
        bound.update(kwargs)
    checked = False
    with torch._C._DisableTorchDispatch():
        if rule == "rows":
            weight = bound.get("weight")
            if isinstance(weight, torch.Tensor) and weight.dim() > 0:
                checked = _check(name, bound.get("indices"), weight.size(0), negative, values, "rows", 0)
        elif rule == "list":
            checked = _check_list(name, bound.get("self"), bound.get("indices"), values)
        else:
            table = bound.get("self")
            if not isinstance(table, torch.Tensor) or table.dim() == 0:
                return False
            if rule == "flat":
                return _check(name, bound.get("index"), table.numel(), negative, values, "elements", None)
            dim = bound.get("dim")
            if not isinstance(dim, int) or not -table.dim() <= dim < table.dim():
                return False  # the kernel refuses the dimension itself
            dim = dim % table.dim()
            checked = _check(name, bound.get("index"), table.size(dim), negative, values, "size", dim)
    return checked


def _check_list(name: str, table: Any, indices: Any, values: Callable[[Any], Optional[torch.Tensor]]) -> bool:
    """``table[indices]``: each integral index tensor indexes the next dimension, a boolean mask
    (bool or uint8) as many as it has, None one."""
    if not isinstance(table, torch.Tensor) or not isinstance(indices, (list, tuple)):
        return False
    checked, dim = False, 0
    for index in indices:
        if dim >= table.dim():
            return checked  # more indices than dimensions: the kernel refuses that itself
        if index is None:
            dim += 1
        elif not isinstance(index, torch.Tensor):
            return checked
        elif index.dtype in (torch.bool, torch.uint8):
            dim += index.dim()
        else:
            checked = _check(name, index, table.size(dim), True, values, "size", dim) or checked
            dim += 1
    return checked


def _check(
    name: str, index: Any, size: int, negative: bool, values: Callable[[Any], Optional[torch.Tensor]], what: str,
    dim: Optional[int],
) -> bool:
    if not isinstance(index, torch.Tensor) or index.dtype not in INTEGRAL or index.dtype is torch.bool:
        return False
    value = known_value(index, values)
    if value is None:
        return False
    if value.numel() == 0:
        return True
    least_found, most_found = torch.aminmax(value)
    low, high = int(least_found), int(most_found)
    least = -size if negative else 0
    if least <= low and high < size:
        return True
    worst = high if high >= size else low
    error = _error(name, worst, size, least, what, dim)
    # the real kernel's exception (a forward catching IndexError catches it), marked as the
    # real kernel's refusal for the tracer (dispatch.py: the count's error names the module)
    raise error from IndexOutOfRange(error)


def _error(name: str, worst: int, size: int, least: int, what: str, dim: Optional[int]) -> BaseException:
    span = f"{least:,} to {size - 1:,}" if least else f"0 to {size - 1:,}"
    if what == "rows":
        table = f"its table has {size:,} rows (indices {span})"
        remedy = (f"give inputs that index at most row {size - 1:,} (a table of positions: at most {size:,} "
                  "tokens; of token ids: ids below its vocabulary size)")
    elif what == "elements":
        table = f"the tensor it reads has {size:,} elements (indices {span})"
        remedy = "give inputs whose indices stay in that range"
    else:
        table = f"the dimension {dim} it indexes has size {size:,} (indices {span})"
        remedy = "give inputs whose indices stay in that range (shorter sequences or fewer positions)"
    message = f"aten::{name.rstrip('_')} reads index {worst:,}, but {table}, so the real forward raises here: {remedy}"
    return IndexError(message) if name in _INDEX_ERROR else RuntimeError(message)
