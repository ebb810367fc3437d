"""A digest of every figure ``count_generation`` publishes, per configuration of its tests, to compare
two trees (issue #32: the deferred step tables must be the tables booked before, figure for figure).

    PYTHONPATH=. python benchmarks/generation_tables_digest.py > after.txt
    git archive BASE | tar -x -C /tmp/base && cp benchmarks/generation_tables_digest.py /tmp/base/benchmarks/
    (cd /tmp/base && PYTHONPATH=. python benchmarks/generation_tables_digest.py) > before.txt
    diff before.txt after.txt

(The script counts with the flopcount of the tree it sits in: copy it into the base tree.)

Per configuration (GPT-2, LLaMA with grouped-query attention, Mistral with its window crossed inside
the decode and not reached, Mamba, T5, Mixtral, a static cache of two lengths, chunked prefill), on
CPU (real weights) and meta: the prefill's and every decode step's totals, per-operator, per-module,
module x operator and per-phase tables in all five metrics, descriptions, warnings, unsupported ops,
the KV cache figures, ``to_dict()`` and ``table()``, hashed (SHA-256, first 16 hex digits).
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

B = 2
#: (family, config extras, generate() options, prompt, new tokens)
CASES: List[Tuple[str, Dict[str, Any], Dict[str, Any], int, int]] = [
    ("gpt2", {}, {}, 6, 20), ("llama", {}, {}, 6, 20), ("mistral", {"sliding_window": 16}, {}, 4, 24),
    ("mistral", {"sliding_window": 64}, {}, 12, 24), ("mamba", {}, {}, 6, 16), ("t5", {}, {}, 6, 16),
    ("mixtral", {}, {}, 6, 16), ("llama", {}, {"cache_implementation": "static"}, 6, 16),
    ("llama", {}, {"prefill_chunk_size": 4}, 10, 16),
    ("llama", {}, {"cache_implementation": "static", "max_cache_len": 64}, 6, 16),
]


def _config(kind: str, **extra: Any) -> Any:
    import transformers

    common = dict(vocab_size=64)
    if kind == "gpt2":
        return transformers.AutoConfig.for_model("gpt2", n_embd=32, n_layer=3, n_head=4, n_positions=256, **common)
    if kind == "mamba":
        return transformers.AutoConfig.for_model("mamba", hidden_size=32, state_size=4, num_hidden_layers=3, expand=2,
                                                 conv_kernel=4, **common)
    if kind == "t5":
        return transformers.AutoConfig.for_model("t5", d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2,
                                                 num_decoder_layers=2, decoder_start_token_id=0, pad_token_id=0, **common)
    if kind == "mixtral":
        return transformers.AutoConfig.for_model(
            "mixtral", hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256, **common, **extra)
    return transformers.AutoConfig.for_model(
        kind, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, **common, **extra)


def _figures(result: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {
        "totals": [result.flops, result.macs, result.bytes_read, result.bytes_written],
        "inputs": result.input_description, "warnings": list(result.warnings), "unsupported": result.unsupported_ops(),
    }
    for metric in ("flops", "macs", "count", "bytes_read", "bytes_written"):
        out[f"operator {metric}"] = result.by_operator(metric)
        out[f"module {metric}"] = result.by_module(metric)
        out[f"module x operator {metric}"] = result.by_module_and_operator(metric)
        out[f"phase {metric}"] = result.by_phase(metric)
    return out


def main() -> None:
    import torch
    import transformers

    from flopcount import count_generation

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    for kind, extra, options, prompt, new in CASES:
        for device in ("cpu", "meta"):
            auto = transformers.AutoModelForSeq2SeqLM if kind == "t5" else transformers.AutoModelForCausalLM
            torch.manual_seed(0)
            with torch.device(device):
                model = auto.from_config(_config(kind, **extra)).eval()
            model.generation_config.eos_token_id = None
            torch.manual_seed(1)
            ids = torch.randint(1, 64, (B, prompt)).to(device)
            result = count_generation(model, ids, new, **options)
            document = {
                "prefill": _figures(result.prefill), "steps": [_figures(step) for step in result.steps],
                "cache": [result.kv_cache_bytes, result.kv_cache_position_bytes, result.kv_cache_dtype],
                "warnings": list(result.warnings), "dict": result.to_dict(), "table": result.table(),
            }
            digest = hashlib.sha256(json.dumps(document, default=str).encode()).hexdigest()[:16]
            continued = any("affine continuation" in w for w in result.warnings)
            print(f"{kind:8s} {json.dumps(extra):24s} {json.dumps(options):60s} {device:4s} "
                  f"{'continued' if continued else 'traced':9s} {digest}", flush=True)


if __name__ == "__main__":
    main()
