"""Python's cyclic garbage collector around a run on fake copies: a count of ``tracer="auto"``
and a decoding loop (issue #32).

Each forward traced on fake copies builds a copy of the model (module objects, their
dictionaries, FakeTensors: ~37,000 objects for LLaMA-2-70B), alive while the forward runs,
so the collector's young collections during the forward promote it to the oldest generation;
on a 70B count that started a full collection of the whole process (every object torch and
transformers hold, ~430,000) 2 to 4 times per ``count_generation``: 0.4-0.7 s CPU of it. While
the loop runs, :class:`PausedCollections` turns automatic collection off and collects the young
generations itself, when they hold more than :data:`YOUNG_LIMIT` objects and once on exit:
the loop's garbage is freed inside the call, the old generation is not walked. A count's fake
run pauses the same way (a LLaMA-2-70B count on meta met a full collection in 5 of 8 counts:
0.24 s median instead of 0.09). Fake runs pause: their tensors hold no data, so nothing large
waits for a collection (real runs collect as usual, but for the one said below).

A count (``core.analysis.analyze`` with ``tracer="auto"``) is paused as a whole, from reading
the model's facts to the aggregated result (``analyze`` enters :class:`PausedCollections`): with the pause around the
fake run only, a full collection landed in the aggregate (ResNet-50: 6.6 ms of a 29 ms count
with the collector on, 1.3 ms off). Where "auto" counts one real run instead (a forward that needs
a value), automatic collection is back on for that run (:func:`resumed`): its garbage may hold data.
One real run stays paused: ``estimate_memory``'s real step (where a fake step needs values), whose
peak is the measurement; a collection at a moment set by the process's allocation history moved
it from call to call (a tensor a garbage cycle held), so that step's garbage waits for its end.

The collector's switch is process-wide: it is put back as found (on, or off when the caller
had turned it off, in which case nothing is collected here either). Loops in several threads
take turns on a lock to read and set it: the loop that turned it off turns it back on, and a
loop that starts while another has it off leaves it alone (a thread that turns the collector
off while a loop has it paused sees it turned back on when that loop ends).
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

__all__ = ["PausedCollections", "YOUNG_LIMIT", "resumed"]

#: young objects (the collector's generation 0 count) above which a paused loop collects them
YOUNG_LIMIT = 200_000
_SWITCH_LOCK = threading.Lock()
# the pause this thread holds (the innermost that turned collection off), for ``resumed``
_HELD = threading.local()


class PausedCollections:
    """Automatic collection off for the ``with`` block (if it was on), young generations
    collected by :meth:`tidy` past :data:`YOUNG_LIMIT` and on exit; ``active=False``: nothing
    is changed (a loop on real tensors, whose garbage may hold memory)."""

    def __init__(self, active: bool = True, limit: Optional[int] = None):
        self.active = active
        self.limit = YOUNG_LIMIT if limit is None else limit
        self.paused = False
        self._outer: Optional[PausedCollections] = None

    def __enter__(self) -> PausedCollections:
        if self.active:
            with _SWITCH_LOCK:
                self.paused = gc.isenabled()
                if self.paused:
                    gc.disable()
            if self.paused:
                self._outer = getattr(_HELD, "pause", None)
                _HELD.pause = self
        return self

    def tidy(self) -> None:
        """Collect the young generations when they hold more than the limit (paused only)."""
        if self.paused and gc.get_count()[0] > self.limit:
            gc.collect(1)

    def __exit__(self, *exc: Any) -> None:
        if not self.paused:
            return
        try:
            gc.collect(1)
        finally:
            with _SWITCH_LOCK:
                gc.enable()
            self.paused = False
            _HELD.pause = self._outer
            self._outer = None


@contextmanager
def resumed() -> Iterator[None]:
    """Automatic collection back on for the block when this thread's pause turned it off (a
    real run inside a paused count: its garbage may hold data), paused again after it;
    nothing changes otherwise (no pause held, or the caller's collector off)."""
    pause = getattr(_HELD, "pause", None)
    if pause is None or not pause.paused:
        yield
        return
    with _SWITCH_LOCK:
        gc.enable()
    try:
        yield
    finally:
        with _SWITCH_LOCK:
            gc.disable()

