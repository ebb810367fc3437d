"""serve reads a model config's values by the rule ``core.params`` reads them with (issue #27,
branch genfixed): the text config first, then the whole one; the first positive int; the experts
per token under ``core.params.TOP_K_KEYS``. serve had a rule of its own (the text config only, the
first int, zero included, and its own list of top-k names, without ``moe_topk``).

Where the two disagreed: Aria's text model names its experts ``moe_num_experts`` and its experts
per token ``moe_topk`` (transformers' AriaTextConfig, no alias to ``num_experts_per_tok``): serve
priced it as a dense model (top_k 0, every expert's weights read whole at every step), while the
parameter summary's active count (``core.params``) found two of four experts per token."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from flopcount.core.params import summarize_parameters
from flopcount.serving.serve import _moe, serve_facts

transformers = pytest.importorskip("transformers")

EXPERTS, TOP_K, LAYERS = 4, 2, 2


def _aria() -> nn.Module:
    config = transformers.AriaTextConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=50, moe_num_experts=EXPERTS, moe_topk=TOP_K, moe_intermediate_size=16, max_position_embeddings=256,
    )
    with torch.device("meta"):
        return transformers.AriaTextForCausalLM(config).eval()


def test_aria_s_experts_per_token_are_read_as_the_parameter_summary_reads_them() -> None:
    model = _aria()
    facts = serve_facts(model, torch.zeros(2, 6, dtype=torch.long, device="meta"), 8)
    assert facts.top_k == TOP_K  # before: 0 (priced as dense)
    # the routed experts' stacked weights (E, ., .) of each layer: gate_up_proj and down_proj; the
    # shared experts are read at every token, as dense matrices
    routed = [p for name, p in model.named_parameters() if ".mlp.experts." in name]
    assert len(routed) == 2 * LAYERS and all(p.shape[0] == EXPERTS for p in routed)
    experts = [w for w in facts.weights if w.kind == "expert"]
    assert sorted(w.numel for w in experts) == sorted(p.numel() for p in routed)  # before: none
    assert all(w.experts == EXPERTS for w in experts)
    # the same k the parameter summary's active count uses: E - k of E experts' weights inactive
    total = sum(p.numel() for p in model.parameters())
    assert summarize_parameters(model).active == total - sum(p.numel() for p in routed) * (EXPERTS - TOP_K) // EXPERTS
    assert (facts.layers, facts.hidden, facts.kv_heads) == (LAYERS, 32, 2)


class _Configured(nn.Module):
    def __init__(self, config: object) -> None:
        super().__init__()
        self.config = config


def test_a_zero_is_no_value_and_the_whole_config_answers_what_the_text_part_lacks() -> None:
    """``num_local_experts=0`` (a dense variant) no longer hides ``num_experts``; a multimodal
    config whose text part lacks the top-k gives the whole config's."""
    zero = SimpleNamespace(num_local_experts=0, num_experts=8, num_experts_per_tok=2)
    assert _moe(_Configured(zero)) == (8, 2)  # before: (0, 0)
    text = SimpleNamespace(num_local_experts=4)
    whole = SimpleNamespace(num_experts_per_tok=1, get_text_config=lambda: text)
    assert _moe(_Configured(whole)) == (4, 1)  # before: (0, 0)
    assert _moe(_Configured(SimpleNamespace(num_local_experts=4, num_experts_per_tok=True))) == (0, 0)  # a bool is no count
    assert _moe(nn.Linear(2, 2)) == (0, 0)
