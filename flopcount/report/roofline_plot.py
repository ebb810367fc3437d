"""A log-log roofline of a profile: the compute and memory roofs, one point per operator
(or per op row) at (FLOPs per byte, achieved FLOP/s), area by its share of the time, the
top ops labelled. Needs matplotlib (optional); draws on the Agg canvas, no pyplot."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Union

from ..rendering import renders
from ..units import format_count
from .plot import require_matplotlib

if TYPE_CHECKING:
    from ..profiling.result import ProfileResult, ProfileRow

_COLORS = {"compute": "#c0392b", "memory": "#2471a3"}


def _points(result: ProfileResult, by: str) -> List[ProfileRow]:
    rows = list(result.by_operator().values()) if by == "operator" else list(result.rows)
    # a point needs a position on both axes: work, bytes and time
    return [r for r in rows if r.flops > 0 and r.bytes > 0 and r.time_s > 0]


def draw_roofline(result: ProfileResult, *, by: str = "operator", label_top: int = 6) -> Any:
    """The matplotlib Figure (not saved)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8.5, 6), dpi=110)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot(1, 1, 1)
    roofs = result.roofs
    points = _points(result, by)
    xs = [r.flops / r.bytes for r in points]
    ys = [r.achieved_flops_per_s or 0.0 for r in points]
    low = min(xs + [roofs.ridge]) / 10
    high = max(xs + [roofs.ridge]) * 10
    grid = [low * (high / low) ** (k / 200) for k in range(201)]
    for dtype, peak in sorted(roofs.peak_flops.items(), key=lambda kv: -kv[1]):
        ax.plot(grid, [min(peak, x * roofs.bandwidth) for x in grid], lw=1.5, label=f"roof {dtype}: {format_count(peak)}FLOP/s")
    ax.plot(grid, [x * roofs.bandwidth for x in grid], ls=":", color="grey", lw=0.8,
            label=f"bandwidth {format_count(roofs.bandwidth)}B/s")
    total = sum(r.time_s for r in points) or 1.0
    sizes = [20 + 2000 * r.time_s / total for r in points]
    ax.scatter(xs, ys, s=sizes, c=[_COLORS[r.bound] for r in points], alpha=0.55, edgecolors="black", linewidths=0.5)
    ranked = sorted(range(len(points)), key=lambda i: -points[i].time_s)[:label_top]
    offsets = ((10, 10), (10, -22), (-70, 14), (-70, -24))
    for n, i in enumerate(ranked):
        row = points[i]
        name = row.name.replace("aten::", "")
        if by != "operator" and row.module:
            name = f"{name} ({row.module})"
        eff = row.efficiency
        ax.annotate(f"{name}\n{100 * row.time_s / result.total_time_s:.0f}% time, eff {eff:.2f}" if eff else name,
                    (xs[i], ys[i]), fontsize=7, xytext=offsets[n % len(offsets)], textcoords="offset points",
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey"})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(min(ys + [roofs.peak(None)]) / 20, max(roofs.peak_flops.values()) * 3)
    ax.set_xlabel("arithmetic intensity (FLOPs / byte moved)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"Roofline: {roofs.device or result.device} (roofs {roofs.source})\n"
                 "point area = share of the step's time; red compute-bound, blue memory-bound", fontsize=9)
    ax.grid(True, which="both", ls=":", lw=0.4)
    ax.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    return figure


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
