"""Forward-mode AD inside a forward (``torch.func.jvp``, ``jacfwd``, ``forward_ad.make_dual``)
is counted with its tangent products.

A dual tensor's op computes its tangent inside the op (``mm``'s forward-AD formula runs
``mm(dx, W) + mm(x, dW)``, the weight's absent tangent materialised as zeros). The dispatch
tracer recorded ``F.linear`` whole from its TorchFunctionMode and muted those aten ops, so
a jvp of Linear-ReLU-Linear counted the primal only: a third of the work (a jacfwd over 64
inputs: 1/66). Oracles: the hand count, and ``torch.utils.flop_counter.FlopCounterMode``
run live on the same transform of the functional twin (its module hooks fail under
``torch.func``)."""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from conftest import assert_same_state, snapshot
from torch import nn
from torch.func import jacfwd, jvp
from torch.utils.flop_counter import FlopCounterMode

from flopcount import TraceError, count_flops

ROWS, IN, HIDDEN, OUT = 8, 64, 128, 32
PRIMAL = ROWS * (IN * HIDDEN + HIDDEN * OUT)  # 98,304 MACs: the two Linears on 8 rows


def _dual(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    with fwAD.dual_level():
        return fwAD.unpack_dual(f(fwAD.make_dual(x, t))).tangent


TRANSFORMS = {
    "jvp": lambda f, x, t: jvp(f, (x,), (t,))[1],
    "jacfwd": lambda f, x, t: jacfwd(f)(x[0]),  # the Jacobian at one row: 64 tangents
    "make_dual": _dual,
}
#: each Linear runs its primal product, the tangent's (dx W^T, over the tangents) and x 0^T
#: for the weight's zero tangent, which torch materialises: (2 + tangents) x the primal
BY_HAND = {"jvp": 3 * PRIMAL, "jacfwd": (2 + IN) * PRIMAL // ROWS, "make_dual": 3 * PRIMAL}


class Tangent(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.a, self.act, self.b = nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)
        self.how = how

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
        return TRANSFORMS[self.how](lambda v: self.b(self.act(self.a(v))), x, t)


def _oracle_macs(model: Tangent, x: torch.Tensor, t: torch.Tensor) -> int:
    wa, ba, wb, bb = (p.detach() for p in (model.a.weight, model.a.bias, model.b.weight, model.b.bias))
    with FlopCounterMode(display=False) as counter:
        TRANSFORMS[model.how](lambda v: F.linear(F.relu(F.linear(v, wa, ba)), wb, bb), x, t)
    return counter.get_total_flops() // 2


@pytest.mark.parametrize("how", sorted(TRANSFORMS))
def test_the_oracle_agrees_with_the_hand_count(how: str) -> None:
    model = Tangent(how)
    assert _oracle_macs(model, torch.randn(ROWS, IN), torch.randn(ROWS, IN)) == BY_HAND[how]


@pytest.mark.parametrize("how", sorted(TRANSFORMS))
@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_tangent_products_counted(tracer: str, how: str) -> None:
    torch.manual_seed(0)
    model = Tangent(how)
    x, t = torch.randn(ROWS, IN), torch.randn(ROWS, IN)
    before = snapshot(model)
    r = count_flops(model, (x, t), tracer=tracer)
    assert r.macs == _oracle_macs(model, x, t) == BY_HAND[how]
    assert r.complete
    assert_same_state(model, before)


@pytest.mark.parametrize("how", ["jvp", "jacfwd"])
def test_jit_records_torch_func_forward_ad_at_its_aten_ops(how: str) -> None:
    model = Tangent(how)
    x, t = torch.randn(ROWS, IN), torch.randn(ROWS, IN)
    assert count_flops(model, (x, t), tracer="jit").macs == _oracle_macs(model, x, t) == BY_HAND[how]


def test_jit_refuses_a_dual_tensor_it_would_count_as_its_primal() -> None:
    """torch.jit records a dual Linear as one aten::linear (98,304 MACs of 294,912): it says so."""
    model = Tangent("make_dual")
    before = snapshot(model)
    with pytest.raises(TraceError, match=r"forward-mode AD.*tracer='dispatch'"):
        count_flops(model, (torch.randn(ROWS, IN), torch.randn(ROWS, IN)), tracer="jit")
    assert_same_state(model, before)


def test_composites_keep_their_names_outside_forward_ad() -> None:
    """The check reads no tensor outside a dual level: a plain Linear is still one aten::linear."""
    r = count_flops(Tangent("jvp").a, torch.randn(ROWS, IN))
    assert r.by_operator("macs") == {"aten::linear": ROWS * IN * HIDDEN}


class Mixed(nn.Module):
    """A jvp through conv, batch norm, layer norm, GELU, Linear, softmax and a matmul: every
    tangent term runs as an op with a handler (``prims::add``/``prims::mul`` combine them)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.ln = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4).eval(), nn.LayerNorm(6)
        self.fc = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        def f(z: torch.Tensor) -> torch.Tensor:
            h = self.fc(F.gelu(self.ln(self.bn(self.conv(z)))))
            return torch.softmax(h, -1) @ h.transpose(-1, -2)

        return jvp(f, (x,), (t,))[1]


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_jvp_through_common_layers_is_complete(tracer: str) -> None:
    model = Mixed()
    x, t = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)
    with FlopCounterMode(display=False) as counter:  # no torch.func.grad here: its hooks work
        model(x, t)
    r = count_flops(model, (x, t), tracer=tracer)
    assert r.macs == counter.get_total_flops() // 2
    assert r.complete, r.incomplete_reasons()


class Linearized(nn.Module):
    """``torch.func.linearize`` then its jvp function: linearize runs ``f`` once, traces the jvp
    with ``make_fx`` (the primal again, and its tangent products), folds the graph's constant part
    (the primal a third time, and ``x 0^T`` for the weight's zero tangent) and the jvp function
    runs the rest (``dx W^T``): 7 x the primal's MACs. On fake copies the shape cache answered
    repeated calls without running them below it, so ``make_fx`` never saw them and burned their
    results into the graph as constants: the fold skipped them (main: 2,160 MACs of 2,520)."""

    def __init__(self, f: nn.Module, first: bool = False) -> None:
        super().__init__()
        self.f, self.first = f, first

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.first:
            self.f(x)  # a plain call first: every later call of these shapes is a cache hit
        _, jvp_fn = torch.func.linearize(self.f, x)
        return jvp_fn(t)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.a, self.b = nn.LayerNorm(8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(self.norm(x))))


def _live_macs(model: nn.Module, *args: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        model(*args)
    return counter.get_total_flops() // 2


@pytest.mark.filterwarnings("ignore::UserWarning")  # const_fold's get_attr warning, torch's own
@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_linearize_counts_every_run_of_the_primal(tracer: str) -> None:
    torch.manual_seed(0)
    model = Linearized(nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3)))
    x, t = torch.randn(4, 6), torch.randn(4, 6)
    before = snapshot(model)
    r = count_flops(model, (x, t), tracer=tracer)
    assert r.macs == _live_macs(model, x, t) == 7 * 4 * (6 * 10 + 10 * 3)  # 2,520 MACs
    assert_same_state(model, before)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("shape", [(4, 8), (2, 5, 8)])
@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_linearize_of_repeated_blocks_after_a_plain_call(tracer: str, shape: tuple) -> None:
    """Three equal blocks, called once plainly first: every op of the trace a cache hit (main:
    auto 4,608 MACs of 12,288 on 4 rows, 11,520 of 30,720 on 2 x 5)."""
    torch.manual_seed(0)
    model = Linearized(nn.Sequential(Block(), Block(), Block()), first=True)
    x, t = torch.randn(*shape), torch.randn(*shape)
    before = snapshot(model)
    r = count_flops(model, (x, t), tracer=tracer)
    rows = x.numel() // 8
    assert r.macs == _live_macs(model, x, t) == 3 * rows * 2 * 64 * (1 + 7)  # plain call + 7 x primal
    assert_same_state(model, before)


#: the jit count of a linearize forward, in a child process: torch.jit's tracer is left broken in a
#: process whose trace failed inside make_fx (main too: the next jit trace there asserts
#: "graph_ == value->owningGraph()" or the process dies of a bus error)
_JIT_LINEARIZE = """
import warnings
import torch
from torch import nn
from flopcount import TraceError, count_flops
warnings.simplefilter("ignore")
class Linearized(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))
    def forward(self, x, t):
        _, jvp_fn = torch.func.linearize(self.f, x)
        return jvp_fn(t)
torch.manual_seed(0)
model = Linearized()
before = {k: v.clone() for k, v in model.state_dict().items()}
try:
    count_flops(model, (torch.randn(4, 6), torch.randn(4, 6)), tracer="jit")
except TraceError as exc:
    print(exc)
assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
"""


@pytest.mark.filterwarnings("ignore::UserWarning")  # const_fold's get_attr warning, torch's own
def test_jit_refuses_linearize_as_it_refuses_a_dual_tensor(fresh_python: Any) -> None:
    """torch.jit fails on ``make_fx``'s proxies inside ``linearize`` (an ``empty_strided`` given a
    tensor for a size): refused as forward-mode AD, naming linearize and the tracers that count it
    (main: "fails inside a torch.func transform ... grad/jacrev/jacfwd or functional_call"), the
    model left as found. The dispatch tracer counts the same model as it runs (FlopCounterMode live)."""
    import sys

    run = fresh_python.run([sys.executable, "-c", _JIT_LINEARIZE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert re.match(r"the jit tracer cannot count this model: its forward uses forward-mode AD \(torch\.func\.linearize "
                    r"in the root module \(model\)\).*use tracer='dispatch' \(or 'auto'\)", run.stdout), run.stdout
    torch.manual_seed(0)
    model = Linearized(nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3)))
    x, t = torch.randn(4, 6), torch.randn(4, 6)
    assert count_flops(model, (x, t), tracer="dispatch").macs == _live_macs(model, x, t)
