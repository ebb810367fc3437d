"""Pictures of a result: FLOPs by module (top N) and, after a benchmark, the latency
distribution. Needs the optional matplotlib (``pip install 'flopcount[plot]'``),
imported only here and only when a plot is drawn; uses the Agg canvas directly so no
global pyplot state is touched."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple, Union

from ..errors import UsageError
from .units import format_count, format_ms, format_share, with_unit

if TYPE_CHECKING:
    from ..results import FlopResult

INSTALL_HINT = "plotting needs matplotlib: install flopcount[plot] (pip install 'flopcount[plot]')"


def require_matplotlib() -> Any:
    """The matplotlib module, or a UsageError telling how to install it."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError as exc:
        raise UsageError(INSTALL_HINT) from exc
    return matplotlib


def check_plot_path(path: Union[str, Path]) -> None:
    """Fail early on a file type matplotlib cannot write."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    suffix = Path(path).suffix.lower().lstrip(".")
    supported = FigureCanvasAgg(Figure()).get_supported_filetypes()
    if suffix not in supported:
        raise UsageError(f"--plot {path}: unsupported image type {suffix or '(none)'!r}; use one of {', '.join(sorted(supported))}")


def top_modules(result: FlopResult, top: int = 15, depth: Optional[int] = None) -> List[Tuple[str, int]]:
    """``[(module, FLOPs)]`` of the ``top`` costliest modules, largest first, plus one
    ``("other (k modules)", FLOPs)`` entry for the rest, so the bars add up to the total.

    The modules are the leaves of the tree cut at ``depth`` (a module at ``depth``, or a
    shallower one without children); with no ``depth``, the model's leaf modules. Only
    leaves are compared, so no module's FLOPs are counted twice."""
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
    shown = leaves[:top]
    rest = result.flops - sum(f for _, f in shown)
    if rest > 0:
        hidden = len(leaves) - len(shown)
        label = f"other ({hidden} modules)" if hidden else "(ops outside any module)"
        shown.append((label, rest))
    return shown


def plot_result(
    result: FlopResult,
    path: Union[str, Path],
    *,
    top: int = 15,
    depth: Optional[int] = None,
    title: str = "",
    latencies_ms: Optional[Sequence[float]] = None,
) -> None:
    """Write a PNG (or any type matplotlib knows from the suffix) of FLOPs by module;
    with ``latencies_ms``, a second panel shows their distribution with the median,
    p90 and p99 marked."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bars = top_modules(result, top, depth)
    panels = 2 if latencies_ms else 1
    height = max(3.0, 0.32 * len(bars) + 1.4)
    figure = Figure(figsize=(10, height + (3.4 if panels == 2 else 0)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(panels, 1, height_ratios=[height, 3.4][:panels])

    ax = figure.add_subplot(grid[0])
    labels = [label for label, _ in bars][::-1]
    values = [value for _, value in bars][::-1]
    colours = ["#b0b0b0" if label.startswith(("other (", "(ops outside")) else "#3b6ea8" for label in labels]
    ax.barh(range(len(values)), values, color=colours)
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    for i, value in enumerate(values):
        ax.text(value, i, f"  {format_count(value)} ({format_share(value, result.flops)})", va="center", fontsize=8)
    ax.set_xlim(0, max(values, default=1) * 1.25)
    ax.set_xlabel("FLOPs")
    ax.xaxis.set_major_formatter(lambda x, _pos: format_count(x, digits=1))
    ax.spines[["top", "right"]].set_visible(False)
    heading = f"FLOPs by module (top {top}): total {with_unit(result.flops, 'FLOPs')}, {format_count(result.params)} params"
    ax.set_title(f"{title}\n{heading}" if title else heading, fontsize=10, loc="left")

    if latencies_ms:
        _latency_panel(figure.add_subplot(grid[1]), latencies_ms)
    figure.savefig(str(path))


def _latency_panel(ax: Any, latencies_ms: Sequence[float]) -> None:
    import numpy as np

    median, p90, p99 = (float(v) for v in np.percentile(np.asarray(latencies_ms, dtype=np.float64), [50.0, 90.0, 99.0]))
    bins = min(60, max(10, len(latencies_ms) // 5))
    ax.hist(latencies_ms, bins=bins, color="#6a9f58", edgecolor="white", linewidth=0.4)
    for value, name, style in ((median, "median", "-"), (p90, "p90", "--"), (p99, "p99", ":")):
        ax.axvline(value, color="#333333", linestyle=style, linewidth=1.2, label=f"{name} {format_ms(value)}")
    ax.set_xlabel("latency per call (ms)")
    ax.set_ylabel("calls")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(f"Latency over {len(latencies_ms)} timed calls", fontsize=10, loc="left")
