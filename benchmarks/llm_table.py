"""docs/llm.md's tables: LLM inference and training cost measured on meta, beside the formulas
people use. Each model is built from transformers' default config of its type (random
weights, no download) in bfloat16 on the meta device, in its own subprocess (peak RSS is its
own), and measured with flopcount:

* inference: ``count_generation(model, 1 x P prompt, new_tokens=2)``: prefill FLOPs over P
  positions, the decode step after it (context P + 1), the KV cache after it (P + 1 positions,
  bf16), active and total parameters; beside 2N per token (Kaplan) and the EleutherAI
  cookbook's decode estimate 2N + 2 * L * d_attn * context.
* training: ``count_flops(model, 1 x P, backward=True)`` FLOPs per token, beside 6N, PaLM's
  6N + 12 * L * H * Q * T, the Megatron-LM paper's 72 * L * h^2 * (1 + s / (6h) + V / (12 h L))
  (Narayanan et al. 2021) and current Megatron-LM's ``num_floating_point_operations``
  (megatron/training/training.py: GQA, SwiGLU and MoE terms, causal attention halved), see
  :func:`megatron_lm_current`.

N = parameters one token uses, less the input embeddings (token and position tables): the
active parameters for a mixture of experts. Encoder-decoders (T5) get P tokens on each side.

    .venv/bin/python benchmarks/llm_table.py [--prompt 2048] [--only llama,gpt2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: row label -> (model_type, config overrides)
MODELS: Dict[str, Any] = {
    "LLaMA-2-7B": ("llama", {}),
    "Mistral-7B": ("mistral", {}),
    "Mixtral-8x7B": ("mixtral", {}),
    "Qwen3-30B-A3B": ("qwen3_moe", {"num_hidden_layers": 48, "head_dim": 128}),  # its published config
    "GPT-2 (124M)": ("gpt2", {}),
    "T5-small": ("t5", {}),
}


def megatron_lm_current(config: Any, seq: int) -> float:
    """Training FLOPs per token by current Megatron-LM's ``num_floating_point_operations`` for a
    standard (non-MLA, non-hybrid) transformer, from a transformers config (text part).

    6 x [L x (h (q + 2 k) + q s + q h) + h F + h V]: 3 GEMM passes (forward, dgrad, wgrad) x 2 FLOPs
    per MAC; q = heads x head dim, k = KV groups x head dim; the attention term q s counts QK^T and
    AV over half the s x s square (causal); F = per-layer MLP width x 3 (SwiGLU) or x 2 over the
    dense layers, and top-k x expert width x 3 (+ shared experts) over the MoE layers; V the logits.
    """
    h = int(_first(config, "hidden_size", "n_embd", "d_model"))
    layers = int(_first(config, "num_hidden_layers", "n_layer", "num_layers"))
    if getattr(config, "is_encoder_decoder", False):
        layers += int(getattr(config, "num_decoder_layers", None) or getattr(config, "num_layers", 0))
    heads = int(_first(config, "num_attention_heads", "n_head", "num_heads"))
    head_dim = int(getattr(config, "head_dim", None) or getattr(config, "d_kv", None) or h // heads)
    groups = int(getattr(config, "num_key_value_heads", None) or heads)
    q, k = heads * head_dim, groups * head_dim
    act = str(getattr(config, "hidden_act", None) or getattr(config, "activation_function", "") or "")
    gated = getattr(config, "is_gated_act", None)
    swiglu = bool(gated) if gated is not None else act in ("silu", "swiglu", "swish")
    expansion = 3 if swiglu else 2
    dense_ffn = int(getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
                    or getattr(config, "d_ff", None) or 4 * h)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    moe_layers = 0
    if experts:
        sparse = set(getattr(config, "mlp_only_layers", None) or [])
        step = int(getattr(config, "decoder_sparse_step", 1) or 1)
        moe_layers = sum(1 for i in range(layers) if i not in sparse and (i + 1) % step == 0)
    routed = int(getattr(config, "num_experts_per_tok", 0) or 0) * int(getattr(config, "moe_intermediate_size", None) or dense_ffn)
    shared = int(getattr(config, "shared_expert_intermediate_size", 0) or 0)
    mlp = expansion * h * (dense_ffn * (layers - moe_layers) + (routed + shared) * moe_layers)
    attention = layers * (h * (q + 2 * k) + q * seq + q * h)
    return 6 * (attention + mlp + h * int(config.vocab_size))


def _first(config: Any, *names: str) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    raise AttributeError(f"{type(config).__name__} has none of {names}")


def measure(label: str, prompt: int) -> Dict[str, Any]:
    import warnings

    import torch
    import transformers

    import flopcount
    from flopcount.generation.count import count_generation

    warnings.simplefilter("ignore")
    model_type, overrides = MODELS[label]
    config = transformers.AutoConfig.for_model(model_type, **overrides)
    text = config.get_text_config()
    seq = prompt
    positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if model_type == "gpt2" and positions is not None:
        seq = min(prompt, int(positions) - 1)  # learned positions: the prompt and one decode step must fit
    auto = transformers.AutoModelForSeq2SeqLM if config.is_encoder_decoder else transformers.AutoModelForCausalLM
    started = time.perf_counter()
    with torch.device("meta"):
        model = auto.from_config(config, dtype=torch.bfloat16).eval()
    built = time.perf_counter() - started
    ids = torch.empty(1, seq, dtype=torch.int64, device="meta")

    started = time.perf_counter()
    gen = count_generation(model, ids, new_tokens=2)
    gen_s = time.perf_counter() - started

    started = time.perf_counter()
    kwargs: Dict[str, Any] = {"use_cache": False}
    if config.is_encoder_decoder:
        kwargs["decoder_input_ids"] = ids
    train = flopcount.count_flops(model, (ids,), kwargs, tracer="dispatch", backward=True)
    train_s = time.perf_counter() - started

    embeddings = 0
    inputs = model.get_input_embeddings()
    seen = {id(p) for p in inputs.parameters()}
    embeddings += sum(p.numel() for p in inputs.parameters())
    for name, module in model.named_modules():  # learned position tables (GPT-2's wpe)
        if isinstance(module, torch.nn.Embedding) and name.endswith(("wpe", "embed_positions", "position_embeddings")):
            embeddings += sum(p.numel() for p in module.parameters() if id(p) not in seen)
    n_active = gen.prefill.active_params - embeddings
    layers = int(getattr(text, "num_hidden_layers", None) or getattr(text, "num_layers", 0))
    if config.is_encoder_decoder:
        layers = int(getattr(config, "num_layers", 0)) + int(getattr(config, "num_decoder_layers", 0) or getattr(config, "num_layers", 0))
    hidden = int(getattr(text, "hidden_size", None) or getattr(text, "d_model"))
    heads = int(getattr(text, "num_attention_heads", None) or getattr(text, "num_heads"))
    head_dim = int(getattr(text, "head_dim", None) or getattr(text, "d_kv", None) or hidden // heads)
    vocab = int(text.vocab_size)
    d_attn = heads * head_dim
    train_per_token = train.flops / seq
    by_phase = train.by_phase()
    return {
        "model": label,
        "model_type": model_type,
        "prompt": seq,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "head_dim": head_dim,
        "vocab": vocab,
        "params": gen.prefill.params,
        "active_params": gen.prefill.active_params,
        "n_nonembedding_active": n_active,
        "prefill_flops": gen.prefill.flops,
        "prefill_macs": gen.prefill.macs,
        "decode_flops": gen.steps[0].flops,
        "kv_cache_bytes": gen.kv_cache_bytes,
        "train_flops_per_token": train_per_token,
        "train_forward_flops": by_phase.get("forward", 0),
        "train_backward_flops": by_phase.get("backward", 0),
        "kaplan_2n_prefill": 2 * n_active * seq,
        "cookbook_decode": 2 * n_active + 2 * layers * d_attn * (seq + 1),
        "six_n": 6 * n_active,
        "palm": 6 * n_active + 12 * layers * heads * head_dim * seq,
        "megatron": 72 * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * hidden * layers)),
        "megatron_current": megatron_lm_current(config if config.is_encoder_decoder else text, seq),
        "complete": gen.complete and train.complete,
        "incomplete_reasons": list(gen.incomplete_reasons()) + list(train.incomplete_reasons()),
        "build_s": built,
        "generation_s": gen_s,
        "training_s": train_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _g(value: float) -> str:
    return f"{value / 1e9:,.2f} G"


def _t(value: float) -> str:
    return f"{value / 1e12:,.2f} T"


def render(rows: List[Dict[str, Any]]) -> str:
    lines = [
        "| model | P | params (active) | prefill FLOPs | 2N·P | decode FLOPs/token | cookbook 2N + 2·L·d·ctx | KV cache (bf16) | time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['prompt']} | {r['params'] / 1e9:.2f} G ({r['active_params'] / 1e9:.2f} G) | {_t(r['prefill_flops'])} "
            f"| {_t(r['kaplan_2n_prefill'])} | {_g(r['decode_flops'])} | {_g(r['cookbook_decode'])} "
            f"| {r['kv_cache_bytes'] / 2**20:,.1f} MiB | {r['generation_s']:.1f} s |"
        )
    lines += [
        "",
        "| model | training FLOPs/token (measured) | 6N | PaLM 6N + 12·L·H·Q·T | Megatron-LM paper (2021) "
        "| Megatron-LM current | measured / 6N | time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {_g(r['train_flops_per_token'])} | {_g(r['six_n'])} | {_g(r['palm'])} | {_g(r['megatron'])} "
            f"| {_g(r['megatron_current'])} | {r['train_flops_per_token'] / r['six_n']:.3f} | {r['training_s']:.1f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--only", default="", help="comma-separated model_types (llama,mistral,mixtral,qwen3_moe,gpt2,t5)")
    parser.add_argument("--json", default="")
    parser.add_argument("--row", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row:
        print(json.dumps(measure(args.row, args.prompt)))
        return
    wanted = {w for w in args.only.split(",") if w}
    rows = []
    for label, (model_type, _) in MODELS.items():
        if wanted and model_type not in wanted:
            continue
        done = subprocess.run(
            [sys.executable, __file__, "--row", label, "--prompt", str(args.prompt)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            print(f"{label}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{label}: generation {row['generation_s']:.1f} s, training {row['training_s']:.1f} s, "
              f"peak RSS {row['peak_rss_mb']:.0f} MB, complete={row['complete']}", file=sys.stderr, flush=True)
    print(render(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
