"""The facts' per-module parameter counts as one size per module, rolled up after the trace
(issue #32: the count's working set and its fixed cost), and the expert scan narrowed to the
modules that may hold experts. Oracles: torch's own walks (``named_modules``,
``module.parameters()``) and hand-counted parameter sizes."""

from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from flopcount import count_flops
from flopcount.core.model_facts import model_facts


def _owned_by_torch(model: nn.Module) -> Dict[str, int]:
    """Each module's subtree parameters by torch's ``parameters()`` (a tensor once), lazy left out."""
    found: Dict[str, int] = {}
    for name, module in model.named_modules():
        size = sum(p.numel() for p in module.parameters() if not isinstance(p, nn.parameter.UninitializedParameter))
        if size:
            found[name] = size
    return found


def _blocks(n: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(6, 8),
        *[nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.LayerNorm(8), nn.Identity())) for _ in range(n)],
        nn.LazyLinear(3),
    )


def test_owned_of_a_model_without_ties_is_rolled_up_from_one_size_per_module() -> None:
    model = _blocks(4)
    facts = model_facts(model)
    assert isinstance(facts.sizes, tuple) and len(facts.sizes) == len(facts.modules)
    # equal layers: one int object per distinct size, not one per module (the trace's working set)
    layer_sizes = [facts.sizes[i] for i, (name, _) in enumerate(facts.modules) if name.count(".") == 1 and name.endswith(".0")]
    assert len(layer_sizes) == 4 and all(size is layer_sizes[0] for size in layer_sizes)
    assert dict(facts.owned) == _owned_by_torch(model)
    # by hand: first Linear 6*8+8 = 56; each block Linear(8, 8) 72 + LayerNorm(8) 16 = 88; lazy: unknown
    assert facts.owned[""] == 56 + 4 * 88 and facts.owned["1"] == 88 and facts.owned["1.2"] == 16 and "5" not in facts.owned


def test_module_infos_carry_the_rolled_up_counts_in_a_count_batch_2_train_and_eval() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.Flatten(), nn.Linear(4 * 6 * 6, 5)))
    x = torch.randn(2, 3, 8, 8)
    expected = {name: sum(p.numel() for p in m.parameters()) for name, m in model.named_modules()}
    for training in (True, False):
        model.train(training)
        for tracer in ("auto", "dispatch", "jit"):
            result = count_flops(model, (x,), tracer=tracer)
            assert {m.name: m.params for m in result.modules} == expected, (training, tracer)
            assert model.training is training


def test_a_tie_or_an_alias_keeps_the_exact_count_per_name() -> None:
    tied = _blocks(2)
    tied[1][0].weight = tied[2][0].weight  # a tie between two layers
    facts = model_facts(tied)
    assert not isinstance(facts.sizes, tuple)
    assert {k: v for k, v in facts.owned.items() if v} == _owned_by_torch(tied)
    assert facts.owned[""] == 56 + 2 * 88 - 64  # the tied (8, 8) weight once


def test_experts_are_looked_for_only_where_they_may_be() -> None:
    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.num_experts = 4
            self.w = nn.Parameter(torch.zeros(4, 3, 5))

    class Moe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = nn.Linear(3, 4)
            self.block = Experts()
            self.experts = nn.ModuleList(nn.Linear(3, 3) for _ in range(4))

    model = nn.Sequential(nn.Linear(3, 3), Moe())
    model.config = type("Config", (), {"num_experts_per_tok": 1})()  # type: ignore[assignment]
    facts = model_facts(model)
    assert [facts.modules[i][0] for i in facts.experts] == ["1.block", "1.experts"]
    # by hand: total 12 + 16 + 60 + 4 * 12 = 136; one of four experts active in each block:
    # 136 - 3/4 * 60 - 3/4 * 48 = 55
    assert facts.summary.total == 136 and facts.summary.active == 55


def test_module_infos_equal_the_dataclass_built_from_torchs_walk() -> None:
    from flopcount.core.results import ModuleInfo

    model = _blocks(3)
    facts = model_facts(model)
    calls = {name: i % 3 for i, (name, _) in enumerate(model.named_modules())}
    expected = [
        ModuleInfo(name, type(m).__name__, name.count(".") + 1 if name else 0, calls[name],
                   sum(p.numel() for p in m.parameters() if not isinstance(p, nn.parameter.UninitializedParameter)))
        for name, m in model.named_modules()
    ]
    infos = facts.module_infos(calls)
    assert infos == expected and [hash(i) for i in infos] == [hash(i) for i in expected]
    assert [repr(i) for i in infos] == [repr(i) for i in expected]
