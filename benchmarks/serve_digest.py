"""A digest of what ``flopcount.serve`` publishes, to compare two trees (issue #27: a clean-up of
the serving count must leave every figure as it was).

    PYTHONPATH=. python benchmarks/serve_digest.py > after.txt
    git archive BASE | tar -x -C /tmp/base && cp benchmarks/serve_digest.py /tmp/base/benchmarks/
    (cd /tmp/base && PYTHONPATH=. python benchmarks/serve_digest.py) > before.txt
    diff before.txt after.txt

Per configuration (GPT-2, LLaMA with grouped-query attention, Mixtral, Mistral with a window the
decode crosses), on CPU (real weights) and meta, with the derived count and with both batch sizes
counted in full: the ``ServeFacts`` and ``serve(...).to_dict()`` (batches 1, 4 and 32 on an H100,
wall time left out), hashed (SHA-256, first 16 hex digits). Needs transformers.
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import transformers

from flopcount.serving.serve import serve, serve_facts

_DECODER: Dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=50, max_position_embeddings=256)
CASES: Dict[str, Dict[str, Any]] = {
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, vocab_size=50, n_positions=256),
    "llama": dict(_DECODER, head_dim=8),
    "mixtral": dict(_DECODER, num_local_experts=4, num_experts_per_tok=2),
    "mistral": dict(_DECODER, sliding_window=16),
}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def main() -> None:
    warnings.simplefilter("ignore")
    for kind, extra in CASES.items():
        for device in ("cpu", "meta"):
            config = transformers.AutoConfig.for_model(kind, **extra)
            config._attn_implementation = "eager"
            torch.manual_seed(0)
            with torch.device(device):
                model = transformers.AutoModelForCausalLM.from_config(config).eval()
            model.generation_config.eos_token_id = None
            ids = torch.zeros(2, 6, dtype=torch.int64, device=device)
            for derived in (True, False):
                facts = serve_facts(model, ids, 12, derived=derived)
                published = serve(model, ids, 12, on="h100", batch=[1, 4, 32]).to_dict()
                published.pop("wall_s", None)
                print(f"{kind:8s} {device:4s} {'derived' if derived else 'full':7s} facts {_digest(facts.__dict__)} "
                      f"result {_digest(published)}", flush=True)


if __name__ == "__main__":
    main()
