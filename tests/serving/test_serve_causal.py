"""serve prices a causal prefill's attention at its triangle (branch servecausal).

A causal SDPA's fused kernels (flash, memory-efficient) skip the key blocks past the diagonal:
of the P x P scores per head the count books (torch's convention), only P (P + 1) / 2 are
computed. predict and profile priced that triangle (``devices.roofline.kernel_flops``, branch
boundcheck); serve priced the full square, so for a long prompt on a small model its prefill
"lower bound" could sit above a real run by up to 1 / (1 - a / 2) (a: attention's share of the
FLOPs). Oracles: the attention FLOPs derived by hand from the config (2 matmuls x 2 FLOPs per
MAC x layers x heads x scores x head dim) and the H100 SXM datasheet's dense BF16 peak,
989.5 TFLOP/s. A decode step's one query attends to every key (no causal kernel): priced in full.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _serve_shapes import BF16, CONFIG, NEW, PROMPT
from _serve_shapes import attention_flops as _attention

from flopcount.devices import named_roofs
from flopcount.serving import ServeFacts, serve_facts, serve_on

transformers = pytest.importorskip("transformers")

FULL = _attention(PROMPT * PROMPT)
TRIANGLE = _attention(PROMPT * (PROMPT + 1) / 2)


def _facts(**options: Any) -> ServeFacts:
    cfg = transformers.AutoConfig.for_model("llama", **CONFIG)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    return serve_facts(model, torch.zeros(1, PROMPT, dtype=torch.int64, device="meta"), NEW, **options)


@pytest.fixture(scope="module")
def facts() -> ServeFacts:
    return _facts()


def _row(facts: ServeFacts, batch: int) -> Any:
    return serve_on(facts, named_roofs("h100"), "H100 SXM", None, "", batch=batch, dtype="bfloat16").at(batch)


@pytest.mark.parametrize("batch", [1, 3])
def test_the_prefill_compute_term_prices_the_causal_triangle(facts, batch):
    prefill = facts.prefill_at(batch)
    assert prefill.attention_flops == batch * FULL  # the count books the square, torch's convention
    assert batch * FULL / prefill.flops > 0.5  # attention is most of this prefill's work
    row = _row(facts, batch)
    expected = (prefill.flops - batch * FULL + batch * TRIANGLE) / BF16
    assert row.prefill.compute_s == pytest.approx(expected, rel=1e-12)
    assert row.prefill.skipped_flops == pytest.approx(batch * (FULL - TRIANGLE), rel=1e-12)
    # the FLOPs reported stay the count's; only the bound leaves out what the kernel skips
    assert row.prefill.flops == prefill.flops and row.prefill.attention_flops == batch * FULL


def test_both_batch_sizes_counted_in_full_skip_the_same_flops(facts):
    full = _facts(derived=False)
    assert full.prefill == facts.prefill and full.fixed["prefill"] == facts.fixed["prefill"]


def test_a_decode_step_attends_to_every_key_and_is_priced_in_full(facts):
    row = _row(facts, 2)
    assert row.first_step is not None and row.last_step is not None
    first, last = facts.step_at(2, 0), facts.step_at(2, NEW - 2)
    # the one query of step s attends to all PROMPT + 1 + s keys: no triangle
    assert first.attention_flops == 2 * _attention(PROMPT + 1)
    assert row.first_step.compute_s == first.flops / BF16 and row.first_step.skipped_flops == 0
    assert row.last_step.compute_s == last.flops / BF16


# a chunked prefill (the first chunk causal, later chunks at a bottom-right causal kernel): test_serve_chunked.py
