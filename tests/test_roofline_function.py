"""The one roofline function (flopcount.devices.roofline) by hand: per-op time at the memory
level that holds the working set, the any-implementation bound, and predict's two bounds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopcount
from flopcount.devices import MemoryLevel, Roofs, any_implementation, op_time

ROOFS = Roofs(
    {"float32": 1e11, "bfloat16": 4e11},
    1e10,  # main memory 10 GB/s
    "toy",
    levels=(MemoryLevel("L1", 32e3, 1e12), MemoryLevel("L2", 1e6, 1e11), MemoryLevel("L3", 1e8, None)),
)


def test_op_time_picks_the_fastest_level_holding_the_working_set():
    # 16 kB fit L1 (32 kB): 16e3 / 1e12 = 16 ns; 2e3 FLOPs / 1e11 = 20 ns -> compute-bound
    t = op_time(ROOFS, 2e3, 16e3, "float32")
    assert (t.level, t.memory_s, t.compute_s, t.bound) == ("L1", pytest.approx(16e-9), pytest.approx(20e-9), "compute")
    # 500 kB: L2 (1 MB) at 100 GB/s; L1 may serve 32 kB of it: (5e5 - 3.2e4) / 1e11 = 4.68 us
    assert op_time(ROOFS, 0, 5e5).memory_s == pytest.approx(4.68e-6)
    # 50 MB: L3, no published bandwidth -> no memory term claimed
    t = op_time(ROOFS, 1e6, 5e7)
    assert (t.level, t.memory_s, t.seconds) == ("L3", 0.0, pytest.approx(1e-5))
    # 1 GB: main memory for all but what L1, L2 and L3 hold (32 kB + 1 MB + 100 MB):
    # (1e9 - 1.01032e8) / 1e10 = 89.8968 ms
    assert op_time(ROOFS, 0, 1e9).level == "DRAM" and op_time(ROOFS, 0, 1e9).seconds == pytest.approx(0.0898968)
    # a working set given apart from the bytes moved: 1 kB moved out of a 2 MB working set -> L3
    assert op_time(ROOFS, 0, 1e3, working_set=2e6).level == "L3"
    # bf16 has its own peak: 4e5 / 4e11 = 1 us; int8 has none: the highest of its kind is
    # looked for (no integer column), so the highest of all (bf16, 4e11)
    assert op_time(ROOFS, 4e5, 0, "bfloat16").compute_s == pytest.approx(1e-6)
    unpriced = op_time(ROOFS, 4e5, 0, "int8")
    assert unpriced.column is None and unpriced.compute_s == pytest.approx(1e-6)


def test_any_implementation_bound_by_hand():
    # 2e9 fp32 FLOPs / 1e11 = 20 ms and 4e9 bf16 / 4e11 = 10 ms -> 30 ms of compute;
    # 2e8 unavoidable bytes do not fit L3 (1e8): main memory for what the caches cannot hold,
    # (2e8 - 1.01032e8) / 1e10 = 9.8968 ms
    bound = any_implementation(ROOFS, [(2e9, "float32", "aten::mm"), (4e9, "bfloat16", "aten::mm")], 2e8)
    assert (bound.compute_s, bound.memory_s, bound.level) == (pytest.approx(0.03), pytest.approx(0.0098968), "DRAM")
    assert bound.seconds == pytest.approx(0.03)


@pytest.mark.parametrize("tracer_backward", [False, True])
def test_predict_gives_both_bounds(tracer_backward):
    # Linear(1024 -> 1024) on a batch of 64, DRAM-only roofs (1e11 FLOP/s, 1e10 B/s).
    model, x = nn.Linear(1024, 1024), torch.randn(64, 1024)
    roofs = Roofs({"float32": 1e11}, 1e10, "toy")
    result = flopcount.predict(model, x, on=roofs, backward=tracer_backward)
    counted = flopcount.count_flops(model, x, backward=tracer_backward)
    # any implementation: max(all FLOPs / peak, (weights + bias + input [+ their grads]) / bw)
    weights = (1024 * 1024 + 1024) * 4
    unavoidable = weights * (2 if tracer_backward else 1) + 64 * 1024 * 4
    expected_any = max(counted.flops / 1e11, unavoidable / 1e10)
    assert result.any_bound is not None
    assert result.any_bound.unavoidable_bytes == unavoidable
    assert result.any_s == pytest.approx(expected_any)
    # eager: each op max(FLOPs / peak, bytes / bw), summed; both bound the eager program
    assert result.latency_s == pytest.approx(sum(max(r.compute_s, r.memory_s) for r in result.rows))
    assert result.any_s <= result.latency_s  # no cache level: the per-op sum moves at least the unavoidable bytes
    assert result.bound_s("eager") == max(result.latency_s, result.any_s) and result.bound_s("any") == result.any_s
    data = result.to_dict()
    assert data["any_s"] == pytest.approx(result.any_s) and data["any_bound"]["unavoidable_bytes"] == unavoidable


class _TiedLookup(nn.Module):
    """An embedding whose table is also the output head's weight (GPT-2's tied LM head)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(5000, 16)
        self.head = nn.Linear(16, 5000, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.wte(ids))


@pytest.mark.parametrize("batch", [1, 3])
def test_any_implementation_reads_the_rows_a_lookup_gathers_not_the_table(batch):
    # Issue #28: nn.Embedding(1_000_000, 64) on 16 ids was bounded by reading the whole
    # 256 MB table. Any implementation reads the ids (batch x 16 x 8 bytes) and the
    # batch x 16 rows of 64 fp32 values it gathers; an unused table row is never read.
    model, ids = nn.Embedding(1_000_000, 64), torch.randint(0, 1_000_000, (batch, 16))
    roofs = Roofs({"float32": 1e11}, 1e10, "toy")
    result = flopcount.predict(model, ids, on=roofs)
    unavoidable = batch * 16 * 8 + batch * 16 * 64 * 4
    assert result.any_bound is not None and result.any_bound.unavoidable_bytes == unavoidable
    assert result.any_s == pytest.approx(unavoidable / 1e10)


def test_a_tied_table_is_read_whole_by_the_head():
    # The head's matmul reads the whole 5000 x 16 table; the lookup's rows add nothing new.
    model, ids = _TiedLookup(), torch.randint(0, 5000, (2, 7))
    result = flopcount.predict(model, ids, on=Roofs({"float32": 1e11}, 1e10, "toy"))
    assert result.any_bound is not None and result.any_bound.unavoidable_bytes == 5000 * 16 * 4 + 2 * 7 * 8


@pytest.mark.parametrize("meta", [False, True], ids=["cpu", "meta"])
def test_predict_a_lazy_model_leaves_its_unknown_parameters_out_of_the_unavoidable_bytes(meta):
    # predict on a model with a lazy module raised torch's "Attempted to use an uninitialized
    # parameter" (found by benchmarks/zoo_reuse.py on the 19 lazy torch.nn rows): the unavoidable
    # bytes read every parameter's size, which a lazy one does not have before its first forward.
    # Left out, the bound stays a lower bound: here the input (2 x 4 x 6 float32) and the second
    # Linear's 5 x 5 weight are what it counts (the lazy weight and bias are read too, unknown).
    device = "meta" if meta else "cpu"
    with torch.device(device):
        model = nn.Sequential(nn.LazyLinear(5), nn.Linear(5, 5, bias=False))
    x = torch.randn(2, 4, 6, device=device)
    roofs = Roofs({"float32": 1e11}, 1e10, "toy")
    result = flopcount.predict(model, x, on=roofs)
    unavoidable = 2 * 4 * 6 * 4 + 5 * 5 * 4  # the input and the second Linear's weight
    assert result.any_bound is not None and result.any_bound.unavoidable_bytes == unavoidable
    flops = sum(row.flops for row in result.by_operator().values())
    assert flops == 2 * 4 * (2 * 6 * 5 + 2 * 5 * 5)  # 8 rows, 6 -> 5 -> 5 (a bias add is not counted: conventions)
    assert isinstance(model[0], nn.LazyLinear)  # left as found
