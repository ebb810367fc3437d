"""The one device model (flopcount.devices): datasheet parts, names and aliases, math
modes, dtypes without a peak; the one roofline function by hand. Oracles: the figures of
each part's datasheet (cited in flopcount/devices/parts.py) and hand arithmetic."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopcount
from flopcount.devices import named_roofs
from flopcount.errors import UsageError


@pytest.mark.parametrize(
    "name, part, bandwidth",
    [
        # each a name the old matcher mapped to another part, silently (issue #28)
        ("GH200", "GH200 144GB", 4.9e12),  # GH200 datasheet: HBM3e 4.9 TB/s (was H200's 4.8)
        ("H100 NVL", "H100 NVL", 3.9e12),  # H100 datasheet, NVL: 3.9 TB/s (was H100 SXM's 3.35)
        ("V100S", "V100S PCIe", 1.134e12),  # V100 datasheet, V100S: 1,134 GB/s (was V100 PCIe's 900)
        ("A100 40GB PCIe", "A100 40GB PCIe", 1.555e12),  # A100 datasheet: 1,555 GB/s (was 2,039)
        ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe", 1.555e12),  # torch.cuda.get_device_name() form
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1.935e12),
        # documented aliases, echoed
        ("h100", "H100 SXM", 3.35e12),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35e12),
        ("a100", "A100 80GB SXM", 2.039e12),
        ("h200", "H200 SXM", 4.8e12),
        ("Tesla T4", "T4", 320e9),
    ],
)
def test_names_resolve_exactly_or_by_alias_and_echo_the_part(name, part, bandwidth):
    roofs = named_roofs(name)
    assert roofs.device == part
    assert roofs.bandwidth == pytest.approx(bandwidth)


@pytest.mark.parametrize("name", ["tpu v9", "H100X", "A10G", "RTX 3090"])
def test_an_unknown_name_is_an_error_listing_the_parts(name):
    with pytest.raises(UsageError) as info:
        named_roofs(name)
    text = str(info.value)
    assert repr(name) in text and "H100 SXM" in text and "GH200 144GB" in text and "this machine" in text


def test_fp8_and_int8_have_their_own_peaks():
    # H100 SXM dense FP8 = 3958 / 2 = 1979 TFLOP/s (datasheet, with sparsity halved); the old
    # table fell back to the FP32 67 TFLOP/s. A 512x4096 @ 4096x4096 product's 2*512*4096^2
    # FLOPs over the bound must come out at 1979e12 (its ~17 MB fit the 50 MB L2, whose
    # bandwidth is not published: the bound is the compute term).
    result = flopcount.predict(nn.Linear(4096, 4096, bias=False), torch.randn(512, 4096), on="h100",
                               dtype="float8_e4m3fn")
    assert 2 * 512 * 4096 * 4096 / result.latency_s == pytest.approx(1979e12)
    assert result.unpriced == ()
    assert named_roofs("t4").peak_flops["int8"] == pytest.approx(130e12)  # T4 datasheet: INT8 130 TOPS


def test_a_dtype_without_a_peak_is_stated_not_silently_priced():
    # a T4 has no bf16 (Turing): priced at its highest floating peak (FP16 65 TFLOP/s), and said
    result = flopcount.predict(nn.Linear(256, 256, bias=False), torch.randn(64, 256), on="t4", dtype="bfloat16")
    assert result.unpriced == ("bfloat16",)
    assert any("T4 has no peak for bfloat16" in w and "float16" in w for w in result.warnings)
    assert result.latency_s == pytest.approx(2 * 64 * 256 * 256 / 65e12)


def test_math_modes_are_the_modeled_devices_not_the_hosts():
    # torch's defaults on the modeled A100: fp32 convolutions in TF32 (156 TFLOP/s), matmuls in
    # FP32 (19.5); a host flag changes neither, an argument does
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)
    x = torch.randn(32, 64, 56, 56)
    conv_flops = 2 * 32 * 64 * 56 * 56 * 64 * 9
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for host in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = host
            a100 = named_roofs("A100 80GB SXM")
            assert a100.peak("float32", "aten::convolution") == 156e12
            assert a100.peak("float32", "aten::mm") == 19.5e12
            result = flopcount.predict(conv, x, on="A100 80GB SXM")
            compute = sum(r.compute_s for r in result.rows)
            assert compute == pytest.approx(conv_flops / 156e12)
            plan_peak = flopcount.plan(lambda: nn.Sequential(nn.Linear(64, 64)), (torch.randn(4, 64),), fsdp=1,
                                       on="a100").step_time.peak_flops
            assert plan_peak == 19.5e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert named_roofs("a100", matmul_tf32=True).peak("float32", "aten::mm") == 156e12
    assert named_roofs("a100", conv_tf32=False).peak("float32", "aten::convolution") == 19.5e12


def test_plan_and_predict_accept_the_same_names():
    for name in ("H100 NVL", "GH200", "A100 40GB PCIe", "V100S"):
        planned = flopcount.plan(lambda: nn.Sequential(nn.Linear(8, 8)), (torch.randn(2, 8),), fsdp=1, on=name)
        assert planned.on == named_roofs(name).device
        assert planned.step_time.memory_bandwidth == named_roofs(name).bandwidth


def test_the_public_peaks_name_still_works():
    peaks = flopcount.peaks

    assert flopcount.Roofs is flopcount.devices.Roofs
    assert peaks.match_gpu("NVIDIA H100 NVL") == "H100 NVL"
    assert peaks.bandwidth("V100S") == pytest.approx(1.134e12)


def test_plan_step_time_does_not_follow_the_hosts_tf32_flag():
    # the issue: plan's step time moved 7x with torch.backends.cuda.matmul.allow_tf32 on the
    # host. A conv + linear model planned on an A100 gives the same compute time either way.
    def build() -> nn.Module:
        return nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.Flatten(), nn.Linear(16 * 8 * 8, 10))

    saved = torch.backends.cuda.matmul.allow_tf32
    times = []
    try:
        for host in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = host
            times.append(flopcount.plan(build, (torch.randn(4, 16, 8, 8),), fsdp=1, on="a100").step_time.compute_s)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert times[0] == times[1]


# --------------------------------------------------------------------------- "this gpu" (found on an H200)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
@pytest.mark.parametrize("name", ["this gpu", "cuda", "GPU"])
def test_this_gpu_without_cuda_is_a_clear_usage_error(name):
    """On a GPU machine, "this machine" means its CPU: a user serving a CUDA model with
    on="this machine" got CPU roofs. "this gpu" names the GPU; without one it says so."""
    from flopcount.devices import named_roofs
    from flopcount.errors import UsageError

    with pytest.raises(UsageError, match="CUDA GPU, and torch sees none here"):
        named_roofs(name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_this_gpu_is_the_gpu_measured(tmp_path, monkeypatch):
    from flopcount.devices import named_roofs

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    roofs = named_roofs("this gpu")
    assert roofs.source.startswith("measured") and roofs.device == torch.cuda.get_device_name()
    assert named_roofs("this machine").device != roofs.device


# --------------------------------------------------------------------------- "this gpu" as a bound (H200 run)

#: the H200's roofs as measure_roofs("cuda") found them in the run of 2026-11-26 (docs/performance.md,
#: "On a GPU"), and two real runs there, the fastest of 7 CUDA-event-timed calls, that beat the
#: bound priced on those raw measurements: tuned kernels beat a measured GPU rate
H200_MEASURED = dict(peak_flops={"float32": 7.411e13, "float16": 7.696e14, "bfloat16": 8.004e14}, bandwidth=3.881e12)
H200_MLP_BF16_S = 2.7381439e-3  # Linear(8192, 8192) -> ReLU -> Linear(8192, 8192), batch 8192, bfloat16
H200_ELEMENTWISE_S = 23.428032e-3  # 20 x relu(x * 1.0001 + 0.001 i) on a 64x64x224x224 float32 tensor


class _Elementwise(nn.Module):
    def forward(self, x):
        for i in range(20):
            x = torch.relu(x * 1.0001 + 0.001 * i)
        return x


def _h200_cases():
    with torch.device("meta"):
        mlp = nn.Sequential(nn.Linear(8192, 8192), nn.ReLU(), nn.Linear(8192, 8192)).to(torch.bfloat16)
        x = torch.empty(8192, 8192, dtype=torch.bfloat16)
        y = torch.empty(64, 64, 224, 224)
    return [(mlp, x, H200_MLP_BF16_S), (_Elementwise(), y, H200_ELEMENTWISE_S)]


def test_this_gpu_bounds_real_runs_that_beat_the_raw_measurement():
    """On the H200 the eager bound on the raw measured roofs was 2.80 ms for a GEMM-bound MLP that
    ran in 2.738 ms, and 24.44 ms for a DRAM-bound elementwise chain that ran in 23.43 ms. The
    roofs "this gpu" gives (gpu_ceiling: each rate the higher of measured and datasheet, the
    datasheet's math modes) bound both."""
    from flopcount.devices import MemoryLevel, Roofs, gpu_ceiling

    sheet = named_roofs("h200")
    raw = Roofs(H200_MEASURED["peak_flops"], H200_MEASURED["bandwidth"], "NVIDIA H200", "measured",
                levels=(MemoryLevel("L2", 60 * 2**20, None),))
    ceiling = gpu_ceiling(raw, sheet)
    assert ceiling.peak_flops["bfloat16"] == sheet.peak_flops["bfloat16"]  # 989.5 > 800.4 TFLOP/s measured
    assert ceiling.peak_flops["float32"] == H200_MEASURED["peak_flops"]["float32"]  # 74.1 measured > 67
    assert ceiling.bandwidth == sheet.bandwidth and dict(ceiling.math) == dict(sheet.math)
    assert flopcount.devices.default_bound(ceiling) == "eager"
    for model, x, real_s in _h200_cases():
        assert flopcount.predict(model, x, on=raw).bound_s("eager") > real_s  # the raw measurement: no bound
        assert flopcount.predict(model, x, on=ceiling).bound_s("eager") <= real_s
