"""Module bookkeeping both tracers share: canonical module names, the module call
stack seen through process-wide forward hooks, and the error naming the failing module."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from flopcount.core.diagnostics import module_place
from flopcount.errors import TraceError


def module_names(model: nn.Module) -> Dict[nn.Module, str]:
    """Each module's canonical qualified name (the first one ``named_modules()`` gives)."""
    names: Dict[nn.Module, str] = {}
    for name, module in model.named_modules():
        names.setdefault(module, name)
    return names


#: a run's hand-over of one module's output: its qualified name, and what is given the output
#: each time that module's forward returns (the decoding loop keeps an encoder-decoder's encoder output)
ModuleOutput = Tuple[str, Callable[[Any], None]]


def _nothing(output: Any) -> None:
    return None


class ModuleStack:
    """Tracks which modules are running, through process-wide forward hooks that are
    removed on exit. Nothing is added to the model's own hook dictionaries. The hooks
    answer only the thread that entered the stack, and only modules of the traced model.

    ``stack`` holds qualified names, outermost first, without the root, and ``path``
    the same as a tuple (kept ready for tracers that stamp every op with it). After a
    forward raises, both still hold the path of the module that failed.

    ``hand_over`` (a :data:`ModuleOutput`): the output of the module of that name is given to
    its callable as the module returns, through the same hooks (none added).
    """

    def __init__(self, names: Mapping[nn.Module, str], hand_over: Optional[ModuleOutput] = None):
        self._names = names
        self._hand_over = hand_over
        self.stack: List[str] = []
        self.path: Tuple[str, ...] = ()
        self.calls: Dict[str, int] = {}
        #: calls of the traced model's modules made by other threads while this stack was
        #: entered: the model was in use elsewhere (a real run then leaves its state alone)
        self.foreign_calls = 0
        self._handles: List[Any] = []

    def __enter__(self) -> ModuleStack:
        from torch.nn.modules import module as module_impl

        names, stack, calls = self._names, self.stack, self.calls
        # the hooks are process-wide: answer only the thread that traces, so a model run
        # (or counted) in another thread at the same time is not booked here
        owner = threading.get_ident()
        ident, find, counted = threading.get_ident, names.get, calls.get  # bound once: they run per module call
        wanted, give = self._hand_over if self._hand_over is not None else ("", _nothing)

        def pre(module: nn.Module, args: Any) -> None:
            if ident() != owner:
                if module in names:
                    self.foreign_calls += 1
                return
            name = find(module)
            if name is not None:
                calls[name] = counted(name, 0) + 1
                if name:
                    stack.append(name)
                    self.path = tuple(stack)

        def post(module: nn.Module, args: Any, output: Any) -> None:
            if ident() != owner:
                return
            name = find(module)
            if name:
                self.pop(name)
                if name == wanted:
                    give(output)

        self._handles = [
            module_impl.register_module_forward_pre_hook(pre),
            module_impl.register_module_forward_hook(post),
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def pop(self, name: str) -> None:
        """Leave module ``name`` if it is the innermost one running."""
        stack = self.stack
        if stack and stack[-1] == name:
            stack.pop()
            self.path = tuple(stack)

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else ""


_TORCHSCRIPT_FAILED = "The following operation failed in the TorchScript interpreter."


def _error_line(exc: BaseException) -> str:
    """``Type: first line`` of ``exc``; for an error raised inside TorchScript, whose first line only
    says so, the error it ends with and the innermost line of TorchScript's traceback."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0] != _TORCHSCRIPT_FAILED or len(lines) < 2:
        return f"{type(exc).__name__}: {lines[0]}"
    error = lines[-1] if not lines[-1].endswith(":") else f"{lines[-1]} (no message)"
    marks = [i for i, line in enumerate(lines) if line.endswith("<--- HERE") and i > 0]
    files = [line for line in lines[: marks[-1]] if line.startswith("File ")] if marks else []
    if not files:
        return f"{error} (in TorchScript)"
    return f"{error} (in TorchScript, {files[-1]}: {lines[marks[-1] - 1]})"


#: what torch says when a nested tensor meets a dispatch mode (jagged: its subclass's ops; strided: its sizes)
_NESTED_SAYS = ("NestedTensor", "aten::_nested_")
_NESTED_CODE = os.sep + os.path.join("torch", "nested") + os.sep


#: what torch says when a forward run with grad mode off differentiates a tensor it made
_GRADLESS_SAYS = ("does not require grad and does not have a grad_fn", "One of the differentiated Tensors does not require grad")


def _differentiates_without_grad(exc: BaseException) -> bool:
    """Whether ``exc`` is the forward's own ``autograd.grad``/``backward`` failing because the
    run turned grad mode off (a forward-only count: asked while that run is still on)."""
    return not torch.is_grad_enabled() and isinstance(exc, RuntimeError) and any(said in str(exc) for said in _GRADLESS_SAYS)


def _nested_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is torch failing to run a nested tensor (``torch.nested``) under the run's
    modes: its message names the nested tensor's kernels, or it was raised in torch.nested's code."""
    text = str(exc)
    if any(said in text for said in _NESTED_SAYS):
        return True
    frame = exc.__traceback__
    while frame is not None:
        if _NESTED_CODE in frame.tb_frame.f_code.co_filename:
            return True
        frame = frame.tb_next
    return False


def forward_error(exc: BaseException, where: str, inputs_text: str, run: str) -> TraceError:
    """A TraceError naming the module that failed, what ran the forward (``run``: the tracer the
    caller chose, ``"auto tracer"`` for the default count, or ``"benchmark"``) and the inputs given,
    chained to ``exc``; a nested tensor's failure says so (branch wild7: torch's own message named
    a backend kernel or an "internal error")."""
    place = module_place(where)
    nested = (
        "nested tensors (torch.nested, jagged or strided) do not run under a torch dispatch mode or "
        "torch.jit in this torch (FlopCounterMode fails on them too), so flopcount cannot count them: count "
        "the model on the padded tensors (nt.to_padded_tensor(0.0)); torch said "
        if run != "benchmark" and _nested_failure(exc) else ""
    )
    if not nested and _differentiates_without_grad(exc):
        nested = (
            "the forward differentiates inside itself (torch.autograd.grad or .backward(): a MAML inner step, a "
            "gradient penalty) and a forward-only count runs it with grad mode off, as inference: enable grad "
            "where the forward differentiates (with torch.enable_grad(): ...), or count with backward=True; torch said "
        )
    err = TraceError(
        f"forward failed in {place} ({run}) with inputs {inputs_text}: {nested}{_error_line(exc)}",
        module_path=where,
        input_shapes=inputs_text,
    )
    return err


def failing_module(exc: BaseException, names: Mapping[nn.Module, str]) -> Optional[str]:
    """The qualified name of the innermost module of ``names`` whose code was running when
    ``exc`` was raised (the last frame of its traceback whose ``self`` is that module: its
    forward, or ``nn.Module.__call__`` around it), read after the fact without hooks (a timed run
    has none); None when no frame belongs to one (the failure was not the forward's)."""
    found: Optional[str] = None
    frame = exc.__traceback__
    while frame is not None:
        owner = frame.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module):
            found = names.get(owner, found)
        frame = frame.tb_next
    return found
