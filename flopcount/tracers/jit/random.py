"""The jit tracer's random draws on generators of its own (issue #29 item 18).

:class:`flopcount.core.state.PrivateRandomCalls` routes each torch call that may draw to
private generators; this module enters it for one trace and takes it off the stack while an
eval-mode ``nn.MultiheadAttention`` or Transformer encoder layer runs: those check
``has_torch_function`` to choose their fused path, which jit records, and an active
TorchFunctionMode would turn it off (a different graph). In eval mode they draw nothing.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any, Callable, Iterator, List, Optional

from torch import nn

from flopcount.core import state
from flopcount.core.hooks import around_modules
from flopcount.core.state import PrivateRandomCalls

__all__ = ["private_random_calls", "recording_warnings"]

# the modules whose forward picks a fused path when has_torch_function is false (torch 2.x)
_FAST_PATH = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


@contextlib.contextmanager
def private_random_calls() -> Iterator[Optional[PrivateRandomCalls]]:
    """While active, this thread's random draws go to private generators (None, and nothing
    entered, when this torch lacks the private name the pause needs). Process-wide module
    hooks, answering only this thread, removed on exit."""
    if not PrivateRandomCalls.available():
        yield None
        return
    calls = PrivateRandomCalls()

    def pause(module: nn.Module) -> Optional[Callable[[], None]]:
        return calls.resume if not module.training and calls.pause() else None

    with around_modules(_FAST_PATH, pause), calls:
        yield calls


def recording_warnings(into: List[warnings.WarningMessage]) -> Callable[..., None]:
    """A ``warnings.showwarning`` (set inside ``warnings.catch_warnings()``) that appends each
    warning to ``into``, attributed to the code that made the torch call: a TracerWarning that
    torch raises inside a call passing through :class:`PrivateRandomCalls` names the mode's
    frame (flopcount/core/state.py) as its place, where torch's own code or the user's forward
    made the call, and the jit tracer keeps only the user's (a size check inside
    ``torch._assert`` is torch's)."""
    here = state.__file__

    def record(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if filename == here:
            frame: Any = sys._getframe(1)
            while frame is not None and not (frame.f_code.co_filename == here and frame.f_code.co_name == "__torch_function__"):
                frame = frame.f_back
            if frame is not None and frame.f_back is not None:
                filename, lineno = frame.f_back.f_code.co_filename, frame.f_back.f_lineno
        into.append(warnings.WarningMessage(message, category, filename, lineno, file, line))

    return record
