"""Every operator of each forward of a real greedy generate() against count_generation, on the
tiny transformers types of benchmarks/zoo_reuse_hf_types.py (branch genall).

The oracle is tests/_live_oracles.py ``generate_all_flops``: the arguments of each real forward
replayed under flopcount's dispatch tracer, FLOPs by operator. Compared per forward with
``count_generation(model, main input, NEW_TOKENS, trace_every_step=True)`` on the model with real
weights and on a copy built on meta. One line per type: the oracle's per-forward totals, then for
real and meta "equal" or the first differing forward, by how much, and the operators that differ::

    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/generate_all_flops_hf_types.py llama gpt2
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/generate_all_flops_hf_types.py --task seq2seq t5 bart
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/generate_all_flops_hf_types.py --all
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import zoo_reuse_hf_types as hf_types  # noqa: E402
from _live_oracles import generate_all_flops  # noqa: E402

from flopcount import count_generation  # noqa: E402

NEW_TOKENS = 4


def _differ(mine: Dict[str, int], truth: Dict[str, int]) -> Dict[str, tuple]:
    return {op: (mine.get(op, 0), truth.get(op, 0)) for op in sorted(set(mine) | set(truth))
            if mine.get(op, 0) != truth.get(op, 0)}


def compare(model_type: str, class_name: str, task: hf_types.Task) -> str:
    model = hf_types.build(model_type, class_name, None, task)
    ids = hf_types.main_input(model, None)
    truth = generate_all_flops(model, ids, NEW_TOKENS)
    totals = [sum(forward.values()) for forward in truth]
    parts: List[str] = []
    for device in ("real", "meta"):
        if device == "real":
            counted = count_generation(model, ids, NEW_TOKENS, trace_every_step=True)
        else:
            meta = hf_types.build(model_type, class_name, "meta", task)
            counted = count_generation(meta, ids.to("meta"), NEW_TOKENS, trace_every_step=True)
        forwards = [result.by_operator() for result in (counted.prefill, *counted.steps)]
        if len(forwards) != len(truth):
            parts.append(f"{device}: {len(forwards)} forwards, generate() ran {len(truth)}")
            continue
        differing = [k for k, (mine, oracle) in enumerate(zip(forwards, truth)) if sum(mine.values()) != totals[k]]
        if not differing:
            parts.append(f"{device}: equal")
            continue
        first = differing[0]
        delta = sum(forwards[first].values()) - totals[first]
        parts.append(f"{device}: forward {first} {delta:+d} {_differ(forwards[first], truth[first])} "
                     f"({len(differing)} of {len(truth)} differ)")
    return f"{model_type} {totals} | " + " | ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", help="model types (default with --all: every type of the task)")
    parser.add_argument("--task", choices=["causal-lm", "seq2seq"], default="causal-lm")
    parser.add_argument("--all", action="store_true", help="every model type of the task's mapping")
    args = parser.parse_args()
    import transformers.models.auto.modeling_auto as modeling_auto

    task = hf_types.TASKS[args.task]
    mapping = getattr(modeling_auto, task.mapping)
    differ = 0
    for model_type in list(mapping) if args.all else args.types:
        try:
            line = compare(model_type, mapping[model_type], task)
        except Exception as exc:  # a type that does not build or generate: said, not fatal
            line = f"{model_type} not run: {type(exc).__name__}: {str(exc)[:160]}"
        differ += " | " in line and line.count(": equal") != 2
        print(line, flush=True)
    print(f"{differ} type(s) differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
