"""Issue #30's artifact target: ``flopcount count model.pt2`` of an exported ResNet-50 (full size,
1x3x224x224) and of an exported 2-layer LLaMA gives the same MACs, FLOPs and params as counting the
eager model it was exported from, with no ``--input``; and what reading the file costs.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/artifact_counts.py``. Prints, per model: the eager
count, the ``.pt2`` count through the CLI (``main(["count", PATH, "--format", "json"])``, no
``--input``), the independent figure (ResNet-50: REFERENCES.md's published 4,089,184,256 MACs and
torchvision's 25,557,032 params; LLaMA: the analytical count of REFERENCES.md), and the seconds spent exporting,
reading (``torch.export.load``, ``torch.export.unflatten``) and counting.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

import torch

from flopcount import count_flops
from flopcount.cli import main

RESNET50_MACS = 4_089_184_256  # REFERENCES.md: conv + linear MACs at 1x3x224x224
RESNET50_PARAMS = 25_557_032  # torchvision's num_params


def cli_count(path: Path) -> Dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["count", str(path), "--format", "json", "--quiet"])
    if code != 0:
        raise SystemExit(f"count {path} exited {code}: {err.getvalue()}")
    data: Dict[str, Any] = json.loads(out.getvalue())
    return data


def timed(fn: Any) -> Any:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def one(name: str, model: torch.nn.Module, args: tuple, kwargs: Dict[str, Any], expected_macs: int, expected_params: int, folder: Path) -> bool:
    import transformers.modeling_outputs  # noqa: F401  (registers LLaMA's output type for the direct load below)

    eager, t_eager = timed(lambda: count_flops(model, args, kwargs or None))
    program, t_export = timed(lambda: torch.export.export(model, args, kwargs))
    path = folder / f"{name}.pt2"
    torch.export.save(program, path)
    loaded, t_load = timed(lambda: torch.export.load(path))
    _, t_unflatten = timed(lambda: torch.export.unflatten(loaded))
    data, t_cli = timed(lambda: cli_count(path))
    same = (data["macs"], data["flops"], data["params"]) == (eager.macs, eager.flops, eager.params)
    oracle = data["macs"] == expected_macs and data["params"] == expected_params
    print(f"{name}: inputs {data['inputs']}")
    print(f"  eager    MACs {eager.macs:,}  FLOPs {eager.flops:,}  params {eager.params:,}  ({t_eager:.2f} s)")
    print(f"  .pt2     MACs {data['macs']:,}  FLOPs {data['flops']:,}  params {data['params']:,}  (CLI, no --input: {t_cli:.2f} s)")
    print(f"  oracle   MACs {expected_macs:,}  params {expected_params:,}")
    print(f"  same as eager: {same}; equals the oracle: {oracle}")
    print(f"  export {t_export:.2f} s, torch.export.load {t_load:.2f} s, unflatten {t_unflatten:.2f} s, file {path.stat().st_size / 1e6:.1f} MB")
    return same and oracle


def main_() -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    from flopcount.examples.resnet import resnet50

    torch.manual_seed(0)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ok &= one("resnet50", resnet50().eval(), (torch.randn(1, 3, 224, 224),), {}, RESNET50_MACS, RESNET50_PARAMS, folder)
        # a 2-layer LLaMA (grouped-query attention, SwiGLU, LLaMA's vocabulary), 2 sequences of 128 tokens
        L, d, heads, kv, inter, vocab, B, T = 2, 1024, 16, 4, 2816, 32000, 2, 128
        config = LlamaConfig(num_hidden_layers=L, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                             intermediate_size=inter, vocab_size=vocab, max_position_embeddings=4096, use_cache=False)
        llama = LlamaForCausalLM(config).eval()
        ids = torch.randint(0, vocab, (B, T))
        head_dim = d // heads
        per_layer = 2 * d * d + 2 * d * kv * head_dim + 3 * d * inter
        macs = B * T * (L * per_layer + d * vocab) + B * L * 2 * T * T * d  # REFERENCES.md: dense + attention
        params = vocab * d + L * (per_layer + 2 * d) + d + d * vocab
        ok &= one("llama_2layer", llama, (ids,), {}, macs, params, folder)
    print("all equal" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main_())
