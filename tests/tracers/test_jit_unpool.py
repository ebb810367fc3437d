"""MaxUnpool under the jit tracer (issue #9, the nn zoo's MaxUnpool1d/2d/3d rows).

torch's own output-size check fails while jit traces (it is given traced sizes); the jit
tracer hands ``F.max_unpool*d`` the default size as ints. The unpooled output feeds a
``mul`` whose FLOPs (1 per output element) show the output shape each tracer saw; the
size is torch's documented formula ``(in - 1) * stride - 2 * padding + kernel``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flopcount import TraceError, count_flops

TRACERS = ("jit", "dispatch", "auto")
B, C = 3, 4


class _PoolUnpool(nn.Module):
    def __init__(self, dims: int, kernel: int, stride: Optional[int], padding: int, output_size: Any = None):
        super().__init__()
        self.pool = getattr(nn, f"MaxPool{dims}d")(kernel, stride, padding, return_indices=True)
        self.unpool = getattr(nn, f"MaxUnpool{dims}d")(kernel, stride, padding)
        self.output_size = output_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled, indices = self.pool(x)
        return self.unpool(pooled, indices, self.output_size) * 2


def _out_numel(spatial: Sequence[int], kernel: int, stride: int, padding: int) -> int:
    size = 1
    for n in spatial:
        pooled = (n + 2 * padding - kernel) // stride + 1
        size *= (pooled - 1) * stride - 2 * padding + kernel
    return B * C * size


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize(
    "dims,spatial,kernel,stride,padding",
    [(1, (9,), 2, None, 0), (2, (9, 7), 3, 2, 1), (3, (5, 6, 4), 2, None, 0)],
)
def test_max_unpool_counted(tracer: str, dims: int, spatial: Sequence[int], kernel: int, stride: Optional[int], padding: int) -> None:
    x = torch.randn(B, *reversed(spatial), C).movedim(-1, 1).transpose(-1, 2)  # (B, C, *spatial), non-contiguous
    assert tuple(x.shape) == (B, C, *spatial)
    result = count_flops(_PoolUnpool(dims, kernel, stride, padding), (x,), tracer=tracer)
    step = kernel if stride is None else stride
    assert result.by_operator()["aten::mul"] == _out_numel(spatial, kernel, step, padding)
    assert result.unsupported_ops() == {}


@pytest.mark.parametrize("tracer", TRACERS)
def test_max_unpool_given_output_size(tracer: str) -> None:
    # pooling 9 -> 4, unpooled to 9 instead of the default 8
    x = torch.randn(B, C, 9, 9)
    model = _PoolUnpool(2, 2, None, 0, output_size=[9, 9])
    assert count_flops(model, (x,), tracer=tracer).by_operator()["aten::mul"] == B * C * 81


class _Functional(nn.Module):
    def __init__(self, output_size: Any = None):
        super().__init__()
        self.output_size = output_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled, indices = F.max_pool2d(x, 2, return_indices=True)
        return F.max_unpool2d(pooled, indices, 2, output_size=self.output_size) + 1


def test_functional_max_unpool_under_jit_is_one_clear_error() -> None:
    # outside an nn.MaxUnpool module jit keeps torch's fused paths, so it is not intercepted
    with pytest.raises(TraceError, match=r"^torch.jit cannot trace F.max_unpool\*d without output_size in the root module"):
        count_flops(_Functional(), (torch.randn(B, C, 6, 6),), tracer="jit")


@pytest.mark.parametrize("tracer", TRACERS)
def test_functional_max_unpool_counted(tracer: str) -> None:
    # auto and dispatch count it; jit too when output_size is given
    model = _Functional(None if tracer != "jit" else [6, 6])
    result = count_flops(model, (torch.randn(B, C, 6, 6),), tracer=tracer)
    assert result.by_operator()["aten::add"] == B * C * 36


def test_modes_and_hooks_left_as_found() -> None:
    from torch.nn.modules import module as module_impl
    from torch.overrides import _get_current_function_mode_stack

    hooks = (len(module_impl._global_forward_pre_hooks), len(module_impl._global_forward_hooks))

    class Failing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unpool = nn.MaxUnpool2d(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.unpool(x, x.long())  # float indices: refused inside the module

    with pytest.raises(TraceError):
        count_flops(Failing(), (torch.randn(B, C, 4, 4),), tracer="jit")
    assert _get_current_function_mode_stack() == []
    assert (len(module_impl._global_forward_pre_hooks), len(module_impl._global_forward_hooks)) == hooks
