"""A torch function the caller rebound, as a torch-function mode passes its call on (branch wild7).

torch's Python functions hand a call to the active torch-function modes by their own global name
(``handle_torch_function(batch_norm, ...)`` inside ``torch.nn.functional.batch_norm``). Where the
caller rebound that name (``F.batch_norm = fp32_norm``, ``F.layer_norm = spy``: a wrapper that
calls the function it replaced), a mode is handed the wrapper, not the function that asked, and a
mode that calls what it is handed runs the wrapper a second time: its own work (an upcast, an
extra product, a logged call) was done, and counted, twice for each call the forward made. A
mode calls :func:`called_function` of what it is handed instead: the function that asked where
the name was rebound, else what it was handed."""

from __future__ import annotations

import gc
import os
import sys
from types import CodeType, FrameType, FunctionType
from typing import Any, Dict, Iterator, Optional

import torch

__all__ = ["called_function", "torch_own"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_HANDLE = torch.overrides.handle_torch_function.__code__


def torch_own(func: Any) -> bool:
    """Whether ``func`` is torch's own: a built-in, or a Python function whose code is in torch."""
    if type(func) is not FunctionType:
        return True  # a built-in, a method descriptor, an OpOverload: torch binds those
    return func.__code__.co_filename.startswith(_TORCH_DIR)


def called_function(func: Any, known: Dict[Any, Any]) -> Any:
    """What a torch-function mode handed ``func`` (a Python function) calls: the torch function
    that asked, where ``func`` is a wrapper bound under its name; else ``func``. ``known``: the
    mode's memo of earlier answers (one per function handed)."""
    found = known.get(func)
    if found is not None:
        return found
    found = func
    if not torch_own(func):
        asker = _asking_frame()
        if asker is not None and asker.f_code is not func.__code__:
            original = _function_of(asker.f_code, asker.f_globals, func)
            if original is not None:
                found = original
    known[func] = found
    return found


def _asking_frame() -> Optional[FrameType]:
    """The frame of the function that called ``handle_torch_function`` for the call being handed
    on (a few frames up: this module's, the mode's ``__torch_function__``), or None."""
    frame: Optional[FrameType] = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return None
        if frame.f_code is _HANDLE:
            return frame.f_back
        frame = frame.f_back
    return None


def _function_of(code: CodeType, namespace: Dict[str, Any], wrapper: FunctionType) -> Optional[FunctionType]:
    """The function whose code is ``code`` (the one the caller's ``wrapper`` replaced), found where
    a wrapper keeps the function it calls: ``__wrapped__`` (functools.wraps), its closure, its
    defaults, its globals; else among every object the collector tracks (one slow search)."""
    for candidate in _held_by(wrapper):
        if type(candidate) is FunctionType and candidate.__code__ is code and candidate.__globals__ is namespace:
            return candidate
    found = [f for f in gc.get_referrers(code) if type(f) is FunctionType and f.__globals__ is namespace]
    return found[0] if len(found) == 1 else None


def _held_by(wrapper: FunctionType) -> Iterator[Any]:
    yield getattr(wrapper, "__wrapped__", None)
    for cell in wrapper.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
    yield from wrapper.__defaults__ or ()
    yield from (wrapper.__kwdefaults__ or {}).values()
    yield from list(wrapper.__globals__.values())
