"""``copies.outside_modes``: ``read`` runs once, below the torch-function modes; a ``read`` that
raises is not run a second time through the modes (the replay's ``_apply`` writes cache slots and
``_make`` makes fakes: a second run after a partial one would do that work twice)."""

from __future__ import annotations

from typing import Any, List

import pytest
import torch
from torch.overrides import TorchFunctionMode

from flopcount.tracers.fake.copies import outside_modes


class _Counting(TorchFunctionMode):
    """Counts the calls that pass through it."""

    def __init__(self) -> None:
        super().__init__()
        self.passes = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.passes += 1
        return func(*args, **(kwargs or {}))


def test_a_read_runs_once_below_the_modes() -> None:
    t = torch.zeros(2, 3)
    runs: List[int] = []

    def read(tensor: torch.Tensor) -> Any:
        runs.append(1)
        return tuple(tensor.shape), tensor.stride(), tensor.dtype

    with _Counting() as mode:
        found = outside_modes(read, [t], t)
    # one pass: the routed call itself; the three metadata reads inside go through no mode
    assert found == ((2, 3), (3, 1), torch.float32) and runs == [1] and mode.passes == 1


def test_a_read_that_raises_runs_once_and_its_error_is_raised() -> None:
    t = torch.zeros(2)
    runs: List[int] = []

    def read(tensor: torch.Tensor) -> Any:
        runs.append(1)
        raise ValueError("the read's own failure")

    with _Counting():
        with pytest.raises(ValueError, match="the read's own failure"):
            outside_modes(read, [t], t)
    assert runs == [1]  # the parent ran it again through the modes: [1, 1]


class _Refusing(TorchFunctionMode):
    """Refuses every function it does not know (as a strict mode would): the read runs through it."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is outside_modes:
            raise RuntimeError("refused")
        return func(*args, **(kwargs or {}))


def test_a_mode_that_refuses_the_call_gets_the_read_through_it() -> None:
    t = torch.zeros(4, 5)
    runs: List[int] = []

    def read(tensor: torch.Tensor) -> Any:
        runs.append(1)
        return tuple(tensor.shape)

    with _Refusing():
        assert outside_modes(read, [t], t) == (4, 5)
    assert runs == [1]
