"""The roofline model as plain data and arithmetic (no torch): the one place that divides
work by a peak.

A :class:`Roofs` holds a device's peak FLOP/s per dtype column, its memory levels (the
fastest first, each with its capacity and bandwidth; the last is main memory) and says
where the figures came from. :func:`op_time` is the roofline of one op::

    attainable = max(flops / peak(dtype, op family), bytes / bandwidth(level))

where the level is the fastest one whose capacity holds the op's working set (the
Cache-Aware Roofline Model, Ilic, Pratas and Sousa, IEEE CAL 2014). :func:`any_implementation`
is the bound for a program whatever engine runs it: ``max(sum of flops / peak, unavoidable
bytes / bandwidth)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Dict, Iterable, Literal, Mapping, Optional, Sequence, Tuple

from flopcount.errors import UsageError
from flopcount.types import OpCall, TensorMeta, out_of_place

Bound = Literal["compute", "memory"]
#: Which program a latency bound is for: the eager per-op sum, or any implementation.
BoundKind = Literal["eager", "any"]
BOUND_KINDS: Tuple[str, ...] = ("eager", "any")
#: how each bound is named on a line ("any-implementation lower bound on T4"); the eager one
#: is not "per-op": it is the per-op sum or, where larger, the any-implementation bound
BOUND_NAMES: Dict[str, str] = {"eager": "eager", "any": "any-implementation"}


def bound_seconds(kind: str, latency_s: float, any_s: float, compiled: bool = False) -> float:
    """"any": ``any_s``; "eager": the larger of the per-op sum ``latency_s`` and ``any_s``
    (the eager program is one implementation, so both bound it), and ``any_s`` for a
    ``compiled`` model (``torch.compile``: its fused kernels move fewer bytes than the eager
    per-op sum prices, which bounds the program it was compiled from, not the one that runs:
    24.1 ms against a 10.8 ms compiled run of 60 elementwise ops)."""
    if kind == "eager":
        return any_s if compiled else max(latency_s, any_s)
    if kind == "any":
        return any_s
    raise UsageError(f"bound must be 'eager' or 'any', got {kind!r}")


#: the mark beside a figure computed on roofs with doubts (:attr:`Roofs.doubts`), as ``check``'s
#: line has it (``~ 8.012 ms``): an estimate, not a bound
ESTIMATE_MARK = "~"


def doubts_text(doubts: Sequence[str]) -> str:
    """What a figure computed on roofs with ``doubts`` is, in words: "an estimate, not a bound:
    roofs measured under load (load average 5.60 above the 2 cores)"; "" without doubts."""
    return f"an estimate, not a bound: roofs measured under load ({'; '.join(doubts)})" if doubts else ""


#: How a profile's figures are made, printed under every profile report.
PROFILE_CONVENTION = (
    "time: self time of the op's whole call tree per step (device time on CUDA, CPU time on CPU); "
    "bytes: the bytes each op moves, per op family (docs/conventions.md, \"Bytes\"; views 0); "
    "attainable = max(FLOPs / peak, bytes / bandwidth of the fastest memory level holding them); "
    "efficiency = attainable / time."
)

#: dtype used when an op has no dtype of its own (no tensor)
DEFAULT_DTYPE = "float32"

#: op families whose float32 work a device's math mode may price at another column: "conv"
#: follows cuDNN's flag (``torch.backends.cudnn.allow_tf32``: convolutions and cuDNN's RNN
#: layers), "matmul" cuBLAS's (``torch.backends.cuda.matmul.allow_tf32``), "attention" the
#: fastest kernel SDPA may pick (:meth:`Roofs.column`)
CONV, MATMUL, ATTENTION = "conv", "matmul", "attention"
#: the families, in the order a sentence names them; each family's name is also an op name
#: :func:`op_family` reads as that family
FAMILIES: Tuple[str, ...] = (MATMUL, ATTENTION, CONV)

#: The ceiling of float32 products run as three TF32 tensor-core products each ("3xTF32":
#: big*big + big*small + small*big, each float32 split into a TF32 big and small part), a
#: third of the TF32 peak: a derived column, not a datasheet figure, that a device has where
#: it has a TF32 one (Ampere and later). PyTorch's memory-efficient attention runs its float32
#: GEMMs so on sm80+ whatever ``allow_tf32`` says (``DefaultGemmType<ArchTag, float>``:
#: ``OpClassTensorOp`` with ``OpMultiplyAddFastF32``, CUTLASS's 3xTF32 by default;
#: docs/devices.md, "Math modes", cites the sources).
TF32X3 = "tfloat32x3"


#: dtypes no part's datasheet gives a peak for: masks, indices, counters (a column of a
#: given Roofs still prices them)
UNRATED_DTYPES = frozenset({"bool", "int16", "int32", "int64", "uint16", "uint32", "uint64"})

#: a float32 column and an op family as a sentence names them (the family names: also `flopcount roofs`)
_MATH_NAMES = {"float32": "FP32", "tfloat32": "TF32", TF32X3: "3xTF32"}
FAMILY_NAMES = {MATMUL: "matmuls", ATTENTION: "attention", CONV: "convolutions and RNN layers"}


def float32_math_text(math: Mapping[str, str]) -> str:
    """:meth:`Roofs.float32_math` as a sentence: "float32 matmuls in FP32, attention in 3xTF32,
    convolutions and RNN layers in TF32"."""
    said = [f"{FAMILY_NAMES[family]} in {_MATH_NAMES.get(column, column)}" for family, column in math.items()]
    return f"float32 {', '.join(said)}" if said else ""


#: The ops whose float32 work ``torch.backends.cuda.matmul.allow_tf32`` (and
#: ``torch.set_float32_matmul_precision``) lets run on TF32 tensor cores: the matrix products
#: torch hands to cuBLAS (mm, bmm, addmm, baddbmm, addbmm, mv, dot...), the composites made of
#: them (linear, matmul, einsum, tensordot, bilinear, cdist's mm path, cov) and the RNN cells
#: (``lstm_cell``... are ``linear`` and elementwise ops: cuBLAS, not cuDNN). Attention
#: (:data:`ATTENTION_OPS`) and cuDNN's RNN layers (:data:`CUDNN_RNN_OPS`) have families of their
#: own. Elementwise ops, norms, softmax and reductions never run on tensor cores, whatever the
#: flag: their float32 work stays at the float32 peak. Names as the tracers spell them, without
#: the namespace ("aten::addmm_" is "addmm").
MATMUL_OPS = frozenset({
    # matrix and vector products (handlers/matmul.py)
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "inner", "outer", "ger", "addr",
    "matmul", "linear", "bilinear", "_trilinear", "einsum", "tensordot", "_grouped_mm",
    "_sparse_mm", "_sparse_addmm", "smm", "hspmm", "sspaddmm", "grouped_mm_fallback", "grouped_mm_fallback_backward",
    # recurrent cells (handlers/rnn.py): linear plus elementwise, cuBLAS under the matmul flag
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    # linalg composites built on matmul (the factorizations run cuSOLVER/MAGMA in full FP32)
    "cdist", "_euclidean_dist", "cov", "corrcoef", "linalg_matrix_power", "linalg_pinv", "pinverse",
})

#: Attention (handlers/attention.py), forward and backward: ops whose float32 work may run on
#: whichever SDPA backend the modeled GPU picks (a CPU trace books the CPU flash op or the
#: composite; on the GPU float32 SDPA runs the memory-efficient kernel where its constraints
#: hold, else the math path). Their float32 column is the fastest any backend reaches
#: (:meth:`Roofs.column`): the math path's bmm under the matmul mode, the efficient kernel's
#: 3xTF32 (:data:`TF32X3`); flash and cuDNN attention take no float32. The multi-head
#: composites' projections are matmuls, never faster than that.
ATTENTION_OPS = frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_fused_attention_overrideable_backward",
    "_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward", "_efficient_attention_backward",
    "_native_multi_head_attention", "multi_head_attention_forward", "_transformer_encoder_layer_fwd",
})

#: Recurrent layers (handlers/rnn.py), which cuDNN runs on CUDA (``_cudnn_rnn``) with the
#: math type from ``torch.backends.cudnn.allow_tf32``, as convolutions (aten/src/ATen/native/
#: cudnn/RNN.cpp: ``allowTF32CuDNN``), not the matmul flag: the "conv" family. A CPU trace
#: books the layer as ``lstm``/``gru``/``rnn_*`` or oneDNN's ``mkldnn_rnn_layer``; on the
#: modeled GPU the same layer is ``_cudnn_rnn``.
CUDNN_RNN_OPS = frozenset({
    "lstm", "gru", "rnn_tanh", "rnn_relu", "_cudnn_rnn", "_cudnn_rnn_backward",
    "mkldnn_rnn_layer", "mkldnn_rnn_layer_backward",
})


@lru_cache(maxsize=4096)  # called per op per bound; op names are few
def op_family(op: str) -> Optional[str]:
    """Which math mode governs ``op``'s float32 work: "conv" for a convolution (forward or
    backward) or a cuDNN RNN layer (:data:`CUDNN_RNN_OPS`), "matmul" for a matrix product
    (:data:`MATMUL_OPS`), "attention" for attention (:data:`ATTENTION_OPS`), None for every
    other op (elementwise, norms, softmax, reductions: always float32). A family's own name
    ("matmul", "attention", "conv") names that family."""
    if "conv" in op.lower():
        return CONV
    name = out_of_place(op.rpartition("::")[2])  # in place: "addmm_" is addmm
    if name in MATMUL_OPS:
        return MATMUL
    if name in ATTENTION_OPS or name == ATTENTION:
        return ATTENTION
    if name in CUDNN_RNN_OPS:
        return CONV
    return None


def kernel_flops(call: OpCall, flops: float) -> float:
    """The part of a call's counted ``flops`` a kernel cannot skip: all of it, except for a
    causal attention (``is_causal``, or the efficient kernel's causal ``custom_mask_type``),
    whose fused kernels (flash and memory-efficient, CPU and GPU) skip the key blocks past the
    diagonal: of the Lq x Lk scores per head the count books (torch's convention), only the
    m(m + 1) / 2 of the causal triangle, m = min(Lq, Lk), are needed whichever way the
    triangle is aligned (torch's top-left, flash-attn's bottom-right)."""
    lengths = _causal_lengths(call) if flops else None
    if lengths is None:
        return flops
    lq, lk = lengths
    m = min(lq, lk)
    return flops * (m * (m + 1) / 2) / (lq * lk)


def bottom_right_causal_flops(call: OpCall, flops: float) -> float:
    """The part of an attention call's counted ``flops`` (Lq x Lk scores per head) a
    bottom-right-aligned causal kernel computes, for a call whose caller knows its explicit
    mask is exactly causal with the queries at the end of the keys (query i sees keys
    0..Lk - Lq + i: a later chunk of a causal prefill, Lk - Lq positions cached before it):
    the (Lk - Lq) Lq scores over the past and the Lq (Lq + 1) / 2 of the chunk's own triangle,
    what flash-attn's causal kernels (varlen too, vLLM's chunked prefill) compute. All of
    ``flops`` for any other call: not attention, not 4-D, or more queries than keys. The
    window-less case of :func:`windowed_causal_flops`, its past the Lk - Lq cached keys."""
    lengths = attention_lengths(call) if flops else None
    if lengths is None:
        return flops
    return windowed_causal_flops(call, flops, past=lengths[1] - lengths[0])  # past < 0 (Lq > Lk): all of flops


def windowed_causal_flops(call: OpCall, flops: float, past: int, window: Optional[int] = None,
                          chunk: Optional[int] = None, slots: Optional[int] = None) -> float:
    """The part of an attention call's counted ``flops`` (Lq x Lk scores per head) a kernel
    that knows the call's mask computes, for a call whose caller knows the mask:
    :func:`masked_flops` over the call's query and key lengths. All of ``flops`` for a call
    that is not a 4-D attention."""
    lengths = attention_lengths(call) if flops else None
    return flops if lengths is None else masked_flops(flops, lengths[0], lengths[1], past, window, chunk, slots)


def masked_flops(flops: float, lq: int, lk: int, past: int, window: Optional[int] = None,
                 chunk: Optional[int] = None, slots: Optional[int] = None) -> float:
    """The part of ``flops`` spent evenly over an Lq x Lk score matrix (an attention kernel's,
    or an eager attention's score matmuls and the elementwise ops on its scores) that the
    call's causal mask admits: the Lq queries at absolute positions past..past + Lq - 1, each
    seeing the causal keys of its sliding ``window`` (position p: the min(W, p + 1) keys
    p - W + 1..p, transformers' and flash-attn's ``window_size=(W - 1, 0)`` convention) or of
    its attention ``chunk`` (the p mod C + 1 keys from C floor(p / C) to p, Llama-4's chunked
    attention), or, with neither, all p + 1 keys (the bottom-right causal kernel of
    :func:`bottom_right_causal_flops`). The keys must be the ``past`` positions and the call's
    own (Lk = past + Lq), or at least the W - 1 (C - 1) latest positions before them (a
    sliding cache keeps W - 1), or a static cache's ``slots`` (Lk = slots >= past + Lq, position
    i in slot i, the slots not yet written masked): all of ``flops`` otherwise."""
    admitted = admitted_scores(lq, lk, past, window, chunk, slots) if flops else None
    return flops if admitted is None else flops * admitted / (lq * lk)


def sink_flops(flops: float, lq: int, lk: int, past: int, window: Optional[int] = None,
               chunk: Optional[int] = None, slots: Optional[int] = None) -> float:
    """:func:`masked_flops` for ``flops`` spent evenly over the Lq x (Lk + 1) entries of the
    scores and one sink logit per query (GPT-OSS's attention sinks, which every query's softmax
    sees: flash-attn's and vLLM's ``sinks``): the admitted scores and the Lq sinks."""
    admitted = admitted_scores(lq, lk, past, window, chunk, slots) if flops else None
    return flops if admitted is None else flops * (admitted + lq) / (lq * (lk + 1))


def admitted_scores(lq: int, lk: int, past: int, window: Optional[int] = None, chunk: Optional[int] = None,
                    slots: Optional[int] = None) -> Optional[int]:
    """The entries of an Lq x Lk score matrix per head that the causal mask of
    :func:`masked_flops` admits; None where the keys are not the positions it requires."""
    size = window or chunk
    cached = lk - lq
    if lq <= 0 or past < 0 or (cached != past and not (size and past > cached >= size - 1)
                                   and not (slots and lk == slots >= past + lq)):
        return None
    return _scores_before(past + lq, window, chunk) - _scores_before(past, window, chunk)


def one_position_flops(call: OpCall, flops: float, position: int, window: Optional[int] = None,
                       chunk: Optional[int] = None, slots: Optional[int] = None) -> float:
    """The part of an attention call's counted ``flops`` (Lq x Lk scores per head) a kernel that
    knows the call's mask computes, for a call whose every query is the one token at absolute
    ``position`` p (a decode step's: its Lq rows are that token, or its heads packed in by
    grouped-query attention, transformers' ``pack_gqa``): of the Lk keys, the ones the mask
    admits, as :func:`windowed_causal_flops` admits them to a query at p (min(W, p + 1) keys
    of a sliding ``window``, the p mod C + 1 of an attention ``chunk``, else all p + 1). The
    keys must hold them as a cache holds positions: the p earlier ones and its own (Lk = p + 1),
    the latest W - 1 (C - 1) of them and its own (a sliding cache), or a static cache's
    ``slots`` (Lk = slots > p, position i in slot i, the empty ones masked). All of ``flops``
    otherwise."""
    lengths = attention_lengths(call) if flops else None
    if lengths is None or position < 0:
        return flops
    lk = lengths[1]
    size = window or chunk
    held = lk == position + 1 or bool(size and lk == min(position, size - 1) + 1) or bool(slots and lk == slots > position)
    if not held:
        return flops
    return flops * (_scores_before(position + 1, window, chunk) - _scores_before(position, window, chunk)) / lk


def _scores_before(positions: int, window: Optional[int], chunk: Optional[int]) -> int:
    """The scores the queries at positions 0..positions - 1 compute, each seeing its causal keys
    within ``window`` or ``chunk`` (:func:`windowed_causal_flops`): sum of min(W, p + 1), of
    p mod C + 1, or of p + 1."""
    def triangle(n: int) -> int:
        return n * (n + 1) // 2

    if window:
        return triangle(positions) if positions <= window else triangle(window) + (positions - window) * window
    if chunk:
        return positions // chunk * triangle(chunk) + triangle(positions % chunk)
    return triangle(positions)


def _causal_lengths(call: OpCall) -> Optional[Tuple[int, int]]:
    """(Lq, Lk) of a causal attention kernel's query and key (None: not one, or not 4-D)."""
    if op_family(call.op) != ATTENTION or not (call.arg("is_causal") or call.arg("custom_mask_type") in (1, 2)):
        return None
    return attention_lengths(call)


def attention_lengths(call: OpCall) -> Optional[Tuple[int, int]]:
    """(Lq, Lk) of an attention call's 4-D query and key (None: not attention, not 4-D, or a
    length 0)."""
    if op_family(call.op) != ATTENTION:
        return None
    query, key = call.arg("query"), call.arg("key")
    if not (isinstance(query, TensorMeta) and isinstance(key, TensorMeta) and query.ndim == key.ndim == 4):
        return None
    # (B, L, H, E) for flash-attn's and the efficient kernel's own ops, (B, H, L, E) for the SDPA ops
    axis = 1 if call.op.rpartition("::")[2].startswith(("_flash_attention", "_efficient_attention")) else 2
    lq, lk = query.shape[axis], key.shape[axis]
    return (lq, lk) if lq and lk else None


@dataclass(frozen=True)
class MemoryLevel:
    """One level of the memory hierarchy: ``capacity`` bytes (None: unbounded, main memory)
    and ``bandwidth`` bytes/s (None: not published, so the level sets no memory term)."""

    name: str
    capacity: Optional[float]
    bandwidth: Optional[float]

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "capacity": self.capacity, "bandwidth": self.bandwidth}


@dataclass(frozen=True)
class Roofs:
    """Peak FLOP/s per dtype column ("float32", "tfloat32", "bfloat16", "float8_e4m3fn"...)
    and main-memory bandwidth in bytes/s.

    ``source`` says where the figures come from ("measured", "datasheet", "given");
    ``device`` names the machine or part; ``details`` keeps how each figure was made.
    ``levels``: faster memory levels (caches) with their capacity and bandwidth, fastest
    first; main memory (``bandwidth``) is always the last level. ``math``: op family ->
    the column its float32 work is priced at (``{"conv": "tfloat32"}`` for cuDNN's
    default TF32 convolutions and RNN layers), the modeled device's math modes, never the
    host's flags; attention's column follows from them (:meth:`column`). ``doubts``: why a
    bound on these roofs may be above what the device runs (empty: none): the sanity problems
    of this machine's roofs measured now and found not sane (a load average above the cores,
    two passes apart: rates below what the machine does), so each figure computed on them is
    an estimate, not a bound (docs/devices.md, "Roofs measured under load"). Sane measured,
    cached, datasheet and given roofs have none.
    """

    peak_flops: Mapping[str, float]
    bandwidth: float
    device: str = ""
    source: str = "given"
    details: Mapping[str, Any] = field(default_factory=dict)
    levels: Tuple[MemoryLevel, ...] = ()
    math: Mapping[str, str] = field(default_factory=dict)
    doubts: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.peak_flops:
            raise UsageError("Roofs need at least one peak FLOP/s (peak_flops={'float32': ...})")
        for dtype, value in self.peak_flops.items():
            if not (isinstance(value, (int, float)) and value > 0):
                raise UsageError(f"Roofs: peak_flops[{dtype!r}] must be > 0 FLOP/s, got {value!r}")
        if not (isinstance(self.bandwidth, (int, float)) and self.bandwidth > 0):
            raise UsageError(f"Roofs: bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")
        for level in self.levels:
            if level.capacity is not None and not level.capacity > 0:
                raise UsageError(f"Roofs: level {level.name!r} capacity must be > 0 bytes, got {level.capacity!r}")
            if level.bandwidth is not None and not level.bandwidth > 0:
                raise UsageError(f"Roofs: level {level.name!r} bandwidth must be > 0 bytes/s, got {level.bandwidth!r}")
        for family, column in self.math.items():
            if self.column_rate(column) is None:
                raise UsageError(f"Roofs: math[{family!r}] = {column!r} has no peak (known: {', '.join(self.peak_flops)})")

    def column(self, dtype: Optional[str], op: str = "") -> Optional[str]:
        """The peak column ``dtype`` work of ``op`` is priced at (None: this device has no
        peak for it): float32 work of a convolution, an RNN layer or a matrix product
        (:func:`op_family`) at its family's math mode (``math``); float32 attention at the
        faster of the matmul family's column (SDPA's math path is bmm) and :data:`TF32X3`
        (the memory-efficient kernel's 3xTF32), the fastest any SDPA backend reaches, so the
        bound stays a lower bound whichever the GPU picks; any other float32 work at "float32"."""
        name = dtype or DEFAULT_DTYPE
        family = op_family(op)
        if name == "float32" and family == ATTENTION:
            name = self._attention_column()
        elif name == "float32" and family is not None:
            name = self.math.get(family, name)
        return name if name in self.peak_flops or self.column_rate(name) is not None else None

    def _attention_column(self) -> str:
        """Float32 attention's column: :data:`TF32X3` where it beats the matmul family's
        column, else that column (a tie keeps the matmul one)."""
        matmul = self.math.get(MATMUL, "float32")
        tf32x3 = self.column_rate(TF32X3)
        if tf32x3 is not None and tf32x3 > (self.column_rate(matmul) or 0.0):
            return TF32X3
        return matmul

    def column_rate(self, column: str) -> Optional[float]:
        """FLOP/s of a peak column: ``peak_flops``' figure, :data:`TF32X3` a third of the TF32
        one; None where the device has none."""
        if column == TF32X3:
            tf32 = self.peak_flops.get("tfloat32")
            return None if tf32 is None else tf32 / 3
        return self.peak_flops.get(column)

    def peak(self, dtype: Optional[str], op: str = "") -> float:
        """Peak FLOP/s for ``dtype`` work of ``op``: its column's figure, else the highest
        peak of the device's columns of its kind (floating or integer), else the highest of
        all (so a bound stays a lower bound; :func:`op_time` reports the missing column)."""
        column = self.column(dtype, op)
        if column is None:
            return float(self.peak_flops[self.stand_in(dtype)])
        return float(self.column_rate(column) or 0.0)

    def has_compute_roof(self, dtype: Optional[str], op: str = "") -> bool:
        """False for work in a dtype no datasheet rates (:data:`UNRATED_DTYPES`: bool masks,
        int64 indices and routing) that this device has no column for: int8's tensor-core
        peak is no rate for them, so they are priced by their bytes only, a compute term of 0,
        which keeps a bound a lower bound. Any other dtype without a column (bfloat16 on a T4,
        int8 on given roofs) is priced at the highest peak of its kind instead."""
        return self.column(dtype, op) is not None or (dtype or DEFAULT_DTYPE) not in UNRATED_DTYPES

    def float32_math(self, ops: Iterable[str]) -> Dict[str, str]:
        """The column the float32 work of each op family among ``ops`` is priced at, in
        :data:`FAMILIES` order (``{"matmul": "float32", "attention": "tfloat32x3", "conv":
        "tfloat32"}`` on a datasheet H100 under torch's defaults): the math a bound of float32
        work assumed. Empty on a device without a TF32 roof (a T4, a CPU), where float32 has
        one math."""
        if "tfloat32" not in self.peak_flops:
            return {}
        families = {op_family(op): op for op in ops}  # None: ops no math mode governs
        return {family: self.column("float32", families[family]) or "float32" for family in FAMILIES if family in families}

    def stand_in(self, dtype: Optional[str]) -> str:
        """The column a dtype without a peak is priced at: the highest of its kind."""
        floating = "float" in (dtype or DEFAULT_DTYPE)
        same = [k for k in self.peak_flops if ("float" in k) == floating]
        return max(same or list(self.peak_flops), key=lambda k: self.peak_flops[k])

    @property
    def ridge(self) -> float:
        """FLOPs per byte where float32 compute and main-memory roofs meet."""
        return self.peak(DEFAULT_DTYPE) / self.bandwidth

    def all_levels(self) -> Tuple[MemoryLevel, ...]:
        """The cache levels, then main memory (unbounded, ``bandwidth``)."""
        return self.levels + (MemoryLevel("DRAM", None, self.bandwidth),)

    def level_for(self, working_set: float) -> MemoryLevel:
        """The fastest level whose capacity holds ``working_set`` bytes."""
        # the last level (main memory) is unbounded: some level always holds it
        return next(level for level in self.all_levels() if level.capacity is None or working_set <= level.capacity)

    def faster_capacity(self, level: MemoryLevel) -> float:
        """Bytes the levels faster than ``level`` hold together: at most that much of a working
        set can be served from them, the rest has to come from ``level``."""
        total = 0.0
        for other in self.all_levels():
            if other is level or other == level:
                return total
            total += other.capacity or 0.0
        return total

    def level_time(self, bytes_moved: float, working_set: float) -> Tuple[float, MemoryLevel]:
        """Seconds the memory system allows for ``bytes_moved`` of a ``working_set``: the bytes
        the faster levels cannot hold, over the bandwidth of the fastest level holding the
        working set (0 when that bandwidth is not published)."""
        level = self.level_for(working_set)
        if not bytes_moved or not level.bandwidth:
            return 0.0, level
        return max(0.0, bytes_moved - self.faster_capacity(level)) / level.bandwidth, level

    def describe(self) -> str:
        peaks = ", ".join(f"{k} {v / 1e9:.4g} GFLOP/s" for k, v in self.peak_flops.items())
        caches = "".join(
            f"; {lv.name} {lv.bandwidth / 1e9:.4g} GB/s" if lv.bandwidth else f"; {lv.name} bandwidth unpublished"
            for lv in self.levels
        )
        modes = "".join(f"; float32 {fam} as {col}" for fam, col in self.math.items())
        return f"{self.device or 'device'}: {peaks}; bandwidth {self.bandwidth / 1e9:.4g} GB/s{caches}{modes} ({self.source})"

    @property
    def certain(self) -> bool:
        """Whether a bound on these roofs is one: no :attr:`doubts`."""
        return not self.doubts

    def to_dict(self) -> Dict[str, Any]:
        return {
            "device": self.device,
            "source": self.source,
            "peak_flops": dict(self.peak_flops),
            "bandwidth": self.bandwidth,
            "levels": [lv.to_dict() for lv in self.levels],
            "math": dict(self.math),
            "details": dict(self.details),
            "doubts": list(self.doubts),
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Roofs:
        details = dict(data.get("details", {}))
        source = str(data.get("source", "given"))
        doubts = data.get("doubts")
        if doubts is None and source.startswith("measured (not cached"):  # written before "doubts" was a field
            doubts = details.get("not_cached", ())
        return Roofs(
            {str(k): float(v) for k, v in data["peak_flops"].items()},
            float(data["bandwidth"]),
            str(data.get("device", "")),
            source,
            details,
            tuple(MemoryLevel(str(lv["name"]), *(None if lv.get(k) is None else float(lv[k]) for k in ("capacity", "bandwidth")))
                  for lv in data.get("levels", ())),
            {str(k): str(v) for k, v in data.get("math", {}).items()},
            tuple(str(d) for d in doubts or ()),
        )


@dataclass(frozen=True)
class OpTime:
    """The roofline of one op call: ``seconds = max(compute_s, memory_s)``.

    ``column``: the peak it was priced at (None: its dtype has no peak on the device and
    the highest was used); ``level``: the memory level its working set fits."""

    compute_s: float
    memory_s: float
    column: Optional[str]
    level: str

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> Bound:
        return bound(self.compute_s, self.memory_s)


def op_time(
    roofs: Roofs, flops: float, bytes_moved: float, dtype: Optional[str] = None, op: str = "",
    working_set: Optional[float] = None,
) -> OpTime:
    """The fastest one op can run on ``roofs``: ``max(flops / peak, bytes / bandwidth)``,
    the bandwidth of the fastest level that holds ``working_set`` (default: the bytes it
    moves), for the bytes the faster levels cannot hold. A level without a published
    bandwidth sets no memory term, and work without a compute roof (:meth:`Roofs.has_compute_roof`)
    no compute term (the bound claims nothing it cannot source)."""
    column = roofs.column(dtype, op)
    compute = flops / roofs.peak(dtype, op) if flops and roofs.has_compute_roof(dtype, op) else 0.0
    memory, level = roofs.level_time(bytes_moved, bytes_moved if working_set is None else working_set)
    return OpTime(compute, memory, column, level.name)


@dataclass(frozen=True)
class AnyBound:
    """The any-implementation bound of a program: ``seconds = max(compute_s, memory_s)``,
    ``compute_s`` = its FLOPs over the peaks, ``memory_s`` = the unavoidable bytes
    (weights, buffers, inputs; gradients with backward) over the bandwidth of the level that
    holds them."""

    compute_s: float
    memory_s: float
    unavoidable_bytes: float
    level: str
    #: the part of ``unavoidable_bytes`` the levels faster than ``level`` hold: not charged to
    #: ``level`` (``Roofs.level_time``), so ``memory_s = (unavoidable - faster) / bandwidth``
    faster_bytes: float = 0.0
    #: ``level``'s bandwidth; None where it is unpublished (a GPU's L2): then no memory term
    level_bandwidth: Optional[float] = None

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    def to_dict(self) -> Dict[str, Any]:
        return {"seconds": self.seconds, **asdict(self)}


def any_implementation(roofs: Roofs, work: Iterable[Tuple[float, Optional[str], str]], unavoidable_bytes: float) -> AnyBound:
    """``max(sum of flops / peak(dtype, op), unavoidable bytes / bandwidth)`` over ``work``
    (flops, dtype, op) items: no engine, fused or not, runs the program faster."""
    compute = sum(flops / roofs.peak(dtype, op) for flops, dtype, op in work if flops and roofs.has_compute_roof(dtype, op))
    memory, level = roofs.level_time(unavoidable_bytes, unavoidable_bytes)
    faster = min(float(unavoidable_bytes), roofs.faster_capacity(level))
    return AnyBound(compute, memory, float(unavoidable_bytes), level.name, faster_bytes=faster, level_bandwidth=level.bandwidth)


def attainable(flops: float, bytes_moved: float, roofs: Roofs, dtype: Optional[str], op: str = "") -> float:
    """:func:`op_time`'s seconds: the fastest this work can run on ``roofs``."""
    return op_time(roofs, flops, bytes_moved, dtype, op).seconds


def bound(compute_s: float, memory_s: float) -> Bound:
    """"compute" when the compute roof is the binding one (ties: compute), else "memory"."""
    return "compute" if compute_s >= memory_s else "memory"


def intensity(flops: float, bytes_moved: float) -> Optional[float]:
    """Arithmetic intensity in FLOPs per byte (None when no bytes move)."""
    return flops / bytes_moved if bytes_moved else None


def efficiency(attainable_s: float, measured_s: float) -> Optional[float]:
    """``attainable_s / measured_s`` (None without a measured time, or for work the roofs
    do not see: no FLOPs and no bytes)."""
    return attainable_s / measured_s if measured_s > 0 and attainable_s > 0 else None
