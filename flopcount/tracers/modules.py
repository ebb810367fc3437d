"""What both tracers share: input flattening, module names, the module call stack,
and leaving the model (and process) exactly as it was found."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from ..errors import FlopcountWarning, TraceError, UsageError

# --------------------------------------------------------------------------- inputs


def as_call_args(inputs: Any, kwargs: Optional[Mapping[str, Any]]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """flopcount's input convention: a tuple is unpacked into positional arguments;
    anything else (a Tensor, list, dict, nested container) is ONE positional argument."""
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise UsageError(f"kwargs must be a mapping of keyword arguments, got {type(kwargs).__name__}")
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    return args, dict(kwargs or {})


def flatten_tensors(obj: Any) -> Tuple[List[torch.Tensor], Callable[[Sequence[torch.Tensor]], Any]]:
    """Every tensor inside ``obj`` (tuples, lists, dicts, dataclasses, nested) and a
    function that rebuilds ``obj`` with replacement tensors in the same order."""
    tensors: List[torch.Tensor] = []

    def walk(node: Any) -> Callable[[Sequence[torch.Tensor]], Any]:
        if isinstance(node, torch.Tensor):
            index = len(tensors)
            tensors.append(node)
            return lambda values: values[index]
        if isinstance(node, tuple) and hasattr(node, "_fields"):  # namedtuple
            parts = [walk(v) for v in node]
            return lambda values: type(node)(*(p(values) for p in parts))
        if isinstance(node, (tuple, list)):
            parts = [walk(v) for v in node]
            kind = type(node)
            return lambda values: kind(p(values) for p in parts) if kind in (tuple, list) else kind([p(values) for p in parts])
        if isinstance(node, Mapping):
            items = [(k, walk(v)) for k, v in node.items()]
            kind = type(node)

            def rebuild_mapping(values: Sequence[torch.Tensor]) -> Any:
                rebuilt = {k: p(values) for k, p in items}
                if kind is dict:
                    return rebuilt
                try:
                    return kind(rebuilt)
                except Exception:
                    return OrderedDict(rebuilt) if isinstance(node, OrderedDict) else rebuilt

            return rebuild_mapping
        return lambda values: node

    rebuild = walk(obj)
    return tensors, rebuild


def output_tensors(obj: Any) -> List[torch.Tensor]:
    """Tensors inside a model's output (tensors, containers, dataclasses, HF ModelOutput)."""
    found: List[torch.Tensor] = []
    stack = [obj]
    seen = set()
    while stack:
        node = stack.pop()
        if isinstance(node, torch.Tensor):
            found.append(node)
        elif isinstance(node, Mapping):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, (tuple, list)):
            stack.extend(reversed(node))
        elif dataclasses.is_dataclass(node) and not isinstance(node, type) and id(node) not in seen:
            seen.add(id(node))
            stack.extend(reversed([getattr(node, f.name) for f in dataclasses.fields(node)]))
    return found


def describe_inputs(inputs: Any, kwargs: Optional[Mapping[str, Any]] = None) -> str:
    """A short human description of example inputs, e.g. ``(Tensor[1, 3, 224, 224] float32)``."""

    def one(node: Any) -> str:
        if isinstance(node, torch.Tensor):
            dtype = str(node.dtype).replace("torch.", "")
            where = "" if node.device.type == "cpu" else f" {node.device.type}"
            return f"Tensor[{', '.join(str(s) for s in node.shape)}] {dtype}{where}"
        if isinstance(node, Mapping):
            return "{" + ", ".join(f"{k!r}: {one(v)}" for k, v in node.items()) + "}"
        if isinstance(node, tuple):
            return "(" + ", ".join(one(v) for v in node) + ("," if len(node) == 1 else "") + ")"
        if isinstance(node, list):
            return "[" + ", ".join(one(v) for v in node) + "]"
        text = repr(node)
        return text if len(text) <= 40 else text[:37] + "..."

    text = one(inputs)
    if kwargs:
        text += " with kwargs {" + ", ".join(f"{k}={one(v)}" for k, v in kwargs.items()) + "}"
    return text


# --------------------------------------------------------------------------- modules


def module_names(model: nn.Module) -> Dict[nn.Module, str]:
    """Each module's canonical qualified name (the first one ``named_modules()`` gives)."""
    names: Dict[nn.Module, str] = {}
    for name, module in model.named_modules():
        names.setdefault(module, name)
    return names


class ModuleStack:
    """Tracks which modules are running, through process-wide forward hooks that are
    removed on exit. Nothing is added to the model's own hook dictionaries.

    ``stack`` holds qualified names, outermost first, without the root. After a
    forward raises, ``stack`` still holds the path of the module that failed.
    """

    def __init__(self, names: Mapping[nn.Module, str]):
        self._names = names
        self.stack: List[str] = []
        self.calls: Dict[str, int] = {}
        self._handles: List[Any] = []

    def __enter__(self) -> "ModuleStack":
        from torch.nn.modules import module as module_impl

        names, stack, calls = self._names, self.stack, self.calls

        def pre(module: nn.Module, args: Any) -> None:
            name = names.get(module)
            if name is not None:
                calls[name] = calls.get(name, 0) + 1
                if name:
                    stack.append(name)

        def post(module: nn.Module, args: Any, output: Any) -> None:
            name = names.get(module)
            if name and stack and stack[-1] == name:
                stack.pop()

        self._handles = [
            module_impl.register_module_forward_pre_hook(pre),
            module_impl.register_module_forward_hook(post),
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else ""


# --------------------------------------------------------------------------- state


@functools.lru_cache(maxsize=None)
def fake_tensor_type() -> Optional[type]:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # pragma: no cover - very old or stripped torch
        return None
    return FakeTensor


def is_dataless(tensor: torch.Tensor) -> bool:
    """True for tensors without data (meta device, FakeTensors): shapes only."""
    if tensor.device.type == "meta":
        return True
    fake = fake_tensor_type()
    return fake is not None and isinstance(tensor, fake)


@contextlib.contextmanager
def preserved_model_state(model: nn.Module) -> Iterator[None]:
    """Leave ``model`` as found whatever the forward does: training flags, buffers
    (BatchNorm running stats) bit for bit, ``requires_grad``, ``.grad``, the hook
    dictionaries, grad mode and the RNG state (dropout draws from it)."""
    modules = list(model.modules())
    flags = [(m, m.training) for m in modules]
    buffers = []
    for m in modules:
        for name, buf in m._buffers.items():
            if buf is not None:
                buffers.append((m, name, buf, None if is_dataless(buf) else buf.detach().clone()))
    params = list(model.parameters())
    param_state = [(p, p.requires_grad, p.grad, p._version) for p in params]
    hook_attrs = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks")
    hooks = [(m, attr, dict(getattr(m, attr))) for m in modules for attr in hook_attrs if hasattr(m, attr)]
    grad_enabled = torch.is_grad_enabled()
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_grad_enabled(grad_enabled)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        for m, mode in flags:
            m.training = mode
        with torch.no_grad():
            for m, name, buf, saved in buffers:
                m._buffers[name] = buf
                if saved is not None and (buf.shape != saved.shape or not torch.equal(buf, saved)):
                    buf.copy_(saved) if buf.shape == saved.shape else buf.set_(saved)
        changed = []
        for p, requires_grad, grad, version in param_state:
            p.requires_grad_(requires_grad)
            p.grad = grad
            if p._version != version:
                changed.append(p)
        for m, attr, saved_hooks in hooks:
            current = getattr(m, attr)
            if current.keys() != saved_hooks.keys():
                current.clear()
                current.update(saved_hooks)
        if changed:
            warnings.warn(
                f"the model's forward changed {len(changed)} parameter(s) in place; flopcount cannot undo that",
                FlopcountWarning,
                stacklevel=3,
            )


def forward_error(exc: BaseException, where: str, inputs_text: str, tracer: str) -> TraceError:
    """A TraceError naming the module that failed and the inputs given, chained to ``exc``."""
    place = f"module '{where}'" if where else "the root module"
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    err = TraceError(
        f"forward failed in {place} ({tracer} tracer) with inputs {inputs_text}: {type(exc).__name__}: {first_line}",
        module_path=where,
        input_shapes=inputs_text,
    )
    return err
