"""One profile at a time in this process.

torch's profiler is process-wide: two ``torch.profiler.profile`` sessions started from two
threads at once crash the process (a segmentation fault on torch 2.13, measured with two
threads each profiling a small model). :func:`one_at_a_time` makes the second thread's
``profile`` wait for the first; a ``profile`` started on a thread that is already profiling
(from the model's forward or the loss) is a :class:`~flopcount.errors.UsageError`.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List, TypeVar, cast

from flopcount.errors import UsageError

__all__ = ["one_at_a_time"]

_F = TypeVar("_F", bound=Callable[..., Any])

_LOCK = threading.Lock()
_holder: List[int] = []  # the thread now profiling (empty when none)


def one_at_a_time(function: _F) -> _F:
    """``function`` holding the process's profiling lock while it runs."""

    @functools.wraps(function)
    def exclusive(*args: Any, **kwargs: Any) -> Any:
        if _holder and _holder[0] == threading.get_ident():
            raise UsageError(
                f"{function.__name__}() was called while this thread is already inside {function.__name__}() "
                "(from the model's forward or loss_fn): torch's profiler cannot run inside itself"
            )
        with _LOCK:
            _holder.append(threading.get_ident())
            try:
                return function(*args, **kwargs)
            finally:
                _holder.clear()

    return cast(_F, exclusive)
