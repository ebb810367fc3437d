"""Statistics and iteration control of flopcount.bench, with hand-derived oracles,
numpy as a live peer, and a fake clock (no real timing)."""

from __future__ import annotations

import math
from typing import List

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flopcount.bench import LoopPlan, compute_stats, percentile, run_iterations
from flopcount.errors import UsageError


def test_stats_hand_computed():
    s = compute_stats(samples_s=[4.0, 1.0, 10.0, 3.0, 2.0])  # sorted: 1 2 3 4 10
    assert s.iters == 5
    assert s.median_s == 3.0
    assert s.mean_s == 4.0
    assert s.min_s == 1.0 and s.max_s == 10.0
    # p90: rank 0.9*4 = 3.6 -> 4 + 0.6*(10-4) = 7.6 ; p99: rank 3.96 -> 4 + 0.96*6 = 9.76
    assert s.p90_s == pytest.approx(7.6)
    assert s.p99_s == pytest.approx(9.76)
    # squared deviations 9+4+1+0+36 = 50, ddof=1 -> 50/4
    assert s.std_s == pytest.approx(math.sqrt(12.5))
    assert s.cv == pytest.approx(math.sqrt(12.5) / 4.0)
    # p25 = 2 (rank 1), p75 = 4 (rank 3)
    assert s.iqr_s == pytest.approx(2.0)
    assert s.rel_iqr == pytest.approx(2.0 / 3.0)
    assert s.samples_s == (4.0, 1.0, 10.0, 3.0, 2.0)  # original order kept


def test_stats_even_count_median_and_single_sample():
    assert compute_stats(samples_s=[1.0, 2.0, 3.0, 4.0]).median_s == 2.5
    one = compute_stats(samples_s=[7.0])
    assert (one.median_s, one.p99_s, one.std_s, one.cv, one.iqr_s) == (7.0, 7.0, 0.0, 0.0, 0.0)


def test_stats_rejects_empty():
    with pytest.raises(UsageError):
        compute_stats(samples_s=[])
    with pytest.raises(UsageError):
        percentile([1.0], 101)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=1e-6, max_value=1e4, allow_nan=False), min_size=2, max_size=200))
def test_stats_match_numpy(values: List[float]):
    s = compute_stats(samples_s=values)
    a = np.asarray(values)
    for p, got in ((50, s.median_s), (90, s.p90_s), (99, s.p99_s)):
        assert got == pytest.approx(float(np.percentile(a, p)), rel=1e-9, abs=1e-12)
    assert s.std_s == pytest.approx(float(np.std(a, ddof=1)), rel=1e-7, abs=1e-9)
    assert s.min_s <= s.median_s <= s.p90_s <= s.p99_s <= s.max_s


def test_noise_flag_uses_relative_iqr():
    steady = compute_stats(samples_s=[1.0] * 99 + [50.0])  # one outlier: large CV, zero IQR
    assert steady.cv > 1.0 and not steady.is_noisy()
    spread = compute_stats(samples_s=[1.0, 1.5, 2.0, 2.5, 3.0])
    assert spread.is_noisy(0.10) and not spread.is_noisy(0.6)


# --------------------------------------------------------------------------- iteration control


class FakeClock:
    """Integer nanoseconds that only move when told to."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def fake_runner(clock: FakeClock, per_call_ns: int, blocks: List[int]):
    def run_block(n: int) -> List[float]:
        blocks.append(n)
        out = []
        for _ in range(n):
            clock.now += per_call_ns
            out.append(per_call_ns * 1e-9)
        return out

    return run_block


def test_fixed_iters_is_one_block():
    clock, blocks = FakeClock(), []
    samples, wall = run_iterations(fake_runner(clock, 2_000_000, blocks), LoopPlan(iters=7), clock)
    assert blocks == [7] and samples == pytest.approx([2e-3] * 7) and wall == 14_000_000


def test_adaptive_stops_when_budget_spent():
    # 1 ms per call, budget 50 ms, min 10: block 1, then 9 to reach min_iters, then
    # blocks of int(0.05 * 50 ms / 1 ms) = 2 until 50 ms have passed.
    clock, blocks = FakeClock(), []
    plan = LoopPlan(min_iters=10, budget_s=0.05)
    samples, wall = run_iterations(fake_runner(clock, 1_000_000, blocks), plan, clock)
    assert len(samples) == 50
    assert wall == 50_000_000
    assert blocks[:2] == [1, 9] and set(blocks[2:]) == {2}


def test_adaptive_min_iters_dominates_short_budget():
    clock, blocks = FakeClock(), []
    samples, _ = run_iterations(fake_runner(clock, 1_000_000, blocks), LoopPlan(min_iters=25, budget_s=1e-6), clock)
    assert len(samples) == 25


def test_adaptive_max_iters_caps_a_clock_that_never_moves():
    clock, blocks = FakeClock(), []
    samples, _ = run_iterations(fake_runner(clock, 0, blocks), LoopPlan(min_iters=5, budget_s=1.0, max_iters=1000), clock)
    assert len(samples) == 1000
    assert max(blocks) <= LoopPlan().max_block


def test_adaptive_overshoot_is_bounded():
    # slow calls (30 ms) with a 100 ms budget: never plans past the budget by more than one call
    clock, blocks = FakeClock(), []
    samples, wall = run_iterations(fake_runner(clock, 30_000_000, blocks), LoopPlan(min_iters=1, budget_s=0.1), clock)
    assert wall >= 100_000_000 and wall - 30_000_000 < 100_000_000
    assert len(samples) == 4


@pytest.mark.parametrize(
    "plan",
    [LoopPlan(iters=0), LoopPlan(min_iters=0), LoopPlan(budget_s=0), LoopPlan(min_iters=10, max_iters=5)],
)
def test_plan_validation(plan):
    with pytest.raises(UsageError):
        plan.validate()


def test_progress_reports_every_chunk_up_to_the_total():
    from flopcount.bench import LoopPlan, run_iterations

    seen = []
    clock = iter(range(0, 10**9, 1000)).__next__
    samples, _ = run_iterations(lambda n: [1.0] * n, LoopPlan(iters=25), clock, lambda done, total: seen.append((done, total)))
    assert len(samples) == 25
    assert seen[-1] == (25, 25) and len(seen) == 9  # chunks of ceil(25 / 10) = 3
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
