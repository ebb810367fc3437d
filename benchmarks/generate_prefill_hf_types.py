"""count_generation's prefill with and without the model's ``prepare_inputs_for_generation``,
against FlopCounterMode on the real ``generate()``, on every transformers model type of a
generating head (branch genprep: generate()'s ``_prefill`` makes the prefill's inputs with the
preparer, XLM appends its mask token there; count_generation's prefill now does the same).

Each type is built as ``zoo_reuse_hf_types.py`` builds it (tiny config, real weights, batch 2,
its main input); a type whose ``generate()`` fails without flopcount is skipped. For each:

* the truth: FlopCounterMode live around each forward of a real greedy ``generate()``
  (``max_new_tokens = min_new_tokens = NEW_TOKENS``, SDPA on its math backend), and around the
  whole call (an encoder-decoder's encoder runs outside its forwards: the prefill's truth is the
  whole call less the decode steps);
* ``count_generation(model, main input, NEW_TOKENS)`` as it is ("with"), and with the prefill fed
  the call as made, not passed through the preparer ("without": the count before genprep);
  FLOPs as 2 x MACs (FlopCounterMode counts the contractions).

Prints one line per type whose counts differ with and without the preparer, or differ from the
truth, and a summary; exit status 1 where "with" is further from the truth than "without"::

    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/generate_prefill_hf_types.py --match xlm
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/generate_prefill_hf_types.py --task seq2seq
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from unittest import mock

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))  # the live oracles

import zoo  # noqa: E402
from _live_oracles import forward_flops  # noqa: E402
from zoo_reuse_hf_types import NEW_TOKENS, TASKS, build, main_input, plain_generate_error, task_types  # noqa: E402

import flopcount  # noqa: E402
from flopcount.decoding.forwards import Setup  # noqa: E402


def truth(model: torch.nn.Module, main: torch.Tensor) -> List[int]:
    """FlopCounterMode's FLOPs of the real generate(): the prefill (its encoder included), then
    each decode step."""
    with forward_flops(model) as steps:
        with zoo.quiet(), torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as whole:
            model.generate(main, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return [whole.get_total_flops() - sum(steps[1:])] + steps[1:]


def counted(model: torch.nn.Module, main: torch.Tensor, preparer: bool) -> Tuple[List[int], bool]:
    """count_generation's FLOPs (2 x MACs) of the prefill, then of each decode step; without
    ``preparer``, the prefill fed the call as made (the count before genprep). Also whether a
    forward ran ``aten::_grouped_mm`` (experts), which FlopCounterMode does not count
    (docs/conventions.md)."""
    as_made = Setup.prefill_call

    def without_preparer(setup: Setup, index: int, cache: Any = None) -> Any:
        setup._prepare = None
        return as_made(setup, index, cache)

    patch = mock.patch.object(Setup, "prefill_call", without_preparer) if not preparer else mock.patch.dict({})
    with zoo.quiet(), patch:
        result = flopcount.count_generation(model, main, NEW_TOKENS)
    forwards = [result.prefill, *result.steps]
    grouped = any(forward.by_operator("flops").get("aten::_grouped_mm", 0) for forward in forwards)
    return [2 * forward.macs for forward in forwards], grouped


def distance(counts: List[int], reference: List[int]) -> int:
    return sum(abs(a - b) for a, b in zip(counts, reference)) + abs(len(counts) - len(reference)) * 10**18


def compare(model_type: str, class_name: str, task: Any) -> Tuple[str, Optional[str]]:
    """("same" | "moved toward" | "moved away" | "failed", the line to print or None)."""
    model = build(model_type, class_name, None, task)
    main = main_input(model, None)
    real = truth(model, main)
    results: Dict[bool, List[Any]] = {}
    grouped = False
    for preparer in (True, False):
        try:
            results[preparer], experts = counted(model, main, preparer)
            grouped = grouped or experts
        except Exception as exc:
            results[preparer] = [f"{type(exc).__name__}: {zoo.first_line(exc)[:100]}"]
    with_, without = results[True], results[False]
    if with_ == without:
        if with_ == real:
            return "same", None
        why = " (its experts' _grouped_mm, which FlopCounterMode does not count)" if grouped else ""
        return "same", f"SAME, NOT THE TRUTH{why} {model_type}: counted {with_}, FlopCounterMode {real}"
    if isinstance(with_[0], str):
        return "failed", f"FAILED {model_type}: with the preparer {with_[0]}; without {without}; truth {real}"
    if isinstance(without[0], str) or distance(with_, real) < distance(without, real):
        verdict = "moved toward"
    else:
        verdict = "moved away"
    exact = "= truth" if with_ == real else "!= truth"
    return verdict, (f"{verdict.upper()} {model_type}: prefill {without[0]} -> {with_[0]} (truth {real[0]}); "
                     f"steps {without[1:]} -> {with_[1:]} (truth {real[1:]}); {exact}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--match", default=None, help="only model types containing this text")
    parser.add_argument("--task", choices=("causal-lm", "seq2seq", "speech-seq2seq"), default="causal-lm")
    args = parser.parse_args(argv)
    task = TASKS[args.task]
    types = [(t, c) for t, c in task_types(task).items() if not args.match or args.match in t]
    torch.set_num_threads(1)
    tally = {"same": 0, "moved toward": 0, "moved away": 0, "failed": 0, "skipped": 0}
    start, cpu_start = time.perf_counter(), time.process_time()
    for model_type, class_name in types:
        if plain_generate_error(model_type, class_name, task) is not None:
            tally["skipped"] += 1
            continue
        try:
            verdict, line = compare(model_type, class_name, task)
        except Exception as exc:  # the truth itself could not be taken (FlopCounterMode, generate)
            verdict, line = "skipped", f"NO TRUTH {model_type}: {type(exc).__name__}: {zoo.first_line(exc)[:120]}"
        tally[verdict] += 1
        if line:
            print(line, flush=True)
    print(f"\n{len(types)} {args.task} types: " + ", ".join(f"{count} {name}" for name, count in tally.items())
          + f"; {time.perf_counter() - start:.0f} s wall, {time.process_time() - cpu_start:.0f} s CPU", flush=True)
    return 1 if tally["moved away"] or tally["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
