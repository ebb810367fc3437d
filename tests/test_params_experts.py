"""Routed experts found however a module declares its expert count (core/params.py): in its
``__dict__``, as a class attribute, through its own ``__getattr__``; the summary's "active"
parameters derived by hand (every parameter less (E - k) / E of each expert block)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import summarize_parameters


class _Stacked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4, 3, 5))  # E=4 experts of 3x5: 60 parameters


class _InDict(_Stacked):
    def __init__(self) -> None:
        super().__init__()
        self.num_experts = 4


class _OnClass(_Stacked):
    num_experts = 4


class _ByGetattr(_Stacked):
    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if name == "num_local_experts":
            return 4
        return super().__getattr__(name)


@pytest.mark.parametrize("block", [_InDict, _OnClass, _ByGetattr], ids=["dict", "class", "getattr"])
def test_an_expert_block_is_found_however_its_count_is_declared(block):
    model = nn.Sequential(nn.Linear(5, 2), block())  # 12 + 60 parameters
    summary = summarize_parameters(model, experts_per_token=1)
    # 72 in all; one token touches 1 of the 4 experts: 60 * (4 - 1) // 4 = 45 inactive
    assert summary.total == 72
    assert summary.active == 72 - 45


def test_a_model_without_experts_has_no_active_figure():
    assert summarize_parameters(nn.Sequential(nn.Linear(5, 2), _Stacked()), experts_per_token=1).active is None
