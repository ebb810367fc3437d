"""A step timer for training and data loops: is the loop waiting for data?

What is measured, per step (a step ends at each :meth:`StepTimer.step` call):

* ``reader_cost`` — seconds spent inside ``next()`` of the wrapped data iterator
  during the step (fetching the batch);
* ``batch_cost`` — seconds from the end of the previous step (or the first fetch)
  to this ``step()`` call: reading plus everything the loop did with the batch;
* ``ips`` — samples per second of the step: ``num_samples / batch_cost`` (steps/s
  when ``num_samples`` is not given).

``reader_ratio`` = total reader cost / total batch cost: near 1 the loop is starved
by data loading; near 0 the model is the bottleneck.

With the FLOPs of a step (:meth:`StepTimer.set_step_cost`, or ``StepTimer(model=...,
example_batch=...)`` which counts forward + backward (+ ``optimizer``) once on fake
copies), the summary adds ``tflops`` = step FLOPs / batch cost / 1e12 per step, and the
``mfu`` = FLOP/s / ``peak_flops`` (given, or the GPU's datasheet peak). On CUDA, pass
``synchronize=torch.cuda.synchronize`` so a step's GPU work is finished before its
end is read (otherwise asynchronous work lands in the next step's reader cost).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar

import torch

from flopcount.bench.peak import checked_peak, mfu_part, mfu_peak
from flopcount.core.deprecation import module_getattr
from flopcount.errors import UsageError, is_int_at_least

T = TypeVar("T")
Clock = Callable[[], int]


@dataclass(frozen=True)
class StepTiming:
    """One step of a :class:`StepTimer`: seconds spent reading, seconds for the whole step,
    samples processed. (Called ``StepRecord`` in 0.2; that name is a deprecated alias.)"""

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
        return asdict(self)


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
    flops_per_step: Optional[int] = None
    tflops: Optional[CostSummary] = None  # TFLOP/s: avg = total FLOPs / total batch cost
    mfu: Optional[CostSummary] = None  # fraction of peak_flops, same averaging

    def to_dict(self) -> Dict[str, Any]:
        return {
            "steps": self.steps,
            "reader_cost_s": self.reader_cost.to_dict(),
            "batch_cost_s": self.batch_cost.to_dict(),
            "reader_ratio": self.reader_ratio,
            "ips": self.ips.to_dict(),
            "ips_unit": self.ips_unit,
            "flops_per_step": self.flops_per_step,
            "tflops": None if self.tflops is None else self.tflops.to_dict(),
            "mfu": None if self.mfu is None else self.mfu.to_dict(),
        }

    def __str__(self) -> str:
        r, b, i = self.reader_cost, self.batch_cost, self.ips
        text = (
            f"{self.steps} steps | reader_cost avg {r.avg:.5f} s (min {r.min:.5f}, max {r.max:.5f}) | "
            f"batch_cost avg {b.avg:.5f} s (min {b.min:.5f}, max {b.max:.5f}) | "
            f"reader_ratio {100 * self.reader_ratio:.1f}% | "
            f"ips avg {i.avg:.5g} {self.ips_unit} (min {i.min:.5g}, max {i.max:.5g})"
        )
        if self.tflops is not None:
            t = self.tflops
            text += f" | {self.flops_per_step:.4g} FLOPs/step, TFLOP/s avg {t.avg:.4g} (min {t.min:.4g}, max {t.max:.4g})"
        if self.mfu is not None:
            m = self.mfu
            text += f" | MFU avg {100 * m.avg:.2f}% (min {100 * m.min:.2f}%, max {100 * m.max:.2f}%)"
        return text


def summarize_steps(
    records: Sequence[StepTiming], flops_per_step: Optional[int] = None, peak_flops: Optional[float] = None
) -> StepSummary:
    """Pure aggregation of step records; see :class:`StepSummary` for the formulas.
    ``flops_per_step`` adds TFLOP/s per step; ``peak_flops`` (FLOP/s) with it the MFU."""
    if not records:
        raise UsageError("no steps recorded: call step() once per iteration of the loop")
    readers = [r.reader_cost for r in records]
    batches = [r.batch_cost for r in records]
    with_samples = all(r.num_samples is not None for r in records)
    samples = [float(r.num_samples) if with_samples else 1.0 for r in records]  # type: ignore[arg-type]
    total_batch = sum(batches)
    per_step_ips = [n / b if b > 0 else float("inf") for n, b in zip(samples, batches)]
    tflops = mfu = None
    if flops_per_step is not None:
        rates = [flops_per_step / b if b > 0 else float("inf") for b in batches]
        avg = flops_per_step * len(batches) / total_batch if total_batch > 0 else float("inf")
        tflops = CostSummary(avg=avg / 1e12, min=min(rates) / 1e12, max=max(rates) / 1e12)
        if peak_flops:
            mfu = CostSummary(avg=avg / peak_flops, min=min(rates) / peak_flops, max=max(rates) / peak_flops)
    return StepSummary(
        steps=len(records),
        reader_cost=_summary(readers, sum(readers) / len(readers)),
        batch_cost=_summary(batches, total_batch / len(batches)),
        reader_ratio=sum(readers) / total_batch if total_batch > 0 else 0.0,
        ips=_summary(per_step_ips, sum(samples) / total_batch if total_batch > 0 else float("inf")),
        ips_unit="samples/s" if with_samples else "steps/s",
        flops_per_step=flops_per_step,
        tflops=tflops,
        mfu=mfu,
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

    FLOPs of a step: ``model`` and ``example_batch`` (counted once with
    ``count_flops(model, example_batch, backward=True, loss_fn=loss_fn, optimizer=optimizer)``
    on fake copies), or :meth:`set_step_cost`. ``peak_flops`` (FLOP/s) for the MFU, or ``on``:
    the part whose dense datasheet peak it is (``"h100"``, as the trainer callbacks' ``on=``), at
    the model's dtype (float32 without a model); on a GPU in flopcount's peaks table it defaults to
    the datasheet peak at the model's dtype.
    """

    def __init__(
        self,
        *,
        clock: Optional[Clock] = None,
        synchronize: Optional[Callable[[], Any]] = None,
        skip_first: int = 0,
        model: Any = None,
        example_batch: Any = None,
        loss_fn: Optional[Callable[[Any], Any]] = None,
        optimizer: Any = None,
        peak_flops: Optional[float] = None,
        on: Optional[str] = None,
    ):
        if skip_first < 0:
            raise UsageError(f"skip_first must be >= 0, got {skip_first}")
        if (model is None) != (example_batch is None):
            raise UsageError("StepTimer: pass model= and example_batch= together (or neither, and call set_step_cost)")
        self.flops_per_step: Optional[int] = None
        self.peak_flops = checked_peak(peak_flops)
        part = mfu_part("StepTimer", on, peak_flops)
        if part is not None and model is None:  # the part's peak at float32 (a model's dtype decides below)
            self.peak_flops = mfu_peak(torch.device("cpu"), torch.float32, None, part)[0]
        if model is not None:
            from flopcount.core.analysis import analyze, report_unsupported

            result = analyze(model, example_batch, backward=True, loss_fn=loss_fn, optimizer=optimizer)
            report_unsupported(result)
            self.flops_per_step = result.flops
            param = next(model.parameters(), None)
            if peak_flops is None and param is not None:  # the datasheet peak of the part, or of the GPU the model is on
                self.peak_flops = mfu_peak(param.device, param.dtype, None, part)[0]
        self._clock: Clock = clock if clock is not None else time.perf_counter_ns
        self._synchronize = synchronize
        self.skip_first = skip_first
        self._records: List[StepTiming] = []
        self._reader_ns = 0
        self._last_ns: Optional[int] = None

    def set_step_cost(self, flops: Any, peak_flops: Optional[float] = None) -> None:
        """The FLOPs of one step: an int, or a FlopResult (its ``flops``: count it with
        ``backward=True`` and ``optimizer=`` for a training step). ``peak_flops`` sets the MFU's peak."""
        value = getattr(flops, "flops", flops)
        if not is_int_at_least(value, 0):
            raise UsageError(f"set_step_cost expects FLOPs as an int >= 0 or a FlopResult, got {flops!r:.60}")
        if peak_flops is not None:
            self.peak_flops = checked_peak(peak_flops)
        self.flops_per_step = value

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

    def step(self, num_samples: Optional[int] = None) -> StepTiming:
        """Ends the current step and records it; returns its record."""
        if num_samples is not None and num_samples < 0:
            raise UsageError(f"num_samples must be >= 0, got {num_samples}")
        if self._synchronize is not None:
            self._synchronize()
        now = self._clock()
        if self._last_ns is None:  # step() without wrap() or start(): nothing to measure from
            self._last_ns = now
            raise UsageError("step() before the loop started: call start() or iterate timer.wrap(loader) first")
        record = StepTiming(reader_cost=self._reader_ns * 1e-9, batch_cost=(now - self._last_ns) * 1e-9, num_samples=num_samples)
        self._records.append(record)
        self._reader_ns = 0
        self._last_ns = now
        return record

    @property
    def records(self) -> Tuple[StepTiming, ...]:
        """Every recorded step, including the skipped ones."""
        return tuple(self._records)

    def summary(self) -> StepSummary:
        """Summary of the steps after ``skip_first``."""
        kept = self._records[self.skip_first :]
        if not kept and self._records:
            raise UsageError(f"only {len(self._records)} step(s) recorded, all skipped (skip_first={self.skip_first})")
        return summarize_steps(kept, self.flops_per_step, self.peak_flops)


# 0.2's name (two classes were called StepRecord; plan's step recorder keeps it)
__getattr__ = module_getattr(__name__, {"StepRecord": ("flopcount.bench.StepTiming", lambda: StepTiming)})
