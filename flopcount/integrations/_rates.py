"""Rates from counted FLOPs and measured step times: TFLOP/s, MFU, tokens/s (pure functions),
and the peak an MFU is measured against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Union

import torch

from ..bench import peaks
from ..errors import UsageError

PREFIX = "flopcount/"


@dataclass
class Window:
    """Steps since the last log: their FLOPs, measured seconds, tokens and samples."""

    steps: int = 0
    flops: int = 0
    seconds: float = 0.0
    tokens: int = 0
    samples: int = 0
    has_tokens: bool = True

    def add(self, flops: int, seconds: float, tokens: Optional[int], samples: int) -> None:
        self.steps += 1
        self.flops += flops
        self.seconds += seconds
        self.samples += samples
        if tokens is None:
            self.has_tokens = False
        else:
            self.tokens += tokens


def window_metrics(window: Window, peak: Optional[float]) -> Dict[str, float]:
    """``flops_per_step`` = mean FLOPs of the window's steps (exact per step when each log
    covers one step); ``tflops_per_s`` = window FLOPs / window seconds / 1e12; ``mfu`` =
    FLOP/s / ``peak``; ``tokens_per_s`` and ``samples_per_s`` over the same seconds."""
    if window.steps == 0:
        return {}
    metrics = {PREFIX + "flops_per_step": window.flops / window.steps}
    if window.seconds > 0:
        rate = window.flops / window.seconds
        metrics[PREFIX + "tflops_per_s"] = rate / 1e12
        if peak:
            metrics[PREFIX + "mfu"] = rate / peak
        if window.has_tokens:
            metrics[PREFIX + "tokens_per_s"] = window.tokens / window.seconds
        metrics[PREFIX + "samples_per_s"] = window.samples / window.seconds
    return metrics


def resolve_peak(device: torch.device, dtype: Union[None, str, torch.dtype], given: Optional[float]) -> Tuple[Optional[float], str]:
    """The FLOP/s an MFU is measured against, and a sentence when there is none: ``given``
    if set, else the GPU's dense datasheet peak (``bench/peaks.py``) at ``dtype``; none on
    CPU (a measured GEMM rate is a micro-benchmark's figure, not a peak: pass one to get an MFU)."""
    if given is not None:
        if not given > 0:
            raise UsageError(f"peak_flops must be a positive FLOP/s figure, got {given!r}")
        return float(given), ""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        found = peaks.peak_flops(name, dtype)
        if found is None:
            return None, f"no peak for {name} at {dtype} in flopcount's table: pass peak_flops= for an MFU"
        return found, ""
    if device.type == "cpu":
        return None, (
            "no MFU on CPU unless peak_flops= is given (FLOP/s): a CPU has no datasheet peak flopcount knows, and a "
            "measured GEMM rate is not a peak (flopcount.bench.roofs.machine_roofs().peak() is one figure you may pass)"
        )
    return None, f"no peak FLOP/s is known for device {device.type!r}: pass peak_flops= (FLOP/s) for an MFU"


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def model_dtype(model: Any) -> Optional[torch.dtype]:
    """The dtype of the model's first floating parameter."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return None
