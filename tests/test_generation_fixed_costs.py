"""count_generation's and serve's fixed costs on small models (issue #27, branch genfixed): each
shortcut gives the figures of the path it replaces, and is not taken where it must not be.

* the uncounted forward between a run's traced steps (the "catch-up": it only fills the cache)
  runs, with real weights, as the dispatch tracer runs a forward, without recording it (it was a
  full trace whose events were dropped). Oracles: a real greedy generate() under FlopCounterMode
  (each forward's FLOPs, its cache's bytes), the traced catch-up's cache tensor for tensor, the
  dispatch tracer's own TraceError for a forward that refuses the catch-up;
* transformers' "is tracing" probe answered on fakes (tracers/fake/hf_tracing.py's FakeValues)
  runs on the CPU only ops whose top-level fakes all have a followed value (an integral op of
  the token ids on meta was run there and refused), and builds an aten op's CPU arguments
  without the general container walk where they are plain (the walk still runs otherwise);
* the greedy token of a fake run on meta is taken on a meta stand-in of its logits.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest
import torch
from _live_oracles import generate_truth, held_bytes
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount.core.inputs import prepare_call
from flopcount.decoding import counted
from flopcount.decoding.counted import Counter, count_decoding
from flopcount.generation.count import count_generation
from flopcount.tracers.fake import hf_tracing

transformers = pytest.importorskip("transformers")

B, P, N, VOCAB = 2, 6, 8, 50


def _llama(device: str = "cpu") -> nn.Module:
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, vocab_size=VOCAB, max_position_embeddings=256,
    )
    config._attn_implementation = "eager"  # the matmuls FlopCounterMode sees
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None
    return model.eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, P), generator=torch.Generator().manual_seed(0))


def _traced_forwards(monkeypatch: Any) -> List[int]:
    """Each forward the dispatch tracer runs for the decoding loop (its token positions)."""
    widths: List[int] = []
    real = counted.trace

    def spy(model: nn.Module, call: Any, **options: Any) -> Any:
        ids = call.kwargs.get("input_ids")
        widths.append(int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else -1)
        return real(model, call, **options)

    monkeypatch.setattr(counted, "trace", spy)
    return widths


def test_the_catch_up_is_not_traced_and_every_figure_is_generate_s(monkeypatch: Any) -> None:
    """N = 8: 7 decode steps, one run; steps 0, 1, 2 and 6 are traced, 3..5 continued, their
    three positions fed in one forward. Before: that forward was traced too (6 traced forwards)."""
    model, ids = _llama(), _ids()
    expected, cache = generate_truth(model, ids, N)
    before, ids_before = snapshot(model), ids.clone()
    widths = _traced_forwards(monkeypatch)
    result = count_generation(model, ids, new_tokens=N)
    assert widths == [P, 1, 1, 1, 1]  # the prefill, steps 0, 1, 2 and 6; not the 3-position catch-up
    assert [2 * result.prefill.macs] + [2 * step.macs for step in result.steps] == expected
    assert result.kv_cache_bytes == held_bytes(cache)
    assert any("decode steps 3..5 were costed as the exact affine continuation" in w for w in result.warnings)
    assert_same_state(model, before)
    assert torch.equal(ids, ids_before)


def _cache_tensors(cache: Any) -> List[torch.Tensor]:
    """The K and V tensors of a transformers cache, layer by layer."""
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def test_the_uncounted_catch_up_fills_the_cache_the_traced_one_fills(monkeypatch: Any) -> None:
    """The cache the last step reads (and the greedy tokens behind it) are the traced catch-up's,
    tensor for tensor; and generate()'s cache has the same shapes."""
    model, ids = _llama(), _ids()
    light = count_decoding(model, ids, N)
    monkeypatch.setattr(Counter, "_run_uncounted", lambda self, prepared: False)  # the traced catch-up
    traced = count_decoding(model, ids, N)
    _, real = generate_truth(model, ids, N)
    pairs = list(zip(_cache_tensors(light.cache), _cache_tensors(traced.cache), _cache_tensors(real)))
    assert len(pairs) == 4  # 2 layers x (K, V)
    for a, b, c in pairs:
        assert torch.equal(a, b)
        assert a.shape == c.shape == (B, 2, P + N - 1, 8)  # (batch, KV heads, positions, head dim)
    assert [s.flops for s in light.steps] == [s.flops for s in traced.steps]


def test_the_uncounted_catch_up_is_not_taken_where_the_tracer_does_more() -> None:
    """Fake copies, a tensor without data (the tracer answers its reads), lazy modules: traced."""
    model, ids = _llama(), _ids()
    call = {"input_ids": ids, "use_cache": True}
    assert Counter(model)._run_uncounted(prepare_call((), call)) is True
    assert Counter(model)._run_uncounted(prepare_call((), {**call, "input_ids": ids.to("meta")})) is False
    assert Counter(_llama("meta"), fast=True)._run_uncounted(prepare_call((), {**call, "input_ids": ids.to("meta")})) is False
    lazy = nn.Sequential(nn.LazyLinear(4))
    assert Counter(lazy)._run_uncounted(prepare_call((torch.ones(2, 3),))) is False
    assert isinstance(lazy[0], nn.LazyLinear)  # not materialised by the refusal


class _Block(nn.Module):
    """Attention-like: each new position against every cached one (work affine in the context);
    refuses several new positions once a cache exists, and writes to itself on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if x.shape[1] > 1 and context.shape[1] > x.shape[1]:
            raise ValueError("one new position at a time")
        return self.proj(x) + (x @ context.transpose(1, 2)) @ context


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.block = _Block()
        self.head = nn.Linear(8, VOCAB)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                past_key_values: Optional[torch.Tensor] = None, use_cache: bool = True) -> Dict[str, torch.Tensor]:
        x = self.embed(input_ids)
        context = x if past_key_values is None else torch.cat([past_key_values, x], 1)
        return {"logits": self.head(self.block(x, context)), "past_key_values": context}


def test_a_catch_up_the_model_refuses_is_the_traced_error_and_leaves_the_model_as_found(monkeypatch: Any) -> None:
    """The 3-position forward raises in ``block``: the note quotes the TraceError the dispatch
    tracer raises for the same call (module named), every step is then traced, and the caller's
    module keeps its own ``calls`` (the run wrote the private twin's)."""
    torch.manual_seed(0)
    model = _Toy().eval()
    ids = _ids()
    before, ids_before = snapshot(model), ids.clone()
    widths = _traced_forwards(monkeypatch)
    result = count_generation(model, ids, new_tokens=N)
    note = next(w for w in result.warnings if "refused 3 positions in one forward" in w)
    # (the note keeps the error's first 160 characters: the module and the inputs)
    assert "(forward failed in module 'block' (dispatch tracer) with inputs () with kwargs {past_key_values=Tensor[2, 9, 8]" in note
    assert note.endswith("every decode step was traced")
    # the failed attempt traced the prefill and steps 0, 1, 2 (the catch-up was not traced); then every step
    assert widths == [P, 1, 1, 1] + [P] + [1] * (N - 1)
    # each step s: embed and head are fixed; the block's two matmuls grow by 2 x 8 x B MACs per position
    grow = [b.macs - a.macs for a, b in zip(result.steps, result.steps[1:])]
    assert grow == [2 * 8 * B] * (N - 2)
    assert model.block.calls == 0
    assert_same_state(model, before)
    assert torch.equal(ids, ids_before)


def _fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def test_an_op_of_an_unknown_fake_is_not_run_on_the_cpu(monkeypatch: Any) -> None:
    """Token ids without a value (a meta prompt): ``ids + 1`` cannot be followed; it was run on the
    CPU all the same and refused there. Ops of known values and factories are still followed, and
    an unknown value written into a known fake still forgets every value."""
    mode = _fake_mode()
    real = torch.arange(6)
    known, unknown = mode.from_tensor(real), mode.from_tensor(torch.zeros(6, dtype=torch.long))
    values = hf_tracing.FakeValues()
    values.seed([known], [real])
    ran: List[str] = []
    run = values._on_cpu_run

    def spy(func: Any, args: Any, kwargs: Any) -> Any:
        ran.append(str(func))
        return run(func, args, kwargs)

    monkeypatch.setattr(values, "_on_cpu_run", spy)
    with mode, values:
        shifted = unknown + 1
        following = known + 1
        positions = torch.arange(3)
    assert ran == ["aten.add.Tensor", "aten.arange.default"]  # before: also the first add
    assert not values.knows(shifted) and values.knows(following) and values.knows(positions)
    assert torch.equal(values._values[following], real + 1)
    with mode, values:
        following.add_(unknown)
    assert not values.knows(following) and not values.knows(positions) and not values.knows(known)


def test_an_argument_the_quick_walk_does_not_open_goes_through_run_on_cpu(monkeypatch: Any) -> None:
    """Plain lists and tuples of tensors and scalars are walked directly by run_on_cpu; anything
    else (a tuple subclass such as torch.Size) by its general walk (``flatten_tensors``), with the
    same result."""
    from flopcount.tracers.fake import values as values_module

    mode = _fake_mode()
    real = torch.arange(6)
    known = mode.from_tensor(real)
    values = hf_tracing.FakeValues()
    values.seed([known], [real])
    general: List[str] = []
    walk = values_module.flatten_tensors
    ops: List[str] = []

    def spy(tree: Any) -> Any:
        general.append(ops[-1])
        return walk(tree)

    monkeypatch.setattr(values_module, "flatten_tensors", spy)
    aten = torch.ops.aten

    def run(func: Any, args: Any, kwargs: Any) -> Any:
        ops.append(str(func))
        return values._on_cpu_run(func, args, kwargs)

    with mode:
        joined = run(aten.cat.default, ([known, known],), {"dim": 0})
        shaped = run(aten.view.default, (known, torch.Size([2, 3])), {})
        ones = run(aten.ones.default, ([2],), {"dtype": torch.long, "device": torch.device("meta")})
    assert torch.equal(joined, torch.cat([real, real])) and torch.equal(shaped, real.view(2, 3))
    assert ones.device.type == "cpu" and torch.equal(ones, torch.ones(2, dtype=torch.long))
    assert general == ["aten.view.default"]  # before: all three


def test_meta_counts_take_the_greedy_token_on_a_meta_stand_in(monkeypatch: Any) -> None:
    """A fake run on meta: the token fed back has the fake argmax's shape, stride and dtype, and
    every forward's FLOPs are generate()'s on CPU; a meta model given CPU ids keeps the fake token."""
    expected, _ = generate_truth(_llama(), _ids(), N)
    meta = count_generation(_llama("meta"), _ids().to("meta"), new_tokens=N)
    assert [2 * meta.prefill.macs] + [2 * step.macs for step in meta.steps] == expected
    fed: List[Any] = []
    advance = counted.Decoding.advance

    def spy(self: Any, output: Any) -> None:
        advance(self, output)
        fed.append(self.tokens)

    monkeypatch.setattr(counted.Decoding, "advance", spy)
    count_generation(_llama("meta"), _ids().to("meta"), new_tokens=3)
    assert [(t.device.type, tuple(t.shape), t.stride(), t.dtype) for t in fed] == [("meta", (B, 1), (1, 1), torch.int64)] * 3
    fed.clear()
    on_cpu_ids = count_generation(_llama("meta"), _ids(), new_tokens=N)
    assert [2 * on_cpu_ids.prefill.macs] + [2 * step.macs for step in on_cpu_ids.steps] == expected
    assert fed and all(t.device.type == "cpu" and isinstance(t, hf_tracing.fake_tensor_type()) for t in fed)


def test_a_continued_step_s_events_share_a_call_only_between_equal_pairs() -> None:
    """Affine.events continues each distinct (step 0, step 1) pair of calls once, as
    Affine.changes prices them: two layers whose attention grows alike share the continued call;
    a layer whose keys grow otherwise (another head count) gets its own. Step s of a (1, h, 1, c)
    x (1, h, c, d) product: c = c0 + s (the context grows by one position per step)."""
    from flopcount.core.registry import HandlerRegistry
    from flopcount.decoding.runs import Affine
    from flopcount.types import OpCall, OpEvent, TensorMeta

    def bmm(heads: int, context: int) -> OpCall:
        return OpCall("aten::bmm", {"self": TensorMeta((heads, 1, context), "float32"),
                                    "mat2": TensorMeta((heads, context, 8), "float32")},
                      (TensorMeta((heads, 1, 8), "float32"),))

    def step(context: int) -> List[Any]:
        return [(OpEvent(bmm(heads, context), (layer,)), None) for layer, heads in (("0", 4), ("1", 4), ("2", 2))]

    affine = Affine(step(10), step(11), HandlerRegistry())
    events = affine.events(5)
    assert [e.call.args["self"].shape for e in events] == [(4, 1, 15), (4, 1, 15), (2, 1, 15)]
    assert [e.call.args["mat2"].shape for e in events] == [(4, 15, 8), (4, 15, 8), (2, 15, 8)]
    assert events[0].call is events[1].call and events[2].call is not events[0].call
    assert [e.module_stack for e in events] == [("0",), ("1",), ("2",)]
