"""Values of small integer and boolean meta tensors that the shapes alone decide.

On the meta device ``torch.arange(T)``, ``torch.ones(B, T)`` and what is computed from them
(position ids, their differences, a cumulative sum, a comparison, ``all()``) have values a
real run would have whatever the weights and inputs hold; only the meta tensor cannot show
them. transformers' mask code reads such values into Python (``find_packed_sequence_indices``
asks whether the default position ids are one sequence), which a meta trace would otherwise
answer with a placeholder. :class:`KnownValues` computes each such tensor's value on CPU
beside the meta run: an op whose inputs are all known (or plain scalars, or real CPU
tensors) and whose output is an integral meta tensor of at most ``LIMIT`` elements gets its
value by running the same op on the CPU values. A read of a known tensor is then answered
with its true value. Anything derived from the model's inputs or weights (no value on meta),
from a random op, or larger than ``LIMIT`` stays unknown; an in-place op that cannot be
followed (a write into a meta tensor from an unknown value) forgets every value.

The same holds for fake tensors (a fake copy's run: ``torch.arange(T)`` made in the forward of a
model with real weights), which :class:`KnownValues` follows alike when told to
(``fakes=True``): their values are computed on the CPU below every dispatch mode (the fake mode
under the run would make a fake of a factory's result).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from flopcount.core.inputs import fake_tensor_type, flatten_tensors, output_tensors

__all__ = ["INTEGRAL", "LIMIT", "UNDECIDED", "KnownValues", "Unknown", "cpu_value", "keep_value", "run_on_cpu"]

#: the largest tensor (elements) whose value is followed: position ids and masks of a few
#: thousand tokens, not a (T x T) mask of a long context
LIMIT = 1 << 16
INTEGRAL = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
_aten = torch.ops.aten
#: ops whose result has no value a real run decides (uninitialised memory)
UNDECIDED = frozenset({
    _aten.empty, _aten.empty_like, _aten.empty_strided, _aten.new_empty, _aten.new_empty_strided, _aten.empty_permuted,
})
_CPU = torch.device("cpu")


class Unknown(Exception):
    """A tensor whose value is not followed."""


def cpu_value(values: Any, tensor: torch.Tensor, followed: bool, limit: int) -> torch.Tensor:
    """``tensor``'s CPU value: the one ``values`` holds for a ``followed`` tensor, else ``tensor``
    itself when it is a real CPU tensor of at most ``limit`` elements; :class:`Unknown` otherwise."""
    if followed:
        known = values.get(tensor)
        if known is None:
            raise Unknown
        return known
    if tensor.device.type != "cpu" or tensor.numel() > limit:
        raise Unknown
    return tensor


#: an aten argument kept as it is (no tensor inside)
_LEAVES = frozenset({
    int, float, bool, complex, str, type(None), torch.dtype, torch.layout, torch.memory_format, torch.SymInt,
    torch.SymFloat, torch.SymBool,
})


class _NotPlain(Exception):
    """An argument :func:`_plain` does not walk (``flatten_tensors`` does)."""


def _plain(value: Any, on_cpu: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` with each tensor's ``on_cpu`` value inside plain lists and tuples;
    :class:`_NotPlain` for any other container or object."""
    kind = type(value)
    if kind in _LEAVES:
        return value
    if isinstance(value, torch.Tensor):
        return on_cpu(value)
    if kind is list or kind is tuple:
        return kind(_plain(item, on_cpu) for item in value)
    raise _NotPlain


def run_on_cpu(
    func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], on_cpu: Callable[[torch.Tensor], torch.Tensor],
    moved: Callable[[Any], bool],
) -> Any:
    """``func`` run on each tensor argument's ``on_cpu`` value, each device argument that is
    ``moved`` made cpu (an aten schema takes a device only as an argument of its own, never
    inside a list). Arguments that are tensors, plain scalars, devices or plain lists and tuples
    of them (an aten op's: ~5x cheaper to build) are walked directly; any other object by
    ``flatten_tensors``."""

    def top(value: Any) -> Any:
        if moved(value):
            return _CPU
        return value if type(value) is torch.device else _plain(value, on_cpu)

    try:
        cpu_args = tuple(top(a) for a in args)
        cpu_kwargs = {k: top(v) for k, v in kwargs.items()}
    except _NotPlain:
        tensors, rebuild = flatten_tensors((args, kwargs))
        cpu_args, cpu_kwargs = rebuild([on_cpu(t) for t in tensors])
        cpu_args = tuple(_CPU if moved(a) else a for a in cpu_args)
        cpu_kwargs = {k: _CPU if moved(v) else v for k, v in cpu_kwargs.items()}
    return func(*cpu_args, **cpu_kwargs)


def keep_value(values: Any, out: torch.Tensor, value: Any) -> bool:
    """Hold ``value`` as ``out``'s when it is a tensor of ``out``'s shape and dtype; whether it was."""
    if isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(out.shape) and value.dtype == out.dtype:
        values[out] = value
        return True
    return False


class KnownValues:
    """Meta tensor (and, with ``fakes``, fake tensor) -> its CPU value, for the tensors whose
    value the shapes decide."""

    def __init__(self, fakes: bool = False) -> None:
        self._values = WeakIdKeyDictionary()
        #: the fake tensor class when fakes are followed too, else None
        self.fake: Any = fake_tensor_type() if fakes else None

    def value(self, tensor: Any) -> Optional[torch.Tensor]:
        """The CPU value of ``tensor`` when known, else None."""
        if not isinstance(tensor, torch.Tensor) or not self._followed(tensor):
            return None
        found = self._values.get(tensor)
        return found if isinstance(found, torch.Tensor) else None

    def note(self, func: Any, args: Tuple[Any, ...], kwargs: Optional[Dict[str, Any]], out: Any) -> bool:
        """Follow ``func(*args, **kwargs) -> out`` when its output's value is decided; whether the
        values known changed (one kept, or every one forgotten)."""
        if not isinstance(out, torch.Tensor) or not self._followed(out):
            return self._forget(func, args)
        if (
            out.dtype not in INTEGRAL or out.numel() > LIMIT or torch.Tag.nondeterministic_seeded in func.tags
            or func.overloadpacket in UNDECIDED  # uninitialised memory: no value a real run decides
        ):
            return self._forget(func, args)
        try:
            # below every dispatch mode: a fake mode under the run would make a fake of a factory's result
            with torch._C._DisableTorchDispatch():
                value = run_on_cpu(func, args, kwargs or {}, self._on_cpu, _off_cpu)
        except Exception:  # an unknown input, or an op the CPU refuses: the value stays unknown
            return self._forget(func, args)
        return keep_value(self._values, out, value) or self._forget(func, args)

    def _followed(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is of a kind followed here (its value may be known): meta, or a fake."""
        return tensor.device.type == "meta" or (self.fake is not None and isinstance(tensor, self.fake))

    def _on_cpu(self, tensor: torch.Tensor) -> torch.Tensor:
        return cpu_value(self._values, tensor, self._followed(tensor), LIMIT)

    def __bool__(self) -> bool:
        return len(self._values) > 0

    def _forget(self, func: Any, args: Tuple[Any, ...]) -> bool:
        """An op that writes into a followed tensor and could not be followed: every value is
        forgotten (the tensor written may be a view of a known one, or have known views); whether
        any was."""
        if len(self._values) and func._schema.is_mutable and any(self._followed(t) for t in output_tensors(args)):
            self._values = WeakIdKeyDictionary()
            return True
        return False


def _off_cpu(value: Any) -> bool:
    """A device argument the CPU run replaces with the CPU's (meta, or a fake's device)."""
    return isinstance(value, torch.device) and value.type != "cpu"
