"""ModelFacts read in one walk (issue #32's per-count fixed costs): per-module parameter counts
(``owned``) under every name, the summary and the packed-weights scan, checked against torch's
own public walks (``named_modules(remove_duplicate=False)``, ``named_parameters()``,
``parameters()``) on models with ties, a module under two names, a lazy module and a
packed quantized layer."""

from __future__ import annotations

from typing import Dict

import pytest
import torch
from torch import nn

from flopcount.core.model_facts import model_facts
from flopcount.core.packed import packed_objects
from flopcount.core.params import routed_experts


def _owned_by_torch(model: nn.Module) -> Dict[str, int]:
    """Each name's parameters, a tensor once (torch's named_parameters dedupes ties), lazy left out."""
    found: Dict[str, int] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        params = [p for _, p in module.named_parameters() if not isinstance(p, nn.parameter.UninitializedParameter)]
        if params:
            found[name] = sum(p.numel() for p in params)
    return found


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.block = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6, bias=False))
        self.again = self.block  # one module under two names
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight  # a tie
        self.inner = nn.Sequential(nn.Linear(6, 3))
        self.lazy = nn.LazyLinear(4)


def test_owned_equals_torchs_walk_with_ties_aliases_and_lazy() -> None:
    model = Tied()
    facts = model_facts(model)
    assert {k: v for k, v in facts.owned.items() if v} == _owned_by_torch(model)
    assert facts.aliases == {"block": ("block", "again"), "block.0": ("block.0", "again.0"),
                             "block.1": ("block.1", "again.1"), "block.2": ("block.2", "again.2")}
    assert facts.lazy
    assert [id(p) for p in facts.parameters] == [id(p) for p in model.parameters()]
    summary = facts.summary
    assert summary.total == sum(p.numel() for p in model.parameters() if not isinstance(p, nn.parameter.UninitializedParameter))


def test_owned_of_a_module_shared_across_branches() -> None:
    shared = nn.Linear(5, 5)
    model = nn.Sequential(nn.Sequential(shared, nn.Linear(5, 2)), nn.Sequential(nn.Linear(2, 5), shared))
    facts = model_facts(model)
    assert {k: v for k, v in facts.owned.items() if v} == _owned_by_torch(model)
    assert facts.owned[""] == sum(p.numel() for p in model.parameters())  # the shared Linear once at the root


def test_packed_weights_found_in_the_same_walk() -> None:
    engines = torch.backends.quantized.supported_engines
    if "fbgemm" not in engines and "qnnpack" not in engines:
        pytest.skip("no quantized engine")
    model = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)), {nn.Linear})
    facts = model_facts(model)
    expected = list(packed_objects(model))
    assert [(n, id(m), id(o)) for n, m, o in facts.packed_objects] == [(n, id(m), id(o)) for n, m, o in expected]
    assert facts.packed == expected[0][0] and len(expected) == 2
    assert facts.summary.total == 8 * 4 + 4 + 4 * 2 + 2  # two packed Linears' weights and biases


def test_experts_declared_by_a_property_or_a_delegating_getattr_are_found() -> None:
    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(4, 3, 5))

        @property
        def num_experts(self) -> int:
            return 4

    class Delegating(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)
            self.w = nn.Parameter(torch.zeros(3, 2, 2))

        def __getattr__(self, name: str) -> object:
            if name == "num_local_experts":
                return 3
            return super().__getattr__(name)

    model = nn.Sequential(Experts(), Delegating())
    assert [(n, e) for n, e, _ in routed_experts(model)] == [("0", 4), ("1", 3)]
