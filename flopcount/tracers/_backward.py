"""The backward pass of a dispatch trace (``backward=True``): running it, and
attributing each backward op to the module whose forward built its autograd node.

The backward differentiates the loss with ``torch.autograd.grad``. A reentrant
activation checkpoint (``torch.utils.checkpoint(..., use_reentrant=True)``, and the
checkpoint Functions of libraries built the same way) recomputes its region inside the
backward of one custom ``autograd.Function`` and refuses ``autograd.grad``: it only runs
under a plain ``.backward()``. When the autograd graph holds one, the backward is a plain
``torch.autograd.backward`` of the same roots and seeds, which differentiates the same
leaves (every tensor that requires grad). That writes ``.grad``, so every ``.grad`` it can
reach is set aside first and put back afterwards, and post-accumulate-grad hooks (an
optimizer stepping in backward) are held back meanwhile: the caller's tensors end as
found, as with ``autograd.grad``.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from flopcount.errors import UsageError
from flopcount.step.loss import backward_roots, differentiable
from flopcount.tracers._modules import ModuleStack

__all__ = ["BackwardAttribution", "run_backward"]


class BackwardAttribution:
    """Maps autograd nodes to the module stack their forward ran in.

    During forward, every module entry and exit appends (next autograd sequence
    number, module stack); a node created inside a module has a sequence number in
    that module's span, so a bisect finds its stack. Needs two private-but-stable
    torch bindings; without them backward ops are attributed to the root.
    """

    def __init__(self, modules: ModuleStack):
        self._modules = modules
        self._stack = modules.stack
        self._peek = getattr(torch._C._autograd, "_get_sequence_nr", None)
        self._current_node = getattr(torch._C, "_current_autograd_node", None)
        self._seqs: List[int] = []
        self._stacks: List[Tuple[str, ...]] = []
        self._by_seq: Dict[int, Tuple[str, ...]] = {}
        self._handles: List[Any] = []
        self._owner = threading.get_ident()

    @property
    def available(self) -> bool:
        return self._peek is not None and self._current_node is not None

    def __enter__(self) -> BackwardAttribution:
        if not self.available:
            return self
        from torch.nn.modules import module as module_impl

        # the hooks are process-wide: only the counting thread's modules are marked (sequence
        # numbers are per thread; another thread's forward is none of this count's business)
        owner = self._owner = threading.get_ident()

        def mark(*_: Any) -> None:
            if threading.get_ident() != owner:
                return
            self._seqs.append(self._peek())  # type: ignore[misc]  # `available` checked it
            self._stacks.append(self._modules.path)

        mark()
        # Registered after ModuleStack's hooks, so they see the stack already updated.
        self._handles = [
            module_impl.register_module_forward_pre_hook(mark),
            module_impl.register_module_forward_hook(mark),
        ]
        return self

    def stop_marking(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def start_backward(self, names: Mapping[nn.Module, str], interceptor: Any) -> None:
        """From now on, modules only run to recompute activations (checkpointing).

        * Checkpoint's early stop leaves a module's forward by an exception, which skips
          ModuleStack's exit hook: pop that module here.
        * torch leaves a TorchFunctionMode while its handler runs, and the backward is
          started from one (``autograd.grad`` is a torch function): the composite
          ``interceptor`` is entered again for each recomputed module, so a recomputed
          ``F.linear`` is named as in forward.
        * Marking goes on, on this thread: a reentrant checkpoint builds new autograd
          nodes while it recomputes, and its backward runs them. Sequence numbers are
          per thread: marks made on another thread (CUDA's backward threads) would not
          sort after the forward's, so none are made there, and nodes built there may be
          matched to the wrong module (totals unaffected)."""
        self.stop_marking()
        from torch.nn.modules import module as module_impl

        modules, seqs, stacks, peek = self._modules, self._seqs, self._stacks, self._peek
        thread = self._owner
        entered: List[nn.Module] = []  # the outermost recomputed module, while it runs

        def mark() -> None:
            if peek is None or not seqs:
                return
            seq = peek()
            if threading.get_ident() == thread and seq >= seqs[-1]:
                seqs.append(seq)
                stacks.append(modules.path)

        # Only the counting thread: these hooks are process-wide, and entering the interceptor
        # (a TorchFunctionMode) from another thread's module would push it onto that thread's
        # own mode stack, where nothing pops it (issue #29 item 16). A reentrant checkpoint
        # that CUDA's autograd runs on its device thread is recomputed without the composite
        # names there (its aten ops are still counted).
        def enter(module: nn.Module, args: Any) -> None:
            if threading.get_ident() != thread:
                return
            if not entered:
                entered.append(module)
                interceptor.__enter__()
            mark()

        def exit_always(module: nn.Module, args: Any, output: Any) -> None:
            if threading.get_ident() != thread:
                return
            name = names.get(module)
            if name:
                modules.pop(name)
            if entered and entered[0] is module:
                entered.clear()
                interceptor.__exit__(None, None, None)
            mark()

        try:
            self._handles = [
                module_impl.register_module_forward_pre_hook(enter),
                module_impl.register_module_forward_hook(exit_always, always_call=True),
            ]
        except TypeError:  # torch < 2.1: no always_call; recomputed regions keep leaf names
            self._handles = []

    def __exit__(self, *exc: Any) -> None:
        self.stop_marking()

    def current(self) -> Tuple[str, ...]:
        """The forward module stack of the autograd node now running (root if none)."""
        if not self.available or not self._seqs:
            return ()
        node = self._current_node()  # type: ignore[misc]  # `available` checked it
        if node is None:
            return ()
        sequence_nr = getattr(node, "_sequence_nr", None)
        if sequence_nr is None:  # private binding gone: attribute to the root
            return ()
        seq = sequence_nr()
        found = self._by_seq.get(seq)
        if found is None:
            index = bisect.bisect_right(self._seqs, seq) - 1
            found = self._by_seq[seq] = self._stacks[index] if index >= 0 else ()
        return found


def _checkpoint_function() -> Optional[type]:
    try:
        from torch.utils.checkpoint import CheckpointFunction
    except ImportError:  # a torch without it: only the name test below applies
        return None
    return CheckpointFunction


def _is_reentrant_checkpoint(function: Any) -> bool:
    """torch's own ``CheckpointFunction``, or a library's Function of that name pattern
    (fairscale, DeepSpeed), whose backward refuses ``autograd.grad`` the same way."""
    if not isinstance(function, type):
        return False
    torch_own = _checkpoint_function()
    if torch_own is not None and issubclass(function, torch_own):
        return True
    return "checkpoint" in function.__name__.lower()


def _reentrant_checkpoint(roots: Sequence[torch.Tensor]) -> Tuple[Optional[str], List[torch.Tensor]]:
    """The name of the first reentrant checkpoint Function in the autograd graph of
    ``roots`` (None if there is none), and the leaf tensors the graph accumulates into.
    Walks the graph's nodes once; runs no op."""
    found: Optional[str] = None
    leaves: List[torch.Tensor] = []
    seen = set()
    pending = [r.grad_fn for r in roots if r.grad_fn is not None]
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: its leaf
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        function: Any = getattr(node, "_forward_cls", None)  # a custom Function's node: its class
        if found is None and _is_reentrant_checkpoint(function):
            found = function.__name__
        pending.extend(child for child, _ in node.next_functions if child is not None)
    return found, leaves


@contextlib.contextmanager
def _grads_set_aside(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Each tensor's ``.grad`` is None meanwhile (nothing accumulates into it) and its
    post-accumulate-grad hooks are held back; both are put back on exit."""
    saved: List[Tuple[torch.Tensor, Optional[torch.Tensor], Any, Dict[Any, Any]]] = []
    seen = set()
    try:
        for tensor in tensors:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            hooks: Any = getattr(tensor, "_post_accumulate_grad_hooks", None)
            held = dict(hooks) if hooks else {}
            saved.append((tensor, tensor.grad, hooks, held))
            tensor.grad = None
            if held:
                hooks.clear()  # the engine reads this dict; emptied, it calls nothing
        yield
    finally:
        for tensor, grad, hooks, held in saved:
            tensor.grad = grad
            if held:
                hooks.update(held)


def _backward_keeping_grads(
    roots: Sequence[torch.Tensor], seeds: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor]
) -> Set[int]:
    """``torch.autograd.backward(roots, seeds)`` with every ``.grad`` of ``leaves`` put back
    afterwards (what a reentrant checkpoint needs instead of ``autograd.grad``); returns the
    ids of the leaves that received a gradient."""
    with _grads_set_aside(leaves):
        torch.autograd.backward(list(roots), grad_tensors=list(seeds))
        return {id(leaf) for leaf in leaves if leaf.grad is not None}


def _unique(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    seen = set()
    unique = []
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            unique.append(tensor)
    return unique


def run_backward(
    model: nn.Module, outputs: Any, inputs: Sequence[torch.Tensor], loss_fn: Optional[Callable[[Any], Any]], recorder: Any
) -> Set[int]:
    """Differentiate the loss (``loss_fn(outputs)``, else the step's default loss,
    :mod:`flopcount.step.loss`: the loss the model returned, else every floating output;
    with ones gradients, the gradient of their sum without recording a sum) with respect to
    every parameter and input that requires grad. ``autograd.grad`` is used so no
    ``.grad`` is written and no gradient accumulation op runs; a graph holding a reentrant
    checkpoint (which refuses ``autograd.grad``) gets a plain backward instead, with every
    ``.grad`` set aside and put back. Returns the ids of the leaves that received a
    gradient (the parameters an optimizer step then updates).

    ``recorder`` has ``muted`` (a counter: ops made while > 0 are not recorded) and ``phase``."""
    roots = backward_roots(outputs, loss_fn)
    leaves = differentiable(_unique(list(model.parameters()) + list(inputs)))
    if not roots or not leaves:
        raise UsageError(
            "backward=True but nothing requires grad: no parameter or input has requires_grad=True, "
            "or no floating output depends on one"
        )
    recorder.muted += 1
    try:
        seeds = [torch.ones_like(r) for r in roots]
    finally:
        recorder.muted -= 1
    reentrant, graph_leaves = _reentrant_checkpoint(roots)
    recorder.phase = "backward"
    if reentrant is None:
        grads = torch.autograd.grad(roots, leaves, grad_outputs=seeds, allow_unused=True)
        return {id(leaf) for leaf, grad in zip(leaves, grads) if grad is not None}
    # its backward refuses autograd.grad: a plain backward, every .grad put back
    return _backward_keeping_grads(roots, seeds, leaves + graph_leaves + list(model.parameters()))
