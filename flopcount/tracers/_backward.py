"""The backward pass of a dispatch trace (``backward=True``): running it, and
attributing each backward op to the module whose forward built its autograd node.

The backward differentiates the loss with ``torch.autograd.grad``. A reentrant
activation checkpoint (``torch.utils.checkpoint(..., use_reentrant=True)``, and the
checkpoint Functions of libraries built the same way) recomputes its region inside the
backward of one custom ``autograd.Function`` and refuses ``autograd.grad``: it only runs
under a plain ``.backward()``, which writes ``.grad`` and runs post-accumulate-grad hooks
(an optimizer stepping in backward).

So that neither ever reaches the caller's tensors, a real run's forward (and a reentrant
checkpoint's recompute) sees *stand-ins* of the caller's leaf tensors that require grad
(its parameters and inputs): one ``detach()`` each (same storage, no copy, a
``nn.Parameter`` for a parameter), swapped in for the real tensor in the arguments of every
torch function by :class:`StandIns` (a ``TorchFunctionMode``). The autograd graph then
accumulates into the stand-ins, which are flopcount's own: the caller's ``.grad`` and hooks are
never emptied, written or called, also while the count runs (another thread sees them as they
are). A caller's tensor the graph reached without a torch function seeing it (the arguments of a
custom ``autograd.Function``'s ``apply``) is differentiated as itself by ``autograd.grad``, which
writes nothing; only under a reentrant checkpoint's plain backward is such a tensor's ``.grad``
(and its hooks) set aside and put back, the last resort.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from types import FunctionType
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch import nn
from torch.autograd.function import BackwardCFunction
from torch.overrides import TorchFunctionMode

from flopcount.core.rebound import called_function
from flopcount.errors import UsageError
from flopcount.step.loss import backward_roots, differentiable, nothing_to_differentiate, unique_tensors
from flopcount.tracers._modules import ModuleStack

__all__ = ["BackwardAttribution", "StandIns", "cut_from_callers_graph", "run_backward"]


def cut_from_callers_graph(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """``tensors`` with each input the caller's own graph made (a non-leaf that requires grad:
    a backbone's features given to a head) replaced by a copy that starts a graph of its own:
    ``clone()`` of a detached leaf, a non-leaf as the input was (an in-place op on it is
    allowed), so the model's backward ends there. A reentrant checkpoint's plain ``backward()``
    (which refuses ``inputs=``) would otherwise run the caller's backward behind such an input
    too, count it, write the caller's ``.grad`` and free the caller's graph (wild4's left case).
    Made outside every recorder: the copies are not the model's ops."""
    made: Dict[int, torch.Tensor] = {}
    cut: List[torch.Tensor] = []
    for tensor in tensors:
        if type(tensor) is not torch.Tensor or not tensor.requires_grad or tensor.is_leaf:
            cut.append(tensor)
            continue
        if id(tensor) not in made:
            with torch.enable_grad():
                made[id(tensor)] = tensor.detach().requires_grad_().clone()
        cut.append(made[id(tensor)])
    return cut


def _can_stand_in(tensor: Any) -> bool:
    """A plain leaf tensor or parameter that requires grad (subclasses such as fake tensors or
    DTensors keep their own identity: they are never the caller's real storage's only view)."""
    return type(tensor) in (torch.Tensor, nn.Parameter) and tensor.requires_grad and tensor.is_leaf


class StandIns(TorchFunctionMode):
    """Swaps the caller's leaf tensors for stand-ins in every torch function's arguments.

    Each stand-in is ``tensor.detach()`` (same storage and version counter, no copy) that
    requires grad, a ``nn.Parameter`` for a parameter: the autograd graph accumulates into it,
    never into the caller's tensor. ``of(t)`` is t's stand-in (t itself when it has none),
    ``real(t)`` the caller's tensor of a stand-in."""

    def __init__(self, tensors: Sequence[torch.Tensor] = ()) -> None:
        super().__init__()
        self._by_real: Dict[int, torch.Tensor] = {}
        self._by_stand_in: Dict[int, torch.Tensor] = {}
        self._called: Dict[Any, Any] = {}  # core/rebound.py: a Python function handed -> what it calls
        self.differentiating = False  # run_backward's own autograd call is running
        for tensor in tensors:
            if id(tensor) in self._by_real or not _can_stand_in(tensor):
                continue
            with torch.no_grad():
                detached = tensor.detach()
            stand_in: torch.Tensor = (
                nn.Parameter(detached, requires_grad=True) if isinstance(tensor, nn.Parameter) else detached.requires_grad_()
            )
            self._by_real[id(tensor)] = stand_in
            self._by_stand_in[id(stand_in)] = tensor

    def __bool__(self) -> bool:
        return bool(self._by_real)

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._by_real.get(id(tensor), tensor)

    def real(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._by_stand_in.get(id(tensor), tensor)

    def swap(self, value: Any) -> Any:
        """``value`` with every real tensor in it (in lists, tuples, dicts) replaced by its stand-in."""
        if isinstance(value, torch.Tensor):
            return self._by_real.get(id(value), value)
        if isinstance(value, (list, tuple)):
            swapped = [self.swap(item) for item in value]
            if all(a is b for a, b in zip(swapped, value)):
                return value
            if isinstance(value, list):
                return swapped
            return type(value)(*swapped) if hasattr(value, "_fields") else type(value)(swapped)
        if isinstance(value, dict):
            changed = {key: self.swap(item) for key, item in value.items()}
            return value if all(changed[k] is value[k] for k in value) else type(value)(changed)
        return value

    def _reached(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """The forward's own ``autograd.grad(outputs, inputs)`` (a MAML inner step) with each
        caller's tensor in ``inputs`` given as its stand-in where the graph of ``outputs`` reached
        the stand-in (built by torch functions), as itself where it reached the tensor (a custom
        Function's ``apply`` takes its arguments as they are)."""
        outputs = args[0] if args else kwargs.get("outputs")
        inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
        roots = [outputs] if isinstance(outputs, torch.Tensor) else [t for t in outputs or () if isinstance(t, torch.Tensor)]
        reached = {id(t) for t in _reentrant_checkpoint(roots)[1]}

        def pick(tensor: Any) -> Any:
            stand_in = self.of(tensor) if isinstance(tensor, torch.Tensor) else tensor
            return stand_in if id(stand_in) in reached else tensor

        picked: Any = inputs
        if isinstance(inputs, torch.Tensor):
            picked = pick(inputs)
        elif type(inputs) is list or type(inputs) is tuple:  # not a GradientEdge (a NamedTuple)
            picked = type(inputs)(pick(tensor) for tensor in inputs)
        if len(args) > 1:
            return (args[0], picked, *args[2:]), kwargs
        return args, {**kwargs, "inputs": picked}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if type(func) is FunctionType:  # or a wrapper the caller bound under a torch function's name
            func = self._called.get(func) or called_function(func, self._called)
        if func is torch.autograd.grad or func is torch.autograd.backward:
            if func is torch.autograd.grad and not self.differentiating:
                args, kwargs = self._reached(args, kwargs)
            return func(*args, **kwargs)  # run_backward names the tensors to differentiate itself
        if getattr(func, "__name__", "") == "__get__":
            # reading an attribute (``p.grad``, ``p.shape``) reads the caller's own tensor, unless
            # the attribute is a differentiable view (``p.T``): that one is taken of the stand-in
            found = func(*args, **kwargs)
            if not (isinstance(found, torch.Tensor) and found.grad_fn is not None):
                return found
        return func(*self.swap(args), **self.swap(kwargs))


class BackwardAttribution:
    """Maps autograd nodes to the module stack their forward ran in.

    During forward, every module entry and exit appends (next autograd sequence
    number, module stack); a node created inside a module has a sequence number in
    that module's span, so a bisect finds its stack. Needs two private-but-stable
    torch bindings; without them backward ops are attributed to the root.
    """

    def __init__(self, modules: ModuleStack, real: Sequence[torch.Tensor] = ()):
        #: the caller's leaf tensors (a real run's parameters and inputs) get stand-ins: the
        #: forward, the backward and a reentrant checkpoint's recompute never reach them
        self.stand_ins = StandIns(real)
        self._modules = modules
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
        if self.stand_ins:
            self.stand_ins.__enter__()
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
        stand_ins = self.stand_ins if self.stand_ins else None
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
                # the recompute runs inside the backward, where torch has left every function
                # mode: the stand-ins first (below the interceptor), as in forward
                if stand_ins is not None:
                    stand_ins.__enter__()
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
                if stand_ins is not None:
                    stand_ins.__exit__(None, None, None)
            mark()

        self._handles = [
            module_impl.register_module_forward_pre_hook(enter),
            module_impl.register_module_forward_hook(exit_always, always_call=True),
        ]

    def __exit__(self, *exc: Any) -> None:
        self.stop_marking()
        if self.stand_ins:
            self.stand_ins.__exit__(*exc)

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


def _reentrant_checkpoint_name(node: Any) -> Optional[str]:
    """The Function's name when ``node`` is the backward node of a custom autograd Function
    named like a reentrant checkpoint (torch's own ``CheckpointFunction``, fairscale's,
    DeepSpeed's), whose backward refuses ``autograd.grad``; else None. Read from the node's
    public ``name()`` ("<Function>Backward"), not from its private ``_forward_cls``."""
    if not isinstance(node, BackwardCFunction):
        return None
    named: Any = node
    name: str = named.name()  # torch.autograd.graph.Node.name (the stubs type the node class without it)
    function = name[: -len("Backward")] if name.endswith("Backward") else name
    return function if "checkpoint" in function.lower() else None


def _reentrant_checkpoint(
    roots: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor] = ()
) -> Tuple[Optional[str], List[torch.Tensor]]:
    """The name of the first reentrant checkpoint Function in the autograd graph of
    ``roots`` (None if there is none), and the leaf tensors the graph accumulates into.
    The walk stops at an input made by the caller's own graph (a non-leaf input, such as
    a backbone's features given to a head): what lies behind it is not the model's.
    Walks the graph's nodes once; runs no op."""
    found: Optional[str] = None
    leaves: List[torch.Tensor] = []
    seen = {id(t.grad_fn) for t in inputs if t.grad_fn is not None}
    pending = [r.grad_fn for r in roots if r.grad_fn is not None]
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: its leaf
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        if found is None:
            found = _reentrant_checkpoint_name(node)
        pending.extend(child for child, _ in node.next_functions if child is not None)
    return found, leaves


@contextlib.contextmanager
def _grads_set_aside(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Each tensor's ``.grad`` is None meanwhile (nothing accumulates into it) and its
    post-accumulate-grad hooks are held back; both are put back on exit."""
    saved: List[Tuple[torch.Tensor, Optional[torch.Tensor], Any, Dict[Any, Any]]] = []
    try:
        for tensor in unique_tensors(tensors):
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


def real_step_backward(
    roots: Sequence[torch.Tensor], seeds: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor], plain: bool
) -> None:
    """A timed step's backward of ``roots`` (``profile``'s real steps): ``autograd.grad`` of
    ``leaves``, which writes no ``.grad``; ``plain`` (the graph holds a reentrant checkpoint,
    :func:`needs_plain_backward`, which refuses ``autograd.grad``) a plain backward, the
    ``.grad`` and post-accumulate-grad hooks of ``leaves`` set aside and put back."""
    if not plain:
        torch.autograd.grad(roots, leaves, grad_outputs=seeds, allow_unused=True)
        return
    with _grads_set_aside(leaves):
        torch.autograd.backward(list(roots), grad_tensors=list(seeds))


def needs_plain_backward(roots: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> Tuple[bool, List[torch.Tensor]]:
    """Whether the graph of ``roots`` holds a reentrant checkpoint, and the leaves it
    accumulates into (:func:`_reentrant_checkpoint`)."""
    found, leaves = _reentrant_checkpoint(roots, inputs)
    return found is not None, leaves


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
    attribution: Optional[BackwardAttribution] = getattr(recorder, "attribution", None)
    stand_ins = attribution.stand_ins if attribution is not None else StandIns()
    # the stand-ins the graph accumulates into, in place of the caller's parameters and inputs
    leaves = differentiable(unique_tensors([stand_ins.of(t) for t in list(model.parameters()) + list(inputs)]))
    nothing = nothing_to_differentiate(outputs, roots, leaves)
    if nothing is not None:
        raise UsageError(nothing)
    recorder.muted += 1
    try:
        seeds = [torch.ones_like(r) for r in roots]
    finally:
        recorder.muted -= 1
    reentrant, graph_leaves = _reentrant_checkpoint(roots, [t for t in inputs if isinstance(t, torch.Tensor)])
    # every other leaf the graph accumulates into gets its gradient in a real backward too, and
    # is differentiated as itself: a caller's tensor the graph reached without a torch function
    # seeing it (a custom autograd.Function's apply takes its arguments as they are), a leaf the
    # forward made (``x.detach().requires_grad_()`` for a gradient penalty, a PINN's derivative)
    own = {id(leaf) for leaf in leaves}
    leaves += [leaf for leaf in unique_tensors(graph_leaves) if id(leaf) not in own]
    recorder.phase = "backward"
    stand_ins.differentiating = True
    try:
        return _differentiated(roots, seeds, leaves, graph_leaves, reentrant, stand_ins)
    finally:
        stand_ins.differentiating = False


def _differentiated(
    roots: Sequence[torch.Tensor], seeds: Sequence[torch.Tensor], leaves: List[torch.Tensor],
    graph_leaves: List[torch.Tensor], reentrant: Optional[str], stand_ins: StandIns,
) -> Set[int]:
    """:func:`run_backward`'s backward itself: the ids of the caller's leaves that got a gradient."""
    if reentrant is None:
        # autograd.grad writes no .grad and runs no post-accumulate-grad hook: real leaves are safe here
        grads = torch.autograd.grad(roots, leaves, grad_outputs=seeds, allow_unused=True)
        return {id(stand_ins.real(leaf)) for leaf, grad in zip(leaves, grads) if grad is not None}
    # its backward refuses autograd.grad: a plain backward. It accumulates into the stand-ins
    # (ours, emptied afterwards); a leaf without one (a fake copy's, a tensor subclass, or one the
    # forward reached outside every torch function) is set aside and put back, the last resort
    stood = [leaf for leaf in leaves if stand_ins.real(leaf) is not leaf]
    others = [leaf for leaf in leaves + graph_leaves if stand_ins.real(leaf) is leaf]
    with _grads_set_aside(others):
        torch.autograd.backward(list(roots), grad_tensors=list(seeds))
        got = {id(leaf) for leaf in leaves if leaf.grad is not None}
    for leaf in stood:
        leaf.grad = None  # nobody reads a stand-in's gradient: free it now
    return {id(stand_ins.real(leaf)) for leaf in leaves if id(leaf) in got}
