"""Tables, CSV and overview text of a profile (measured time joined with counted cost) and of a
prediction (roofline lower bounds); the profiler's Chrome trace with flopcount's figures in each
joined op event's ``args`` (Perfetto and the TensorBoard profiler plugin show them beside the event)."""

from __future__ import annotations

import copy
import csv
import io
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence

from flopcount.core.rendering import renders
from flopcount.devices.roofline import PROFILE_CONVENTION, AnyBound, Roofs, doubts_text, float32_math_text
from flopcount.report.notes import estimate_line, marked
from flopcount.report.table import grid
from flopcount.units import ROOT_LABEL, format_bytes, format_count, format_seconds, format_share

if TYPE_CHECKING:
    from flopcount.profiling.predict import PredictResult
    from flopcount.profiling.result import ProfileResult, ProfileRow

BY = ("operator", "module", "op")


def _ratio(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


#: Marks beside a row's figures, explained under the table.
FLAGGED, APPORTIONED = "!", "~"


def _efficiency_cell(row: ProfileRow, roofs: Roofs) -> str:
    """The row's efficiency (its attainable time over its time), ``~`` before it on roofs with
    doubts; ``~`` alone where the time was apportioned."""
    if row.time_source != "measured":
        return APPORTIONED
    if row.efficiency is None:
        return "-"
    return marked(_ratio(row.efficiency), roofs) + (FLAGGED if row.flag else "")


def _rows_for(result: ProfileResult, by: str, depth: Optional[int] = None) -> List[ProfileRow]:
    """The rows per ``by``; module rows down to ``depth`` (the whole model is depth 0)."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, got {by!r}")
    if by == "operator":
        return list(result.by_operator().values())
    if by == "module":
        return [r for r in result.by_module().values() if depth is None or (r.module.count(".") + 1 if r.module else 0) <= depth]
    return list(result.rows)


def overview_line(result: ProfileResult) -> str:
    """One line per step: where the step's time went."""
    o = result.overview
    step = o.step_s or 1.0
    parts = {"ops with FLOPs": o.flops_s, "data movement": o.data_movement_s, "other ops": o.other_s,
             "host time not covered by ops": o.host_uncovered_s}
    return f"Step {format_seconds(o.step_s)}: " + ", ".join(
        f"{label} {format_seconds(value)} ({100 * value / step:.1f}%)" for label, value in parts.items())


def _header(by: str, timing: str) -> List[str]:
    return [by, *(["module", "phase"] if by == "op" else []), "calls", "FLOPs", "bytes", f"time ({timing})", "share",
            "achieved FLOP/s", "FLOP/B", "bound", "attainable", "efficiency"]


def _time_cells(row: ProfileRow, total: float) -> List[str]:
    """The row's measured time (marked when apportioned) and its share of ``total``."""
    return [format_seconds(row.measured_s) + (APPORTIONED if row.time_source != "measured" else ""),
            format_share(row.measured_s, total)]


def _cells(row: ProfileRow, by: str, total: float, roofs: Roofs) -> List[str]:
    return [
        row.module or ROOT_LABEL if by == "module" else row.name,
        *([row.module or ROOT_LABEL, row.phase] if by == "op" else []),
        f"{row.calls:g}",
        format_count(row.flops),
        format_bytes(row.bytes),
        *_time_cells(row, total),
        format_count(row.achieved_flops_per_s),
        _ratio(row.intensity),
        row.bound if row.attainable_s > 0 else "-",
        marked(format_seconds(row.attainable_s), roofs),
        _efficiency_cell(row, roofs),
    ]


def marks_lines(rows: Sequence[ProfileRow], limit: int = 6) -> List[str]:
    """What the table's marks mean, naming the rows that carry them."""
    flagged = [f"{r.name} {r.efficiency:.2f}" for r in rows if r.flag]
    shared = [r.name for r in rows if r.time_source != "measured"]
    marks = (
        (flagged, f"{FLAGGED} roof below achieved: {{}}: compute-bound, faster than the compute roof allows; "
                  "the roof is too low for this op (a library faster than the roof's benchmark), not an op above 100%"),
        (shared, f"{APPORTIONED} time apportioned: {{}}: a fused kernel's time shared among the ops it stands for "
                 "by a model (attainable time or FLOPs), so no per-op efficiency"),
    )
    return [text.format(", ".join(names[:limit]) + (" ..." if len(names) > limit else "")) for names, text in marks if names]


def data_movement_table(result: ProfileResult, *, limit: Optional[int] = 10, fmt: str = "simple") -> str:
    """The ops that move bytes and do no arithmetic, largest time first, with their bandwidth."""
    rows = list(result.data_movement().values())
    if not rows:
        return ""
    shown = rows if limit is None else rows[:limit]
    total = result.total_time_s
    body = grid(
        [
            [r.name, f"{r.calls:g}", format_bytes(r.bytes), *_time_cells(r, total),
             format_count(r.achieved_bytes_per_s) + "B/s" if r.achieved_bytes_per_s else "-",
             marked(format_seconds(r.attainable_s), result.roofs), _efficiency_cell(r, result.roofs)]
            for r in shown
        ],
        ["data movement (no FLOPs)", "calls", "bytes", f"time ({result.timing})", "share", "achieved bandwidth", "attainable",
         "efficiency"],
        fmt,
        disable_numparse=True,
    )
    more = f"\n... {len(rows) - limit} more data-movement ops" if limit is not None and len(rows) > limit else ""
    return body + more


@renders("ProfileResult", "table")
def profile_table(
    result: ProfileResult, *, by: str = "operator", limit: Optional[int] = 25, fmt: str = "simple", depth: Optional[int] = None
) -> str:
    """The rows (per operator, module or op), largest time first, then the overview,
    the roofs, what was not joined and the convention. ``depth``: module rows down to it."""
    rows = _rows_for(result, by, depth)
    if by != "module":
        rows.sort(key=lambda r: -r.measured_s)
    total = result.total_time_s
    shown = rows if limit is None else rows[:limit]
    body = grid([_cells(r, by, total, result.roofs) for r in shown], _header(by, result.timing), fmt, disable_numparse=True)
    lines = [body]
    if limit is not None and len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more rows (limit={limit})")
    lines += marks_lines(shown)
    lines += [line for line in (estimate_line(result.roofs),) if line]
    if by != "module":
        movement = data_movement_table(result, fmt=fmt)
        if movement:
            lines.append(movement)
    lines += [
        overview_line(result),
        f"{result.steps} steps after {result.warmup} warm-up on {result.device}"
        + (" (forward + backward)" if result.backward else "")
        + f"; joined op time {format_seconds(result.op_time_s)} per step",
        f"Roofs: {result.roofs.describe()}",
    ]
    lines += unmatched_lines(result)
    lines.append(PROFILE_CONVENTION)
    lines += [f"warning: {d.text}" for d in result.diagnostics() if d.kind == "warning"]  # the estimate: its ~ line
    return ("\n\n" if fmt == "github" else "\n").join(lines)


def unmatched_lines(result: ProfileResult, limit: int = 8) -> List[str]:
    if not result.unmatched:
        return ["Unmatched: none (every profiled op call has a cost, every counted call a time)"]
    lines = [f"Unmatched ({len(result.unmatched)}):"]
    for u in result.unmatched[:limit]:
        what = f"{u.time_s * 1e6:.1f} us/step" if u.kind == "profiled" else f"{format_count(u.flops)} FLOPs"
        where = f" in '{u.module}'" if u.module else ""
        lines.append(f"  {u.kind}: {u.name}{where} x{u.calls:g}, {what}: {u.reason}")
    if len(result.unmatched) > limit:
        lines.append(f"  ... {len(result.unmatched) - limit} more")
    return lines


_CSV_FIELDS = (
    "name", "module", "phase", "calls", "flops", "macs", "bytes", "time_s", "host_time_s",
    "achieved_flops_per_s", "intensity", "bound", "compute_s", "memory_s", "attainable_s", "efficiency", "dtype",
    "time_source", "category", "achieved_bytes_per_s", "flag", "bound_certain", "bound_doubts",
)


@renders("ProfileResult", "csv")
def profile_csv(result: ProfileResult, *, by: str = "op") -> str:
    """One CSV line per row (per op by default), every figure unformatted; the last two columns
    say whether the row's attainable time and efficiency are bounds (``bound_certain``) and,
    where not, why (``bound_doubts``: the roofs were measured under load)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_CSV_FIELDS)
    doubts = {"bound_certain": result.roofs.certain, "bound_doubts": doubts_text(result.roofs.doubts)}
    for row in _rows_for(result, by):
        data: Dict[str, Any] = {**row.to_dict(), **doubts}
        writer.writerow(["" if data[f] is None else data[f] for f in _CSV_FIELDS])
    return buffer.getvalue()


@renders("PredictResult", "table")
def predict_table(result: PredictResult, *, limit: Optional[int] = 25, fmt: str = "simple") -> str:
    """The per-operator lower bounds, largest first, and the total; on roofs with doubts
    (measured under load) each figure marked ``~`` and named an estimate."""
    roofs = result.roofs
    rows: Sequence[Any] = list(result.by_operator().values())
    shown = rows if limit is None else rows[:limit]
    column = max((r.latency_s for r in shown), default=0.0)  # one unit for the column: its largest figure's
    body = grid(
        [
            [r.name, f"{r.calls:g}", format_count(r.flops), format_bytes(r.bytes), _ratio(r.intensity),
             r.bound if r.latency_s > 0 else "-",
             marked(format_seconds(r.latency_s, like=column), roofs), format_share(r.latency_s, result.latency_s)]
            for r in shown
        ],
        ["operator", "calls", "FLOPs", "bytes", "FLOP/B", "bound", "lower bound" if roofs.certain else "estimate", "share"],
        fmt,
        disable_numparse=True,
    )
    eager_s = result.bound_s("eager")
    what = "lower bound" if roofs.certain else "estimate"
    eager = _beside(eager_s, result.latency_s, result.compute_s, result.memory_s)
    lines = [
        body,
        f"Eager {what} on {roofs.device}: {marked(eager(eager_s), roofs)}: the any-implementation "
        f"{'bound' if roofs.certain else what} below, for a torch.compile-d model (the per-op sum "
        f"{eager(result.latency_s)} bounds the eager program it was compiled from, not its fused kernels)"
        if result.compiled else
        f"Eager {what} on {roofs.device}: {marked(eager(eager_s), roofs)}: the per-op sum "
        f"{eager(result.latency_s)} (compute {eager(result.compute_s)}, memory "
        f"{eager(result.memory_s)} if each ran alone)"
        + (f", or the any-implementation {'bound' if roofs.certain else what} below where larger" if eager_s > result.latency_s else ""),
    ]
    if result.any_bound is not None:
        shown_any = _beside(result.any_s, result.any_bound.compute_s, result.any_bound.memory_s)
        lines.append(
            f"Any implementation (fused or not): {marked(shown_any(result.any_s), roofs)} = max(all FLOPs / peak "
            f"{shown_any(result.any_bound.compute_s)}, {_unavoidable_memory(result.any_bound, shown_any)})")
    math = float32_math_text(result.float32_math())
    if math:
        lines.append(f"Math: {math} (the part's math modes for float32 work)")
    lines += [
        f"Roofs: {roofs.describe()}",
        "Bounds, not forecasts: the first is the sum over ops of max(FLOPs / peak, bytes / bandwidth of the fastest "
        "memory level holding them), for this eager program; real runs add launch and framework overhead and "
        "imperfect kernels, and an engine that fuses ops can beat it but not the any-implementation bound."
        if roofs.certain else
        "Estimates, not bounds: the same sums (each op's max(FLOPs / peak, bytes / bandwidth), and the "
        "any-implementation max) on roofs below what this machine does.",
    ]
    if not roofs.certain:
        lines.insert(1, estimate_line(roofs))
    lines += [f"Note: {w}" for w in result.warnings if "has no peak for" in w]
    return ("\n\n" if fmt == "github" else "\n").join(lines)


def _beside(*figures: float) -> Callable[[float], str]:
    """How one sentence spells its times ``figures``: each in its own unit, a 0 in its largest
    figure's (``compute 0.1 ns, memory 0.0 ns``: 0 alone would read ``0.0 us``)."""
    largest = max(figures)
    return lambda seconds: format_seconds(seconds, like=largest if seconds == 0 else None)


def _unavoidable_memory(any_bound: AnyBound, seconds: Callable[[float], str] = format_seconds) -> str:
    """The any-implementation bound's memory term as the division it is: the unavoidable bytes
    less what the faster levels hold, over the bandwidth of the level holding the rest (its time
    spelled by ``seconds``)."""
    unavoidable = format_bytes(any_bound.unavoidable_bytes)
    if any_bound.level_bandwidth is None:
        return f"unavoidable {unavoidable} held in the {any_bound.level}, whose bandwidth is unpublished: no memory term"
    if any_bound.faster_bytes:
        return (f"unavoidable {unavoidable} less the {format_bytes(any_bound.faster_bytes)} the faster levels hold "
                f"/ {any_bound.level} bandwidth {seconds(any_bound.memory_s)}")
    return f"unavoidable {unavoidable} / {any_bound.level} bandwidth {seconds(any_bound.memory_s)}"


def profile_html(result: ProfileResult, *, entry: str = "", by: str = "operator", depth: Optional[int] = None) -> str:
    """One self-contained page: the table, the overview and, with matplotlib, the roofline."""
    import html

    from flopcount.report.html import page

    rows = [_cells(r, by, result.total_time_s, result.roofs) for r in _rows_for(result, by, depth)]
    body = grid(rows, _header(by, result.timing), "html", disable_numparse=True)
    notes = [*marks_lines(_rows_for(result, by)), *(line for line in (estimate_line(result.roofs),) if line),
             overview_line(result), f"Roofs: {result.roofs.describe()}",
             *unmatched_lines(result)]
    try:
        from flopcount.report.roofline_plot import roofline_svg

        figure = roofline_svg(result)
    except ImportError:
        figure = "<p>(install matplotlib for the roofline plot)</p>"
    movement = data_movement_table(result, limit=None, fmt="html") if by != "module" else ""
    return page(f"flopcount profile: {entry}", [*(f"<p>{html.escape(line)}</p>" for line in notes), figure, body, movement])


def enriched_trace(trace: Mapping[str, Any], args_by_id: Mapping[int, Mapping[str, Any]]) -> Dict[str, Any]:
    """A copy of ``trace`` whose CPU op events (matched by the profiler's ``External id``,
    the ``FunctionEvent.id`` of the joined top-level op) carry the given extra ``args``;
    a figure that does not apply (a view's efficiency and intensity) is null. Seconds
    (``attainable_s``) are written in the trace's unit, microseconds (``attainable_us``)."""
    data = copy.deepcopy(dict(trace))
    for event in data.get("traceEvents", ()):
        args = event.get("args") if isinstance(event, dict) and event.get("cat") == "cpu_op" else None
        if not isinstance(args, dict):
            continue
        extra = args_by_id.get(args.get("External id", -1))
        if extra is not None:
            # None stays (JSON null): a view's efficiency is "none", not 0.0
            args.update((_US.get(key, key), value * 1e6 if key in _US else value) for key, value in extra.items())
    return data


#: figures in seconds in the data -> their name in the trace's microseconds
_US = {"attainable_s": "attainable_us"}


@renders("ProfileResult", "chrome_trace")
def profile_chrome_trace(result: ProfileResult) -> Dict[str, Any]:
    """The profile's kept Chrome trace with each joined op's figures (``ProfileResult.trace_args``);
    on roofs with doubts each also says that its attainable time is an estimate (``bound_certain``
    false, ``bound_doubts`` why)."""
    if result.trace is None:
        raise ValueError("this profile kept no trace (profile(..., keep_trace=False))")
    args = result.trace_args
    if not result.roofs.certain:
        doubts = {"bound_certain": False, "bound_doubts": doubts_text(result.roofs.doubts)}
        args = {key: {**value, **doubts} for key, value in args.items()}
    return enriched_trace(result.trace, args)
