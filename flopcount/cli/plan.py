"""``flopcount plan`` and the per-rank memory of ``check --fsdp/--tp``: load the ENTRY
on the meta device, make one rank's inputs from SPECs, call :func:`flopcount.plan`."""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable, Dict, Optional, Tuple

from ..errors import UsageError
from .output import progress


def _config(args: argparse.Namespace) -> Dict[str, Any]:
    config: Dict[str, Any] = {}
    for key, value in args.config:
        if key in config:
            raise UsageError(f"--config {key} is given twice")
        config[key] = value
    return config


def _builder(args: argparse.Namespace, dtype: Optional[str]) -> Callable[[], Any]:
    from .entry import load_entry
    from .specs import parse_dtype

    config = _config(args)
    cast = parse_dtype(dtype, "--dtype") if dtype else None

    def build() -> Any:
        model = load_entry(args.entry, device="meta", config=config).model
        return model.to(cast) if cast is not None else model

    return build


def _meta_inputs(args: argparse.Namespace) -> Tuple[Any, Optional[Dict[str, Any]]]:
    """One rank's micro-batch as meta tensors (shapes and dtypes are all plan() reads)."""
    from .entry import load_entry
    from .specs import make_tensor

    kw_specs = dict(args.kwargs)
    if args.inputs or kw_specs:
        specs, kwargs = list(args.inputs), kw_specs
    else:
        loaded = load_entry(args.entry, device="meta", config=_config(args))
        if loaded.inputs is not None or loaded.kwargs is not None:
            return (loaded.inputs if loaded.inputs is not None else ()), loaded.kwargs
        specs, kwargs = list(loaded.default_specs), dict(loaded.default_kwargs)
    inputs = tuple(make_tensor(spec, device="meta") for spec in specs)
    made = {name: make_tensor(spec, device="meta") for name, spec in kwargs.items()}
    return inputs, (made or None)


def run_plan(args: argparse.Namespace, *, device: Optional[str], link: Any, optimizer: Optional[str], dtype: Optional[str]) -> Any:
    from ..planner import plan

    inputs, kwargs = _meta_inputs(args)
    progress(args, f"planning {args.entry} on a fake world of {args.fsdp} x {args.tp} ranks")
    return plan(
        _builder(args, dtype), inputs, kwargs, fsdp=args.fsdp, tp=args.tp,
        optimizer=optimizer or "adamw", device=device, link=link,
    )


def _link(text: Optional[str]) -> Any:
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


def cmd_plan(args: argparse.Namespace) -> int:
    from .commands import _check_output, _emit

    _check_output(args.output, "--output")
    result = run_plan(args, device=args.gpu, link=_link(args.link), optimizer=args.optimizer, dtype=args.dtype)
    if args.format == "json":
        text = json.dumps({"entry": args.entry, **result.to_dict()}, indent=2)
    elif args.format == "markdown":
        text = result.to_markdown()
    else:
        text = result.table()
    _emit(text, args)
    return 0
