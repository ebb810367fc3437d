"""Per-module latency: how long each module's forward takes, measured through hooks.

What is measured: for every module of ``named_modules()`` ("" = the root), the time
between its forward pre-hook and its forward hook, summed over the calls it gets in
one forward of the model, per iteration, after warm-up, under ``torch.inference_mode()``.
On CPU the hooks read ``time.perf_counter_ns()``; on CUDA they record events and the
whole forward is synchronised once per iteration (never once per module). Hooks cost
microseconds each, so the figures of small modules (and of parents of many small
modules) are inflated: use :func:`flopcount.bench.benchmark` for the model's latency
and these figures to see where the time goes. ``unhooked_median_s`` on the result
is the root's latency without hooks, for comparison.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from flopcount.bench.device import autocast_context, bind_call, real_run, synchronize
from flopcount.bench.loop import Clock, cpu_block_runner, cuda_block_runner
from flopcount.bench.stats import compute_stats
from flopcount.core.deprecation import ms_aliases, ms_keys
from flopcount.core.diagnostics import FromWarnings
from flopcount.core.dtypes import optional_dtype
from flopcount.core.inputs import require_module
from flopcount.errors import UsageError, int_at_least
from flopcount.units import ROOT_LABEL

PERTURBATION_NOTE = (
    "per-module times come from forward hooks, whose own cost (a few µs per module call) "
    "inflates small modules and their parents; compare the root with unhooked_median_s"
)


@ms_aliases("median", "mean", "min")
@dataclass(frozen=True)
class ModuleLatency:
    """One module: hook-measured latency per forward of the model (all its calls summed).

    Times in seconds; ``achieved_flops_per_s`` = ``flops`` / ``median_s`` when FLOPs were
    given. The 0.2 millisecond names (``median_ms``, ``mean_ms``, ``min_ms``) are deprecated
    properties."""

    name: str
    type_name: str
    depth: int
    calls: int  # calls per forward of the model
    median_s: Optional[float]
    mean_s: Optional[float]
    min_s: Optional[float]
    flops: Optional[float] = None

    @property
    def achieved_flops_per_s(self) -> Optional[float]:
        return None if self.flops is None or not self.median_s else self.flops / self.median_s

    def to_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type_name,
            **{name: getattr(self, name) for name in ("depth", "calls", "median_s", "mean_s", "min_s")},
            **ms_keys(self),  # 0.2's keys (milliseconds), kept one release
            "flops": self.flops,
            "achieved_flops_per_s": self.achieved_flops_per_s,
        }


@ms_aliases("unhooked_median")
@dataclass(frozen=True)
class ModuleLatencyResult(FromWarnings):
    """Per-module latencies in ``named_modules()`` order; parents include children. Times
    in seconds (``unhooked_median_s``: the root timed without hooks)."""

    modules: Tuple[ModuleLatency, ...]
    iters: int
    warmup: int
    device: str
    timing: str
    unhooked_median_s: float
    warnings: Tuple[str, ...] = (PERTURBATION_NOTE,)

    def by_module(self, seconds: Optional[bool] = None) -> Dict[str, Optional[float]]:
        """``{module name: median}``: in seconds with ``seconds=True``; in milliseconds
        otherwise, as in 0.2 (without ``seconds=`` that warns: the default becomes seconds
        in 0.4; ``seconds=False`` keeps milliseconds without a warning)."""
        if seconds is None:
            warnings.warn("ModuleLatencyResult.by_module() returns milliseconds as in flopcount 0.2; from 0.4 it "
                          "returns seconds: pass seconds=True (or seconds=False to keep milliseconds)",
                          DeprecationWarning, stacklevel=2)
        scale = 1.0 if seconds else 1e3
        return {m.name: None if m.median_s is None else m.median_s * scale for m in self.modules}

    def __getitem__(self, name: str) -> ModuleLatency:
        for m in self.modules:
            if m.name == name:
                return m
        raise KeyError(name)

    @property
    def root(self) -> ModuleLatency:
        return self[""]

    def to_dict(self) -> Dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in ("iters", "warmup", "device", "timing", "unhooked_median_s")},
            **ms_keys(self),  # 0.2's key, kept one release
            "modules": [m.to_dict() for m in self.modules],
            "warnings": list(self.warnings),
        }

    def __str__(self) -> str:
        root_s = self.root.median_s or 0.0
        rows = [("module", "type", "calls", "median ms", "% root", "FLOPs", "FLOP/s")]
        for m in self.modules:
            share = f"{100 * m.median_s / root_s:.1f}" if m.median_s is not None and root_s > 0 else "-"
            rows.append(
                (
                    "  " * m.depth + (m.name.rsplit(".", 1)[-1] if m.name else ROOT_LABEL),
                    m.type_name,
                    str(m.calls),
                    "-" if m.median_s is None else f"{m.median_s * 1e3:.4g}",
                    share,
                    "-" if m.flops is None else f"{m.flops:.4g}",
                    "-" if m.achieved_flops_per_s is None else f"{m.achieved_flops_per_s:.4g}",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append(
            f"{self.iters} iterations after {self.warmup} warm-up on {self.device} ({self.timing}); "
            f"root without hooks: {self.unhooked_median_s * 1e3:.4g} ms"
        )
        lines.extend(f"note: {w}" for w in self.warnings)
        return "\n".join(lines)


def module_latency(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    warmup: int = 3,
    iters: int = 20,
    device: Union[None, str, torch.device] = None,
    dtype: Union[None, str, torch.dtype] = None,
    flops: Union[None, Mapping[str, float], Any] = None,
    timer: Optional[Clock] = None,
) -> ModuleLatencyResult:
    """Median per-module forward latency over ``iters`` forwards (after ``warmup``).

    ``flops``: ``{module name: FLOPs}`` or a ``FlopResult`` (its ``by_module()``) to
    report achieved FLOP/s per module; ``dtype`` as ``benchmark``'s (torch.autocast; a name
    such as "bf16" too: docs/api.md#dtypes). Inputs follow flopcount's convention (a tuple
    is unpacked). Hooks are removed and the model left as found on every path; torch's
    random generators too when this is the process's only Python thread (else a train-mode
    dropout advances them as your own calls would: setting them back would rewind another
    thread's draws); a meta or fake model is refused (:class:`UsageError`).
    """
    require_module(model, "module_latency")
    dtype = optional_dtype(dtype, "module_latency: dtype", "autocast")
    int_at_least(iters, 1, "module_latency: iters")
    int_at_least(warmup, 0, "module_latency: warmup")
    flop_map = _flop_map(flops)
    borrowed = real_run(model, inputs, kwargs, device, "module_latency")
    dev = borrowed.device
    amp = autocast_context(dev, dtype)
    clock: Clock = timer if timer is not None else time.perf_counter_ns
    use_events = dev.type == "cuda"
    # each module call's (name, start, end) in one forward: clock readings, or CUDA events read
    # after the forward's one synchronisation
    spans: List[Tuple[str, Any, Any]] = []
    stamp: Callable[[], Any] = _recorded_event if use_events else clock

    def hooks(name: str) -> Tuple[Callable[..., None], Callable[..., None]]:
        starts: List[Any] = []  # a stack: a module may call itself (or be shared) inside its own forward
        return (lambda module, args: starts.append(stamp()),
                lambda module, args, output: spans.append((name, starts.pop(), stamp())))

    samples: Dict[str, List[float]] = {}
    calls_seen: Dict[str, int] = {}
    with borrowed.borrow(model) as on_device:
        named = list(on_device.named_modules())  # the modules that run (the model's private twin)
        samples = {name: [] for name, _ in named}
        call = bind_call(on_device, borrowed.run)
        with torch.inference_mode(), amp:
            for _ in range(warmup):
                call()
            # the root without hooks, timed as benchmark() times it
            unhooked = (cuda_block_runner(call, dev) if use_events else cpu_block_runner(call, clock))(iters)
            handles = []
            try:
                for name, module in named:
                    pre, post = hooks(name)
                    handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
                for _ in range(iters):
                    spans.clear()
                    call()
                    synchronize(dev)
                    totals: Dict[str, float] = {}
                    calls_seen = {}
                    for name, begin, end in spans:
                        seconds = begin.elapsed_time(end) * 1e-3 if use_events else (end - begin) * 1e-9
                        totals[name] = totals.get(name, 0.0) + seconds
                        calls_seen[name] = calls_seen.get(name, 0) + 1
                    for name, value in totals.items():
                        samples[name].append(value)
            finally:
                for handle in handles:
                    handle.remove()

    rows = []
    for name, module in named:
        values = samples[name]
        stats = compute_stats(samples_s=values) if values else None
        rows.append(
            ModuleLatency(
                name=name,
                type_name=type(module).__name__,
                depth=0 if name == "" else name.count(".") + 1,
                calls=calls_seen.get(name, 0),
                median_s=None if stats is None else stats.median_s,
                mean_s=None if stats is None else stats.mean_s,
                min_s=None if stats is None else stats.min_s,
                flops=None if flop_map is None or name not in flop_map else float(flop_map[name]),
            )
        )
    return ModuleLatencyResult(
        modules=tuple(rows),
        iters=iters,
        warmup=warmup,
        device=str(dev),
        timing="cuda_event" if use_events else "perf_counter",
        unhooked_median_s=compute_stats(samples_s=unhooked).median_s,
    )


def _recorded_event() -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _flop_map(flops: Any) -> Optional[Mapping[str, float]]:
    if flops is None:
        return None
    if isinstance(flops, Mapping):
        return flops
    if hasattr(flops, "by_module"):
        return flops.by_module()
    raise UsageError(f"flops must be a {{module name: FLOPs}} mapping or a FlopResult, got {type(flops).__name__}")
