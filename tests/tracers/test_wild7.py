"""Real code the seventh silent-error sweep (branch wild7, ``benchmarks/silent_errors_wild7.py``)
found counted wrongly, refused, or counted another way than asked.

* A ``torch.jit.freeze``-d module (scripted, eval, its weights folded into constants) raised
  ``AttributeError: 'RecursiveScriptModule' object has no attribute 'training'`` under ``auto``
  and ``dispatch``: freezing drops ``training``, which the real run's state keeper read from
  every module.
* A frozen module's first two calls compile it: the compiler's constant pooling compares its
  constants with ``aten::equal``, which the real run recorded as the model's ops.
* A ``Parameter`` subclass (or a buffer of a tensor subclass) held by a module below the root of
  a lazy fake copy could not be copied: the copy is made below the dispatch, where
  ``FakeTensorMode.from_tensor`` asserts, so ``auto`` counted one real run instead.
* A torch Python function the caller rebound to a wrapper that calls it (``F.batch_norm =
  wrapped``): torch hands the call to a torch-function mode by the rebound name, so each of the
  count's modes ran the wrapper again (its extra work counted twice, under every tracer); bound
  before flopcount's tracers were imported, the wrapper was taken for torch's own and later calls
  of a key were answered from the first without running it.

Oracle: ``torch.utils.flop_counter.FlopCounterMode`` run live on the real forward (and backward)
(a dispatch mode: the wrapper runs once a call under it), hand counts, the wrapper's calls in eager."""

from __future__ import annotations

import json
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops
from flopcount.errors import TraceError


def _live_flops(model: nn.Module, args, backward: bool = False) -> int:
    with FlopCounterMode(display=False) as counter:
        out = model(*args)
        if backward:
            out.sum().backward()
    return counter.get_total_flops()


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


# ---- a torch.jit.freeze-d module
@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_frozen_module_is_counted_as_its_real_run(tracer):
    torch.manual_seed(0)
    frozen = torch.jit.freeze(torch.jit.script(_mlp()))
    x = torch.randn(3, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = count_flops(frozen, (x,), tracer=tracer)
    assert 2 * result.macs == _live_flops(frozen, (x,)) == 2 * 3 * (8 * 16 + 16 * 4)


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_frozen_modules_count_leaves_out_its_compilation(tracer):
    """A frozen module's first two calls compile it; the compiler compares its constants with
    aten::equal (constant pooling), which the count booked as the model's: 1,512, 2,316, then
    1,200 FLOPs. Hand: two addmm, 2 x 3 x (8 x 16 + 16 x 4), and the ReLU, 3 x 16, each time."""
    torch.manual_seed(0)
    frozen = torch.jit.freeze(torch.jit.script(_mlp()))
    x = torch.randn(3, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counts = [count_flops(frozen, (x,), tracer=tracer) for _ in range(3)]
    # "auto" reads the frozen program's graph (branch jitrows): its linear spelled as the eager model's
    linear = "aten::linear" if tracer == "auto" else "aten::addmm"
    hand = {linear: 2 * 3 * (8 * 16 + 16 * 4), "aten::relu": 3 * 16}
    assert [{op: v for op, v in c.by_operator("flops").items() if v} for c in counts] == [hand] * 3


class _FrozenInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = torch.jit.freeze(torch.jit.script(nn.Sequential(nn.Linear(8, 16), nn.ReLU()).eval()))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.frozen(x))


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_frozen_child_is_counted_and_the_model_left_as_found(tracer, backward):
    torch.manual_seed(0)
    model = _FrozenInside()
    x = torch.randn(3, 8, requires_grad=True)
    expected = _live_flops(model, (x,), backward)
    model.zero_grad(set_to_none=True)
    x.grad = None
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = count_flops(model, (x,), tracer=tracer, backward=backward)
    assert 2 * result.macs == expected
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert model.head.weight.grad is None and x.grad is None
    assert model.training and model.head.training


# ---- a Parameter subclass below the root of a lazy copy
class _Tagged(nn.Parameter):
    """A parameter carrying a tag (quantisation and sharding libraries subclass Parameter so)."""


class _Marked(torch.Tensor):
    pass


class _Inner(nn.Module):
    def __init__(self, weight: torch.Tensor, shift: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight
        self.register_buffer("shift", shift)

    def forward(self, x):
        return x @ self.weight.t() + self.shift


class _Outer(nn.Module):
    def __init__(self, weight: torch.Tensor, shift: torch.Tensor) -> None:
        super().__init__()
        self.inner = _Inner(weight, shift)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.inner(x))


HELD = [
    ("Parameter subclass", lambda: (_Tagged(torch.randn(16, 8)), torch.zeros(16))),
    ("buffer subclass", lambda: (nn.Parameter(torch.randn(16, 8)), torch.zeros(16).as_subclass(_Marked))),
]


@pytest.mark.parametrize("name,held", HELD, ids=[h[0] for h in HELD])
def test_a_subclass_held_below_the_root_is_copied_not_run(name, held):
    torch.manual_seed(0)
    model = _Outer(*held())
    x = torch.randn(3, 8)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = count_flops(model, (x,), tracer="auto")
    assert not [w for w in result.warnings if "real run" in w], result.warnings
    live = _live_flops(model, (x,))
    assert 2 * result.macs == live == 2 * 3 * (8 * 16 + 16 * 4)
    assert all(torch.equal(state[k], v) and type(v) is type(state[k]) for k, v in model.state_dict().items())
    assert type(model.inner.weight) is type(held()[0])


# ---- a torch function rebound to a wrapper that calls it
def _three_norms() -> nn.Module:
    layers = []
    for _ in range(3):
        layers += [nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)]
    return nn.Sequential(*layers).eval()


#: hand: three convolutions (2 x 4 x 4 x 9 x 36 MACs each) and, per batch norm, the wrapper's mixing
#: einsum (2 x 4 x 4 x 36); a (2, 4, 6, 6) input
_CONV_MACS = 3 * 2 * 4 * 4 * 9 * 36
_MIX_MACS = 3 * 2 * 4 * 4 * 36


def _mixing_wrapper(calls):
    original = F.batch_norm

    def batch_norm_and_mix(x, *args, **kwargs):  # the caller's wrapper: does more, then calls torch's
        calls.append(tuple(x.shape))
        return original(x, *args, **kwargs) + torch.einsum("nchw,cd->ndhw", x, torch.eye(x.shape[1]))

    return batch_norm_and_mix


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_a_rebound_function_runs_once_a_call_and_its_work_is_counted_once(monkeypatch, tracer):
    torch.manual_seed(0)
    calls: list = []
    monkeypatch.setattr(F, "batch_norm", _mixing_wrapper(calls))
    model, x = _three_norms(), torch.randn(2, 4, 6, 6)
    model(x)
    eager_calls, calls[:] = len(calls), []
    live = _live_flops(model, (x,))
    calls[:] = []
    result = count_flops(model, (x,), tracer=tracer)
    assert result.macs == _CONV_MACS + _MIX_MACS and 2 * result.macs == live
    assert result.by_operator("macs")["aten::einsum"] == _MIX_MACS
    assert len(calls) == eager_calls == 3


def test_a_rebound_function_runs_once_a_call_under_backward(monkeypatch):
    torch.manual_seed(0)
    calls: list = []
    original = F.layer_norm

    def fp32_layer_norm(x, *args, **kwargs):  # mixed-precision codebases upcast their norms so
        calls.append(1)
        return original(x.float(), *args, **kwargs).type_as(x) * 1.5

    monkeypatch.setattr(F, "layer_norm", fp32_layer_norm)
    model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 16), nn.LayerNorm(16))
    x = torch.randn(4, 16, requires_grad=True)
    live = _live_flops(model, (x,), backward=True)
    model.zero_grad(set_to_none=True)
    x.grad = None
    for tracer in ("auto", "dispatch"):
        calls[:] = []
        result = count_flops(model, (x,), tracer=tracer, backward=True)
        assert 2 * result.macs == live and len(calls) == 2
        # hand: the wrapper's scaling, 4 x 16 products a norm, and its gradient, as many
        # (the parent: 512 under auto, 768 under dispatch, whose stand-ins are one more mode)
        assert result.by_operator("flops")["aten::mul"] == 2 * 64 + 2 * 64


BOUND_FIRST = textwrap.dedent(
    """
    import json
    import torch
    import torch.nn.functional as F
    from torch import nn

    calls = {"n": 0}
    original = F.batch_norm

    def counted(*args, **kwargs):
        calls["n"] += 1
        print("call", flush=True)
        return original(*args, **kwargs)

    F.batch_norm = counted  # before flopcount's tracers are imported
    import flopcount

    layers = []
    for _ in range(3):
        layers += [nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)]
    model = nn.Sequential(*layers).eval()
    result = flopcount.count_flops(model, (torch.randn(2, 4, 6, 6),))
    print(json.dumps(result.macs))
    """
)


def test_a_function_rebound_before_import_is_run_as_written(fresh_python):
    """The wrapper printed a line a call (its own counter is the caller's state, which a count sets
    back): three batch norms, three calls, as eager makes them."""
    run = fresh_python.run([sys.executable, "-c", BOUND_FIRST], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    assert lines.count("call") == 3
    assert json.loads(lines[-1]) == _CONV_MACS


# ---- a composite under two transforms (hessian = jacfwd(jacrev(f))): jvp's tangent under jacrev's wrapper
def test_a_composite_under_a_hessian_is_counted_at_its_physical_ops():
    """The matmul inside ``hessian`` was booked once at the primal's shape (15 MACs) and its aten ops
    muted: jvp's wrapper sits under jacrev's, where forward_ad reads no tangent. Torch runs six mm (live
    under FlopCounterMode): the primal twice (1 x 5 x 3), its tangent over the 5 basis vectors
    (5 x 5 x 3), the backward's (1 x 3 x 5) twice and its tangent (5 x 3 x 5): 210 MACs."""
    weight = torch.ones(5, 3)

    def hessian_of(x):
        return torch.func.hessian(lambda z: torch.tanh(z @ weight).sum())(x)

    x = torch.randn(5)
    with FlopCounterMode(display=False) as counter:
        hessian_of(x)
    for tracer in ("auto", "dispatch"):
        result = count_flops(_Call(hessian_of), (x,), tracer=tracer)
        assert result.macs == 4 * 15 + 2 * 75 and 2 * result.macs == counter.get_total_flops()


class _PhysicalMacs(TorchDispatchMode):
    """The MACs of the mm / addmm / bmm torch runs, at the shapes a dispatch mode sees them (below
    functorch's wrappers: physical, batched)."""

    def __init__(self) -> None:
        super().__init__()
        self.macs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        a, b = [t for t in args if isinstance(t, torch.Tensor)][-2:] if name in ("mm", "addmm", "bmm") else (None, None)
        if name in ("mm", "addmm"):
            self.macs += a.shape[0] * a.shape[1] * b.shape[1]
        elif name == "bmm":
            self.macs += a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
        return func(*args, **(kwargs or {}))


class _HessianOfLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))

    def forward(self, x):
        return torch.func.hessian(lambda z: self.mlp(z).sum())(x)


def test_linear_layers_under_a_hessian_are_counted_at_their_physical_ops():
    """With parameters FlopCounterMode raises inside hessian ("A leaf node was passed to
    _will_engine_execute_node"): the oracle is the mm/addmm/bmm a dispatch mode sees run (1,230 MACs;
    the parent booked 600, each Linear at its primal shape)."""
    torch.manual_seed(0)
    model, x = _HessianOfLayers(), torch.randn(6)
    with _PhysicalMacs() as physical, torch.no_grad():
        model(x)
    for tracer in ("auto", "dispatch"):
        assert count_flops(model, (x,), tracer=tracer).macs == physical.macs == 1230


class _Call(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


# ---- what torch cannot run under a tracer is refused naming it
class _NestedLinear(nn.Module):
    def __init__(self, layout) -> None:
        super().__init__()
        self.layout = layout
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        nested = torch.nested.nested_tensor([x[0, :3], x[1, :5]], layout=self.layout)
        return self.proj(nested).to_padded_tensor(0.0)


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_a_nested_jagged_tensor_is_refused_as_one(tracer):
    """torch's own message named a backend kernel ('Could not run aten::_nested_get_values with
    arguments from the NestedTensorCPU backend', jit: 'Unsupported value kind'); FlopCounterMode
    fails on the same forward."""
    model, x = _NestedLinear(torch.jagged), torch.randn(2, 5, 8)
    with pytest.raises(Exception):
        with FlopCounterMode(display=False):
            model(x)
    with pytest.raises(TraceError, match=r"nested tensors \(torch\.nested.*to_padded_tensor"):
        count_flops(model, (x,), tracer=tracer)


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_strided_nested_tensor_is_refused_as_one(tracer):
    """torch said "Internal error: NestedTensorImpl doesn't support sizes. Please file an issue"."""
    with pytest.raises(TraceError, match=r"nested tensors \(torch\.nested"):
        count_flops(_NestedLinear(torch.strided), (torch.randn(2, 5, 8),), tracer=tracer)


def test_flex_attention_under_jit_is_refused_by_name():
    """The sentence blamed a torch.func transform of the caller's and sent them to tracer='dispatch',
    which refuses flex_attention too."""
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(2, 3, 8, 16)
    with pytest.raises(TraceError, match="higher-order op flex_attention") as raised:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            count_flops(_Call(lambda a: flex_attention(a, a, a)), (q,), tracer="jit")
    assert "torch.func transform" not in str(raised.value)
    with pytest.raises(TraceError, match="higher-order op torch.ops.higher_order.flex_attention"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            count_flops(_Call(lambda a: flex_attention(a, a, a)), (q,), tracer="dispatch")
