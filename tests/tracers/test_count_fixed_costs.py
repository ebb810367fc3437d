"""The count's per-op path and per-count fixed costs (issue #32, "opfixed"): what was made cheaper
must count exactly as before. Oracles: hand-derived costs of this file's own handlers, the same
count with every tracer (real runs: nothing shared across counts), torch's own hook dictionaries,
and FakeTensorMode's metadata run live."""

from __future__ import annotations

from typing import Any, List

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from flopcount import Cost, count_flops
from flopcount.core import hooks
from flopcount.core.registry import HandlerRegistry
from flopcount.handlers import default_registry
from flopcount.tracers.fake.shape_cache import ShapeCache


class _Relus(nn.Module):
    """Three relus of one shape (one shape-cache key), a linear, one relu of another shape."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 3)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(torch.relu(torch.relu(self.drop(x))))
        return torch.relu(self.fc(x))


def _per_element(flops: int, priced: List[Any]) -> Any:
    def relu(call: Any) -> Cost:
        priced.append(call)
        return Cost.from_flops(flops * call.out().numel)

    return relu


# by hand, batch 2 of 4 x 5: three relus of 2*4*5 = 40 elements, one of 2*4*3 = 24
_ELEMENTS = 3 * 40 + 24


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_second_count_prices_no_shared_call_again(train: bool) -> None:
    """The calls the recorder shares across counts (one per shape-cache key) keep their price for
    the same handler object: a second count runs the handler for none of them (before: once per
    distinct call in every count), and counts the same by hand."""
    torch.manual_seed(0)
    model, x = _Relus().train(train), torch.randn(2, 4, 5)
    priced: List[Any] = []
    handlers = {"aten::relu": _per_element(7, priced)}
    first = count_flops(model, x, handlers=handlers)
    assert len(priced) == 2  # two distinct relu calls (shapes)
    second = count_flops(model, x, handlers=handlers)
    assert len(priced) == 2  # none priced again
    for result in (first, second):
        assert result.by_operator("flops")["aten::relu"] == 7 * _ELEMENTS
        assert result.by_operator("count")["aten::relu"] == 4
    assert model.training is train


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_another_handler_for_the_same_calls_prices_them_anew(tracer: str, train: bool) -> None:
    """A kept price belongs to the handler that made it: another handler object for the same calls
    (``handlers=``, a registry with the op replaced) prices them again, and the default registry's
    count after both is the one before them."""
    torch.manual_seed(0)
    model, x = _Relus().train(train), torch.randn(2, 4, 5)
    before = count_flops(model, x, tracer=tracer)
    seven: List[Any] = []
    three: List[Any] = []
    with_seven = count_flops(model, x, tracer=tracer, handlers={"aten::relu": _per_element(7, seven)})
    with_three = count_flops(model, x, tracer=tracer, handlers={"aten::relu": _per_element(3, three)})
    assert with_seven.by_operator("flops")["aten::relu"] == 7 * _ELEMENTS
    assert with_three.by_operator("flops")["aten::relu"] == 3 * _ELEMENTS
    assert seven and three
    registry = default_registry().copy()
    registry.register("aten::relu", _per_element(5, []), replace=True)
    with_five = count_flops(model, x, tracer=tracer, registry=registry)
    assert with_five.by_operator("flops")["aten::relu"] == 5 * _ELEMENTS
    registry.register("aten::relu", _per_element(11, []), replace=True)  # the same registry, changed
    with_eleven = count_flops(model, x, tracer=tracer, registry=registry)
    assert with_eleven.by_operator("flops")["aten::relu"] == 11 * _ELEMENTS
    after = count_flops(model, x, tracer=tracer)
    assert after.to_dict() == before.to_dict()


def test_a_kept_price_is_the_same_on_every_tracer_with_backward() -> None:
    """Backward and forward ops of one call priced apart (the phase is part of what is kept): the
    fake path's second count equals the real run's, phase by phase."""
    torch.manual_seed(0)
    model, x = _Relus(), torch.randn(2, 4, 5)
    count_flops(model, x, backward=True)
    fake = count_flops(model, x, backward=True)
    real = count_flops(model, x, backward=True, tracer="dispatch")
    assert fake.by_phase("flops") == real.by_phase("flops")
    assert fake.by_operator("bytes_read") == real.by_operator("bytes_read")


def test_call_hooks_are_found_in_each_of_torchs_dictionaries() -> None:
    """``has_call_hooks`` answers for every kind of call hook torch keeps per module, and for a
    module made without ``nn.Module.__init__`` (no hook dictionaries at all)."""
    registrations = [
        lambda m: m.register_forward_hook(lambda *a: None),
        lambda m: m.register_forward_pre_hook(lambda *a: None),
        lambda m: m.register_full_backward_hook(lambda *a: None),
        lambda m: m.register_full_backward_pre_hook(lambda *a: None),
        lambda m: m.register_forward_hook(lambda *a, **k: None, with_kwargs=True),
    ]
    for register in registrations:
        module = nn.Linear(2, 2)
        assert not hooks.has_call_hooks(module)
        handle = register(module)
        assert hooks.has_call_hooks(module)
        handle.remove()
        assert not hooks.has_call_hooks(module)
    bare: Any = object.__new__(nn.Linear)
    assert not hooks.has_call_hooks(bare)


def test_the_shape_cache_keys_each_argument_kind_apart() -> None:
    """Plain fakes are keyed without a call per argument now: a channels-last, a transposed, a
    sliced (offset) fake, a fake of another mode and lists of ints, bools or floats each get their
    own key, and every hit has the metadata FakeTensorMode gives (run live)."""
    mode = FakeTensorMode()
    cache = ShapeCache(mode, FakeTensor)
    other = FakeTensorMode()
    add = torch.ops.aten.add.Tensor
    with mode:
        base = torch.empty(2, 3, 4, 5)
        variants = [
            base, base.to(memory_format=torch.channels_last), base.transpose(2, 3), base[1:],
        ]
        keys = [cache._key(add, (v, v), None) for v in variants]
        assert len(set(keys)) == len(keys)
        for v in variants:
            for _ in range(2):  # a miss, then a hit
                out = cache.run(add, (v, v), None)
                ref = add(v, v)
                assert (out.shape, out.stride(), out.dtype) == (ref.shape, ref.stride(), ref.dtype)
    with other:
        foreign = torch.empty(2, 3)
    assert cache._key(add, (foreign, foreign), None) is cache._key(add, (foreign,), None)  # uncacheable
    view = torch.ops.aten.view.default
    with mode:
        x = torch.empty(2, 6)
        lists = [[3, 4], [True, 4], [3.0, 4], (3, 4)]
        keyed = [cache._key(view, (x, shape), None) for shape in lists]
    assert len(set(keyed)) == len(keyed)


def test_a_registry_replaced_op_is_priced_with_the_new_handler_after_a_count() -> None:
    """A fresh ``HandlerRegistry`` with only this file's handler: the same calls, counted after
    default counts, take this handler's price (hand-derived), batch 2."""
    torch.manual_seed(0)
    model, x = _Relus(), torch.randn(2, 4, 5)
    count_flops(model, x)
    registry = HandlerRegistry()
    registry.register("aten::relu", _per_element(2, []))
    result = count_flops(model, x, registry=registry)
    assert result.by_operator("flops")["aten::relu"] == 2 * _ELEMENTS


def _signature_bind(func: Any, args: Any, kwargs: Any) -> Any:
    """What ``inspect.Signature.bind`` gives (defaults applied), or "error" where it raises."""
    import inspect

    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except TypeError:
        return "error"
    bound.apply_defaults()
    return list(bound.arguments.items())


@pytest.mark.parametrize(
    "func",
    [
        torch.nn.functional.dropout, torch.nn.functional.rms_norm, torch.nn.functional.instance_norm,
        torch.nn.functional.adaptive_avg_pool2d, torch.nn.functional.cross_entropy,
        torch.nn.functional.max_pool1d_with_indices, torch.nn.functional.multi_head_attention_forward,
    ],
    ids=lambda f: f.__name__,
)
def test_a_python_composite_binds_its_arguments_as_its_signature_does(func: Any) -> None:
    """The binder's fast path (plain signatures) gives what ``inspect.Signature.bind`` gives, or
    leaves the call to it: every positional prefix, keywords in any order, a keyword given twice,
    an unknown one, too many positional arguments, a missing required one."""
    import inspect

    from flopcount.tracers._vocabulary import _bound_plainly, _plain_parameters

    plain = _plain_parameters(inspect.signature(func))
    names = list(inspect.signature(func).parameters)
    values = [object() for _ in names]
    calls = []
    for cut in range(len(names) + 2):
        calls.append((tuple(values[:cut]), {}))
        calls.append((tuple(values[:cut]), dict(reversed(list(zip(names[cut:], values[cut:]))))))
        if 0 < cut <= len(names):
            calls.append((tuple(values[:cut]), {names[cut - 1]: values[0]}))  # given twice
        calls.append((tuple(values[:cut]), {"not_a_parameter": 1}))
    calls.append(((), {names[-1]: values[-1]}))  # required ones missing
    assert plain is not None or func is torch.nn.functional.multi_head_attention_forward
    for args, kwargs in calls:
        expected = _signature_bind(func, args, kwargs)
        fast = _bound_plainly(plain, args, kwargs) if plain is not None else None
        if expected == "error" or plain is None:
            assert fast is None, (args, kwargs)  # left to Signature.bind, which raises
        else:
            assert fast is not None and list(fast.items()) == expected, (args, kwargs)


def test_dropout_counts_alike_on_every_tracer_in_train_and_eval() -> None:
    """``F.dropout`` (bound by the fast path) recorded as one ``aten::dropout`` event per call with
    its own arguments: batch 2, train and eval, keywords and positions, every tracer the same."""

    class _Drops(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.nn.functional.dropout(x, 0.25, self.training)
            x = torch.nn.functional.dropout(x, p=0.5, training=self.training)
            return torch.nn.functional.dropout(x, training=self.training, inplace=False)

    x = torch.randn(2, 3, 8)
    for train in (False, True):
        model = _Drops().train(train)
        results = [count_flops(model, x, tracer=t) for t in ("auto", "dispatch", "jit")]
        for result in results:
            assert result.by_operator("count").get("aten::dropout") == 3
            assert result.by_operator("flops") == results[0].by_operator("flops")
        assert model.training is train


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_module_rows_are_the_models_own_facts(tracer: str) -> None:
    """Each module's row (type, depth, calls, parameters) by hand, batch 2, every tracer: a
    Linear(5, 3) holds 5*3 + 3 = 18 parameters, called once at depth 1; the root holds it."""
    torch.manual_seed(0)
    model, x = _Relus(), torch.randn(2, 4, 5)
    rows = {m.name: m for m in count_flops(model, x, tracer=tracer).modules}
    assert (rows["fc"].type_name, rows["fc"].depth, rows["fc"].calls, rows["fc"].params) == ("Linear", 1, 1, 18)
    assert (rows[""].type_name, rows[""].depth, rows[""].calls, rows[""].params) == ("_Relus", 0, 1, 18)
    assert (rows["drop"].calls, rows["drop"].params) == (1, 0)
