"""Cases that broke the latency lower bound on this project's CPU VM (branch boundcheck,
docs/performance.md): work the bound charged that no kernel does. Each oracle is a count by
hand on given roofs; the real runs they were found against are in benchmarks/bound_suite.py
(``--break``).

* a dynamic int8 Linear priced at the float32 roof (2.3-3.0x above the fastest run);
* a causal SDPA priced for its whole Lq x Lk scores (1.05x at 1 thread, s2048);
* a 64 MiB buffer updated at one position counted as read by any implementation (39x).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import flopcount
from flopcount.devices import MemoryLevel, Roofs
from flopcount.devices.cpu import cpu_facts

#: compute-bound roofs: memory (1 PB/s) never binds
COMPUTE = Roofs({"float32": 1e11, "bfloat16": 2e11, "int8": 4e11}, 1e15, "toy")
#: memory-bound roofs: 10 GB/s main memory, no cache
MEMORY = Roofs({"float32": 1e15}, 1e10, "toy")


def _quantized(model: nn.Module, dtype: torch.dtype = torch.qint8) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=dtype)


def test_a_dynamic_int8_linear_is_priced_at_the_int8_roof():
    # fbgemm multiplies the quantized activations by the qint8 weight in int8 (VNNI): on the VM
    # 2x Linear(2048) at batch 64 ran at 444 GFLOP/s, 2.3x the float32 roof it was priced at.
    # 32 x 256 x 128 MACs = 2 * 1,048,576 FLOPs at the int8 column (4e11): 5.24288 us
    model = _quantized(nn.Sequential(nn.Linear(256, 128)).eval())
    result = flopcount.predict(model, torch.randn(32, 256), on=COMPUTE)
    row = result.by_operator()["quantized::linear_dynamic"]
    assert row.flops == 2 * 32 * 256 * 128
    assert row.compute_s == pytest.approx(2 * 32 * 256 * 128 / 4e11)
    assert result.any_bound is not None and result.any_bound.compute_s == pytest.approx(2 * 32 * 256 * 128 / 4e11)
    # an fp16 dynamic Linear computes in float32 (fbgemm widens the weight): the float32 column
    half = _quantized(nn.Sequential(nn.Linear(256, 128)).eval(), torch.float16)
    row = flopcount.predict(half, torch.randn(32, 256), on=COMPUTE).by_operator()["quantized::linear_dynamic_fp16"]
    assert row.compute_s == pytest.approx(2 * 32 * 256 * 128 / 1e11)


def test_a_cpu_has_an_int8_ceiling_and_roof():
    # int8: four byte products per float32 lane per instruction (pmaddubsw, VNNI): 4x float32's
    facts = cpu_facts(cpuinfo="model name\t: Fake\ncpu MHz\t\t: 2600.000\nflags\t\t: avx2 fma avx512f avx512_vnni\n",
                      cpufreq="5000000", cache_root="/nonexistent")
    assert facts.isa_peak(threads=1)["int8"] == 4 * (2 * 16 * 2 * 5e9)
    amx = cpu_facts(cpuinfo="model name\t: Fake\nflags\t\t: avx512f amx_int8\n", cpufreq="2000000", cache_root="/nonexistent")
    assert amx.isa_peak(threads=1)["int8"] == 2048 * 2e9
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("no fbgemm in this build")
    from flopcount.devices.measured import measure_roofs

    roofs = measure_roofs("cpu", dtypes=("int8",), budget_s=0.05, levels=False)
    assert roofs.peak_flops["int8"] > 0 and "quantized dynamic" in roofs.details["compute_int8"]


class _Attention(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


@pytest.mark.parametrize("lq, lk", [(128, 128), (32, 128), (128, 32)])
def test_a_causal_attention_is_priced_for_its_triangle(lq, lk):
    # The fused kernels skip the key blocks past the diagonal: of Lq x Lk scores per head only
    # m(m+1)/2 (m = min(Lq, Lk)) need computing. 2 heads, E = Ev = 16: 2 x scores x 32 MACs.
    q, k, v = torch.randn(1, 2, lq, 16), torch.randn(1, 2, lk, 16), torch.randn(1, 2, lk, 16)
    m = min(lq, lk)
    full = 2 * (2 * lq * lk * 32)  # what count_flops books (torch's flop_counter convention)
    causal = flopcount.predict(_Attention(True), (q, k, v), on=COMPUTE)
    assert causal.by_operator()["aten::scaled_dot_product_attention"].flops == full
    assert causal.compute_s == pytest.approx(2 * (2 * m * (m + 1) // 2 * 32) / 1e11)
    assert causal.any_bound is not None and causal.any_bound.compute_s == pytest.approx(causal.compute_s)
    plain = flopcount.predict(_Attention(False), (q, k, v), on=COMPUTE)
    assert plain.compute_s == pytest.approx(full / 1e11)


def test_a_causal_attention_backward_is_priced_for_its_triangle():
    # the CPU flash backward: 3E + 2Ev MACs per needed score (recomputed QK^T, dP, dV, dQ, dK)
    q, k, v = (torch.randn(1, 2, 64, 16, requires_grad=True) for _ in range(3))
    result = flopcount.predict(_Attention(True), (q, k, v), on=COMPUTE, backward=True)
    backward = [r for r in result.rows if r.phase == "backward" and "attention" in r.name]
    assert len(backward) == 1 and backward[0].flops == 2 * 2 * 64 * 64 * 80
    assert backward[0].compute_s == pytest.approx(2 * 2 * (64 * 65 // 2) * 80 / 1e11)


def test_profile_prices_a_causal_attention_for_its_triangle():
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    result = flopcount.profile(_Attention(True), (q, k, v), roofs=COMPUTE, warmup=1, steps=1, keep_trace=False)
    row = result.by_operator()["aten::scaled_dot_product_attention"]
    assert row.flops == 2 * 2 * 128 * 128 * 32
    assert row.attainable_s == pytest.approx(2 * 2 * (128 * 129 // 2) * 32 / 1e11)


class _CacheUpdate(nn.Module):
    """A 2 MiB static cache buffer written at one position (index_copy_), as a decode step does."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(16, 512, 64))

    def forward(self, pos: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return self.cache.index_copy_(1, pos, new)


def test_a_buffer_written_in_place_is_not_read_by_any_implementation():
    # The bound counted the whole buffer as read once: 64 MiB over DRAM was 0.47 ms against a
    # 12 us index_copy_ on the VM (39x). What must move: the position (8 B) and the new rows
    # (16 x 64 float32 = 4,096 B) read; the elements written are the output's, left out.
    model = _CacheUpdate()
    before = model.cache.clone()
    result = flopcount.predict(model, (torch.tensor([7]), torch.randn(16, 1, 64)), on=MEMORY)
    assert result.any_bound is not None and result.any_bound.unavoidable_bytes == 8 + 16 * 64 * 4
    assert result.bound_s("eager") < 16 * 512 * 64 * 4 / 1e10 / 100
    assert torch.equal(model.cache, before)  # left as found


class _UnusedHead(nn.Module):
    """A used Linear(8, 8) beside a Linear(1024, 1024) head this forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(1024, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.mark.parametrize("backward", [False, True])
def test_parameters_of_a_module_never_called_are_not_unavoidable(backward):
    # the 4 MiB head is never read (nor its gradient written); the body's 8 x 8 + 8 weights are,
    # with backward their gradients too, and the 2 x 8 input
    x = torch.randn(2, 8)
    result = flopcount.predict(_UnusedHead(), x, on=MEMORY, backward=backward)
    body = (8 * 8 + 8) * 4
    assert result.any_bound is not None
    assert result.any_bound.unavoidable_bytes == body * (2 if backward else 1) + 2 * 8 * 4


def test_a_buffer_read_whole_is_still_priced_per_op():
    # a buffer the forward reads (a fixed scale) costs its bytes in the eager bound, per op
    model = nn.Module()
    model.register_buffer("scale", torch.ones(1024, 1024))
    model.forward = lambda x: x * model.scale  # type: ignore[method-assign]
    roofs = Roofs({"float32": 1e15}, 1e10, "toy", levels=(MemoryLevel("L1", 1e3, 1e12),))
    result = flopcount.predict(model, torch.randn(1024, 1024), on=roofs)
    # mul reads x and the buffer, writes the product: 3 x 4 MiB, less the 1 kB L1 holds
    assert result.latency_s == pytest.approx((3 * 1024 * 1024 * 4 - 1e3) / 1e10)


class _Positions(nn.Module):
    """A learned 4096 x 64 positional table (1 MiB) of which a forward reads its first rows."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(4096, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pos[: x.shape[-2]]


def test_a_parameter_only_sliced_is_not_read_whole():
    # A 32 MiB table read up to 16 rows was bounded by reading all of it (0.151 ms against a
    # 7 us run on the VM, 22x). Any implementation reads the input (16 x 64 float32) and the 16
    # rows; the rows are priced per op (the add reads them), the any bound counts the input alone.
    x = torch.randn(1, 16, 64)
    result = flopcount.predict(_Positions(), x, on=MEMORY)
    assert result.any_bound is not None and result.any_bound.unavoidable_bytes == 16 * 64 * 4
    # the add reads x and the 16 rows, writes the sum: 3 x 4,096 B at 10 GB/s
    assert result.latency_s == pytest.approx(3 * 16 * 64 * 4 / 1e10)
