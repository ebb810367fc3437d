"""count_generation's continued decode steps book their tables when first read (issue #32's
count_generation target: LLaMA-2-70B, 128 new tokens, under 1 s).

A continued step (the affine continuation of its run's first two steps) used to be re-priced
into a full FlopResult as the loop went: a ledger booking per changed call and per owner, and a
copy of every touched per-module row, for each of the 123 continued steps of a 70B count (80
layers). Its totals are now exact at once (its run's first step plus each changed call's
difference times its events) and its per-operator, per-module and per-phase tables are booked
by the same ledger when one is first read. Oracles: every step traced (``trace_every_step``,
each forward aggregated on its own), the hand formula per step, and the eager re-pricing
(``reprice_groups``)."""

from __future__ import annotations

import copy
import pickle
import threading
from typing import Any, Dict, List, Tuple

import pytest
import torch
from torch import nn

from flopcount.core.ledger import Ledger
from flopcount.core.results import FlopResult, ModuleInfo, aggregate, reprice_deferred, reprice_groups
from flopcount.generation.count import GenerationResult, count_generation
from flopcount.types import Cost, OpCall, OpEvent, ParamSummary

transformers = pytest.importorskip("transformers")

B, H, HEADS, KV_HEADS, HD, INTER, LAYERS, VOCAB = 2, 32, 4, 2, 8, 64, 3, 50
METRICS = ("flops", "macs", "count", "bytes", "bytes_read", "bytes_written")


def _model(kind: str, device: str, train: bool = False, **extra: Any) -> nn.Module:
    config = transformers.AutoConfig.for_model(
        kind, hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, head_dim=HD, vocab_size=VOCAB, max_position_embeddings=256, **extra,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None
    return model.train(train)


def _tables(step: FlopResult) -> Dict[str, Any]:
    """Every figure a step publishes, read through its public methods."""
    out: Dict[str, Any] = {"totals": (step.flops, step.macs, step.bytes_read, step.bytes_written)}
    for metric in METRICS:
        out[f"operator:{metric}"] = step.by_operator(metric)  # type: ignore[arg-type]
        out[f"module:{metric}"] = step.by_module(metric)  # type: ignore[arg-type]
        out[f"module_op:{metric}"] = step.by_module_and_operator(metric)  # type: ignore[arg-type]
        out[f"phase:{metric}"] = step.by_phase(metric)  # type: ignore[arg-type]
    out["operator_totals"] = step.operator_totals()
    out["module_totals"] = {m.name: step.module_totals(m.name) for m in step.modules}
    return out


def _continued(result: GenerationResult) -> List[int]:
    """The steps the count continued (its note names the ranges, "a..b")."""
    note = next(w for w in result.warnings if "affine continuation" in w)
    ranges = note.split("decode steps ", 1)[1].split(" were", 1)[0]
    steps: List[int] = []
    for part in ranges.split(", "):
        low, _, high = part.partition("..")
        steps += range(int(low), int(high or low) + 1)
    return steps


# Mistral, window W = 16, prompt P = 4, 24 new tokens: step s attends min(P + s + 1, W) keys, so the
# window fills at step 11; the steps are cut into runs 0..9 (continued 3..8), 10..12 (traced one by
# one) and 13..22 (continued 16..21): continued steps on both sides of the boundary. Window 64: never
# reached, one run. LLaMA (grouped-query attention) for a model without a window, in train mode too.
CASES = {
    "mistral-window-crossed": ("mistral", {"sliding_window": 16}, 4, 24, 16),
    "mistral-window-not-reached": ("mistral", {"sliding_window": 64}, 12, 24, 64),
    "llama-gqa-train": ("llama", {}, 6, 20, None),
}
DENSE = LAYERS * (H * HEADS * HD + 2 * H * KV_HEADS * HD + HEADS * HD * H + 3 * H * INTER)  # per token


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("case", list(CASES))
def test_deferred_steps_equal_every_step_traced(case: str, device: str) -> None:
    kind, extra, prompt, new_tokens, window = CASES[case]
    model = _model(kind, device, train=case.endswith("train"), **extra)
    ids = torch.randint(0, VOCAB, (B, prompt)).to(device)
    fast = count_generation(model, ids, new_tokens=new_tokens)
    every = count_generation(model, ids, new_tokens=new_tokens, trace_every_step=True)
    continued = _continued(fast)
    if case == "mistral-window-crossed":
        assert continued == [*range(3, 9), *range(16, 22)]
    else:
        assert continued == list(range(3, new_tokens - 2))

    def step_macs(s: int) -> int:
        # one token through the dense layers and the LM head; QK^T and AV over the keys kept
        keys = P_S = prompt + s + 1
        if window is not None:
            keys = min(P_S, window)
        return B * (DENSE + H * VOCAB) + LAYERS * B * HEADS * keys * 2 * HD

    assert [s.macs for s in fast.steps] == [step_macs(s) for s in range(new_tokens - 1)]
    assert len(fast.steps) == len(every.steps) == new_tokens - 1
    _same_steps(fast, every, case)


def _same_steps(fast: GenerationResult, every: GenerationResult, case: str) -> None:
    assert len(fast.steps) == len(every.steps)
    assert _tables(fast.prefill) == _tables(every.prefill)
    for index, (a, b) in enumerate(zip(fast.steps, every.steps)):
        assert _tables(a) == _tables(b), (case, index)
        assert a.flops == a.by_module()[""] == sum(a.by_operator().values())
    assert (fast.flops, fast.macs, fast.decode_flops) == (every.flops, every.macs, every.decode_flops)
    assert fast.to_dict()["steps"] == every.to_dict()["steps"]
    assert fast.kv_cache_bytes == every.kv_cache_bytes


def _other(kind: str) -> nn.Module:
    """The other families count_generation's tests run, on meta."""
    common: Dict[str, Any] = dict(vocab_size=VOCAB)
    if kind == "gpt2":
        config = transformers.AutoConfig.for_model("gpt2", n_embd=H, n_layer=LAYERS, n_head=HEADS, n_positions=256, **common)
    elif kind == "mamba":
        config = transformers.AutoConfig.for_model("mamba", hidden_size=H, state_size=4, num_hidden_layers=LAYERS, expand=2,
                                                   conv_kernel=4, **common)
    elif kind == "t5":
        config = transformers.AutoConfig.for_model("t5", d_model=H, d_ff=INTER, d_kv=HD, num_heads=HEADS, num_layers=2,
                                                   num_decoder_layers=2, decoder_start_token_id=0, pad_token_id=0, **common)
    else:
        config = transformers.AutoConfig.for_model(
            "mixtral", hidden_size=H, intermediate_size=48, num_hidden_layers=2, num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256, **common)
    auto = transformers.AutoModelForSeq2SeqLM if kind == "t5" else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config).eval()
    model.generation_config.eos_token_id = None
    return model


# (family, generate() options): GPT-2, a state-space model (cache_params), an encoder-decoder, a
# mixture of experts (k of E per token on meta), a static cache (attended in full), chunked prefill.
OTHERS = {
    "gpt2": ("gpt2", {}), "mamba": ("mamba", {}), "t5": ("t5", {}), "mixtral": ("mixtral", {}),
    "llama-static": ("llama", {"cache_implementation": "static"}),
    "llama-chunked-prefill": ("llama", {"prefill_chunk_size": 4}),
}


@pytest.mark.parametrize("case", list(OTHERS))
def test_deferred_steps_equal_every_step_traced_for_each_family(case: str) -> None:
    kind, options = OTHERS[case]
    model = _model("llama", "meta") if kind == "llama" else _other(kind)
    ids = torch.zeros(B, 10, dtype=torch.int64, device="meta")
    fast = count_generation(model, ids, new_tokens=16, **options)
    every = count_generation(model, ids, new_tokens=16, trace_every_step=True, **options)
    # one run: steps 0, 1, 2 and 14 traced. The static cache's length, 10 + 16 - 1 = 25 positions, is
    # a limit: step s attends 10 + s + 1 positions, 25 at step 14, so steps 13 and 14 are traced one
    # by one and the run 0..12 continues 3..11
    assert _continued(fast) == list(range(3, 12 if case == "llama-static" else 14))
    _same_steps(fast, every, case)


def test_a_continued_step_books_nothing_until_its_tables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: each continued step was booked (one Ledger.rebook_group per changed call) during
    the count. Now none is booked until a table is read, and a step read twice is booked once."""
    booked: List[int] = []
    group, one = Ledger.rebook_group, Ledger.rebook

    def counting_group(self: Ledger, *args: Any) -> None:
        booked.append(1)
        group(self, *args)

    def counting_one(self: Ledger, *args: Any) -> None:
        booked.append(1)
        one(self, *args)

    monkeypatch.setattr(Ledger, "rebook_group", counting_group)
    monkeypatch.setattr(Ledger, "rebook", counting_one)
    model = _model("llama", "meta")
    result = count_generation(model, torch.zeros(B, 6, dtype=torch.int64, device="meta"), new_tokens=20)
    continued = _continued(result)
    assert continued == list(range(3, 18))
    assert booked == []  # totals only: every step's FLOPs were read to make the result
    assert result.decode_flops == sum(s.flops for s in result.steps)
    assert booked == []
    step = result.steps[continued[0]]
    first = step.by_module()
    once = len(booked)
    assert once > 0 and step.by_operator() and step.by_module() == first
    assert len(booked) == once  # read again: booked once
    for index in continued[1:]:
        result.steps[index].by_phase()
    assert len(booked) == once * len(continued)  # each continued step: the same bookings


def test_a_continued_steps_operators_are_read_without_booking_its_module_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Branch serveattn: serve reads ``by_operator()`` of every decode step (its attention FLOPs).
    Before, that booked each continued step's four tables (one Ledger.rebook_group per changed
    call: 15 ms a step on an 80-layer LLaMA); now its operators are its base's plus the changes,
    and the other tables wait to be read. The figures are those of every step traced."""
    booked: List[int] = []
    group = Ledger.rebook_group

    def counting_group(self: Ledger, *args: Any) -> None:
        booked.append(1)
        group(self, *args)

    monkeypatch.setattr(Ledger, "rebook_group", counting_group)
    model = _model("llama", "meta")
    ids = torch.zeros(B, 6, dtype=torch.int64, device="meta")
    result = count_generation(model, ids, new_tokens=20)
    continued = _continued(result)
    assert continued == list(range(3, 18))
    operators = [result.steps[index].by_operator() for index in continued]
    assert booked == []
    every = count_generation(model, ids, new_tokens=20, trace_every_step=True)
    assert operators == [every.steps[index].by_operator() for index in continued]


def _layer_events(layers: int) -> List[OpEvent]:
    """One attention call per layer (the same call object: structural reuse books one call)."""
    call = OpCall("aten::scaled_dot_product_attention", {}, ())
    return [OpEvent(call, ("model", f"model.layers.{i}", f"model.layers.{i}.self_attn")) for i in range(layers)]


def _base(events: List[OpEvent], cost: Cost) -> FlopResult:
    mlp = OpEvent(OpCall("aten::mm", {}, ()), ("model", "model.layers.0", "model.layers.0.mlp"))
    names = ["", "model", "model.layers", "model.layers.0.mlp"]
    names += [name for i in range(len(events)) for name in (f"model.layers.{i}", f"model.layers.{i}.self_attn")]
    modules = [ModuleInfo(name, "Module", name.count(".") + bool(name), 1, 0) for name in names]
    return aggregate([(e, cost) for e in events] + [(mlp, Cost(macs=7, flops=14))], tracer="dispatch", modules=modules,
                     parameters=ParamSummary(total=0, trainable=0, frozen=0))


@pytest.mark.parametrize("kind", ["plain", "split", "float"])
def test_deferred_repricing_equals_the_eager_one(kind: str) -> None:
    events = _layer_events(80)
    old, new = {
        "plain": (Cost(macs=100, flops=200, bytes_read=64, bytes_written=32), Cost(macs=110, flops=220, bytes_read=68, bytes_written=32)),
        "split": (Cost.split(("aten::bmm", Cost(macs=50, flops=100)), ("aten::_softmax", Cost(flops=30))),
                  Cost.split(("aten::bmm", Cost(macs=55, flops=110)), ("aten::_softmax", Cost(flops=33)))),
        "float": (Cost(macs=100, flops=200.5), Cost(macs=110, flops=220.25)),  # type: ignore[arg-type]
    }[kind]
    base = _base(events, old)
    groups: List[Tuple[List[OpEvent], Cost, Cost]] = [(events, old, new)]
    deferred, eager = reprice_deferred(base, groups), reprice_groups(base, groups)
    assert (deferred.flops, deferred.macs, deferred.bytes_read, deferred.bytes_written) == \
        (eager.flops, eager.macs, eager.bytes_read, eager.bytes_written)
    if kind == "plain":  # by hand: 80 layers, each 10 MACs, 20 FLOPs and 4 bytes read more; the mm's 7 MACs
        assert (deferred.macs, deferred.flops, deferred.bytes_read) == (80 * 110 + 7, 80 * 220 + 14, 80 * 68)
    if kind == "split":  # 80 x (55 + 0) MACs, 80 x (110 + 33) FLOPs
        assert (deferred.macs, deferred.flops) == (80 * 55 + 7, 80 * 143 + 14)
    assert _tables(deferred) == _tables(eager)
    assert deferred == eager  # the dataclass's own equality: every field, the tables included
    # unchanged costs: the base itself, as the eager path returns it
    assert reprice_deferred(base, [(events, old, old)]) is base


def test_threads_reading_a_deferred_step_book_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import flopcount.core.results as results

    events = _layer_events(80)
    old, new = Cost(macs=100, flops=200), Cost(macs=110, flops=220)
    base = _base(events, old)
    step = reprice_deferred(base, [(events, old, new)])
    calls: List[int] = []
    booking = results.reprice_groups

    def slow(*args: Any) -> FlopResult:
        calls.append(1)
        time.sleep(0.05)  # every reader arrives while the first books
        return booking(*args)

    monkeypatch.setattr(results, "reprice_groups", slow)
    seen: List[int] = []
    threads = [threading.Thread(target=lambda: seen.append(step.by_module()["model.layers.5"])) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1] and seen == [220] * 8  # layer 5: its attention at the new cost


def test_a_deferred_step_pickles_copies_and_reads_from_threads_as_its_tables() -> None:
    events = _layer_events(80)
    old, new = Cost(macs=100, flops=200), Cost(macs=110, flops=220)
    base = _base(events, old)
    eager = reprice_groups(base, [(events, old, new)])
    for make in (lambda r: pickle.loads(pickle.dumps(r)), copy.deepcopy, copy.copy):
        assert _tables(make(reprice_deferred(base, [(events, old, new)]))) == _tables(eager)
    shared = reprice_deferred(base, [(events, old, new)])
    seen: List[Dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: seen.append(_tables(shared))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [_tables(eager)] * 4
    # the base is not changed by reading a step continued from it
    assert base.by_module()["model.layers.3.self_attn"] == 200


def _mixed_events() -> List[Tuple[OpEvent, Any]]:
    """Plain, split and estimated costs, ops without a handler in two modules, two phases and a
    module reached under two names (an alias)."""
    mm = OpCall("aten::mm", {}, ())
    attention = OpCall("aten::_native_multi_head_attention", {}, ())
    unknown = OpCall("custom::op", {}, ())
    estimated = Cost(macs=0, flops=9, note="depends on the data")
    split = Cost.split(("aten::bmm", Cost(macs=50, flops=100, bytes_read=8)), ("aten::_softmax", Cost(flops=30, bytes_written=4)))
    return [
        (OpEvent(mm, ("model", "model.a")), Cost(macs=7, flops=14, bytes_read=3, bytes_written=2)),
        (OpEvent(attention, ("model", "model.b")), split),
        (OpEvent(unknown, ("model", "model.a")), None),
        (OpEvent(unknown, ("model", "model.shared")), None),
        (OpEvent(OpCall("aten::nonzero", {}, ()), ("model",)), estimated),
        (OpEvent(mm, ("model", "model.shared"), "backward"), Cost(macs=5, flops=10)),
    ]


@pytest.mark.parametrize("floats", [False, True])
def test_a_deferred_aggregate_equals_the_booked_one(floats: bool) -> None:
    """count_generation books each traced forward's tables when first read: the same result
    as booking them at once (every field, the unsupported ops, notes and aliases included)."""
    costed = _mixed_events()
    if floats:  # booked at once: summed in another order, floats could differ
        costed.append((OpEvent(OpCall("aten::mm", {}, ()), ("model",)), Cost(macs=1, flops=2.5)))  # type: ignore[arg-type]
    names = ["", "model", "model.a", "model.b", "model.shared"]
    modules = [ModuleInfo(name, "Module", name.count(".") + bool(name), 1, 0) for name in names]
    options: Dict[str, Any] = dict(tracer="dispatch", modules=modules, parameters=ParamSummary(total=0, trainable=0, frozen=0),
                                   input_description="x", warnings=("w",), gaps=("g",), aliases={"model.shared": ["model.shared", "model.b.shared"]})
    deferred = aggregate(iter(costed), deferred=True, **options)
    booked = aggregate(costed, **options)
    assert deferred == booked and _tables(deferred) == _tables(booked)
    assert deferred.unsupported_ops() == {"custom::op": 2} and deferred.warnings == booked.warnings
    # by hand: MACs 7 + 50 + 5 (+ 1), FLOPs 14 + 100 + 30 + 9 + 10 (+ 2.5)
    assert (deferred.macs, deferred.flops) == ((63, 165.5) if floats else (62, 163))
