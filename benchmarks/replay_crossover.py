"""Where the repeated-layer replay (flopcount.step.replay) starts to pay (issue #32 / #27,
helper replaymin): the CPU seconds of ``estimate_memory`` (inference, and an AdamW training
step) and ``plan`` (one rank, and fsdp=2 x tp=2) of tiny LLaMA / GPT-2 / BERT stacks at
several depths, with the replay taken and with it refused; ``--models gemma2 gpt_oss``: tiny
stacks of sliding and full attention in turn, replayed by units of two layers (periodreplay).

    PYTHONPATH=. python benchmarks/replay_crossover.py [--models llama gpt2 bert gemma2 gpt_oss]
        [--layers 6 8 10 12 16] [--readings mem-infer mem-adamw plan-1 plan-2x2] [--repeat 3]

"replay" and "full" differ only in ``flopcount.step.replay.MIN_LAYERS`` (1 and a depth no
stack reaches), so the rest of the reuse (the count's) is on in both. Each figure is the
median of ``--repeat`` calls' ``time.process_time`` after one warm-up call; "ratio" is
replay / full (below 1: the replay pays). The load average is printed with the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from _layer_stacks import BATCH, SEQ, VOCAB

import flopcount
from flopcount.step import replay

NEVER = 10**9
#: the models whose blocks have a built-in tensor-parallel plan (flopcount.planning.world): the
#: fsdp=2 x tp=2 reading runs on those only
TP_BUILT_IN = ("llama", "gpt2")


def _llama(layers: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64, use_cache=False,
    )
    return LlamaForCausalLM(config)


def _gpt2(layers: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=layers, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )
    return GPT2LMHeadModel(config)


def _bert(layers: int) -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        num_hidden_layers=layers, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=VOCAB, max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return BertModel(config, add_pooling_layer=False)


def _alternating(model_type: str, **values: Any) -> Callable[[int], nn.Module]:
    """A tiny ``model_type`` whose layers alternate between sliding and full attention
    (Gemma-2, GPT-OSS): replayed by units of two layers (periodreplay)."""

    def build(layers: int) -> nn.Module:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.for_model(
            model_type, num_hidden_layers=layers, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64, sliding_window=8,
            use_cache=False, **values,
        )
        return AutoModelForCausalLM.from_config(config)

    return build


BUILDERS: Dict[str, Callable[[int], nn.Module]] = {
    "llama": _llama, "gpt2": _gpt2, "bert": _bert,
    "gemma2": _alternating("gemma2"), "gpt_oss": _alternating("gpt_oss", num_local_experts=4, num_experts_per_tok=2),
}
DEFAULT_MODELS = ("llama", "gpt2", "bert")


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def _call(reading: str, model_name: str, layers: int) -> Callable[[], Any]:
    build = BUILDERS[model_name]
    if reading.startswith("mem-"):
        model = build(layers)
        options: Dict[str, Any] = {} if reading == "mem-infer" else {"backward": True, "optimizer": "adamw"}
        return lambda: flopcount.estimate_memory(model, (_ids(),), **options)
    ranks: Dict[str, Any] = {} if reading == "plan-1" else {"fsdp": 2, "tp": 2}
    return lambda: flopcount.plan(lambda: build(layers), (_ids(),), on="h100", link="nvlink4", **ranks)


def _cpu(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm-up
    seconds: List[float] = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        seconds.append(time.process_time() - start)
    return statistics.median(seconds)


def _measure(fn: Callable[[], Any], repeat: int) -> Tuple[float, float]:
    saved = replay.MIN_LAYERS
    try:
        replay.MIN_LAYERS = 1
        replayed = _cpu(fn, repeat)
        replay.MIN_LAYERS = NEVER
        full = _cpu(fn, repeat)
    finally:
        replay.MIN_LAYERS = saved
    return replayed, full


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(BUILDERS))
    parser.add_argument("--layers", nargs="+", type=int, default=[6, 8, 10, 12, 16])
    parser.add_argument("--readings", nargs="+", default=["mem-infer", "mem-adamw", "plan-1", "plan-2x2"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    print(f"load before: {open('/proc/loadavg').read().strip()}  torch {torch.__version__}")
    print(f"{'reading':10} {'model':6} {'layers':>6} {'replay s':>9} {'full s':>8} {'ratio':>6}")
    for reading in args.readings:
        for model_name in args.models:
            if reading == "plan-2x2" and model_name not in TP_BUILT_IN:
                print(f"{reading:10} {model_name:6}  (no built-in tensor-parallel plan for its blocks)")
                continue
            for layers in args.layers:
                replayed, full = _measure(_call(reading, model_name, layers), args.repeat)
                ratio = replayed / full
                print(f"{reading:10} {model_name:6} {layers:6d} {replayed:9.3f} {full:8.3f} {ratio:6.2f}", flush=True)
    print(f"load after: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
