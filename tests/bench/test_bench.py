"""flopcount.bench.benchmark end to end on CPU (fake clock for exact figures, the real
clock with loose assertions only), FLOP/s and MFU arithmetic, the peaks table, the
model left as found, usage errors; GPU-only tests skip without CUDA."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from conftest import FakeClock, assert_same_state, cuda, snapshot
from torch import nn

from flopcount import peaks
from flopcount.bench import BenchmarkResult, benchmark
from flopcount.errors import FlopcountWarning, UsageError


class Ticking(nn.Module):
    """Each forward advances the fake clock by the next duration (ns), cycling; the forwards run
    are counted on the clock (``ticks``), an object the timed runs' private twin shares."""

    def __init__(self, clock: FakeClock, durations_ns):
        super().__init__()
        self.clock = clock
        self.durations = list(durations_ns)
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale=None):
        self.clock.now += self.durations[self.clock.ticks % len(self.durations)]
        self.clock.ticks += 1
        return x


def test_fake_clock_gives_exact_statistics_and_counts_warmup():
    clock = FakeClock()
    # warm-up takes the first 2 durations; the 5 timed calls get 1..5 ms
    model = Ticking(clock, [9_000_000, 9_000_000, 1_000_000, 2_000_000, 3_000_000, 4_000_000, 5_000_000])
    r = benchmark(model, torch.zeros(6, 4), warmup=2, iters=5, timer=clock)
    assert clock.ticks == 7
    assert r.iters == 5
    assert r.median_s == pytest.approx(3e-3)
    assert r.mean_s == pytest.approx(3e-3)
    assert r.min_s == pytest.approx(1e-3) and r.max_s == pytest.approx(5e-3)
    assert r.p90_s == pytest.approx(4.6e-3)  # rank 3.6 between 4 and 5 ms
    assert r.wall_s == pytest.approx(15e-3)
    # throughput from the leading dim of the first tensor: 6 samples / 3 ms
    assert r.batch_size == 6
    assert r.throughput == pytest.approx(2000.0)
    assert r.iters_per_s == pytest.approx(1000.0 / 3.0)
    assert r.timing == "perf_counter" and r.device == "cpu"


def test_adaptive_run_through_benchmark():
    clock = FakeClock()
    model = Ticking(clock, [1_000_000])
    r = benchmark(model, torch.zeros(1, 4), warmup=0, min_iters=10, budget_s=0.05, timer=clock)
    assert r.iters == 50 and clock.ticks == 50


def test_batch_size_override_and_inputs_convention():
    clock = FakeClock()
    model = Ticking(clock, [2_000_000])
    r = benchmark(model, (torch.zeros(3, 4),), {"scale": torch.ones(1)}, warmup=0, iters=2, batch_size=12, timer=clock)
    assert r.batch_size == 12 and r.throughput == pytest.approx(6000.0)
    # kwargs only: the batch comes from the first kwarg tensor
    r = benchmark(model, (), {"x": torch.zeros(5, 4)}, warmup=0, iters=2, timer=clock)
    assert r.batch_size == 5
    # no tensor at all: batch 1
    r = benchmark(model, 3.0, warmup=0, iters=2, timer=clock)
    assert r.batch_size == 1


def test_achieved_flops_and_mfu_math():
    clock = FakeClock()
    model = Ticking(clock, [1_000_000])  # 1 ms
    r = benchmark(model, torch.zeros(1, 4), warmup=0, iters=3, flops=2e9, peak_flops=1e13, timer=clock)
    assert r.achieved_flops_per_s == pytest.approx(2e12)  # 2e9 FLOP / 1e-3 s
    assert r.mfu == pytest.approx(0.2)
    assert r.peak_source == "given"
    # a FlopResult-like object is accepted for flops; the peak comes from the table
    class Counted:
        flops = 3.12e9

    r = benchmark(model, torch.zeros(1, 4), warmup=0, iters=3, flops=Counted(), on="NVIDIA A100-SXM4-80GB", dtype=torch.bfloat16, timer=clock)
    assert r.peak_flops == pytest.approx(312e12)
    assert r.mfu == pytest.approx(3.12e12 / 312e12)
    assert "A100" in r.peak_source and "dense" in r.peak_source
    # no flops: no achieved rate, no MFU
    r = benchmark(model, torch.zeros(1, 4), warmup=0, iters=3, timer=clock)
    assert r.achieved_flops_per_s is None and r.mfu is None


def test_rendering_is_json_and_text():
    clock = FakeClock()
    model = Ticking(clock, [1_000_000, 3_000_000])
    r = benchmark(model, torch.zeros(2, 4), warmup=0, iters=4, flops=1e6, peak_flops=1e9, timer=clock)
    data = json.loads(json.dumps(r.to_dict()))
    for key in ("median_s", "mean_s", "p90_s", "p99_s", "min_s", "max_s", "std_s", "iters", "throughput", "iters_per_s", "cv", "mfu"):
        assert key in data
    # 1, 3, 1, 3 ms: the median is 2 ms; the 0.2 keys (ms) are kept beside the seconds for one release
    assert data["median_s"] == pytest.approx(2e-3) and data["median_ms"] == pytest.approx(2.0)
    assert "samples_s" not in data and r.to_dict(samples=True)["samples_s"] == pytest.approx([1e-3, 3e-3, 1e-3, 3e-3])
    text = str(r)
    assert "median" in text and "CV" in text and "MFU" in text


def test_noisy_run_warns_and_stores_the_warning():
    clock = FakeClock()
    model = Ticking(clock, [1_000_000, 5_000_000])
    with pytest.warns(FlopcountWarning, match="noisy"):
        r = benchmark(model, torch.zeros(1, 4), warmup=0, iters=10, timer=clock)
    assert r.noisy and any("noisy" in w for w in r.warnings)


def test_cpu_end_to_end_real_clock():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    r = benchmark(model, torch.randn(8, 16), warmup=2, min_iters=5, budget_s=0.05)
    assert isinstance(r, BenchmarkResult)
    assert r.iters >= 5
    assert 0 < r.min_s <= r.median_s <= r.p90_s <= r.p99_s <= r.max_s
    assert r.throughput > 0 and r.batch_size == 8
    assert r.memory_kind in (None, "cpu RSS growth")
    assert r.threads == torch.get_num_threads()


def test_runs_under_inference_mode_and_records_no_grad():
    seen = []

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            seen.append(torch.is_inference_mode_enabled())
            return self.lin(x)

    benchmark(Probe(), torch.randn(2, 3), warmup=1, iters=2)
    assert seen == [True, True, True]


def test_bfloat16_autocast_on_cpu():
    dtypes = []

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            dtypes.append(y.dtype)
            return y

    r = benchmark(Probe(), torch.randn(2, 8), warmup=0, iters=2, dtype=torch.bfloat16)
    assert dtypes == [torch.bfloat16, torch.bfloat16] and r.dtype == "bfloat16"


def test_compile_reports_first_call_separately():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    r = benchmark(model, torch.randn(2, 8), warmup=1, iters=3, compile={"backend": "eager"})
    assert r.compiled and r.compile_s is not None and r.compile_s > 0
    assert r.iters == 3


class BNNet(nn.Module):
    def __init__(self, fail: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)
        self.fail = fail

    def forward(self, x):
        y = self.drop(self.bn(self.conv(x)))
        if self.fail:
            raise RuntimeError("boom")
        return y


def _with_grads(model: nn.Module) -> nn.Module:
    model(torch.randn(2, 3, 6, 6)).sum().backward()
    return model


@pytest.mark.parametrize("training", [True, False])
def test_model_left_as_found(training):
    model = _with_grads(BNNet()).train(training)
    before = snapshot(model)
    with pytest.warns(FlopcountWarning) if training else _nothing():
        r = benchmark(model, torch.randn(2, 3, 6, 6), warmup=2, iters=3)
    assert r.training == training
    assert_same_state(model, before)  # BatchNorm running stats restored in train mode


def test_model_left_as_found_when_forward_raises():
    model = _with_grads(BNNet()).train()
    model.fail = True
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="boom"):
        benchmark(model, torch.randn(2, 3, 6, 6), warmup=1, iters=2)
    assert_same_state(model, before)


class _Hooking(nn.Module):
    """A forward that leaves a hook behind and flips requires_grad: what the tracers' state
    guard undoes, and (#19: one state guard) the benchmark now undoes too."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        self.lin.register_forward_hook(lambda *a: None)
        self.lin.bias.requires_grad_(False)
        return self.lin(x)


def test_benchmark_undoes_hooks_and_flags_and_leaves_the_models_own_counters():
    model = _Hooking()
    benchmark(model, torch.randn(2, 4), warmup=2, iters=3)
    assert len(model.lin._forward_hooks) == 0 and model.lin.bias.requires_grad
    assert model.calls == 0  # the runs wrote the private twin's counter (tests/bench/test_timed_runs_twin.py)


def test_explicit_cpu_device_keeps_the_model():
    model = nn.Linear(4, 4)
    params = [id(p) for p in model.parameters()]
    r = benchmark(model, torch.randn(2, 4), device="cpu", warmup=0, iters=2)
    assert r.device == "cpu" and [id(p) for p in model.parameters()] == params


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_without_gpu_is_a_usage_error():
    with pytest.raises(UsageError, match="CUDA is not available"):
        benchmark(nn.Linear(2, 2), torch.randn(1, 2), device="cuda")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"iters": 0},
        {"warmup": -1},
        {"min_iters": 0},
        {"budget_s": 0},
        {"batch_size": 0},
        {"dtype": torch.int8},
        {"flops": "many"},
        {"flops": 1e9, "peak_flops": 0},
        {"device": "not-a-device"},
    ],
)
def test_usage_errors(kwargs):
    with pytest.raises(UsageError):
        benchmark(nn.Linear(2, 2), torch.randn(1, 2), **kwargs)


def test_not_a_module():
    with pytest.raises(UsageError):
        benchmark(lambda x: x, torch.randn(1))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- peaks table


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", None),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", None),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 3090", None),
    ],
)
def test_gpu_names(name, key):
    assert peaks.match_gpu(name) == key


def test_peak_lookup_and_table_invariants():
    assert peaks.peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) == pytest.approx(989.5e12)
    assert peaks.peak_flops("NVIDIA H100 80GB HBM3", "tf32") == pytest.approx(494.5e12)
    assert peaks.peak_flops("Tesla T4", torch.bfloat16) is None  # no bf16 on Turing
    assert peaks.peak_flops("Some GPU", torch.float16) is None
    with pytest.raises(UsageError):
        peaks.dtype_key(torch.int16)
    assert peaks.peak_flops("Tesla T4", torch.int8) == pytest.approx(130e12)  # T4 datasheet: INT8 130 TOPS
    for gpu, row in peaks.PEAK_TFLOPS.items():
        assert row["float32"] > 0
        for key in ("float16", "bfloat16", "tfloat32"):
            if key in row:
                assert row[key] >= row["float32"], gpu
        if "float16" in row and "bfloat16" in row:
            assert row["float16"] == row["bfloat16"], gpu
    with pytest.raises(TypeError):
        peaks.PEAK_TFLOPS["A100 80GB SXM"]["float32"] = 1.0  # type: ignore[index]


# --------------------------------------------------------------------------- GPU only


@pytest.mark.cuda
@cuda
def test_cuda_events_memory_and_model_restored():
    model = _with_grads(BNNet()).eval()  # stays on the CPU; benchmark moves it and back
    before = snapshot(model)
    r = benchmark(model, torch.randn(4, 3, 16, 16), device="cuda", warmup=3, iters=10, flops=1e6)
    assert r.timing == "cuda_event" and r.device.startswith("cuda")
    assert r.median_s > 0 and r.iters == 10
    assert r.peak_memory_bytes and r.peak_memory_bytes > 0 and r.memory_kind == "cuda max_memory_allocated"
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(b.device.type == "cpu" for b in model.buffers())
    assert_same_state(model, before)


@pytest.mark.cuda
@cuda
def test_cuda_adaptive_and_autocast():
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)).cuda().eval()
    x = torch.randn(32, 256, device="cuda")
    r = benchmark(model, x, warmup=3, min_iters=20, budget_s=0.1, dtype=torch.float16, flops=1e6)
    assert r.iters >= 20 and r.dtype == "float16"
    assert r.peak_source is None or "dense" in r.peak_source
    assert next(model.parameters()).dtype == torch.float32


@pytest.mark.cuda
@cuda
def test_cuda_events_see_gpu_work_that_a_naive_clock_misses():
    x = torch.randn(2048, 2048, device="cuda")

    class MatPow(nn.Module):
        def forward(self, a):
            for _ in range(10):
                a = a @ x
            return a

    r = benchmark(MatPow(), x, warmup=2, iters=5)
    assert r.median_s > 0.05e-3  # 10 x 17 GFLOP matmuls cannot finish in launch time


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --------------------------------------------------------------------------- issue #9, finding 7 (benchmark part)


def test_benchmark_leaves_the_random_stream_as_found():
    """A train-mode dropout draws random numbers in every timed call; the caller's next
    draw must be what it would have been without the benchmark."""
    from flopcount.bench import module_latency

    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).train()
    x = torch.randn(4, 3, 8)
    torch.manual_seed(123)
    expected = torch.rand(5)
    for run in (
        lambda: benchmark(model, x, iters=3, warmup=1),
        lambda: module_latency(model, x, iters=2, warmup=1),
    ):
        torch.manual_seed(123)
        run()
        others = [(type(t).__module__, type(t).__name__, t.name) for t in threading.enumerate() if t is not threading.current_thread()]
        assert torch.equal(torch.rand(5), expected), f"not set back; other threads alive: {others}"


@cuda
def test_cuda_random_stream_left_as_found():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).train()
    torch.cuda.manual_seed(7)
    expected = torch.rand(5, device="cuda")
    torch.cuda.manual_seed(7)
    benchmark(model, torch.randn(4, 8), device="cuda", iters=3, warmup=1)
    assert torch.equal(torch.rand(5, device="cuda"), expected)


@pytest.mark.parametrize("where", ["model", "input"])
def test_a_model_without_data_is_refused(where):
    from flopcount import count_flops
    from flopcount.bench import module_latency

    device = "meta" if where == "model" else "cpu"
    with torch.device(device):
        model = nn.Linear(4, 4)
    x = torch.randn(2, 4, device="meta" if where == "input" else "cpu")
    with pytest.raises(UsageError, match="meta"):
        benchmark(model, x, iters=2, warmup=0)
    with pytest.raises(UsageError, match="meta"):
        module_latency(model, x, iters=2, warmup=0)
    if where == "model":
        with pytest.raises(UsageError, match="meta"):
            count_flops(model, torch.empty(2, 4, device="meta"), measure=True)


def test_a_fake_model_is_refused():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = nn.Linear(4, 4)
        x = torch.randn(2, 4)
    with pytest.raises(UsageError, match="fake"):
        benchmark(model, x, iters=2, warmup=0)


def test_a_lazy_model_is_timed_and_left_lazy():
    """benchmark (and module_latency, profile: the same borrowed_model) ran the caller's lazy
    model, whose first call turned its LazyLinear into a Linear with materialised parameters
    ("the model's parameters are left as found" said the docstring)."""
    from flopcount import module_latency

    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 5)
    second = model[2].weight
    result = benchmark(model, x, warmup=1, iters=3)
    assert result.stats.iters == 3
    module_latency(model, x, warmup=1, iters=3)
    assert isinstance(model[0], nn.LazyLinear) and model[0].has_uninitialized_params()
    assert isinstance(model[0].weight, nn.parameter.UninitializedParameter)
    assert model[2].weight is second and not model[0]._forward_pre_hooks == {}
    assert model(x).shape == (3, 2)  # still materialises for the user afterwards
