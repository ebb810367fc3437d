"""The datasheet parts: one table of named accelerators with their dense peak throughput
per dtype, memory bandwidth and capacity, L2 size (and bandwidth where the maker publishes
it) and interconnect links. Plain data, no torch.

Peaks are TFLOP/s (TOPS for integers) **dense**: NVIDIA's datasheets print tensor-core
figures "with sparsity" (2:4 structured), twice the dense rate; the table holds half of
those. ``float32`` is the non-tensor-core FP32 rate, ``tfloat32`` the TF32 tensor-core
rate, ``float64`` the highest FP64 rate (tensor core where the part has one). Boost clocks:
a sustained clock is lower, so a bound against these figures stays a lower bound. A part
lists only the dtypes its sheet gives; a dtype it has no figure for is never priced at
another column silently (:func:`flopcount.devices.roofline.op_time` reports it).

Names resolve exactly (case, spaces, dashes and a leading "NVIDIA"/"Tesla"/"GeForce"
ignored) or through each part's documented aliases (including what
``torch.cuda.get_device_name()`` prints); anything else is an error listing the parts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Dict, Mapping, Optional, Tuple

from flopcount.errors import UsageError, close_names
from flopcount.types import dtype_key

#: peak columns, as torch spells the dtypes (tfloat32: TF32 tensor cores on float32 data)
DTYPE_COLUMNS: Tuple[str, ...] = (
    "float64", "float32", "tfloat32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "int4",
)
#: a column's other names beyond a dtype's (flopcount.types.DTYPE_ALIASES: "bf16", "half"...)
_COLUMN_ALIASES = {
    "tf32": "tfloat32", "fp8": "float8_e4m3fn", "float8": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "float8_e4m3fnuz": "float8_e4m3fn", "float8_e5m2fnuz": "float8_e5m2",
    "uint8": "int8", "qint8": "int8", "quint8": "int8",
}

#: interconnect name -> bytes/s per GPU, one direction (datasheet figures)
LINKS: Mapping[str, float] = MappingProxyType({
    "nvlink5": 900e9,  # B200: 1.8 TB/s bidirectional
    "nvlink4": 450e9,  # H100/H200 SXM: 900 GB/s bidirectional
    "nvlink3": 300e9,  # A100 SXM: 600 GB/s bidirectional
    "nvlink2": 150e9,  # V100 SXM2: 300 GB/s bidirectional
    "nvlink-bridge4": 300e9,  # H100/H200 NVL pairs: 600 GB/s bidirectional
    "nvlink-bridge3": 300e9,  # A100 PCIe pairs: 600 GB/s bidirectional
    "nvlink-c2c": 450e9,  # GH200 CPU<->GPU: 900 GB/s bidirectional
    "pcie5": 64e9,  # x16, per direction
    "pcie4": 32e9,  # x16, per direction
    "pcie3": 16e9,  # x16, per direction
    "infiniband-xdr": 100e9,  # 800 Gb/s per GPU NIC
    "infiniband-ndr": 50e9,  # 400 Gb/s per GPU NIC
    "infiniband-hdr": 25e9,  # 200 Gb/s per GPU NIC
    "ethernet-400g": 50e9,
    "ethernet-100g": 12.5e9,
})


@dataclass(frozen=True)
class Part:
    """One accelerator's datasheet figures (units: TFLOP/s, GB/s = 1e9 bytes/s, bytes)."""

    name: str
    peaks_tflops: Mapping[str, float]
    memory_gbps: float
    memory_bytes: float
    l2_bytes: Optional[float] = None
    l2_gbps: Optional[float] = None
    links: Tuple[str, ...] = ()
    aliases: Tuple[str, ...] = ()
    source: str = ""

    @property
    def peak_flops(self) -> Dict[str, float]:
        return {k: v * 1e12 for k, v in self.peaks_tflops.items()}

    @property
    def bandwidth(self) -> float:
        return self.memory_gbps * 1e9


_MB = 1e6
_GB = 1e9
_H100_SXM = {"float64": 67.0, "float32": 67.0, "tfloat32": 494.5, "float16": 989.5, "bfloat16": 989.5,
             "float8_e4m3fn": 1979.0, "float8_e5m2": 1979.0, "int8": 1979.0}
_H100_NVL = {"float64": 60.0, "float32": 60.0, "tfloat32": 417.5, "float16": 835.5, "bfloat16": 835.5,
             "float8_e4m3fn": 1670.5, "float8_e5m2": 1670.5, "int8": 1670.5}
_A100 = {"float64": 19.5, "float32": 19.5, "tfloat32": 156.0, "float16": 312.0, "bfloat16": 312.0,
         "int8": 624.0, "int4": 1248.0}

_PARTS: Tuple[Part, ...] = (
    # NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100, 2023/2024):
    # SXM: FP64 TC 67, FP32 67, TF32 989*, BF16/FP16 1979*, FP8 3958*, INT8 3958* (* sparse);
    # 80 GB HBM3 at 3.35 TB/s; NVLink 900 GB/s. L2 50 MB (Hopper architecture whitepaper).
    Part("H100 SXM", _H100_SXM, 3350.0, 80 * _GB, 50 * _MB, None, ("nvlink4", "pcie5"),
         ("h100", "h100 sxm5", "h100 80gb hbm3", "h100 sxm 80gb"), "NVIDIA H100 datasheet (SXM)"),
    # same sheet, PCIe: FP64 TC 51, FP32 51, TF32 756*, BF16/FP16 1513*, FP8 3026*, INT8 3026*;
    # 80 GB HBM2e at 2.0 TB/s; NVLink bridge 600 GB/s, PCIe Gen5 128 GB/s.
    Part("H100 PCIe", {"float64": 51.0, "float32": 51.0, "tfloat32": 378.0, "float16": 756.5, "bfloat16": 756.5,
                       "float8_e4m3fn": 1513.0, "float8_e5m2": 1513.0, "int8": 1513.0},
         2000.0, 80 * _GB, 50 * _MB, None, ("nvlink-bridge4", "pcie5"), ("h100 pcie 80gb",),
         "NVIDIA H100 datasheet (PCIe)"),
    # same sheet, H100 NVL: FP64 TC 60, FP32 60, TF32 835*, BF16/FP16 1671*, FP8 3341*, INT8 3341*;
    # 94 GB HBM3 at 3.9 TB/s; NVLink 600 GB/s.
    Part("H100 NVL", _H100_NVL, 3900.0, 94 * _GB, 50 * _MB, None, ("nvlink-bridge4", "pcie5"),
         ("h100nvl", "h100 nvl 94gb"), "NVIDIA H100 datasheet (H100 NVL)"),
    # NVIDIA H200 Tensor Core GPU datasheet (2024): H200 SXM: the H100 SXM's peaks,
    # 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s.
    Part("H200 SXM", _H100_SXM, 4800.0, 141 * _GB, 50 * _MB, None, ("nvlink4", "pcie5"),
         ("h200", "h200 141gb hbm3e", "h200 sxm 141gb"), "NVIDIA H200 datasheet (SXM)"),
    # same sheet, H200 NVL: FP64 TC 60, FP32 60, TF32 835*, BF16/FP16 1671*, FP8 3341*, INT8 3341*;
    # 141 GB at 4.8 TB/s; NVLink bridge 900 GB/s (2- or 4-way).
    Part("H200 NVL", _H100_NVL, 4800.0, 141 * _GB, 50 * _MB, None, ("nvlink4", "pcie5"), ("h200nvl",),
         "NVIDIA H200 datasheet (NVL)"),
    # NVIDIA GH200 Grace Hopper Superchip datasheet (2024): the GPU's peaks are the H100 SXM's;
    # HBM3e 144 GB at up to 4.9 TB/s (the 96 GB HBM3 version: 4 TB/s); NVLink-C2C 900 GB/s.
    Part("GH200 144GB", _H100_SXM, 4900.0, 144 * _GB, 50 * _MB, None, ("nvlink-c2c", "nvlink4"),
         ("gh200", "gh200 144gb hbm3e", "gh200 144g hbm3e"), "NVIDIA GH200 Grace Hopper Superchip datasheet (HBM3e)"),
    Part("GH200 96GB", _H100_SXM, 4000.0, 96 * _GB, 50 * _MB, None, ("nvlink-c2c", "nvlink4"),
         ("gh200 96gb hbm3",), "NVIDIA GH200 Grace Hopper Superchip datasheet (HBM3)"),
    # NVIDIA A100 Tensor Core GPU datasheet (2021): FP64 TC 19.5, FP32 19.5, TF32 156 (312*),
    # BF16/FP16 312 (624*), INT8 624 (1248*), INT4 1248 (2496*); 80 GB SXM 2,039 GB/s, 80 GB PCIe
    # 1,935 GB/s, 40 GB (SXM and PCIe) 1,555 GB/s; NVLink 600 GB/s (PCIe: bridge for 2 GPUs).
    # L2 40 MB (A100 architecture whitepaper).
    Part("A100 80GB SXM", _A100, 2039.0, 80 * _GB, 40 * _MB, None, ("nvlink3", "pcie4"),
         ("a100", "a100 sxm4 80gb", "a100 80gb"), "NVIDIA A100 datasheet (80GB SXM)"),
    Part("A100 80GB PCIe", _A100, 1935.0, 80 * _GB, 40 * _MB, None, ("nvlink-bridge3", "pcie4"),
         ("a100 pcie 80gb", "a100 80gb pcie"), "NVIDIA A100 datasheet (80GB PCIe)"),
    Part("A100 40GB SXM", _A100, 1555.0, 40 * _GB, 40 * _MB, None, ("nvlink3", "pcie4"),
         ("a100 sxm4 40gb", "a100 40gb"), "NVIDIA A100 datasheet (40GB SXM)"),
    Part("A100 40GB PCIe", _A100, 1555.0, 40 * _GB, 40 * _MB, None, ("nvlink-bridge3", "pcie4"),
         ("a100 pcie 40gb",), "NVIDIA A100 datasheet (40GB PCIe)"),
    # NVIDIA L4 datasheet (2023): FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485*, INT8 485*;
    # 24 GB GDDR6 at 300 GB/s; PCIe Gen4. L2 48 MB (Ada Lovelace whitepaper, AD104).
    Part("L4", {"float32": 30.3, "tfloat32": 60.0, "float16": 121.0, "bfloat16": 121.0,
                "float8_e4m3fn": 242.5, "float8_e5m2": 242.5, "int8": 242.5},
         300.0, 24 * _GB, 48 * _MB, None, ("pcie4",), (), "NVIDIA L4 datasheet"),
    # NVIDIA A10 datasheet (2021): FP32 31.2, TF32 62.5 (125*), BF16/FP16 125 (250*),
    # INT8 250 (500*), INT4 500 (1000*); 24 GB GDDR6 at 600 GB/s. L2 6 MB (GA102).
    Part("A10", {"float32": 31.2, "tfloat32": 62.5, "float16": 125.0, "bfloat16": 125.0, "int8": 250.0, "int4": 500.0},
         600.0, 24 * _GB, 6 * _MB, None, ("pcie4",), (), "NVIDIA A10 datasheet"),
    # NVIDIA V100 datasheet (2020): SXM2 FP64 7.8, FP32 15.7, tensor 125; PCIe FP64 7, FP32 14,
    # tensor 112; V100S PCIe FP64 8.2, FP32 16.4, tensor 130; HBM2 900 GB/s (V100S 1,134 GB/s);
    # NVLink 300 GB/s (SXM2). No BF16/TF32 (Volta). L2 6 MB (Volta whitepaper).
    Part("V100 SXM2", {"float64": 7.8, "float32": 15.7, "float16": 125.0}, 900.0, 32 * _GB, 6 * _MB, None,
         ("nvlink2", "pcie3"), ("v100", "v100 sxm2 16gb", "v100 sxm2 32gb"), "NVIDIA V100 datasheet (SXM2)"),
    Part("V100 PCIe", {"float64": 7.0, "float32": 14.0, "float16": 112.0}, 900.0, 32 * _GB, 6 * _MB, None,
         ("pcie3",), ("v100 pcie 16gb", "v100 pcie 32gb"), "NVIDIA V100 datasheet (PCIe)"),
    Part("V100S PCIe", {"float64": 8.2, "float32": 16.4, "float16": 130.0}, 1134.0, 32 * _GB, 6 * _MB, None,
         ("pcie3",), ("v100s", "v100s pcie 32gb"), "NVIDIA V100 datasheet (V100S PCIe)"),
    # NVIDIA T4 datasheet (2019): FP32 8.1, mixed FP16/FP32 65, INT8 130, INT4 260; 16 GB GDDR6
    # at 320 GB/s. No BF16 (Turing). L2 4 MB (Turing whitepaper, TU104).
    Part("T4", {"float32": 8.1, "float16": 65.0, "int8": 130.0, "int4": 260.0}, 320.0, 16 * _GB, 4 * _MB, None,
         ("pcie3",), (), "NVIDIA T4 datasheet"),
    # NVIDIA Ada Lovelace architecture whitepaper (v2.x), GeForce RTX 4090: FP32 82.6; tensor
    # TF32 82.6, FP16/BF16 with FP32 accumulate 165.2, FP8 with FP32 accumulate 330.3, INT8 660.6,
    # INT4 1321.2 (dense); 24 GB GDDR6X at 1,008 GB/s; L2 72 MB. No FP64 figure given.
    Part("RTX 4090", {"float32": 82.6, "tfloat32": 82.6, "float16": 165.2, "bfloat16": 165.2,
                      "float8_e4m3fn": 330.3, "float8_e5m2": 330.3, "int8": 660.6, "int4": 1321.2},
         1008.0, 24 * _GB, 72 * _MB, None, ("pcie4",), ("4090", "rtx4090", "geforce rtx 4090"),
         "NVIDIA Ada Lovelace GPU architecture whitepaper"),
)


def normalise(name: str) -> str:
    """Lower case, dashes/underscores as spaces, single spaces, no vendor prefix."""
    text = re.sub(r"[\s_\-]+", " ", name.strip().lower())
    text = re.sub(r"^(nvidia )?(tesla |geforce )?", "", text)
    return text.strip()


def _index() -> Dict[str, Part]:
    found: Dict[str, Part] = {}
    for part in _PARTS:
        for key in (part.name, *part.aliases):
            norm = normalise(key)
            if norm in found and found[norm] is not part:
                raise AssertionError(f"two parts answer to {key!r}")
            found[norm] = part
    return found


PARTS: Mapping[str, Part] = MappingProxyType({p.name: p for p in _PARTS})
_BY_NAME = _index()


def known_names() -> str:
    return ", ".join(PARTS)


def part_hint(name: str) -> str:
    """``"; did you mean h100, v100?"``: the names or aliases closest to ``name`` (a typo), one per
    part; "" when none is close."""
    closest: Dict[int, str] = {}
    for key in close_names(normalise(str(name)), list(_BY_NAME)):
        closest.setdefault(id(_BY_NAME[key]), key)
    return f"; did you mean {', '.join(closest.values())}?" if closest else ""


def find_part(name: str) -> Optional[Part]:
    """The part ``name`` names, exactly or by a documented alias; None when none does.

    Also reads ``torch.cuda.get_device_name()`` forms: "NVIDIA A100-SXM4-80GB",
    "NVIDIA H100 80GB HBM3", "Tesla V100-PCIE-32GB", "NVIDIA GH200 480GB"."""
    return _BY_NAME.get(normalise(name))


def resolve_part(name: str) -> Part:
    """:func:`find_part`, or a UsageError naming the known parts."""
    part = find_part(name)
    if part is None:
        listed = [find_part(each.strip()) for each in str(name).split(",")]
        if len(listed) > 1 and all(listed):  # serve's --on h100,l4 given where one part goes
            raise UsageError(f"{name!r} names {len(listed)} parts; one part goes here (serve compares several: "
                             f"serve --on {name})")
        raise UsageError(f"unknown part {name!r}; known parts: {known_names()} (aliases in docs/devices.md), "
                         f"or 'this machine'{part_hint(name)}")
    return part


def column_of(dtype: object) -> str:
    """The peak column of a dtype (``torch.bfloat16``, "bf16", "float8_e4m3fn"...); floating
    and integer dtypes that are no column keep their own name (and have no peak)."""
    text = dtype_key(str(dtype))
    return _COLUMN_ALIASES.get(text, text)


#: The float32 column a modeled device prices each op family at, torch's defaults:
#: cuDNN convolutions and RNN layers in TF32 (``torch.backends.cudnn.allow_tf32`` is True),
#: matmuls not (``torch.backends.cuda.matmul.allow_tf32`` is False). Attention has no flag of
#: its own: ``Roofs.column`` prices it at the faster of the matmul mode and 3xTF32.
DEFAULT_CONV_TF32 = True
DEFAULT_MATMUL_TF32 = False


@dataclass(frozen=True)
class MathModes:
    """The modeled device's math modes (never read from the host's torch flags): ``conv_tf32``
    is cuDNN's flag (the "conv" family: convolutions and RNN layers), ``matmul_tf32`` cuBLAS's
    (the "matmul" family; attention follows it where it beats 3xTF32: ``Roofs.column``)."""

    conv_tf32: bool = DEFAULT_CONV_TF32
    matmul_tf32: bool = DEFAULT_MATMUL_TF32
    extra: Mapping[str, str] = field(default_factory=dict)

    def math(self, part: Part) -> Dict[str, str]:
        out: Dict[str, str] = {}
        if "tfloat32" in part.peaks_tflops:
            if self.conv_tf32:
                out["conv"] = "tfloat32"
            if self.matmul_tf32:
                out["matmul"] = "tfloat32"
        return out
