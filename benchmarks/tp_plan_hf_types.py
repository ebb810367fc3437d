"""The built-in LLaMA-family tensor-parallel plan on every transformers causal-LM type that has
its names (branch tpfit): which types it plans, and which it refuses and why.

Each causal-LM type of benchmarks/zoo_reuse_hf_types.py is first built on meta
(``build(..., "meta", ...)``, :data:`LAYERS` layers) to see whether its repeated block has the
LLaMA-family names (``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj``, all
``nn.Linear``: what ``builtin_tp_plan`` takes). Each that has is then planned for real, as
benchmarks/zoo_replay_hf_types.py's reading (3) does: built with 14 layers on CPU in train mode,
its cache off, ``plan(build, ids, fsdp=2, tp=2)``. One line per type: ``planned`` and a digest of
``to_dict()`` (to compare two trees' per-rank figures), or the error's type and first line.
``--repeat N``: the CPU time said is the median of N calls (the time to a plan or a refusal).
``--skip`` leaves types out (:data:`SKIP`: gemma4's tiny config is about 1 B parameters)::

    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/tp_plan_hf_types.py --list
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/tp_plan_hf_types.py > after.txt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import List, Optional

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import zoo  # noqa: E402
import zoo_reuse_hf_types as hf_types  # noqa: E402
from zoo_replay_hf_types import LAYERS, training_model  # noqa: E402

import flopcount  # noqa: E402
from flopcount.planning.world import transformer_blocks  # noqa: E402

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
SKIP = ("gemma3n", "gemma4", "gemma4_text")  # gemma3n needs timm; gemma4 is ~1 B parameters at 14 layers


def llama_named(block: nn.Module) -> bool:
    """Whether the block has the names the built-in LLaMA-family plan takes."""
    attn, mlp = getattr(block, "self_attn", None), getattr(block, "mlp", None)
    if attn is None or mlp is None:
        return False
    attention_linears = all(isinstance(getattr(attn, name, None), nn.Linear) for name in ATTENTION)
    mlp_linears = all(isinstance(getattr(mlp, name, None), nn.Linear) for name in MLP)
    return attention_linears and mlp_linears


def llama_types(skip: List[str]) -> List[str]:
    types = []
    for model_type, class_name in hf_types.task_types(hf_types.TASKS["causal-lm"]).items():
        if model_type in skip:
            continue
        try:
            model = hf_types.build(model_type, class_name, "meta", hf_types.TASKS["causal-lm"], LAYERS)
        except Exception:
            continue  # the sweep does not build it either
        _, blocks = transformer_blocks(model)
        if blocks and llama_named(blocks[0]):
            types.append(model_type)
    return types


def outcome(model_type: str) -> str:
    class_name = hf_types.task_types(hf_types.TASKS["causal-lm"])[model_type]
    ids = hf_types.prompt(None)
    try:
        with zoo.quiet():
            result = flopcount.plan(lambda: training_model(model_type, class_name), (ids,), fsdp=2, tp=2)
    except Exception as exc:
        return f"{type(exc).__name__}: {zoo.first_line(exc)[:300]}"
    digest = hashlib.sha256(json.dumps(result.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"planned {digest}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="only list the types with LLaMA-family names")
    parser.add_argument("--types", default=None, help="these types (comma-separated) instead of the listed ones")
    parser.add_argument("--repeat", type=int, default=1, help="the median CPU time of this many calls")
    parser.add_argument("--skip", default=",".join(SKIP), help="types left out (comma-separated)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    types = args.types.split(",") if args.types else llama_types(args.skip.split(","))
    print(f"{len(types)} types: {' '.join(types)}", flush=True)
    if args.list:
        return 0
    for model_type in types:
        seconds = []
        for _ in range(args.repeat):
            cpu = time.process_time()
            said = outcome(model_type)
            seconds.append(time.process_time() - cpu)
        print(f"{model_type}\t{said}\t{statistics.median(seconds):.3f} s CPU", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
