"""This machine's measured roofs: sanity checks on fake measurements (load, passes that
disagree, implausibly low against the ISA peak, bf16 below fp32 on bf16 hardware), the cache
key, the opt-out, the ISA peak and the cache levels from fake /proc and /sys. Oracles: the
fake figures themselves and the ISA formula by hand."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import torch
from torch import nn

import flopcount
from flopcount.devices import Roofs
from flopcount.devices import measured as m
from flopcount.devices.cpu import cpu_facts, read_caches
from flopcount.devices.roofline import MemoryLevel

IDLE = (0.5, 0.5, 0.5)
BUSY = (8.1, 3.8, 1.5)  # what this 2-core VM showed while other jobs ran
WHEN = datetime(2026, 11, 26, 13, 0, tzinfo=timezone.utc)


def _fake(fp32: float = 5e10, bw: float = 2e10, bf16: float = 1e11, isa: float = 1e11, l2: float = 8e10):
    details = {"isa_peak_flops": {"float32": isa, "bfloat16": 2 * isa}, "bf16_instructions": "avx512_bf16"}
    return Roofs({"float32": fp32, "bfloat16": bf16}, bw, "fake cpu", "measured", details,
                 (MemoryLevel("L2", 1e6, l2),))


class Passes:
    """A measure function returning the given roofs in turn (then the last again)."""

    def __init__(self, *roofs: Roofs) -> None:
        self.roofs, self.calls = list(roofs), 0

    def __call__(self, device: torch.device) -> Roofs:
        self.calls += 1
        return self.roofs[min(self.calls, len(self.roofs)) - 1]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(m.NO_CACHE_ENV, raising=False)
    return tmp_path / "flopcount" / "roofs.json"


def test_sane_roofs_are_cached_and_say_when_and_how(cache_dir):
    measure = Passes(_fake())
    first = m.machine_roofs("cpu", measure=measure, loadavg=lambda: IDLE, cores=2, now=lambda: WHEN)
    assert measure.calls == 2 and first.source == "measured"
    again = m.machine_roofs("cpu", measure=measure, loadavg=lambda: IDLE, cores=2)
    assert measure.calls == 2  # read back
    assert again.source.startswith("measured (cached; measured 2026-11-26T13:00:00Z, ")
    assert again.levels == (MemoryLevel("L2", 1e6, 8e10),)
    assert json.loads(cache_dir.read_text())


def test_a_measurement_under_load_is_used_but_never_cached(cache_dir):
    # load 8.1 on 2 cores: measured once (two passes), not retried, not written
    measure = Passes(_fake(fp32=1e9))
    roofs = m.machine_roofs("cpu", measure=measure, loadavg=lambda: BUSY, cores=2)
    assert measure.calls == 2
    assert roofs.source.startswith("measured (not cached: load average 8.10 above the 2 cores")
    assert not cache_dir.exists()
    # and the next call measures again rather than reading a poisoned entry
    m.machine_roofs("cpu", measure=measure, loadavg=lambda: BUSY, cores=2)
    assert measure.calls == 4


def test_passes_that_disagree_are_measured_again_then_refused(cache_dir):
    # fp32 5e10 then 3e10: 40 % apart (> 25 %) in every try
    measure = Passes(_fake(fp32=5e10), _fake(fp32=3e10), _fake(fp32=5e10), _fake(fp32=3e10))
    roofs = m.machine_roofs("cpu", measure=measure, loadavg=lambda: IDLE, cores=2, tries=2)
    assert measure.calls == 4
    assert "float32 roof 50 vs 30 GFLOP/s in two passes" in roofs.source
    assert roofs.peak_flops["float32"] == 5e10  # the best is still what this call uses
    assert not cache_dir.exists()
    # a second try that agrees is cached
    measure = Passes(_fake(fp32=5e10), _fake(fp32=3e10), _fake(fp32=5e10), _fake(fp32=5.1e10))
    roofs = m.machine_roofs("cpu", measure=measure, loadavg=lambda: IDLE, cores=2, tries=2)
    assert roofs.source == "measured" and cache_dir.exists()


def test_implausible_and_inconsistent_roofs_are_refused():
    # the cached fp32 roof: 0.89 GFLOP/s, under a tenth of a 1e11 ISA peak
    low = _fake(fp32=0.89e9)
    assert any("below 10% of the ISA peak" in p for p in m.sanity(low, low, 0.5, 2))
    # bf16 at 4e10 below half of fp32's 1e11 on a CPU with bf16 instructions
    odd = _fake(fp32=1e11, bf16=4e10)
    assert any("bfloat16 roof 40 below half of float32's 100" in p for p in m.sanity(odd, odd, 0.5, 2))
    # a bandwidth level 2x apart between passes
    assert any("L2 bandwidth" in p for p in m.sanity(_fake(l2=8e10), _fake(l2=4e10), 0.5, 2))
    assert m.sanity(_fake(), _fake(), 0.5, 2) == []


def test_the_cache_key_holds_threads_math_flags_and_torch(monkeypatch):
    key = m.machine_key(torch.device("cpu"))
    assert f"x{torch.get_num_threads()} threads" in key and f"torch {torch.__version__}" in key
    saved_threads = torch.get_num_threads()
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not saved_tf32
        assert m.machine_key(torch.device("cpu")) != key
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
        torch.set_num_threads(1 if saved_threads != 1 else 2)
        assert m.machine_key(torch.device("cpu")) != key
    finally:
        torch.set_num_threads(saved_threads)
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
    assert m.machine_key(torch.device("cpu")) == key


def test_the_cache_can_be_turned_off(cache_dir, monkeypatch):
    monkeypatch.setenv(m.NO_CACHE_ENV, "1")
    measure = Passes(_fake())
    m.machine_roofs("cpu", measure=measure, loadavg=lambda: IDLE, cores=2)
    m.machine_roofs("cpu", measure=measure, loadavg=lambda: IDLE, cores=2)
    assert measure.calls == 4 and not cache_dir.exists()
    m.remember_roofs(_fake(), "cpu")
    assert not cache_dir.exists()


def test_remeasure_keeps_the_best_sane_figures(cache_dir):
    m.machine_roofs("cpu", measure=Passes(_fake(fp32=5e10)), loadavg=lambda: IDLE, cores=2)
    again = m.machine_roofs("cpu", measure=Passes(_fake(fp32=6e10, bw=1e10)), loadavg=lambda: IDLE, cores=2, refresh=True)
    assert (again.peak_flops["float32"], again.bandwidth) == (6e10, 2e10)


def test_a_roof_below_what_ran_is_raised():
    raised = m.raise_to_achieved(_fake(fp32=5e10), {"float32": 7e10, "bfloat16": 1e10}, "aten::convolution")
    assert raised.peak_flops == {"float32": 7e10, "bfloat16": 1e11}
    assert "50 -> 70 GFLOP/s (aten::convolution)" in raised.details["raised_to_achieved"]["float32"]


CPUINFO = """processor\t: 0
model name\t: Fake Zen 5
cpu MHz\t\t: 2600.000
flags\t\t: fpu sse avx avx2 fma avx512f avx512_bf16
processor\t: 1
model name\t: Fake Zen 5
cpu MHz\t\t: 2600.000
flags\t\t: fpu sse avx avx2 fma avx512f avx512_bf16
"""


def test_isa_peak_by_hand():
    # max clock 5.0 GHz from cpufreq (kHz); 2 FMA units x 16 fp32 lanes (avx512f) x 2 FLOPs
    facts = cpu_facts(cpuinfo=CPUINFO, cpufreq="5000000", cache_root="/nonexistent")
    assert facts.model == "Fake Zen 5" and facts.max_hz == 5e9
    peaks = facts.isa_peak(threads=1)
    assert peaks["float32"] == 1 * 2 * 16 * 2 * 5e9  # 320 GFLOP/s per core
    assert peaks["float64"] == 160e9 and peaks["bfloat16"] == 640e9  # bf16 dot products: 2x fp32
    # without a published max clock the current one is used, and the facts say so
    bare = cpu_facts(cpuinfo=CPUINFO.replace("avx512f avx512_bf16", ""), cpufreq="", cache_root="/nonexistent")
    assert bare.max_hz == 2.6e9 and bare.lanes() == 8 and bare.notes


def test_cache_levels_from_sysfs(tmp_path):
    for i, (level, kind, size, shared) in enumerate(
        [(1, "Data", "48K", "0"), (1, "Instruction", "32K", "0"), (2, "Unified", "2048K", "0"), (3, "Unified", "32M", "0-15")]
    ):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(f"{value}\n")
    caches = read_caches(str(tmp_path))
    assert [(c.level, c.size, c.sharers) for c in caches] == [(1, 48 * 1024, 1), (2, 2 * 2**20, 1), (3, 32 * 2**20, 16)]
    # two threads hold two private L2s (4 MiB) but share the one L3 (32 MiB)
    assert caches[1].capacity(2) == 4 * 2**20 and caches[2].capacity(2) == 32 * 2**20


def test_measured_levels_are_ordered_and_shown_at_their_working_set():
    # a real (tiny-budget) measurement: each level's capacity is the working set it was shown
    # at, a faster level is never slower than the one below it, main memory is last
    roofs = m.measure_roofs("cpu", ["float32"], budget_s=0.02, stream_bytes=8 * 2**20)
    levels = roofs.all_levels()
    assert levels[-1].name == "DRAM" and levels[-1].capacity is None
    rates = [lv.bandwidth for lv in levels]
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    caps = [lv.capacity for lv in levels[:-1]]
    assert caps == sorted(caps)


def test_an_entry_cached_under_the_old_key_is_not_read(cache_dir):
    # the poisoned cache: fp32 0.89 GFLOP/s stored by an earlier flopcount under a key
    # without math flags or a version; it is never read back as this machine's roofs
    import platform

    old_key = f"{platform.node()} | cpu | {m._cpu_model()} x{torch.get_num_threads()} threads | torch {torch.__version__}"
    cache_dir.parent.mkdir(parents=True)
    cache_dir.write_text(json.dumps({old_key: Roofs({"float32": 0.89e9}, 1e9, "cpu", "measured").to_dict()}))
    roofs = m.machine_roofs("cpu", measure=Passes(_fake()), loadavg=lambda: IDLE, cores=2)
    assert roofs.peak_flops["float32"] == 5e10


def test_profile_raises_a_measured_roof_below_what_an_op_reached(cache_dir):
    # a cached float32 roof of 0.1 GFLOP/s (no sane machine is that slow: the poisoned
    # cache); a 64x512 @ 512x512 linear (2*64*512*512 = 33.6 MFLOPs) runs far faster. The
    # profile's roof must end at least at the fastest compute op's own measured rate (its
    # FLOPs / its profiled time), so no compute-bound row reads above 1.
    m.remember_roofs(Roofs({"float32": 1e8}, 1e12, "slow cpu", "measured"), "cpu")
    model, x = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)), torch.randn(64, 512)
    result = flopcount.profile(model, x, steps=2)
    rates = [r.flops / r.time_s for r in result.rows if r.flops >= 1e6 and r.time_s * 1e6 / 2 >= 20]
    assert rates, "the linears were timed"
    assert result.roofs.peak_flops["float32"] >= max(rates) * (1 - 1e-9)
    assert "raised_to_achieved" in result.roofs.details
    # given roofs are the user's and stay as given
    given = Roofs({"float32": 1e8}, 1e12, "given", "given")
    assert flopcount.profile(model, x, steps=2, roofs=given).roofs.peak_flops["float32"] == 1e8


# What measure_roofs' float32 candidates reached on an NVIDIA H100 SXM (torch 2.11+cu130, default
# flags; docs/performance.md, "On a GPU"): the 8192^3 mm 51.98 TFLOP/s (cuBLAS's FFMA kernel, relative
# error 1.6e-6 against float64: true float32), the channels-last 3x3 conv 72.71 TFLOP/s (cuDNN runs
# float32 convolutions on TF32 tensor cores by default), the linear 21.02 TFLOP/s. The part's
# float32 datasheet peak is 67 TFLOP/s.
H100_FLOAT32 = {"8192x8192x8192 mm": 51.98e12, "conv2d 8x128x28x28 3x3 channels_last": 72.71e12,
                "linear 512x1024x1024": 21.02e12}


def test_float32_work_run_as_tf32_is_priced_in_its_own_column(monkeypatch):
    """Before, the float32 roof was the best candidate, the TF32 conv's 72.71 TFLOP/s: float32
    matmuls were priced 1.4x faster than the fastest float32 GEMM ran, above the datasheet."""
    kernels = {label: (lambda: None, 1.0) for label in H100_FLOAT32 if not label.endswith(" mm")}
    rate_of = {id(kernel): H100_FLOAT32[label] for label, kernel in kernels.items()}
    monkeypatch.setattr(m, "_gemm_rate", lambda dev, dtype, budget, timer: (H100_FLOAT32["8192x8192x8192 mm"], 8192))
    monkeypatch.setattr(m, "_library_kernels", lambda dev, dtype: list(kernels.items()))
    monkeypatch.setattr(m, "_best_rate", lambda kernel, budget, timer: rate_of[id(kernel)])
    monkeypatch.setattr(m, "_stream_rate", lambda dev, budget, timer, size: (3.0e12, "fake stream"))
    monkeypatch.setattr(m, "reduced_precision_families", lambda dev: ("conv",))  # cuDNN's default
    roofs = m.measure_roofs("cpu", ["float32"], levels=False, facts=cpu_facts())
    assert dict(roofs.peak_flops) == {"float32": 51.98e12, "tfloat32": 72.71e12}
    assert dict(roofs.math) == {"conv": "tfloat32"}
    assert roofs.peak("float32", "aten::mm") == 51.98e12
    assert roofs.peak("float32", "aten::convolution") == 72.71e12
    # with no family on TF32 (a CPU; or cuDNN's TF32 turned off) the best candidate is the roof
    monkeypatch.setattr(m, "reduced_precision_families", lambda dev: ())
    roofs = m.measure_roofs("cpu", ["float32"], levels=False, facts=cpu_facts())
    assert dict(roofs.peak_flops) == {"float32": 72.71e12} and not roofs.math


def test_which_float32_work_runs_as_tf32_follows_torch_flags():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    gpu = torch.device("cuda", 0)  # a device object only: nothing runs
    try:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
        torch.set_float32_matmul_precision("highest")
        assert m.reduced_precision_families(gpu) == ("conv",)  # torch's defaults
        assert m.reduced_precision_families(torch.device("cpu")) == ()
        torch.set_float32_matmul_precision("high")
        assert m.reduced_precision_families(gpu) == ("matmul", "conv")
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
        assert m.reduced_precision_families(gpu) == ()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])
