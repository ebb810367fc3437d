"""Branch tf32rule: the matmul math mode (``named_roofs(part, matmul_tf32=True)``, ``--matmul-tf32``)
prices the float32 work of matrix products only. ``torch.backends.cuda.matmul.allow_tf32`` lets
cuBLAS products (mm, bmm, addmm, baddbmm, linear, matmul...) and attention's contractions use
TF32 tensor cores; elementwise ops, norms, softmax and reductions never run on them. On the
parent every float32 op but a convolution was priced at the TF32 peak."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount.devices import named_roofs
from flopcount.devices.roofline import op_time
from flopcount.profiling.predict import predict

# H100 SXM datasheet, dense: FP32 67 TFLOP/s, TF32 494.5 TFLOP/s
FP32 = 67e12
TF32 = 494.5e12


@pytest.mark.parametrize("op", ["aten::relu", "aten::gelu", "aten::add", "aten::_softmax", "aten::native_layer_norm",
                                "aten::mean", "aten::mul_"])
def test_elementwise_float32_stays_at_the_float32_peak_under_the_matmul_mode(op):
    roofs = named_roofs("h100", matmul_tf32=True)
    timed = op_time(roofs, 1e9, 0.0, "float32", op)
    assert timed.column == "float32"
    assert timed.compute_s == pytest.approx(1e9 / FP32, rel=1e-12)


# attention left this list (branch fp32math): its float32 column is the fastest SDPA backend's
# (the efficient kernel's 3xTF32 under the default matmul mode), tests/test_fp32math.py
@pytest.mark.parametrize("op", ["aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::linear",
                                "aten::matmul", "aten::einsum", "aten::lstm_cell", "matmul"])
def test_matrix_products_take_the_matmul_mode(op):
    for matmul_tf32, peak in ((False, FP32), (True, TF32)):
        timed = op_time(named_roofs("h100", matmul_tf32=matmul_tf32), 1e9, 0.0, "float32", op)
        assert timed.compute_s == pytest.approx(1e9 / peak, rel=1e-12)


def test_convolutions_keep_their_own_mode():
    for conv_tf32, peak in ((True, TF32), (False, FP32)):
        timed = op_time(named_roofs("h100", conv_tf32=conv_tf32, matmul_tf32=True), 1e9, 0.0, "float32", "aten::convolution")
        assert timed.compute_s == pytest.approx(1e9 / peak, rel=1e-12)


def _wide_gelu_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 8192), nn.GELU(), nn.Linear(8192, 64))


def test_a_wide_gelu_mlp_prices_its_gelu_at_fp32_under_the_matmul_mode():
    """Batch 4: the two linears' FLOPs (FlopCounterMode, live) at TF32, the GELU's 5 FLOPs per
    element (0.5*x*(1 + erf(x/sqrt(2)))) at FP32. 4 MB of weights sit in the 50 MB L2, whose
    bandwidth is unpublished: no memory term, the bound is the compute sum. The parent priced
    the GELU at TF32 too: 17.29 ns instead of 19.41 ns."""
    model = _wide_gelu_mlp()
    x = torch.randn(4, 64)
    with FlopCounterMode(display=False) as counter:
        model(x)
    matmul_flops = counter.get_total_flops()
    gelu_flops = 5 * 4 * 8192
    result = predict(model, x, on=named_roofs("h100", matmul_tf32=True))
    assert result.any_s == pytest.approx(matmul_flops / TF32 + gelu_flops / FP32, rel=1e-9)
    assert result.float32_math() == {"matmul": "tfloat32"}
    default = predict(model, x, on="h100")
    assert default.any_s == pytest.approx((matmul_flops + gelu_flops) / FP32, rel=1e-9)
