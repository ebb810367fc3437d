"""A count's FakeTensorMode (and its fake maker) handed on to the next count (issue #32, branch
`resnet`): a mode's constructor records the Python stack and a maker checks its first fake, fixed
costs of every count. What a count leaves in its mode must not reach the next one. Oracles:
``FlopCounterMode`` run live on the same model and inputs (``torch_contraction_flops``: 2 FLOPs
per MAC of the contractions) and MACs derived by hand."""

from __future__ import annotations

import copy
import threading
from typing import Any, List

import pytest
import torch
from conftest import torch_contraction_flops
from torch import nn

from flopcount import count_flops
from flopcount.tracers import dispatch
from flopcount.tracers.fake import copies


class _Net(nn.Module):
    """conv -> batch norm -> relu -> pool -> linear: the ResNet ops, small."""

    def __init__(self, width: int = 6, kernel: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, kernel, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _macs(batch: int, width: int, kernel: int, size: int) -> int:
    """By hand: a 3 -> width conv of kernel k, padding 1, on size x size: an output of
    (size + 2 - k + 1)^2 positions, each width * 3 * k * k MACs; the linear width * 5 per sample."""
    out = size + 2 - kernel + 1
    return batch * (width * out * out * 3 * kernel * kernel + width * 5)


def test_a_count_gives_its_mode_to_the_next() -> None:
    """Two counts in a row: the second runs under the mode the first gave back (fails before this
    change: every count made its own), and both count what the hand formula says."""
    torch.manual_seed(0)
    model, x = _Net().eval(), torch.randn(2, 3, 8, 8)
    first = count_flops(model, x)
    idle = [mode for mode, _ in copies._IDLE]
    assert idle, "the count gave its mode back"
    seen: List[Any] = []
    dispatch.trace(model, (x,), fake_copy=True, on_output=lambda out: seen.append(out.fake_mode))
    assert seen and seen[0] in idle  # taken from the pool
    assert seen[0] not in [mode for mode, _ in copies._IDLE]  # its fakes were handed on: not given back
    second = count_flops(model, x)
    assert first.macs == second.macs == _macs(2, 6, 3, 8)


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_model_changed_between_counts_is_counted_as_it_is_now(tracer: str, train: bool) -> None:
    """The second count follows what changed since the first: a wider conv with a larger kernel
    (new parameters), another batch and image size; totals as FlopCounterMode counts them live and
    as the hand formula says, in train and eval mode, with every tracer."""
    torch.manual_seed(0)
    model = _Net(6, 3).train(train)
    x = torch.randn(2, 3, 8, 8)
    first = count_flops(model, x, tracer=tracer)
    assert first.macs == _macs(2, 6, 3, 8)
    assert 2 * first.macs == torch_contraction_flops(copy.deepcopy(model), (x,))
    model.conv = nn.Conv2d(3, 6, 5, padding=1, bias=False)
    y = torch.randn(3, 3, 10, 10)
    second = count_flops(model, y, tracer=tracer)
    assert second.macs == _macs(3, 6, 5, 10)
    assert 2 * second.macs == torch_contraction_flops(copy.deepcopy(model), (y,))
    assert model.training is train


_HELD: List[torch.Tensor] = []


class _UsesAGlobal(nn.Module):
    """Multiplies by a real tensor it holds nowhere the copy sees (a global): the fake mode
    converts it on use, and remembers it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ _HELD[0]


def test_a_global_tensor_resized_between_counts() -> None:
    """A real tensor the forward reaches through a global is converted by the count's mode, which
    remembers it: resized in place before the next count, that count must see the new shape (a
    mode that converted anything is not handed on)."""
    _HELD[:] = [torch.randn(4, 3)]
    model, x = _UsesAGlobal(), torch.randn(2, 5, 4)
    try:
        first = count_flops(model, x)
        assert first.macs == 2 * 5 * 4 * 3  # by hand: (2, 5, 4) @ (4, 3)
        with torch.no_grad():
            _HELD[0].resize_(4, 7)
        second = count_flops(model, x)
        assert second.macs == 2 * 5 * 4 * 7
        assert 2 * second.macs == torch_contraction_flops(model, (x,))
    finally:
        _HELD.clear()


class _NeedsAValue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = int(x.abs().sum().item() > -1) + 1  # a value: not countable on fakes
        for _ in range(steps):
            x = self.fc(x)
        return x


def test_a_count_that_fell_back_leaves_the_next_one_right() -> None:
    """A forward that needs a value fails on fakes (counted by a real run instead); the modes the
    pool holds afterwards are as new, and the next counts are right (2 linears of 4 x 4 on 3 rows)."""
    torch.manual_seed(0)
    model, x = _NeedsAValue(), torch.randn(3, 4)
    assert count_flops(model, x).macs == 2 * 3 * 4 * 4
    assert all(copies._as_made(mode) for mode, _ in copies._IDLE)
    net, y = _Net().eval(), torch.randn(2, 3, 8, 8)
    assert count_flops(net, y).macs == _macs(2, 6, 3, 8)
    assert count_flops(model, x).macs == 2 * 3 * 4 * 4


def test_threads_counting_at_once_each_hold_their_own_mode() -> None:
    """Four threads count models of different widths at once, many times: each count equals its
    hand formula (a mode held by two counts at once would mix their fakes)."""
    errors: List[str] = []
    start = threading.Barrier(4)

    def work(width: int) -> None:
        torch.manual_seed(width)
        model, x = _Net(width).eval(), torch.randn(2, 3, 8, 8)
        start.wait()
        for _ in range(15):
            got = count_flops(model, x).macs
            if got != _macs(2, width, 3, 8):
                errors.append(f"width {width}: {got}")

    threads = [threading.Thread(target=work, args=(w,)) for w in (2, 3, 4, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(copies._IDLE) <= copies._POOL_SIZE
    modes = [mode for mode, _ in copies._IDLE]
    assert len({id(m) for m in modes}) == len(modes)
