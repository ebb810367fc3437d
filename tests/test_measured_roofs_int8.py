"""The CPU int8 roof (branch hwroofs): measured on aten's ``_int_mm`` as well as on fbgemm's dynamic
quantized linear. A model can call ``torch._int_mm`` directly, and it ran above fbgemm (843 against
646 GFLOP/s on the project's VM, under load 6.6; boundcheck saw 763 against a 759.5 roof), so a roof
measured on fbgemm alone was no ceiling. Read as the dispatcher key ``aten._int_mm`` (not a private
torch symbol by benchmarks/private_torch.py's rule, as the tracers' ``_local_scalar_dense``).

And the deprecation torch raises when the measurement makes the qint8 weight (quantized tensors are
deprecated, once per process from C++) is ignored by its message around that one call: the
measurement silenced every warning, any thread's, while it set up fbgemm's kernels."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from flopcount.devices import measured

SHAPES = ((64, 2048), (256, 2048), (1024, 1024))


def test_the_int8_roof_is_measured_on_int_mm_too():
    """A fake clock (each timed call takes 1 s) makes each kernel's rate its FLOPs: 2 x M x K x N."""
    ticks = iter(range(10**9))
    roofs = measured.measure_roofs("cpu", ["int8"], budget_s=1e-6, clock=lambda: float(next(ticks)), stream_bytes=4096,
                                   levels=False)
    said = roofs.details["compute_int8"]
    for rows, width in SHAPES:
        flops = 2 * rows * width * width
        assert f"{rows}x{width}x{width} _int_mm {flops / 1e9:.4g}" in said, said
    # the biggest product, 1024^3 in both libraries, tops the fake clock's rates: the roof is the best of all
    assert roofs.peak_flops["int8"] == pytest.approx(2 * 1024**3)


def test_an_int_mm_kernel_computes_the_product_it_is_priced_for():
    fn, flops = measured._int8_product(torch.device("cpu"), 64, 128)
    out = fn()
    assert out.dtype == torch.int32 and tuple(out.shape) == (64, 128) and flops == 2 * 64 * 128 * 128


def test_setting_up_the_int8_kernels_lets_other_warnings_through(monkeypatch):
    """Every operand the set-up draws warns here; each warning reaches the caller (the set-up ignored
    every warning while it made fbgemm's kernels)."""
    real = measured._operand
    calls = []

    def warning_operand(*args, **kwargs):
        calls.append(args)
        warnings.warn("another warning", UserWarning, stacklevel=2)
        return real(*args, **kwargs)

    monkeypatch.setattr(measured, "_operand", warning_operand)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernels = measured._int8_kernels(torch.device("cpu"))
    assert kernels and calls
    assert len([w for w in caught if str(w.message) == "another warning"]) == len(calls)


_DEPRECATION = "quantized tensor creation functions"
_RECORD = ("import warnings, torch\n"
           "from flopcount.devices import measured\n"
           "with warnings.catch_warnings(record=True) as caught:\n"
           "    warnings.simplefilter('always')\n"
           "    {call}\n"
           "print(sum('" + _DEPRECATION + "' in str(w.message) for w in caught))\n")


@pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines, reason="needs fbgemm")
def test_the_quantized_deprecation_alone_is_ignored(fresh_python):
    """In a process of its own (torch warns once per process): making a qint8 tensor warns, and the
    measurement's set-up, which makes three, does not pass that warning on."""
    plain = fresh_python.run([sys.executable, "-c", _RECORD.format(
        call="torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8)")], capture_output=True, text=True, check=True)
    assert plain.stdout.strip() == "1", plain.stderr  # the control: the message the filter names, raised here
    set_up = fresh_python.run([sys.executable, "-c", _RECORD.format(call="measured._int8_kernels(torch.device('cpu'))")],
                              capture_output=True, text=True, check=True)
    assert set_up.stdout.strip() == "0", set_up.stderr
