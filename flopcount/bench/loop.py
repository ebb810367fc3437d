"""The timing loop: iteration control (fixed count or a time budget, in blocks) and the
per-device block runners (a CPU clock around each call, or CUDA events)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import torch

from flopcount.errors import UsageError, int_at_least

#: A clock returning integer nanoseconds, like :func:`time.perf_counter_ns`.
Clock = Callable[[], int]

#: ``run_block(n)`` runs ``n`` timed iterations and returns their latencies in ms.
BlockRunner = Callable[[int], List[float]]


@dataclass(frozen=True)
class LoopPlan:
    """How many iterations to time: exactly ``iters`` when given; otherwise blocks of
    iterations until ``budget_s`` of wall time is spent and at least ``min_iters`` ran,
    never more than ``max_iters`` (the scheme of ``torch.utils.benchmark``'s
    ``blocked_autorange``, but keeping every iteration's sample)."""

    iters: Optional[int] = None
    min_iters: int = 10
    budget_s: float = 1.0
    max_iters: int = 100_000
    block_fraction: float = 0.05  # each adaptive block aims at this share of the budget
    max_block: int = 10_000

    def validate(self) -> None:
        if self.iters is not None:
            int_at_least(self.iters, 1, "benchmark: iters")
        int_at_least(self.min_iters, 1, "benchmark: min_iters")
        if not self.budget_s > 0:
            raise UsageError(f"budget_s must be > 0, got {self.budget_s!r}")
        if self.max_iters < self.min_iters:
            raise UsageError(f"max_iters ({self.max_iters}) is below min_iters ({self.min_iters})")


#: ``progress(done, total)`` after each block; ``total`` is None under a time budget.
Progress = Callable[[int, Optional[int]], None]


def run_iterations(
    run_block: BlockRunner, plan: LoopPlan, clock: Clock, progress: Optional[Progress] = None
) -> Tuple[List[float], int]:
    """Iteration control: call ``run_block`` until ``plan`` is satisfied.

    Returns ``(samples_s, wall_ns)`` (seconds per call) where ``wall_ns`` is the clock time the whole
    timed region took (samples plus loop overhead). The first adaptive block is one
    iteration; each later block is sized from the previous block's wall time so
    each takes about ``block_fraction * budget_s``, which keeps the budget check out
    of the per-iteration path without overshooting the budget by much.
    """
    begin = clock()
    if plan.iters is not None:
        if progress is None:
            return run_block(plan.iters), clock() - begin
        # about ten reports; a block boundary costs one clock read (CPU) or one sync (CUDA)
        chunk = max(1, -(-plan.iters // 10))
        fixed: List[float] = []
        while len(fixed) < plan.iters:
            fixed.extend(run_block(min(chunk, plan.iters - len(fixed))))
            progress(len(fixed), plan.iters)
        return fixed, clock() - begin
    budget_ns = plan.budget_s * 1e9
    samples: List[float] = []
    block = 1
    block_start = begin
    while True:
        samples.extend(run_block(block))
        now = clock()
        elapsed = now - begin
        count = len(samples)
        if progress is not None:
            progress(count, None)
        if count >= plan.max_iters or (count >= plan.min_iters and elapsed >= budget_ns):
            return samples, elapsed
        # size the next block from the last one, so one slow early call (a cold cache,
        # a page fault) does not keep later blocks tiny
        per_iter = max((now - block_start) / block, 1.0)
        block_start = now
        target = int(plan.block_fraction * budget_ns / per_iter)
        if elapsed < budget_ns:  # do not plan far past the budget
            target = min(target, int((budget_ns - elapsed) / per_iter) + 1)
        block = max(1, min(target, plan.max_block, plan.max_iters - count))
        if count < plan.min_iters:
            block = max(block, plan.min_iters - count)


def cpu_block_runner(call: Callable[[], Any], clock: Clock) -> BlockRunner:
    """Times each call with two clock readings taken right around it; nothing else
    happens between them (no allocation but the sample append, after the reading)."""

    def run_block(n: int) -> List[float]:
        samples: List[int] = []
        append = samples.append
        for _ in range(n):
            t0 = clock()
            call()
            t1 = clock()
            append(t1 - t0)
        return [s * 1e-9 for s in samples]

    return run_block


def cuda_block_runner(call: Callable[[], Any], device: torch.device) -> BlockRunner:
    """Records a start and an end CUDA event around each call on the current stream,
    synchronises once per block, then reads ``elapsed_time`` (GPU time, ms; returned in s). Events
    are reused across blocks."""
    stream = torch.cuda.current_stream(device)
    pool: List[Tuple[Any, Any]] = []

    def run_block(n: int) -> List[float]:
        while len(pool) < n:
            pool.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        pairs = pool[:n]
        for start, end in pairs:
            start.record(stream)
            call()
            end.record(stream)
        pairs[-1][1].synchronize()
        return [start.elapsed_time(end) * 1e-3 for start, end in pairs]

    return run_block


