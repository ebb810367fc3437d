"""flopcount.serve (issue #31): serving bounds from the model's own forwards.

Oracles: hand formulas from the published configs (derivations in the comments), Meta's
published LLaMA-2-7B parameter count, the datasheet figures of the parts, and real
``generate()`` runs on CPU (the storages its cache holds) for the cache figures.
"""

from __future__ import annotations

import math
from typing import Any, Dict

import pytest
import torch
from _live_oracles import held_bytes
from conftest import assert_same_state, snapshot
from torch import nn

import flopcount
from flopcount.errors import UsageError
from flopcount.serving import LEAVES_OUT

transformers = pytest.importorskip("transformers")

# LLaMA-2-7B (meta-llama/Llama-2-7b-hf config.json): hidden 4096, intermediate 11008, 32 layers,
# 32 heads, 32 KV heads, vocab 32000, untied embeddings.
L7 = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
          num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=False)
#: Meta's published parameter count of LLaMA-2-7B; by hand: per layer 4 x 4096^2 (q, k, v, o)
#: + 3 x 4096 x 11008 (gate, up, down) + 2 x 4096 (norms) = 202,383,360; x 32 = 6,476,267,520;
#: + embedding and LM head 2 x 32000 x 4096 = 262,144,000; + final norm 4096 = 6,738,415,616.
LLAMA2_7B_PARAMS = 6_738_415_616
P7, N7 = 8, 4


def _meta(kind: str, dtype: torch.dtype = torch.float16, **config: Any) -> nn.Module:
    cfg = transformers.AutoConfig.for_model(kind, **config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


@pytest.fixture(scope="module")
def llama7b() -> Any:
    model = _meta("llama", **L7)
    ids = torch.empty(1, P7, dtype=torch.int64, device="meta")
    return model, flopcount.serve(model, ids, N7, on="h100", batch=[1, 8])


def test_llama2_7b_kv_bytes_per_token_is_hand_derived(llama7b):
    _, result = llama7b
    # 2 (K and V) x 32 layers x 4096 (32 KV heads x 128) x 2 bytes (fp16)
    assert result.kv_bytes_per_token == 2 * 32 * 4096 * 2 == 524_288
    # the cache at the final context (P + N - 1 positions) per sequence
    assert result.kv_bytes_per_sequence == (P7 + N7 - 1) * 524_288


def test_decode_weight_bytes_are_the_parameter_bytes(llama7b):
    _, result = llama7b
    assert result.weight_bytes == LLAMA2_7B_PARAMS * 2
    for batch in (1, 8):
        # every weight once per step; the untied embedding table only at the B rows gathered
        expected = (LLAMA2_7B_PARAMS - 32000 * 4096) * 2 + batch * 4096 * 2
        assert result.at(batch).weights_read_per_step == expected


def test_the_cache_is_read_once_per_step_not_twice(llama7b):
    _, result = llama7b
    per_position = 524_288
    facts = result.facts
    # decode step s reads the P + s positions cached before it and writes one
    assert [s.cache_read for s in facts.steps] == [float((P7 + s) * per_position) for s in range(N7 - 1)]
    assert [s.cache_written for s in facts.steps] == [float(per_position)] * (N7 - 1)
    row = result.at(8)
    weights = (LLAMA2_7B_PARAMS - 32000 * 4096) * 2 + 8 * 4096 * 2
    assert row.first_step is not None and row.last_step is not None
    assert row.first_step.bytes == weights + 8 * (P7 + 1) * per_position
    assert row.last_step.bytes == weights + 8 * (P7 + N7 - 1) * per_position
    # the bound is the roofline of those bytes on the H100 SXM's 3.35 TB/s HBM, less the 50 MB
    # its L2 could serve (the one roofline function's cache-aware memory term)
    assert row.first_step.memory_s == pytest.approx((row.first_step.bytes - 50e6) / 3.35e12, rel=1e-12)


def test_the_lm_head_runs_on_the_positions_generate_computes(llama7b):
    _, result = llama7b
    dense = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    # prefill: P positions through every layer, attention QK^T and AV (2 x P^2 x 4096 per layer),
    # and the LM head once (logits_to_keep=1), not P times
    assert result.facts.prefill.macs == P7 * dense + 32 * 2 * P7 * P7 * 4096 + 4096 * 32000
    # decode step s: one position, attention over P + s + 1 keys, the head once
    assert result.facts.steps[0].macs == dense + 32 * 2 * (P7 + 1) * 4096 + 4096 * 32000


def test_capacity_is_the_parts_bytes_with_the_reserve_stated(llama7b):
    _, result = llama7b
    assert result.capacity_bytes == 80e9  # the H100 SXM's 80 GB, not 80 GiB
    assert result.reserve == 0.10 and result.usable_bytes == pytest.approx(72e9)
    kv = (P7 + N7 - 1) * 524_288
    # activations: the largest tensor one op writes per sequence, the MLP's P x 11008 fp16 intermediate
    activations = P7 * 11008 * 2
    assert result.facts.activation_bytes == activations
    assert result.max_batch == math.floor((72e9 - LLAMA2_7B_PARAMS * 2) / (kv + activations))
    assert "10% reserve" in result.table() and "72.00 GB usable" in result.table()


def test_int8_and_int4_weights_include_their_scales(llama7b):
    model, _ = llama7b
    ids = torch.empty(1, P7, dtype=torch.int64, device="meta")
    facts = flopcount.serving.serve_facts(model, ids, 2)
    from flopcount.devices import named_roofs
    from flopcount.serving import serve_on

    roofs = named_roofs("h100")
    matrices = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    rows = 32 * (5 * 4096 + 2 * 11008)  # output rows: q, k, v, o, down 4096 each; gate, up 11008
    rest = (LLAMA2_7B_PARAMS - matrices) * 2  # embedding, LM head, norms stay fp16
    int8 = serve_on(facts, roofs, "H100 SXM", 80e9, "nvlink4", weight_dtype="int8")
    assert int8.weight_bytes == matrices + 2 * rows + rest
    # int4: half a byte per weight, one fp16 scale + a 4-bit zero per 128 inputs of each row
    groups = 32 * (4 * 4096 * 32 + 2 * 11008 * 32 + 4096 * 86)  # 4096 / 128 = 32, ceil(11008 / 128) = 86
    int4 = serve_on(facts, roofs, "H100 SXM", 80e9, "nvlink4", weight_dtype="int4")
    assert int4.weight_bytes == matrices / 2 + 2.5 * groups + rest
    assert "scale" in int4.weight_note and "scale" in int8.weight_note


def test_moe_decode_reads_the_experts_the_batch_routes_to():
    E, K, H, INTER, LAYERS = 8, 2, 64, 96, 2
    model = _meta("mixtral", torch.bfloat16, hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=100, num_local_experts=E,
                  num_experts_per_tok=K)
    ids = torch.empty(1, 6, dtype=torch.int64, device="meta")
    result = flopcount.serve(model, ids, 4, on="h100", batch=[1, 4, 64])
    experts = LAYERS * E * 3 * H * INTER * 2  # every expert's gate, up, down in bf16
    table = 100 * H * 2  # the untied embedding, read at the rows gathered
    rest = result.weight_bytes - experts - table
    # the rest in bf16: per layer q, o (H x H), k, v (H x 2 KV heads x 16), the router (E x H), two
    # norms; the final norm and the untied LM head (100 x H)
    assert rest == 2 * (LAYERS * (2 * H * H + 2 * H * 32 + E * H + 2 * H) + H + 100 * H)
    for batch in (1, 4, 64):
        # expected experts read: E (1 - (1 - k/E)^B) of E; at B = 1 that is k of E
        share = 1 - (1 - K / E) ** batch
        expected = rest + batch * H * 2 + experts * share
        assert result.at(batch).weights_read_per_step == pytest.approx(expected, rel=1e-12)
    # not all E (llm-analysis) at batch 1, not k (GenZ) at batch 64
    assert result.at(1).weights_read_per_step == pytest.approx(rest + H * 2 + experts * K / E, rel=1e-12)
    assert result.at(64).weights_read_per_step > rest + experts * 0.9999


def _cpu(kind: str, dtype: torch.dtype = torch.float32, **config: Any) -> nn.Module:
    cfg = transformers.AutoConfig.for_model(kind, **config)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    return model


def _real_cache(model: nn.Module, ids: torch.Tensor, new: int) -> Any:
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, return_dict_in_generate=True)
    return out.past_key_values


SMALL: Dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=8, vocab_size=50, max_position_embeddings=256)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_sliding_window_layers_hold_and_read_only_their_window(device):
    W, B, P, N = 8, 2, 12, 10
    model = _cpu("mistral", sliding_window=W, **SMALL)
    ids = torch.randint(0, 50, (B, P))
    truth = held_bytes(_real_cache(model, ids, N))
    if device == "meta":
        model = model.to("meta")
        ids = ids.to("meta")
    result = flopcount.serve(model, ids, N, on="l4")
    per_position = 2 * 2 * 8 * 4  # K and V x 2 KV heads x head_dim 8 x float32, per layer
    # the window is full before the first step: each step reads the W - 1 positions the
    # sliding layer keeps (not P + s), in each of the 2 layers; per sequence (the layers'
    # int64 counters, 8 bytes each, are the batch's fixed part)
    assert [s.cache_read for s in result.facts.steps] == [2 * (W - 1) * per_position] * (N - 1)
    assert [s.cache_read for s in result.facts.fixed["steps"]] == [2 * 8] * (N - 1)
    # what the real generate()'s cache holds: the W-position tensors the layers keep views of
    assert B * result.kv_bytes_per_sequence + result.facts.fixed["cache_held"] == truth


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_space_layers_hold_their_state_in_the_models_dtype(dtype):
    B, P, N, H, STATE, KERNEL = 2, 6, 5, 32, 8, 4
    model = _cpu("mamba", dtype, hidden_size=H, state_size=STATE, num_hidden_layers=2, vocab_size=50, expand=2,
                 conv_kernel=KERNEL)
    ids = torch.randint(0, 50, (B, P))
    cache = _real_cache(model, ids, N)
    states = [t for t in _tensors(cache) if t.is_floating_point()]
    kept = {t.dtype for t in states}
    result = flopcount.serve(model, ids, N, on="h100")
    # per layer: the conv state (2H channels x kernel) in the model's dtype and the SSM state
    # (2H x state size), which transformers' Mamba keeps in float32 whatever the model's dtype
    assert kept == {dtype, torch.float32}
    real = sum(t.numel() * t.element_size() for t in states) / B  # the real cache's state tensors
    assert result.kv_bytes_per_sequence == real == 2 * (2 * H * KERNEL * dtype.itemsize + 2 * H * STATE * 4)
    assert result.facts.cache_dtype == "+".join(sorted(str(d).replace("torch.", "") for d in kept))
    assert result.kv_bytes_per_token == 0  # a recurrent state does not grow with the context


def _tensors(obj: Any, seen: Any = None) -> Any:
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        yield obj
    elif id(obj) not in seen and obj is not None and not isinstance(obj, (int, float, str, bool)):
        seen.add(id(obj))
        items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else \
            vars(obj).values() if hasattr(obj, "__dict__") else ()
        for item in items:
            yield from _tensors(item, seen)


def test_a_tied_head_is_read_whole_and_a_position_table_at_its_rows():
    cfg = dict(n_embd=32, n_layer=2, n_head=4, vocab_size=50, n_positions=64)
    model = _meta("gpt2", torch.float32, **cfg)
    ids = torch.empty(3, 5, dtype=torch.int64, device="meta")
    result = flopcount.serve(model, ids, 3, on="h100", batch=[1, 3])
    # GPT-2 by hand: wte 50 x 32 (tied LM head), wpe 64 x 32; per layer ln 2 x 2 x 32,
    # c_attn 32 x 96 + 96, attn c_proj 32 x 32 + 32, c_fc 32 x 128 + 128, mlp c_proj 128 x 32 + 32; ln_f 64
    layer = 4 * 32 + 32 * 96 + 96 + 32 * 32 + 32 + 32 * 128 + 128 + 128 * 32 + 32
    params = 50 * 32 + 64 * 32 + 2 * layer + 64
    assert result.weight_bytes == params * 4
    for batch in (1, 3):
        # the tied table is the head's weight, read whole; wpe is read at the B positions fed
        assert result.at(batch).weights_read_per_step == (params - 64 * 32) * 4 + batch * 32 * 4


def test_batches_price_one_count_as_counting_that_batch_does():
    model = _meta("llama", torch.float32, **{k: v for k, v in SMALL.items() if k != "head_dim"})
    one = flopcount.serve(model, torch.empty(1, 7, dtype=torch.int64, device="meta"), 5, on="a100", batch=4)
    four = flopcount.count_generation(model, torch.empty(4, 7, dtype=torch.int64, device="meta"), 5)
    row = one.at(4)
    assert row.prefill.flops == four.prefill.flops
    assert row.first_step is not None and row.first_step.flops == four.steps[0].flops
    assert sum(one.facts.step_at(4, i).flops for i in range(4)) == four.decode_flops


def test_tensor_parallel_divides_the_work_and_adds_the_all_reduces():
    model = _meta("llama", torch.float16, **{k: v for k, v in SMALL.items() if k != "head_dim"})
    ids = torch.empty(1, 6, dtype=torch.int64, device="meta")
    one = flopcount.serve(model, ids, 3, on="h100", batch=[4])
    two = flopcount.serve(model, ids, 3, on="h100", batch=[4], tp=2)
    assert two.weight_bytes == one.weight_bytes / 2
    assert two.kv_bytes_per_sequence == one.kv_bytes_per_sequence / 2  # 2 KV heads over 2 ranks
    first = two.at(4).first_step
    assert first is not None
    # two ring all-reduces per layer of B x hidden fp16 values: 2 (tp - 1) / tp x bytes over NVLink4 (450 GB/s)
    assert first.comm_s == pytest.approx(2 * 2 * (2 * 1 / 2) * (4 * 32 * 2) / 450e9, rel=1e-12)
    assert two.link == "nvlink4"


def test_the_result_says_what_the_bound_leaves_out(llama7b):
    _, result = llama7b
    for word in ("scheduling", "paging", "batching policy", "launch", "host", "speculative decoding"):
        assert word in LEAVES_OUT
    assert LEAVES_OUT in result.table()
    assert result.to_dict()["leaves_out"] == LEAVES_OUT


def test_compute_bound_batch_meets_the_roofline(llama7b):
    _, result = llama7b
    b = result.compute_bound_batch
    assert b is not None and b > 1
    facts = result.facts
    n = len(facts.steps)

    def terms(batch: int) -> Any:
        flops = sum(facts.step_at(batch, i).flops for i in range(n)) / n
        cache = sum(facts.step_at(batch, i).cache_read + facts.step_at(batch, i).cache_written for i in range(n)) / n
        # H100 SXM: 989.5 TFLOP/s dense fp16, 3.35 TB/s HBM3 (less the 50 MB its L2 may serve)
        return flops / 989.5e12, (result.at(batch).weights_read_per_step + cache - 50e6) / 3.35e12

    compute, memory = terms(b)
    assert compute >= memory
    compute, memory = terms(b - 1)
    assert compute < memory


def test_bad_input_names_what_is_wrong():
    model = _meta("llama", torch.float32, **{k: v for k, v in SMALL.items() if k != "head_dim"})
    ids = torch.empty(1, 4, dtype=torch.int64, device="meta")
    with pytest.raises(UsageError, match="unknown part 'h1000'"):
        flopcount.serve(model, ids, 2, on="h1000")
    with pytest.raises(UsageError, match="batch"):
        flopcount.serve(model, ids, 2, batch=[1, 0])
    with pytest.raises(UsageError, match="tp must be"):
        flopcount.serve(model, ids, 2, tp=0)
    with pytest.raises(UsageError, match="weight_dtype .* got 'int3'"):
        flopcount.serve(model, ids, 2, weight_dtype="int3")
    with pytest.raises(UsageError, match="new_tokens"):
        flopcount.serve(model, ids, 0)


@pytest.mark.parametrize("train", [False, True])
def test_the_model_is_left_as_found(train, tmp_path, monkeypatch):
    from flopcount.devices.measured import remember_roofs
    from flopcount.devices.roofline import Roofs

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a cache of this test's own
    if not train:  # roofs in the cache: read, not measured (2.7 s of CPU); the train case measures them
        remember_roofs(Roofs({"float32": 1e11}, 1e10, "stored by the test", "given"), "cpu")
    model = _cpu("llama", **{k: v for k, v in SMALL.items() if k != "head_dim"})
    model.train(train)
    ids = torch.randint(0, 50, (2, 5))
    before, ids_before, rng = snapshot(model), ids.clone(), torch.get_rng_state()
    flopcount.serve(model, ids, 3, on="this machine")
    assert_same_state(model, before)
    assert torch.equal(ids, ids_before) and torch.equal(torch.get_rng_state(), rng)
