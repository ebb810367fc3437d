"""A log-log roofline of a profile: the compute and memory roofs, one point per operator
(or per op row) at (FLOPs per byte, achieved FLOP/s), area by its share of the time, the
top ops labelled; the ops with no FLOPs in a panel of their own (bytes moved, bandwidth
reached). Flagged rows (roof below achieved) are edged, apportioned ones hollow. Needs
matplotlib (optional); draws on the Agg canvas, no pyplot."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Tuple, Union

from flopcount.core.rendering import renders
from flopcount.report.plot import new_figure
from flopcount.units import format_count

if TYPE_CHECKING:
    from flopcount.profiling.result import ProfileResult, ProfileRow

#: Roof lines are drawn in greys (one line style per dtype), points in colours no roof uses,
#: so a point is never read as a roof or the other way round.
ROOF_COLORS = ("#1a1a1a", "#595959", "#8c8c8c", "#b3b3b3")
ROOF_STYLES = ("-", "--", "-.", (0, (6, 2, 1, 2)))
POINT_COLORS = {"compute": "#e66100", "memory": "#5d3a9b", "data movement": "#1b9e77"}
#: The edge of a point whose compute roof is below what it achieved (the flag's colour).
FLAG_EDGE = "#d4006a"


def _rows(result: ProfileResult, by: str) -> List[ProfileRow]:
    return list(result.by_operator().values()) if by == "operator" else list(result.rows)


def _points(result: ProfileResult, by: str) -> List[ProfileRow]:
    # a point needs a position on both axes: work, bytes and time
    return [r for r in _rows(result, by) if r.flops > 0 and r.bytes > 0 and r.measured_s > 0]


def _moving(result: ProfileResult, by: str) -> List[ProfileRow]:
    """Rows with bytes and time but no FLOPs: placed by bytes moved and bandwidth reached."""
    return [r for r in _rows(result, by) if r.category == "data movement" and r.measured_s > 0]


def _label(row: ProfileRow, by: str, total_s: float) -> str:
    name = row.name.replace("aten::", "") + (f" ({row.module})" if by != "operator" and row.module else "")
    share = f"{100 * row.measured_s / total_s:.0f}% time" if total_s > 0 else ""
    eff = row.efficiency
    if row.time_source != "measured":
        tail = "time apportioned"
    elif eff is not None:
        tail = f"eff {eff:.2f}" + (f", {row.flag}" if row.flag else "")
    else:
        tail = ""
    return "\n".join(p for p in (name, ", ".join(t for t in (share, tail) if t)) if p)


def _annotate(ax: Any, rows: List[ProfileRow], xs: List[float], ys: List[float], by: str, total_s: float, top: int) -> None:
    ranked = sorted(range(len(rows)), key=lambda i: -rows[i].measured_s)[:top]
    flagged = [i for i in range(len(rows)) if rows[i].flag and i not in ranked]
    offsets = ((10, 10), (10, -22), (-70, 14), (-70, -24))
    for n, i in enumerate(ranked + flagged):
        ax.annotate(_label(rows[i], by, total_s), (xs[i], ys[i]), fontsize=7, xytext=offsets[n % len(offsets)],
                    textcoords="offset points", arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey"})


def _scatter(ax: Any, rows: List[ProfileRow], xs: List[float], ys: List[float], colour_of: Any, total: float) -> None:
    """Measured points filled, apportioned ones hollow; flagged ones edged in :data:`FLAG_EDGE`."""
    groups = (
        ("measured", lambda r: r.time_source == "measured" and not r.flag),
        ("roof below achieved (compute-bound, efficiency > 1.05)", lambda r: bool(r.flag)),
        ("time apportioned from a fused kernel (no efficiency)", lambda r: r.time_source != "measured"),
    )
    for label, keep in groups:
        chosen = [i for i, r in enumerate(rows) if keep(r)]
        if not chosen:
            continue
        sizes = [20 + 2000 * rows[i].measured_s / total for i in chosen]
        colours = [colour_of(rows[i]) for i in chosen]
        hollow = label.startswith("time apportioned")
        ax.scatter([xs[i] for i in chosen], [ys[i] for i in chosen], s=sizes,
                   facecolors="none" if hollow else colours,
                   edgecolors=FLAG_EDGE if label.startswith("roof below") else (colours if hollow else "black"),
                   linewidths=2.0 if not label.startswith("measured") else 0.5,
                   alpha=0.8 if hollow else 0.55, label=None if label == "measured" else label)


#: characters per title line: a 9-point line across one panel of the figure
_TITLE_WIDTH = 95


def _log_axes(ax: Any, xlim: Tuple[float, float], ylim: Tuple[float, float], xlabel: str, ylabel: str, title: str) -> None:
    """Both panels' log-log axes, limits, labels, title, grid and legend."""
    ax.set(xscale="log", yscale="log", xlim=xlim, ylim=ylim, xlabel=xlabel, ylabel=ylabel)
    # a measured roof's source is a sentence ("measured (cached; measured 2026-...)"): wrapped,
    # so the title stays inside its panel
    ax.set_title("\n".join(textwrap.fill(line, width=_TITLE_WIDTH) for line in title.splitlines()), fontsize=9)
    ax.grid(True, which="both", ls=":", lw=0.4)
    legend = ax.legend(fontsize=7, loc="lower right")
    handles = getattr(legend, "legend_handles", None) or getattr(legend, "legendHandles", None) or ()
    for handle in handles:
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([40])  # a legend marker the size of a small point, not of the first drawn


def draw_roofline(result: ProfileResult, *, by: str = "operator", label_top: int = 6) -> Any:
    """The matplotlib Figure (not saved): the roofline of the ops with FLOPs and, beside it
    when there are any, a panel for the ops with none (gathers, copies, embedding), placed by
    bytes moved and bandwidth reached under the bandwidth roof."""
    moving = _moving(result, by)
    figure = new_figure(figsize=(14, 6) if moving else (8.5, 6), dpi=110)
    ax = figure.add_subplot(1, 2 if moving else 1, 1)
    roofs = result.roofs
    points = _points(result, by)
    xs = [r.flops / r.bytes for r in points]
    ys = [r.achieved_flops_per_s or 0.0 for r in points]
    low = min(xs + [roofs.ridge]) / 10
    high = max(xs + [roofs.ridge]) * 10
    grid = [low * (high / low) ** (k / 200) for k in range(201)]
    for n, (dtype, peak) in enumerate(sorted(roofs.peak_flops.items(), key=lambda kv: -kv[1])):
        ax.plot(grid, [min(peak, x * roofs.bandwidth) for x in grid], lw=1.5, color=ROOF_COLORS[n % len(ROOF_COLORS)],
                ls=ROOF_STYLES[n % len(ROOF_STYLES)], label=f"roof {dtype}: {format_count(peak)}FLOP/s")
    ax.plot(grid, [x * roofs.bandwidth for x in grid], ls=":", color=ROOF_COLORS[-1], lw=0.8,
            label=f"bandwidth {format_count(roofs.bandwidth)}B/s")
    total = sum(r.measured_s for r in points + moving) or 1.0
    _scatter(ax, points, xs, ys, lambda r: POINT_COLORS[r.bound], total)
    _annotate(ax, points, xs, ys, by, result.total_time_s, label_top)
    _log_axes(ax, (low, high), (min(ys + [roofs.peak(None)]) / 20, max(roofs.peak_flops.values()) * 3),
              "arithmetic intensity (FLOPs / byte moved)", "achieved FLOP/s",
              f"Roofline: {roofs.device or result.device} (roofs {roofs.source})\n"
              + ("" if roofs.certain else "roofs measured under load: below what this machine does, estimates, not ceilings\n")
              + "point area = share of the step's time; orange compute-bound, purple memory-bound")
    if moving:
        _draw_data_movement(figure.add_subplot(1, 2, 2), result, moving, by, total, label_top)
    figure.tight_layout()
    return figure


def _draw_data_movement(ax: Any, result: ProfileResult, rows: List[ProfileRow], by: str, total: float, top: int) -> None:
    """Ops with no FLOPs: x = bytes moved per step, y = bandwidth reached, under the roof."""
    bandwidth = result.roofs.bandwidth
    xs = [max(r.bytes, 1.0) for r in rows]
    ys = [r.achieved_bytes_per_s or 0.0 for r in rows]
    positive = [y for y in ys if y > 0]
    ax.axhline(bandwidth, color=ROOF_COLORS[0], lw=1.5, label=f"bandwidth roof {format_count(bandwidth)}B/s")
    placed = [y if y > 0 else bandwidth / 1e6 for y in ys]
    _scatter(ax, rows, xs, placed, lambda r: POINT_COLORS["data movement"], total)
    _annotate(ax, rows, xs, placed, by, result.total_time_s, top)
    _log_axes(ax, (min(xs) / 10, max(xs) * 10), (min(positive + [bandwidth]) / 20, max(positive + [bandwidth]) * 3),
              "bytes moved per step", "achieved bandwidth (bytes/s)",
              "Data movement: ops with no FLOPs (gathers, copies, embedding)\n"
              "point area = share of the step's time; efficiency = attainable / time")


@renders("ProfileResult", "roofline_plot")
def plot_roofline(result: ProfileResult, path: Union[str, Path], *, by: str = "operator", label_top: int = 6) -> None:
    """Save the roofline to ``path`` (PNG, SVG, PDF... by its suffix)."""
    draw_roofline(result, by=by, label_top=label_top).savefig(str(path))


def roofline_svg(result: ProfileResult) -> str:
    """The roofline as inline SVG text (for the HTML page)."""
    buffer = io.StringIO()
    draw_roofline(result).savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.find("<svg"):]
