"""serve prices a forward's attention FLOPs at attention's column (branch serveattn).

Float32 attention runs, on an A100/H100/H200, on whichever SDPA backend the GPU picks; the
memory-efficient kernel runs its float32 GEMMs as 3xTF32 whatever ``allow_tf32`` says, so
``Roofs.column`` prices float32 attention at the faster of the matmul mode and TF32 / 3 (branch
fp32math). serve priced every FLOP of a forward as a matmul (FP32 under the defaults), which put
its float32 "lower bound" above what the part allows. Oracles: ``FlopCounterMode`` run live on
the same forwards (its SDPA entries; torch registers no formula for the CPU flash kernel, so its
own ``sdpa_flop_count`` is mapped to it, the formula it uses for the CUDA kernels), and the H100
SXM datasheet's dense peaks: FP32 67, TF32 494.5, BF16 989.5 TFLOP/s.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from flopcount.devices import named_roofs
from flopcount.serving import ServeFacts, serve_facts, serve_on

transformers = pytest.importorskip("transformers")

FP32, TF32, BF16 = 67e12, 494.5e12, 989.5e12
PROMPT, NEW = 7, 9  # 8 decode steps: 0, 1, 2 and 7 traced, 3..6 continued (serving.counting)
ATTN: Dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=50, max_position_embeddings=256)


def _cpu_sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return int(sdpa_flop_count(query, key, value))


#: FlopCounterMode's SDPA entries: the CUDA kernels are registered in torch, the CPU one is not
SDPA_OPS = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, torch.ops.aten._scaled_dot_product_flash_attention,
            torch.ops.aten._scaled_dot_product_efficient_attention)


def _live_sdpa_flops(model: nn.Module, ids: torch.Tensor) -> List[int]:
    """FlopCounterMode's SDPA FLOPs of each forward a real greedy generate() runs (prefill first)."""
    flops: List[int] = []
    forward = model.forward

    @functools.wraps(forward)  # generate reads the forward's signature (logits_to_keep)
    def counted(*args: Any, **kwargs: Any) -> Any:
        mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa}
        with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
            out = forward(*args, **kwargs)
        counts = counter.get_flop_counts()["Global"]
        flops.append(sum(counts.get(op, 0) for op in SDPA_OPS))
        return out

    model.forward = counted
    try:
        model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    finally:
        del model.forward
    return flops


@pytest.fixture(scope="module")
def llama() -> Iterator[Tuple[ServeFacts, List[int]]]:
    """A tiny float32 LLaMA (SDPA attention, grouped-query) on CPU: serve's facts, and
    FlopCounterMode's SDPA FLOPs of each forward of the real generate()."""
    cfg = transformers.AutoConfig.for_model("llama", **ATTN)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    ids = torch.randint(0, 50, (1, PROMPT))
    facts = serve_facts(model, ids, NEW)
    assert any("first two decode steps" in w for w in facts.warnings)  # the derived count
    with torch.no_grad():
        live = _live_sdpa_flops(model, ids)
    assert len(live) == NEW
    yield facts, live


#: of the prefill's 7 x 7 scores per head its causal kernel computes the 7 x 8 / 2 of the triangle
TRIANGLE = (PROMPT * (PROMPT + 1) / 2) / (PROMPT * PROMPT)


def _on_h100(facts: ServeFacts, dtype: str = "float32", **modes: bool) -> Any:
    return serve_on(facts, named_roofs("h100", **modes), "H100 SXM", None, "", dtype=dtype)


def test_the_prefill_and_every_step_carry_the_attention_flops_torch_counts(llama):
    facts, live = llama
    # 2 FLOPs x 2 layers x 4 query heads x Lq x Lk x (8 + 8): the prefill 7 x 7, step s 1 x (8 + s)
    assert live == [2 * 2 * 4 * 7 * 7 * 16] + [2 * 2 * 4 * (8 + s) * 16 for s in range(NEW - 1)]
    assert facts.prefill_at(1).attention_flops == live[0]
    # steps 3..6 are the continuation of steps 0 and 1: attention grows with the context
    assert [facts.step_at(1, s).attention_flops for s in range(NEW - 1)] == live[1:]
    # per sequence, none of it fixed: batch 5 runs 5 x each
    assert facts.step_at(5, 6).attention_flops == 5 * live[7]


def test_both_batch_sizes_counted_in_full_carry_the_same_attention_flops(llama):
    facts, _ = llama
    cfg = transformers.AutoConfig.for_model("llama", **ATTN)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    full = serve_facts(model, torch.zeros(1, PROMPT, dtype=torch.int64, device="meta"), NEW, derived=False)
    assert full.prefill == facts.prefill and full.steps == facts.steps and full.fixed == facts.fixed


def test_float32_prices_attention_at_tf32_over_3_and_the_rest_at_fp32(llama):
    facts, live = llama
    result = _on_h100(facts)
    assert result.float32_math() == {"matmul": "float32", "attention": "tfloat32x3"}
    row = result.at(1)
    prefill = facts.prefill_at(1)
    assert row.prefill.attention_flops == live[0]
    # the causal prefill's attention priced at its triangle (branch servecausal)
    expected = live[0] * TRIANGLE / (TF32 / 3) + (prefill.flops - live[0]) / FP32
    assert row.prefill.compute_s == pytest.approx(expected, rel=1e-12)
    # the parent's bound, every FLOP at FP32, is above it
    assert row.prefill.compute_s < prefill.flops / FP32
    last = facts.step_at(1, NEW - 2)
    assert row.last_step is not None
    assert row.last_step.compute_s == pytest.approx(live[-1] / (TF32 / 3) + (last.flops - live[-1]) / FP32, rel=1e-12)


def test_under_matmul_tf32_attention_and_matmuls_share_the_tf32_column(llama):
    facts, live = llama
    result = _on_h100(facts, matmul_tf32=True)
    assert result.float32_math() == {"matmul": "tfloat32", "attention": "tfloat32"}
    row = result.at(1)
    # TF32 beats TF32 / 3: every FLOP at TF32, as one sum (the bound before the split), the
    # causal prefill's attention at its triangle
    facts_flops, attention = facts.prefill_at(1).flops, live[0]
    assert row.prefill.compute_s == pytest.approx((facts_flops - attention + attention * TRIANGLE) / TF32, rel=1e-12)
    assert row.last_step is not None and row.last_step.compute_s == facts.step_at(1, NEW - 2).flops / TF32


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_is_unchanged(llama, dtype):
    facts, live = llama
    result = _on_h100(facts, dtype)
    assert result.float32_math() == {}
    row = result.at(4)
    # attention and matmuls share the column: FLOPs / the BF16 (= FP16) peak, the causal
    # prefill's attention at its triangle (4 sequences, each its own)
    needed = facts.prefill_at(4).flops - 4 * live[0] * (1 - TRIANGLE)
    assert row.prefill.compute_s == pytest.approx(needed / BF16, rel=1e-12)
    assert row.first_step is not None and row.first_step.compute_s == facts.step_at(4, 0).flops / BF16


def test_a_model_without_attention_ops_is_priced_as_before() -> None:
    cfg = transformers.AutoConfig.for_model("mamba", hidden_size=32, state_size=8, num_hidden_layers=2, vocab_size=50,
                                            expand=2, conv_kernel=4)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    facts = serve_facts(model, torch.zeros(1, 6, dtype=torch.int64, device="meta"), 8)
    assert facts.prefill.attention_flops == 0 and all(step.attention_flops == 0 for step in facts.steps)
    result = _on_h100(facts)
    assert result.float32_math() == {"matmul": "float32"}
    assert result.at(1).prefill.compute_s == facts.prefill_at(1).flops / FP32
