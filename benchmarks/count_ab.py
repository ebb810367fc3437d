"""Before/after of a speed pass in ONE process (issue #32): the functions a pass changed are loaded
from another checkout's files (``--base``, e.g. a worktree of main) and swapped in turn with this
checkout's, round by round, on the same models and inputs; CPU time of the counting thread, median
and 25th percentile of each side, and their ratio. On a loaded machine a same-process ratio is the
figure to quote: two processes run minutes apart see different loads. Both sides must give the
same ``to_dict()`` (checked after the rounds).

``PASSES`` lists the functions each pass swaps: "opfixed" (the count's per-op path and fixed
costs; the default), "asfound" (``trace`` without and with its ``left_as_found`` guard, as
count_flops calls it) and "reuse" (structural reuse's ``Reuse`` class whole, branch exact3: its
key's ties, code and requires_grad checks); a later pass adds its own (each must exist under the same name in both
checkouts).

    PYTHONPATH=. .venv/bin/python benchmarks/count_ab.py --base /path/to/main [--rounds 10] [--per 3]
        [--only resnet,bert,gpt2,tiny,70b] [--pass opfixed|asfound|reuse]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from bench_fastpath import CASES  # noqa: E402
from bench_reuse import tiny_llama  # noqa: E402

import flopcount.core.analysis as analysis  # noqa: E402
import flopcount.core.hooks as hooks  # noqa: E402
import flopcount.core.ledger as ledger  # noqa: E402
import flopcount.core.model_facts as model_facts  # noqa: E402
import flopcount.core.results as results  # noqa: E402
import flopcount.tracers._modules as modules  # noqa: E402
import flopcount.tracers.dispatch as dispatch  # noqa: E402
import flopcount.tracers.fake.shape_cache as shape_cache  # noqa: E402
from flopcount import count_flops  # noqa: E402

warnings.simplefilter("ignore")

#: (this checkout's owner, attribute, path of the base's file, owner's name there ("" for the module))
Swap = Tuple[Any, str, str, str]
OPFIXED: Tuple[Swap, ...] = (
    (shape_cache.ShapeCache, "_key", "tracers/fake/shape_cache.py", "ShapeCache"),
    (shape_cache.ShapeCache, "_part", "tracers/fake/shape_cache.py", "ShapeCache"),
    (analysis, "cost_records", "core/analysis.py", ""),
    (hooks, "has_call_hooks", "core/hooks.py", ""),
    (modules.ModuleStack, "__enter__", "tracers/_modules.py", "ModuleStack"),
    (ledger.Ledger, "_book_tree", "core/ledger.py", "Ledger"),
    (results, "_frozen", "core/results.py", ""),
    (model_facts.ModelFacts, "module_infos", "core/model_facts.py", "ModelFacts"),
)
ASFOUND: Tuple[Swap, ...] = ((analysis, "trace", "tracers/__init__.py", ""),)
# structural reuse whole: the base's ``Reuse`` (its file loaded against this checkout's package) and this one's
REUSE: Tuple[Swap, ...] = ((dispatch, "Reuse", "tracers/_reuse.py", ""),)
PASSES: Dict[str, Tuple[Swap, ...]] = {"opfixed": OPFIXED, "asfound": ASFOUND, "reuse": REUSE}


def _base_module(base: Path, relative: str, loaded: Dict[str, ModuleType]) -> ModuleType:
    """The base checkout's file as a module of its own (its imports resolve to this checkout's
    package: only the functions swapped come from the base)."""
    if relative not in loaded:
        name = "base_" + relative.replace("/", "_").removesuffix(".py")
        spec = importlib.util.spec_from_file_location(name, base / "flopcount" / relative)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
        loaded[relative] = module
    return loaded[relative]


def _swaps(base: Path, swaps: Tuple[Swap, ...]) -> List[Tuple[Any, str, Any, Any]]:
    loaded: Dict[str, ModuleType] = {}
    found = []
    for owner, attribute, relative, owner_name in swaps:
        module = _base_module(base, relative, loaded)
        old_owner = getattr(module, owner_name) if owner_name else module
        found.append((owner, attribute, getattr(old_owner, attribute), getattr(owner, attribute)))
    return found


def _models(only: List[str]) -> Dict[str, Tuple[Any, Tuple[Any, ...]]]:
    labels = {"resnet": "ResNet-50 1x3x224x224", "bert": "BERT-base 1x128", "gpt2": "GPT-2 small 1x256"}
    made: Dict[str, Tuple[Any, Tuple[Any, ...]]] = {}
    for key in only:
        torch.manual_seed(0)
        made[key] = tiny_llama() if key == "tiny" else _llama_70b() if key == "70b" else CASES[labels[key]]()
    return made


def _llama_70b() -> Tuple[Any, Tuple[Any, ...]]:
    """LLaMA-2-70B's config on meta at 4,096 tokens (as ``count_phases``)."""
    from transformers import LlamaForCausalLM

    from flopcount.examples.hf import llama2_70b_config

    with torch.device("meta"):
        model = LlamaForCausalLM(llama2_70b_config()).eval()
    return model, (torch.zeros(1, 4096, dtype=torch.long, device="meta"),)


def _quantile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="the other checkout's root (its flopcount/ files)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per", type=int, default=3, help="counts per side and round")
    parser.add_argument("--only", default="resnet,bert,gpt2,tiny")
    parser.add_argument("--pass", dest="swapped", choices=sorted(PASSES), default="opfixed", help="whose functions to swap")
    args = parser.parse_args()
    torch.set_num_threads(1)
    swaps = _swaps(args.base, PASSES[args.swapped])

    def side(new: bool) -> None:
        for owner, attribute, old, current in swaps:
            setattr(owner, attribute, current if new else old)

    models = _models(args.only.split(","))
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds x {args.per} counts per side, load {load} at start, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; base {args.base}; pass {args.swapped}")
    spent: Dict[Tuple[str, bool], List[float]] = {(k, s): [] for k in models for s in (False, True)}
    for key, (model, inputs) in models.items():
        for new in (False, True):
            side(new)
            count_flops(model, inputs)
    for r in range(args.rounds):
        for key, (model, inputs) in models.items():
            for new in ((False, True) if r % 2 == 0 else (True, False)):
                side(new)
                for _ in range(args.per):
                    start = time.thread_time()
                    count_flops(model, inputs)
                    spent[(key, new)].append(time.thread_time() - start)
    same: Dict[str, bool] = {}
    for key, (model, inputs) in models.items():
        runs: List[Callable[[], Any]] = []
        for new in (False, True):
            side(new)
            runs.append(count_flops(model, inputs).to_dict)
        same[key] = runs[0]() == runs[1]()
    side(True)
    print("| model | base median (p25) | this checkout median (p25) | ratio median / p25 | same to_dict |")
    print("|---|---|---|---|---|")
    for key in models:
        old, new_ = spent[(key, False)], spent[(key, True)]
        print(f"| {key} | {_quantile(old, .5):.2f} ms ({_quantile(old, .25):.2f}) | {_quantile(new_, .5):.2f} ms "
              f"({_quantile(new_, .25):.2f}) | {_quantile(new_, .5) / _quantile(old, .5):.3f} / "
              f"{_quantile(new_, .25) / _quantile(old, .25):.3f} | {same[key]} |")
    with open("/proc/loadavg") as f:
        print("load at the end", " ".join(f.read().split()[:3]))


if __name__ == "__main__":
    main()
