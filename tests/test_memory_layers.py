"""Issue #32: estimate_memory replays a model's repeated layers (flopcount.step.replay) from a
3-layer run checked by a 4-layer one instead of tracing every layer.

Oracles: the same estimate with the replay off (``FLOPCOUNT_REUSE=0``: every layer traced, as
before), compared as whole ``MemoryEstimate`` values (peak, categories at the peak, peak module
and phase, every module's calls, activation bytes and peak, warnings), on tiny LLaMA / GPT-2 /
BERT / torch encoder stacks of 6-8 layers, batch 2, inference, forward+backward, SGD / Adam /
AdamW / Adagrad, autocast; torch's MemTracker on a real cpu run of the same step; and models built to break
a replay (a layer differing in one attribute the forward reads, a hooked layer), which must be
traced in full.
"""

from __future__ import annotations

import collections
import copy
import gc
import warnings
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import pytest
import torch
from _layer_stacks import BATCH, SEQ, VOCAB, estimates_on_and_off, llama
from _layer_stacks import bert as _bert
from _layer_stacks import encoder as _encoder
from _layer_stacks import gpt2 as _gpt2
from _layer_stacks import ids as _ids
from _live_oracles import warmed_step_peak
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount.memory.estimate import estimate_memory

pytestmark = pytest.mark.usefixtures("replay_from_six_layers")  # the replay's exactness tests run on 6-8-layer stacks (conftest)

MemTracker = pytest.importorskip("torch.distributed._tools.mem_tracker").MemTracker


def _llama() -> nn.Module:
    return llama(intermediate_size=96)


class Block(nn.Module):
    """A residual MLP block; ``widen`` sets the hidden width the forward makes (read at run time)."""

    def __init__(self, width: int = 32, widen: int = 4):
        super().__init__()
        self.widen = widen
        self.up = nn.Linear(width, width * 4)
        self.down = nn.Linear(width * 4, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        extra = torch.ones(x.shape[0], self.widen * 1024)  # a tensor whose size the attribute sets
        return x + self.down(h) + extra.sum() * 0


class Blocks(nn.Module):
    def __init__(self, n: int = 8, odd: Optional[int] = None):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        if odd is not None:
            self.blocks[odd].widen = 64  # the one layer that differs: its forward makes 16x the tensor
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


CASES: Dict[str, Tuple[Callable[[], nn.Module], Callable[[], Tuple[Any, Dict[str, Any]]]]] = {
    "llama": (_llama, lambda: ((), {"input_ids": _ids(), "labels": _ids()})),
    "gpt2": (_gpt2, lambda: ((_ids(),), {})),
    "bert": (_bert, lambda: ((_ids(),), {})),
    "encoder": (_encoder, lambda: ((torch.randn(BATCH, SEQ, 64, generator=torch.Generator().manual_seed(2)),), {})),
    "blocks": (Blocks, lambda: ((torch.randn(BATCH * 4, 32, generator=torch.Generator().manual_seed(3)),), {})),
}
STEPS: Dict[str, Dict[str, Any]] = {
    "inference": {},
    "fwd+bwd": {"backward": True},
    "sgd": {"backward": True, "optimizer": "sgd-momentum"},
    "adam": {"backward": True, "optimizer": "adam"},
    "adagrad": {"backward": True, "optimizer": "adagrad"},
    "adamw-autocast": {"backward": True, "optimizer": "adamw", "autocast": torch.bfloat16},
}
# BERT's forward + backward without an optimizer is not here: tests/test_memory_replay_module_peaks.py's
# [bert-train-fwd+bwd] runs the same call (this file's bert(), torch.manual_seed(0), train mode, _ids(),
# backward=True, replay on and off) and asserts what this test does (replay taken, on == off, the
# model left as found) and every module row against MemTracker besides
GRID = [
    ("llama", "inference"), ("llama", "fwd+bwd"), ("llama", "adamw-autocast"), ("llama", "sgd"),
    ("gpt2", "adam"),
    ("bert", "sgd"),
    ("encoder", "adam"),
    ("blocks", "inference"), ("blocks", "sgd"), ("blocks", "adagrad"),
]


_estimates = estimates_on_and_off


@pytest.mark.parametrize("case, step", GRID, ids=[f"{c}-{s}" for c, s in GRID])
def test_replayed_layers_give_every_figure_of_the_full_trace(monkeypatch: pytest.MonkeyPatch, case: str, step: str) -> None:
    build, inputs = CASES[case]
    torch.manual_seed(0)
    model = build().train()
    args, kwargs = inputs()
    before = snapshot(model)
    on, off, used = _estimates(monkeypatch, model, args, kwargs, **STEPS[step])
    assert used == [True, False]  # replayed with the switch on; traced in full with it off
    assert on == off  # peak, categories at the peak, peak module and phase, every module's row, warnings
    assert_same_state(model, before)


def test_the_replay_matches_torchs_memtracker_on_a_real_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # the oracle: torch's own MemTracker around the same step run for real on a copy (Adam
    # warmed by one step, so its state exists; forward, sum loss with outputs released,
    # backward, step), all 8 blocks run
    torch.manual_seed(0)
    model = Blocks()
    x = torch.randn(BATCH * 4, 32)
    on, off, used = _estimates(monkeypatch, model, (x,), {}, backward=True, optimizer="adam")
    assert used == [True, False] and on == off
    assert on.peak_bytes == warmed_step_peak(model, x, torch.optim.Adam)


def test_a_layer_that_differs_where_the_forward_reads_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # block 5 makes a 64 KiB-per-row tensor where the others make 4 KiB: a replay of block 1
    # would miss it, so the step must be traced in full (the attribute is read: the cut run refuses)
    torch.manual_seed(0)
    model = Blocks(odd=5)
    x = torch.randn(BATCH * 4, 32)
    on, off, used = _estimates(monkeypatch, model, (x,), {}, backward=True, optimizer="adamw")
    assert used == [False, False] and on == off
    # the odd block's forward keeps nothing, but its peak includes its 64 x 1024 floats per row
    assert on.module("blocks.5").peak_bytes - on.module("blocks.4").peak_bytes >= (64 - 4) * 1024 * 4 * BATCH * 4


class Calls:
    """A plain object the layers share (as transformers' layers share their config)."""

    def __init__(self) -> None:
        self.calls = 0


class CountingBlock(Block):
    """:class:`Block` that counts its calls in ``shared`` (a :class:`Calls` or a dict every layer
    holds) and makes a 64 x 1024-float-per-row tensor on the sixth call: layer 5 of a stack."""

    def __init__(self, shared: Any) -> None:
        super().__init__()
        self.shared = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.shared, dict):
            self.shared["calls"] += 1
            calls = self.shared["calls"]
        else:
            self.shared.calls += 1
            calls = self.shared.calls
        out = super().forward(x)
        if calls == 6:
            out = out + torch.ones(x.shape[0], 64 * 1024).sum() * 0
        return out


class CountingBlocks(Blocks):
    def __init__(self, shared: Any):
        super().__init__()
        self.blocks = nn.ModuleList(CountingBlock(shared) for _ in range(8))


@pytest.mark.parametrize("holder", ["object", "dict"])
def test_layers_counting_their_calls_in_shared_state_are_traced_in_full(monkeypatch: pytest.MonkeyPatch, holder: str) -> None:
    # the cut runs run 3 and 4 layers: the sixth call never happens there, so a replay of layer 1
    # missed layer 5's tensor (before: a peak of 407,852 B replayed, 2,368,812 B traced in full
    # and by MemTracker, either holder). A step that writes the layers' state is traced in full,
    # on a fresh copy (the cut runs' calls would otherwise be counted in its start)
    torch.manual_seed(0)
    shared = Calls() if holder == "object" else {"calls": 0}
    model = CountingBlocks(shared)
    x = torch.randn(BATCH * 4, 32)
    on, off, used = _estimates(monkeypatch, model, (x,), {})
    assert used == [False, False] and on == off
    assert (shared.calls if holder == "object" else shared["calls"]) == 0  # the caller's: the estimate ran on copies
    assert on.peak_bytes == _memtracker_peak(model, x, backward=False)


# a per-layer flag a parent keeps in a global, and a call counter a layer keeps in one
WIDE_LAYER = {"now": False}
GLOBAL_CALLS = 0


class FlaggedBlock(Block):
    """:class:`Block` that makes a 64 x 1024-float-per-row tensor while the global flag is set."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if WIDE_LAYER["now"]:
            out = out + torch.ones(x.shape[0], 64 * 1024).sum() * 0
        return out


class FlaggingBlocks(Blocks):
    """Sets the global flag for layer 5 only, as a parent's loop sets a mode per layer."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(FlaggedBlock() for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            WIDE_LAYER["now"] = i == 5
            x = block(x)
        WIDE_LAYER["now"] = False
        return self.head(x)


class GloballyCountingBlock(Block):
    """:class:`CountingBlock` with its count in a global: the wide tensor on the sixth call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global GLOBAL_CALLS
        GLOBAL_CALLS += 1
        out = super().forward(x)
        if GLOBAL_CALLS == 6:
            out = out + torch.ones(x.shape[0], 64 * 1024).sum() * 0
        return out


class GloballyCountingBlocks(Blocks):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(GloballyCountingBlock() for _ in range(8))


def test_a_global_flag_set_for_a_later_layer_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # the cut runs run layers 0-3, where the flag is never set: a replay of layer 1 missed layer
    # 5's tensor (before: the replay was taken, and blocks.5's row differed from the full trace's)
    torch.manual_seed(0)
    model = FlaggingBlocks()
    x = torch.randn(BATCH * 4, 32)
    on, off, used = _estimates(monkeypatch, model, (x,), {})
    assert used == [False, False] and on == off
    assert on.peak_bytes == _memtracker_peak(model, x, backward=False)


def test_a_call_counter_in_a_global_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # as the shared-state counter above, in a global: a step that writes a global its layers'
    # forwards name is traced in full, the counter set back to where the cut runs found it
    global GLOBAL_CALLS
    torch.manual_seed(0)
    model = GloballyCountingBlocks()
    x = torch.randn(BATCH * 4, 32)
    GLOBAL_CALLS = 0
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    used = []
    from flopcount.memory import estimate as estimate_module

    layered = estimate_module._layered

    def spy(*a: Any, **k: Any) -> Any:
        try:
            figures = layered(*a, **k)
        except Exception:
            used.append("state written")
            raise
        used.append(figures is not None)
        return figures

    monkeypatch.setattr(estimate_module, "_layered", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on = estimate_memory(model, (x,))
    assert GLOBAL_CALLS == 0  # left as found (asfound; before, one step's 8 calls, as a real forward leaves it)
    # before: the cut runs' 7 calls were left in the counter, so the full trace never made the
    # sixth call's tensor (a peak below MemTracker's)
    assert on.peak_bytes == _memtracker_peak(model, x, backward=False)
    assert used == ["state written", False]  # the cut runs wrote it; the fresh copy traced in full


def test_a_hooked_layer_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = Blocks()
    kept: List[torch.Tensor] = []
    handle = model.blocks[3].register_forward_hook(lambda m, args, out: kept.append(out * 2))
    try:
        x = torch.randn(BATCH * 4, 32)
        on, off, used = _estimates(monkeypatch, model, (x,), {}, backward=True, optimizer="sgd")
    finally:
        handle.remove()
    assert used == [False, False] and on == off
    assert len(model.blocks[3]._forward_hooks) == 0


def test_a_model_with_a_kv_cache_in_its_training_step_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers' LLaMA with use_cache=True builds a cache in training too and its layers
    # index it by layer_idx, the attribute that differs between layers: the cut run refuses it
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=6, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
        vocab_size=VOCAB, max_position_embeddings=64, use_cache=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).train()
    on, off, used = _estimates(monkeypatch, model, (), {"input_ids": _ids(), "labels": _ids()}, backward=True)
    assert used == [False, False] and on == off


def test_autocast_casts_freed_together_at_the_forwards_end_are_replayed_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    # GPT-2's Conv1D biases are cast by autocast and cached until the forward ends, then freed
    # all at once (addmm's backward does not keep them): every middle layer's casts die where
    # the forward's autocast ends (flopcount.step.replay's fixed piece ``released``), so the
    # 4-layer check matches the stretched template and the replay gives the full trace's figures
    # (issue ampcheck: before, the check differed by one layer's 9 x 64 bf16 biases, 1,152 B)
    torch.manual_seed(0)
    model = _gpt2().train()
    on, off, used = _estimates(monkeypatch, model, (_ids(),), {}, **STEPS["adamw-autocast"])
    assert used == [True, False] and on == off


class Conv1D(nn.Module):
    """transformers' GPT-2 Conv1D: ``x @ weight + bias`` by ``torch.addmm``."""

    def __init__(self, nx: int, nf: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out = torch.addmm(self.bias, flat, self.weight)
        return out.reshape(*x.shape[:-1], -1)


class AmpBlock(nn.Module):
    """A GPT-2-like block without attention: LayerNorm, Conv1D up, GELU, Linear down (both
    with biases, which autocast casts and caches), residual."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = Conv1D(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class AmpStack(nn.Module):
    def __init__(self, layers: int = 12, width: int = 48):
        super().__init__()
        self.blocks = nn.ModuleList(AmpBlock(width) for _ in range(layers))
        self.head = nn.Linear(width, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.mark.parametrize("step", ["fwd+bwd", "adam"])
def test_a_stack_with_cast_biases_is_replayed_under_autocast_as_memtracker_measures(monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    from _live_oracles import amp_step_peak

    from flopcount.step import replay

    width = 48
    torch.manual_seed(0)
    model = AmpStack(layers=12, width=width).train()
    x = torch.randn(BATCH, SEQ, width, generator=torch.Generator().manual_seed(4))
    before = snapshot(model)
    released: List[int] = []
    of = replay.Template.of

    def spy(*args: Any, **kwargs: Any) -> Any:
        template = of(*args, **kwargs)
        if template is not None:
            for piece in template.pieces:
                if piece.released:  # {(device, category): bytes}, "Total" among the categories
                    released.append(sum(value for (_, key), value in piece.released.items() if key != "Total"))
        return template

    monkeypatch.setattr(replay.Template, "of", spy)
    adam = step == "adam"
    on, off, used = _estimates(
        monkeypatch, model, (x,), {}, backward=True, optimizer="adam" if adam else None, autocast=torch.bfloat16,
    )
    assert_same_state(model, before)
    assert used == [True, False] and on == off
    # what one middle layer's forward leaves that dies as the forward's autocast ends: its two
    # biases' bf16 casts (Conv1D's 4 x width, Linear's width; the weights' casts stay, saved for
    # the backward; LayerNorm runs in float32 on cpu, its parameters uncast)
    bf16 = 2
    assert released == [(4 * width + width) * bf16]
    if not adam:  # with Adam the full trace itself is 2 B under MemTracker's live step here (not the replay's)
        assert on.peak_bytes == amp_step_peak(model, (x,), {}, backward=True, adam=False, amp=torch.bfloat16)


# --------------------------------------------------------------------------- the parent's forward
# The cut runs (3 and 4 layers) only ever run the parent's forward for 3 and 4 layers: a parent
# that treats a later layer otherwise must be traced in full (flopcount.step.parent_walk proves
# on the whole model that it does not). Each model below differs from a plain loop only at
# layer AT = 6 of 8, where neither cut run reaches.

AT = 6


class Parent(nn.Module):
    """8 Linear(64, 64) layers called in a loop; ``what`` is what the loop does at layer AT."""

    def __init__(self, what: str = "plain", n: int = 8):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(n))
        self.what = what

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = x
        kept: List[torch.Tensor] = []
        order = list(range(len(self.layers)))
        if self.what == "order" and len(order) > AT + 1:
            order[AT], order[AT + 1] = order[AT + 1], order[AT]
        for i in order:
            layer = self.layers[i]
            if self.what == "skip" and i == AT:
                continue
            if self.what == "raise" and i == AT:
                raise ValueError(f"layer {AT} refuses")
            if self.what == "hook" and i == AT:  # a hook that exists only while layer AT runs
                handle = layer.register_forward_hook(lambda m, args, out: torch.cat([out, out], 0))
                x = layer(x)
                handle.remove()
            elif self.what == "input" and i == AT:  # layer AT fed the model's input, not layer AT-1's output
                x = layer(first)
            else:
                x = layer(x)
            if self.what == "twice" and i == AT:
                x = layer(x)
            if self.what == "cat" and i == AT:  # the issue's repro: a big extra activation after layer AT only
                x = torch.cat([x, x], 0)
            if self.what == "keep" and i == AT:  # layer AT's output kept alive to the forward's end
                kept.append(x)
            if self.what == "grad-hook" and i == AT:  # a tensor hook: it runs in the backward, for layer AT only
                x.register_hook(lambda g: g + torch.zeros(8, *g.shape).sum(0))
            if self.what == "function" and i == AT:  # the same aten op, but a custom backward for layer AT only
                x = _WideRelu.apply(x)
            else:
                x = torch.relu(x)
        return x.sum()


class _WideRelu(torch.autograd.Function):
    """relu whose backward makes a temporary 8 times the gradient's size."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (out,) = ctx.saved_tensors
        return grad * (out > 0) + torch.zeros(8, *grad.shape).sum(0)


def _memtracker_peak(model: nn.Module, x: torch.Tensor, backward: bool) -> int:
    """torch's MemTracker around the same step run for real on a copy (forward; with backward:
    the loss the model returns, released, then backward): the peak's total bytes."""
    real = copy.deepcopy(model)
    tracker = MemTracker()
    tracker.track_external(real, x)
    with tracker:
        if backward:
            loss = real(x)
            loss.backward()
            del loss
        else:
            with torch.no_grad():
                real(x)
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return int(peak["Total"])


PARENT_CASES = [
    ("cat", True), ("twice", True), ("skip", True), ("order", True), ("hook", True), ("input", True), ("keep", False),
    ("grad-hook", True), ("function", True),
]


@pytest.mark.parametrize("what, backward", PARENT_CASES, ids=[c[0] for c in PARENT_CASES])
def test_a_parent_that_treats_a_later_layer_otherwise_is_traced_in_full(monkeypatch: pytest.MonkeyPatch, what: str, backward: bool) -> None:
    # before the parent walk each of these was replayed from layers 0-3 and got a wrong figure:
    # peaks (replayed / MemTracker's) cat 1,460,488 / 1,853,704 B, twice 1,460,488 / 1,591,560,
    # skip and input 1,460,488 / 1,329,416, hook 1,460,488 / 1,853,704, keep (inference)
    # 526,336 / 657,408, grad-hook 1,460,488 / 2,377,992, function 1,460,488 / 2,640,136; order:
    # the same peak, but layers 6 and 7's rows swapped
    torch.manual_seed(0)
    model = Parent(what)
    x = torch.randn(512, 64)  # batch 512
    before = snapshot(model)
    on, off, used = _estimates(monkeypatch, model, (x,), {}, backward=backward)
    assert used == [False, False] and on == off
    assert on.peak_bytes == _memtracker_peak(model, x, backward)
    assert_same_state(model, before)
    assert not model.layers[AT]._forward_hooks


class _SeesTheCollector(nn.Module):
    """Linear(64, 64) -> sum; records whether automatic collection is on while its forward runs
    (in a deque of the class's: the readings run copies of the module, and give a class's list,
    dict or set back its entries after them, core/state.FoundState), and raises when asked (the
    caller's collector must come back either way)."""

    seen: Deque[bool] = collections.deque()

    def __init__(self, raises: bool = False) -> None:
        super().__init__()
        self.layer = nn.Linear(64, 64)
        self.raises = raises

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(gc.isenabled())
        if self.raises:
            raise ValueError("refused")
        return self.layer(x).sum()


@pytest.mark.parametrize("reading", ["estimate_memory", "plan"])
@pytest.mark.parametrize("raises", [False, True])
def test_the_fake_steps_run_with_the_automatic_collector_paused(reading: str, raises: bool) -> None:
    # CI (torch 2.14.1) once failed test_a_parent_that_treats_a_later_layer_otherwise_is_traced_in_full[input]:
    # the estimate with reuse on gave 1,312,768 B, with it off (and MemTracker) 1,329,416 B. In a
    # fresh process with the collector's thresholds at (100, 10, 10) or (50, 10, 10) the same
    # estimate gave one figure or the other, and plan(fsdp=2) of that parent 1,165,064 or
    # 1,296,136 B at (700, 10, 10): a collection landing inside flopcount's fake step (its
    # trackers hold fakes weakly) moved the peak. The steps now run with automatic collection
    # paused, and the caller's collector (on, its thresholds) is as it was after, also on failure.
    from flopcount import plan

    thresholds = gc.get_threshold()
    x = torch.randn(4, 64)  # batch 4
    _SeesTheCollector.seen = collections.deque()
    model = _SeesTheCollector(raises)

    assert gc.isenabled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if reading == "estimate_memory":
                estimate_memory(model, (x,), {}, backward=True)
            else:
                plan(lambda: _SeesTheCollector(raises), (x,), fsdp=2, optimizer=None)
        except Exception:
            assert raises
    assert gc.isenabled() and gc.get_threshold() == thresholds
    seen = _SeesTheCollector.seen
    assert seen and not any(seen)


class Repro(nn.Module):
    """The issue's repro: ``torch.cat([x, x], 0)`` after layer 6 of 8 only."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x))
            if i == 6:
                x = torch.cat([x, x], 0)
        return x.sum()


def test_the_issues_repro_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # replayed it gave 1,460,488 B; the truth (MemTracker on the real step, and every layer
    # traced) is 1,984,776 B
    torch.manual_seed(0)
    model = Repro()
    x = torch.randn(512, 64)
    on, off, used = _estimates(monkeypatch, model, (x,), {}, backward=True)
    assert used == [False, False] and on == off
    assert on.peak_bytes == _memtracker_peak(model, x, True) == 1_984_776


@pytest.mark.parametrize("backward", [False, True], ids=["inference", "fwd+bwd"])
def test_a_plain_parent_loop_is_still_replayed_and_exact(monkeypatch: pytest.MonkeyPatch, backward: bool) -> None:
    torch.manual_seed(0)
    model = Parent("plain")
    x = torch.randn(512, 64)
    on, off, used = _estimates(monkeypatch, model, (x,), {}, backward=backward)
    assert used == [True, False] and on == off
    assert on.peak_bytes == _memtracker_peak(model, x, backward)


def test_the_parent_walk_leaves_the_process_as_found(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    torch.manual_seed(0)
    model = Parent("plain")
    x = torch.randn(512, 64)
    enabled, grad = gc.isenabled(), torch.is_grad_enabled()
    rng = torch.get_rng_state()
    on, _, used = _estimates(monkeypatch, model, (x,), {}, backward=True)
    assert used == [True, False]
    assert gc.isenabled() == enabled and torch.is_grad_enabled() == grad
    assert torch.equal(torch.get_rng_state(), rng)
    assert all("forward" not in vars(layer) for layer in model.layers)


class Widening(Blocks):
    """Blocks whose forward widens block AT for its one call (an attribute its forward reads) and
    puts it back: every layer is the same before and after the forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            if i == AT:
                block.widen = 64
            x = block(x)
            if i == AT:
                block.widen = 4
        return self.head(x)


def test_a_parent_that_changes_a_later_layer_for_its_call_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # replayed, block 6's 64 x 1024 floats per row were missed (block 1's 4 x 1024 stood in): a
    # peak of 542,296 B where the step makes 2,403,628 B
    torch.manual_seed(0)
    model = Widening()
    x = torch.randn(BATCH * 4, 32)
    on, off, used = _estimates(monkeypatch, model, (x,), {}, backward=True)
    assert used == [False, False] and on == off
    loss_model = _Summed(model)  # MemTracker's step: the loss is the sum of the outputs, as the estimate's default
    assert on.peak_bytes == _memtracker_peak(loss_model, x, True)
    assert all(block.widen == 4 for block in model.blocks)


class _Summed(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).sum()


def test_a_forward_that_fails_at_a_later_layer_fails_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    # the cut runs never reach layer 6: replayed, the estimate returned a figure for a step that
    # cannot run; the walk of the whole forward fails there, the step is traced in full and fails
    import gc

    from flopcount.errors import FlopcountError

    torch.manual_seed(0)
    model = Parent("raise")
    x = torch.randn(512, 64)
    before = snapshot(model)
    enabled = gc.isenabled()
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    with pytest.raises(FlopcountError, match="layer 6 refuses"):
        estimate_memory(model, (x,), backward=True)
    assert gc.isenabled() == enabled and torch.is_grad_enabled()
    assert_same_state(model, before)
    assert all("forward" not in vars(layer) for layer in model.layers)
