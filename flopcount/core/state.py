"""The caller's process and tensors as found: the random generators and the input tensors
(a forward that writes to its inputs in place). Shared by the tracers and the benchmark."""

from __future__ import annotations

import contextlib
import functools
import itertools
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from flopcount.core.inputs import is_dataless


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore the CPU (and initialised CUDA) RNG state on exit.

    The generators are process-wide: restoring them also rewinds every draw another thread
    made meanwhile (issue #29 item 18). So only work that draws random numbers on real
    tensors and is timed uses this (a benchmark's or a profile's real steps, where a
    dispatch mode would distort the time); a count on fake tensors draws nothing and touches
    no generator, and the dispatch tracer's real run draws on generators of its own
    (:class:`PrivateRandom`; the jit tracer's sets the RNG back when its trace drew)."""
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


class PrivateRandom:
    """A TorchDispatchMode that runs every random op of the entering thread on generators of
    its own, so a real run that draws (train-mode dropout, ``randn`` in a forward) neither
    advances the caller's generators nor has to set them back (issue #29 item 18: setting the
    process-wide generator back rewinds every draw another thread made meanwhile).

    Each private generator starts from a copy of the state of the generator the op would have
    drawn from (the device's default generator, or a ``generator=`` the call names): the run
    draws exactly what it would have drawn, and the caller's generator is only read. Ops whose
    schema takes a ``generator`` get the private one; overloads without that argument
    (``rand.default``, ``randint_like.low_dtype``...) run as their ``generator`` sibling;
    ``native_dropout`` is run as the ``bernoulli_`` mask it draws. A drawing op none of this
    covers (the CPU flash-attention kernel with ``dropout_p > 0``, cuDNN's RNN with dropout, a
    device other than CPU and CUDA) draws from the process's generator: :attr:`fell_back` is
    then True and the caller sets that generator back as before. Dataless tensors (meta, fake)
    draw nothing and pass through. The mode stack is per thread: other threads are not seen.
    Not usable under torch.jit tracing: any dispatch mode changes what jit records."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        owner = self

        class _Mode(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # no dynamo-disabling shim around each op: a per-op cost, and a toggle of the
                # interpreter's frame evaluation on every op while other threads run
                return False

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                return owner._dispatch(func, args, kwargs or {})

        self._mode = _Mode()
        self._generators: Dict[Any, torch.Generator] = {}
        #: a random op drew from the process's generator (see the class docstring)
        self.fell_back = False

    def __enter__(self) -> PrivateRandom:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def _dispatch(self, func: Any, args: Any, kwargs: Dict[str, Any]) -> Any:
        if not _seeded_overload(func):
            return func(*args, **kwargs)
        index = _generator_index(func)
        if index is None:
            if func is torch.ops.aten.native_dropout.default:
                return self._dropout(func, args, kwargs)
            sibling = _with_generator(func)
            if sibling is None:
                if _draws(func, args, kwargs) and not _dataless_call(args, kwargs):
                    self.fell_back = True
                return func(*args, **kwargs)
            func, index = sibling, _generator_index(sibling)
            assert index is not None
        given = args[index] if index < len(args) else kwargs.get("generator")
        if _dataless_call(args, kwargs):
            return func(*args, **kwargs)
        private = self._private(given, _device_of(args, kwargs))
        if private is None:
            self.fell_back = True
            return func(*args, **kwargs)
        if index < len(args):
            args = tuple(args[:index]) + (private,) + tuple(args[index + 1 :])
        else:
            kwargs = dict(kwargs, generator=private)
        return func(*args, **kwargs)

    def _private(self, given: Optional[torch.Generator], device: torch.device) -> Optional[torch.Generator]:
        """The private twin of ``given`` (or of ``device``'s default generator), made on first use."""
        source = given
        if source is None:
            if device.type == "cpu":
                source = torch.default_generator
            elif device.type == "cuda":
                index = device.index if device.index is not None else torch.cuda.current_device()
                source = torch.cuda.default_generators[index]
            else:
                return None
        key = id(source)
        private = self._generators.get(key)
        if private is None:
            private = torch.Generator(device=source.device)
            private.set_state(source.get_state())  # a read of the caller's generator, never a write
            self._generators[key] = private
        return private

    def _dropout(self, func: Any, args: Any, kwargs: Dict[str, Any]) -> Any:
        """``native_dropout(input, p, train)`` with its mask drawn on the private generator:
        ``mask ~ Bernoulli(1 - p)``, ``output = input * mask / (1 - p)`` (zeros for p = 1)."""
        names = ("input", "p", "train")
        bound = dict(zip(names, args), **kwargs)
        tensor, p, train = bound["input"], float(bound["p"]), bound.get("train")
        if train is False or _dataless_call((tensor,), {}):
            return func(*args, **kwargs)
        private = self._private(None, tensor.device)
        if private is None:
            self.fell_back = True
            return func(*args, **kwargs)
        mask = torch.empty_like(tensor, dtype=torch.bool).bernoulli_(1.0 - p, generator=private)
        scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
        return tensor * mask * scale, mask


@functools.cache
def _seeded_overload(func: Any) -> bool:
    tag = getattr(torch.Tag, "nondeterministic_seeded", None)
    return tag is not None and tag in getattr(func, "tags", ())


@functools.cache
def _generator_index(func: Any) -> Optional[int]:
    for index, argument in enumerate(func._schema.arguments):
        if argument.name == "generator":
            return index
    return None


@functools.cache
def _with_generator(func: Any) -> Any:
    """The overload of the same op whose arguments are ``func``'s plus ``generator``."""
    names = [a.name for a in func._schema.arguments]
    packet = func.overloadpacket
    for name in packet.overloads():
        other = getattr(packet, name)
        other_names = [a.name for a in other._schema.arguments]
        if "generator" in other_names and [n for n in other_names if n != "generator"] == names:
            return other
    return None


def _draws(func: Any, args: Any, kwargs: Dict[str, Any]) -> bool:
    """Whether a seeded op without a generator draws here: attention and RNN kernels draw
    only with a dropout probability above zero in training."""
    bound = {a.name: v for a, v in zip(func._schema.arguments, args)}
    bound.update(kwargs)
    for key in ("dropout_p", "dropout"):
        if key in bound and not bound[key]:
            return False
    return not ("train" in bound and bound["train"] is False)


def _tensors(args: Any, kwargs: Dict[str, Any]) -> Iterator[torch.Tensor]:
    for value in itertools.chain(args, kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (item for item in value if isinstance(item, torch.Tensor))


def _dataless_call(args: Any, kwargs: Dict[str, Any]) -> bool:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "meta":
        return True
    return any(is_dataless(t) for t in _tensors(args, kwargs))


def _device_of(args: Any, kwargs: Dict[str, Any]) -> torch.device:
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device)
    for tensor in _tensors(args, kwargs):
        return tensor.device
    return torch.device("cpu")


def _layout(tensor: torch.Tensor) -> Tuple[Any, ...]:
    """Shape, strides and offset of a strided tensor; the shape of a sparse one (COO, CSR,
    CSC, BSR, BSC tensors have no strides)."""
    if tensor.layout != torch.strided:
        return (tensor.shape, tensor.layout)
    return (tensor.shape, tensor.stride(), tensor.storage_offset())
#: random ops whose ``train`` argument turns the draw off (eval-mode dropout draws nothing)
_TRAIN_GATED = ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "native_dropout", "rrelu")


@functools.cache
def _seeded(op: str) -> bool:
    """``aten::name`` (any overload) carries torch's ``nondeterministic_seeded`` tag: it draws
    from a generator. An op torch does not know (a custom op) counts as drawing."""
    namespace, _, name = op.partition("::")
    packet = getattr(getattr(torch.ops, namespace, None), name.split(".")[0], None) if name else None
    if packet is None:
        return namespace not in ("aten", "prim")
    tag = getattr(torch.Tag, "nondeterministic_seeded", None)
    try:
        overloads = [getattr(packet, overload) for overload in packet.overloads()]
    except (AttributeError, RuntimeError):
        return True
    return tag is None or any(tag in getattr(overload, "tags", ()) for overload in overloads)


def draws_random(events: Iterable[Any]) -> bool:
    """True when one of the trace's events drew random numbers from a generator (dropout in
    train mode, ``randn``, ``bernoulli_``...): the real run advanced the process's RNG."""
    for event in events:
        call = event.call
        op = call.op
        if not _seeded(op):
            continue
        if op.partition("::")[2].split(".")[0].rstrip("_") in _TRAIN_GATED:
            if call.arg("train") is False or call.arg("training") is False or call.arg("p") == 0:
                continue
        return True
    return False


@contextlib.contextmanager
def preserved_inputs(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Give the caller's input tensors back exactly as found, even when the forward
    writes to them in place (``x.add_(1)``, ``x.relu_()``): their values, ``requires_grad``
    and ``.grad``. Each tensor with data is copied first; a copy is only written back to a
    tensor whose version counter moved."""
    saved: List[Tuple[torch.Tensor, int, Tuple[Any, ...], torch.Tensor, bool, Any]] = []
    seen = set()
    for tensor in tensors:
        if id(tensor) in seen or is_dataless(tensor):
            continue
        seen.add(id(tensor))
        layout = _layout(tensor)
        saved.append((tensor, tensor._version, layout, tensor.detach().clone(), tensor.requires_grad, tensor.grad))
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, version, layout, copy, requires_grad, grad in saved:
                if _layout(tensor) != layout and tensor.layout == torch.strided:
                    shape, stride, offset = layout
                    tensor.as_strided_(shape, stride, offset)
                if tensor._version != version:
                    tensor.copy_(copy)
                if tensor.is_leaf:
                    tensor.requires_grad_(requires_grad)
                    tensor.grad = grad
