"""Readings on a CUDA GPU that CI (no GPU) never runs, for what changed since the last GPU run:
``count_generation`` fed what ``generate()`` feeds (branch genall), every reading leaving the
model's classes and the globals its forwards write as found (branch asfound), and the layer
replay of ``estimate_memory`` on a CUDA stack. Run on a lent GPU by ``benchmarks/gpu_checks.sh``;
skipped elsewhere.

Oracles: each forward of a real greedy ``generate()`` on the GPU, replayed with the exact
arguments it received (``tests/_live_oracles.generate_all_flops``, every operator) and
``FlopCounterMode`` over that real ``generate()`` (contractions); the values the test reads before
the call; the full trace (``FLOPCOUNT_REUSE=0``) for the replay, and the hand formula for the
stack's parameters.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch
from _live_oracles import generate_all_flops, generate_truth
from conftest import cuda
from torch import nn

import flopcount

B, P, N, VOCAB = 2, 12, 4, 64


def _decoder(kind: str, dtype: torch.dtype) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    if kind == "llama":
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=16, max_position_embeddings=128)
    else:
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(device="cuda", dtype=dtype).eval()
    model.generation_config.eos_token_id = None  # no early stop: N forwards
    return model


def _forwards(result: Any) -> List[Dict[str, int]]:
    return [forward.by_operator() for forward in (result.prefill, *result.steps)]


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_cuda_count_generation_matches_a_real_generate(kind: str, dtype: torch.dtype) -> None:
    model = _decoder(kind, dtype)
    ids = torch.randint(3, VOCAB, (B, P), generator=torch.Generator().manual_seed(1)).cuda()
    truth = generate_all_flops(model, ids, N)
    contractions, _ = generate_truth(model, ids, N) if kind == "gpt2" else (None, None)
    result = flopcount.count_generation(model, ids, N, trace_every_step=True)
    assert _forwards(result) == truth
    if kind == "gpt2":  # torch 2.11's FlopCounterMode refuses SDPA over grouped-query heads (LLaMA's 4 / 2)
        assert [2 * forward.macs for forward in (result.prefill, *result.steps)] == contractions


class _Counted(nn.Module):
    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return self.lin(x)


@cuda
@pytest.mark.parametrize("reading", ["count_flops", "estimate_memory", "benchmark", "module_latency", "profile"])
def test_cuda_readings_leave_class_data_as_found(reading: str) -> None:
    model = nn.Sequential(*(_Counted() for _ in range(14))).cuda()
    x = torch.randn(4, 32, device="cuda")
    runs = {
        "count_flops": lambda: flopcount.count_flops(model, (x,)),
        "estimate_memory": lambda: flopcount.estimate_memory(model, (x,), backward=True, optimizer="adam"),
        "benchmark": lambda: flopcount.benchmark(model, x, iters=3, warmup=1),
        "module_latency": lambda: flopcount.module_latency(model, x, iters=2, warmup=1),
        "profile": lambda: flopcount.profile(model, x, warmup=1, steps=2),
    }
    before = _Counted.calls
    runs[reading]()
    assert _Counted.calls == before
    model(x)  # the premise: the model's own call advances it, once per block
    assert _Counted.calls == before + 14


@cuda
@pytest.mark.parametrize("backward", [False, True], ids=["inference", "training"])
def test_cuda_layer_replay_equals_the_full_trace(monkeypatch: Any, backward: bool) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=14, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=16, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).cuda()
    ids = torch.randint(0, VOCAB, (B, 32), device="cuda")
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    full = flopcount.estimate_memory(model, (ids,), backward=backward, optimizer="adam" if backward else None)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    replayed = flopcount.estimate_memory(model, (ids,), backward=backward, optimizer="adam" if backward else None)
    assert replayed.to_dict() == full.to_dict()
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64  # q, o; k, v (GQA: 2 heads of 16); gate, up, down; two norms
    assert full.params == VOCAB * 64 * 2 + 14 * layer + 64
