"""A step timer for training and data loops: is the loop waiting for data?

What is measured, per step (a step ends at each :meth:`StepTimer.step` call):

* ``reader_cost`` — seconds spent inside ``next()`` of the wrapped data iterator
  during the step (fetching the batch);
* ``batch_cost`` — seconds from the end of the previous step (or the first fetch)
  to this ``step()`` call: reading plus everything the loop did with the batch;
* ``ips`` — samples per second of the step: ``num_samples / batch_cost`` (steps/s
  when ``num_samples`` is not given).

``reader_ratio`` = total reader cost / total batch cost: near 1 the loop is starved
by data loading; near 0 the model is the bottleneck. On CUDA, pass
``synchronize=torch.cuda.synchronize`` so a step's GPU work is finished before its
end is read (otherwise asynchronous work lands in the next step's reader cost).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar

from ..errors import UsageError

T = TypeVar("T")
Clock = Callable[[], int]


@dataclass(frozen=True)
class StepRecord:
    """One step: seconds spent reading, seconds for the whole step, samples processed."""

    reader_cost: float
    batch_cost: float
    num_samples: Optional[int]


@dataclass(frozen=True)
class CostSummary:
    """Average, minimum and maximum of one per-step quantity."""

    avg: float
    min: float
    max: float

    def to_dict(self) -> Dict[str, float]:
        return {"avg": self.avg, "min": self.min, "max": self.max}


@dataclass(frozen=True)
class StepSummary:
    """Aggregate of the recorded steps (after ``skip_first``).

    ``reader_cost``/``batch_cost`` avg = arithmetic mean over steps (seconds);
    ``ips.avg`` = total samples / total batch cost (the sustained rate), ``ips.min`` /
    ``ips.max`` over steps; ``reader_ratio`` = sum reader / sum batch cost.
    """

    steps: int
    reader_cost: CostSummary
    batch_cost: CostSummary
    reader_ratio: float
    ips: CostSummary
    ips_unit: str  # "samples/s" or "steps/s"

    def to_dict(self) -> Dict[str, Any]:
        return {
            "steps": self.steps,
            "reader_cost_s": self.reader_cost.to_dict(),
            "batch_cost_s": self.batch_cost.to_dict(),
            "reader_ratio": self.reader_ratio,
            "ips": self.ips.to_dict(),
            "ips_unit": self.ips_unit,
        }

    def __str__(self) -> str:
        r, b, i = self.reader_cost, self.batch_cost, self.ips
        return (
            f"{self.steps} steps | reader_cost avg {r.avg:.5f} s (min {r.min:.5f}, max {r.max:.5f}) | "
            f"batch_cost avg {b.avg:.5f} s (min {b.min:.5f}, max {b.max:.5f}) | "
            f"reader_ratio {100 * self.reader_ratio:.1f}% | "
            f"ips avg {i.avg:.5g} {self.ips_unit} (min {i.min:.5g}, max {i.max:.5g})"
        )


def summarize_steps(records: Sequence[StepRecord]) -> StepSummary:
    """Pure aggregation of step records; see :class:`StepSummary` for the formulas."""
    if not records:
        raise UsageError("no steps recorded: call step() once per iteration of the loop")
    readers = [r.reader_cost for r in records]
    batches = [r.batch_cost for r in records]
    with_samples = all(r.num_samples is not None for r in records)
    samples = [float(r.num_samples) if with_samples else 1.0 for r in records]  # type: ignore[arg-type]
    total_batch = sum(batches)
    per_step_ips = [n / b if b > 0 else float("inf") for n, b in zip(samples, batches)]
    return StepSummary(
        steps=len(records),
        reader_cost=_summary(readers, sum(readers) / len(readers)),
        batch_cost=_summary(batches, total_batch / len(batches)),
        reader_ratio=sum(readers) / total_batch if total_batch > 0 else 0.0,
        ips=_summary(per_step_ips, sum(samples) / total_batch if total_batch > 0 else float("inf")),
        ips_unit="samples/s" if with_samples else "steps/s",
    )


def _summary(values: Sequence[float], avg: float) -> CostSummary:
    return CostSummary(avg=avg, min=min(values), max=max(values))


class StepTimer:
    """Times a loop's data reading and steps.

    >>> timer = StepTimer()
    >>> for batch in timer.wrap(loader):          # doctest: +SKIP
    ...     train_step(batch)
    ...     timer.step(num_samples=len(batch))
    >>> print(timer.summary())                     # doctest: +SKIP

    ``clock``: nanosecond clock (default ``time.perf_counter_ns``; tests inject a
    fake). ``synchronize``: called before each step's end is read (e.g.
    ``torch.cuda.synchronize``). ``skip_first``: steps left out of the summary
    (warm-up: first batches, worker start-up, compilation).
    """

    def __init__(self, *, clock: Optional[Clock] = None, synchronize: Optional[Callable[[], Any]] = None, skip_first: int = 0):
        if skip_first < 0:
            raise UsageError(f"skip_first must be >= 0, got {skip_first}")
        self._clock: Clock = clock if clock is not None else time.perf_counter_ns
        self._synchronize = synchronize
        self.skip_first = skip_first
        self._records: List[StepRecord] = []
        self._reader_ns = 0
        self._last_ns: Optional[int] = None

    def start(self) -> None:
        """Marks the start of the first step (otherwise: the first fetch from a wrapped iterator)."""
        self._last_ns = self._clock()
        self._reader_ns = 0

    def wrap(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yields the items of ``iterable``, timing each ``next()`` as reader cost."""
        iterator = iter(iterable)
        clock = self._clock
        while True:
            t0 = clock()
            if self._last_ns is None:
                self._last_ns = t0
            try:
                item = next(iterator)
            except StopIteration:
                return
            self._reader_ns += clock() - t0
            yield item

    def step(self, num_samples: Optional[int] = None) -> StepRecord:
        """Ends the current step and records it; returns its record."""
        if num_samples is not None and num_samples < 0:
            raise UsageError(f"num_samples must be >= 0, got {num_samples}")
        if self._synchronize is not None:
            self._synchronize()
        now = self._clock()
        if self._last_ns is None:  # step() without wrap() or start(): nothing to measure from
            self._last_ns = now
            raise UsageError("step() before the loop started: call start() or iterate timer.wrap(loader) first")
        record = StepRecord(reader_cost=self._reader_ns * 1e-9, batch_cost=(now - self._last_ns) * 1e-9, num_samples=num_samples)
        self._records.append(record)
        self._reader_ns = 0
        self._last_ns = now
        return record

    @property
    def records(self) -> Tuple[StepRecord, ...]:
        """Every recorded step, including the skipped ones."""
        return tuple(self._records)

    def summary(self) -> StepSummary:
        """Summary of the steps after ``skip_first``."""
        kept = self._records[self.skip_first :]
        if not kept and self._records:
            raise UsageError(f"only {len(self._records)} step(s) recorded, all skipped (skip_first={self.skip_first})")
        return summarize_steps(kept)

    def reset(self) -> None:
        """Forgets every step; the next fetch or start() begins a new measurement."""
        self._records.clear()
        self._reader_ns = 0
        self._last_ns = None
