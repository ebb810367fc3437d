"""Renderers of a MemoryEstimate: a table with the breakdown at the peak, and a JSON-safe dict."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from flopcount.core.rendering import renders
from flopcount.report.table import grid
from flopcount.units import ROOT_LABEL, format_bytes, format_count, format_share

if TYPE_CHECKING:
    from flopcount.memory.estimate import MemoryEstimate

SCHEMA_VERSION = 1

#: a breakdown row's label where it is not the field's name
_LABELS = {"optimizer_state": "optimizer state", "activations": "activations (forward)", "temporaries": "temporaries (backward)"}


def breakdown_table(estimate: MemoryEstimate, fmt: str = "simple") -> str:
    """What is alive at the peak, by kind, with shares of the peak."""
    parts = asdict(estimate.at_peak)
    rows = [
        [_LABELS.get(key, key), format_bytes(value), format_share(value, estimate.peak_bytes)] for key, value in parts.items()
    ]
    rows.append(["peak", format_bytes(estimate.peak_bytes), format_share(estimate.peak_bytes, estimate.peak_bytes)])
    return grid(rows, ["At peak", "Bytes", "Share"], fmt, ("left", "right", "right"))


#: what a peak is made of, in the order the one-line summary names them
_SUMMARY = (
    ("parameters", "weights"),
    ("buffers", "buffers"),
    ("gradients", "gradients"),
    ("optimizer_state", "optimizer state"),
    ("activations", "activations"),
    ("temporaries", "backward temporaries"),
    ("inputs", "inputs"),
)


def peak_summary(estimate: MemoryEstimate) -> str:
    """One line: what the peak is of and what it includes, e.g. ``memory: peak 168.13 MB of a
    training step (adam), reached in the optimizer step = weights 33.57 MB + gradients ...``.
    Weights, gradients, optimizer state and activations are always named (0 B when absent)."""
    parts = asdict(estimate.at_peak)
    always = {"parameters", "gradients", "optimizer_state", "activations"}
    terms = [f"{label} {format_bytes(parts[key])}" for key, label in _SUMMARY if parts[key] or key in always]
    step = _STEP.get(estimate.mode, estimate.mode) + (f" ({estimate.optimizer})" if estimate.optimizer else "")
    cast = f", weights and inputs cast to {estimate.dtype}" if estimate.dtype else ""
    phase = "optimizer step" if estimate.peak_phase == "optimizer" else estimate.peak_phase
    return f"memory: peak {format_bytes(estimate.peak_bytes)} of {step}{cast}, reached in the {phase} = " + " + ".join(terms)


_STEP = {"inference": "an inference step", "forward+backward": "a forward + backward step", "training step": "a training step"}


@renders("MemoryEstimate", "table")
def memory_table(estimate: MemoryEstimate, max_depth: Optional[int] = 1, fmt: str = "simple") -> str:
    """The breakdown at the peak, then one row per module that ran (down to ``max_depth``)
    with its retained activations and its own peak, then a footer naming the step."""
    rows = [
        [info.name or ROOT_LABEL, info.type_name, info.calls, format_bytes(info.activation_bytes), format_bytes(info.peak_bytes)]
        for info in estimate.modules
        if info.calls and (max_depth is None or info.depth <= max_depth)
    ]
    modules = grid(rows, ["Module", "Type", "Calls", "Activations kept", "Peak while running"], fmt,
                   ("left", "left", "right", "right", "right"))
    return "\n\n".join([breakdown_table(estimate, fmt), modules, "\n".join(_footer(estimate))])


def _footer(estimate: MemoryEstimate) -> List[str]:
    step = estimate.mode + (f" ({estimate.optimizer})" if estimate.optimizer else "")
    where = estimate.peak_module or ROOT_LABEL
    lines = [
        f"Peak: {format_bytes(estimate.peak_bytes)} ({estimate.peak_bytes:,} bytes) in the {estimate.peak_phase} of "
        f"'{where}'; step: {step}; device: {estimate.device}; {format_count(estimate.params)} params"
        + (f" cast to {estimate.dtype}" if estimate.dtype else "")
        + f"; inputs: {estimate.input_description}",
        "Tensor storage bytes as torch's MemTracker counts them, estimated on fake tensors; allocator caching, "
        "fragmentation and the CUDA context are not included.",
    ]
    lines += [f"WARNING: {text}" for text in estimate.warnings]
    return lines


#: a module's figures in the dict, after its type
_MODULE_KEYS = ("depth", "calls", "activation_bytes", "peak_bytes")


@renders("MemoryEstimate", "dict")
def memory_to_dict(estimate: MemoryEstimate) -> Dict[str, Any]:
    """Stable keys; every value is a str, int, list, dict or None."""
    return {
        "schema_version": SCHEMA_VERSION,
        "peak_bytes": estimate.peak_bytes,
        "at_peak": asdict(estimate.at_peak),
        **{key: getattr(estimate, key) for key in ("peak_module", "peak_phase", "mode", "optimizer", "params", "device", "dtype")},
        "inputs": estimate.input_description,
        "by_module": {m.name: {"type": m.type_name, **{key: getattr(m, key) for key in _MODULE_KEYS}} for m in estimate.modules},
        "warnings": list(estimate.warnings),
    }
