"""A shape cache in front of FakeTensorMode, for the default (fake) path.

On fake tensors an op's result depends only on the metadata of its arguments (shapes,
strides, dtypes, devices) and on its non-tensor arguments. FakeTensorMode computes it by
running the op's meta kernel (often Python, such as convolution's) behind a general cache
whose key building costs more than the kernel on small models. Most ops a model runs
repeat with the same argument metadata (every block of a ResNet or a transformer), so
this cache keeps, per op and argument metadata, the metadata of the result, and makes the
next result directly: a meta tensor wrapped as a FakeTensor, about 10 µs.

Only what is safe is cached:

* ops whose schema returns fresh tensors (no aliasing, no ``out=``, no mutated argument),
  views of their first argument (one tensor sharing its storage: made on that storage with
  the recorded shape, stride and offset) and in-place ops (``relu_``, ``add_``) whose only effect on metadata is none: they return
  their first argument itself;
* calls whose arguments are FakeTensors of this mode (strided, not complex; no constant folded
  in, except for ops returning fresh tensors, where a constant is keyed apart from a plain fake
  and a result holding a constant is never remembered), Python scalars, dtypes, devices and
  lists of those;
* results made on a first call that succeeded; an op that raised, or needs a value
  (``nonzero``, ``.item()``), is never cached and raises again as before;
* no answer while ``make_fx`` traces (``torch.func.linearize`` inside a forward): its proxy
  mode, below the recorder, must see every op, or it folds the op's result into its graph as
  a constant and the op is never run again (nor counted) when the graph runs.

Every other call goes to FakeTensorMode unchanged.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from flopcount.tracers.fake.making import FakeMaker

__all__ = ["ShapeCache"]

_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)
_UNCACHEABLE = object()
# In-place ops that change their argument's metadata without the inplace_view tag
# (``_resize_output_`` under every out= kernel, ``requires_grad_``, sparse resizes).
_METADATA_WRITERS = ("resize", "requires_grad", "sparse", "coalesced", "set_")
# Ops returning a list of views of their first argument, answered as views are.
_VIEW_LISTS = frozenset({"aten::split", "aten::split_with_sizes", "aten::unbind", "aten::chunk", "aten::tensor_split"})
# Tags that mean the result's metadata is not a function of the argument metadata.
_VALUE_TAGS = ("dynamic_output_shape", "data_dependent_output", "inplace_view", "nondeterministic_seeded")


class _Kind:
    """How an op overload may be cached: "fresh" (new tensors), "inplace" (returns
    argument 0, metadata unchanged), "view" (one tensor sharing argument 0's storage) or
    None (never)."""

    __slots__ = ("mode", "tuple_out")

    def __init__(self, func: Any = None):
        self.mode: Optional[str] = None
        self.tuple_out = False
        if func is None:  # a composite (Python function) known to return one new tensor
            self.mode = "fresh"
            return
        schema = func._schema
        tags = {str(t).rsplit(".", 1)[-1] for t in getattr(func, "tags", ())}
        if any(tag in tags for tag in _VALUE_TAGS if tag != "nondeterministic_seeded"):
            return
        returns = schema.returns
        written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        if schema.name in _VIEW_LISTS and len(returns) == 1 and str(returns[0].type) == "List[Tensor]":
            first = schema.arguments[0] if schema.arguments else None
            if (  # a list of views of the first argument (split, unbind, chunk)
                returns[0].alias_info is not None
                and not returns[0].alias_info.is_write
                and not written
                and first is not None
                and str(first.type) == "Tensor"
                and first.alias_info is not None
                and sum(a.alias_info is not None for a in schema.arguments) == 1
            ):
                self.mode = "views"
            return
        if not returns or any(str(r.type) != "Tensor" for r in returns):
            return
        if any(r.alias_info is not None for r in returns):
            first = schema.arguments[0] if schema.arguments else None
            if (  # a view of the first argument (view, transpose, expand, select, slice...)
                len(returns) == 1
                and not written
                and not returns[0].alias_info.is_write
                and first is not None
                and not first.kwarg_only
                and str(first.type) == "Tensor"
                and first.alias_info is not None
                and set(first.alias_info.after_set) == set(returns[0].alias_info.after_set)
                and sum(a.alias_info is not None for a in schema.arguments) == 1
            ):
                self.mode = "view"
                return
            # in-place: one return, the first argument, written; not a metadata change
            if (
                len(returns) == 1
                and len(written) == 1
                and schema.arguments
                and written[0] is schema.arguments[0]
                and not schema.arguments[0].kwarg_only
                and not any(word in schema.name for word in _METADATA_WRITERS)
            ):
                self.mode = "inplace"
            return
        if written or any(a.alias_info is not None for a in schema.arguments):
            return
        self.mode = "fresh"
        self.tuple_out = len(returns) > 1


_COMPOSITE = _Kind()
_STRIDED = torch.strided
#: the complex dtypes of this torch (a set lookup: ``dtype.is_complex`` costs ~0.6 us on the per-op path)
_COMPLEX = frozenset(d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_complex)
_DEVICE = torch.ops.prim.device.default

# Memos shared by every ShapeCache, like FakeTensorMode's own cache: pure functions of an op
# overload's schema (_KINDS) and of argument metadata and the default dtype (_RESULTS); no
# tensor is kept and nothing here changes behaviour, only speed. Turning the cache off for
# an op after a failure is per ShapeCache (one trace), never process-wide.
_KINDS: Dict[Any, _Kind] = {}
_RESULTS: Dict[Tuple[Any, ...], Any] = {}
_MAX_RESULTS = 50_000


class ShapeCache:
    """Runs ops on fake tensors of ``mode``, remembering the result metadata per op and
    argument metadata; ``run(func, args, kwargs)`` is a drop-in for ``func(*args, **kwargs)``."""

    def __init__(self, mode: Any, fake_type: type, maker: Optional[FakeMaker] = None):
        self._mode = mode
        self._fake_type: Any = fake_type
        self._results = _RESULTS
        # the fake copy's maker when given (one per mode: its check against the constructor made once)
        self._maker = FakeMaker(mode, fake_type) if maker is None else maker
        self._meta = torch.device("meta")
        self.hits = 0
        self.misses = 0
        #: op -> why this call stopped answering it from the cache (reported on the trace);
        #: the choice lasts for this cache, never for the process.
        self.disabled: Dict[str, str] = {}
        self._off: Dict[Any, None] = {}
        #: the key of the call :meth:`run` just answered from the cache or remembered (None:
        #: a call the cache does not know): equal keys, equal argument metadata and results
        self.key: Any = None
        self._constants = False  # whether the key being built may hold a fake's constant (fresh ops)

    def run(self, func: Any, args: Tuple[Any, ...], kwargs: Optional[Dict[str, Any]]) -> Any:
        self.key = None
        if func is _DEVICE and not kwargs and len(args) == 1:
            # ``tensor.device`` read by a kernel (batch norm reads it twice): a fake answers its
            # fake device outside a kernel's run, as FakeTensor.__torch_dispatch__ does
            tensor = args[0]
            if type(tensor) is self._fake_type and tensor.fake_mode is self._mode and not getattr(self._mode, "in_kernel_invocation", True):
                return tensor.fake_device
            return func(*args)
        kind = _KINDS.get(func)
        if kind is None:
            kind = _KINDS[func] = _Kind(func)
        if kind.mode is None or func in self._off:
            return func(*args, **kwargs) if kwargs else func(*args)
        # a fresh result may come from arguments holding constants (a KV cache's ``torch.tensor([])``
        # concatenated with a fake): keyed apart from plain fakes, and remembered only when the
        # mode's result holds none (with every argument constant it would: never remembered)
        self._constants = kind.mode == "fresh"
        key = self._key(func, args, kwargs)
        self._constants = False
        if key is _UNCACHEABLE:
            return func(*args, **kwargs) if kwargs else func(*args)
        found = self._results.get(key)
        # While make_fx traces (torch.func.linearize in a forward), its proxy mode sits below the
        # recorder: a result made here never reaches it, so its graph would hold the result as a
        # constant and the constant folding after it would skip the op (the primal's Linears)
        if found is not None and get_proxy_mode() is None:
            self.key = key
            self.hits += 1
            if kind.mode == "inplace":
                return args[0]
            try:
                if kind.mode == "view":
                    if args[0].is_inference() == torch.is_inference_mode_enabled():
                        return self._view(args[0], found)
                    # a view is an inference tensor when its argument is one; ours would be one
                    # when made in inference mode: the mode makes it (a rare mix)
                    return func(*args, **kwargs) if kwargs else func(*args)
                if kind.mode == "views":
                    if args[0].is_inference() == torch.is_inference_mode_enabled():
                        container, views = found
                        return container([self._view(args[0], d) for d in views])
                    # a view is an inference tensor when its argument is one; ours would be one
                    # when made in inference mode: the mode makes it (a rare mix)
                    return func(*args, **kwargs) if kwargs else func(*args)
                return self._make(found, kind.tuple_out)
            except Exception as exc:  # a private constructor that changed: FakeTensorMode as before
                self._disable(func, exc)
                return func(*args, **kwargs) if kwargs else func(*args)
        out = func(*args, **kwargs) if kwargs else func(*args)
        if self._remember(key, self._describe(out, kind, args)):
            self.key = key
        return out

    def run_composite(self, func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """Like :meth:`run`, for a whole composite torch function that always returns one
        new tensor (``F.linear``, ``torch.matmul``, SDPA): on a hit, none of its aten ops
        run. Only valid without autograd (the caller checks grad mode)."""
        key = self._key(func, args, kwargs)
        if key is _UNCACHEABLE:
            return func(*args, **kwargs)
        found = self._results.get(key)
        if found is not None and get_proxy_mode() is None:
            self.hits += 1
            try:
                return self._make(found, False)
            except Exception as exc:  # a private constructor that changed: run it as before
                self._disable(func, exc)
                return func(*args, **kwargs)
        out = func(*args, **kwargs)
        self._remember(key, self._describe(out, _COMPOSITE, args))
        return out

    def function_key(self, func: Any, args: Tuple[Any, ...], kwargs: Optional[Dict[str, Any]]) -> Any:
        """The key of a whole torch function's call (None: an argument the cache does not key).
        Batch norm's kernel choice also reads whether cuDNN is enabled: part of the key."""
        if func in self._off:
            return None
        key = self._key(func, args, kwargs)
        return None if key is _UNCACHEABLE else (key, torch.backends.cudnn.enabled)

    def fresh_result(self, out: Any, args: Tuple[Any, ...]) -> Any:
        """The metadata of ``out`` when it is one new fake tensor of this mode (else None)."""
        return self._describe(out, _COMPOSITE, args)

    def made(self, func: Any, described: Any) -> Any:
        """A new fake tensor of :meth:`fresh_result`'s metadata (None, and ``func`` off the cache
        for this trace, when the private constructor fails: the caller runs ``func``). None too
        while ``make_fx`` traces (``torch.func.linearize``): see :meth:`run`."""
        if get_proxy_mode() is not None:
            return None
        try:
            with torch._C._DisableTorchDispatch():
                out = self._fake(*described[0])
        except Exception as exc:  # a private constructor that changed: run it as before
            self._disable(func, exc)
            return None
        self.hits += 1
        return out

    def _disable(self, func: Any, exc: BaseException) -> None:
        self._off[func] = None
        name = str(getattr(func, "__name__", func))
        self.disabled.setdefault(name, f"{type(exc).__name__}: {str(exc)[:120]}")

    def stats(self) -> Dict[str, Any]:
        """Hits, misses and the ops this cache stopped answering (with why)."""
        return {"hits": self.hits, "misses": self.misses, "disabled": dict(self.disabled)}

    def _remember(self, key: Tuple[Any, ...], record: Any) -> bool:
        self.misses += 1
        if record is None:
            return False
        if len(self._results) >= _MAX_RESULTS:
            self._results.clear()
        self._results[key] = record
        return True

    def _key(self, func: Any, args: Tuple[Any, ...], kwargs: Optional[Dict[str, Any]]) -> Any:
        # the default dtype decides the result dtype of, e.g., an int tensor times a float.
        # A plain fake of this mode (most arguments) is keyed here without a call of ``_part``
        # (the per-op path: ~1,200 arguments per ResNet-50 count): the same tuple ``_part`` makes
        parts = [func, torch.get_default_dtype()]
        part, fake, mode = self._part, self._fake_type, self._mode
        for value in args:
            if type(value) is fake and value.fake_mode is mode and value.constant is None and value.layout is _STRIDED:
                dtype = value.dtype
                if dtype in _COMPLEX:
                    return _UNCACHEABLE
                parts.append((value.shape, value.stride(), value.storage_offset(), dtype, value.fake_device))
                continue
            item = part(value)
            if item is _UNCACHEABLE:
                return _UNCACHEABLE
            parts.append(item)
        if kwargs:
            for name, value in kwargs.items():
                item = part(value)
                if item is _UNCACHEABLE:
                    return _UNCACHEABLE
                parts.append(name)
                parts.append(item)
        return tuple(parts)

    def _part(self, value: Any) -> Any:
        kind = type(value)
        if kind is self._fake_type:
            if value.fake_mode is not self._mode or value.layout is not _STRIDED:
                return _UNCACHEABLE
            dtype = value.dtype
            if dtype in _COMPLEX:
                return _UNCACHEABLE
            if value.constant is not None:
                if not self._constants:
                    return _UNCACHEABLE
                return (value.shape, value.stride(), value.storage_offset(), dtype, value.fake_device, "constant")
            return (value.shape, value.stride(), value.storage_offset(), dtype, value.fake_device)
        if kind is int or kind is bool:
            return (kind, value)
        if kind in _SCALARS:
            if kind is float and value == 0.0 and math.copysign(1.0, value) < 0:
                return (kind, value, "-")  # -0.0 == 0.0, but an argument shown to handlers keeps its sign
            return (kind, value)
        if kind is list or kind is tuple:
            items = []
            for item in value:
                if type(item) is int:  # sizes, strides, paddings: no call
                    items.append((int, item))
                    continue
                made = self._part(item)
                if made is _UNCACHEABLE:
                    return _UNCACHEABLE
                items.append(made)
            return (kind, tuple(items))
        return _UNCACHEABLE

    def _describe(self, out: Any, kind: _Kind, args: Tuple[Any, ...]) -> Any:
        if kind.mode == "inplace":
            return True if args and out is args[0] else None
        if kind.mode == "view":
            return self._view_of(out, args)
        if kind.mode == "views":
            if type(out) not in (list, tuple):
                return None
            views = [self._view_of(view, args) for view in out]
            return None if any(v is None for v in views) else (type(out), tuple(views))
        outs: Tuple[Any, ...] = out if kind.tuple_out else (out,)
        if not isinstance(outs, tuple):
            return None
        described = []
        tensor: Any
        for tensor in outs:
            if type(tensor) is not self._fake_type or tensor.fake_mode is not self._mode or tensor.constant is not None:
                return None
            if tensor.storage_offset() or tensor.layout != torch.strided:
                return None
            described.append((tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.fake_device))
        return tuple(described)

    def _view_of(self, out: Any, args: Tuple[Any, ...]) -> Any:
        """The metadata of ``out`` when it is a view of ``args[0]`` on its storage (else None)."""
        if type(out) is not self._fake_type or out.fake_mode is not self._mode or out.constant is not None:
            return None
        if out is args[0] or out.layout != torch.strided:
            return None  # an alias that is the argument itself (a no-op view): left to the mode
        if type(args[0]) is not self._fake_type or out.untyped_storage() is not args[0].untyped_storage():
            return None  # not on the argument's storage after all (an op that views or copies)
        return (tuple(out.shape), out.stride(), out.storage_offset(), out.dtype, out.fake_device)

    def _make(self, described: Any, tuple_out: bool) -> Any:
        with torch._C._DisableTorchDispatch():
            made = tuple(self._fake(*meta) for meta in described)
        return made if tuple_out else made[0]

    def _view(self, base: Any, described: Any) -> Any:
        """A fake of the recorded metadata on ``base``'s storage (what FakeTensorMode makes for a
        view: a meta tensor of the storage wrapped as a fake); autograd's view tracking is above
        the dispatch modes and sees it as the view it is."""
        shape, stride, offset, dtype, device = described
        with torch._C._DisableTorchDispatch():
            meta = torch.empty(0, dtype=dtype, device=self._meta).set_(base.untyped_storage(), offset, shape, stride)
            return self._maker.wrap(meta, device)

    def _fake(self, shape: Any, stride: Any, dtype: torch.dtype, device: torch.device) -> Any:
        return self._maker.make(shape, stride, dtype, device)
