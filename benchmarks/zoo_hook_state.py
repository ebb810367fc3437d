"""A library's stateful hook and the count, under each tracer (issue #27 item 5, branch twinhooks).

FLUX and CogVideoX built small from code as ``zoo_reuse_wild.py`` builds them, with diffusers'
``enable_cache(PyramidAttentionBroadcastConfig(...))`` and one step taken (the hooks hold an
iteration counter and cached outputs). Each is counted twice with ``tracer="dispatch"``, "jit"
and "auto"; a line shows both FLOPs and whether the caller's hook state (each hook's iteration
and cached object) is as before the counts. Then ``benchmark``, ``module_latency`` and ``profile``
run each once: the hook state as before. Exit status 1 when any differs.

    PYTHONPATH=. .venv-zoo/bin/python benchmarks/zoo_hook_state.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Tuple

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import zoo_reuse_wild  # noqa: E402

import flopcount  # noqa: E402

TRACERS = ("dispatch", "jit", "auto")


def hook_states(model: nn.Module) -> List[Tuple[int, int]]:
    """Each PyramidAttentionBroadcast hook's (id of its cached object, iteration), in module order."""
    found = []
    for module in model.modules():
        registry = getattr(module, zoo_reuse_wild.HOOK_REGISTRY, None)
        if registry is None:
            continue
        for hook in registry.hooks.values():
            state = getattr(hook, "state", None)
            if state is not None:
                found.append((id(state.cache), state.iteration))
    return found


def main() -> int:
    cases: List[Tuple[str, Any, Any]] = [
        ("FLUX", zoo_reuse_wild._flux, zoo_reuse_wild._flux_inputs),
        ("CogVideoX", zoo_reuse_wild._cogvideox, zoo_reuse_wild._cogvideox_inputs),
    ]
    failed = 0
    for label, build, inputs in cases:
        for tracer in TRACERS:
            torch.manual_seed(0)
            model = zoo_reuse_wild._cached(build, inputs)()
            args, kwargs = inputs()
            before = hook_states(model)
            first = flopcount.count_flops(model, args, kwargs, tracer=tracer)
            second = flopcount.count_flops(model, args, kwargs, tracer=tracer)
            after = hook_states(model)
            same = before == after and first.flops == second.flops
            failed += not same
            iterations_before = sum(iteration for _, iteration in before)
            iterations_after = sum(iteration for _, iteration in after)
            print(
                f"{'ok ' if same else 'DIFFER'} {label:10s} {tracer:8s} FLOPs {first.flops:>11,} then {second.flops:>11,}; "
                f"hook iterations {iterations_before} -> {iterations_after} over {len(before)} hooks",
                flush=True,
            )
        failed += _timed_runs(label, build, inputs)
    print(f"{len(cases) * (len(TRACERS) + len(TIMED))} cases, {failed} differ")
    return 1 if failed else 0


#: the timed real runs, which run the model's private twin too (bench/device.borrowed_model)
TIMED = {
    "benchmark": lambda model, args, kwargs: flopcount.benchmark(model, args, kwargs, warmup=1, iters=2),
    "module_latency": lambda model, args, kwargs: flopcount.module_latency(model, args, kwargs, warmup=1, iters=2),
    "profile": lambda model, args, kwargs: flopcount.profile(
        model, args, kwargs, warmup=1, steps=2, roofs=flopcount.Roofs({"float32": 1e12}, 1e11, "fixed", "given")
    ),
}


def _timed_runs(label: str, build: Any, inputs: Any) -> int:
    """Each timed run once on the hooked model: the caller's hook state as before."""
    failed = 0
    for name, run in TIMED.items():
        torch.manual_seed(0)
        model = zoo_reuse_wild._cached(build, inputs)()
        args, kwargs = inputs()
        before = hook_states(model)
        run(model, args, kwargs)
        after = hook_states(model)
        same = before == after
        failed += not same
        print(
            f"{'ok ' if same else 'DIFFER'} {label:10s} {name:14s} hook iterations "
            f"{sum(i for _, i in before)} -> {sum(i for _, i in after)} over {len(before)} hooks",
            flush=True,
        )
    return failed


if __name__ == "__main__":
    sys.exit(main())
