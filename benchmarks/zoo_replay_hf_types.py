"""The layer replay of ``estimate_memory`` and ``plan`` on every transformers causal-LM model type,
and on timm's deep stacks (issue #32 items 3 and 4: every reading identical with reuse on and off).

``estimate_memory`` and ``plan`` run a stack of at least ``flopcount.step.replay.MIN_LAYERS``
(12) identical layers cut to 3 and 4 layers and replay the rest (flopcount/step/replay.py,
parent_walk.py). Each model type of benchmarks/zoo_reuse_hf_types.py (its type list,
``tiny_config`` and ``build``) is built with :data:`LAYERS` (14; ``--layers``) layers so that the replay is
taken (24: a stack whose layers alternate between two kinds, replayed by units of two layers, too); batch 2, 12 tokens, train mode, the cache off (:func:`training_model`). With reuse off vs on (``FLOPCOUNT_REUSE=0/1``, as
``zoo_reuse._with_reuse``), everything a user reads of:

1. ``estimate_memory(model, ids, backward=True, optimizer="adamw")``: a training step with the
   default loss: ``to_dict()``, ``peak_bytes``, ``at_peak`` by category, ``peak_module``,
   ``peak_phase``, every module row, ``activation_bytes()``, ``table(max_depth=None)``;
2. the same under ``autocast=torch.bfloat16`` (forward and loss under autocast), where the model
   has a stack to replay;
3. where it has one, ``plan(build, ids, fsdp=4)`` and, where the built-in TP plan takes the type (it refuses the
   others with a UsageError, said), ``plan(build, ids, fsdp=2, tp=2)``: ``to_dict()`` (every
   per-rank figure: FLOPs and MACs by phase, peak and its categories, state bytes, collectives,
   step-time bounds, notes) and ``to_markdown()``.

Whether the replay was taken is read by instrumenting it (the cut runs' results; a wrapper
around ``find_stack``, ``Template.checked`` and ``parent_proven``), and why not where it was
not. The model and its ids are left as found (``zoo.snapshot``). An independent oracle on a few
small types (:data:`ORACLE_TYPES`): torch's ``MemTracker`` live on a real AdamW loop
(tests/_live_oracles.py ``loop_peaks``, the steady state's third step) equals the estimate's
peak, as tests/test_memory_review.py compares it. A type whose plain training step (forward,
default loss, backward, AdamW step) fails is "not run"; one that runs it but that
``estimate_memory`` or ``plan`` cannot take with the reuse off is FAILED.

``--timm``: timm models with a 12+-block ModuleList/Sequential (:data:`TIMM_MODELS`) through (1)
and (2), with the MemTracker oracle. A whole run takes over an hour of CPU on a 2-core VM (see
docs/performance.md, "stepsweep"): ``--start``, ``--types`` and ``--no-plan``/``--no-estimate``
split it. Prints one line per model that differs or fails and a summary; exit
status 1 on any difference or failure::

    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/zoo_replay_hf_types.py
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/zoo_replay_hf_types.py --no-plan      # (1) and (2)
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/zoo_replay_hf_types.py --no-estimate  # (3)
    PYTHONPATH=. /work/main/.venv-zoo/bin/python benchmarks/zoo_replay_hf_types.py --timm
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import zoo  # noqa: E402
import zoo_reuse_hf_types as hf_types  # noqa: E402
from _live_oracles import loop_peaks  # noqa: E402
from zoo_reuse import Tally, _first_difference, _with_reuse  # noqa: E402

import flopcount  # noqa: E402
from flopcount.errors import TraceError, UsageError  # noqa: E402
from flopcount.memory import estimate as estimate_module  # noqa: E402
from flopcount.step import replay as replay_module  # noqa: E402
from flopcount.step.loss import default_loss  # noqa: E402

plan_module = importlib.import_module("flopcount.planning.plan")  # the module (flopcount.planning.plan is the function)

LAYERS = 14
#: types not built, with why: each took the whole 23 GB VM and was OOM-killed, ending the sweep
#: before its summary (stepsweep, periodreplay and sweep17 in docs/performance.md)
NOT_BUILT = {
    "longcat_flash": "its tiny config's own real training step at 14 layers needs over 20 GB (OOM-killed at 21.8 GB)",
}
#: small types whose estimate is also compared with MemTracker run live on a real AdamW loop
ORACLE_TYPES = ("llama", "gpt2", "qwen2", "opt", "gpt_neox", "phi")
#: timm models with a ModuleList/Sequential of 12+ identical blocks (their default sizes), batch 2
TIMM_MODELS = ("vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224", "eva02_tiny_patch14_224", "cait_xxs24_224",
               "xcit_nano_12_p16_224", "resmlp_12_224", "gmlp_ti16_224", "vit_small_patch16_224")


# --------------------------------------------------------------------------- what a user reads


def memory_rows(estimate: Any) -> Dict[str, Any]:
    return {
        "dict": estimate.to_dict(), "peak_bytes": estimate.peak_bytes, "at_peak": dataclasses.asdict(estimate.at_peak),
        "peak_module": estimate.peak_module, "peak_phase": estimate.peak_phase,
        "modules": [dataclasses.asdict(row) for row in estimate.modules],
        "activation_bytes": estimate.activation_bytes(), "table": estimate.table(max_depth=None),
    }


def plan_rows(result: Any) -> Dict[str, Any]:
    return {"dict": result.to_dict(), "markdown": result.to_markdown()}


# --------------------------------------------------------------------------- was the replay taken


@contextlib.contextmanager
def watched(log: List[str]) -> Iterator[None]:
    """What the layer replay did, appended to ``log``: "no stack", "order" (the template's layers
    not met in a step's order), "check differs", "parent not proven", "state written" (the cut
    runs wrote the model's state), "step raised <exception>" (a cut run failed: ``_IndexRead``, the
    step read a per-layer attribute such as ``layer_idx``), "replayed". Instruments flopcount's own functions while it
    lasts (put back after)."""
    saved: List[Tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, wrapper: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        saved.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def on_find_stack(original: Any) -> Any:
        def find_stack(model: Any) -> Any:
            stack = original(model)
            if stack is None:
                log.append("no stack")
            return stack
        return find_stack

    def on_checked(original: Any) -> Any:
        def checked(self: Any, check: Any) -> bool:
            same = bool(original(self, check))
            if not same:
                log.append("check differs")
            return same
        return checked

    def on_template_of(original: Any) -> Any:
        def of(cls: Any, records: Any, prefix: str, *args: Any, **kwargs: Any) -> Any:
            template = original.__func__(cls, records, prefix, *args, **kwargs)
            if template is None:
                log.append("order")
            return template
        return classmethod(of)

    def on_parent(original: Any) -> Any:
        def parent_proven(*args: Any, **kwargs: Any) -> bool:
            proven = bool(original(*args, **kwargs))
            if not proven:
                log.append("parent not proven")
            return proven
        return parent_proven

    def on_step(original: Any) -> Any:
        def step(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except Exception as exc:
                cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc  # estimate's TraceError wraps it
                log.append(f"step raised {type(cause).__name__}")
                raise
        return step

    def on_result(original: Any) -> Any:
        def cut_runs(*args: Any, **kwargs: Any) -> Any:
            try:
                result = original(*args, **kwargs)
            except estimate_module._StateWritten:
                log.append("state written")
                raise
            log.append("replayed" if result is not None else "cut runs refused")
            return result
        return cut_runs

    try:
        wrap(estimate_module, "find_stack", on_find_stack)
        wrap(plan_module, "find_stack", on_find_stack)
        wrap(estimate_module, "parent_proven", on_parent)
        wrap(plan_module, "parent_proven", on_parent)
        wrap(estimate_module, "_layered", on_result)
        wrap(plan_module, "_cut_steps", on_result)
        wrap(estimate_module, "_tracked_step", on_step)
        wrap(plan_module, "_fake_step", on_step)
        wrap(replay_module.Template, "checked", on_checked)
        of = replay_module.Template.__dict__["of"]  # the classmethod itself, put back as it was
        saved.append((replay_module.Template, "of", of))
        setattr(replay_module.Template, "of", on_template_of(of))
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def replay_outcome(log: List[str]) -> str:
    """The replay's outcome from :func:`watched`'s log: "replayed", or why not."""
    if "replayed" in log:
        return "replayed"
    reasons = [entry for entry in log if entry not in ("cut runs refused",)]
    return reasons[0] if reasons else "cut runs refused"


# --------------------------------------------------------------------------- the comparisons


def compared(name: str, reading: Callable[[], Any], rows: Callable[[Any], Dict[str, Any]],
             outcomes: Dict[str, str]) -> Tuple[Optional[str], Any]:
    """``reading()`` with reuse off and on: the first difference (None: identical) and the
    reuse-on result; the replay's outcome with the reuse on in ``outcomes[name]``. Raises what
    the reuse-off reading raises (the model cannot be read at all)."""
    off = _with_reuse(False, reading)
    log: List[str] = []
    try:
        with watched(log):
            on = _with_reuse(True, reading)
    except Exception as exc:
        return f"{name} raised with reuse on only: {zoo.first_line(exc)[:150]}", None
    outcomes[name] = replay_outcome(log)
    off_rows, on_rows = rows(off), rows(on)
    if off_rows != on_rows:
        return f"{name} " + _first_difference(off_rows, on_rows), on
    return None, on


def estimate_readings(model: torch.nn.Module, args: Tuple[Any, ...], outcomes: Dict[str, str],
                      oracle: bool) -> Optional[str]:
    """Readings (1) and (2) of ``model`` on ``args`` (2 only where the model has a stack to
    replay: without one, the reuse changes only the optimizer's warm-up, which (1) compares),
    the model and inputs left as found, and with ``oracle`` MemTracker's live peak of the
    steady-state step."""
    before = zoo.snapshot(model, args)
    readings = {
        "estimate_memory": lambda: flopcount.estimate_memory(model, args, backward=True, optimizer="adamw"),
    }
    if replay_module.find_stack(model) is not None:
        readings["estimate_memory autocast"] = lambda: flopcount.estimate_memory(
            model, args, backward=True, optimizer="adamw", autocast=torch.bfloat16,
        )
    results = {}
    for name, reading in readings.items():
        difference, results[name] = compared(name, reading, memory_rows, outcomes)
        if difference is not None:
            return difference
        changed = zoo.changes(before, zoo.snapshot(model, args))
        if changed:
            return f"{name} changed the model or inputs: {', '.join(changed)}"
    if oracle:
        torch.manual_seed(0)
        with zoo.quiet():
            peaks, _ = loop_peaks(copy.deepcopy(model), *args)
        peak = results["estimate_memory"].peak_bytes
        if peak != peaks[2]:
            return f"estimate_memory peak {peak:,} B vs MemTracker live {peaks[2]:,} B (steady state; steps {peaks})"
    return None


def plan_readings(build: Callable[[], torch.nn.Module], args: Tuple[Any, ...], outcomes: Dict[str, str],
                  notes: List[str]) -> Optional[str]:
    """Reading (3): plan over FSDP 4 and, where the built-in TP plan takes the model, FSDP 2 x TP 2."""
    for fsdp, tp in ((4, 1), (2, 2)):
        name = f"plan fsdp={fsdp} tp={tp}"
        try:
            difference, _ = compared(name, lambda: flopcount.plan(build, args, fsdp=fsdp, tp=tp), plan_rows, outcomes)
        except UsageError as exc:  # the built-in TP plan does not take the type
            if tp == 1:
                raise
            notes.append(f"no TP: {zoo.first_line(exc)[:100]}")
            continue
        except TraceError as exc:  # the sharded model's own forward fails (DiffLlama: 1 key/value head per rank)
            if tp == 1:
                raise
            print(f"TP FAILS {name}: {zoo.first_line(exc)[:160]}", flush=True)
            notes.append("TP step fails")
            continue
        if difference is not None:
            return difference
    return None


def plain_training_error(model: torch.nn.Module, args: Tuple[Any, ...]) -> Optional[str]:
    """Why a plain training step (forward, default loss, backward, AdamW step) of a copy fails (None: it runs)."""
    try:
        real = copy.deepcopy(model)
        opt = torch.optim.AdamW(real.parameters())
        with zoo.quiet():
            default_loss(real(*args)).backward()
            opt.step()
    except Exception as exc:
        return zoo.first_line(exc)[:160]
    return None


# --------------------------------------------------------------------------- the sweeps


class Outcomes:
    """The replay's outcome of every reading (how many replayed, and why the others were not)."""

    def __init__(self) -> None:
        self.by_reading: Dict[str, Dict[str, List[str]]] = {}

    def add(self, model: str, outcomes: Dict[str, str]) -> None:
        for reading, outcome in outcomes.items():
            self.by_reading.setdefault(reading, {}).setdefault(outcome, []).append(model)

    def summary(self) -> str:
        lines = []
        for reading, by_outcome in self.by_reading.items():
            parts = [f"{outcome} {len(models)}" for outcome, models in sorted(by_outcome.items(), key=lambda kv: -len(kv[1]))]
            lines.append(f"  {reading}: {', '.join(parts)}")
            for outcome, models in by_outcome.items():
                if outcome != "replayed":
                    lines.append(f"    {outcome}: {' '.join(models)}")
        return "\n".join(lines)


def training_model(model_type: str, class_name: str) -> torch.nn.Module:
    """The type built with :data:`LAYERS` layers, in train mode, its cache off (as a training
    loop runs it: with the cache on, each layer's ``layer_idx`` is read and the replay refused)."""
    model = hf_types.build(model_type, class_name, None, hf_types.TASKS["causal-lm"], LAYERS).train()
    model.config.use_cache = False
    return model


def hf_check(model_type: str, class_name: str, with_estimate: bool, with_plan: bool, outcomes: Dict[str, str],
             notes: List[str]) -> Tuple[Optional[str], int]:
    model = training_model(model_type, class_name)
    args = (hf_types.prompt(None),)
    difference = estimate_readings(model, args, outcomes, oracle=model_type in ORACLE_TYPES) if with_estimate else None
    # plan's replay needs a stack too: without one, reuse on and off trace the same step (not planned, to save time)
    if difference is None and with_plan and replay_module.find_stack(model) is not None:
        difference = plan_readings(lambda: training_model(model_type, class_name), args, outcomes, notes)
    return difference, 0


def hf_sweep(match: Optional[str], exact: List[str], start: str, with_estimate: bool, with_plan: bool, tally: Tally,
             replays: Outcomes) -> Tuple[int, List[str]]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = [(t, c) for t, c in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
             if (not match or match in t) and (not exact or t in exact) and t >= start]
    not_run: List[str] = []
    for model_type, class_name in types:
        clock = time.perf_counter()
        if model_type in NOT_BUILT:
            not_run.append(model_type)
            print(f"NOT RUN {model_type} ({class_name}): {NOT_BUILT[model_type]}", flush=True)
            continue
        try:
            reason = plain_training_error(training_model(model_type, class_name), (hf_types.prompt(None),))
        except Exception as exc:
            reason = zoo.first_line(exc)[:160]
        if reason is not None:
            not_run.append(model_type)
            print(f"NOT RUN {model_type} ({class_name}): {reason}", flush=True)
            continue
        outcomes: Dict[str, str] = {}
        notes: List[str] = []
        where = f"{model_type} ({class_name})"
        tally.run(where, None, lambda: hf_check(model_type, class_name, with_estimate, with_plan, outcomes, notes), width=200)
        replays.add(model_type, outcomes)
        said = "; ".join(f"{k}: {v}" for k, v in outcomes.items())
        print(f"  {where}: {time.perf_counter() - clock:.1f} s; {said}{'; ' if notes else ''}{'; '.join(notes)}",
              file=sys.stderr, flush=True)
    return len(types), not_run


def timm_check(name: str, outcomes: Dict[str, str]) -> Tuple[Optional[str], int]:
    import timm

    torch.manual_seed(0)
    with zoo.quiet():
        model = timm.create_model(name, pretrained=False).train()
    size = model.pretrained_cfg.get("input_size", (3, 224, 224))
    x = torch.randn(2, *size, generator=torch.Generator().manual_seed(1))
    return estimate_readings(model, (x,), outcomes, oracle=True), 0


def timm_sweep(match: Optional[str], tally: Tally, replays: Outcomes) -> int:
    names = [n for n in TIMM_MODELS if not match or match in n]
    for name in names:
        clock = time.perf_counter()
        outcomes: Dict[str, str] = {}
        tally.run(f"timm/{name}", None, lambda: timm_check(name, outcomes), width=200)
        replays.add(name, outcomes)
        said = "; ".join(f"{k}: {v}" for k, v in outcomes.items())
        print(f"  timm/{name}: {time.perf_counter() - clock:.1f} s; {said}", file=sys.stderr, flush=True)
    return len(names)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--match", default=None, help="only model types (or timm names) containing this text")
    parser.add_argument("--types", default=None, help="only these model types (comma-separated, exact names)")
    parser.add_argument("--start", default="", help="only model types whose name sorts at or after this (a second process)")
    parser.add_argument("--no-plan", action="store_true", help="estimate_memory only")
    parser.add_argument("--no-estimate", action="store_true", help="plan only")
    parser.add_argument("--timm", action="store_true", help="the timm models of TIMM_MODELS instead (estimate_memory)")
    parser.add_argument("--layers", type=int, default=None,
                        help="layers of each model type (LAYERS, 14; 24: a stack of 2-layer units replayed too)")
    args = parser.parse_args(argv)
    global LAYERS
    LAYERS = args.layers or LAYERS
    torch.set_num_threads(1)
    tally = Tally(failure="FAILED")  # a plain training step ran: a model flopcount cannot estimate or plan
    replays = Outcomes()
    start, cpu_start = time.perf_counter(), time.process_time()
    if args.timm:
        import timm

        built = timm_sweep(args.match, tally, replays)
        what = f"{built} timm models (12+ blocks), timm {timm.__version__}"
    else:
        import transformers

        types, not_run = hf_sweep(args.match, args.types.split(",") if args.types else [], args.start, not args.no_estimate,
                                   not args.no_plan, tally, replays)
        what = (f"{types} causal-LM model types at {LAYERS} layers, {types - len(not_run)} built and ran a plain training "
                f"step ({len(not_run)} not run), transformers {transformers.__version__}")
    print(f"\n{what}; torch {torch.__version__}; {tally.same} identical (every reading, reuse off = on), "
          f"{tally.differ} differ, {tally.failed} failed; "
          f"{time.perf_counter() - start:.0f} s wall, {time.process_time() - cpu_start:.0f} s CPU", flush=True)
    print("the layer replay, by reading (reuse on):\n" + replays.summary(), flush=True)
    return 1 if tally.differ or tally.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
