"""A count in TensorBoard: totals and per-module FLOPs as scalars, the tables as text.

``torch.utils.tensorboard`` (and the ``tensorboard`` package behind it) is imported when
:func:`write_tensorboard` runs, never by ``import flopcount``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from flopcount.errors import UsageError

__all__ = ["count_scalars", "profile_scalars", "write_profile_tensorboard", "write_tensorboard"]


def count_scalars(result: Any, max_depth: Optional[int] = 1, prefix: str = "flopcount") -> Dict[str, float]:
    """``{tag: value}``: ``flops``, ``macs``, ``params``, FLOPs by phase, and FLOPs of each
    module down to ``max_depth`` (``modules/<name>``; the whole model is ``flops``)."""
    scalars = {f"{prefix}/flops": float(result.flops), f"{prefix}/macs": float(result.macs), f"{prefix}/params": float(result.params)}
    phases = result.by_phase()
    if len(phases) > 1:
        scalars.update({f"{prefix}/phase/{phase}": float(flops) for phase, flops in phases.items()})
    depths = {m.name: m.depth for m in result.modules}
    scalars.update({f"{prefix}/modules/{name}": float(flops) for name, flops in result.by_module().items()
                    if name and (max_depth is None or depths[name] <= max_depth)})
    return scalars


def write_tensorboard(
    result: Any, log_dir: str, *, max_depth: Optional[int] = 1, step: int = 0, prefix: str = "flopcount", label: str = ""
) -> Dict[str, float]:
    """Write ``result`` (a FlopResult) as TensorBoard scalars (:func:`count_scalars`) and
    text (the module table and the operator table, as markdown) into ``log_dir``; returns
    the scalars written. Needs the ``tensorboard`` package (``pip install flopcount[tensorboard]``)."""
    scalars = count_scalars(result, max_depth=max_depth, prefix=prefix)
    title = f"**{label}**\n\n" if label else ""
    texts = {f"{prefix}/modules": title + result.to_markdown(max_depth=max_depth), f"{prefix}/operators": _operator_markdown(result)}
    return _write(log_dir, scalars, texts, step)


def profile_scalars(result: Any, top: int = 10, prefix: str = "flopcount/profile") -> Dict[str, float]:
    """``{tag: value}`` of a :class:`~flopcount.profiling.ProfileResult`: the step time (ms),
    its FLOPs, the achieved TFLOP/s, and for the ``top`` operators by time their time (ms) and
    efficiency against the roofs (attainable time / measured time; tagged ``op_efficiency_estimate``
    where the roofs were measured under load: ``result.bound_certain`` False)."""
    step_s = float(result.total_time_s)
    flops = float(sum(r.flops for r in result.rows))
    scalars = {f"{prefix}/step_ms": step_s * 1e3, f"{prefix}/flops": flops}
    if step_s > 0:
        scalars[f"{prefix}/tflops_per_s"] = flops / step_s / 1e12
    operators = sorted(result.by_operator().items(), key=lambda kv: -kv[1].time_s)[:top]
    efficiency = "op_efficiency" if getattr(result, "bound_certain", True) else "op_efficiency_estimate"
    for name, row in operators:
        scalars[f"{prefix}/op_ms/{name}"] = float(row.time_s) * 1e3
        if row.efficiency is not None:
            scalars[f"{prefix}/{efficiency}/{name}"] = float(row.efficiency)
    return scalars


def write_profile_tensorboard(result: Any, log_dir: str, *, label: str = "", top: int = 10, table: str = "") -> Dict[str, float]:
    """Write a profile into ``log_dir`` where TensorBoard looks: :func:`profile_scalars` as
    scalars, ``table`` (the profile table, markdown) as text, and, when the result kept its
    trace, the Chrome trace with each op's FLOPs and efficiency under ``log_dir/profile/``
    (``*.pt.trace.json``), which the PyTorch Profiler plugin (torch-tb-profiler) lists as a run."""
    title = f"**{label}**\n\n" if label else ""
    scalars = _write(log_dir, profile_scalars(result, top=top), {"flopcount/profile/operators": title + table} if table else {})
    if getattr(result, "trace", None) is not None:
        run_dir = Path(log_dir) / "profile"
        run_dir.mkdir(parents=True, exist_ok=True)
        result.export_chrome_trace(str(run_dir / "flopcount.pt.trace.json"))
    return scalars


def _write(log_dir: str, scalars: Dict[str, float], texts: Dict[str, str], step: int = 0) -> Dict[str, float]:
    """``scalars`` and ``texts`` (tag -> markdown) written at ``step`` into ``log_dir``; returns ``scalars``."""
    writer = summary_writer()(log_dir=log_dir)
    try:
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, global_step=step)
        for tag, text in texts.items():
            writer.add_text(tag, text, global_step=step)
    finally:
        writer.close()
    return scalars


def summary_writer() -> Any:
    """``torch.utils.tensorboard.SummaryWriter``, or a UsageError saying what to install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise UsageError("--tensorboard needs the tensorboard package: pip install flopcount[tensorboard]") from exc
    return SummaryWriter


def _operator_markdown(result: Any) -> str:
    ordered = sorted(result.operator_totals().items(), key=lambda kv: -kv[1].flops)
    rows = [f"| {op} | {t.flops:,} | {t.macs:,} | {t.calls} |" for op, t in ordered]
    return "\n".join(["| operator | FLOPs | MACs | calls |", "|---|---:|---:|---:|", *rows])
