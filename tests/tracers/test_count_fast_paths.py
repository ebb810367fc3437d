"""The default count's per-op fast paths (issue #32, count speed): a fake's device read answered
by the shape cache, and a known call's bound arguments made once per shape-cache key. Each keeps
the events exactly as the general path records them (the oracle: the same trace with the fast
path off, and FakeTensor's own answer)."""

from __future__ import annotations

import math
from types import MappingProxyType

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from examples.resnet import resnet18
from flopcount import count_flops
from flopcount.tracers import _recorder
from flopcount.tracers import trace as run_trace
from flopcount.tracers.fake import shape_cache as _shape_cache
from flopcount.tracers.fake.shape_cache import ShapeCache

_DEVICE = torch.ops.prim.device.default


def _events(run):
    return [(e.call.op, e.call.args, e.call.outputs, e.module_stack, e.phase) for e in run.events]


def test_a_fake_device_read_is_answered_without_the_fake_mode(monkeypatch):
    mode = FakeTensorMode()
    cache = ShapeCache(mode, FakeTensor)
    with mode:
        x = torch.empty(2, 3)
    expected = x.fake_device  # what FakeTensor.__torch_dispatch__ answers outside a kernel

    def refuse(*args, **kwargs):
        raise AssertionError("prim.device reached FakeTensorMode")

    with mode:  # as in a count: the mode is active
        monkeypatch.setattr(FakeTensorMode, "__torch_dispatch__", refuse)
        assert cache.run(_DEVICE, (x,), None) == expected


def test_a_device_read_inside_a_kernel_is_the_fake_modes_answer():
    # inside a meta kernel's run FakeTensor answers "meta": the cache leaves it to it
    mode = FakeTensorMode()
    cache = ShapeCache(mode, FakeTensor)
    with mode:
        x = torch.empty(2, 3)
    mode.in_kernel_invocation = True
    try:
        assert cache.run(_DEVICE, (x,), None) == torch.device("meta")
    finally:
        mode.in_kernel_invocation = False
    assert cache.run(_DEVICE, (x,), None) == torch.device("cpu")


class _BatchNormBlock(nn.Module):
    """Batch norm reads its input's device twice in C++ (prim.device) and runs aten::empty
    beside the kernel; a non-contiguous input and a view after it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x.transpose(2, 3))))
        return self.fc(y.mean((2, 3))).t()


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_known_calls_arguments_are_bound_once_per_key(monkeypatch, train):
    torch.manual_seed(0)
    model, x = _BatchNormBlock().train(train), torch.randn(2, 3, 6, 6)
    monkeypatch.setattr(_shape_cache, "_RESULTS", {})
    monkeypatch.setattr(_recorder, "_BOUND", {}, raising=False)
    cold = run_trace(model, (x,))
    binds = []
    bind = _recorder._Signature.bind
    monkeypatch.setattr(_recorder._Signature, "bind", lambda self, args, kwargs: binds.append(self.name) or bind(self, args, kwargs))
    warm = run_trace(model, (x,))
    # every aten op of the warm run was a shape-cache hit: none bound again
    assert binds == []
    assert _events(warm) == _events(cold)
    # events of one key share one call (priced once), its arguments read-only: no event (no
    # handler) can change another's
    assert all(a.call is b.call for a, b in zip(warm.events, cold.events) if type(a.call.args) is MappingProxyType)
    # every aten op's call is shared; the one composite (F.linear, recorded by the interceptor) is not keyed
    assert [e.call.op for e in warm.events if type(e.call.args) is not MappingProxyType] == ["aten::linear"]
    with pytest.raises(TypeError):
        warm.events[0].call.args["input"] = None  # type: ignore[index]
    monkeypatch.setattr(ShapeCache, "run", lambda self, func, args, kwargs: func(*args, **(kwargs or {})))
    monkeypatch.setattr(ShapeCache, "run_composite", lambda self, func, args, kwargs: func(*args, **kwargs))
    assert _events(run_trace(model, (x,))) == _events(warm)


class _SignedZero(nn.Module):
    def forward(self, x, y):
        return x.add(y, alpha=0.0), x.add(y, alpha=-0.0), x.sub(y, alpha=-0.0)


def test_a_negative_zero_argument_keeps_its_sign():
    # -0.0 == 0.0: a key that confused them would show the first call's alpha for the second
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    for _ in range(2):  # cold, then warm
        run = run_trace(_SignedZero(), (x, y))
        alphas = [e.call.args["alpha"] for e in run.events if e.call.op in ("aten::add", "aten::sub")]
        assert [math.copysign(1.0, a) for a in alphas] == [1.0, -1.0, -1.0]


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_warm_count_equals_a_real_run_at_batch_two(monkeypatch, train):
    torch.manual_seed(0)
    model, x = resnet18().train(train), torch.randn(2, 3, 32, 32).transpose(2, 3)
    monkeypatch.setattr(_shape_cache, "_RESULTS", {})
    monkeypatch.setattr(_recorder, "_BOUND", {}, raising=False)
    count_flops(model, x)
    warm = count_flops(model, x)
    real = count_flops(model, x, tracer="dispatch")
    assert (warm.macs, warm.flops) == (real.macs, real.flops)
    assert warm.by_operator() == real.by_operator()
    assert warm.by_module("flops") == real.by_module("flops")


class _Norms(nn.Module):
    """Convolutions, batch norm (affine and not), layer norm, twice each with equal shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(4, 4, 3, padding=1) for _ in range(2)])
        self.bns = nn.ModuleList([nn.BatchNorm2d(4), nn.BatchNorm2d(4, affine=False)])
        self.conv1d = nn.Conv1d(4, 4, 1)
        self.ln = nn.LayerNorm(6)

    def forward(self, x):
        for conv, bn in zip(self.convs, self.bns):
            x = bn(conv(x))
        y = self.conv1d(x.flatten(2)[..., :6])
        return self.ln(y), torch.nn.functional.layer_norm(y, (6,), eps=1e-3)


def _dispatched(monkeypatch):
    seen = []
    dispatch = _recorder.Recorder.__torch_dispatch__

    def spy(self, func, types, args=(), kwargs=None):
        seen.append(str(func))
        return dispatch(self, func, types, args, kwargs)

    monkeypatch.setattr(_recorder.Recorder, "__torch_dispatch__", spy)
    return seen


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_known_functions_ops_are_booked_from_its_first_call(monkeypatch, train):
    torch.manual_seed(0)
    model, x = _Norms().train(train), torch.randn(2, 4, 5, 5).to(memory_format=torch.channels_last)
    monkeypatch.setattr(_shape_cache, "_RESULTS", {})
    monkeypatch.setattr(_recorder, "_BOUND", {}, raising=False)
    monkeypatch.setattr(_recorder, "_FUNCTIONS", {}, raising=False)
    cold = run_trace(model, (x,))
    seen = _dispatched(monkeypatch)
    warm = run_trace(model, (x,))
    kernels = [op for op in seen if "convolution" in op or "batch_norm" in op or "layer_norm" in op]
    # booked from the first call: none of their ops ran (in training too: batch norm's kernel
    # updates the running statistics of the fake copy, which hold no data; its schema writes nothing)
    assert kernels == []
    assert _events(warm) == _events(cold)
    monkeypatch.setattr(ShapeCache, "run", lambda self, func, args, kwargs: func(*args, **(kwargs or {})))
    monkeypatch.setattr(ShapeCache, "function_key", lambda self, func, args, kwargs: None, raising=False)
    assert _events(run_trace(model, (x,))) == _events(warm)


class _Tagged(torch.Tensor):
    """A tensor subclass with a ``__torch_function__`` of its own (it sees every torch call)."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_subclass_with_its_own_torch_function_counts_as_a_real_run(train):
    torch.manual_seed(0)
    model = _Norms().train(train)
    x = torch.randn(2, 4, 5, 5).as_subclass(_Tagged)
    for _ in range(2):  # cold, then warm
        auto = count_flops(model, x)
        real = count_flops(model, x, tracer="dispatch")
        assert auto.by_operator() == real.by_operator()
        assert auto.by_module("flops") == real.by_module("flops")


def test_owners_of_a_model_without_aliases_step_by_step_are_the_whole_walks():
    from flopcount.core import ledger

    # by hand: the root, the ModuleList "h" never called itself, then each stack entry
    assert ledger.owners_of(("h.0", "h.0.attn"), {}, {}) == ("", "h", "h.0", "h.0.attn")
    # with aliases the answer depends on them: a module shared as a.m and b.m (canonical a.m)
    # called from b counts for b, not a
    assert ledger.owners_of(("b", "a.m"), {"a.m": ("a.m", "b.m")}, {"a.m": "a.m", "b.m": "a.m"}) == ("", "b", "a.m")
    aliased = ledger.Ledger({"a.m": ("a.m", "b.m")})
    assert aliased.owners(("b", "a.m")) == ("", "b", "a.m")
    # a ledger without aliases makes a stack's owners from those of the stack one shorter (no
    # cache across ledgers: issue #32, 5.6 KiB per 70B layer kept after a count): the same as the
    # whole stack walked, for nested stacks, a ModuleList's child and grandchild, a stack that
    # leaves its outer entry's names (a module called from a sibling), a recursion, the root
    fresh = ledger.Ledger()
    stacks = [
        ("", "model", "model.layers.3", "model.layers.3.mlp", "model.layers.3.mlp.experts.1"),
        ("h.0", "h.0.attn", "h.0.attn.heads.2.q"), ("a", "b.c", "a.d"), ("x", "x", "x.y.z"), ("",), (),
    ]
    for stack in stacks:
        for end in range(len(stack), -1, -1):  # the longest first: its prefixes are made on the way
            assert fresh.owners(stack[:end]) == ledger.owners_of(stack[:end], {}, {}), stack[:end]
    assert fresh.owners(("a", "b.c", "a.d")) == ("", "a", "b.c", "a.d")  # by hand: "b" is not on the path of "a"
    # the tree booking credits a node with the owners its stack adds: those after the owners of the
    # stack one shorter, which begin every stack's owners (with aliases too)
    aliases = {"a.m": ("a.m", "b.m")}
    canonical = {"a.m": "a.m", "b.m": "a.m"}
    for stack in [*stacks, ("b", "a.m", "a.m.x"), ("a", "a.m"), ("b", "b.m.y", "a.m")]:
        for end in range(1, len(stack) + 1):
            for named in ({}, aliases):
                shorter = ledger.owners_of(stack[:end - 1], named, canonical if named else {})
                assert ledger.owners_of(stack[:end], named, canonical if named else {})[:len(shorter)] == shorter
    assert fresh.owners(("h.0", "h.0.attn", "h.0.attn.heads.2.q")) == (
        "", "h", "h.0", "h.0.attn", "h.0.attn.heads", "h.0.attn.heads.2", "h.0.attn.heads.2.q")
    torch.manual_seed(0)
    model, x = resnet18().eval(), torch.randn(2, 3, 32, 32)
    first, second = count_flops(model, x), count_flops(model, x)
    assert second.by_module("flops") == first.by_module("flops") == count_flops(model, x, tracer="dispatch").by_module("flops")


def test_complex_and_sparse_arguments_are_never_keyed():
    # a complex fake's result metadata may depend on more than the key holds (conjugate/negative
    # bits), a sparse one's on its values: left to FakeTensorMode, never remembered
    mode = FakeTensorMode()
    cache = ShapeCache(mode, FakeTensor)
    with mode:
        z = torch.empty(3, 4, dtype=torch.complex64)
        s = torch.empty(3, 4).to_sparse()
        for x in (z, s):
            out = cache.run(torch.ops.aten.mul.Tensor, (x, 2), None)
            assert cache.key is None and (cache.hits, cache.misses) == (0, 0)
            assert out.dtype == x.dtype and out.layout == x.layout
            assert cache.function_key(torch.nn.functional.layer_norm, (x, (4,)), {}) is None


class _GrowingCache(nn.Module):
    """What transformers' DynamicCache does on its first update: an empty ``torch.tensor([])``
    (a constant on fakes: FakeTensorMode keeps the values of tensors of at most one element)
    concatenated with the new keys; and constants alone, whose values a forward may read."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        keys = torch.tensor([], dtype=x.dtype, device=x.device)
        keys = torch.cat([keys.view(0, 4).expand(0, 4), self.proj(x)], dim=0)
        both = torch.tensor(1.0) + torch.tensor(2.0)  # every argument a constant: so is the result
        scale = float(both)  # read on fakes only because the result kept its value (3.0)
        return keys * scale


def test_a_constant_concatenated_with_a_fake_is_cached_and_constants_alone_keep_their_values(monkeypatch):
    torch.manual_seed(0)
    model, x = _GrowingCache(), torch.randn(2, 4)
    monkeypatch.setattr(_shape_cache, "_RESULTS", {})
    runs = [run_trace(model, (x,)) for _ in range(2)]  # cold, then warm
    assert all(run.shape_cache for run in runs)  # on fakes (no real run was needed)
    monkeypatch.setattr(ShapeCache, "run", lambda self, func, args, kwargs: func(*args, **(kwargs or {})))
    plain = run_trace(model, (x,))
    for run in runs:
        assert _events(run) == _events(plain)
        assert run.warnings == plain.warnings
    assert runs[1].shape_cache["hits"] > runs[0].shape_cache["hits"]
    # the real run agrees (the constant sum read as 3.0 on fakes too)
    assert count_flops(model, x).by_operator() == count_flops(model, x, tracer="dispatch").by_operator()


def test_a_fresh_op_with_a_constant_argument_is_keyed_apart_and_read_back():
    mode = FakeTensorMode()
    cache = ShapeCache(mode, FakeTensor)
    cat = torch.ops.aten.cat.default
    with mode:
        plain = torch.empty(0, 4)
        constant = torch.tensor([]).view(0, 4)
        y = torch.empty(2, 4)
        assert constant.constant is not None and plain.constant is None
        first = cache.run(cat, ([constant, y],), None)
        key_constant = cache.key
        second = cache.run(cat, ([constant, y],), None)
        assert cache.key == key_constant and (cache.hits, cache.misses) == (1, 1)
        cache.run(cat, ([plain, y],), None)
        assert cache.key != key_constant  # a plain fake of the same metadata: its own key
        for out in (first, second):
            assert (out.shape, out.stride(), out.constant) == (torch.Size([2, 4]), (4, 1), None)
        # every argument constant: the mode's result is a constant, never remembered
        one, two = torch.tensor(1.0), torch.tensor(2.0)
        sums = []
        for _ in range(2):
            sums.append(cache.run(torch.ops.aten.add.Tensor, (one, two), None))
            assert cache.key is None
    assert [out.constant.item() for out in sums] == [3.0, 3.0]


@pytest.mark.parametrize(
    "func, make_args",
    [
        (torch.ops.aten.split.Tensor, lambda x: (x, 3, 1)),
        (torch.ops.aten.split_with_sizes.default, lambda x: (x, [2, 5], 1)),
        (torch.ops.aten.unbind.int, lambda x: (x, 0)),
        (torch.ops.aten.chunk.default, lambda x: (x, 2, 2)),
    ],
    ids=["split", "split_with_sizes", "unbind", "chunk"],
)
def test_a_list_of_views_from_the_cache_is_what_the_fake_mode_makes(func, make_args):
    mode = FakeTensorMode()
    cache = ShapeCache(mode, FakeTensor)
    with mode:
        x = torch.empty(4, 6, 7).transpose(1, 2)[1:]  # a non-contiguous view with an offset
        expected = func(*make_args(x))  # FakeTensorMode's own answer (the oracle)
        cache.run(func, make_args(x), None)  # miss: remembered
        hit = cache.run(func, make_args(x), None)
    assert (cache.hits, cache.misses) == (1, 1)
    assert type(hit) is type(expected) and len(hit) == len(expected)
    for got, want in zip(hit, expected):
        assert type(got) is FakeTensor
        assert (got.shape, got.stride(), got.storage_offset(), got.dtype, got.device) == (
            want.shape, want.stride(), want.storage_offset(), want.dtype, want.device)
        assert got.untyped_storage() is x.untyped_storage()


class _Split(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).split(8, dim=2)
        a, b = torch.unbind(k.view(2, 3, 2, 4), dim=2)
        return q @ k.transpose(1, 2) @ v, a * b, torch.chunk(v, 2, dim=-1)[1].sum()


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_lists_of_views_record_the_same_events_without_the_cache(monkeypatch, backward):
    torch.manual_seed(0)
    model, x = _Split(), torch.randn(2, 3, 8)
    monkeypatch.setattr(_shape_cache, "_RESULTS", {})
    run_trace(model, (x,), backward=backward)
    warm = run_trace(model, (x,), backward=backward)
    monkeypatch.setattr(ShapeCache, "run", lambda self, func, args, kwargs: func(*args, **(kwargs or {})))
    monkeypatch.setattr(ShapeCache, "run_composite", lambda self, func, args, kwargs: func(*args, **kwargs))
    assert _events(warm) == _events(run_trace(model, (x,), backward=backward))
    assert count_flops(model, x).by_operator() == count_flops(model, x, tracer="dispatch").by_operator()
