"""``flopcount plan`` and the per-rank memory of ``check --fsdp/--tp``: load the ENTRY
on the meta device, make one rank's inputs from SPECs, call :func:`flopcount.plan`."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any, Dict, Optional, Tuple

from flopcount.cli.deadline import stage
from flopcount.cli.output import progress
from flopcount.cli.parser import pairs_once
from flopcount.errors import UsageError


def _meta_inputs(args: argparse.Namespace) -> Tuple[Any, Optional[Dict[str, Any]], str]:
    """One rank's micro-batch as meta tensors (shapes and dtypes are all plan() reads), and
    where it came from when no --input/--kwarg gave it ("" when they did)."""
    from flopcount.cli.artifacts import looks_like_artifact
    from flopcount.cli.entry import load_entry
    from flopcount.cli.specs import make_inputs

    kw_specs = pairs_once(args.kwargs, "--kwarg")
    if (args.inputs or kw_specs) and not looks_like_artifact(args.entry.strip()):
        specs, kwargs, origin = list(args.inputs), kw_specs, ""
    elif args.inputs or kw_specs:
        fit = load_entry(args.entry, device="meta", config=pairs_once(args.config, "--config")).fit_specs
        # an exported program's inputs are checked against its shapes (TorchScript's are not known)
        specs, kwargs = fit(list(args.inputs), kw_specs) if fit is not None else (list(args.inputs), kw_specs)
        origin = ""
    else:
        loaded = load_entry(args.entry, device="meta", config=pairs_once(args.config, "--config"))
        if loaded.inputs is not None or loaded.kwargs is not None:
            given = (loaded.inputs if loaded.inputs is not None else ()), loaded.kwargs
            return given[0], given[1], f"the example inputs {args.entry} returned"
        if loaded.needs_inputs is not None and not (loaded.default_specs or loaded.default_kwargs):
            raise UsageError(loaded.needs_inputs)
        specs, kwargs = list(loaded.default_specs), dict(loaded.default_kwargs)
        shown = ", ".join([str(s) for s in specs] + [f"{k}={v}" for k, v in kwargs.items()]) or "no inputs"
        origin = f"the default input of {args.entry} ({shown})"
    return (*make_inputs(specs, kwargs, "meta"), origin)


def run_plan(args: argparse.Namespace, *, on: Optional[str], link: Any, optimizer: Optional[str], dtype: Optional[str]) -> Any:
    from flopcount.planning.plan import gpu_key, plan
    from flopcount.planning.result import link_bandwidth

    gpu_key(on)  # bad --on or --link: one line before any work
    for value in (link.values() if isinstance(link, dict) else [link] if link is not None else []):
        link_bandwidth(value, "--link")
    stage(args, f"the import and construction of the model ({args.entry}, on the meta device)")
    inputs, kwargs, origin = _meta_inputs(args)
    if origin:
        progress(args, f"no --input: planning {origin}; --input SPEC sets one rank's micro-batch")
    progress(args, f"planning {args.entry} on a fake world of {args.fsdp} x {args.tp} ranks")
    stage(args, f"the plan of {args.entry} (its factory on the meta device, sharding, one fake training step)")
    from flopcount.cli.entry import meta_builder

    # an exported program's graph stays on the CPU, where plan's fake step runs
    result = plan(
        meta_builder(args, dtype, graph_device="cpu"), inputs, kwargs, fsdp=args.fsdp, tp=args.tp,
        optimizer=optimizer or "adamw", on=on, link=link,
        mixed_precision=getattr(args, "mixed_precision", None), backend=getattr(args, "backend", "nccl"),
    )
    if origin:
        note = f"no --input was given: the micro-batch is {origin}"
        result = dataclasses.replace(result, notes=(*result.notes, note))
    return result


def parse_link(text: Optional[str]) -> Any:
    """``nvlink4``, ``50e9`` (bytes/s), or ``dp=infiniband-ndr,tp=nvlink4``."""
    if text is None:
        return None

    def one(value: str) -> Any:
        try:
            return float(value)
        except ValueError:
            return value

    if "=" in text:
        pairs = [part.partition("=") for part in text.split(",")]
        return {key.strip(): one(value.strip()) for key, _, value in pairs}
    return one(text)


def render(result: Any, fmt: str, entry: str) -> str:
    if fmt == "json":
        return json.dumps({"entry": entry, **result.to_dict()}, indent=2)
    return result.to_markdown() if fmt == "markdown" else result.table()
