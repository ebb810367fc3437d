"""StepTimer with a fake clock: reader cost, batch cost, reader ratio and ips against
hand-computed values."""

from __future__ import annotations

import json

import pytest

from flopcount.bench.steps import StepTimer, StepTiming, summarize_steps
from flopcount.errors import UsageError

S = 1_000_000_000  # one second in ns


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def slow_loader(clock: FakeClock, read_s, batches):
    for seconds, batch in zip(read_s, batches):
        clock.now += seconds * S
        yield batch


def run_loop(timer: StepTimer, clock: FakeClock, read_s, work_s, sizes, pass_sizes=True):
    for i, batch in enumerate(timer.wrap(slow_loader(clock, read_s, sizes))):
        clock.now += work_s[i] * S
        timer.step(num_samples=batch if pass_sizes else None)


def test_hand_computed_summary():
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    # reads 1 s and 3 s, work 3 s and 5 s -> batch costs 4 s and 8 s; 4 and 16 samples
    run_loop(timer, clock, [1, 3], [3, 5], [4, 16])
    s = timer.summary()
    assert s.steps == 2
    assert (s.reader_cost.avg, s.reader_cost.min, s.reader_cost.max) == pytest.approx((2.0, 1.0, 3.0))
    assert (s.batch_cost.avg, s.batch_cost.min, s.batch_cost.max) == pytest.approx((6.0, 4.0, 8.0))
    assert s.reader_ratio == pytest.approx(4.0 / 12.0)
    # per-step ips 4/4 = 1 and 16/8 = 2; avg = 20 samples / 12 s
    assert (s.ips.avg, s.ips.min, s.ips.max) == pytest.approx((20.0 / 12.0, 1.0, 2.0))
    assert s.ips_unit == "samples/s"
    assert "reader_ratio" in str(s)
    json.dumps(s.to_dict())


def test_data_bound_loop_has_high_reader_ratio():
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    run_loop(timer, clock, [9] * 5, [1] * 5, [1] * 5)
    assert timer.summary().reader_ratio == pytest.approx(0.9)


def test_skip_first_and_steps_per_second_without_sizes():
    clock = FakeClock()
    timer = StepTimer(clock=clock, skip_first=1)
    run_loop(timer, clock, [10, 1, 1], [10, 1, 3], [8, 8, 8], pass_sizes=False)
    s = timer.summary()
    assert s.steps == 2 and len(timer.records) == 3
    assert s.ips_unit == "steps/s"
    assert (s.ips.avg, s.ips.min, s.ips.max) == pytest.approx((2.0 / 6.0, 0.25, 0.5))


def test_start_and_manual_steps_and_synchronize():
    clock = FakeClock()
    synced = []
    timer = StepTimer(clock=clock, synchronize=lambda: synced.append(clock.now))
    timer.start()
    clock.now += 2 * S
    rec = timer.step(num_samples=4)
    assert rec == StepTiming(reader_cost=0.0, batch_cost=2.0, num_samples=4)
    assert synced == [2 * S]


def test_errors():
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    with pytest.raises(UsageError):
        timer.step()
    with pytest.raises(UsageError):
        timer.summary()
    with pytest.raises(UsageError):
        summarize_steps([])
    with pytest.raises(UsageError):
        StepTimer(skip_first=-1)
    timer = StepTimer(clock=clock, skip_first=5)
    run_loop(timer, clock, [1], [1], [1])
    with pytest.raises(UsageError, match="skipped"):
        timer.summary()


def test_step_cost_gives_tflops_and_mfu_per_step():
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    timer.set_step_cost(3 * 10**12, peak_flops=2e12)
    run_loop(timer, clock, [1, 1], [1, 5], [4, 4])  # batch costs 2 s and 6 s
    summary = timer.summary()
    # 3e12 FLOPs in 2 s = 1.5 TFLOP/s, in 6 s = 0.5; sustained 6e12 / 8 s = 0.75
    assert summary.tflops.to_dict() == pytest.approx({"avg": 0.75, "min": 0.5, "max": 1.5})
    assert summary.mfu.to_dict() == pytest.approx({"avg": 0.375, "min": 0.25, "max": 0.75})
    assert "TFLOP/s avg 0.75 (min 0.5, max 1.5)" in str(summary) and "MFU avg 37.50%" in str(summary)
    assert json.loads(json.dumps(summary.to_dict()))["flops_per_step"] == 3 * 10**12
    with pytest.raises(UsageError, match="set_step_cost"):
        timer.set_step_cost(-1)


def test_step_cost_without_peak_has_no_mfu_and_no_cost_no_rate():
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    run_loop(timer, clock, [1], [1], [4])
    assert timer.summary().tflops is None and "TFLOP/s" not in str(timer.summary())
    timer.set_step_cost(10**12)
    assert timer.summary().tflops.avg == pytest.approx(0.5) and timer.summary().mfu is None


def test_step_timer_counts_the_training_step_of_a_model():
    import torch

    from flopcount import count_flops

    model = torch.nn.Linear(8, 4, bias=False)
    batch = torch.randn(5, 8)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    timer = StepTimer(model=model, example_batch=batch, optimizer=sgd)
    optimizer = count_flops(model, batch, backward=True, optimizer=sgd).by_phase()["optimizer"]
    # forward x @ W.T and backward grad_W = grad.T @ x: 2 x (5 x 8 x 4) MACs = 4 x 160 FLOPs; no input grad
    assert timer.flops_per_step == 4 * 5 * 8 * 4 + optimizer
    assert optimizer > 0
    with pytest.raises(UsageError, match="together"):
        StepTimer(model=model)
