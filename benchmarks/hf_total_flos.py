"""HF Trainer's ``total_flos`` per training micro-batch (``6 x main-input elements x
non-embedding parameters``, from ``Trainer.floating_point_ops``) beside flopcount's exact
forward + backward count of the same batch, per model family; configs built from code on
the meta device (no download, no weights).

    PYTHONPATH=. /work/venvs/integ/bin/python benchmarks/hf_total_flos.py

Prints a markdown table (docs/integrations.md).
"""

from __future__ import annotations

import types
import warnings
from typing import Any, Callable, Dict, List, Tuple

import torch

import flopcount
from flopcount.integrations.hf import hf_loss


def _tokens(batch: int, seq: int, vocab: int) -> Dict[str, Any]:
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return {"input_ids": ids, "labels": ids}


def _cases() -> List[Tuple[str, Callable[[], Any], Callable[[], Dict[str, Any]], str]]:
    import transformers as tf

    return [
        ("GPT-2 small (124M), 1x1024 tokens",
         lambda: tf.GPT2LMHeadModel(tf.GPT2Config()), lambda: _tokens(1, 1024, 50257), "causal LM"),
        ("LLaMA-style 1.1B, GQA 32/4 heads, 1x2048",
         lambda: tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                                   num_attention_heads=32, num_key_value_heads=4, vocab_size=32000)),
         lambda: _tokens(1, 2048, 32000), "causal LM"),
        ("Mixtral-style MoE, 8 experts top-2, 1x1024",
         lambda: tf.MixtralForCausalLM(tf.MixtralConfig(hidden_size=1024, intermediate_size=3584, num_hidden_layers=8,
                                                       num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                                                       num_local_experts=8, num_experts_per_tok=2)),
         lambda: _tokens(1, 1024, 32000), "causal LM"),
        ("T5-small, 1x512 in, 1x128 out",
         lambda: tf.T5ForConditionalGeneration(tf.T5Config(decoder_start_token_id=0, pad_token_id=0)),
         lambda: {"input_ids": torch.zeros(1, 512, dtype=torch.long, device="meta"),
                  "labels": torch.zeros(1, 128, dtype=torch.long, device="meta")}, "seq2seq"),
        ("ViT-B/16, 1 image 224x224",
         lambda: tf.ViTForImageClassification(tf.ViTConfig(num_labels=1000)),
         lambda: {"pixel_values": torch.zeros(1, 3, 224, 224, device="meta"), "labels": torch.zeros(1, dtype=torch.long, device="meta")},
         "image classifier"),
        ("Whisper-tiny, 30 s audio, 1x64 labels",
         lambda: tf.WhisperForConditionalGeneration(tf.WhisperConfig(d_model=384, encoder_layers=4, decoder_layers=4,
                                                                   encoder_attention_heads=6, decoder_attention_heads=6,
                                                                   encoder_ffn_dim=1536, decoder_ffn_dim=1536,
                                                                   decoder_start_token_id=50257, pad_token_id=50257)),
         lambda: {"input_features": torch.zeros(1, 80, 3000, device="meta"),
                  "labels": torch.zeros(1, 64, dtype=torch.long, device="meta")}, "speech seq2seq"),
    ]


def hf_estimate(model: Any, inputs: Dict[str, Any]) -> float:
    from transformers import Trainer

    return float(Trainer.floating_point_ops(types.SimpleNamespace(model=model), inputs))  # type: ignore[arg-type]


def main() -> None:
    print("| model (batch) | HF total_flos (6N) | flopcount fwd+bwd | HF / exact | output head share | attention share |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, build, inputs_fn, _kind in _cases():
        with torch.device("meta"):
            model = build()
        model.train()
        inputs = inputs_fn()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = flopcount.count_flops(model, (), kwargs=inputs, backward=True, loss_fn=hf_loss)
        ops = result.by_operator()
        # score and value products: SDPA forward, its backward (bmm) and the softmax backward
        attention = sum(v for k, v in ops.items() if "attention" in k or k.endswith("bmm") or "softmax_backward" in k)
        modules = result.by_module()
        head = sum(modules.get(n, 0) for n in ("lm_head", "proj_out", "classifier"))
        hf = hf_estimate(model, inputs)
        print(f"| {name} | {hf:.3g} | {result.flops:.3g} | {hf / result.flops:.2f} | {head / result.flops:.1%} | "
              f"{attention / result.flops:.1%} |")


if __name__ == "__main__":
    main()
