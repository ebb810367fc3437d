"""Bad input gets a clear error that names what is wrong and where."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopcount
from flopcount import Cost, HandlerError, TraceError, UnsupportedOpError, UsageError, count_flops


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Inner(), Inner())
        self.blocks[1].fc = nn.Linear(5, 4)  # wrong in_features: fails in blocks.1.fc

    def forward(self, x):
        return self.blocks(x)


def test_forward_failure_names_module_path_and_inputs():
    with pytest.raises(TraceError) as info:
        count_flops(Outer(), torch.randn(2, 4))
    message = str(info.value)
    assert "blocks.1.fc" in message
    assert "Tensor[2, 4] float32" in message
    assert info.value.module_path == "blocks.1.fc"
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize("who, call", [
    ("count_flops", lambda m, x: flopcount.count_flops(m, x)),
    ("count_generation", lambda m, x: flopcount.count_generation(m, x.long(), 2)),
    ("serve", lambda m, x: flopcount.serve(m, x.long(), 2)),
    ("estimate_memory", lambda m, x: flopcount.estimate_memory(m, x)),
    ("benchmark", lambda m, x: flopcount.benchmark(m, x)),
    ("module_latency", lambda m, x: flopcount.module_latency(m, x)),
    ("profile", lambda m, x: flopcount.profile(m, x)),
    ("predict", lambda m, x: flopcount.predict(m, x)),
])
def test_not_a_module(who, call):
    """Every reading refuses a non-module in one sentence naming the function called (one
    helper, core.inputs.require_module; estimate_memory alone said it otherwise before)."""
    with pytest.raises(UsageError, match=rf"^{who} expects a torch\.nn\.Module, got function$"):
        call(lambda x: x, torch.randn(1, 2))


def test_unknown_tracer():
    with pytest.raises(UsageError, match="tracer must be one of"):
        count_flops(nn.Linear(2, 2), torch.randn(1, 2), tracer="fx")


def test_kwargs_must_be_mapping():
    with pytest.raises(UsageError, match="kwargs"):
        count_flops(nn.Linear(2, 2), torch.randn(1, 2), kwargs=[1, 2])  # type: ignore[arg-type]


class UsesUnknownOp(nn.Module):
    def forward(self, x):
        return torch.special.zeta(x, torch.full_like(x, 2.0))


def test_unsupported_op_is_reported_not_zero():
    r = count_flops(UsesUnknownOp(), torch.rand(3, 3) + 1)
    assert r.unsupported_ops() == {"aten::special_zeta": 1}
    assert "NOT counted" in r.table()
    assert "aten::special_zeta" in r.table()
    with pytest.raises(UnsupportedOpError, match="aten::special_zeta"):
        count_flops(UsesUnknownOp(), torch.rand(3, 3) + 1, strict=True)


def test_per_call_handler_override_and_known_zero():
    r = count_flops(UsesUnknownOp(), torch.rand(3, 3) + 1, handlers={"aten::special_zeta": lambda c: Cost.from_flops(7 * c.out().numel)})
    assert r.flops == 7 * 9
    assert r.unsupported_ops() == {}
    r0 = count_flops(UsesUnknownOp(), torch.rand(3, 3) + 1, handlers={"aten::special_zeta": None})
    assert r0.flops == 0 and r0.unsupported_ops() == {}
    # the default registry is untouched by per-call overrides
    assert flopcount.default_registry().resolve("aten::special_zeta") is None


def test_handler_failure_names_op_and_module():
    def broken(call):
        raise ValueError("bad shape")

    with pytest.raises(HandlerError) as info:
        count_flops(Outer().blocks[0], torch.randn(2, 4), tracer="jit", handlers={"aten::linear": broken})
    assert "aten::linear" in str(info.value) and "fc" in str(info.value)


def test_register_handler_duplicate_is_an_error():
    registry = flopcount.default_registry().copy()
    with pytest.raises(flopcount.errors.DuplicateHandlerError):
        registry.register("aten::mm", lambda c: Cost())
    registry.register("aten::mm", lambda c: Cost(1, 2), replace=True)
    assert registry.resolve("aten::mm")(None) == Cost(1, 2)  # type: ignore[misc]
    assert flopcount.default_registry().resolve("aten::mm") is not registry.resolve("aten::mm")


def test_bad_op_name():
    with pytest.raises(UsageError, match="aten::addmm"):
        flopcount.default_registry().copy().register("addmm", lambda c: Cost())


# --------------------------------------------------------------------------- issue #9, finding 10: misuse


def _mystery_op():
    """A custom torch.library op that flopcount has no handler for (registered once)."""
    if not hasattr(torch.ops.flopcount_errors_test, "mystery"):
        torch.library.define("flopcount_errors_test::mystery", "(Tensor x) -> Tensor")
        torch.library.impl("flopcount_errors_test::mystery", "CompositeExplicitAutograd")(lambda x: x * 2)
        torch.library.register_fake("flopcount_errors_test::mystery")(lambda x: torch.empty_like(x))
    return torch.ops.flopcount_errors_test.mystery


class Mystery(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4))
        self.op = _mystery_op()

    def forward(self, x):
        return self.op(self.inner(x))


@pytest.mark.parametrize("tracer", ["jit", "dispatch", "auto"])
@pytest.mark.parametrize("answer, fragment", [(5, "returned int"), (Cost(-1, 4), "must be integers >= 0"),
                                              (Cost(1, 2.5), "must be integers >= 0"), ("7", "returned str")])  # type: ignore[arg-type]
def test_a_handler_returning_a_bad_cost_is_a_handler_error(tracer, answer, fragment):
    with pytest.raises(HandlerError) as info:
        count_flops(Mystery(), torch.randn(2, 3, 4), tracer=tracer, handlers={"flopcount_errors_test::mystery": lambda call: answer})
    message = str(info.value)
    assert "flopcount_errors_test::mystery" in message and fragment in message and "the root module (model)" in message


def test_handlers_must_be_a_mapping():
    with pytest.raises(UsageError, match="handlers must be a mapping"):
        count_flops(Mystery(), torch.randn(2, 4), handlers=[lambda call: Cost()])  # type: ignore[arg-type]


def test_measure_options_are_checked_before_any_work():
    with pytest.raises(UsageError, match="'bogus'"):
        count_flops(nn.Linear(4, 4), torch.randn(2, 4), measure={"bogus": 1})
    with pytest.raises(UsageError, match="measure must be"):
        count_flops(nn.Linear(4, 4), torch.randn(2, 4), measure="yes")  # type: ignore[arg-type]


class KeywordOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, *, x):
        return self.fc(x)


@pytest.mark.parametrize("tracer", ["jit", "dispatch", "auto"])
def test_none_inputs_mean_no_positional_inputs(tracer):
    x = torch.randn(2, 5, 4)
    r = count_flops(KeywordOnly(), None, kwargs={"x": x}, tracer=tracer)
    assert r.macs == 2 * 5 * 4 * 3


def test_a_handler_returning_none_marks_the_call_unsupported():
    r = count_flops(Mystery(), torch.randn(2, 3, 4), handlers={"flopcount_errors_test::mystery": lambda call: None})
    assert r.unsupported_ops() == {"flopcount_errors_test::mystery": 1} and not r.complete
    assert r.macs == 2 * 3 * 4 * 4
