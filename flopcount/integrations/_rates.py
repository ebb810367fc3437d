"""Rates from counted FLOPs and measured step times: TFLOP/s, MFU, HFU, tokens/s (pure
functions), and the peak they are measured against.

MFU (model FLOPs utilisation) counts :func:`model_flops`: 3 x the forward FLOPs of the model as
written (PaLM's 6N + 12·L·H·Q·T per token is 3 x its forward; no recomputation, no fused
attention backward's extra work); with frozen parameters at most every FLOP the step ran (a
frozen backbone's step does less than 3 x its forward): such a step's MFU never exceeds its HFU. HFU (hardware FLOPs utilisation) counts every FLOP the step
ran as flopcount counted it: forward, backward (recomputation under activation checkpointing
and the fused attention backward's 2.5x included) and the optimizer step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Union

import torch

from flopcount.bench.peak import mfu_peak, model_flops

__all__ = ["PREFIX", "Window", "model_device", "model_dtype", "model_flops", "resolve_peak", "window_metrics"]

PREFIX = "flopcount/"


@dataclass
class Window:
    """Steps since the last log: their FLOPs (as run, and the model FLOPs), measured
    seconds, tokens and samples; tokens and model FLOPs are None once a step without them came."""

    steps: int = 0
    flops: int = 0
    seconds: float = 0.0
    tokens: Optional[int] = 0
    samples: int = 0
    model_flops: Optional[int] = 0

    def add(self, flops: int, seconds: float, tokens: Optional[int], samples: int, model_flops: Optional[int] = None) -> None:
        self.steps += 1
        self.flops += flops
        self.seconds += seconds
        self.samples += samples
        self.tokens = None if tokens is None or self.tokens is None else self.tokens + tokens
        self.model_flops = None if model_flops is None or self.model_flops is None else self.model_flops + model_flops


def window_metrics(window: Window, peak: Optional[float]) -> Dict[str, float]:
    """``flops_per_step`` = mean FLOPs of the window's steps (exact per step when each log
    covers one step); ``tflops_per_s`` = window FLOPs / window seconds / 1e12; ``hfu`` =
    FLOP/s / ``peak``; ``mfu`` = model FLOPs / window seconds / ``peak`` (when every step
    has them); ``tokens_per_s`` and ``samples_per_s`` over the same seconds."""
    if window.steps == 0:
        return {}
    metrics = {PREFIX + "flops_per_step": window.flops / window.steps}
    if window.seconds > 0:
        rate = window.flops / window.seconds
        metrics[PREFIX + "tflops_per_s"] = rate / 1e12
        if peak:
            metrics[PREFIX + "hfu"] = rate / peak
            if window.model_flops is not None:
                metrics[PREFIX + "mfu"] = window.model_flops / window.seconds / peak
        if window.tokens is not None:
            metrics[PREFIX + "tokens_per_s"] = window.tokens / window.seconds
        metrics[PREFIX + "samples_per_s"] = window.samples / window.seconds
    return metrics


def resolve_peak(
    device: torch.device, dtype: Union[None, str, torch.dtype], given: Optional[float], on: Optional[str] = None
) -> Tuple[Optional[float], str]:
    """The FLOP/s an MFU is measured against, and a sentence when there is none: ``given``
    if set; else the dense datasheet peak of the modeled part ``on`` (a part's name, as
    :func:`flopcount.bench.peak.mfu_part` checked it when the callback was made) at ``dtype``; else the GPU's
    own (``device``: where the model runs; torch's default math modes: float32 matmuls at the
    FP32 peak); none on CPU (a measured GEMM rate is a micro-benchmark's figure, not a peak:
    pass one to get an MFU)."""
    found, _ = mfu_peak(device, dtype, given, on)
    if found is not None:
        return found, ""
    if on is not None:
        return None, f"{on} has no dense peak at {dtype} in flopcount's table: pass peak_flops= for an MFU"
    if device.type == "cuda":
        return None, f"no peak for {torch.cuda.get_device_name(device)} at {dtype} in flopcount's table: pass peak_flops= for an MFU"
    if device.type == "cpu":
        return None, (
            "no MFU on CPU unless peak_flops= is given (FLOP/s): a CPU has no datasheet peak flopcount knows, and a "
            "measured GEMM rate is not a peak (flopcount.devices.measured.machine_roofs().peak() is one figure you may pass)"
        )
    return None, f"no peak FLOP/s is known for device {device.type!r}: pass peak_flops= (FLOP/s) for an MFU"


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    return next((param.device for param in model.parameters()), torch.device("cpu"))


def model_dtype(model: Any) -> Optional[torch.dtype]:
    """The dtype of the model's first floating parameter."""
    return next((param.dtype for param in model.parameters() if param.is_floating_point()), None)
