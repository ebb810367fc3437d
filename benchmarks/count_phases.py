"""Where a default count's time goes (issue #32 step 1): the CPU time of each stage of
``count_flops`` on a meta copy of ResNet-50 1x3x224x224, BERT-base 1x128, GPT-2 small 1x256
and LLaMA-2-70B's config at 1x4096, beside ``FlopCounterMode`` on the same meta copy.

CPU time of the counting thread (``time.thread_time``), not wall time: on a shared machine the
wall clock measures the other jobs too. Minimum over the repeats, with the garbage collector off
while they run (its full passes walk the whole heap and land in whichever stage allocates when the
threshold trips); the collector's passes per count are measured separately, with it on. A stage
nested in another is also inside its parent's figure (structure, first calls and replays are
inside the trace).

    PYTHONPATH=. .venv/bin/python benchmarks/count_phases.py [--repeats 15] [--only gpt2,70b] [--real]
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from bench_fastpath import CASES  # noqa: E402
from bench_reuse import meta_copy  # noqa: E402
from torch import nn  # noqa: E402

import flopcount.core.analysis as analysis  # noqa: E402
import flopcount.core.ledger as ledger  # noqa: E402
import flopcount.core.results as results  # noqa: E402
import flopcount.tracers._reuse as reuse  # noqa: E402
import flopcount.tracers.dispatch as dispatch  # noqa: E402
import flopcount.tracers.fake.copies as copies  # noqa: E402
from flopcount import count_flops  # noqa: E402
from flopcount.core.model_facts import ModelFacts  # noqa: E402

warnings.simplefilter("ignore")

# (module, attribute, label): the stages timed, wrapped for the run of this script only
STAGES: Tuple[Tuple[Any, str, str], ...] = (
    (analysis, "model_facts", "model facts"),
    (analysis, "trace", "trace (all of it)"),
    (dispatch, "fake_copies", "  fake copy"),
    (copies.LazyCopy, "read_all", "    of which tensor keys read up front"),
    (reuse.Reuse, "install", "  reuse: install"),
    (reuse.Reuse, "_structure", "  reuse: structural keys"),
    (reuse.Reuse, "_match", "  reuse: entries matched (reads compared)"),
    (reuse.Reuse, "_first", "  reuse: first calls (nested ones counted again)"),
    (copies.LazyCopy, "copies_of", "    of which their subtrees copied"),
    (reuse.Reuse, "_finish", "    of which their checks after the run"),
    (reuse.Reuse, "_replay", "  reuse: replays"),
    (analysis, "cost_records", "cost records (pricing)"),
    (ModelFacts, "module_infos", "module rows"),
    (analysis, "aggregate", "aggregate (ledger, result)"),
    (ledger.Ledger, "_book_tree", "  of which the ledger's tree booking"),
    (results, "_frozen_tables", "  of which the module tables frozen"),
)


def _timed(spent: Dict[str, float]) -> None:
    for owner, name, label in STAGES:
        inner = getattr(owner, name)

        def wrapper(*args: Any, __inner: Callable[..., Any] = inner, __label: str = label, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return __inner(*args, **kwargs)
            finally:
                spent[__label] = spent.get(__label, 0.0) + time.thread_time() - start

        setattr(owner, name, functools.wraps(inner)(wrapper))


Case = Tuple[nn.Module, Tuple[Any, ...], Tuple[nn.Module, Tuple[Any, ...]]]


def _cases(only: List[str], real: bool = False) -> Dict[str, Case]:
    """label -> (model, inputs, the meta copy FlopCounterMode runs on: with ``real`` too, so that
    the ratio is always to the same peer)."""
    made: Dict[str, Case] = {}
    short = {"resnet50": "ResNet-50 1x3x224x224", "bert": "BERT-base 1x128", "gpt2": "GPT-2 small 1x256"}
    for key, label in short.items():
        if key in only:
            torch.manual_seed(0)
            model, inputs = CASES[label]()
            meta = meta_copy(model, tuple(inputs))  # ties kept: the same model as --real
            if real:
                made[label + ", real weights"] = model, tuple(inputs), meta
            else:
                made[label] = (*meta, meta)
    if "70b" in only:
        from transformers import LlamaForCausalLM

        from flopcount.examples.hf import llama2_70b_config

        with torch.device("meta"):
            model = LlamaForCausalLM(llama2_70b_config()).eval()
        ids = (torch.zeros(1, 4096, dtype=torch.long, device="meta"),)
        made["LLaMA-2-70B config, meta, 1x4096"] = model, ids, (model, ids)
    return made


def _flop_counter_mode(model: nn.Module, inputs: Tuple[Any, ...]) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(*inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--only", default="resnet50,bert,gpt2,70b")
    parser.add_argument("--real", action="store_true", help="count the models with their real weights (FlopCounterMode still runs on the meta copy, ties kept)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"torch {torch.__version__}, 1 thread, CPU time of the counting thread, minimum of {args.repeats}, "
          f"load average {load} at start, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    spent: Dict[str, float] = {}
    _timed(spent)
    for label, (model, inputs, on_meta) in _cases(args.only.split(","), args.real).items():
        count_flops(model, inputs)  # first-use costs (imports, caches) are not per-count costs
        best: Dict[str, float] = {}
        totals: List[float] = []
        fcm: List[float] = []
        gc.collect()
        gc.disable()
        try:
            for _ in range(args.repeats):
                spent.clear()
                start = time.thread_time()
                count_flops(model, inputs)
                totals.append(time.thread_time() - start)
                for stage, seconds in spent.items():
                    best[stage] = min(best.get(stage, seconds), seconds)
                if "70B" not in label:
                    start = time.thread_time()
                    _flop_counter_mode(*on_meta)
                    fcm.append(time.thread_time() - start)
        finally:
            gc.enable()
        passes = [0]

        def seen(phase: str, info: Dict[str, Any]) -> None:
            if phase == "start" and info.get("generation") == 2:
                passes[0] += 1

        gc.callbacks.append(seen)
        try:
            for _ in range(args.repeats):
                count_flops(model, inputs)
        finally:
            gc.callbacks.remove(seen)
        peer = f"; FlopCounterMode {min(fcm) * 1e3:.1f} ms, ratio {min(totals) / min(fcm):.2f}x" if fcm else ""
        print(f"\n{label}: count {min(totals) * 1e3:.1f} ms{peer}; "
              f"{passes[0]} full collector passes in {args.repeats} counts (collector on)")
        for _, _, stage in STAGES:
            if stage in best:
                print(f"  {stage:50s} {best[stage] * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
