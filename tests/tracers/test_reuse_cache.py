"""Structural reuse of decoder layers given a KV cache (issue #32, step 2): a layer called with
a transformers ``Cache`` is booked from an earlier layer's call when the slot it indexes holds
what that layer's slot held, and the slot is left as the real call leaves it.

Oracles: the same count with reuse off (``FLOPCOUNT_REUSE=0``: every call traced), a real run
of the model on CPU (the shapes each cache slot holds afterwards), and hand-derived MACs."""

from __future__ import annotations

import collections
import copy
from typing import Any, Deque, List

import pytest
import torch
from torch import nn

from flopcount import count_flops
from flopcount.core.inputs import prepare_call
from flopcount.tracers import trace

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    StaticCache,
)
from transformers.models.llama import modeling_llama  # noqa: E402

# the reuse key on stacks of 2 or 3 small blocks: every twin group keyed (the default policy would trace
# them: tests/conftest.py, ``reuse_always``)
pytestmark = pytest.mark.usefixtures("reuse_always")

VOCAB, LAYERS = 64, 4


def _llama(**extra: Any) -> nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)
    return LlamaForCausalLM(config).eval()


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        return _llama()
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=LAYERS, n_head=4, n_positions=64,
                                          bos_token_id=0, eos_token_id=0)).eval()
    if kind == "mistral":  # every layer a sliding window of 4 positions (DynamicSlidingWindowLayer)
        return MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                                num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                                                max_position_embeddings=64, sliding_window=4)).eval()
    # Qwen2 with sliding attention on layers 1 and 3 only (a hybrid cache: two kinds of slot)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         use_sliding_window=True, sliding_window=4, max_window_layers=LAYERS,
                         layer_types=["full_attention", "sliding_attention"] * (LAYERS // 2))
    return Qwen2ForCausalLM(config).eval()


# what _Decode's forward saw of the cache (a global, not module state: the copy shares it); a deque,
# since a reading gives a global list, dict or set its entries back as found (core/state.FoundState)
SEEN: Deque[Any] = collections.deque()


class _Decode(nn.Module):
    """A prefill of the prompt, then one decode step through the cache (as generate() runs them);
    records the shapes each cache slot holds after each forward."""

    def __init__(self, lm: nn.Module, static: int = 0):
        super().__init__()
        self.lm = lm
        self.static = static

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        cache = StaticCache(config=self.lm.config, max_cache_len=self.static) if self.static else DynamicCache(config=self.lm.config)
        out = self.lm(ids, cache=cache, use_cache=True)
        SEEN.append(_slots(cache))
        out = self.lm(ids[:, -1:], cache=cache, use_cache=True)
        SEEN.append(_slots(cache))
        return out.logits


def _slots(cache: Any) -> List[Any]:
    return [(type(layer).__name__, None if layer.keys is None else (tuple(layer.keys.shape), layer.keys.stride()),
             None if layer.values is None else tuple(layer.values.shape)) for layer in cache.layers]


def _rows(result: Any) -> Any:
    return {
        "dict": result.to_dict(),
        **{metric: (result.by_operator(metric), result.by_module(metric), result.by_module_and_operator(metric),
                    result.by_phase(metric)) for metric in ("macs", "flops")},
        "calls": [(m.name, m.calls) for m in result.modules],
    }


def _both(monkeypatch: Any, model: nn.Module, inputs: Any) -> Any:
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, inputs)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")
    on = count_flops(model, inputs)
    return off, on


def _reused(model: nn.Module, inputs: Any) -> int:
    return int(trace(model, prepare_call(inputs)).shape_cache["reused_calls"])


@pytest.fixture(autouse=True)
def _reuse_on(monkeypatch: Any) -> None:
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")


# every kind in eval on real weights; LLaMA also in train mode and on meta, the hybrid on meta
CASES = [(kind, False, False) for kind in ("llama", "gpt2", "mistral", "qwen2-hybrid")] + [
    ("llama", True, False), ("llama", False, True), ("llama", True, True), ("qwen2-hybrid", False, True)]


@pytest.mark.parametrize(("kind", "train", "meta"), CASES,
                         ids=[f"{k}-{'train' if t else 'eval'}-{'meta' if m else 'real'}" for k, t, m in CASES])
def test_decoder_layers_with_a_cache_give_identical_rows_on_and_off(monkeypatch, kind, train, meta):
    model = _model(kind).train(train)
    inputs = (torch.randint(0, VOCAB, (2, 9)),)
    if meta:
        model, inputs = copy.deepcopy(model).to("meta"), tuple(t.to("meta") for t in inputs)
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)


def _attention_runs(monkeypatch: Any, model: nn.Module, inputs: Any) -> int:
    """How many times LlamaAttention.forward ran during a count (a class-level spy, set before
    the count: the copy's modules call their class's forward)."""
    runs: List[int] = []
    original = modeling_llama.LlamaAttention.forward
    tick = runs.append  # a C method, keyed by identity: the spy's closure holds no count a key would see

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        # the class's forward now: keyed as its code since branch ``exact3`` (a spy that wrote its
        # closure's ``runs[0]`` made every first call unclean, each layer traced)
        tick(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", spy)
    count_flops(model, inputs)
    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", original)
    return len(runs)


def test_llama_decoder_layers_given_a_cache_are_run_once(monkeypatch):
    model = _llama()
    inputs = (torch.randint(0, VOCAB, (2, 9)),)
    # the model makes a DynamicCache (use_cache=True by default) and hands it to every layer:
    # layer 0 runs, layers 1..3 are booked from it
    assert _attention_runs(monkeypatch, model, inputs) == 1
    assert _reused(model, inputs) == LAYERS - 1
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    assert _attention_runs(monkeypatch, model, inputs) == LAYERS
    # hand-derived: per layer q,o 32x32, k,v 32x16 (2 KV heads of 8), MLP 3 x 32x48, per token;
    # attention 2 x T^2 x 32 per sequence; LM head 32 x 64 per token
    tokens, t = 2 * 9, 9
    per_layer = tokens * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 48) + 2 * 2 * t * t * 32
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")
    result = count_flops(model, inputs)
    contractions = sum(v for op, v in result.by_operator("macs").items()
                       if op in ("aten::linear", "aten::scaled_dot_product_attention"))
    assert contractions == LAYERS * per_layer + tokens * 32 * VOCAB


@pytest.mark.parametrize("static", [0, 16], ids=["dynamic", "static"])
@pytest.mark.parametrize("kind", ["llama", "gpt2", "mistral", "qwen2-hybrid"])
def test_the_cache_is_left_as_a_real_run_leaves_it(monkeypatch, kind, static):
    if static and kind == "gpt2":
        pytest.skip("one static case per attention kind is enough")
    lm = _model(kind)
    model = _Decode(lm, static).eval()
    ids = torch.randint(0, VOCAB, (2, 7))
    SEEN.clear()
    with torch.no_grad():
        model(ids)  # the real run
    real = list(SEEN)
    SEEN.clear()
    off, on = _both(monkeypatch, model, (ids,))
    assert len(SEEN) == 4
    assert SEEN[0] == SEEN[2] == real[0]  # after the prefill: reuse off, then on
    assert SEEN[1] == SEEN[3] == real[1]  # after the decode step
    assert _rows(on) == _rows(off)
    assert _reused(model, (ids,)) >= 2 * (LAYERS - 1) - (2 if kind == "qwen2-hybrid" else 0)


def test_a_layer_with_a_hook_is_traced(monkeypatch):
    model = _llama()
    inputs = (torch.randint(0, VOCAB, (2, 9)),)
    calls = []
    model.model.layers[2].register_forward_hook(lambda *a: calls.append(1))
    assert _attention_runs(monkeypatch, model, inputs) == 2  # layer 0, and layer 2 (hooked)
    assert calls == [1]
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)


def test_a_layer_of_another_width_is_traced(monkeypatch):
    model = _llama()
    wide = copy.deepcopy(model.model.layers[2].mlp)
    config = copy.copy(model.config)
    config.intermediate_size = 80
    model.model.layers[2].mlp = modeling_llama.LlamaMLP(config)
    inputs = (torch.randint(0, VOCAB, (2, 9)),)
    assert _attention_runs(monkeypatch, model, inputs) == 2
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)
    # the wide MLP: 3 x 32 x 80 MACs per token where the others have 3 x 32 x 48
    mlp = on.by_module("macs")
    assert mlp["model.layers.2.mlp"] - mlp["model.layers.1.mlp"] == 2 * 9 * 3 * 32 * (80 - 48)
    del wide


class _Layer(nn.Module):
    """A toy decoder layer on a DynamicCache: ``cache.update(k, v, self.layer_idx)``, and, with
    ``use``, work that depends on its index elsewhere (what reuse must not miss)."""

    def __init__(self, layer_idx: int, use: str = ""):
        super().__init__()
        self.layer_idx = layer_idx
        self.use = use
        self.k = nn.Linear(8, 8)
        self.v = nn.Linear(8, 8)
        self.extra = nn.Linear(8, 8)
        self.widths = [1, 1, 3, 1]

    def forward(self, x: torch.Tensor, cache: Any) -> torch.Tensor:
        k = self.k(x).unsqueeze(1)
        keys, values = cache.update(k, self.v(x).unsqueeze(1), self.layer_idx)
        if self.use == "compare" and self.layer_idx == 2:  # an int comparison
            x = self.extra(x)
        if self.use == "index":  # a list indexed with it in the model's own code
            for _ in range(self.widths[self.layer_idx]):
                x = self.extra(x)
        if self.use == "tensor":  # a C function that wants a true int: the stand-in is refused
            x = x + torch.full((1,), self.layer_idx, dtype=x.dtype)
        return x + (keys * values).sum(2)


class _Toy(nn.Module):
    def __init__(self, use: str):
        super().__init__()
        self.layers = nn.ModuleList([_Layer(i, use) for i in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = DynamicCache(ddp_cache_data=[(None, None)] * 4)  # four empty slots made up front
        for layer in self.layers:
            x = layer(x, cache)
        return x


@pytest.mark.parametrize("use", ["", "compare", "index", "tensor"])
def test_a_layer_index_used_beyond_the_cache_is_traced(monkeypatch, use):
    torch.manual_seed(0)
    model = _Toy(use).eval()
    x = torch.randn(3, 5, 8)
    off, on = _both(monkeypatch, model, (x,))
    assert _rows(on) == _rows(off)
    # by hand: k, v: 2 x 3*5 x 8 x 8 MACs per layer; ``extra`` where the index asks for it
    extra = {"": 0, "compare": 1, "index": 1 + 1 + 3 + 1, "tensor": 0}[use]
    assert on.by_operator("macs")["aten::linear"] == (4 * 2 + extra) * 15 * 64
    # layers 1..3 booked from layer 0 only when the index is used for nothing but the cache
    assert _reused(model, (x,)) == (3 if use == "" else 0)


SMALL = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=VOCAB, head_dim=8, max_position_embeddings=64)
# model type -> decoder-layer calls booked from another (by reading why each is or is not reused):
# OPT's first layer gets its input as a view, the others not; Qwen3-MoE and gpt-oss's experts
# need a stand-in kernel on fake tensors (their first calls are not clean: traced again)
TYPES = {"gemma2": LAYERS - 1, "starcoder2": LAYERS - 1, "gpt_neox": LAYERS - 1, "bloom": LAYERS - 1,
         "cohere2": LAYERS - 1, "phi": LAYERS - 1, "opt": LAYERS - 2, "qwen3_moe": None, "gpt_oss": None}


@pytest.mark.parametrize("model_type", sorted(TYPES))
def test_transformers_model_types_give_identical_rows_on_and_off(monkeypatch, model_type):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SMALL)).eval()
    inputs = (torch.randint(0, VOCAB, (2, 9)),)
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)
    if TYPES[model_type] is not None:
        assert _reused(model, inputs) == TYPES[model_type]


@pytest.mark.parametrize("cache", ["dynamic", "static", "sliding"])
def test_count_generation_is_identical_on_and_off(monkeypatch, cache):
    # count_generation's forwards are traced with tracer="dispatch" on the model as given, where
    # reuse is not taken (docs/internals.md): a guard that keeps it exact when it is
    from flopcount import count_generation

    model = _model("mistral" if cache == "sliding" else "llama")
    ids = torch.randint(0, VOCAB, (2, 6))
    options = {"cache_implementation": "static"} if cache == "static" else {}
    results = []
    for flag in ("0", "always"):
        monkeypatch.setenv("FLOPCOUNT_REUSE", flag)
        results.append(count_generation(model, ids, new_tokens=4, **options))
    off, on = results
    assert on.macs == off.macs and on.flops == off.flops
    for a, b in zip([on.prefill, *on.steps], [off.prefill, *off.steps]):
        assert _rows(a) == _rows(b)


@pytest.mark.parametrize("kind", ["llama", "qwen2-hybrid"])
def test_predict_is_identical_on_and_off(monkeypatch, kind):
    from flopcount import predict

    model = _model(kind)
    inputs = (torch.randint(0, VOCAB, (2, 9)),)
    results = []
    for flag in ("0", "always"):
        monkeypatch.setenv("FLOPCOUNT_REUSE", flag)
        results.append(predict(model, inputs, on="t4"))
    off, on = results
    assert on.to_dict() == off.to_dict()


class _Catching(nn.Module):
    """A forward that catches its layers' failures and goes on another way: a stand-in refused
    there must not change what is counted."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Layer(i, "tensor") for i in range(4)])
        self.fallback = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = DynamicCache(ddp_cache_data=[(None, None)] * 4)
        for layer in self.layers:
            try:
                x = layer(x, cache)
            except Exception:
                x = self.fallback(x)
        return x


def test_a_refused_layer_index_caught_by_the_forward_is_counted_as_a_real_run(monkeypatch):
    torch.manual_seed(0)
    model = _Catching().eval()
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        model(x)  # the real run takes no fallback
    off, on = _both(monkeypatch, model, (x,))
    assert _rows(on) == _rows(off)
    assert "fallback" not in on.by_module("macs") or on.by_module("macs")["fallback"] == 0
    assert on.by_operator("macs")["aten::linear"] == 4 * 2 * 15 * 64  # k and v of four layers


@pytest.mark.parametrize("model_type", ["bart", "t5"])
def test_encoder_decoders_with_a_cross_attention_cache_give_identical_rows(monkeypatch, model_type):
    # their decoder layers get an EncoderDecoderCache (two caches inside one): not described,
    # so traced; the encoder's layers are booked again
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    sizes = {"bart": dict(d_model=32, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, vocab_size=VOCAB,
                          max_position_embeddings=64),
             "t5": dict(d_model=32, d_kv=8, d_ff=48, num_layers=3, num_heads=4, vocab_size=VOCAB)}[model_type]
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(AutoConfig.for_model(model_type, **sizes)).eval()
    ids, decoder_ids = torch.randint(2, VOCAB, (2, 9)), torch.randint(2, VOCAB, (2, 5))
    results = []
    for flag in ("0", "always"):
        monkeypatch.setenv("FLOPCOUNT_REUSE", flag)
        results.append(count_flops(model, (ids,), {"decoder_input_ids": decoder_ids}))
    off, on = results
    assert _rows(on) == _rows(off)


def test_sliding_layers_among_full_ones_are_traced_once_each_kind(monkeypatch):
    # Qwen2 with layers 0, 2 full and 1, 3 sliding (their cache slots are of two classes):
    # layer 1 is traced (its slot is not what layer 0's was), layers 2 and 3 are booked from 0 and 1
    from transformers.models.qwen2 import modeling_qwen2

    model = _model("qwen2-hybrid")
    inputs = (torch.randint(0, VOCAB, (2, 9)),)
    runs: List[int] = []
    original = modeling_qwen2.Qwen2Attention.forward
    tick = runs.append  # as in ``_attention_runs``: no count in the spy's closure

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        tick(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(modeling_qwen2.Qwen2Attention, "forward", spy)
    count_flops(model, inputs)
    assert len(runs) == 2
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    runs.clear()
    count_flops(model, inputs)
    assert len(runs) == LAYERS
