"""``torch.linalg.lstsq`` priced by its ``driver``: ``gelsd`` and ``gelss`` solve through the SVD
(LAPACK: bidiagonalise A, the singular values and V, U^H applied to B, x = V diag(1/s) U^H B),
``gels`` and ``gelsy`` (torch's CPU default) through QR. Every driver dispatches as the one
``aten::linalg_lstsq`` with a ``driver`` argument, under every tracer; the SVD drivers were priced
with the QR formula (722 FLOPs for an 8 x 5 system with 3 right-hand sides, 2,295 by the SVD).
Oracle: the hand counts of docs/conventions.md, derived here term by term (FlopCounterMode has
no formula for lstsq: it counts 0)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import count_flops

TRACERS = ["auto", "dispatch", "jit"]


class Lstsq(nn.Module):
    def __init__(self, driver: object) -> None:
        super().__init__()
        self.driver = driver

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.linalg.lstsq(a, b, driver=self.driver).solution


def _svd_hand(m: int, n: int, r: int) -> int:
    """Golub-Reinsch least squares (G&VL 5.5, Sigma and V: 4 M k^2 + 8 k^3), U^H B by k reflectors
    (4 M k r - 2 k^2 r), V diag(1/s) (k r divides, 2 k^2 r)."""
    big, k = max(m, n), min(m, n)
    return 4 * big * k * k + 8 * k**3 + 4 * big * k * r - 2 * k * k * r + k * r + 2 * k * k * r


def _qr_hand(m: int, n: int, r: int) -> int:
    """geqrf (2 m n^2 - 2 n^3 / 3, m >= n) + ormqr (4 m r k - 2 r k^2) + trsm (k^2 r)."""
    k = min(m, n)
    return round(2 * m * n * n - 2 * n**3 / 3 + 4 * m * r * k - 2 * r * k * k + k * k * r)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("driver", ["gelsd", "gelss"])
def test_svd_drivers_priced_by_the_svd(driver: str, tracer: str) -> None:
    a, b = torch.randn(8, 5, dtype=torch.float64), torch.randn(8, 3, dtype=torch.float64)
    assert _svd_hand(8, 5, 3) == 800 + 1000 + 480 - 150 + 15 + 150  # 2,295
    assert count_flops(Lstsq(driver), (a, b), tracer=tracer).flops == _svd_hand(8, 5, 3)


@pytest.mark.parametrize("tracer", TRACERS)
def test_svd_driver_wide_and_batched(tracer: str) -> None:
    # minimum-norm solution of an under-determined system (m < n): the roles of m and n swap
    a, b = torch.randn(2, 4, 7, dtype=torch.float64), torch.randn(2, 4, 2, dtype=torch.float64)
    assert count_flops(Lstsq("gelsd"), (a, b), tracer=tracer).flops == 2 * _svd_hand(4, 7, 2)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("driver", [None, "gels", "gelsy"])
def test_qr_drivers_keep_the_qr_formula(driver: object, tracer: str) -> None:
    a, b = torch.randn(8, 5), torch.randn(8, 3)
    assert count_flops(Lstsq(driver), (a, b), tracer=tracer).flops == _qr_hand(8, 5, 3)  # 722
