"""Conformance with fvcore's ``tests/test_jit_model_analysis.py`` (per-module cases).

fvcore's fixture nets carry their expected per-module counts (MACs); each case builds the
same net here, checks fvcore live, and asserts flopcount's ``by_module("macs")``. fvcore's
default ``ancestor_mode("owner")`` credits a module that is never called itself with the
ops of its members; its ``"caller"`` mode credits a parent with what ran inside its
forward. flopcount does both at once: never-called owners (containers, a submodule used
through another method) are credited, and a shared module's calls count for the parent
that made them.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict

import pytest
import torch
from _conformance import TRACERS, count, family_macs, fvcore_analysis
from torch import nn

from flopcount import Cost


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 2, 1)
        self.fc = nn.Linear(10, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.conv(x.reshape(-1, 2, 5)), 1)
        return 3 * self.fc(x) + 1


class _NestedNet(nn.Module):
    """fvcore's NestedNet: input (B, 4, 5)."""

    def __init__(self) -> None:
        super().__init__()
        self.submod = _Inner()
        self.fc = nn.Linear(20, 10)
        self.conv = nn.Conv1d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc(torch.flatten(self.conv(x), 1))
        return self.submod(x) ** 2


def _nested_expected(batch: int = 1) -> Dict[str, Dict[str, int]]:
    """MACs per module and op family, derived from the layer shapes."""
    inner_conv, inner_fc = 5 * 1 * 2 * 2, 10 * 10  # positions x k x Cin x Cout; in x out
    conv, fc = 5 * 3 * 4 * 4, 20 * 10
    per = {
        "submod.conv": {"conv": inner_conv},
        "submod.fc": {"linear": inner_fc},
        "submod": {"conv": inner_conv, "linear": inner_fc},
        "conv": {"conv": conv},
        "fc": {"linear": fc},
        "": {"conv": conv + inner_conv, "linear": fc + inner_fc},
    }
    return {name: {op: batch * n for op, n in ops.items()} for name, ops in per.items()}


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [1, 3])
def test_nested_net(batch: int, tracer: str) -> None:
    # fvcore: test_total, test_by_module, test_by_operator, test_by_module_and_operator
    model, x = _NestedNet(), torch.randn(batch, 4, 5)
    expected = _nested_expected(batch)
    fv = fvcore_analysis(model, (x,))
    assert fv.by_module() == {name: sum(ops.values()) for name, ops in expected.items()}
    result = count(model, (x,), tracer)
    assert result.by_module("macs") == {name: sum(ops.values()) for name, ops in expected.items()}
    for name, ops in expected.items():
        assert family_macs(result, name) == ops


@pytest.mark.parametrize("tracer", TRACERS)
def test_unused_module(tracer: str) -> None:
    # fvcore: test_unused_module -- a submodule never called counts 0 and is reported
    class UnusedNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.unused, self.act = (
                nn.Linear(10, 10),
                nn.Linear(10, 1),
                nn.Linear(20, 20),
                nn.ReLU(),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.act(self.fc1(x)))

    model, x = UnusedNet(), torch.randn(1, 10)
    fv = fvcore_analysis(model, (x,))
    assert fv.uncalled_modules() == {"unused"} and fv.total("unused") == 0
    result = count(model, (x,), tracer)
    assert result.by_module("macs")["unused"] == 0 and result.by_module("macs")[""] == 110
    assert {m.name for m in result.modules if m.calls == 0} == {"unused"}


@pytest.mark.parametrize("tracer", TRACERS)
def test_repeated_module(tracer: str) -> None:
    # fvcore: test_repeated_module -- fc1 called 3 times, fc2 twice
    class RepeatedNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(10, 10), nn.Linear(10, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(3):
                x = self.fc1(x)
            for _ in range(2):
                x = self.fc2(x)
            return x

    model, x = RepeatedNet(), torch.randn(1, 10)
    assert fvcore_analysis(model, (x,)).by_module() == {"": 500, "fc1": 300, "fc2": 200}
    result = count(model, (x,), tracer)
    assert result.by_module("macs") == {"": 500, "fc1": 300, "fc2": 200}
    assert {m.name: m.calls for m in result.modules} == {"": 1, "fc1": 3, "fc2": 2}


class _NonForwardInner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def other_func(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class _NonForwardNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.submod = _NonForwardInner()
        self.fc = nn.Linear(10, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.submod.other_func(self.fc(x))


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [1, 5])
def test_non_forward_func_call(batch: int, tracer: str) -> None:
    # fvcore: test_non_forward_func_call (ancestor_mode "owner": submod owns submod.fc) and
    # test_copy (the same net with batch 5: 550)
    model, x = _NonForwardNet(), torch.randn(batch, 10)
    fv = fvcore_analysis(model, (x,)).ancestor_mode("owner")
    expected = {"": 110 * batch, "fc": 100 * batch, "submod": 10 * batch, "submod.fc": 10 * batch}
    assert fv.by_module() == expected
    assert count(model, (x,), tracer).by_module("macs") == expected


class _SharedInner(nn.Module):
    def __init__(self, submod: nn.Module) -> None:
        super().__init__()
        self.submod = submod

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.submod(x)


class _SharedModuleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        inner = nn.Linear(10, 10)
        self.submod1, self.submod2 = _SharedInner(inner), _SharedInner(inner)
        multiname = nn.Linear(10, 1)
        self.multiname1, self.multiname2 = multiname, multiname

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.submod1(x) + self.submod2(x)
        return self.multiname1(x) + self.multiname2(x)


@pytest.mark.parametrize("tracer", TRACERS)
def test_shared_module(tracer: str) -> None:
    # fvcore: test_shared_module (ancestor_mode "caller"). The shared Linear is named once
    # (submod1.submod) and its row keeps both calls; each parent counts its own call. These
    # are the figures of fvcore's test (its current source); the fvcore release installed
    # here (0.1.5.post20221221) still credits both calls to submod1, so it is not run live.
    model, x = _SharedModuleNet(), torch.randn(1, 10)
    expected = {"": 220, "submod1": 100, "submod1.submod": 200, "submod2": 100, "multiname1": 20}
    result = count(model, (x,), tracer)
    assert result.by_module("macs") == expected
    assert result.by_module("macs")["submod1"] + result.by_module("macs")["submod2"] == 200


@pytest.mark.parametrize("tracer", TRACERS)
def test_recursive_scope(tracer: str) -> None:
    # fvcore: test_recursive_scope -- the root calls itself three times before its fc runs once
    class RecursiveScopeNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(10, 1)

        def forward(self, x: torch.Tensor, count: int = 3) -> torch.Tensor:
            return self(x, count - 1) if count > 0 else self.fc(x)

    model, x = RecursiveScopeNet(), torch.randn(1, 10)
    fv = fvcore_analysis(model, (x,))
    assert (fv.total(), fv.total("fc")) == (10, 10)
    result = count(model, (x,), tracer)
    assert result.by_module("macs") == {"": 10, "fc": 10}


@pytest.mark.parametrize("tracer", TRACERS)
def test_data_parallel(tracer: str) -> None:
    # fvcore: test_data_parallel -- names gain the "module." prefix; DataParallel on CPU
    # emits record_function markers, which are known zeros (strict=True must not raise)
    model, x = torch.nn.DataParallel(_NestedNet()).cpu(), torch.randn(1, 4, 5)
    expected = {("module." + n if n else "module"): sum(ops.values()) for n, ops in _nested_expected().items()}
    expected[""] = expected["module"]
    fv = fvcore_analysis(model, (x,))
    assert fv.by_module() == expected
    result = count(model, (x,), tracer, strict=True)
    assert result.by_module("macs") == expected


@pytest.mark.parametrize("tracer", TRACERS)
def test_data_parallel_root_scope(tracer: str) -> None:
    # fvcore: test_data_parallel_root_scope -- DataParallel(Linear(10, 10)), input 10 x 10: 1000
    model, x = nn.DataParallel(nn.Linear(10, 10)).cpu(), torch.randn(10, 10)
    for mode in ("caller", "owner"):
        assert fvcore_analysis(model, (x,)).ancestor_mode(mode).total() == 1000
    assert count(model, (x,), tracer, strict=True).macs == 1000


@pytest.mark.convention(
    "conv, add, mul and pow have handlers; fvcore with only the linear handles reports them as skipped"
)
@pytest.mark.parametrize("tracer", TRACERS)
def test_unsupported_ops(tracer: str) -> None:
    # fvcore: test_unsupported_ops -- what fvcore skips per module, flopcount counts
    model, x = _NestedNet(), torch.randn(1, 4, 5)
    result = count(model, (x,), tracer, strict=True)
    assert result.unsupported_ops() == {}
    ops = result.by_module_and_operator()
    assert ops["submod.conv"]["aten::convolution"] == 2 * 5 * 1 * 2 * 2
    assert ops["submod"]["aten::mul"] == ops["submod"]["aten::add"] == 10  # 3 * y + 1: 1 per element
    assert ops[""]["aten::pow"] == 10


@pytest.mark.parametrize("tracer", TRACERS)
def test_changing_handles(tracer: str) -> None:
    # fvcore: test_changing_handles -- a dummy linear handle (1000 per call)
    model, x = _NestedNet(), torch.randn(1, 4, 5)
    dummy = {op: (lambda call: Cost.from_macs(1000)) for op in ("aten::linear", "aten::addmm")}
    macs = count(model, (x,), tracer, handlers=dummy).by_module("macs")
    conv, inner_conv = 5 * 3 * 4 * 4, 5 * 1 * 2 * 2
    assert macs == {
        "": 2000 + conv + inner_conv,
        "submod": 1000 + inner_conv,
        "submod.conv": inner_conv,
        "submod.fc": 1000,
        "fc": 1000,
        "conv": conv,
    }


class _TraceWarningNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(10, 1), nn.Linear(10, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x).item()
        warnings.warn("Dummy RuntimeWarning.", RuntimeWarning, stacklevel=1)
        if y < 0.0:
            x = self.fc2(x)
        return x + 2


@pytest.mark.parametrize("tracer", TRACERS)
def test_trace_warning_net(tracer: str) -> None:
    # fvcore: test_disable_warnings -- .item() steers a branch; fc1 ran whatever the branch
    model, x = _TraceWarningNet(), torch.randn(1, 10)
    with torch.no_grad():
        branch = model.fc1(x).item() < 0.0
    expected = 10 + (100 if branch else 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = count(model, (x,), tracer)
    # fc1's result only steers Python: every tracer counts it, jit too (#9.1)
    assert result.macs == expected and result.complete
    assert result.by_module("macs")["fc1"] == 10


@pytest.mark.parametrize("tracer", TRACERS)
def test_skip_uncalled_containers(tracer: str) -> None:
    # fvcore: test_skip_uncalled_containers_warnings -- a ModuleList is never called but holds
    # a module that is; the container includes its member
    class A(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.submod = nn.ModuleList([nn.Linear(3, 3)])

        def forward(self, x: torch.Tensor) -> Any:
            return self.submod[0](x) + 1

    model, x = A(), torch.rand(1, 3)
    assert fvcore_analysis(model, (x,)).by_module() == {"": 9, "submod": 9, "submod.0": 9}
    assert count(model, (x,), tracer).by_module("macs") == {"": 9, "submod": 9, "submod.0": 9}
