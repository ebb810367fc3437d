"""One "is floating" predicate on tracers' dtype names (issue #27's review: predict and its byte
model had two, matching substrings): core.traffic.is_floating / is_complex answer as torch's own
``dtype.is_floating_point`` / ``dtype.is_complex``, and predict(dtype=) recasts exactly the real
floating tensors."""

from __future__ import annotations

from typing import Any, Tuple

import pytest
import torch
from torch import nn

import flopcount
from flopcount.core.traffic import is_complex, is_floating
from flopcount.devices import Roofs

_DTYPES = sorted({value for value in vars(torch).values() if isinstance(value, torch.dtype)}, key=str)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_the_predicate_is_torchs(dtype: torch.dtype) -> None:
    name = str(dtype).replace("torch.", "")  # the tracers' spelling
    assert is_floating(name) == dtype.is_floating_point
    assert is_complex(name) == dtype.is_complex


def test_names_that_are_no_torch_dtype_are_neither() -> None:
    # jit spells ComplexHalf "complexhalf" (no torch dtype of that name); "tfloat32" is a peak column
    for name in (None, "", "complexhalf", "tfloat32", "half precision"):
        assert not is_floating(name) and not is_complex(name)


class _Mixed(nn.Module):
    def forward(self, x: torch.Tensor, idx: torch.Tensor, z: torch.Tensor) -> Tuple[Any, ...]:
        return x * 2, idx + 1, torch.exp(z)


def test_predict_dtype_recasts_real_floating_tensors_only() -> None:
    batch, width = 2, 8
    x = torch.randn(batch, width)
    idx = torch.arange(batch * width).reshape(batch, width)
    z = torch.randn(batch, width, dtype=torch.complex64)
    roofs = Roofs(peak_flops={"float32": 1e12, "bfloat16": 4e12}, bandwidth=1e11, device="flat", source="given")
    rows = flopcount.predict(_Mixed(), (x, idx, z), on=roofs, dtype="bfloat16").by_operator()
    n = batch * width
    # x * 2: a float32 tensor priced as bfloat16 (2 bytes), read once and written once; the 2 is a number
    assert (rows["aten::mul"].bytes_read, rows["aten::mul"].bytes_written, rows["aten::mul"].dtype) == (2 * n, 2 * n, "bfloat16")
    # idx + 1: int64 stays 8 bytes an element
    assert (rows["aten::add"].bytes_read, rows["aten::add"].bytes_written, rows["aten::add"].dtype) == (8 * n, 8 * n, "int64")
    # exp(z): complex64 stays 8 bytes an element and computes in complex64
    assert (rows["aten::exp"].bytes_read, rows["aten::exp"].bytes_written, rows["aten::exp"].dtype) == (8 * n, 8 * n, "complex64")
    # the multiply's n FLOPs at the bfloat16 peak
    assert rows["aten::mul"].compute_s == pytest.approx(n / 4e12)
