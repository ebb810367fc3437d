"""Matching two counts row by row: modules by path and type, operators by name."""

from __future__ import annotations

import os
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple, Union

from flopcount.core.results import FlopResult, Totals, load_report
from flopcount.core.rows import CostRow
from flopcount.devices import Roofs, default_bound
from flopcount.devices.roofline import BOUND_NAMES, bound_seconds
from flopcount.diffs.result import METRICS, Change, DiffResult, Number, Status
from flopcount.errors import UsageError

#: what :func:`diff` accepts for each side
Side = Union[FlopResult, str, "os.PathLike[str]", Mapping[str, Any]]


def as_result(side: Side, name: str) -> Tuple[FlopResult, str]:
    """A side of a diff as a :class:`FlopResult` and the label it came with: a result, a
    JSON report's path, or a report's dict (``to_dict()`` / ``count --format json``)."""
    if isinstance(side, FlopResult):
        return side, str(side.sections.get("entry") or name)
    if isinstance(side, (str, os.PathLike)):
        return load_report(side), str(os.fspath(side))
    if isinstance(side, Mapping):
        result = FlopResult.from_dict(side, source=f"report {name}")
        return result, str(result.sections.get("entry") or name)
    raise UsageError(f"diff: {name} must be a FlopResult, a JSON report's path or its dict, got {type(side).__name__}")


def totals_of(result: FlopResult) -> Dict[str, Number]:
    """The whole model's metrics; peak memory (bytes) and latency (seconds, the median) when
    the report holds them (``count --memory``, ``bench``)."""
    values: Dict[str, Number] = {"params": result.params, "macs": result.macs, "flops": result.flops, "bytes": result.bytes}
    memory = result.sections.get("memory")
    if isinstance(memory, Mapping) and isinstance(memory.get("peak_bytes"), int):
        values["peak_memory"] = memory["peak_bytes"]
    timing = result.benchmark
    median: Any = getattr(timing, "median_s", None) if timing is not None else None
    saved = result.sections.get("benchmark")
    if median is None and isinstance(saved, Mapping):
        median = saved.get("median_s")
        if median is None and isinstance(saved.get("median_ms"), (int, float)):  # a report written by 0.2
            median = saved["median_ms"] / 1e3
    if isinstance(median, (int, float)) and not isinstance(median, bool):
        values["latency"] = median
    return values


def bound_of(result: FlopResult) -> Optional[Tuple[float, str, bool]]:
    """The latency bound a ``count --on PART`` report holds, as ``check --on`` holds a budget
    to it there (the any-implementation bound on a datasheet part, the eager one on this
    machine), what it is and whether it is one: ``(seconds, "any-implementation lower bound
    on H100 SXM, bfloat16", True)``; on this machine's roofs measured under load an estimate
    (``"eager estimate on ..., not a bound: roofs measured under load (...)", False``); None
    when the report holds none."""
    saved = result.sections.get("predict")
    if not isinstance(saved, Mapping) or not isinstance(saved.get("roofs"), Mapping):
        return None
    roofs = Roofs.from_dict(saved["roofs"])
    kind = default_bound(roofs)
    seconds = bound_seconds(kind, float(saved["latency_s"]), float(saved.get("any_s") or 0.0), bool(saved.get("compiled")))
    dtype = saved.get("dtype")
    what = "lower bound" if roofs.certain else "estimate"
    basis = f"{BOUND_NAMES[kind]} {what} on {roofs.device}" + (f", {dtype}" if dtype else "")
    if not roofs.certain:
        basis += f", not a bound: roofs measured under load ({'; '.join(roofs.doubts)})"
    return seconds, basis, roofs.certain


def _values(first: str, value: Number, t: Union[CostRow, Totals]) -> Dict[str, Number]:
    """A row's metrics: ``first`` (a module's params, an operator's calls), then its MACs, FLOPs and bytes."""
    return {first: value, "macs": t.macs, "flops": t.flops, "bytes": t.bytes}


def _modules(result: FlopResult) -> Dict[Tuple[str, str], Tuple[int, Dict[str, Number]]]:
    return {(info.name, info.type_name): (info.depth, _values("params", info.params, result._module_sums(info.name)))
            for info in result.modules}


#: the classes torch.export rebuilds a program's modules as (``torch.export.unflatten``; fx's
#: ``GraphModule`` for a program read flat), and the class of every module of a loaded TorchScript
#: program (``torch.jit.load``): they keep each module's path but not its class
SCRIPTED_TYPE = "RecursiveScriptModule"
REBUILT_TYPES = frozenset({"InterpreterModule", "UnflattenedModule", "GraphModule", SCRIPTED_TYPE})

ModuleKey = Tuple[str, str]


def _matched_rebuilt(mods_a: Dict[ModuleKey, Any], mods_b: Dict[ModuleKey, Any]) -> Tuple[Dict[ModuleKey, Any], Dict[ModuleKey, Any]]:
    """Both sides' modules with a rebuilt module (an exported program's ``InterpreterModule``, a
    TorchScript program's ``RecursiveScriptModule``) keyed as the module of the same path on the
    other side, that one's class named (of two rebuilt classes, the first by name, on both sides):
    the eager model against the ``.pt2`` or ``.pt`` it ships, or the two files, is one model, each
    path matched, not every module removed and added. A path the other side lacks, or has under
    more than one class, is left as it is."""

    def rekeyed(mine: Dict[ModuleKey, Any], other: Dict[ModuleKey, Any]) -> Dict[ModuleKey, Any]:
        by_path: Dict[str, List[str]] = {}
        for name, type_name in other:
            by_path.setdefault(name, []).append(type_name)
        out = {}
        for (name, type_name), value in mine.items():
            types = by_path.get(name, [])
            key = (name, type_name)
            if type_name in REBUILT_TYPES and key not in other and len(types) == 1:
                theirs = types[0]
                key = (name, min(type_name, theirs) if theirs in REBUILT_TYPES else theirs)
            out[key] = value
        return out

    return rekeyed(mods_a, mods_b), rekeyed(mods_b, mods_a)


#: a module row's costs (its params are its own whoever runs it)
_COSTS = ("macs", "flops", "bytes")


def scripted_roots(result: FlopResult) -> Tuple[str, ...]:
    """The outermost TorchScript modules with submodules (``RecursiveScriptModule``): TorchScript
    runs their submodules without Python's module hooks, so the submodules' work is booked on them
    and the submodules' own rows read 0 (the count's warning says so)."""
    parents = {info.name.rpartition(".")[0] for info in result.modules if info.name}
    roots: List[str] = []
    for info in result.modules:
        if info.type_name == SCRIPTED_TYPE and info.name in parents and not any(_inside(info.name, root) for root in roots):
            roots.append(info.name)
    return tuple(roots)


def _inside(name: str, root: str) -> bool:
    """Whether module ``name`` is strictly below module ``root``."""
    return name != root and (root == "" or name.startswith(root + "."))


def _unmeasured(result: FlopResult) -> FrozenSet[str]:
    """The modules below a TorchScript module (:func:`scripted_roots`) whose rows read no cost:
    their MACs, FLOPs and bytes are not known (booked on the scripted module), only their params."""
    roots = scripted_roots(result)
    if not roots:
        return frozenset()
    return frozenset(
        info.name for info in result.modules
        if any(_inside(info.name, root) for root in roots) and not _costs(result._module_sums(info.name))
    )


def _costs(totals: Totals) -> bool:
    return bool(totals.macs or totals.flops or totals.bytes)


def _params_only(row: Tuple[int, Dict[str, Number]]) -> Tuple[int, Dict[str, Number]]:
    depth, values = row
    return depth, {k: v for k, v in values.items() if k not in _COSTS}


def _module_status(a: Optional[Mapping[str, Number]], b: Optional[Mapping[str, Number]]) -> Status:
    """:func:`_status` over the metrics both sides know (a TorchScript submodule's row: params only)."""
    if a is None or b is None:
        return _status(a, b)
    known = set(a) & set(b)
    return _status({k: a[k] for k in known}, {k: b[k] for k in known})


def _operators(result: FlopResult) -> Dict[str, Dict[str, Number]]:
    return {op: _values("count", t.calls, t) for op, t in result.operator_totals().items()}


#: the spellings of one linear (or matrix product) that tracers produce: ``aten::linear`` as
#: Python called it (the eager model, a ``.pt2``); ``aten::t`` + ``aten::addmm`` (or a view,
#: ``aten::mm`` and a bias ``aten::add`` where the input has more than two dimensions) as it
#: runs below Python, where the dispatch tracer sees a TorchScript program's ``linear``
LINEAR_SPELLINGS = frozenset({"aten::linear", "aten::matmul", "aten::addmm", "aten::mm", "aten::bmm", "aten::t",
                              "aten::add", "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::expand"})


def _respelled(ops_a: Mapping[str, Mapping[str, Number]], ops_b: Mapping[str, Mapping[str, Number]]) -> FrozenSet[str]:
    """The changed operators that only respell the same work: all of :data:`LINEAR_SPELLINGS`,
    ``aten::linear`` or ``aten::matmul`` on one side only, and their MACs, FLOPs and bytes
    summed equal on both sides (exactly); empty otherwise (a change is then shown as one)."""
    changed = {op for op in set(ops_a) | set(ops_b) if _status(ops_a.get(op), ops_b.get(op)) != "unchanged"}
    composite = {"aten::linear", "aten::matmul"}
    if not changed or not changed <= LINEAR_SPELLINGS or not (composite & changed):
        return frozenset()
    if any(op in ops_a and op in ops_b for op in composite & changed):  # a composite on both sides: a real change
        return frozenset()

    def summed(ops: Mapping[str, Mapping[str, Number]]) -> Tuple[Number, ...]:
        return tuple(sum(ops[op].get(k, 0) for op in changed if op in ops) for k in ("macs", "flops", "bytes"))

    return frozenset(changed) if summed(ops_a) == summed(ops_b) else frozenset()


def _lower_bound(result: FlopResult) -> bool:
    """Incomplete only by ops without a handler: its MACs, FLOPs and bytes can only be higher."""
    return not result.complete and not result.gaps


def _status(a: Optional[Mapping[str, Number]], b: Optional[Mapping[str, Number]]) -> Status:
    if a is None:
        return "added"
    if b is None:
        return "removed"
    return "unchanged" if all(a.get(k) == b.get(k) for k in set(a) | set(b)) else "changed"


def _merged_order(a_keys: Iterable[Tuple[str, str]], b_keys: Iterable[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """B's module order, each of A's modules that B lacks placed before the first module
    that follows it in A and B has: so a removed layer stays beside its old neighbours."""
    b_list = list(b_keys)
    in_b = set(b_list)
    pending: Dict[Tuple[str, str], List[Tuple[str, str]]] = {}
    waiting: List[Tuple[str, str]] = []
    for key in a_keys:
        if key in in_b:
            if waiting:
                pending[key] = waiting
                waiting = []
        else:
            waiting.append(key)
    order: List[Tuple[str, str]] = []
    for key in b_list:
        order.extend(pending.pop(key, ()))
        order.append(key)
    return order + waiting  # every key of pending is one of B's: each list was placed above


def diff(a: Side, b: Side, *, a_label: Optional[str] = None, b_label: Optional[str] = None) -> DiffResult:
    """What changes from A to B, per module (matched by path and type, a module torch.export
    rebuilt matching the other side's module of its path: added, removed, changed), per
    operator (by name; rows that only respell one linear, ``aten::linear`` against ``aten::t`` +
    ``aten::addmm`` with equal MACs, FLOPs and bytes, ``respelled``) and in total: params, MACs, FLOPs, bytes moved, and peak memory and
    latency when both reports hold them, and the latency bound when both hold one on the same
    part (``count --on``, :func:`bound_of`). ``a`` and ``b``: a
    :class:`~flopcount.core.results.FlopResult`, a JSON report's path (``count --format json
    --output``) or its dict. Delta = B - A; relative = (B - A) / A."""
    result_a, label_a = as_result(a, "A")
    result_b, label_b = as_result(b, "B")
    totals_a, totals_b = totals_of(result_a), totals_of(result_b)
    bound_a, bound_b = bound_of(result_a), bound_of(result_b)
    # the same bound on the same part; an estimate (roofs measured under load) is compared with nothing
    if bound_a is not None and bound_b is not None and bound_a[1] == bound_b[1] and bound_a[2] and bound_b[2]:
        totals_a["latency_bound"], totals_b["latency_bound"] = bound_a[0], bound_b[0]
    both = [m for m in METRICS if m in totals_a and m in totals_b]
    totals = Change("total", "", "", 0, _status(totals_a, totals_b),
                    {m: totals_a[m] for m in both}, {m: totals_b[m] for m in both})

    mods_a, mods_b = _matched_rebuilt(_modules(result_a), _modules(result_b))
    unmeasured_a, unmeasured_b = _unmeasured(result_a), _unmeasured(result_b)
    modules: List[Change] = []
    for key in _merged_order(mods_a, mods_b):
        side_a, side_b = mods_a.get(key), mods_b.get(key)
        if side_a is not None and key[0] in unmeasured_a:
            side_a = _params_only(side_a)
        if side_b is not None and key[0] in unmeasured_b:
            side_b = _params_only(side_b)
        depth = (side_b or side_a or (0, {}))[0]
        values_a = side_a[1] if side_a else None
        values_b = side_b[1] if side_b else None
        modules.append(Change("module", key[0], key[1], depth, _module_status(values_a, values_b), values_a, values_b))

    ops_a, ops_b = _operators(result_a), _operators(result_b)
    names = sorted(set(ops_a) | set(ops_b), key=lambda op: (-max(ops_a.get(op, {}).get("flops", 0), ops_b.get(op, {}).get("flops", 0)), op))
    respelled = _respelled(ops_a, ops_b)
    operators = tuple(
        Change("operator", op, "", 0, "respelled" if op in respelled else _status(ops_a.get(op), ops_b.get(op)),
               ops_a.get(op), ops_b.get(op)) for op in names
    )
    return DiffResult(
        a_label=a_label or label_a,
        b_label=b_label or label_b,
        totals=totals,
        modules=tuple(modules),
        operators=operators,
        a_incomplete=result_a.incomplete_reasons(),
        b_incomplete=result_b.incomplete_reasons(),
        a_lower=_lower_bound(result_a),
        b_lower=_lower_bound(result_b),
        a_phases=" + ".join(result_a.by_phase()) or "forward",
        b_phases=" + ".join(result_b.by_phase()) or "forward",
        a_inputs=result_a.input_description,
        b_inputs=result_b.input_description,
        a_bound="" if bound_a is None else bound_a[1],
        b_bound="" if bound_b is None else bound_b[1],
        a_scripted=scripted_roots(result_a) if unmeasured_a else (),
        b_scripted=scripted_roots(result_b) if unmeasured_b else (),
    )
