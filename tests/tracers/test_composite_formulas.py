"""Composites jit records as one op and the dispatcher runs as others agree (issue #9, finding 5).

``SELU`` reaches the dispatcher as ``elu`` with a scale, ``Dropout1d``/``2d``/``3d`` and the
alpha dropouts as a per-channel mask (``div_``/``mul_``/``add_``) and a ``mul`` by the input.
Each count here is checked against the formula written out by hand below and, for the
dropouts, against the elementwise ops a bare ``TorchDispatchMode`` sees the CPU
decomposition run (1 FLOP per output element of each arithmetic op) -- under every tracer,
at batch > 1, on non-contiguous inputs, in train and eval mode.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from flopcount import count_flops

TRACERS = ("jit", "dispatch", "auto")


def non_contiguous(*shape: int) -> torch.Tensor:
    """A tensor of ``shape`` laid out in reverse dimension order (no dim is contiguous)."""
    return torch.randn(*reversed(shape)).permute(*reversed(range(len(shape))))


def _count(model: nn.Module, x: torch.Tensor, tracer: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dropout2d's 3-D input warning
        return count_flops(model, (x,), tracer=tracer)


# -- SELU: scale * elu(x); elu = compare, exp, sub, multiply by alpha (4); the scale 1 more ------


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("inplace", [False, True])
def test_selu_five_per_element(tracer: str, train: bool, inplace: bool) -> None:
    x = non_contiguous(3, 4, 6).contiguous() if inplace else non_contiguous(3, 4, 6)
    result = _count(nn.SELU(inplace=inplace).train(train), x, tracer)
    assert result.flops == 5 * 3 * 4 * 6 and result.macs == 0
    assert result.unsupported_ops() == {}
    assert {op for op, flops in result.by_operator().items() if flops} == {"aten::selu_" if inplace else "aten::selu"}


@pytest.mark.parametrize("tracer", TRACERS)
def test_elu_counts_its_scales(tracer: str) -> None:
    # celu(x, a) = elu(x, a, scale=1, input_scale=1/a): 5; elu: 4; selu: 5
    x = non_contiguous(2, 3, 5)
    n = x.numel()
    model = nn.Sequential(nn.ELU(0.7), nn.CELU(0.5), nn.SELU())
    assert _count(model, x, tracer).flops == (4 + 5 + 5) * n


# -- dropouts: the mask has one element per (sample, channel) for the feature variants ---------


def _decomposition_flops(model: nn.Module, x: torch.Tensor) -> int:
    """1 FLOP per output element of each arithmetic aten op the CPU forward runs."""
    arithmetic = {"mul", "div", "add", "sub"}
    seen: List[int] = []

    class Elementwise(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func._schema.name.split("::")[1].rstrip("_") in arithmetic:
                seen.append(out.numel())
            return out

    with warnings.catch_warnings(), Elementwise(), torch.no_grad():
        warnings.simplefilter("ignore")
        model(x)
    return sum(seen)


# (module, input, hand formula in train mode for an input of ``shape`` with ``n`` elements)
DROPOUTS: Dict[str, Tuple[Callable[[], nn.Module], Callable[[], torch.Tensor], int]] = {
    # divide the (N, C, 1) mask by 1 - p, multiply: N*C + numel
    "dropout1d": (lambda: nn.Dropout1d(0.3), lambda: non_contiguous(3, 4, 6), 3 * 4 + 3 * 4 * 6),
    # unbatched: the mask has one element per channel
    "dropout1d_unbatched": (lambda: nn.Dropout1d(0.3), lambda: non_contiguous(4, 6), 4 + 4 * 6),
    "dropout2d": (lambda: nn.Dropout2d(0.3), lambda: non_contiguous(3, 4, 5, 5), 3 * 4 + 3 * 4 * 25),
    # a 3-D input to dropout2d is taken as (N, C, L)
    "dropout2d_3d": (lambda: nn.Dropout2d(0.3), lambda: non_contiguous(3, 4, 6), 3 * 4 + 3 * 4 * 6),
    "dropout3d": (lambda: nn.Dropout3d(0.3), lambda: non_contiguous(2, 4, 2, 3, 3), 2 * 4 + 2 * 4 * 18),
    "dropout3d_unbatched": (lambda: nn.Dropout3d(0.3), lambda: non_contiguous(4, 2, 3, 3), 4 + 4 * 18),
    # mask -> (mask - 1)*c + d and mask*a: 4 per mask element; input*mask + b: 2 per element
    "alpha_dropout": (lambda: nn.AlphaDropout(0.3), lambda: non_contiguous(3, 4, 6), 4 * 72 + 2 * 72),
    "feature_alpha_dropout": (
        lambda: nn.FeatureAlphaDropout(0.3),
        lambda: non_contiguous(3, 4, 5, 5),
        4 * 3 * 4 + 2 * 3 * 4 * 25,
    ),
    "dropout": (lambda: nn.Dropout(0.3), lambda: non_contiguous(3, 4, 6), 2 * 72),
}


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", sorted(DROPOUTS))
def test_dropouts_train(name: str, tracer: str) -> None:
    build, make, formula = DROPOUTS[name]
    model, x = build().train(), make()
    assert _decomposition_flops(model, x) == formula  # the formula is what eager PyTorch runs
    torch.manual_seed(0)
    result = _count(model, x, tracer)
    assert result.flops == formula and result.macs == 0
    assert result.unsupported_ops() == {}


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", sorted(DROPOUTS))
def test_dropouts_eval_are_free(name: str, tracer: str) -> None:
    build, make, _ = DROPOUTS[name]
    assert _count(build().eval(), make(), tracer).flops == 0
