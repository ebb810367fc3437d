"""flopcount.serve beside the config-formula calculators llm-analysis and GenZ (issue #31).

Same configurations, batch 1, 16-bit weights and cache, one decode step after a P-token prompt
(context P + 1), H100 SXM: decode FLOPs per token, bytes one decode step moves, KV-cache bytes
per token, weight memory. flopcount counts the model built on meta from transformers' config
(written from the published config.json, no download); the peers run their own formulas on their
own configs of the same models (llm-analysis: its shipped ``NousResearch_Llama-2-7b-hf``; GenZ:
``meta-llama/Llama-2-7B``, ``mistralai/Mistral-7B``, ``mistralai/Mixtral-8x7B``,
``ai21labs/Jamba-v0.1``). The peers live in their own venv (their pins conflict with ours):

    python3 -m venv /work/venv-peers && /work/venv-peers/bin/pip install llm-analysis \\
        "transformers==4.30.2" "huggingface-hub==0.14.1" && /work/venv-peers/bin/pip install genz-llm
    .venv/bin/python benchmarks/serve_peers.py [--peers-python /work/venv-peers/bin/python]

GenZ prints MB as MiB (2^20 bytes); its "MACs" are converted to FLOPs (x 2).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (label, transformers model type, config overrides, dtype, prompt, GenZ name, llm-analysis config or None)
MODELS: List[Any] = [
    ("LLaMA-2-7B", "llama", dict(tie_word_embeddings=False), "float16", 2048, "meta-llama/Llama-2-7B",
     "NousResearch_Llama-2-7b-hf"),
    # Mistral-7B-v0.1: window 4096, so a prompt of 8192 puts the context past it
    ("Mistral-7B (window 4096)", "mistral", dict(sliding_window=4096, max_position_embeddings=32768), "bfloat16", 8192,
     "mistralai/Mistral-7B", "custom:mistral"),
    ("Mixtral-8x7B (8 experts, top 2)", "mixtral", dict(sliding_window=None), "bfloat16", 2048,
     "mistralai/Mixtral-8x7B", "custom:mixtral"),
    # Jamba-v0.1 (transformers' default jamba config): 1 attention layer in 8, MoE every other layer
    ("Jamba-v0.1 (Mamba + attention + MoE)", "jamba", dict(use_mamba_kernels=False), "bfloat16", 128,
     "ai21labs/Jamba-v0.1", "custom:jamba"),
]

PEERS = r'''
import json, sys, warnings
warnings.filterwarnings("ignore")
out = {}
label, prompt, genz_name, la_name = json.loads(sys.argv[1])
try:
    from GenZ import decode_moddeling
    system = {"Flops": 989.5, "Memory_size": 80, "Memory_BW": 3350, "ICN": 450, "real_values": True}
    _, table = decode_moddeling(model=genz_name, batch_size=1, input_tokens=prompt, output_tokens=1, Bb=1,
                                system_name=system, bits="bf16", model_profilling=True)
    row = table.to_dict("records")[0]
    mib = 2 ** 20
    out["genz"] = {"flops": 2e6 * row["MACs (MFLOP)"], "bytes": row["Total Data (MB)"] * mib,
                   "kv_per_token": row["KV Cache (MB)"] * mib / (prompt + 1), "weights": row["Total Weights (MB)"] * mib}
except Exception as exc:
    out["genz"] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
try:
    from llm_analysis.analysis import LLMAnalysis
    from llm_analysis.config import ModelConfig, get_dtype_config_by_name, get_gpu_config_by_name, get_model_config_by_name
    if la_name.startswith("custom:"):
        kind = la_name.split(":")[1]
        spec = {"mistral": dict(num_layers=32, n_head=32, hidden_dim=4096, vocab_size=32000, num_key_value_heads=8,
                                ffn_embed_dim=14336),
                "mixtral": dict(num_layers=32, n_head=32, hidden_dim=4096, vocab_size=32000, num_key_value_heads=8,
                                ffn_embed_dim=14336, moe_num_experts=8, moe_top_k=2),
                "jamba": dict(num_layers=32, n_head=32, hidden_dim=4096, vocab_size=65536, num_key_value_heads=8,
                              ffn_embed_dim=14336, moe_num_experts=16, moe_top_k=2)}[kind]
        model = ModelConfig(name=kind, max_seq_len=32768, **spec)
    else:
        model = get_model_config_by_name(la_name)
    analysis = LLMAnalysis(model, get_gpu_config_by_name("h100-sxm-80gb"), get_dtype_config_by_name("w16a16e16"),
                           flops_efficiency=1.0, hbm_memory_efficiency=1.0)
    summary = analysis.inference(batch_size_per_gpu=1, seq_len=prompt, num_tokens_to_generate=1)
    layers = model.num_layers
    out["llm-analysis"] = {"flops": summary["decode_num_flops_fwd_total"], "bytes": None,
                           "kv_per_token": layers * analysis.get_memory_kv_cache_per_layer(1, 1, 2),
                           "weights": summary["weight_memory_per_gpu"]}
except Exception as exc:
    out["llm-analysis"] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
print(json.dumps(out))
'''


def _ours(kind: str, overrides: Dict[str, Any], dtype: str, prompt: int) -> Dict[str, float]:
    import torch
    import transformers

    from flopcount.devices import named_roofs
    from flopcount.serving import serve_facts, serve_on

    config = transformers.AutoConfig.for_model(kind, **overrides)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    ids = torch.zeros(1, prompt, dtype=torch.int64, device="meta")
    started = time.perf_counter()
    facts = serve_facts(model, ids, 2)
    result = serve_on(facts, named_roofs("h100"), "H100 SXM", 80e9, "nvlink4", batch=[1])
    row = result.at(1)
    assert row.first_step is not None
    held_per_token = facts.at("cache_held", 1) / (prompt + 1)
    return {"flops": facts.step_at(1, 0).flops, "bytes": row.first_step.bytes,
            "kv_per_token": result.kv_bytes_per_token, "kv_held_per_position": held_per_token,
            "weights": result.weight_bytes, "seconds": time.perf_counter() - started}


def _fmt(value: Any, scale: float, unit: str) -> str:
    return "—" if value is None else f"{value / scale:,.3f} {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers-python", default="/work/venv-peers/bin/python")
    parser.add_argument("--only", default=None, help="a label prefix, e.g. LLaMA")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print("| model (prompt P) | tool | decode FLOPs/token | bytes per decode step | KV bytes/token (growth) | "
          "KV cache held at context P + 1 | weights |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, kind, overrides, dtype, prompt, genz, la in MODELS:
        if args.only and not label.startswith(args.only):
            continue
        ours = _ours(kind, overrides, dtype, prompt)
        done = subprocess.run([args.peers_python, "-c", PEERS, json.dumps([label, prompt, genz, la])],
                              capture_output=True, text=True, timeout=900)
        try:
            peers = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            peers = {"genz": {"error": done.stderr[-200:]}, "llm-analysis": {"error": done.stderr[-200:]}}
        name = f"{label} (P={prompt})"
        print(f"| {name} | flopcount | {_fmt(ours['flops'], 1e9, 'G')} | {_fmt(ours['bytes'], 1e9, 'GB')} | "
              f"{ours['kv_per_token']:,.0f} B | {_fmt(ours['kv_held_per_position'] * (prompt + 1), 1e9, 'GB')} | "
              f"{_fmt(ours['weights'], 1e9, 'GB')} |")
        for tool in ("llm-analysis", "genz"):
            got = peers.get(tool, {})
            if "error" in got:
                print(f"| {name} | {tool} | refused: {got['error']} | | | | |")
                continue
            print(f"| {name} | {tool} | {_fmt(got['flops'], 1e9, 'G')} | {_fmt(got['bytes'], 1e9, 'GB')} | "
                  f"{got['kv_per_token']:,.0f} B | {_fmt(got['kv_per_token'] * (prompt + 1), 1e9, 'GB')} | "
                  f"{_fmt(got['weights'], 1e9, 'GB')} |")
        print(f"<!-- {label}: flopcount counted in {ours['seconds']:.1f} s; cache held at the end "
              f"{ours['kv_held_per_position']:,.0f} B per prompt position -->", flush=True)


if __name__ == "__main__":
    main()
