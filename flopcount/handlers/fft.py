"""Fast Fourier transforms: the ``torch.fft`` functions (jit) and the three kernels they
run (dispatch: ``_fft_r2c``, ``_fft_c2r``, ``_fft_c2c``), plus ``stft`` and ``istft``.

FLOPs follow FFTW's benchmark convention (benchFFT, "FFT Benchmark Methodology"): a
complex transform of N points (N = product of the transformed sizes) costs
**5 N log2 N** real FLOPs, a real-input or real-output transform half that,
**2.5 N log2 N**, per transform (times the batch of untransformed elements). A
normalisation (``norm=`` / ``normalization``) multiplies every output component once.
No MACs: an FFT is not a contraction.
"""

from __future__ import annotations

import math
from math import prod
from typing import Any, List, Optional, Sequence, Tuple

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import first_output, is_complex
from flopcount.types import Cost, Handler, OpCall, TensorMeta

__all__ = ["C2C", "REAL", "fft_flops", "register"]

C2C = 5.0  # FLOPs per N log2 N, complex transform
REAL = 2.5  # real input (r2c) or real output (c2r)


def fft_flops(points: int, transforms: int, per: float) -> int:
    """``transforms`` FFTs of ``points`` points: per x N log2 N each (0 for N <= 1)."""
    return 0 if points <= 1 or transforms <= 0 else round(per * points * math.log2(points) * transforms)


def _norm_flops(out: Optional[TensorMeta], scaled: bool) -> int:
    """One multiply per real component of the output when a normalisation is applied."""
    return 0 if not scaled or out is None else out.numel * (2 if is_complex(out) else 1)


def _dims(value: Any, ndim: int) -> Tuple[int, ...]:
    if value is None:
        return tuple(range(ndim))
    return (value % ndim,) if isinstance(value, int) else tuple(int(d) % ndim for d in value)


def _transform(shape: Sequence[int], dims: Sequence[int], sizes: Sequence[int]) -> Tuple[int, int]:
    """(points per transform, number of transforms) for ``shape`` transformed along
    ``dims`` with logical sizes ``sizes``."""
    points = prod(sizes)
    batch = prod(s for i, s in enumerate(shape) if i not in set(dims))
    return points, batch


# -- dispatch kernels ------------------------------------------------------------------------


def _kernel(kind: float, last_size: Optional[str] = None) -> Handler:
    """_fft_r2c(self real, dim, normalization, onesided) and _fft_c2r(self complex, dim,
    normalization, last_dim_size): 2.5 N log2 N per transform (c2r: N counted on the real
    output, its last dim ``last_dim_size``); _fft_c2c(self complex, dim, normalization,
    forward): 5 N log2 N per transform; plus the normalisation."""

    def handler(call: OpCall) -> Cost:
        x = call.tensor("self")
        dims = _dims(call.arg("dim"), x.ndim)
        sizes = [x.shape[d] for d in dims]
        if last_size is not None:
            sizes[-1] = int(call.arg(last_size))
        points, batch = _transform(x.shape, dims, sizes)
        return Cost.from_flops(fft_flops(points, batch, kind) + _norm_flops(first_output(call), bool(call.arg("normalization"))))

    return handler


# -- torch.fft functions (jit) ---------------------------------------------------------------


def _scaled(norm: Optional[str], inverse: bool) -> bool:
    """Whether ``norm`` scales this direction: "backward" (default) scales the inverse,
    "forward" the forward transform, "ortho" both."""
    norm = norm or "backward"
    if norm == "ortho":
        return True
    return inverse if norm == "backward" else not inverse


def _one_dim(kind: str, inverse: bool):  # type: ignore[no-untyped-def]
    """fft/ifft (complex; a real input runs r2c), rfft/ihfft (r2c), irfft/hfft (c2r):
    one transform of n points along ``dim`` (n defaults to the input size, or
    2 * (size - 1) for a real output)."""

    def handler(call: OpCall) -> Cost:
        x = call.tensor("self")
        dim = int(call.arg("dim", -1)) % x.ndim
        n = call.arg("n")
        per = REAL if kind != "c2c" or not is_complex(x) else C2C
        if n is None:
            n = 2 * (x.shape[dim] - 1) if kind == "c2r" else x.shape[dim]
        batch = x.numel // x.shape[dim] if x.shape[dim] else 0
        flops = fft_flops(int(n), batch, per)
        return Cost.from_flops(flops + _norm_flops(first_output(call), _scaled(call.arg("norm"), inverse)))

    handler.__doc__ = f"{kind} along one dim: per x n log2 n per transform."
    return handler


def _transform_dims(call: OpCall, ndim: int, s: Any, default_dims: Optional[Tuple[int, ...]]) -> Tuple[int, ...]:
    """The dims an n-dim transform runs over: ``dim``, else the last ``len(s)`` dims when
    sizes ``s`` are given, else ``default_dims`` (None: every dim)."""
    dims_arg = call.arg("dim", default_dims)
    if dims_arg is None and s is not None:
        dims_arg = tuple(range(ndim - len(s), ndim))
    return _dims(dims_arg, ndim)


def _sizes(x: TensorMeta, s: Any, dims: Sequence[int], kind: str) -> List[int]:
    """The logical sizes along ``dims``: ``s`` (-1: the input's), else the input's, the last
    2 * (size - 1) for a real output (c2r)."""
    if s is not None:
        return [int(v) if v != -1 else x.shape[d] for v, d in zip(s, dims)]
    sizes = [x.shape[d] for d in dims]
    if kind == "c2r":
        sizes[-1] = 2 * (sizes[-1] - 1)
    return sizes


def _n_dim(kind: str, inverse: bool, default_dims: Optional[Tuple[int, ...]]):  # type: ignore[no-untyped-def]
    """fft2/fftn/ifft2/ifftn (c2c; a real input is promoted to complex first), rfft2/rfftn
    (r2c), irfft2/irfftn (c2r): one transform over
    ``dim`` with sizes ``s`` (last size 2 * (size - 1) for a real output)."""

    def handler(call: OpCall) -> Cost:
        x = call.tensor("self")
        s = call.arg("s")
        dims = _transform_dims(call, x.ndim, s, default_dims)
        sizes = _sizes(x, s, dims, kind)
        flops = fft_flops(*_transform(x.shape, dims, sizes), C2C if kind == "c2c" else REAL)
        return Cost.from_flops(flops + _norm_flops(first_output(call), _scaled(call.arg("norm"), inverse)))

    handler.__doc__ = f"{kind} over several dims: per x N log2 N per transform, N = prod(sizes)."
    return handler


def _stft(call: OpCall) -> Cost:
    """stft: a window multiply (n_fft per frame, when a window is given) and one FFT of
    n_fft points per frame and signal (real input: r2c, complex: c2c). Frames and
    signals come from the output (..., freq, frames[, 2])."""
    x, out = call.tensor("self"), first_output(call)
    n_fft = int(call.arg("n_fft"))
    if out is None:
        raise ValueError("stft: the output shape is needed to count its frames")
    frames_dim = -2 if not is_complex(out) and out.ndim >= 3 and out.shape[-1] == 2 else -1
    transforms = out.shape[frames_dim] * prod(x.shape[:-1])  # frames x signals
    per = C2C if is_complex(x) else REAL
    window = transforms * n_fft if isinstance(call.arg("window"), TensorMeta) else 0
    norm = _norm_flops(out, bool(call.arg("normalized")))
    return Cost.from_flops(fft_flops(n_fft, transforms, per) + window + norm)


def _istft_length(n_fft: int, hop: int, frames: int, center: bool, length: Any) -> int:
    """The samples istft keeps of its overlap-added signal: n_fft + hop (frames - 1), less
    n_fft // 2 at each end when ``center``, cut to ``length`` (a longer ``length`` is zero
    padding after the division)."""
    expected = n_fft + hop * (frames - 1)
    start = n_fft // 2 if center else 0
    if length is not None:
        end = start + int(length)
    else:
        end = expected - start if center else expected
    return max(min(end, expected) - start, 0)


def _istft(call: OpCall) -> Cost:
    """istft (jit; the dispatch tracer sees the ops it runs, SpectralOps.cpp): per signal
    and frame an inverse FFT of n_fft points (c2r, or c2c with ``return_complex``) and its
    normalisation (always: by n or, ``normalized``, by sqrt n), the window multiply (n_fft;
    complex 6), the overlap-add (n_fft per frame, ``unfold_backward``); the window envelope
    (square n_fft, overlap-add n_fft per frame); its check on the L kept samples (abs L,
    min L, lt and equal 1); the division by it (L per signal; complex 11)."""
    x = call.tensor("self")
    n_fft = int(call.arg("n_fft"))
    hop = int(call.arg("hop_length") or n_fft // 4)
    frames, signals = x.shape[-1], prod(x.shape[:-2])
    transforms = signals * frames
    complex_out = bool(call.arg("return_complex"))
    per_sample = transforms * n_fft
    inverse = fft_flops(n_fft, transforms, C2C if complex_out else REAL) + per_sample * (2 if complex_out else 1)
    window = per_sample * (6 if complex_out else 1)
    envelope = n_fft + frames * n_fft
    kept = _istft_length(n_fft, hop, frames, bool(call.arg("center", True)), call.arg("length"))
    check = 2 * kept + 2
    divide = signals * kept * (11 if complex_out else 1)
    return Cost.from_flops(inverse + window + per_sample + envelope + check + divide)


def _hermitian_n_dim(kind: str, inverse: bool, default_dims: Optional[Tuple[int, ...]]):  # type: ignore[no-untyped-def]
    """hfft2/hfftn (c2c over the leading dims, then c2r over the last) and ihfft2/ihfftn
    (r2c over the last dim, a conjugation, then c2c over the leading dims): the two
    stages torch runs, each with its own normalisation."""

    def handler(call: OpCall) -> Cost:
        x = call.tensor("self")
        s = call.arg("s")
        dims = _transform_dims(call, x.ndim, s, default_dims)
        last = dims[-1]
        shape = list(x.shape)
        for d, size in zip(dims, _sizes(x, s, dims, kind)):
            shape[d] = size
        lead = prod(shape[d] for d in dims[:-1])
        n_last = shape[last]
        half = list(shape)
        half[last] = n_last // 2 + 1
        scaled = _scaled(call.arg("norm"), inverse)
        real_last = fft_flops(n_last, prod(shape) // max(n_last, 1), REAL)
        complex_lead = fft_flops(lead, prod(half) // max(lead, 1), C2C) if len(dims) > 1 else 0
        half_meta = TensorMeta(tuple(half), "complex64")
        norm = _norm_flops(half_meta, scaled) if len(dims) > 1 else 0
        if kind == "c2r":
            norm += _norm_flops(TensorMeta(tuple(shape), "float32"), scaled)
            return Cost.from_flops(complex_lead + real_last + norm)
        norm += _norm_flops(half_meta, scaled)
        conj = prod(half) if len(dims) > 1 else 0  # conj_physical of the r2c output
        return Cost.from_flops(real_last + conj + complex_lead + norm)

    handler.__doc__ = f"{kind} hermitian transform over several dims, as its two stages."
    return handler


#: per-element FLOPs of the window functions (their textbook formulas)
WINDOWS = {
    "aten::hann_window": 4,  # 0.5 - 0.5 cos(2 pi k / N): scale, cos, multiply, subtract
    "aten::hamming_window": 4,  # alpha - beta cos(2 pi k / N)
    "aten::blackman_window": 8,  # 0.42 - 0.5 cos(2 pi k/N) + 0.08 cos(4 pi k/N)
    "aten::bartlett_window": 4,  # 1 - |2k/N - 1|
    "aten::kaiser_window": 8,  # i0(beta sqrt(1 - (2k/N - 1)^2)) / i0(beta)
}


def _window(call: OpCall) -> Cost:
    out = first_output(call)
    length = out.numel if out is not None else int(call.arg("window_length"))
    return Cost.from_flops(WINDOWS[call.op] * length)


def register(registry: HandlerRegistry) -> None:
    registry.register("aten::_fft_r2c", _kernel(REAL))
    registry.register("aten::_fft_c2r", _kernel(REAL, "last_dim_size"))
    registry.register("aten::_fft_c2c", _kernel(C2C))
    # each transform's 1-D, 2-D (the last two dims by default) and n-D spellings; hfft/ihfft's
    # n-dim forms run two stages (_hermitian_n_dim)
    for name, kind, inverse in (("fft", "c2c", False), ("ifft", "c2c", True), ("rfft", "r2c", False),
                                ("ihfft", "r2c", True), ("irfft", "c2r", True), ("hfft", "c2r", False)):
        registry.register(f"aten::fft_{name}", _one_dim(kind, inverse))
        n_dim = _hermitian_n_dim if name in ("hfft", "ihfft") else _n_dim
        registry.register(f"aten::fft_{name}2", n_dim(kind, inverse, (-2, -1)))
        registry.register(f"aten::fft_{name}n", n_dim(kind, inverse, None))
    registry.register("aten::stft", _stft)
    registry.register("aten::istft", _istft)
    registry.register(list(WINDOWS), _window)
    # conj_physical negates the imaginary part: one FLOP per complex element
    registry.register(
        ["aten::_conj_physical", "aten::conj_physical"], lambda call: Cost.from_flops(call.tensor("self").numel)
    )
    registry.register_zero(["aten::fft_fftshift", "aten::fft_ifftshift", "aten::fft_fftfreq", "aten::fft_rfftfreq"])
