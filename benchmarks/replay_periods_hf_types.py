"""Which transformers causal-LM types have a stack of layers that alternate between kinds, and
which period the layer replay (flopcount.step.replay.find_stack) finds for it (issue #32,
helper periodreplay).

Each type of benchmarks/zoo_reuse_hf_types.py is built from its tiny config on the meta device
with ``--layers`` layers (24), its per-layer patterns (``layer_types``...) repeated from their
start as the config gives them (not zoo_reuse_hf_types' rearranged first three, which would
break the period). The longest ModuleList of 12+ layers is reported as: "period 1" (identical
layers, replayed before periods too), "period p" (p > 1: units of p layers, replayed since), or
"head h, period p" (since headreplay: h layers of other kinds, then a run of period p), or
"refused" (its layers differ otherwise). ``find_stack``'s floor on the units (``MIN_LAYERS``) is
lowered to ``--min-units`` (4) here, so that a long period is listed with how many units the
stack holds; the replay itself takes a period only where the stack holds ``MIN_LAYERS`` units::

    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/replay_periods_hf_types.py [--layers 24] [--match gemma]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, List, Optional

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import zoo  # noqa: E402
import zoo_reuse_hf_types as hf_types  # noqa: E402

from flopcount.step import replay  # noqa: E402


def repeated(kinds: List[Any], layers: int = hf_types.LAYERS) -> List[Any]:
    """``kinds`` made ``layers`` long by repeating it from its start (the config's own order)."""
    return [kinds[index % len(kinds)] for index in range(layers)]


def longest_list(model: torch.nn.Module) -> Optional[torch.nn.Module]:
    lists = [m for m in model.modules() if type(m) in (torch.nn.ModuleList, torch.nn.Sequential) and len(m) >= 12]
    return max(lists, key=len) if lists else None


def kinds(layers: torch.nn.Module) -> str:
    """The layers' classes and their attention kind, where they say it, as a short pattern."""
    names = []
    for layer in layers:
        attention = next((m for m in layer.modules() if hasattr(m, "sliding_window") or hasattr(m, "is_sliding")), None)
        window = getattr(attention, "sliding_window", getattr(attention, "is_sliding", None)) if attention is not None else None
        names.append(f"{type(layer).__name__}{'/s' if window else ''}")
    distinct = list(dict.fromkeys(names))
    return "".join("ABCDEFGH"[distinct.index(n)] if len(distinct) <= 8 else "?" for n in names)


def main(argv: Optional[List[str]] = None) -> int:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--min-units", type=int, default=4)
    parser.add_argument("--match", default=None)
    args = parser.parse_args(argv)
    hf_types.shortened_pattern = repeated
    replay.MIN_LAYERS = args.min_units
    by_outcome: dict = {}
    for model_type, class_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if args.match and args.match not in model_type:
            continue
        try:
            model = hf_types.build(model_type, class_name, "meta", hf_types.TASKS["causal-lm"], args.layers)
        except Exception as exc:
            by_outcome.setdefault("not built", []).append(model_type)
            print(f"{model_type}: not built ({zoo.first_line(exc)[:80]})", flush=True)
            continue
        layers = longest_list(model)
        if layers is None:
            by_outcome.setdefault("no list of 12+", []).append(model_type)
            continue
        stack = replay.find_stack(model)
        if stack is None:
            outcome = "refused"
        elif stack.layers is not layers:
            outcome = f"another list ({len(stack)} layers, period {stack.period})"
        elif stack.head:  # layers of other kinds before the run (headreplay)
            outcome = f"head {stack.head}, period {stack.period}"
        else:
            outcome = f"period {stack.period}"
        by_outcome.setdefault(outcome, []).append(model_type)
        units = f", {stack.units} units" if stack is not None else ""
        print(f"{model_type}: {len(layers)} layers {kinds(layers)}: {outcome}{units}", flush=True)
    print()
    for outcome, types in sorted(by_outcome.items()):
        print(f"{outcome}: {len(types)}: {' '.join(types)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
