"""Issue #32: plan replays the repeated layers of rank 0's step (flopcount.step.replay) from the
model cut to 3 layers, checked against it cut to 4 (the memory timeline record for record, the
booked op events and the collectives one for one), instead of tracing every layer.

Oracle: the same plan with the replay off (``FLOPCOUNT_REUSE=0``: every layer traced, as
before), compared as whole ``PlanResult`` values (peak and every memory category, state bytes,
FLOPs and MACs by phase and operator, collectives by kind and dimension, step times, MFU/HFU),
on 6-7-layer LLaMA / GPT-2 / torch encoder stacks, batch 2, FSDP and TP, mixed precision,
autocast, the gloo backend, AdamW and SGD; and a model whose layers differ where the forward
reads, which must be traced in full."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from _layer_stacks import BATCH, SEQ, spy_on_plan_replay
from _layer_stacks import encoder as _encoder
from _layer_stacks import gpt2 as _gpt2
from _layer_stacks import ids as _ids
from _layer_stacks import llama as _llama
from torch import nn

import flopcount

pytestmark = pytest.mark.usefixtures("replay_from_six_layers")  # the replayed plans of 6-7-layer stacks (conftest)

CASES: List[Tuple[str, Callable[[], nn.Module], Callable[[], torch.Tensor], Dict[str, Any]]] = [
    ("llama-fsdp2-tp2", _llama, _ids, {"fsdp": 2, "tp": 2}),
    ("llama-fsdp4-bf16-gloo", _llama, _ids, {"fsdp": 4, "mixed_precision": "bfloat16", "backend": "gloo"}),
    ("llama-tp2-sgd-autocast", _llama, _ids, {"tp": 2, "optimizer": "sgd", "autocast": "bfloat16"}),
    ("gpt2-fsdp2-tp2", _gpt2, _ids, {"fsdp": 2, "tp": 2}),
    ("encoder-fsdp2", _encoder, lambda: torch.randn(BATCH, SEQ, 64, generator=torch.Generator().manual_seed(2)), {"fsdp": 2}),
]


def _plans(monkeypatch: pytest.MonkeyPatch, build: Callable[[], nn.Module], x: torch.Tensor, **options: Any) -> Tuple[Any, Any, List[bool]]:
    used = spy_on_plan_replay(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
        on = flopcount.plan(build, (x,), on="h100", link="nvlink4", **options)
        monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
        off = flopcount.plan(build, (x,), on="h100", link="nvlink4", **options)
    return on, off, used


@pytest.mark.parametrize("name, build, inputs, options", CASES, ids=[c[0] for c in CASES])
def test_replayed_layers_give_every_per_rank_figure_of_the_full_trace(
    monkeypatch: pytest.MonkeyPatch, name: str, build: Callable[[], nn.Module], inputs: Callable[[], torch.Tensor],
    options: Dict[str, Any],
) -> None:
    on, off, used = _plans(monkeypatch, build, inputs(), **options)
    assert used == [True, False]  # replayed with the switch on; every layer traced with it off
    assert on == off  # peak, memory categories, state bytes, FLOPs, collectives, times, MFU
    if options.get("fsdp", 1) > 1:  # FSDP wraps every layer of the whole model, not the cut one's 3
        assert on.wrapped_blocks == {"llama": 7, "gpt2": 6, "encoder": 6}[name.split("-")[0]]


class Block(nn.Module):
    def __init__(self, widen: int = 4):
        super().__init__()
        self.widen = widen
        self.up = nn.Linear(32, 128)
        self.down = nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = torch.ones(x.shape[0], self.widen * 256)  # a tensor whose size the attribute sets
        return x + self.down(torch.relu(self.up(x))) + extra.sum() * 0


class Odd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(8))
        self.layers[6].widen = 64  # the one layer that differs: a replay of layer 1 would miss its tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_layer_that_differs_where_the_forward_reads_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    on, off, used = _plans(monkeypatch, Odd, torch.randn(8, 32), fsdp=2)
    assert used == [False, False] and on == off


class Calls:
    """A plain object the layers share (as transformers' layers share their config)."""

    def __init__(self) -> None:
        self.calls = 0


class CountingLinear(nn.Module):
    """A Linear(32, 32) that counts its calls in the object it shares with the other layers and
    runs a second time on the sixth call (layer 5: neither cut run, 3 and 4 layers, reaches it)."""

    def __init__(self, shared: Calls) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)
        self.shared = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.shared.calls += 1
        x = self.linear(x)
        if self.shared.calls == 6:
            x = self.linear(x)
        return x


class Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = Calls()
        self.layers = nn.ModuleList(CountingLinear(shared) for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def test_layers_counting_their_calls_in_a_shared_object_are_planned_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # 9 Linear(32, 32) calls on 8 rows (layer 5 runs twice), each 8 x 32 x 32 MACs forward and
    # twice that backward (input and weight gradients) but the first (its input needs none);
    # before, the object every layer holds was one identity to the walk's state, layer 1 was
    # replayed for layer 5 and the plan booked 8 Linears
    on, off, used = _plans(monkeypatch, Counting, torch.randn(8, 32), optimizer="sgd")
    assert used == [False, False] and on == off
    linear = 8 * 32 * 32
    assert on.macs == {"forward": 9 * linear, "backward": (2 * 9 - 1) * linear, "optimizer": 0}


# a mode a parent's loop keeps in a global per layer, and a call counter a layer keeps in one
TWICE = {"now": False}
GLOBAL_CALLS = 0


class FlaggedLinear(nn.Module):
    """A Linear(32, 32) run a second time while the global flag is set."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        if TWICE["now"]:
            x = self.linear(x)
        return x


class Flagging(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(FlaggedLinear() for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            TWICE["now"] = i == 5
            x = layer(x)
        TWICE["now"] = False
        return x.sum()


class GloballyCountingLinear(FlaggedLinear):
    """:class:`CountingLinear` with its count in a global."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global GLOBAL_CALLS
        GLOBAL_CALLS += 1
        x = self.linear(x)
        if GLOBAL_CALLS == 6:  # the sixth call: layer 5 of the first forward
            x = self.linear(x)
        return x


class GloballyCounting(Flagging):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(GloballyCountingLinear() for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def test_layers_reading_a_global_set_per_layer_are_planned_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # as the shared-object counter above: layer 5 runs its Linear twice, so 9 calls forward (hand
    # count); before, the walk saw no global: layer 1 was replayed for layer 5 and the plan booked 8
    on, off, used = _plans(monkeypatch, Flagging, torch.randn(8, 32), optimizer="sgd")
    assert used == [False, False] and on == off
    linear = 8 * 32 * 32
    assert on.macs == {"forward": 9 * linear, "backward": (2 * 9 - 1) * linear, "optimizer": 0}


def test_layers_counting_their_calls_in_a_global_are_planned_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # the cut runs make calls 1-7 (3 and 4 layers): the counter is set back to 0 after them, so
    # the full trace makes the sixth call at layer 5 as a real forward would (9 Linears); before,
    # it started at call 8, never made the sixth, and the plan booked 8
    global GLOBAL_CALLS
    GLOBAL_CALLS = 0
    used = spy_on_plan_replay(monkeypatch)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planned = flopcount.plan(GloballyCounting, (torch.randn(8, 32),), on="h100", optimizer="sgd")
    assert used == [False]
    assert GLOBAL_CALLS == 0  # left as found (asfound; before, one forward's 8 calls, as a real step leaves it)
    linear = 8 * 32 * 32
    assert planned.macs == {"forward": 9 * linear, "backward": (2 * 9 - 1) * linear, "optimizer": 0}


class Parent(nn.Module):
    """8 Linear(64, 64) layers in a loop, each followed by a relu; ``what`` is what the loop does at
    layer 6, which neither cut run (3 and 4 layers) reaches."""

    def __init__(self, what: str = "plain") -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(8))
        self.what = what

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if self.what == "skip" and i == 6:
                continue
            if self.what == "raise" and i == 6:
                raise ValueError("layer 6 refuses")
            x = layer(x)
            if self.what == "twice" and i == 6:
                x = layer(x)
            if self.what == "cat" and i == 6:  # the repro: a big extra activation after layer 6 only
                x = torch.cat([x, x], 0)
            x = torch.relu(x)
        return x.sum()


# rows each relu sees and the rows summed at the end, by hand from the forward above (batch 512)
PARENT_ROWS = {
    "plain": ([512] * 8, 512),
    "cat": ([512] * 6 + [1024] * 2, 1024),
    "twice": ([512] * 8, 512),
    "skip": ([512] * 7, 512),
}


@pytest.mark.parametrize("what", list(PARENT_ROWS))
def test_a_parent_that_treats_a_later_layer_otherwise_is_planned_in_full(monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    # before the parent walk "cat" was replayed from layers 0-3: forward FLOPs 33,849,344
    # (every layer at 512 rows) where the step makes 38,109,184, and peak 1,560,392 B where the
    # full trace has 2,084,680 B; "twice" and "skip" likewise missed or added a layer
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    x = torch.randn(512, 64)
    on, off, used = _plans(monkeypatch, lambda: Parent(what), x, fsdp=2)
    # "skip": layer 6 gets no gradient, so each plan runs twice, the second time without its
    # optimizer state (docs/parallel.md, "Modules the forward never calls")
    assert used == ([True, False] if what == "plain" else [False] * (4 if what == "skip" else 2))
    assert on == off
    # forward FLOPs: the addmms as torch's FlopCounterMode counts them on the real forward
    # (2 * rows * 64 * 64 each), plus 1 per element of each relu and of the final sum
    # (docs/conventions.md: an elementwise op or a reduction costs 1 per element)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        Parent(what)(x)
    relu_rows, summed = PARENT_ROWS[what]
    assert on.flops["forward"] == counter.get_total_flops() + 64 * sum(relu_rows) + 64 * summed


def test_a_forward_that_fails_at_a_later_layer_fails_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    # the cut runs never reach layer 6: replayed, plan returned figures for a step that cannot run
    from flopcount.errors import FlopcountError

    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    with pytest.raises(FlopcountError, match="layer 6 refuses"):
        flopcount.plan(lambda: Parent("raise"), (torch.randn(512, 64),), fsdp=2)
