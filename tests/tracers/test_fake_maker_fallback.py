"""The fast fake maker's fallbacks work: a count stays on fake tensors when torch's FakeTensor
constructor is not the one the fast route was written for.

Found on a lent H200 with torch 2.11 (below pyproject's floor, but the fallback exists for exactly
such a torch): its ``FakeTensor.__new__`` takes no ``requires_grad``/``_is_param``, so the maker's
first fake raised, and the general route it fell back to (``FakeTensorMode.from_tensor``) ran below
the dispatch, where torch refuses it ("you set no_dispatch() before calling into this function").
Every count then fell back to one real run, with a warning: on the GPU, GPU memory and time.

Oracle: the hand formula of the model's MACs, and the count's own promise (counted on fakes: no
real-run note among its warnings)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from flopcount import count_flops
from flopcount.tracers.fake import copies, making

B, C, K, HW, OUT = 2, 3, 8, 6, 5
# a 3x3 convolution without padding (K x C x 9 MACs per output element, 4 x 4 outputs) and a
# linear layer on the flattened (K x 4 x 4) map
MACS = B * K * (HW - 2) ** 2 * C * 9 + B * (K * (HW - 2) ** 2) * OUT


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(C, K, 3), nn.ReLU(), nn.Flatten(), nn.Linear(K * (HW - 2) ** 2, OUT))


@pytest.fixture
def fresh_makers(monkeypatch: Any) -> None:
    """No mode and maker handed on by an earlier count: each count makes (and checks) its own."""
    monkeypatch.setattr(copies, "_IDLE", [])


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_an_older_fake_constructor_still_counts_on_fakes(monkeypatch: Any, fresh_makers: None, train: bool) -> None:
    from torch._subclasses.fake_tensor import FakeTensor

    original = FakeTensor.__new__

    def older(cls: type, *args: Any, **kwargs: Any) -> Any:  # torch 2.11's keywords
        if "requires_grad" in kwargs or "_is_param" in kwargs:
            raise TypeError("FakeTensor.__new__() got an unexpected keyword argument 'requires_grad'")
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(FakeTensor, "__new__", staticmethod(older))
    model = _model().train(train)
    result = count_flops(model, torch.randn(B, C, HW, HW), backward=train)
    assert result.warnings == ()  # before: "tracer auto: counted one real run (dispatch) because ..."
    assert result.macs == (3 * MACS if train else MACS) - (B * C * (HW - 2) ** 2 * K * 9 if train else 0)


def test_a_fast_route_that_fails_falls_back_to_torchs_own(monkeypatch: Any, fresh_makers: None) -> None:
    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a private constructor that changed")

    monkeypatch.setattr(making.FakeMaker, "make", broken)
    result = count_flops(_model(), torch.randn(B, C, HW, HW))
    assert result.warnings == ()
    assert result.macs == MACS
