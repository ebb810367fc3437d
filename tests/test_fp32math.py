"""Branch fp32math: float32 work that runs on tensor cores whatever torch's matmul flag says.

* cuDNN runs float32 RNN layers (``_cudnn_rnn``: nn.LSTM, nn.GRU, nn.RNN) with the math type
  from ``torch.backends.cudnn.allow_tf32`` (default True), as it runs convolutions
  (aten/src/ATen/native/cudnn/RNN.cpp, ``allowTF32CuDNN``): the "conv" family, TF32 by default.
  The cells (``lstm_cell``...) are ``linear`` plus elementwise ops: cuBLAS, the matmul flag.
* SDPA in float32 on Ampere and later runs the memory-efficient kernel where its constraints
  hold, whose GEMMs are 3xTF32 tensor-core products whatever ``allow_tf32`` says
  (mem_eff_attention/gemm_kernel_utils.h: ``DefaultGemmType<ArchTag, float>`` for sm80+ is
  ``OpClassTensorOp`` with ``OpMultiplyAddFastF32``); the math path is bmm under the matmul
  flag. Attention's float32 column is the faster of the two, so the bound stays a lower bound
  whichever backend the GPU picks: a third of the TF32 peak under torch's defaults.

On the parent both were priced at the FP32 (CUDA-core) peak under the default flags: a bound up
to 7.4x (LSTM) or 2.5x (SDPA) above what the GPU can do. Figures from the source, not measured
(no GPU here). Each test below failed on the parent but the cells' (a guard: they were right).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flopcount.devices import named_roofs
from flopcount.devices.roofline import float32_math_text, op_time
from flopcount.profiling.predict import predict

# datasheet dense peaks (NVIDIA H100 SXM / H200 SXM: the same Hopper compute): FP32 (CUDA
# cores) 67 TFLOP/s, TF32 tensor cores 494.5 TFLOP/s; 3xTF32 = three TF32 products per float32
# product; HBM3 3.35 TB/s (H100 SXM) and HBM3e 4.8 TB/s (H200); L2 50 MB, bandwidth unpublished
FP32 = 67e12
TF32 = 494.5e12
TF32X3 = TF32 / 3
HBM = {"h100": 3.35e12, "h200": 4.8e12}
L2_BYTES = 50e6  # datasheet MB: 10^6 bytes
# T4: FP32 8.1 TFLOP/s, no TF32; L4: FP32 30.3, TF32 60 (a third of it, 20, is below FP32)
T4_FP32 = 8.1e12
L4_FP32 = 30.3e12
L4_TF32 = 60e12

STEPS, BATCH, INPUT, HIDDEN = 10, 4, 64, 128
# LSTM gate arithmetic per position and hidden unit (handlers/rnn.py): 4 adds + 3 sigmoid +
# 2 tanh + 4 mul/add = 22 FLOPs
LSTM_GATE_FLOPS = 22


def _lstm_flops() -> int:
    """One layer over STEPS x BATCH positions: 2 FLOPs per MAC of the input and hidden
    projections of the 4 gates (4H x I and 4H x H weights; bias adds not counted) plus the
    gate arithmetic."""
    positions = STEPS * BATCH
    macs = positions * (4 * HIDDEN * INPUT + 4 * HIDDEN * HIDDEN)
    return 2 * macs + positions * HIDDEN * LSTM_GATE_FLOPS


SDPA_B, SDPA_H, SDPA_L, SDPA_D = 2, 4, 128, 64


def _sdpa_flops() -> int:
    """Q K^T and P V: 2 x (B H Lq Lk D) MACs, 2 FLOPs each (softmax not counted by the op)."""
    return 2 * 2 * SDPA_B * SDPA_H * SDPA_L * SDPA_L * SDPA_D


class _Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


def _sdpa_inputs():
    q = torch.randn(SDPA_B, SDPA_H, SDPA_L, SDPA_D)
    return q, torch.randn_like(q), torch.randn_like(q)


@pytest.mark.parametrize("part", ["h100", "h200"])
@pytest.mark.parametrize("modes, peak", [
    ({}, TF32),  # torch's defaults: cudnn.allow_tf32 True
    ({"conv_tf32": False}, FP32),  # the cuDNN flag off: FP32 (CUDA cores)
    ({"conv_tf32": False, "matmul_tf32": True}, FP32),  # the matmul flag does not govern cuDNN's RNNs
])
def test_an_fp32_lstm_is_priced_under_cudnns_flag(part, modes, peak):
    """The working set (0.4 MB of weights, inputs and states) sits in the 50 MB L2, whose
    bandwidth is unpublished: no memory term, so both bounds are FLOPs / peak. The parent
    priced the layer at FP32 under the defaults: 119 ns instead of 16.1 ns on an H100."""
    model = nn.LSTM(INPUT, HIDDEN)
    x = torch.randn(STEPS, BATCH, INPUT)
    result = predict(model, x, on=named_roofs(part, **modes))
    expected = _lstm_flops() / peak
    assert result.column_sum("flops") == _lstm_flops()
    assert result.bound_s("any") == pytest.approx(expected, rel=1e-12)
    assert result.bound_s("eager") == pytest.approx(expected, rel=1e-12)
    assert result.float32_math() == {"conv": "tfloat32" if peak == TF32 else "float32"}


@pytest.mark.parametrize("part", ["h100", "h200"])
@pytest.mark.parametrize("modes, peak, column", [
    ({}, TF32X3, "tfloat32x3"),  # the defaults: the efficient kernel's 3xTF32 beats bmm at FP32
    ({"conv_tf32": False}, TF32X3, "tfloat32x3"),  # the cuDNN flag: no say (cuDNN attention takes no float32)
    ({"matmul_tf32": True}, TF32, "tfloat32"),  # the math path's bmm at TF32 is faster still
])
def test_an_fp32_sdpa_call_is_priced_at_the_fastest_backends_ceiling(part, modes, peak, column):
    """q, k, v and the output, 1 MB, sit in the L2: no memory term. The parent priced the call
    at FP32 under the defaults: 501 ns instead of 204 ns."""
    result = predict(_Attention(), _sdpa_inputs(), on=named_roofs(part, **modes))
    expected = _sdpa_flops() / peak
    assert result.column_sum("flops") == _sdpa_flops()
    assert result.bound_s("any") == pytest.approx(expected, rel=1e-12)
    assert result.bound_s("eager") == pytest.approx(expected, rel=1e-12)
    assert result.float32_math() == {"attention": column}


@pytest.mark.parametrize("part", ["h100", "h200"])
@pytest.mark.parametrize("op", ["aten::_efficient_attention_forward", "aten::_efficient_attention_backward",
                                "aten::_scaled_dot_product_efficient_attention_backward",
                                "aten::_scaled_dot_product_flash_attention_for_cpu"])
def test_a_memory_bound_efficient_attention_call_keeps_its_memory_term(part, op):
    """200 MB moved, over the L2's 50 MB: the bytes the L2 cannot hold over HBM's bandwidth
    (Roofs.level_time); 1 GFLOP at 3xTF32 is below that."""
    moved = 200e6
    timed = op_time(named_roofs(part), 1e9, moved, "float32", op)
    assert timed.column == "tfloat32x3"
    assert timed.compute_s == pytest.approx(1e9 / TF32X3, rel=1e-12)
    assert timed.memory_s == pytest.approx((moved - L2_BYTES) / HBM[part], rel=1e-12)
    assert timed.seconds == timed.memory_s


def test_parts_without_a_faster_tensor_core_path_keep_their_float32_peak():
    """A T4 has no TF32 (no tensor cores for float32): LSTM and SDPA at FP32 as before. On an
    L4 a third of TF32 (20 TFLOP/s) is below FP32 (30.3): attention stays at FP32, the RNN
    takes TF32 (60) under cuDNN's default."""
    assert named_roofs("t4").peak("float32", "aten::lstm") == T4_FP32
    assert named_roofs("t4").peak("float32", "aten::scaled_dot_product_attention") == T4_FP32
    assert named_roofs("l4").peak("float32", "aten::scaled_dot_product_attention") == L4_FP32
    assert named_roofs("l4").peak("float32", "aten::lstm") == L4_TF32
    assert named_roofs("t4").float32_math(["aten::lstm", "aten::scaled_dot_product_attention"]) == {}


def test_the_rnn_cells_stay_matmuls():
    """``lstm_cell`` is ``linear`` plus elementwise ops (cuBLAS): the matmul flag's family."""
    assert named_roofs("h100").peak("float32", "aten::lstm_cell") == FP32
    assert op_time(named_roofs("h100", matmul_tf32=True), 1e9, 0.0, "float32", "aten::gru_cell").compute_s == \
        pytest.approx(1e9 / TF32, rel=1e-12)


def test_the_math_sentence_says_rnn_layers_and_attention():
    """The sentence names what the bound assumed; on the parent an LSTM's said "float32
    matmuls in FP32" (it was priced as a matmul) and attention had no name."""
    roofs = named_roofs("h100")
    ops = ["aten::addmm", "aten::scaled_dot_product_attention", "aten::lstm"]
    text = float32_math_text(roofs.float32_math(ops))
    assert text == "float32 matmuls in FP32, attention in 3xTF32, convolutions and RNN layers in TF32"


def test_a_profiled_float32_attention_rate_raises_the_tf32_roof_three_times_it() -> None:
    """profile raises a roof below a rate an op reached. Float32 attention is priced at a third of
    the TF32 peak (3xTF32), a column no table holds: an attention op measured at r FLOP/s ran the
    TF32 units at 3r, so the TF32 roof is raised to 3r where it is below (before, the rate was
    booked under "tfloat32x3", which no roof holds, and dropped). An mm's rate stays its own."""
    from types import SimpleNamespace

    from flopcount.devices import Roofs
    from flopcount.devices.measured import raise_to_achieved
    from flopcount.profiling.run import _achieved

    roofs = Roofs({"float32": 50e12, "tfloat32": 300e12}, 3e12, math={"conv": "tfloat32"})
    flops = 4e9

    def fact(op: str) -> SimpleNamespace:
        return SimpleNamespace(flops=flops, dtype="float32", event=SimpleNamespace(call=SimpleNamespace(op=op)))

    facts = [fact("aten::_scaled_dot_product_efficient_attention"), fact("aten::mm")]
    # per step (microseconds summed over 2 steps): the attention op 20 us (200 TFLOP/s, above
    # 300 / 3), the mm 100 us (40 TFLOP/s, below its 50)
    measured = SimpleNamespace(time={0: 2 * 20.0, 1: 2 * 100.0})
    achieved = _achieved(facts, measured, 2, roofs)  # type: ignore[arg-type]
    assert achieved == pytest.approx({"tfloat32": 3 * flops / 20e-6, "float32": flops / 100e-6}, rel=1e-12)
    raised = raise_to_achieved(roofs, achieved)
    assert raised.peak_flops == pytest.approx({"float32": 50e12, "tfloat32": 600e12}, rel=1e-12)
    assert raised.column_rate("tfloat32x3") == pytest.approx(200e12, rel=1e-12)  # the attention op's own rate: now a ceiling it meets
