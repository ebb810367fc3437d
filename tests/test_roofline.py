"""Roofs and roofline arithmetic (hand-computed numbers, a fake clock), the per-machine
roofs cache, and predict()'s lower bound computed by hand for a Linear."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import cuda
from torch import nn

import flopcount
from flopcount import devices
from flopcount.devices import measured as measured_mod
from flopcount.devices import measured as roofs_mod
from flopcount.devices.roofline import Roofs, attainable, bound, efficiency, intensity


def test_roofline_math_by_hand():
    r = Roofs({"float32": 1e9, "bfloat16": 4e9}, 1e8)
    # 2e6 FLOPs / 1e9 = 2 ms of compute; 1e6 bytes / 1e8 = 10 ms of memory
    assert attainable(2e6, 1e6, r, "float32") == pytest.approx(1e-2)
    assert bound(2e-3, 1e-2) == "memory"
    assert efficiency(1e-2, 2e-2) == pytest.approx(0.5)
    assert intensity(2e6, 1e6) == pytest.approx(2.0)
    # bfloat16 has its own peak; a dtype without one is priced at the highest peak (4e9:
    # 8e7 / 4e9 = 20 ms), never at a lower one, so the bound stays a lower bound
    assert attainable(8e7, 0, r, "bfloat16") == pytest.approx(2e-2)
    assert attainable(8e7, 0, r, "int8") == pytest.approx(2e-2)
    assert r.ridge == pytest.approx(10.0)


def test_roofs_refuse_nonsense():
    with pytest.raises(flopcount.UsageError, match="bandwidth"):
        Roofs({"float32": 1e9}, 0)
    with pytest.raises(flopcount.UsageError, match="peak"):
        Roofs({}, 1e9)


class _StepClock:
    """Seconds; every reading advances by ``dt``, so each timed call takes exactly ``dt``."""

    def __init__(self, dt: float) -> None:
        self.t, self.dt = 0.0, dt

    def __call__(self) -> float:
        self.t += self.dt  # a timed call reads twice: it took dt
        return self.t


def test_measure_roofs_with_a_fake_clock():
    # each call "takes" 0.5 s. The roof is the best of three libraries' kernels, each timed at
    # 0.5 s: GEMM 256^3 (stops growing: 0.5 >= budget/10) 2*256^3 = 33,554,432 FLOPs; a 3x3
    # conv 8x128x28x28 -> 128 channels 2*8*128*28*28*128*9 = 1,849,688,064 FLOPs; a linear
    # 512x1024 -> 1024 2*512*1024*1024 = 1,073,741,824 FLOPs: the conv's rate is the roof.
    # The streams loop a 1 MiB buffer 4 times per timing (4 MiB / 1 MiB): 3 buffers x 4 in 0.5 s.
    roofs = roofs_mod.measure_roofs("cpu", ["float32"], budget_s=1.0, clock=_StepClock(0.5), stream_bytes=2**20,
                                    levels=False)
    assert roofs.peak_flops == {"float32": pytest.approx(1_849_688_064 / 0.5)}
    assert roofs.bandwidth == pytest.approx(3 * 2**20 * 4 / 0.5)
    assert roofs.source == "measured"
    assert roofs.details["gemm_float32"] == "256x256x256 mm"
    assert roofs.details["compute_float32"].startswith("conv2d")


def test_machine_roofs_cached_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def fake_measure(device: torch.device) -> Roofs:
        calls.append(device)
        return Roofs({"float32": 5e10}, 2e10, "fake cpu", "measured")

    idle = dict(loadavg=lambda: (0.0, 0.0, 0.0), cores=2)
    first = roofs_mod.machine_roofs("cpu", measure=fake_measure, **idle)
    second = roofs_mod.machine_roofs("cpu", measure=fake_measure, **idle)
    assert len(calls) == 2  # two passes, which agree: measured once, then read back
    assert (second.peak_flops, second.bandwidth) == ({"float32": 5e10}, 2e10)
    assert first.source == "measured"
    assert second.source.startswith("measured (cached; measured 20")  # says when, and how
    stored = json.loads((tmp_path / "flopcount" / "roofs.json").read_text())
    assert list(stored) == [roofs_mod.machine_key(torch.device("cpu"))]
    roofs_mod.machine_roofs("cpu", measure=fake_measure, refresh=True, **idle)
    assert len(calls) == 4


def test_datasheet_roofs_and_names():
    h100 = devices.named_roofs("h100")
    assert h100.bandwidth == 3350e9 and h100.peak_flops["bfloat16"] == 989.5e12
    assert devices.named_roofs("T4").peak_flops["float32"] == 8.1e12
    assert devices.named_roofs("NVIDIA A100-SXM4-80GB").device == "A100 80GB SXM"
    for name in ("h200", "l4"):
        assert devices.named_roofs(name).source.startswith("datasheet")
    with pytest.raises(flopcount.UsageError, match="unknown part 'tpu v9'; known parts: H100 SXM"):
        devices.named_roofs("tpu v9")


def test_predict_linear_by_hand():
    model, x = nn.Linear(64, 32), torch.randn(8, 64)
    result = flopcount.predict(model, x, on="t4")
    (row,) = result.rows
    flops = 2 * 8 * 64 * 32
    moved = (8 * 64 + 32 * 64 + 32 + 8 * 32) * 4
    assert (row.flops, row.bytes) == (flops, moved)
    # the 10,880 bytes fit the T4's 4 MB L2, whose bandwidth NVIDIA does not publish: the
    # bound claims no memory time for it, only the compute term
    expected = flops / 8.1e12
    assert row.latency_s == pytest.approx(expected) and result.latency_s == pytest.approx(expected)
    assert row.bound == "compute"
    # on main memory (a Roofs with no cache level) the memory term binds: moved / 320 GB/s
    dram = flopcount.predict(model, x, on=Roofs({"float32": 8.1e12}, 320e9, "T4 DRAM only"))
    assert dram.latency_s == pytest.approx(max(flops / 8.1e12, moved / 320e9)) and dram.rows[0].bound == "memory"
    # priced in bfloat16 on an H100: floating tensors at 2 bytes, the bf16 tensor-core peak
    bf16 = flopcount.predict(model, x, on="h100", dtype=torch.bfloat16)
    assert bf16.latency_s == pytest.approx(flops / 989.5e12)


def test_predict_backward_covers_both_phases_and_given_roofs():
    model, x = nn.Sequential(nn.Linear(16, 16), nn.ReLU()), torch.randn(4, 16)
    roofs = Roofs({"float32": 1e9}, 1e9, "toy")
    result = flopcount.predict(model, x, on=roofs, backward=True)
    counted = flopcount.count_flops(model, x, backward=True)
    assert sum(r.flops for r in result.rows) == counted.flops
    assert {r.phase for r in result.rows} == {"forward", "backward"}
    assert result.latency_s == pytest.approx(sum(max(r.flops / 1e9, r.bytes / 1e9) for r in _calls(result)))


def _calls(result):
    # rows of one call each here (every op of this model runs once per phase and module)
    assert all(r.calls == 1 for r in result.rows if r.flops or r.bytes)
    return result.rows


@pytest.mark.cuda
@cuda
def test_cuda_roofs_measured_and_datasheet(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    roofs = devices.roofs_for(torch.device("cuda"))
    assert roofs.source == "measured"
    sheet = roofs.details.get("datasheet")
    if sheet is not None:  # a GPU in the table: measured below the datasheet peak, within reason
        assert 0.3 * sheet["bandwidth"] < roofs.bandwidth < 1.1 * sheet["bandwidth"]


@pytest.mark.cuda
@cuda
def test_cuda_measured_roofs_claim_nothing_for_data_in_l2():
    """On an H200, 60 elementwise ops on a 25.7 MB tensor (in + out = 51 MB, inside the 60 MB L2)
    ran faster than the bound charging every byte at the measured DRAM rate (ratio 1.011):
    measured GPU roofs carry the L2 (capacity from the device's properties), which, as on the
    datasheet, sets no memory term."""
    from flopcount.devices.measured import measure_roofs

    roofs = measure_roofs("cuda", budget_s=0.2)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert [(lv.name, lv.capacity, lv.bandwidth) for lv in roofs.levels] == [("L2", float(l2), None)]


def test_a_new_measurement_keeps_the_best_roofs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    slow = Roofs({"float32": 4e10, "bfloat16": 9e10}, 3e9, "cpu", "measured")
    fast = Roofs({"float32": 6e10}, 2e9, "cpu", "measured")
    idle = dict(loadavg=lambda: (0.0, 0.0, 0.0), cores=2)
    roofs_mod.machine_roofs("cpu", measure=lambda dev: slow, **idle)
    merged = roofs_mod.machine_roofs("cpu", measure=lambda dev: fast, refresh=True, **idle)
    assert (merged.peak_flops, merged.bandwidth) == ({"float32": 6e10, "bfloat16": 9e10}, 3e9)
    assert roofs_mod.machine_roofs("cpu").peak_flops == merged.peak_flops  # and it is what the cache holds


def test_a_latency_lower_bound_fails_or_stays_undecided():
    from flopcount.budget.check import Budget, check_budget

    over = check_budget(Budget(max_latency_s=0.010), latency_s=0.0125, latency_bound="lower")
    within = check_budget(Budget(max_latency_s=0.010), latency_s=0.004, latency_bound="lower")
    measured = check_budget(Budget(max_latency_s=0.010), latency_s=0.004)
    assert (over.status, within.status, measured.status) == ("FAIL", "UNDECIDED", "PASS")
    assert "not decided without measuring" in within.verdict()
    # a certain FAIL elsewhere still wins over an undecided latency
    both = check_budget(Budget(max_latency_s=0.010, max_params=5), latency_s=0.004, params=6, latency_bound="lower")
    assert both.status == "FAIL"


def test_gemm_roof_keeps_to_its_budget(monkeypatch):
    # A model machine where an n^3 product takes 1 ms at n = 256 (8x per doubling). With a
    # 1 s budget the size stops at 1024 (64 ms; 2048 would take 512 ms > budget/4), and the
    # timed calls of every size, warm-ups included, stay within the budget: 2 * (1 + 8 + 64) ms
    # while growing, then 64 ms products until half the budget is spent (7 in all) = 530 ms.
    # The old loop grew to 2048 and ran 5 of them: 3.2 s for a "1 s" budget.
    class Product:
        def __init__(self, n: int) -> None:
            self.n = n

    monkeypatch.setattr(measured_mod, "_gemm", lambda n, dev, dtype: Product(n))
    timed = []

    def timer(product: Product) -> float:
        took = 1e-3 * (product.n / 256) ** 3
        timed.append(took)
        return took

    rate, n = measured_mod._gemm_rate(torch.device("cpu"), torch.float32, 1.0, timer)
    assert n == 1024
    assert rate == pytest.approx(2 * 1024**3 / 0.064)
    assert sum(timed) == pytest.approx(0.530)
    assert len(timed) == 2 * 3 + 6


def test_stream_roof_keeps_to_its_budget():
    # each call "takes" 0.05 s; per variant a warm-up, then at least 3 timed calls, then more
    # while under budget/6 and the next fits in budget/3: 4 calls = 0.2 s > 1/6 s, so 4 each
    clock = _StepClock(0.05)
    rate, _ = measured_mod._stream_rate(torch.device("cpu"), 1.0, measured_mod._timer(torch.device("cpu"), clock), 2**20)
    assert rate == pytest.approx(3 * 2**20 * 4 / 0.05)  # a timing loops the 1 MiB buffer 4 times
    assert clock.t == pytest.approx(3 * 4 * 2 * 0.05)  # 3 variants x 4 calls x 2 readings
