"""``--timeout SECONDS``: stop a command whose factory or forward hangs, naming what was
still running.

POSIX only, and in the main thread: ``signal.setitimer(ITIMER_REAL)`` delivers SIGALRM to the
main thread, whose handler raises :class:`CommandTimeout` there. The exception unwinds the one
thread that was working through every ``finally`` on its way (the tracers put the model, the
hooks and the RNG back as on any other exception), so no helper thread is left running on
state it shares with the main one. Python runs the handler between bytecodes: code stuck
inside one long C call (a single huge kernel, a blocking read in an extension) is stopped
when that call returns, not before.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from typing import Any, Iterator, Optional

from flopcount.errors import UsageError

__all__ = ["CommandTimeout", "deadline", "stage"]


class CommandTimeout(BaseException):
    """Raised in the main thread when ``--timeout`` ran out. A BaseException (as
    KeyboardInterrupt), so that no ``except Exception`` of the model's or ours turns it into
    another error on its way out; ``finally`` blocks still run."""

    def __init__(self, seconds: float, what: str) -> None:
        super().__init__(f"timed out after {seconds:g} s")
        self.seconds = seconds
        self.what = what


def stage(args: argparse.Namespace, what: str) -> None:
    """Record what the command is doing now (what a timeout names)."""
    args.stage = what


@contextlib.contextmanager
def deadline(args: argparse.Namespace, seconds: Optional[float]) -> Iterator[None]:
    """Raise :class:`CommandTimeout` in this (the main) thread after ``seconds``; the previous
    SIGALRM handler and timer are put back on the way out. ``None``: no limit."""
    if seconds is None:
        yield
        return
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        raise UsageError("--timeout needs POSIX signals (Linux, macOS) and the main thread; run flopcount from a shell "
                         "and let the CI job's own limit stop it elsewhere")

    def expired(signum: int, frame: Any) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        raise CommandTimeout(seconds, getattr(args, "stage", None) or f"flopcount {args.command}")

    previous = signal.signal(signal.SIGALRM, expired)
    old_timer = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if old_timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *old_timer)
