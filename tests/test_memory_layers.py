"""Issue #32: estimate_memory replays a model's repeated layers (flopcount.step.replay) from a
3-layer run checked by a 4-layer one instead of tracing every layer.

Oracles: the same estimate with the replay off (``FLOPCOUNT_REUSE=0``: every layer traced, as
before), compared as whole ``MemoryEstimate`` values (peak, categories at the peak, peak module
and phase, every module's calls, activation bytes and peak, warnings), on tiny LLaMA / GPT-2 /
BERT / torch encoder stacks of 6-8 layers, batch 2, inference, forward+backward, SGD / Adam /
AdamW / Adagrad, autocast; torch's MemTracker on a real cpu run of the same step; and models built to break
a replay (a layer differing in one attribute the forward reads, a hooked layer), which must be
traced in full.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn

import flopcount.memory.estimate as estimate_module
from flopcount.memory.estimate import estimate_memory

MemTracker = pytest.importorskip("torch.distributed._tools.mem_tracker").MemTracker
BATCH, SEQ, VOCAB = 2, 16, 128


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=7, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
        vocab_size=VOCAB, max_position_embeddings=64, use_cache=False,
    )
    return LlamaForCausalLM(config)


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=6, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False,
    )
    return GPT2LMHeadModel(config)


def _bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        num_hidden_layers=6, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return BertModel(config, add_pooling_layer=False)


def _encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)


class Block(nn.Module):
    """A residual MLP block; ``widen`` sets the hidden width the forward makes (read at run time)."""

    def __init__(self, width: int = 32, widen: int = 4):
        super().__init__()
        self.widen = widen
        self.up = nn.Linear(width, width * 4)
        self.down = nn.Linear(width * 4, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        extra = torch.ones(x.shape[0], self.widen * 1024)  # a tensor whose size the attribute sets
        return x + self.down(h) + extra.sum() * 0


class Blocks(nn.Module):
    def __init__(self, n: int = 8, odd: Optional[int] = None):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        if odd is not None:
            self.blocks[odd].widen = 64  # the one layer that differs: its forward makes 16x the tensor
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


CASES: Dict[str, Tuple[Callable[[], nn.Module], Callable[[], Tuple[Any, Dict[str, Any]]]]] = {
    "llama": (_llama, lambda: ((), {"input_ids": _ids(), "labels": _ids()})),
    "gpt2": (_gpt2, lambda: ((_ids(),), {})),
    "bert": (_bert, lambda: ((_ids(),), {})),
    "encoder": (_encoder, lambda: ((torch.randn(BATCH, SEQ, 64, generator=torch.Generator().manual_seed(2)),), {})),
    "blocks": (Blocks, lambda: ((torch.randn(BATCH * 4, 32, generator=torch.Generator().manual_seed(3)),), {})),
}
STEPS: Dict[str, Dict[str, Any]] = {
    "inference": {},
    "fwd+bwd": {"backward": True},
    "sgd": {"backward": True, "optimizer": "sgd-momentum"},
    "adam": {"backward": True, "optimizer": "adam"},
    "adagrad": {"backward": True, "optimizer": "adagrad"},
    "adamw-autocast": {"backward": True, "optimizer": "adamw", "autocast": torch.bfloat16},
}
GRID = [
    ("llama", "inference"), ("llama", "fwd+bwd"), ("llama", "adamw-autocast"), ("llama", "sgd"),
    ("gpt2", "adam"),
    ("bert", "fwd+bwd"), ("bert", "sgd"),
    ("encoder", "adam"),
    ("blocks", "inference"), ("blocks", "sgd"), ("blocks", "adagrad"),
]


def _estimates(monkeypatch: pytest.MonkeyPatch, model: nn.Module, args: Any, kwargs: Dict[str, Any], **options: Any) -> Tuple[Any, Any, List[bool]]:
    """The estimate with the replay on (whether it was used) and off."""
    used: List[bool] = []
    layered = estimate_module._layered

    def spy(*a: Any, **k: Any) -> Any:
        figures = layered(*a, **k)
        used.append(figures is not None)
        return figures

    monkeypatch.setattr(estimate_module, "_layered", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
        on = estimate_memory(model, args, kwargs, **options)
        monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
        off = estimate_memory(model, args, kwargs, **options)
    return on, off, used


@pytest.mark.parametrize("case, step", GRID, ids=[f"{c}-{s}" for c, s in GRID])
def test_replayed_layers_give_every_figure_of_the_full_trace(monkeypatch: pytest.MonkeyPatch, case: str, step: str) -> None:
    build, inputs = CASES[case]
    torch.manual_seed(0)
    model = build().train()
    args, kwargs = inputs()
    before = snapshot(model)
    on, off, used = _estimates(monkeypatch, model, args, kwargs, **STEPS[step])
    assert used == [True, False]  # replayed with the switch on; traced in full with it off
    assert on == off  # peak, categories at the peak, peak module and phase, every module's row, warnings
    assert_same_state(model, before)


def test_the_replay_matches_torchs_memtracker_on_a_real_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # the oracle: torch's own MemTracker around the same step run for real on a copy (Adam
    # warmed by one step, so its state exists; forward, sum loss with outputs released,
    # backward, step), all 8 blocks run
    torch.manual_seed(0)
    model = Blocks()
    x = torch.randn(BATCH * 4, 32)
    on, off, used = _estimates(monkeypatch, model, (x,), {}, backward=True, optimizer="adam")
    assert used == [True, False] and on == off
    real = copy.deepcopy(model)
    opt = torch.optim.Adam(real.parameters())
    for p in real.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(real, opt, x)
    with tracker:
        loss = real(x).sum()
        loss.backward()
        del loss
        opt.step()
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    assert on.peak_bytes == peak["Total"]


def test_a_layer_that_differs_where_the_forward_reads_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # block 5 makes a 64 KiB-per-row tensor where the others make 4 KiB: a replay of block 1
    # would miss it, so the step must be traced in full (the attribute is read: the cut run refuses)
    torch.manual_seed(0)
    model = Blocks(odd=5)
    x = torch.randn(BATCH * 4, 32)
    on, off, used = _estimates(monkeypatch, model, (x,), {}, backward=True, optimizer="adamw")
    assert used == [False, False] and on == off
    # the odd block's forward keeps nothing, but its peak includes its 64 x 1024 floats per row
    assert on.module("blocks.5").peak_bytes - on.module("blocks.4").peak_bytes >= (64 - 4) * 1024 * 4 * BATCH * 4


def test_a_hooked_layer_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = Blocks()
    kept: List[torch.Tensor] = []
    handle = model.blocks[3].register_forward_hook(lambda m, args, out: kept.append(out * 2))
    try:
        x = torch.randn(BATCH * 4, 32)
        on, off, used = _estimates(monkeypatch, model, (x,), {}, backward=True, optimizer="sgd")
    finally:
        handle.remove()
    assert used == [False, False] and on == off
    assert len(model.blocks[3]._forward_hooks) == 0


def test_a_model_with_a_kv_cache_in_its_training_step_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers' LLaMA with use_cache=True builds a cache in training too and its layers
    # index it by layer_idx, the attribute that differs between layers: the cut run refuses it
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=6, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
        vocab_size=VOCAB, max_position_embeddings=64, use_cache=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).train()
    on, off, used = _estimates(monkeypatch, model, (), {"input_ids": _ids(), "labels": _ids()}, backward=True)
    assert used == [False, False] and on == off


def test_autocast_casts_freed_together_at_the_forwards_end_are_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # GPT-2's Conv1D biases are cast by autocast and cached until the forward ends, then freed
    # all at once (addmm's backward does not keep them): not a layer-by-layer timeline, so the
    # 4-layer check differs from the stretched template and the step is traced in full
    torch.manual_seed(0)
    model = _gpt2().train()
    on, off, used = _estimates(monkeypatch, model, (_ids(),), {}, **STEPS["adamw-autocast"])
    assert used == [False, False] and on == off
