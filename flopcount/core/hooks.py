"""Which hooks a module, or the process, has: the one place that answers it.

No torch hook dictionary is named here: **a hook container is a dictionary held in a private
attribute whose name contains "hook"** (a module's, or ``torch.nn.modules.module``'s for the
process-wide ones); a module's *call* hooks are those whose name also says "forward" or
"backward". A hook kind torch adds later under the same convention is found without a change
(``tests/test_private_torch.py`` checks every kind; docs/internals.md). Nothing is changed here:
callers put hooks back or leave them out of a copy on the dictionaries this module hands them.
:func:`around_modules` is the one pair of process-wide hooks the jit tracer adds around some
modules' forwards (through torch's public functions).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import threading
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Tuple

from torch import nn

__all__ = [
    "THREAD_ATTRIBUTE",
    "around_modules",
    "call_hook_dicts",
    "call_hook_names",
    "call_hook_sizes",
    "has_call_hooks",
    "hook_dicts",
    "hook_flag_names",
    "is_hook_name",
    "process_hooks_present",
]


def is_hook_name(name: str) -> bool:
    """Whether a module attribute of this name holds hooks by the convention, if it is a dict:
    torch's are private attributes; a user's public ``self.forward_hooks = {...}`` is not one."""
    return name.startswith("_") and "hook" in name


def _is_hook_dict(name: str, value: Any) -> bool:
    return is_hook_name(name) and isinstance(value, dict)  # OrderedDict is a dict


def _is_call_hook(name: str) -> bool:
    return "forward" in name or "backward" in name


def hook_dicts(module: nn.Module) -> Dict[str, Dict[Any, Any]]:
    """Every hook dictionary in ``module``'s ``__dict__`` (call hooks, state-dict and
    load-state-dict hooks, their flags' dictionaries), by attribute name; the dictionaries
    themselves, not copies."""
    return {name: value for name, value in vars(module).items() if _is_hook_dict(name, value)}


def call_hook_dicts(module: nn.Module) -> Dict[str, Dict[Any, Any]]:
    """The hook dictionaries a call of ``module`` reads: forward, forward pre-, backward and
    backward pre-hooks and their keyword / always-call flags."""
    return {name: value for name, value in hook_dicts(module).items() if _is_call_hook(name)}


#: found once, on a bare module of the running torch (an immutable tuple)
_CALL_HOOK_NAMES = tuple(name for name, value in vars(nn.Module()).items() if _is_hook_dict(name, value) and _is_call_hook(name))
_GET_CALL_HOOKS = operator.itemgetter(*_CALL_HOOK_NAMES)


def call_hook_names() -> Tuple[str, ...]:
    """The names of the call-hook dictionaries every ``nn.Module`` has in this torch (found by
    the convention on a bare ``nn.Module()``): the fast path for checks made per call."""
    return _CALL_HOOK_NAMES


@functools.cache
def hook_flag_names() -> FrozenSet[str]:
    """Per-module hook state that is not a dictionary (whether the backward hooks are "full"):
    attributes of a bare ``nn.Module()`` whose name contains "hook" and whose value is not a
    dictionary."""
    return frozenset(name for name, value in vars(nn.Module()).items() if "hook" in name and not isinstance(value, dict))


def has_call_hooks(module: nn.Module) -> bool:
    """Whether a forward or backward of ``module`` runs a hook of its own (process-wide hooks:
    :func:`process_hooks_present`). Looks up the dictionaries :func:`call_hook_names` found on
    a bare module (about as fast as naming them: it runs per call in structural reuse)."""
    try:
        return any(_GET_CALL_HOOKS(module.__dict__))  # one C call for the ~8 lookups
    except (KeyError, TypeError):  # a module missing one (made without nn.Module.__init__)
        get = module.__dict__.get
        return any(get(name) for name in _CALL_HOOK_NAMES)


def call_hook_sizes(state: Mapping[str, Any]) -> Tuple[int, ...]:
    """How many hooks each call-hook dictionary of a module's ``vars()`` holds (hooks live in
    dictionaries changed in place, so a fingerprint of the module records their sizes)."""
    try:
        return tuple(map(len, _GET_CALL_HOOKS(state)))
    except (KeyError, TypeError):  # a module missing one (made without nn.Module.__init__)
        get = state.get
        return tuple([len(get(name) or ()) for name in _CALL_HOOK_NAMES])


def process_hooks_present() -> bool:
    """Whether a process-wide module hook is registered (``register_module_forward_hook``,
    ``..._forward_pre_hook``, ``..._backward_hook``, ``..._full_backward_pre_hook``,
    ``..._buffer/module/parameter_registration_hook``): any non-empty hook dictionary of
    ``torch.nn.modules.module``."""
    from torch.nn.modules import module as module_impl

    return any(value for name, value in vars(module_impl).items() if _is_hook_dict(name, value))


#: the attribute a process-wide module hook of flopcount's carries when it answers one thread
#: only (:func:`around_modules`): that thread's ``threading.get_ident()``. Structural reuse
#: (``tracers/_reuse.py``) ignores such a hook in any other thread's count.
THREAD_ATTRIBUTE = "__flopcount_thread__"


@contextlib.contextmanager
def around_modules(kinds: Tuple[type, ...], enter: Callable[[nn.Module], Optional[Callable[[], None]]]) -> Iterator[None]:
    """While active, ``enter(module)`` runs before each forward of a module of ``kinds`` on the
    entering thread, and what it returns (an undo, or None) after that forward, also one that
    raised. Process-wide hooks (torch's ``register_module_forward_*``: nothing is added to a
    model) that answer only the entering thread, removed on exit."""
    from torch.nn.modules import module as module_impl

    owner = threading.get_ident()
    undos: List[Optional[Callable[[], None]]] = []  # one per such forward running

    def pre(module: nn.Module, args: Any) -> None:
        if isinstance(module, kinds) and threading.get_ident() == owner:
            undos.append(enter(module))

    def post(module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(module, kinds) and undos and threading.get_ident() == owner:
            undo = undos.pop()
            if undo is not None:
                undo()

    setattr(pre, THREAD_ATTRIBUTE, owner)
    setattr(post, THREAD_ATTRIBUTE, owner)
    handles = [module_impl.register_module_forward_pre_hook(pre),
               module_impl.register_module_forward_hook(post, always_call=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
