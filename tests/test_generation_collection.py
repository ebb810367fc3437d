"""The cyclic garbage collector around count_generation's loop on fake copies (issue #32's
count_generation target: LLaMA-2-70B, 128 new tokens, under 1 s).

Finding: each forward traced on fake copies holds a copy of the model while it runs, so the
collector's young collections promote it to the oldest generation, and on the 70B count that
made 2 to 4 full collections of the whole process (~430,000 objects) per count: 0.4-0.7 s CPU
of 1.0-1.4 s. The loop now pauses automatic collection and collects the young generations
itself, and leaves the collector's switch as found. Oracles: gc.callbacks (which generation each
collection walked), gc.isenabled() before and after, and the forward count derived by hand."""

from __future__ import annotations

import gc
import threading
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import torch
from torch import nn

import flopcount.core.collection as collection
import flopcount.decoding.counted as counted
from flopcount.errors import TraceError
from flopcount.generation.count import count_generation

transformers = pytest.importorskip("transformers")

B, P = 2, 5


def _llama(device: str) -> nn.Module:
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=128,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None
    return model.eval()


class Collections:
    """Every collection that starts while a test runs: its generation, whether automatic
    collection was on (off: one the loop ran itself) and whether a forward was being traced."""

    def __init__(self) -> None:
        self.seen: List[Tuple[int, bool, bool]] = []
        self.inside = False

    def __call__(self, phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            self.seen.append((info["generation"], gc.isenabled(), self.inside))

    def during_forwards(self) -> List[int]:
        return [generation for generation, _, inside in self.seen if inside]

    def by_the_loop(self) -> List[int]:
        return [generation for generation, enabled, _ in self.seen if not enabled]


@pytest.fixture
def collections(monkeypatch: pytest.MonkeyPatch) -> Iterator[Collections]:
    spy = Collections()
    run = counted.Counter._run

    def traced(self: counted.Counter, prepared: Any, *named: Any) -> Any:  # named: the forward's name, its step
        spy.inside = True
        try:
            return run(self, prepared, *named)
        finally:
            spy.inside = False

    monkeypatch.setattr(counted.Counter, "_run", traced)
    gc.callbacks.append(spy)
    try:
        yield spy
    finally:
        gc.callbacks.remove(spy)


def test_a_fake_loop_walks_no_old_generation(collections: Collections) -> None:
    """Every object made before the count frozen out of the collector's reach, and thresholds
    (700, 1, 1): any object promoted past a young collection would start a full collection at
    the next one. Before: full (generation 2) collections started inside the loop's forwards;
    now none does."""
    model = _llama("meta")
    ids = torch.zeros(B, P, dtype=torch.int64, device="meta")
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    try:
        gc.collect()  # the old generation is empty now: its size, the bar for a full collection, is 0
        gc.set_threshold(700, 1, 1)
        collections.seen.clear()
        result = count_generation(model, ids, new_tokens=12)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    assert 2 not in collections.during_forwards(), collections.seen
    assert collections.by_the_loop() == [1]  # the loop's young garbage, collected once before the call returns
    assert gc.isenabled()
    assert len(result.steps) == 11


def test_young_generations_are_collected_between_forwards(monkeypatch: pytest.MonkeyPatch, collections: Collections) -> None:
    """With a limit of 0 the loop collects its young generations after every forward: with
    trace_every_step, the prefill and N - 1 steps (N forwards), then once on exit; no automatic
    collection runs while the loop has it off."""
    monkeypatch.setattr(collection, "YOUNG_LIMIT", 0)
    model = _llama("meta")
    new_tokens = 6
    collections.seen.clear()
    count_generation(model, torch.zeros(B, P, dtype=torch.int64, device="meta"), new_tokens=new_tokens, trace_every_step=True)
    assert collections.by_the_loop() == [1] * (new_tokens + 1)
    assert [g for g, enabled, inside in collections.seen if enabled and inside] == []  # none automatic in a forward
    assert gc.isenabled()


def test_the_switch_is_left_as_found(collections: Collections) -> None:
    model = _llama("meta")
    ids = torch.zeros(B, P, dtype=torch.int64, device="meta")
    gc.disable()
    try:
        collections.seen.clear()
        count_generation(model, ids, new_tokens=8)
        assert not gc.isenabled()
        assert collections.seen == []  # the caller turned collection off: none runs here either
    finally:
        gc.enable()
    count_generation(model, ids, new_tokens=8)
    assert gc.isenabled()


class _Fails(nn.Module):
    """A decoder whose forward raises on its third call (a decode step), fake copies or not."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 8)
        self.head = nn.Linear(8, 64)
        self.calls = 0

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = True) -> Dict[str, Any]:
        self.calls += 1
        if past_key_values is not None and past_key_values.shape[1] > P:
            raise ValueError("no room in the cache")
        x = self.embed(input_ids)
        cache = x if past_key_values is None else torch.cat([past_key_values, x], dim=1)
        return {"logits": self.head(x), "past_key_values": cache}


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_the_switch_is_left_as_found_when_the_forward_raises(device: str) -> None:
    with torch.device(device):
        model = _Fails()
    with pytest.raises(TraceError, match="no room in the cache"):
        count_generation(model, torch.zeros(B, P, dtype=torch.int64, device=device), new_tokens=6)
    assert gc.isenabled()


def test_only_fake_loops_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real tensors' garbage may hold memory: a loop on real weights leaves collection on."""
    during: Dict[str, List[bool]] = {"meta": [], "cpu": []}
    run = counted.Counter._run

    def spying(self: counted.Counter, prepared: Any, *named: Any) -> Any:
        during["meta" if self.fast else "cpu"].append(gc.isenabled())
        return run(self, prepared, *named)

    monkeypatch.setattr(counted.Counter, "_run", spying)
    for device in ("meta", "cpu"):
        count_generation(_llama(device), torch.zeros(B, P, dtype=torch.int64, device=device), new_tokens=4)
    # 4 new tokens: the prefill and 3 decode steps, each traced
    assert during == {"meta": [False] * 4, "cpu": [True] * 4}
    assert gc.isenabled()


def test_two_threads_counting_at_once_leave_collection_on() -> None:
    model = _llama("meta")
    ids = torch.zeros(B, P, dtype=torch.int64, device="meta")
    start = threading.Barrier(2)
    done: List[int] = []
    failed: List[BaseException] = []

    def count() -> None:
        try:
            start.wait()
            done.append(count_generation(model, ids, new_tokens=10).macs)
        except BaseException as exc:  # reported below
            failed.append(exc)

    threads = [threading.Thread(target=count) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failed, failed
    assert len(done) == 2 and done[0] == done[1]
    assert gc.isenabled()
