"""Issue #27 item 4: what two private torch symbols replaced by public ones cost.

**Ranges.** Would the public ``torch.profiler.record_function`` do for ``profile``'s ranges
instead of torch's private ``torch._C._profiler._RecordFunctionFast``? ``profile`` opens a profiler range around the run of every counted op of its join step (the
event's marker) and one around each timed step. This script measures, in one process:

1. the cost of one range (enter + exit) of each kind, outside and inside an active profiler;
2. ``flopcount.profile`` (roofs measured once, then given) of a small CNN and a small transformer encoder (batch 2, eval and
   train with backward) with each kind: the wall time of the whole call, and whether the result
   is the same (the joined rows' names, calls, FLOPs; the unmatched calls), and how many ranges
   one call opens (their extra cost: that number times the per-range difference, the figure a
   loaded machine's wall times cannot resolve). Times per op are measurements and differ run to
   run with either kind; they are not compared. One thread.

**The step's backward entry.** ``estimate_memory``'s step credits a module's backward entry with
the live bytes. It did so by replacing ModTracker's private ``_get_append_fn`` on the instance;
now a public ``register_multi_grad_hook`` on the module's outputs does. 3. ``estimate_memory`` of
a 6-layer GPT-2 (transformers, batch 2, 64 tokens, backward, AdamW) with each, interleaved: the
wall time, and whether every module row is the same.

    PYTHONPATH=. .venv/bin/python benchmarks/private_torch_costs.py [--rounds 3] [--skip-step]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flopcount
import flopcount.profiling.run as run

FAST: Callable[[str], Any] = torch._C._profiler._RecordFunctionFast
PUBLIC: Callable[[str], Any] = torch.profiler.record_function
KINDS = {"_RecordFunctionFast": FAST, "record_function": PUBLIC}


def range_cost_us(make: Callable[[str], Any], n: int = 20000) -> float:
    names = [f"flopcount#{i}" for i in range(64)]
    start = time.perf_counter()
    for i in range(n):
        with make(names[i & 63]):
            pass
    return (time.perf_counter() - start) / n * 1e6


def models() -> Dict[str, Tuple[nn.Module, Tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    cnn = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return {"cnn": (cnn, (torch.randn(2, 3, 32, 32),)), "encoder": (encoder, (torch.randn(2, 16, 64),))}


def digest(result: Any) -> Tuple[Any, ...]:
    rows = tuple(sorted((r.name, r.module, r.phase, r.calls, r.flops) for r in result.rows))
    unmatched = tuple(sorted((u.kind, u.name, u.module, u.phase, u.calls) for u in result.unmatched))
    return rows, unmatched


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-step", action="store_true", help="skip the estimate_memory comparison (needs transformers)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a shared machine: one thread times more steadily
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, load {Path('/proc/loadavg').read_text().split()[:3]}")
    print("\n| range kind | outside a profiler (us) | inside a profiler (us) |\n|---|---|---|")
    outside: Dict[str, List[float]] = {k: [] for k in KINDS}
    inside: Dict[str, List[float]] = {k: [] for k in KINDS}
    for _ in range(args.rounds):
        for name, make in KINDS.items():  # interleaved
            outside[name].append(range_cost_us(make))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True):
            for name, make in KINDS.items():
                inside[name].append(range_cost_us(make, 5000))
    for name in KINDS:
        print(f"| {name} | {statistics.median(outside[name]):.2f} | {statistics.median(inside[name]):.2f} |")
    print("\n| model | mode | profile() s, fast | profile() s, record_function | ratio | ranges per call | their extra cost, ms "
          "(ranges x the per-range difference) | same rows and unmatched |\n|---|---|---|---|---|---|---|---|")
    original = run._range
    roofs = None  # measured by the first call, then given: each call's time is the profile's own
    try:
        for label, (model, inputs) in models().items():
            for mode in ("eval", "train"):
                model.train(mode == "train")
                walls: Dict[str, List[float]] = {k: [] for k in KINDS}
                digests: Dict[str, Any] = {}
                if roofs is None:
                    roofs = flopcount.profile(model, inputs, warmup=0, steps=1).roofs
                for make in KINDS.values():  # untimed: a first use's one-time costs (torch parsing new event names)
                    run._range = make  # type: ignore[assignment]
                    flopcount.profile(model, inputs, backward=mode == "train", warmup=1, steps=3, roofs=roofs)
                for _ in range(args.rounds):
                    for name, make in KINDS.items():
                        run._range = make  # type: ignore[assignment]
                        start = time.perf_counter()
                        result = flopcount.profile(model, inputs, backward=mode == "train", warmup=1, steps=3, roofs=roofs)
                        roofs = result.roofs
                        walls[name].append(time.perf_counter() - start)
                        digests.setdefault(name, digest(result))
                fast, public = (statistics.median(walls[k]) for k in KINDS)
                same = digests["_RecordFunctionFast"] == digests["record_function"]
                opened: List[str] = []
                run._range = lambda name: (opened.append(name), FAST(name))[1]  # type: ignore[assignment]
                flopcount.profile(model, inputs, backward=mode == "train", warmup=1, steps=3, roofs=roofs)
                extra_ms = len(opened) * (statistics.median(inside["record_function"]) - statistics.median(inside["_RecordFunctionFast"])) / 1e3
                print(f"| {label} | {mode} | {fast:.3f} | {public:.3f} | {public / fast:.2f} | {len(opened)} | {extra_ms:.2f} | {same} |")
    finally:
        run._range = original  # type: ignore[assignment]
    if not args.skip_step:
        step_entry(args.rounds)
    return 0


def _append_fn_hooks(mod_tracker: Any, owner: int, entered: Callable[[], None]) -> None:
    """The replaced way (until 2026-11-27), for the comparison only: ModTracker's two forward
    hooks wrapped for the owning thread, and its private ``_get_append_fn`` replaced on the
    instance so that a backward entry also calls ``entered``."""
    import threading

    for name in ("_fw_pre_hook", "_fw_post_hook"):
        hook = getattr(mod_tracker, name)

        def only_owner(*a: Any, _hook: Any = hook, _pre: bool = name == "_fw_pre_hook", **k: Any) -> Any:
            if threading.get_ident() != owner:
                return None
            out = _hook(*a, **k)
            if _pre:
                entered()
            return out

        setattr(mod_tracker, name, only_owner)
    append = mod_tracker._get_append_fn

    def credited(w_mod: Any, name: str, is_bw: bool) -> Callable[..., None]:
        fn = append(w_mod, name, is_bw)
        if not is_bw:
            return fn

        def enter_backward(*a: Any) -> None:
            fn(*a)
            entered()

        return enter_backward

    mod_tracker._get_append_fn = credited


def step_entry(rounds: int) -> None:
    import warnings

    import transformers

    import flopcount.step.runner as runner
    from flopcount.memory.estimate import estimate_memory

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=6, n_embd=256, n_head=4, vocab_size=1000))
    ids = torch.randint(0, 1000, (2, 64))
    kinds = {"_get_append_fn": _append_fn_hooks, "register_multi_grad_hook": runner._own_thread_module_hooks}
    times: Dict[str, List[float]] = {k: [] for k in kinds}
    rows: Dict[str, Any] = {}
    public = runner._own_thread_module_hooks
    try:
        for _ in range(rounds):
            for name, hooks in kinds.items():
                runner._own_thread_module_hooks = hooks  # type: ignore[assignment]
                start = time.perf_counter()
                estimate = estimate_memory(model, (ids,), backward=True, optimizer="adamw")
                times[name].append(time.perf_counter() - start)
                rows[name] = [(m.name, m.peak_bytes) for m in estimate.modules]
    finally:
        runner._own_thread_module_hooks = public  # type: ignore[assignment]
    old, new = (statistics.median(times[k]) for k in kinds)
    same = rows["_get_append_fn"] == rows["register_multi_grad_hook"]
    print("\n| estimate_memory, GPT-2 6 layers, backward + AdamW | s, _get_append_fn | s, register_multi_grad_hook | ratio | "
          "same module rows |\n|---|---|---|---|---|")
    print(f"| {len(rows['register_multi_grad_hook'])} module rows | {old:.3f} | {new:.3f} | {new / old:.2f} | {same} |")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
