"""Pictures of a result: FLOPs by module (top N) and, after a benchmark, the latency
distribution. Needs the optional matplotlib (``pip install 'flopcount[plot]'``),
imported only here and only when a plot is drawn; uses the Agg canvas directly so no
global pyplot state is touched."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple, Union

from flopcount.errors import UsageError
from flopcount.units import format_count, format_ms, format_share, show_value, with_unit

if TYPE_CHECKING:
    from flopcount.budget.check import BudgetReport
    from flopcount.core.results import FlopResult

INSTALL_HINT = "plotting needs matplotlib: install flopcount[plot] (pip install 'flopcount[plot]')"


def require_matplotlib() -> Any:
    """The matplotlib module, or a UsageError telling how to install it."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError as exc:
        raise UsageError(INSTALL_HINT) from exc
    return matplotlib


def new_figure(**options: Any) -> Any:
    """A matplotlib ``Figure(**options)`` on its own Agg canvas: no pyplot, no global state."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(**options)
    FigureCanvasAgg(figure)
    return figure


def check_plot_path(path: Union[str, Path]) -> None:
    """Fail early on a file type matplotlib cannot write."""
    suffix = Path(path).suffix.lower().lstrip(".")
    supported = new_figure().canvas.get_supported_filetypes()
    if suffix not in supported:
        raise UsageError(f"--plot {path}: unsupported image type {suffix or '(none)'!r}; use one of {', '.join(sorted(supported))}")


def _leaves(result: FlopResult, depth: Optional[int]) -> List[Tuple[str, float]]:
    """``[(label, FLOPs)]`` of the leaves of the module tree cut at ``depth`` (a module at
    ``depth``, or a shallower one without children; all leaves with no ``depth``), largest first."""
    names = [m.name for m in result.modules if m.name]
    has_children = {n.rsplit(".", 1)[0] for n in names if "." in n}
    leaves = []
    for m in result.modules:
        if not m.name:
            continue
        at_cut = depth is not None and m.depth == depth
        shallow_leaf = (depth is None or m.depth < depth) and m.name not in has_children
        if at_cut or shallow_leaf:
            flops = result.module_totals(m.name).flops
            if flops > 0:
                leaves.append((f"{m.name} ({m.type_name})", flops))
    leaves.sort(key=lambda kv: -kv[1])
    return leaves


#: the share of the total the shown modules should explain when the plot picks the depth
EXPLAINED = 0.8


def choose_depth(result: FlopResult, top: int = 15) -> Optional[int]:
    """The deepest module depth at which the ``top`` costliest modules still explain at least
    :data:`EXPLAINED` of the FLOPs (the most detail a ``top``-bar plot can show without a large
    "other" bar); the depth explaining the most when none reaches it; None for a model
    without submodules."""
    depths = sorted({m.depth for m in result.modules if m.name})
    if not depths or result.flops <= 0:
        return None
    best, best_share = depths[0], -1.0
    chosen: Optional[int] = None
    for depth in depths:
        share = sum(f for _, f in _leaves(result, depth)[:top]) / result.flops
        if share >= EXPLAINED:
            chosen = depth
        if share > best_share + 1e-12:
            best, best_share = depth, share
    return chosen if chosen is not None else best


def top_modules(result: FlopResult, top: int = 15, depth: Optional[int] = None) -> List[Tuple[str, float]]:
    """``[(module, FLOPs)]`` of the ``top`` costliest modules, largest first, plus one
    ``("other (k modules)", FLOPs)`` entry for the rest, so the bars add up to the total.

    The modules are the leaves of the tree cut at ``depth`` (a module at ``depth``, or a
    shallower one without children); with no ``depth``, the model's leaf modules. Only
    leaves are compared, so no module's FLOPs are counted twice."""
    leaves = _leaves(result, depth)
    shown = leaves[:top]
    rest = result.flops - sum(f for _, f in shown)
    if rest > 0:
        hidden = len(leaves) - len(shown)
        label = f"other ({hidden} modules)" if hidden else "(ops outside any module)"
        shown.append((label, rest))
    return shown


def plot_result(result: FlopResult, path: Union[str, Path], **options: Any) -> None:
    """Write :func:`draw_figure`'s picture (``options`` are its keywords) to ``path``: a PNG,
    or any type matplotlib knows from the suffix."""
    draw_figure(result, **options).savefig(str(path))


def png_bytes(result: FlopResult, **options: Any) -> bytes:
    """:func:`draw_figure`'s picture as PNG bytes (for the HTML report)."""
    import io

    buffer = io.BytesIO()
    draw_figure(result, **options).savefig(buffer, format="png")
    return buffer.getvalue()


def draw_figure(
    result: FlopResult,
    *,
    top: int = 15,
    depth: Optional[int] = None,
    title: str = "",
    latencies_ms: Optional[Sequence[float]] = None,
    budget: Optional[BudgetReport] = None,
) -> Any:
    """A matplotlib ``Figure`` (Agg canvas; no pyplot state) of FLOPs by module, the ``top``
    largest; with ``latencies_ms``, a panel shows their distribution with the median, p90 and
    p99 marked; with ``budget``, a panel shows each budget's actual value against its limit (a
    line at 100 %) with PASS, FAIL or INCOMPLETE. ``depth=None`` lets the plot choose the
    depth (:func:`choose_depth`)."""
    chosen = depth if depth is not None else choose_depth(result, top)
    bars = top_modules(result, top, chosen)
    heights = [max(3.0, 0.32 * len(bars) + 1.4)]
    if budget is not None and budget.lines:
        heights.append(0.45 * len(budget.lines) + 1.3)
    if latencies_ms:
        heights.append(3.4)
    figure = new_figure(figsize=(10, sum(heights)), dpi=100, layout="constrained")
    grid = figure.add_gridspec(len(heights), 1, height_ratios=heights)

    ax = figure.add_subplot(grid[0])
    labels = [label for label, _ in bars][::-1]
    values = [value for _, value in bars][::-1]
    colours = ["#b0b0b0" if label.startswith(("other (", "(ops outside")) else "#3b6ea8" for label in labels]
    ax.barh(range(len(values)), values, color=colours)
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    for i, value in enumerate(values):
        ax.text(value, i, f"  {format_count(value)} ({format_share(value, result.flops)})", va="center", fontsize=8)
    ax.set(xlim=(0, max(values, default=1) * 1.25), xlabel="FLOPs")
    ax.xaxis.set_major_formatter(lambda x, _pos: format_count(x, digits=1))
    ax.spines[["top", "right"]].set_visible(False)
    where = "" if chosen is None else f" at depth {chosen}" + (" (chosen)" if depth is None else "")
    heading = f"FLOPs by module{where}, top {top}: total {with_unit(result.flops, 'FLOPs')}, {format_count(result.params)} params"
    ax.set_title(f"{title}\n{heading}" if title else heading, fontsize=10, loc="left")

    panel = 1
    if budget is not None and budget.lines:
        _budget_panel(figure.add_subplot(grid[panel]), budget, result.complete)
        panel += 1
    if latencies_ms:
        _latency_panel(figure.add_subplot(grid[panel]), latencies_ms)
    return figure


_STATUS_COLOURS = {"PASS": "#4c9a5a", "FAIL": "#c0392b", "INCOMPLETE": "#d68910", "UNDECIDED": "#d68910"}


def _budget_panel(ax: Any, budget: BudgetReport, complete: bool) -> None:
    """Each budget as a bar of actual / limit, the limit as a line at 100 %, with the line's
    status as the budget table gives it (:attr:`BudgetLine.status`)."""
    lines = list(budget.lines)[::-1]
    ratios = [line.actual / line.limit if line.limit else float("inf") for line in lines]
    finite = [r for r in ratios if r != float("inf")]
    right = max(1.25, max(finite, default=1.0) * 1.35)
    statuses = [str(line.status) for line in lines]
    shown = [min(r, right) for r in ratios]
    ax.barh(range(len(lines)), shown, color=[_STATUS_COLOURS[s] for s in statuses], height=0.6)
    ax.axvline(1.0, color="#222222", linewidth=1.4)
    ax.text(1.0, len(lines) - 0.35, " limit", fontsize=8, va="bottom")
    ax.set_yticks(range(len(lines)), [line.name for line in lines], fontsize=9)
    for i, (line, status, value) in enumerate(zip(lines, statuses, shown)):
        text = f"  {status}  {show_value(line.actual, line.unit)} of {show_value(line.limit, line.unit)}"
        ax.text(value, i, text, va="center", fontsize=8, color=_STATUS_COLOURS[status], fontweight="bold")
    ax.set(xlim=(0, right * 1.45), ylim=(-0.6, len(lines) - 0.1), xlabel="actual / limit")
    ax.xaxis.set_major_formatter(lambda x, _pos: f"{100 * x:.0f}%")
    ax.spines[["top", "right"]].set_visible(False)
    passed = sum(status == "PASS" for status in statuses)
    verdict = budget.status
    note = "" if complete else "; INCOMPLETE: the FLOP count may be short (see the report)"
    ax.set_title(f"Budgets: {verdict} ({passed} of {len(lines)} met without caveat{note})", fontsize=10, loc="left")


def _latency_panel(ax: Any, latencies_ms: Sequence[float]) -> None:
    import numpy as np

    median, p90, p99 = (float(v) for v in np.percentile(np.asarray(latencies_ms, dtype=np.float64), [50.0, 90.0, 99.0]))
    bins = min(60, max(10, len(latencies_ms) // 5))
    ax.hist(latencies_ms, bins=bins, color="#6a9f58", edgecolor="white", linewidth=0.4)
    for value, name, style in ((median, "median", "-"), (p90, "p90", "--"), (p99, "p99", ":")):
        ax.axvline(value, color="#333333", linestyle=style, linewidth=1.2, label=f"{name} {format_ms(value)}")
    ax.set(xlabel="latency per call (ms)", ylabel="calls")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(f"Latency over {len(latencies_ms)} timed calls", fontsize=10, loc="left")


def draw_sunburst(result: FlopResult, *, max_depth: int = 3, title: str = "") -> Any:
    """FLOPs by module as rings: the model in the middle, depth ``d`` on ring ``d``; a
    wedge's angle is the module's share of the total, under its parent's wedge. The part
    of a parent no child accounts for (its own ops) stays blank."""
    figure = new_figure(figsize=(9, 9), dpi=100, layout="constrained")
    from matplotlib.patches import Wedge

    total = result.flops
    ax = figure.add_subplot()
    ax.set_aspect("equal")
    ax.axis("off")
    ring = 1.0
    palette = ["#3b6ea8", "#6a9f58", "#d68910", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d", "#b7950b"]
    ax.add_patch(Wedge((0, 0), ring, 0, 360, facecolor="#dfe6ee", edgecolor="white"))
    ax.text(0, 0, f"{with_unit(total, 'FLOPs')}\n{format_count(result.params)} params", ha="center", va="center", fontsize=10)
    start: dict = {"": 90.0}  # angles run counter-clockwise from 12 o'clock
    colour: dict = {}
    used: dict = {}
    for m in result.modules:
        if not m.name or m.depth > max_depth or total <= 0:
            continue
        parent = m.name.rsplit(".", 1)[0] if "." in m.name else ""
        if parent not in start:
            continue
        flops = result.module_totals(m.name).flops
        span = 360.0 * flops / total
        theta1 = start[parent] + used.get(parent, 0.0)
        used[parent] = used.get(parent, 0.0) + span
        start[m.name] = theta1
        if span <= 0:
            continue
        colour[m.name] = colour.get(parent) or palette[len(colour) % len(palette)]
        inner = ring * m.depth
        shade = 1.0 - 0.18 * (m.depth - 1)
        ax.add_patch(Wedge((0, 0), inner + ring, theta1, theta1 + span, width=ring, facecolor=colour[m.name],
                           alpha=max(0.35, shade), edgecolor="white", linewidth=0.8))
        if span >= 9:
            import math

            middle = math.radians(theta1 + span / 2)
            radius = inner + ring / 2
            label = m.name.rsplit(".", 1)[-1] + f"\n{format_share(flops, total)}"
            ax.text(radius * math.cos(middle), radius * math.sin(middle), label, ha="center", va="center", fontsize=7)
    outer = ring * (max_depth + 1)
    ax.set(xlim=(-outer, outer), ylim=(-outer, outer))
    heading = f"FLOPs by module, depth 1-{max_depth} from the centre out"
    ax.set_title(f"{title}\n{heading}" if title else heading, fontsize=10, loc="left")
    return figure


def plot_sunburst(result: FlopResult, path: Union[str, Path], *, max_depth: int = 3, title: str = "") -> None:
    """Write :func:`draw_sunburst` to ``path``."""
    draw_sunburst(result, max_depth=max_depth, title=title).savefig(str(path))
