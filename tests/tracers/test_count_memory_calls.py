"""The module-call counts of a count with replayed layers (issue #32's memory target, branch
countmem2): a replay adds its modules' calls to the trace's counts when they are read, after the
forward, not an entry per replayed module while the forward runs; the counts are the ones a count
without replays makes, in the same order (``decoding.counted`` iterates them)."""

from __future__ import annotations

import sys
from typing import Any, List

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount import count_flops
from flopcount.core.inputs import prepare_call
from flopcount.tracers import _reuse, trace
from tests.tracers._tiny_llama import tiny_llama

pytest.importorskip("transformers")

LAYERS = 24


def _llama_like(layers: int = LAYERS, device: str = "meta") -> nn.Module:
    return tiny_llama(layers, device=device)


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class Outer(nn.Module):
    """Repeated blocks of repeated blocks, one of them run twice."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.ModuleList([Inner() for _ in range(3)])
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.inner:
            x = block(x)
        return self.norm(self.inner[0](x))


class Other(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.proj(x))


class Nested(nn.Module):
    """Replays, then a first call of another kind (its counts read while the forward runs), then
    replays again, a shared block, and a stack of blocks of blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.ModuleList([Outer() for _ in range(3)])
        self.between = Other()
        self.second = nn.ModuleList([Outer() for _ in range(2)])
        self.shared = Inner()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.first:
            x = block(x)
        x = self.shared(self.between(x))
        for block in self.second:
            x = block(x)
        return self.head(self.shared(x))


def _calls(monkeypatch: Any, model: nn.Module, inputs: Any, reuse: bool, tracer: str) -> List[Any]:
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1" if reuse else "0")
    run = trace(model, prepare_call(inputs), tracer=tracer)
    if reuse:
        assert int(run.shape_cache.get("reused_calls", 0)) > 0, "nothing replayed: the case tests nothing"
    return list(run.module_calls.items())


@pytest.mark.parametrize("device", ["cpu", "meta"])  # real weights (a lazy fake copy), a meta model
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("case", ["llama", "nested"])
def test_module_calls_with_replays_are_those_without_in_the_same_order(monkeypatch, device, train, case):
    # the oracle: the same count without replays (every module's call seen by the stack's hooks).
    # Replays are the default tracer's ("auto"): "dispatch" and "jit" run every call
    tracer = "auto"
    torch.manual_seed(0)
    if case == "llama":
        model = _llama_like(6, device=device).train(train)
        inputs: Any = (torch.zeros(2, 16, dtype=torch.long, device=device),)  # batch 2
    else:
        with torch.device(device):
            model = Nested().train(train)
        inputs = (torch.randn(2, 5, 8, device=device),)  # batch 2
    before = snapshot(model) if device == "cpu" else None  # a meta tensor has no values to compare
    off = _calls(monkeypatch, model, inputs, False, tracer)
    on = _calls(monkeypatch, model, inputs, True, tracer)
    assert on == off
    if before is not None:
        assert_same_state(model, before)
    if case == "nested":  # by hand: each Outer runs inner[0] twice; shared runs twice
        calls = dict(on)
        assert calls["first.1.inner.0"] == 2 and calls["first.1.inner.0.a"] == 2 and calls["first.2.inner.1"] == 1
        assert calls["second.1.inner.0.b"] == 2 and calls["shared"] == 2 and calls["shared.a"] == 2
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    rows = [(m.name, m.calls) for m in count_flops(model, inputs, tracer=tracer).modules]
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    assert rows == [(m.name, m.calls) for m in count_flops(model, inputs, tracer=tracer).modules]


def test_a_replayed_layer_adds_no_module_call_entry_while_the_forward_runs(monkeypatch):
    """While the forward runs, the stack's counts hold the traced modules' names only: the first
    layer's 13 modules, each replayed layer's own call (it passes the stack's hooks), and the
    modules outside the layers. Before: every replayed layer's 13 names, ~0.3 KiB per 70B layer
    alive through the trace (a dictionary entry per module)."""
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    model = _llama_like()
    seen: List[int] = []
    deferred: List[int] = []
    replay = _reuse.Reuse._replay

    def counted(self: Any, *args: Any) -> Any:
        out = replay(self, *args)
        seen.append(len(self._modules.calls))
        deferred.append(sys.getsizeof(getattr(self, "_marks", ())) + sys.getsizeof(getattr(self, "_replayed", ())))
        return out

    monkeypatch.setattr(_reuse.Reuse, "_replay", counted)
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")  # batch 2
    run = trace(model, prepare_call((ids,)))
    assert len(seen) == LAYERS - 1  # every layer but the first replayed
    per_layer = sum(1 for name, _ in model.named_modules() if name.startswith("model.layers.3.") or name == "model.layers.3")
    outside = sum(1 for name, _ in model.named_modules() if not name.startswith("model.layers."))
    # the last replay: layer 0's modules, layers 1..L-1's own names, at most every module outside the layers
    assert seen[-1] <= per_layer + (LAYERS - 1) + outside, seen[-1]  # main: 13 per layer (~312 here)
    # what the deferral holds per replay: two references and two machine integers (a list and an
    # array growing by CPython's over-allocation: at most 1/8 + 6 slots beyond, bounded here by 2x)
    assert (deferred[-1] - deferred[0]) / (len(deferred) - 1) <= 2 * (2 * 8 + 2 * 8), deferred
    # after the forward, every replayed layer's modules are in (each called once): the flush
    assert sum(1 for name in run.module_calls if name.startswith("model.layers.")) == per_layer * LAYERS


def _left_in_free_lists(monkeypatch: Any, layers: int, whole: bool) -> int:
    """Bytes a trace (``whole``: a count) leaves allocated that a full collection frees, with its
    result still held: blocks CPython's free lists keep (a tuple freed goes to its size's list,
    up to 2,000 per size) and garbage. ``tracemalloc`` counts them, and so does the count's peak."""
    import gc
    import tracemalloc

    from flopcount.core.model_facts import model_facts

    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    model = _llama_like(layers).eval()
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")  # batch 2
    facts = model_facts(model)

    def run() -> Any:
        return count_flops(model, (ids,)) if whole else trace(model, prepare_call((ids,)), facts=facts)

    run()  # warm
    gc.collect()  # empties the free lists
    tracemalloc.start()
    try:
        kept = run()
        raw = tracemalloc.get_traced_memory()[0]
        gc.collect()
        live = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return raw - live


@pytest.mark.parametrize("whole", [False, True], ids=["trace", "count"])
def test_a_replayed_layer_leaves_no_tuple_blocks_in_the_free_lists(monkeypatch, whole):
    """CPython 3.11 builds a tuple from a generator or a ``map`` (length unknown) with ``malloc``
    and ``realloc``, never from its free list, yet puts it on the free list when it is freed: each
    such tuple made and let go per module left a block there (the keys of replayed layers, their
    signatures, the cache slots a first call describes: 2,195 B per layer after a trace on main
    ed82cd9, 3,020 after a count; ~2 KiB per 70B layer at the count's peak)."""
    shallow, deep = 8, 24
    per_layer = (_left_in_free_lists(monkeypatch, deep, whole) - _left_in_free_lists(monkeypatch, shallow, whole)) / (deep - shallow)
    tuple_of = lambda n: 16 + 24 + 8 * n  # collector header, header, items
    if not whole:
        # the trace still holds its records: at most one 3-tuple per layer (a first call given the
        # KV cache describes every slot as (slot, its attributes, its description))
        bound = tuple_of(3)
    else:
        # the result holds no record: a replay's names (13), the stack it was called under (2), its
        # (record, costs) pair, and the 3-tuple above, each freed to its free list once booked
        bound = tuple_of(13) + tuple_of(2) + tuple_of(2) + tuple_of(3)
    assert per_layer <= bound, (per_layer, bound)


def test_the_facts_walk_holds_no_list_per_module(monkeypatch):
    """The facts' walk kept each module's names in a list of its own until the walk ended (to find
    modules under several names): 13 lists of one name per LLaMA layer, 64 B each (a list object of
    16 + 40 B and its one-item array of 8), ~0.8 KiB per layer of the facts' peak. Now a module's
    first name is held as itself, a list made only for a module met again. Read while the walk's
    locals are alive: when it builds the facts."""
    import gc

    from flopcount.core import model_facts as facts_module

    model = _llama_like(8)
    names = {name for name, _ in model.named_modules()}
    found: List[int] = []
    made = facts_module.ModelFacts

    def lists() -> int:  # lists of one of the model's module names, alive now
        return sum(1 for o in gc.get_objects() if type(o) is list and len(o) == 1 and type(o[0]) is str and o[0] in names)

    def counting(*args: Any, **kwargs: Any) -> Any:
        found.append(lists())
        return made(*args, **kwargs)

    monkeypatch.setattr(facts_module, "ModelFacts", counting)
    gc.collect()
    before = lists()  # the process's own (none of the walk's)
    facts_module.model_facts(model)
    assert [n - before for n in found] == [0], (found, before)  # main: one per module (8 layers: 13 x 8 + 7)
    # a module under two names: one list, of both
    shared = nn.Linear(2, 2)
    aliased = nn.Sequential(shared, nn.ReLU(), shared)
    monkeypatch.setattr(facts_module, "ModelFacts", made)
    assert facts_module.model_facts(aliased).aliases == {"0": ("0", "2")}
