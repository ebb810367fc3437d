"""``backward=True`` differentiates every leaf a real ``loss.backward()`` reaches, also a leaf
the forward made: a physics-informed net or a WGAN-GP critic takes ``x.detach().requires_grad_()``
and the derivative of its output in the forward. The count took the gradients of the parameters
and inputs only, so the double backward's products for that leaf were missing (N x 2 x H MACs
here). Oracle: ``torch.utils.flop_counter.FlopCounterMode`` run live on the functional twin
with ``.backward()`` (its module hooks fail under ``autograd.grad``), and the forward by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same_state, snapshot
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops

N, D, H = 16, 2, 32


def _loss(x: torch.Tensor, layer_a, layer_b, layer_c) -> torch.Tensor:  # type: ignore[no-untyped-def]
    x = x.detach().requires_grad_(True)
    u = layer_c(torch.tanh(layer_b(torch.tanh(layer_a(x)))))
    (du,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    return (du**2).sum() + u.sum()


class Pinn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(D, H), nn.Linear(H, H), nn.Linear(H, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _loss(x, self.a, self.b, self.c)


def _oracle_flops(model: Pinn, x: torch.Tensor) -> int:
    weights = [p.detach().clone().requires_grad_() for p in model.parameters()]
    layers = [lambda v, w=w, b=b: F.linear(v, w, b) for w, b in zip(weights[::2], weights[1::2])]
    with FlopCounterMode(display=False) as counter:
        _loss(x, *layers).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_leaf_made_in_forward_gets_its_gradient(tracer: str) -> None:
    torch.manual_seed(0)
    model, x = Pinn(), torch.randn(N, D)
    before = snapshot(model)
    r = count_flops(model, x, tracer=tracer, backward=True)
    # forward: the three Linears, then autograd.grad back to x through them (same products)
    assert r.by_phase("macs")["forward"] == 2 * N * (D * H + H * H + H)
    assert 2 * r.macs == _oracle_flops(model, x)
    assert_same_state(model, before)
