"""Coverage zoo (issue #9): count every torchvision model family, 25 transformers
architectures and every simple torch.nn layer under each tracer, and report what
flopcount gets wrong or cannot see.

For each model: ``count_flops`` under tracer auto / jit / dispatch; MACs against a
published or hand-derived count; ops without a handler; jit == dispatch (MACs and FLOPs);
meta == CPU (dispatch on a copy built on the meta device); the model and its inputs left
bit-identical (state_dict, module types, training flags, requires_grad, hooks, inputs,
global RNG). Failures are recorded per model (first line of the error).

    .venv/bin/python benchmarks/zoo.py --only nn --json nn.json
    .venv-zoo/bin/python benchmarks/zoo.py --only torchvision --start 0 --limit 40 --json tv1.json
    .venv/bin/python benchmarks/zoo.py --from-json nn.json tv1.json ...   # one report from pieces

Uses only flopcount's public API. Prints Markdown on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import platform
import re
import sys
import time
import traceback
import warnings
import zlib
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from zoo_nn import Case  # noqa: E402

import flopcount  # noqa: E402
from flopcount import count_flops  # noqa: E402

TRACERS = ("auto", "jit", "dispatch")
PARTS = ("torchvision", "transformers", "nn")
# Ops that do no floating-point arithmetic: unsupported but not an undercount.
NO_ARITHMETIC = frozenset({
    "aten::_pack_padded_sequence", "aten::_pad_packed_sequence", "aten::matrix_H", "aten::mH",
    "aten::_nested_tensor_from_mask_left_aligned", "aten::_nested_tensor_from_mask", "aten::_nested_from_padded",
    "aten::_nested_tensor_from_tensor_list", "aten::to_padded_tensor", "aten::nested_to_padded_tensor",
    "aten::histc", "aten::bincount", "aten::nonzero", "aten::unique", "aten::_unique2", "aten::randperm",
})


# --------------------------------------------------------------------------- state


def _digest(t: torch.Tensor) -> str:
    if nn.parameter.is_lazy(t):
        return f"uninitialized {type(t).__name__}"
    t = t.detach()
    if t.device.type == "meta":
        return f"meta{tuple(t.shape)}{t.dtype}"
    flat = t.cpu().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
    return f"{tuple(t.shape)}{t.dtype}{t.stride()} crc {zlib.crc32(raw.numpy().data):08x}"


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, Mapping):
        for item in obj.values():
            yield from _tensors(item)


def _map(obj: Any, fn: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map(v, fn) for v in obj)
    if isinstance(obj, list):
        return [_map(v, fn) for v in obj]
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def snapshot(model: nn.Module, inputs: Any) -> Dict[str, Any]:
    """Everything a counter could change, as comparable values (digests, not copies)."""
    return {
        "state_dict": {k: _digest(v) for k, v in model.state_dict(keep_vars=True).items()},
        "module types": [(n, type(m).__name__) for n, m in model.named_modules()],
        "training flags": [m.training for m in model.modules()],
        "requires_grad": [(n, p.requires_grad) for n, p in model.named_parameters()],
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                     for m in model.modules()),
        "inputs": [_digest(t) for t in _tensors(inputs)],
        "rng": _digest(torch.get_rng_state()),
        "grad mode": torch.is_grad_enabled(),
    }


def changes(before: Dict[str, Any], after: Dict[str, Any]) -> List[str]:
    out = []
    for key, old in before.items():
        new = after[key]
        if old == new:
            continue
        if key == "state_dict":
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            out.append(f"state_dict ({', '.join(diff[:3])}{'…' if len(diff) > 3 else ''})")
        elif key == "module types":
            diff = [f"{a[1]}→{b[1]}" for a, b in zip(old, new) if a != b]
            out.append(f"module types ({', '.join(diff[:3])})")
        else:
            out.append(key)
    return out


# --------------------------------------------------------------------------- running


def first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text if len(text) <= 2000 else text[:1997] + "..."


def _short(text: str, size: int = 170) -> str:
    """An error for a table cell: what failed where (up to the input listing) and the cause."""
    if len(text) <= size:
        return text
    head = text.split(" with inputs", 1)[0][:80]
    cause = re.search(r"\b\w+(Error|Exception|Warning): ", text[len(head) + 2:])
    tail = text[len(head) + 2 + cause.start():] if cause else text[-(size - len(head)):]
    return f"{head} … {tail[:max(40, size - len(head))]}"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence warnings and stray prints of third-party model code (flopcount prints nothing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stdout(io.StringIO()):
            yield


def _count(model: nn.Module, inputs: Tuple[Tuple[Any, ...], Dict[str, Any]], tracer: str) -> Any:
    args, kwargs = inputs
    with quiet():
        return count_flops(model, args, kwargs=kwargs or None, tracer=tracer)


def _summary(result: Any) -> Dict[str, Any]:
    return {
        "macs": result.macs,
        "flops": result.flops,
        "params": result.params,
        "tracer": result.tracer,
        "unsupported": result.unsupported_ops(),
        "by_op_macs": result.by_operator("macs"),
        "by_op_flops": result.by_operator("flops"),
        "warnings": len(result.warnings),
        "complete": _complete(result),
    }


def _complete(result: Any) -> Optional[bool]:
    """``FlopResult.complete`` where this flopcount has it (None before it existed)."""
    value = getattr(result, "complete", None)
    value = value() if callable(value) else value
    return None if value is None else bool(value)


def _build(case: Case, device: Optional[str] = None, reference: bool = False) -> nn.Module:
    """The model, on CPU or built directly on ``device``; a model whose constructor
    computes with tensors (RegNet's widths) cannot be built under the meta device, so it
    is built on CPU and moved. ``reference``: the model the reference count is stated for."""
    if reference and case.ref_build is not None:
        case = dataclasses.replace(case, build=case.ref_build)
    torch.manual_seed(0)
    with quiet():
        if device is None:
            model = case.build()
        else:
            try:
                with torch.device(device):
                    model = case.build()
            except Exception:
                model = case.build().to(device)
    return model.train(case.train)


def _inputs_for(case: Case, which: Any = None, device: Optional[str] = None) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    torch.manual_seed(1)
    args, kwargs = (which or case.inputs)()
    if device is not None:
        args, kwargs = _map(args, lambda t: t.to(device)), _map(kwargs, lambda t: t.to(device))
    return args, kwargs


def op_diff(a: Dict[str, Any], b: Dict[str, Any], metric: str) -> List[str]:
    """Operators whose ``metric`` differs between two summaries, as ``op a/b``, after
    removing renames: a surplus on one side that equals the sum of up to three surpluses
    on the other (``linear`` = ``mm`` + ``addmm``) is the same work under other names."""
    x, y = a[f"by_op_{metric}"], b[f"by_op_{metric}"]
    diff = {op: x.get(op, 0) - y.get(op, 0) for op in set(x) | set(y) if x.get(op, 0) != y.get(op, 0)}
    for _ in range(2):
        for op in sorted(diff, key=lambda o: -abs(diff[o])):
            if op not in diff:
                continue
            others = [o for o in diff if o != op and (diff[o] > 0) != (diff[op] > 0)]
            for size in (1, 2, 3):
                match = next((c for c in itertools.combinations(others, size)
                              if sum(diff[o] for o in c) == -diff[op]), None)
                if match:
                    for o in (op, *match):
                        del diff[o]
                    break
    ops = sorted(diff, key=lambda o: -abs(diff[o]))
    return [f"{op} {x.get(op, 0)}/{y.get(op, 0)}" for op in ops][:6]


def run_case(case: Case, *, meta: bool = True) -> Dict[str, Any]:
    start = time.perf_counter()
    row: Dict[str, Any] = {
        "family": case.family, "name": case.name, "note": case.note, "ref_macs": case.ref_macs,
        "ref_source": case.ref_source, "ref_params": case.ref_params, "errors": {}, "changed": {},
        "results": {},
    }
    try:
        model = _build(case)
        inputs = _inputs_for(case)
    except Exception as exc:
        row["errors"]["build"] = first_line(exc)
        row["seconds"] = round(time.perf_counter() - start, 2)
        return row
    row["input"] = _describe(inputs)
    before = snapshot(model, inputs)
    for tracer in TRACERS:
        try:
            row["results"][tracer] = _summary(_count(model, inputs, tracer))
        except Exception as exc:
            row["errors"][tracer] = first_line(exc)
        after = snapshot(model, inputs)
        changed = changes(before, after)
        if changed:
            row["changed"][tracer] = changed
            model, inputs = _build(case), _inputs_for(case)  # a fresh copy for the next tracer
            after = snapshot(model, inputs)
        before = after
    del model
    if meta:
        try:
            meta_model = _build(case, "meta")
            row["results"]["meta"] = _summary(_count(meta_model, _inputs_for(case, device="meta"), "dispatch"))
        except Exception as exc:
            row["errors"]["meta"] = first_line(exc)
        if case.ref_inputs is not None:
            try:
                meta_model = _build(case, "meta", reference=True)
                ref_inputs = _inputs_for(case, case.ref_inputs, device="meta")
                row["ref_input"] = _describe(ref_inputs)
                row["results"]["ref"] = _summary(_count(meta_model, ref_inputs, "dispatch"))
            except Exception as exc:
                row["errors"]["ref"] = first_line(exc)
    row["seconds"] = round(time.perf_counter() - start, 2)
    _judge(row)
    return row


def _describe(inputs: Tuple[Tuple[Any, ...], Dict[str, Any]]) -> str:
    def one(t: Any) -> str:
        if isinstance(t, torch.Tensor):
            text = "×".join(str(s) for s in t.shape) or "scalar"
            return text + ("" if t.is_contiguous() else " nc")
        if isinstance(t, (list, tuple)):
            return "[" + ", ".join(one(v) for v in t) + "]"
        return type(t).__name__

    args, kwargs = inputs
    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


def _judge(row: Dict[str, Any]) -> None:
    """Derived verdicts: jit vs dispatch, meta vs CPU, MACs vs the reference."""
    res = row["results"]
    jit, disp, meta_r = res.get("jit"), res.get("dispatch"), res.get("meta")
    row["jit_vs_dispatch"] = None
    if jit and disp:
        same = jit["macs"] == disp["macs"] and jit["flops"] == disp["flops"]
        row["jit_vs_dispatch"] = "=" if same else {
            "macs": [jit["macs"], disp["macs"]], "flops": [jit["flops"], disp["flops"]],
            "ops": op_diff(jit, disp, "macs" if jit["macs"] != disp["macs"] else "flops"),
        }
    row["meta_vs_cpu"] = None
    if disp and meta_r:
        same = disp["macs"] == meta_r["macs"] and disp["flops"] == meta_r["flops"]
        row["meta_vs_cpu"] = "=" if same else {
            "macs": [disp["macs"], meta_r["macs"]], "flops": [disp["flops"], meta_r["flops"]],
            "ops": op_diff(disp, meta_r, "macs" if disp["macs"] != meta_r["macs"] else "flops"),
        }
    # a published figure stated for other inputs is compared with the count at those inputs only
    elsewhere = row.get("ref_input") is not None or "published at" in row.get("note", "")
    counted = res.get("ref") if elsewhere else (res.get("auto") or res.get("dispatch"))
    row["counted_macs"] = counted["macs"] if counted else None
    ref = row["ref_macs"]
    row["vs_ref"] = None
    if ref is not None and counted is not None:
        tolerance = 500_000 if row["ref_source"].startswith("published") else 0
        delta = counted["macs"] - ref
        row["vs_ref"] = "=" if abs(delta) <= tolerance else (f"{100.0 * delta / ref:+.1f}%" if ref else f"+{delta}")
    ops: Dict[str, List[str]] = {}
    for tracer, summary in res.items():
        for op in summary["unsupported"]:
            ops.setdefault(op, []).append(tracer)
    row["unsupported"] = ops


# --------------------------------------------------------------------------- report


def _g(value: Optional[int]) -> str:
    if value is None:
        return "—"
    if abs(value) >= 10**9:
        return f"{value / 1e9:.3f} G"
    if abs(value) >= 10**6:
        return f"{value / 1e6:.3f} M"
    if abs(value) >= 10**4:
        return f"{value / 1e3:.1f} k"
    return str(value)


def _grouped(errors: Dict[str, str]) -> Dict[str, str]:
    """``{"auto/jit": message}``: runs that failed the same way, named together."""
    by_message: Dict[str, List[str]] = {}
    for run, message in errors.items():
        by_message.setdefault(message, []).append(run)
    return {"/".join(runs): message for message, runs in by_message.items()}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _mark(verdict: Any) -> str:
    if verdict is None:
        return "—"
    if verdict == "=":
        return "="
    (m1, m2), (f1, f2) = verdict["macs"], verdict["flops"]
    return f"**≠** MACs {m1:,}/{m2:,}" if m1 != m2 else f"**≠** FLOPs {f1:,}/{f2:,}"


def _ran(auto: Optional[Dict[str, Any]]) -> str:
    if not auto:
        return "—"
    return auto["tracer"] + (", incomplete" if auto.get("complete") is False else "")


def table(rows: List[Dict[str, Any]]) -> str:
    head = ("| model | input | params | reference MACs | counted | vs ref | auto ran | unsupported ops "
            "| jit = dispatch | meta = CPU | unchanged | errors | s |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        res = r["results"]
        auto = res.get("auto") or res.get("dispatch") or {}
        params = auto.get("params")
        params_text = _g(params)
        if r.get("ref_params") and params is not None:
            params_text += " =" if params == r["ref_params"] else f" (pub. {_g(r['ref_params'])})"
        unsupported = ", ".join(
            f"`{op.replace('aten::', '')}`" + ("" if len(t) == len(res) else f" ({'/'.join(t)})")
            for op, t in sorted(r.get("unsupported", {}).items()))
        changed = "; ".join(f"{t}: {', '.join(c)}" for t, c in r["changed"].items())
        errors = "; ".join(f"{k}: {_short(v)}" for k, v in _grouped(r["errors"]).items())
        ref = "—"
        if r["ref_macs"] is not None:
            at = r.get("ref_input")
            ref = f"{_g(r['ref_macs'])} (published, at {at})" if at else f"{_g(r['ref_macs'])} ({r['ref_source']})"
        lines.append("| " + " | ".join(_cell(c) for c in (
            r["name"], r.get("input", "—"), params_text, ref, _g(r.get("counted_macs")), r.get("vs_ref") or "—",
            _ran(res.get("auto")), unsupported or "", _mark(r.get("jit_vs_dispatch")),
            _mark(r.get("meta_vs_cpu")), "yes" if not r["changed"] else f"**no**: {changed}", errors,
            f"{r['seconds']:.1f}",
        )) + " |")
    return "\n".join(lines)


def summary(rows: List[Dict[str, Any]]) -> str:
    out = []
    families: Dict[str, int] = {}
    for r in rows:
        families[r["family"]] = families.get(r["family"], 0) + 1
    failed = [r for r in rows if r["errors"]]
    out.append(f"- models: {len(rows)} ({', '.join(f'{k} {v}' for k, v in families.items())}); "
               f"with an error under some tracer: {len(failed)}")
    ops: Dict[str, List[str]] = {}
    for r in rows:
        for op in r.get("unsupported", {}):
            ops.setdefault(op, []).append(r["name"])
    arithmetic = {op: m for op, m in ops.items() if op not in NO_ARITHMETIC}
    out.append(f"- unsupported ops: {len(ops)} distinct, {len(arithmetic)} of them arithmetic "
               f"(in {len({n for m in arithmetic.values() for n in m})} models)")
    for op, names in sorted(ops.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        tag = "" if op in arithmetic else " (no arithmetic)"
        listing = ", ".join(names[:6]) + (f", … (+{len(names) - 6})" if len(names) > 6 else "")
        out.append(f"  - `{op}`{tag}: {len(names)} models — {listing}")
    judged = [r for r in rows if r["results"].get("auto", {}).get("complete") is not None]
    if judged:
        flagged = [r for r in judged if r["results"]["auto"]["complete"] is False]
        silent = [r["name"] for r in judged if r["results"]["auto"]["complete"] and (
            set(r["results"]["auto"]["unsupported"]) - NO_ARITHMETIC or str(r.get("vs_ref") or "").startswith("-"))]
        out.append(f"- auto results flagged incomplete: {len(flagged)} of {len(judged)}; "
                   f"short or unsupported but flagged complete: {len(silent)} {', '.join(silent)}".rstrip())
    disagree = [r for r in rows if isinstance(r.get("jit_vs_dispatch"), dict)]
    out.append(f"- jit ≠ dispatch: {len(disagree)} models")
    for r in disagree:
        v = r["jit_vs_dispatch"]
        out.append(f"  - {r['family']}/{r['name']}: MACs {v['macs'][0]} vs {v['macs'][1]}, FLOPs {v['flops'][0]} vs "
                   f"{v['flops'][1]}; ops (jit/dispatch): {'; '.join(v['ops']) or '—'}")
    meta_bad = [r for r in rows if isinstance(r.get("meta_vs_cpu"), dict)]
    out.append(f"- meta ≠ CPU: {len(meta_bad)} models")
    for r in meta_bad:
        v = r["meta_vs_cpu"]
        out.append(f"  - {r['family']}/{r['name']}: MACs {v['macs'][0]} vs {v['macs'][1]}, FLOPs {v['flops'][0]} vs "
                   f"{v['flops'][1]}; ops (CPU/meta): {'; '.join(v['ops']) or '—'}")
    off = [r for r in rows if r.get("vs_ref") not in (None, "=")]
    out.append(f"- MACs ≠ reference: {len(off)} of {sum(1 for r in rows if r.get('vs_ref'))} compared")
    for r in off:
        out.append(f"  - {r['family']}/{r['name']}: counted {r['counted_macs']} vs {r['ref_macs']} "
                   f"({r['ref_source']}) {r['vs_ref']}")
    changed = [r for r in rows if r["changed"]]
    out.append(f"- model or inputs changed: {len(changed)} models")
    for r in changed:
        what = "; ".join(f"{t}: {', '.join(c)}" for t, c in r["changed"].items())
        out.append(f"  - {r['family']}/{r['name']}: {what}")
    out.append(f"- errors: {len(failed)} models")
    for r in failed:
        out.append(f"  - {r['family']}/{r['name']}: " + "; ".join(f"{k}: {_short(v, 300)}"
                                                                 for k, v in _grouped(r["errors"]).items()))
    return "\n".join(out)


def environment() -> Dict[str, str]:
    env = {"python": platform.python_version(), "torch": torch.__version__, "flopcount": flopcount.__version__,
           "machine": f"{platform.machine()}, {torch.get_num_threads()} threads", "platform": platform.platform()}
    for name in ("torchvision", "transformers"):
        try:
            env[name] = __import__(name).__version__
        except ImportError:
            env[name] = "not installed"
    return env


def report(rows: List[Dict[str, Any]], env: Dict[str, str], skipped: Dict[str, str]) -> str:
    parts = ["## Environment", ", ".join(f"{k} {v}" for k, v in env.items()), "", "## Summary", summary(rows)]
    for family in PARTS:
        subset = [r for r in rows if r["family"] == family]
        if subset:
            parts += ["", f"## {family} ({len(subset)})", table(subset)]
    if skipped:
        parts += ["", "## Not run", "\n".join(f"- {k}: {v}" for k, v in skipped.items())]
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------- main


def collect(only: Optional[str]) -> Tuple[List[Case], Dict[str, str]]:
    cases: List[Case] = []
    skipped: Dict[str, str] = {}
    wanted = [only] if only else list(PARTS)
    if "torchvision" in wanted:
        try:
            import torchvision  # type: ignore[import-not-found]  # noqa: F401
        except ImportError:
            skipped["torchvision"] = "not installed in this environment (make zoo installs it)"
        else:
            import zoo_tv

            cases += zoo_tv.cases()
            skipped["torchvision quantization"] = "quantized models are issue #9 item 4, not part of this zoo"
    if "transformers" in wanted:
        try:
            import transformers  # noqa: F401
        except ImportError:
            skipped["transformers"] = "not installed"
        else:
            import zoo_hf

            cases += zoo_hf.cases()
    if "nn" in wanted:
        import zoo_nn

        cases += zoo_nn.cases()
        for name, why in zoo_nn.unlisted().items():
            skipped[f"nn.{name}"] = why
    return cases, skipped


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=PARTS)
    parser.add_argument("--start", type=int, default=0, help="skip the first N models (run in pieces)")
    parser.add_argument("--limit", type=int, default=None, help="run at most N models")
    parser.add_argument("--match", default=None, help="only models whose name contains this text")
    parser.add_argument("--no-meta", action="store_true", help="skip the meta-device runs")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument("--from-json", type=Path, nargs="+", default=None,
                        help="render one report from JSON files of earlier runs (no model is run)")
    args = parser.parse_args(argv)

    if args.from_json:
        merged: List[Dict[str, Any]] = []
        notes: Dict[str, str] = {}
        recorded: Dict[str, str] = {}
        for path in args.from_json:
            data = json.loads(path.read_text())
            for row in data["rows"]:
                if row["results"]:
                    _judge(row)  # re-derive the verdicts with this version of the rules
                merged.append(row)
            notes.update(data["skipped"])
            recorded = recorded or data["environment"]
        sys.stdout.write(report(merged, recorded, notes))
        return 0

    cases, skipped = collect(args.only)
    if args.match:
        cases = [c for c in cases if args.match in c.name]
    cases = cases[args.start:]
    if args.limit is not None:
        cases = cases[:args.limit]
    rows: List[Dict[str, Any]] = []
    env = environment()
    for i, case in enumerate(cases):
        print(f"[{i + 1}/{len(cases)}] {case.family}/{case.name} ...", end=" ", file=sys.stderr, flush=True)
        try:
            row = run_case(case, meta=not args.no_meta)
        except Exception as exc:  # the zoo reports, it does not stop
            traceback.print_exc(file=sys.stderr)
            row = {"family": case.family, "name": case.name, "note": case.note, "ref_macs": case.ref_macs,
                   "ref_source": case.ref_source, "ref_params": case.ref_params, "errors": {"zoo": first_line(exc)},
                   "changed": {}, "results": {}, "seconds": 0.0}
        rows.append(row)
        print(f"{row['seconds']:.1f}s", file=sys.stderr, flush=True)
        if args.json:  # after every model, so a piece cut short keeps what it measured
            args.json.write_text(json.dumps({"environment": env, "skipped": skipped, "rows": rows}, indent=1))
    sys.stdout.write(report(rows, env, skipped))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
