"""Tiny stacks of identical layers (transformers' LLaMA, GPT-2 and BERT, torch's encoder) built
from code, for the tests of the repeated-layer replay in estimate_memory and plan."""

from __future__ import annotations

import importlib
from typing import Any, List

import torch
from torch import nn

BATCH, SEQ, VOCAB = 2, 16, 128


class LayerList(nn.Module):
    """Toy layers of ``width`` features run in turn, then a linear head: the stacks of the
    period and head replay tests (tests/test_replay_periods.py, tests/test_replay_heads.py)."""

    def __init__(self, layers: List[nn.Module], width: int = 32):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def llama(intermediate_size: int = 128, layers: int = 7) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=intermediate_size, vocab_size=VOCAB, max_position_embeddings=64, use_cache=False,
    )
    return LlamaForCausalLM(config)


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=6, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False,
    )
    return GPT2LMHeadModel(config)


def bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        num_hidden_layers=6, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return BertModel(config, add_pooling_layer=False)


def encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)


def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def estimates_on_and_off(monkeypatch, model, args, kwargs, **options):
    """``estimate_memory`` with the repeated-layer replay on and off (``FLOPCOUNT_REUSE``), and
    whether the replay was taken on each call (``memory.estimate._layered`` gave figures)."""
    import warnings

    from flopcount.memory import estimate as estimate_module

    used = []
    layered = estimate_module._layered

    def spy(*a, **k):
        figures = layered(*a, **k)
        used.append(figures is not None)
        return figures

    monkeypatch.setattr(estimate_module, "_layered", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
        on = estimate_module.estimate_memory(model, args, kwargs, **options)
        monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
        off = estimate_module.estimate_memory(model, args, kwargs, **options)
    return on, off, used


def assert_adamw_estimate_replayed_exactly(monkeypatch, model, x, replayed: bool) -> None:
    """``estimate_memory`` of an AdamW training step of ``model`` on ``x``: the replay taken with
    the switch on where ``replayed`` (never with it off); every figure the same on and off (peak,
    categories at the peak, every module's row, warnings); the peak MemTracker's, measured live on
    the steady-state step; the model left as found."""
    from _live_oracles import warmed_step_peak
    from conftest import assert_same_state, snapshot

    before = snapshot(model)
    on, off, used = estimates_on_and_off(monkeypatch, model, (x,), {}, backward=True, optimizer="adamw")
    assert used == [replayed, False]
    assert on == off
    assert on.peak_bytes == warmed_step_peak(model, x, torch.optim.AdamW)
    assert_same_state(model, before)


def plans_on_and_off(monkeypatch, build, args, **options):
    """``flopcount.plan(build, args, **options)`` with the repeated-layer replay on and off
    (``FLOPCOUNT_REUSE``), and whether each call took the replay (:func:`spy_on_plan_replay`)."""
    import warnings

    import flopcount

    used = spy_on_plan_replay(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
        on = flopcount.plan(build, args, **options)
        monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
        off = flopcount.plan(build, args, **options)
    return on, off, used


def spy_on_plan_replay(patch: Any) -> List[bool]:
    """Whether each ``flopcount.plan`` call from now on took the layered replay (True) or traced
    the step in full (False), in call order: ``patch`` (a pytest MonkeyPatch) wraps
    ``flopcount.planning.plan._layered_step``, which gives None where the replay is refused."""
    plan_module = importlib.import_module("flopcount.planning.plan")  # the package re-exports plan()
    used: List[bool] = []
    layered = plan_module._layered_step

    def spy(*args: Any, **kwargs: Any) -> Any:
        made = layered(*args, **kwargs)
        used.append(made is not None)
        return made

    patch.setattr(plan_module, "_layered_step", spy)
    return used
