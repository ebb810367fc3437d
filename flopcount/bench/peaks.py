"""Known dense peak throughput and memory bandwidth of a few NVIDIA GPUs, for MFU (model
FLOPs utilisation) and roofline bounds.

Figures are TFLOP/s from NVIDIA's datasheets, **dense** (without 2:4 structured
sparsity; datasheets often print the sparse figure, twice the dense one). Tensor-core
figures for float16/bfloat16 are with FP32 accumulation where the datasheet
distinguishes (GeForce). ``float32`` is the non-tensor-core FP32 rate (what
PyTorch uses unless TF32 matmuls are enabled); ``tfloat32`` is the TF32 tensor-core
rate. Sources and caveats are listed in docs/benchmarking.md. Boost clocks are
assumed: real sustained clocks are lower, so MFU against these figures is an
upper-bound denominator.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Mapping, Optional, Tuple, Union

import torch

from ..errors import UsageError

DTYPE_KEYS = ("float32", "tfloat32", "float16", "bfloat16")

# GPU key -> dtype key -> dense peak TFLOP/s (datasheet, boost clock).
_PEAKS = {
    "H100 SXM": {"float32": 67.0, "tfloat32": 494.5, "float16": 989.5, "bfloat16": 989.5},
    "H100 PCIe": {"float32": 51.0, "tfloat32": 378.0, "float16": 756.5, "bfloat16": 756.5},
    "H200": {"float32": 67.0, "tfloat32": 494.5, "float16": 989.5, "bfloat16": 989.5},
    "A100": {"float32": 19.5, "tfloat32": 156.0, "float16": 312.0, "bfloat16": 312.0},
    "L4": {"float32": 30.3, "tfloat32": 60.0, "float16": 121.0, "bfloat16": 121.0},
    "A10": {"float32": 31.2, "tfloat32": 62.5, "float16": 125.0, "bfloat16": 125.0},
    "V100 SXM2": {"float32": 15.7, "float16": 125.0},
    "V100 PCIe": {"float32": 14.0, "float16": 112.0},
    "T4": {"float32": 8.1, "float16": 65.0},
    "RTX 4090": {"float32": 82.6, "tfloat32": 82.6, "float16": 165.2, "bfloat16": 165.2},
}

# GPU key -> memory bandwidth in GB/s (10^9 bytes/s), datasheet (the largest-memory
# variant where a part comes in several: A100 80GB SXM, H100 SXM5 80GB).
_BANDWIDTH_GBPS = {
    "H100 SXM": 3350.0,
    "H100 PCIe": 2000.0,
    "H200": 4800.0,
    "A100": 2039.0,
    "L4": 300.0,
    "A10": 600.0,
    "V100 SXM2": 900.0,
    "V100 PCIe": 900.0,
    "T4": 320.0,
    "RTX 4090": 1008.0,
}

#: Read-only view: ``BANDWIDTH_GBPS[gpu]`` = datasheet memory bandwidth in GB/s.
BANDWIDTH_GBPS: Mapping[str, float] = MappingProxyType(_BANDWIDTH_GBPS)

#: Read-only view: ``PEAK_TFLOPS[gpu][dtype]`` = dense peak in TFLOP/s.
PEAK_TFLOPS: Mapping[str, Mapping[str, float]] = MappingProxyType({k: MappingProxyType(v) for k, v in _PEAKS.items()})

# (pattern over the lower-cased device name, table key); first match wins, so the
# more specific names come first ("a10g" must not fall into "a10").
_NAME_PATTERNS: Tuple[Tuple[str, Optional[str]], ...] = (
    (r"h100.*(pcie)", "H100 PCIe"),
    (r"h100", "H100 SXM"),  # "NVIDIA H100 80GB HBM3" is the SXM part
    (r"h200", "H200"),
    (r"a100", "A100"),
    (r"\bl4\b", "L4"),
    (r"a10g", None),  # AWS variant without a public NVIDIA datasheet: no entry
    (r"\ba10\b", "A10"),
    (r"v100.*pcie", "V100 PCIe"),
    (r"v100", "V100 SXM2"),
    (r"\bt4\b", "T4"),
    (r"4090", "RTX 4090"),
)


def match_gpu(name: str) -> Optional[str]:
    """The table key for a device name such as ``torch.cuda.get_device_name()``
    ("NVIDIA A100-SXM4-80GB" -> "A100"), or ``None`` when the GPU is not in the table."""
    lowered = name.lower().replace("-", " ").replace("_", " ")
    if name in _PEAKS:
        return name
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, lowered):
            return key
    return None


def dtype_key(dtype: Union[None, str, torch.dtype]) -> str:
    """The peaks-table column for a compute dtype. ``None``/float32 give "float32", or
    "tfloat32" when TF32 matmuls are enabled (``torch.backends.cuda.matmul.allow_tf32``)."""
    if dtype is None or dtype == torch.float32 or dtype == "float32":
        return "tfloat32" if torch.backends.cuda.matmul.allow_tf32 else "float32"
    if isinstance(dtype, torch.dtype):
        text = str(dtype).replace("torch.", "")
    else:
        text = str(dtype).lower().replace("torch.", "")
    aliases = {"tf32": "tfloat32", "fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32"}
    text = aliases.get(text, text)
    if text not in DTYPE_KEYS:
        raise UsageError(f"no peak column for dtype {dtype!r}; known: {', '.join(DTYPE_KEYS)}")
    return text


def peak_flops(gpu_name: str, dtype: Union[None, str, torch.dtype] = None) -> Optional[float]:
    """Dense peak in FLOP/s for ``gpu_name`` at ``dtype``, or ``None`` when the GPU or
    that dtype is not in :data:`PEAK_TFLOPS` (pass ``peak_flops=`` yourself then)."""
    key = match_gpu(gpu_name)
    if key is None:
        return None
    tflops = _PEAKS[key].get(dtype_key(dtype))
    return None if tflops is None else tflops * 1e12


def bandwidth(gpu_name: str) -> Optional[float]:
    """Datasheet memory bandwidth in bytes/s for ``gpu_name``, or ``None`` when unknown."""
    key = match_gpu(gpu_name)
    if key is None or key not in _BANDWIDTH_GBPS:
        return None
    return _BANDWIDTH_GBPS[key] * 1e9
