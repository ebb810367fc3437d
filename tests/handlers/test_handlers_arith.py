"""Handlers for ops that do arithmetic and used to be unsupported (issue #9 finding 8):
FFT, linear algebra, distances, grid_sample, antialiased resize, CTC, quantile, angle,
complex operands, nn.Bilinear's _trilinear, and the zero-cost packing ops.

Each formula is derived by hand in the test; every op also runs under every tracer with
batch > 1 and non-contiguous inputs, and the tracers must agree exactly."""

from __future__ import annotations

import warnings
from math import ceil, log2

import pytest
import torch
import torch.nn.functional as F
from conftest import Fn, assert_same_state, snapshot
from torch import nn

from flopcount import count_flops
from flopcount.core.registry import KNOWN_ZERO
from flopcount.handlers import build_default_registry

REG = build_default_registry()
TRACERS = ("jit", "dispatch", "auto")




def counts(fn, *inputs, tracers=TRACERS):
    """(macs, flops) under every tracer; asserts they agree and nothing is unsupported."""
    found = {}
    for tracer in tracers:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = count_flops(Fn(fn), tuple(inputs), tracer=tracer)
        assert result.unsupported_ops() == {}, (tracer, result.unsupported_ops())
        found[tracer] = (result.macs, result.flops)
    assert len(set(found.values())) == 1, found
    return found[tracers[0]]


def nc(*shape, dtype=torch.float32):
    """A non-contiguous tensor of ``shape`` (the transpose of a contiguous one)."""
    t = torch.randn(*shape[:-2], shape[-1], shape[-2], dtype=dtype)
    return t.transpose(-1, -2)


# -- FFT: FFTW's 5 N log2 N (complex) and 2.5 N log2 N (real) --------------------------------


def c2c(n, transforms):
    return 5 * n * log2(n) * transforms


def real(n, transforms):
    return 2.5 * n * log2(n) * transforms


def test_fft_family_formulas():
    x = nc(3, 8, 16)  # (3, 8, 16), non-contiguous
    z = nc(3, 8, 16, dtype=torch.complex64)
    # rfft along the last dim: 24 transforms of 16 points, no normalisation (forward, "backward" norm)
    assert counts(torch.fft.rfft, x) == (0, round(real(16, 24)))
    # fft of complex input: c2c; the default norm scales nothing forward
    assert counts(torch.fft.fft, z) == (0, round(c2c(16, 24)))
    # ifft scales by 1/n: one multiply per real component of the (3, 8, 16) complex output
    assert counts(torch.fft.ifft, z) == (0, round(c2c(16, 24)) + 2 * 3 * 8 * 16)
    # irfft: output length 2 * (16 - 1) = 30, real output scaled by 1/n
    assert counts(torch.fft.irfft, z) == (0, round(real(30, 24)) + 3 * 8 * 30)
    # fft2 of real input: promoted to complex, one 128-point transform per batch entry
    assert counts(torch.fft.fft2, x) == (0, round(c2c(8 * 16, 3)))
    # rfftn over all dims with sizes s: 3 * 8 * 10 points, one transform
    assert counts(lambda t: torch.fft.rfftn(t, s=(3, 8, 10)), x) == (0, round(real(240, 1)))
    # "ortho" scales both ways: fft of real input along dim 1 (8 points) runs r2c (onesided=False)
    assert counts(lambda t: torch.fft.fft(t, dim=1, norm="ortho"), x) == (0, round(real(8, 48)) + 2 * 3 * 8 * 16)


# Input (3, 8, 16). R(n, t) / C(n, t): t real / complex transforms of n points (FFTW above).
# A normalisation adds one multiply per real component of the stage's output: complex (3, 8, 16)
# = 768, complex half spectrum (3, 8, 9) = 432. Hermitian n-dim transforms run two stages
# (r2c over the last dim, a conj_physical of the (3, 8, 9) half spectrum, c2c over the rest),
# each normalised on its own output.
R = lambda n, t: round(real(n, t))
C = lambda n, t: round(c2c(n, t))
HALF = 3 * 8 * 9


@pytest.mark.parametrize(
    "name, default, sized",
    [
        # default: a real input to fft runs r2c (onesided=False), 24 transforms along dim -1.
        # n=12, dim=1, norm="ortho": 3 x 16 = 48 transforms of 12 points, scaled output
        # (3, 12, 16) complex = 1152 (full) or (3, 7, 16) = 672 (onesided)
        ("fft", R(16, 24), R(12, 48) + 1152),
        ("ifft", R(16, 24) + 768, R(12, 48) + 1152),
        ("rfft", R(16, 24), R(12, 48) + 672),
        ("ihfft", R(16, 24) + 2 * HALF, R(12, 48) + 672),
        # default: promoted to complex, one 128-point transform of the last two dims per batch entry (3).
        # s=(6, 4), dim=(0, 2), norm="forward": 24 points, 8 transforms (dim 1), forward scaled:
        # output (6, 8, 4) complex = 384 or onesided (6, 8, 3) = 288
        ("fft2", C(128, 3), C(24, 8) + 384),
        ("ifft2", C(128, 3) + 768, C(24, 8)),
        ("rfft2", R(128, 3), R(24, 8) + 288),
        # r2c of 16 points x 24, conj of (3, 8, 9), c2c of 8 points x 27; two normalisations.
        # sized: r2c of 4 points x 48, conj of (6, 8, 3) = 144, c2c of 6 points x 24; "forward" leaves ihfft unscaled
        ("ihfft2", R(16, 24) + HALF + C(8, 27) + 2 * 2 * HALF, R(4, 48) + 144 + C(6, 24)),
        ("fftn", C(384, 1), C(24, 8) + 384),
        ("ifftn", C(384, 1) + 768, C(24, 8)),
        ("rfftn", R(384, 1), R(24, 8) + 288),
        # c2c over dims (0, 1): 24 points x 9
        ("ihfftn", R(16, 24) + HALF + C(24, 9) + 2 * 2 * HALF, R(4, 48) + 144 + C(6, 24)),
    ],
)
def test_fft_real_input_tracers_agree(name, default, sized):
    fn = getattr(torch.fft, name)
    assert counts(fn, nc(3, 8, 16)) == (0, default)
    if name.endswith(("n", "2")):
        assert counts(lambda t: fn(t, s=(6, 4), dim=(0, 2), norm="forward"), nc(3, 8, 16)) == (0, sized)
    else:
        assert counts(lambda t: fn(t, n=12, dim=1, norm="ortho"), nc(3, 8, 16)) == (0, sized)


@pytest.mark.parametrize(
    "name, expected",
    [
        # complex (3, 8, 16); a real output has n = 2 x (16 - 1) = 30 on the last dim, (3, 8, 30) = 720 values
        ("fft", C(16, 24)),
        ("ifft", C(16, 24) + 768),
        ("irfft", R(30, 24) + 720),
        ("hfft", R(30, 24)),  # a forward transform: "backward" norm leaves it unscaled
        ("fft2", C(128, 3)),
        ("ifft2", C(128, 3) + 768),
        ("irfft2", R(8 * 30, 3) + 720),
        # hfft2: c2c over dim -2 (8 points x 3 x 16 = 48), then c2r of 30 points x 24
        ("hfft2", C(8, 48) + R(30, 24)),
        ("fftn", C(384, 1)),
        ("ifftn", C(384, 1) + 768),
        ("irfftn", R(3 * 8 * 30, 1) + 720),
        ("hfftn", C(24, 16) + R(30, 24)),  # c2c over dims (0, 1): 24 points x 16
    ],
)
def test_fft_complex_input_tracers_agree(name, expected):
    fn = getattr(torch.fft, name)
    assert counts(fn, nc(3, 8, 16, dtype=torch.complex64)) == (0, expected)


def test_stft_and_windows():
    signal = torch.randn(2, 64)
    # center=True pads 4 each side: 72 samples, hop 2 (n_fft // 4) -> 1 + (72 - 8) // 2 = 33 frames
    frames = 1 + (72 - 8) // 2
    assert counts(lambda s: torch.stft(s, 8, return_complex=True), signal) == (0, round(real(8, 2 * frames)))
    # hann window: 4 FLOPs per sample (scale, cos, multiply, subtract), window multiply per frame sample,
    # normalized: one multiply per real component of the (2, 5, frames) complex output
    frames = 1 + (72 - 8) // 3
    expected = 4 * 8 + 2 * frames * 8 + round(real(8, 2 * frames)) + 2 * 2 * 5 * frames
    fn = lambda s: torch.stft(s, 8, hop_length=3, window=torch.hann_window(8), normalized=True, return_complex=True)
    assert counts(fn, signal) == (0, expected)


# -- linear algebra: LAPACK counts -------------------------------------------------------------


def test_linalg_lapack_formulas():
    n, b = 6, 2
    a = nc(b, n, n)
    rhs = nc(b, n, 3)
    lu = 2 * n**3 / 3
    assert counts(torch.linalg.solve, a, rhs) == (0, round(b * (lu + 2 * n * n * 3)))
    assert counts(torch.linalg.inv, a) == (0, b * 2 * n**3)
    assert counts(torch.linalg.det, a) == (0, round(b * (lu + n)))
    spd = torch.eye(n) * n
    assert counts(lambda m: torch.linalg.cholesky(m + spd), a)[1] == round(b * n**3 / 3) + b * n * n
    assert counts(lambda m: torch.linalg.solve_triangular(m, rhs, upper=True), a) == (0, b * n * n * 3)
    tall = nc(b, 9, 4)
    m_, k_ = 9, 4
    geqrf = 2 * m_ * k_**2 - 2 * k_**3 / 3
    orgqr = 4 * m_ * k_ * k_ - 2 * (m_ + k_) * k_**2 + 4 * k_**3 / 3
    assert counts(torch.linalg.qr, tall) == (0, round(b * (geqrf + orgqr)))
    assert counts(lambda m: torch.linalg.qr(m, mode="r"), tall) == (0, round(b * geqrf))
    assert counts(lambda m: torch.linalg.svd(m, full_matrices=False), tall) == (0, b * (14 * m_ * k_**2 + 8 * k_**3))
    assert counts(torch.linalg.eigh, a) == (0, b * 9 * n**3)
    assert counts(torch.linalg.eig, a) == (0, b * 25 * n**3)
    # complex: 4x the real count
    za, zb = nc(b, n, n, dtype=torch.complex64), nc(b, n, 3, dtype=torch.complex64)
    assert counts(torch.linalg.solve, za, zb) == (0, round(4 * b * (lu + 2 * n * n * 3)))


def test_linalg_values_only_under_jit():
    # without a gradient torch computes eigen/singular values only (docs/conventions.md, "Values
    # only"; every tracer: tests/tracers/test_values_only_linalg.py)
    n, b = 6, 2
    a = nc(b, n, n)
    assert count_flops(Fn(torch.linalg.eigvalsh), a, tracer="jit").flops == round(b * 4 * n**3 / 3)
    assert count_flops(Fn(torch.linalg.eigvals), a, tracer="jit").flops == b * 10 * n**3
    assert count_flops(Fn(torch.linalg.svdvals), a, tracer="jit").flops == round(b * (4 * n**3 - 4 * n**3 / 3))


# Batch 2 of the LAPACK counts above (docs/conventions.md "Linear algebra"), per matrix:
# A (5, 4): m = 5, n = k = 4; A (4, 4): n = 4; r right-hand sides. Each op rounds its own total.
_LU_SQ = 2 * 4**3 / 3  # getrf of a 4 x 4
_GEQRF = 2 * 5 * 4**2 - 2 * 4**3 / 3  # 5 x 4
_THIN_SVD = 14 * 5 * 4**2 + 8 * 4**3


@pytest.mark.parametrize(
    "fn, shapes, expected",
    [
        (torch.linalg.lu, [(2, 5, 4)], round(2 * (5 * 4**2 - 4**3 / 3))),  # m n^2 - n^3 / 3
        (torch.linalg.lu_factor, [(2, 4, 4)], round(2 * _LU_SQ)),
        (torch.inverse, [(2, 4, 4)], 2 * 2 * 4**3),  # getrf + getri: 2 n^3
        (torch.det, [(2, 4, 4)], round(2 * (_LU_SQ + 4))),  # + the diagonal product
        (torch.linalg.slogdet, [(2, 4, 4)], round(2 * (_LU_SQ + 3 * 4))),  # + |u_ii|, log, sum
        (torch.logdet, [(2, 4, 4)], round(2 * (_LU_SQ + 3 * 4)) + 2 * 2),  # + sign test and select
        # thin SVD + a divide per singular value (k) + V diag(1/s) U^H (2 n k m)
        (torch.linalg.pinv, [(2, 5, 4)], round(2 * (_THIN_SVD + 4 + 2 * 4 * 4 * 5))),
        (lambda a: torch.linalg.pinv(a, hermitian=True), [(2, 4, 4)], 2 * (9 * 4**3 + 4 + 2 * 4**3)),
        # geqrf + Q^H B (4 m r k - 2 r k^2, r = 3) + trsm (k^2 r)
        (
            lambda a, b: torch.linalg.lstsq(a, b).solution,
            [(2, 5, 4), (2, 5, 3)],
            round(2 * (_GEQRF + 4 * 5 * 3 * 4 - 2 * 3 * 4**2 + 4**2 * 3)),
        ),
        (lambda a, b: torch.cholesky_solve(b, a), [(2, 4, 4), (2, 4, 3)], 2 * 2 * 4**2 * 3),  # 2 n^2 r
        (torch.cholesky_inverse, [(2, 4, 4)], round(2 * 2 * 4**3 / 3)),  # potri
        (
            lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b),
            [(2, 4, 4), (2, 4, 3)],
            round(2 * _LU_SQ) + 2 * 2 * 4**2 * 3,
        ),
        # geqrf, then orgqr 4 m n k - 2 (m + n) k^2 + 4 k^3 / 3 with m = 5, n = k = 4
        (
            lambda a: torch.linalg.householder_product(*torch.geqrf(a)),
            [(2, 5, 4)],
            round(2 * _GEQRF) + round(2 * (4 * 5 * 4 * 4 - 2 * 9 * 4**2 + 4 * 4**3 / 3)),
        ),
        # geqrf, then ormqr on C (5, 3) from the left: 4 m n k - 2 n k^2, n = 3, k = 4
        (
            lambda a, c: torch.ormqr(*torch.geqrf(a), c),
            [(2, 5, 4), (2, 5, 3)],
            round(2 * _GEQRF) + 2 * (4 * 5 * 3 * 4 - 2 * 3 * 4**2),
        ),
        (lambda a: torch.linalg.svd(a), [(2, 5, 4)], 2 * (4 * 5**2 * 4 + 8 * 5 * 4**2 + 9 * 4**3)),  # full
        (torch.svd, [(2, 5, 4)], 2 * _THIN_SVD),  # some=True: thin
    ],
)
def test_linalg_tracers_agree(fn, shapes, expected):
    assert counts(fn, *(nc(*s) for s in shapes)) == (0, expected)


@pytest.mark.parametrize("power, matmuls", [(2, 1), (3, 2), (13, 5), (16, 4)])
def test_matrix_power_counts_torch_binary_powering(power, matmuls):
    # 13 = 0b1101: 3 squarings + 2 products; 16: 4 squarings
    b, k = 2, 4
    assert counts(lambda a: torch.linalg.matrix_power(a, power), nc(b, k, k)) == (
        matmuls * b * k**3,
        2 * matmuls * b * k**3,
    )


# -- distances -------------------------------------------------------------------------------


def test_cdist_direct_and_matmul_paths():
    b, r1, r2, m = 2, 5, 7, 3
    x1, x2 = nc(b, r1, m), nc(b, r2, m)
    # direct: per pair m subtracts, squares, adds + one sqrt
    assert counts(torch.cdist, x1, x2) == (0, b * r1 * r2 * (3 * m + 1))
    assert counts(lambda a, c: torch.cdist(a, c, p=1), x1, x2) == (0, b * r1 * r2 * 3 * m)
    # more than 25 rows: torch's matmul form, [-2 x1, |x1|^2, 1] @ [x2, 1, |x2|^2]^T
    r1 = 30
    x1 = nc(b, r1, m)
    macs = b * r1 * r2 * (m + 2)
    extra = b * (2 * r1 * m + 2 * r2 * m + r1 * m + 2 * r1 * r2)  # norms, -2 scale, clamp + sqrt
    assert counts(torch.cdist, x1, x2) == (macs, 2 * macs + extra)


def test_pdist_pairwise_cosine():
    n, m = 6, 3
    assert counts(F.pdist, torch.randn(m, n).t()) == (0, n * (n - 1) // 2 * (3 * m + 1))
    a, c = nc(4, 6, 5), nc(4, 6, 5)
    # pairwise_distance: subtract, add eps (2N), 2-norm over the last dim (2N + M)
    assert counts(F.pairwise_distance, a, c) == (0, 2 * 120 + 2 * 120 + 24)
    # cosine similarity over dim 1 of (4, 6, 5): N = 120, M = 20; 8N + 4M
    assert counts(lambda u, v: F.cosine_similarity(u, v, dim=1), a, c) == (0, 8 * 120 + 4 * 20)
    assert counts(lambda u, v: F.cosine_similarity(u, v, dim=-1), a, c[:1]) == (0, 8 * 120 + 4 * 24)


# -- sampling --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, per_element, per_location", [("bilinear", 7, 8), ("nearest", 0, 2), ("bicubic", 35, 48)]
)
def test_grid_sample_2d(mode, per_element, per_location):
    x, grid = nc(2, 3, 5, 6), torch.rand(2, 4, 7, 2) * 2 - 1
    locations, channels = 2 * 4 * 7, 3
    expected = locations * (2 * 3 + per_location) + locations * channels * per_element
    assert counts(lambda a, g: F.grid_sample(a, g, mode=mode, align_corners=False), x, grid) == (0, expected)


def test_grid_sample_3d():
    x, grid = torch.randn(2, 3, 5, 6, 4), torch.rand(2, 4, 7, 3, 3) * 2 - 1
    locations = 2 * 4 * 7 * 3
    assert counts(lambda a, g: F.grid_sample(a, g, align_corners=False), x, grid) == (
        0,
        locations * (9 + 22) + locations * 3 * 15,
    )


def test_antialiased_resize_windows():
    # width 8 -> 4 (scale 2, bilinear support 1 x 2 = 2), height unchanged (pass skipped):
    # centres 1, 3, 5, 7 cover [0, 3), [1, 5), [3, 7), [5, 8): 3 + 4 + 4 + 3 = 14 taps per row,
    # 2 FLOPs per tap, rows = 2 x 3 x 5
    x = nc(2, 3, 5, 8)
    assert counts(lambda a: F.interpolate(a, size=(5, 4), mode="bilinear", antialias=True), x) == (0, 2 * 14 * 30)
    # bicubic (support 2 x scale), both dims: width 8 -> 3 (scale 8/3, support 16/3), centres 4/3, 4, 20/3
    # cover [0, 7), [0, 8), [1, 8): 22 taps x 30 rows; then height 5 -> 4 (scale 5/4, support 5/2) on
    # (2, 3, 5, 3): centres 5/8, 15/8, 25/8, 35/8 cover [0, 3), [0, 4), [1, 5), [2, 5): 14 taps x 18 columns
    bicubic = lambda a: F.interpolate(a, size=(4, 3), mode="bicubic", antialias=True)
    assert counts(bicubic, x) == (0, 2 * (22 * 30 + 14 * 2 * 3 * 3))
    # upscaling by 1.5 (scale 2/3 < 1: support 1): width 8 -> 12, windows 1, 2 x 10, 1 = 22 taps x 30 rows;
    # height 5 -> 7: 1, 2 x 6 = 13 taps x (2 x 3 x 12) columns
    upscale = lambda a: F.interpolate(a, scale_factor=1.5, mode="bilinear", antialias=True)
    assert counts(upscale, x) == (0, 2 * (22 * 30 + 13 * 2 * 3 * 12))


# -- losses and reductions -------------------------------------------------------------------


def test_ctc_loss_lattice():
    time, batch, classes = 10, 2, 6
    log_probs = torch.randn(time, batch, classes).log_softmax(-1)
    targets = torch.randint(1, classes, (batch, 4))
    # int lengths: sum over b of T_b (2 S_b + 1) cells, 13 FLOPs each; sum reduction adds B
    fn = lambda lp, t: F.ctc_loss(lp, t, [10, 8], [4, 3], reduction="sum")
    assert counts(fn, log_probs, targets) == (0, 13 * (10 * 9 + 8 * 7) + batch)
    # tensor lengths (values unknown): T x (2 x padded + 1) per sequence; mean adds 2B + 1
    lengths = torch.full((batch,), time, dtype=torch.long), torch.full((batch,), 4, dtype=torch.long)
    fn = lambda lp, t: F.ctc_loss(lp, t, *lengths)
    assert counts(fn, log_probs, targets) == (0, 13 * batch * time * 9 + 2 * batch + 1)


@pytest.mark.parametrize("interpolation, per_output", [("linear", 6), ("lower", 2), ("nearest", 2), ("midpoint", 5)])
def test_quantile(interpolation, per_output):
    x = nc(3, 8, 5)  # (3, 8, 5)
    n, length, rows = 120, 8, 15
    sort = n * ceil(log2(length))
    # sort + isnan + any (2N) + q * (L - 1) + per-output interpolation
    fn = lambda t: torch.quantile(t, 0.3, dim=1, interpolation=interpolation)
    assert counts(fn, x) == (0, sort + 2 * n + 1 + per_output * rows)
    # Q = 3 quantiles along the last dim: L = 5 (sort 3 passes), 24 rows, O = 72 outputs
    q = torch.tensor([0.2, 0.5, 0.9])
    fn = lambda t: torch.quantile(t, q, dim=-1, keepdim=True, interpolation=interpolation)
    assert counts(fn, x) == (0, n * ceil(log2(5)) + 2 * n + 3 + per_output * 72)
    # nanquantile of the whole tensor: L = N = 120 (7 passes), one output, (k + 2) per output
    fn = lambda t: torch.nanquantile(t, 0.3, interpolation=interpolation)
    assert counts(fn, x) == (0, n * ceil(log2(n)) + 2 * n + per_output + 2)


# -- pointwise and complex -------------------------------------------------------------------


def test_angle_and_complex_elementwise():
    x = nc(3, 4, 5)
    z = nc(3, 4, 5, dtype=torch.complex64)
    n = 60
    assert counts(torch.angle, x) == (0, n)  # a sign select
    assert counts(torch.angle, z) == (0, n)  # atan2(imag, real)
    assert counts(torch.add, z, z) == (0, 2 * n)  # two real adds
    assert counts(torch.mul, z, z) == (0, 6 * n)  # 4 multiplies + 2 adds
    assert counts(torch.div, z, z) == (0, 11 * n)  # 6 multiplies, 3 adds, 2 divides
    assert counts(torch.abs, z) == (0, n)  # hypot
    assert counts(torch.polar, x.abs(), x) == (0, 4 * n)
    assert counts(torch.complex, x, x) == (0, 0)


def test_complex_contractions_are_four_real_macs():
    b, n, k, m = 3, 4, 5, 6
    za, zb = nc(b, n, k, dtype=torch.complex64), nc(b, k, m, dtype=torch.complex64)
    macs = 4 * b * n * k * m
    assert counts(torch.matmul, za, zb) == (macs, 2 * macs)
    assert counts(lambda p, q: torch.einsum("bij,bjk->bik", p, q), za, zb) == (macs, 2 * macs)
    w = torch.randn(m, k, dtype=torch.complex64)
    assert counts(lambda p: F.linear(p, w), za) == (4 * b * n * k * m, 8 * b * n * k * m)


# -- nn.Bilinear: _trilinear under dispatch == aten::bilinear under jit ----------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("train", [True, False])
def test_bilinear_same_under_every_tracer(bias, train):
    layer = nn.Bilinear(5, 6, 7, bias=bias).train(train)
    x1, x2 = nc(2, 3, 5), torch.randn(2, 6, 3).transpose(1, 2)  # 3-D, non-contiguous
    rows = 6
    macs = rows * 7 * 5 * 6
    before = snapshot(layer)
    for tracer in TRACERS:
        result = count_flops(layer, (x1, x2), tracer=tracer)
        assert result.unsupported_ops() == {}
        # the bias is a separate aten::add in nn.Bilinear's decomposition: rows x out FLOPs
        assert (result.macs, result.flops) == (macs, 2 * macs + (rows * 7 if bias else 0)), tracer
    back = count_flops(layer, (x1, x2), tracer="dispatch", backward=True)
    assert back.unsupported_ops() == {}
    # the inputs need no gradient: grad_weight is one _trilinear of the forward's MACs, grad_bias a
    # sum of the (rows, out) gradient
    assert back.by_phase("macs")["backward"] == macs
    assert back.by_phase()["backward"] == 2 * macs + (rows * 7 if bias else 0)
    assert_same_state(layer, before)


def test_scaled_mm_and_trilinear_registered():
    for op in ("aten::_trilinear", "aten::_grouped_mm", "aten::_scaled_grouped_mm", "aten::_scaled_mm"):
        assert callable(REG.resolve(op)), op


# -- zero-cost ops that used to be unsupported -----------------------------------------------


@pytest.mark.parametrize(
    "op",
    [
        "aten::_pack_padded_sequence",
        "aten::_pad_packed_sequence",
        "aten::matrix_H",
        "aten::_nested_tensor_from_mask_left_aligned",
    ],
)
def test_zero_cost_ops_are_known(op):
    assert REG.resolve(op) == KNOWN_ZERO


class PackedLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 5, batch_first=True)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0]


@pytest.mark.parametrize("tracer", TRACERS)
def test_packed_lstm_is_strict_clean(tracer):
    model = PackedLSTM()
    lengths = torch.tensor([6, 4, 2])
    result = count_flops(model, (torch.randn(3, 6, 4), lengths), tracer=tracer, strict=True)
    # S = sum of lengths = 12 positions; MACs = S x (w_ih + w_hh)
    assert result.macs == 12 * (4 * 5 * 4 + 4 * 5 * 5)


def test_matrix_h():
    x = nc(3, 4, 4)
    assert counts(lambda t: t.mH @ t, x) == (3 * 4 * 4 * 4, 2 * 3 * 4 * 4 * 4)


# -- composite losses jit records whole: the same cost as their decomposition -----------------


def test_composite_losses():
    b, d = 4, 5
    n = b * d
    a, c, e = nc(b, d), nc(b, d), nc(b, d)
    sign = torch.sign(torch.randn(b))
    # 3 products + 3 sums over D (6N), then 13 per-row ops, mean over B (B + 1)
    assert counts(nn.CosineEmbeddingLoss(), a, c, sign) == (0, 6 * n + 13 * b + b + 1)
    # margin - x, clamp, two ne/where selects, add; mean (N + 1)
    assert counts(nn.HingeEmbeddingLoss(), a, torch.sign(torch.randn(b, d))) == (0, 7 * n + n + 1)
    assert counts(nn.MarginRankingLoss(), a[:, 0], c[:, 0], sign) == (0, 5 * b + b + 1)
    # exp(x) - t x; full adds Stirling's term (10 per element)
    assert counts(nn.PoissonNLLLoss(), a, torch.rand(b, d)) == (0, 3 * n + n + 1)
    assert counts(nn.PoissonNLLLoss(log_input=False, full=True, reduction="sum"), a.abs(), torch.rand(b, d)) == (
        0,
        14 * n + n,
    )
    # two pairwise distances (sub, add eps, square, sum, sqrt: 4N + B each), margin, sub, clamp
    assert counts(nn.TripletMarginLoss(), a, c, e) == (0, 2 * (4 * n + b) + 3 * b + b + 1)
    # p = 1 and swap: three distances (sub, add eps, |.|, sum: 4N each), the swap's minimum (B)
    assert counts(nn.TripletMarginLoss(swap=True, p=1), a, c, e) == (0, 3 * 4 * n + b + 3 * b + b + 1)
    # upper bound C^2 per sample, a divide per sample, mean
    assert counts(nn.MultiLabelMarginLoss(), a, torch.randint(0, d, (b, d))) == (0, b * d * d + b + b + 1)
    assert counts(nn.MultiMarginLoss(), a, torch.randint(0, d, (b,))) == (0, 4 * n + b + b + 1)


# conv (2, 4, 8, 8) output = 512 elements, 512 x 3 x 9 = 13824 MACs per gradient
_CONV_BACKWARD = 2 * (2 * 13824) + 512 + 2 * 3 * 10 * 10  # grad_input + grad_weight, grad_bias, unpad (2, 3, 10, 10)


@pytest.mark.parametrize(
    "module, inputs, backward",
    [
        # one add per grad_output element (2, 3, 4, 4)
        (nn.FractionalMaxPool2d(2, output_size=(4, 4)), (torch.randn(2, 3, 8, 8),), 2 * 3 * 16),
        (nn.RReLU(), (torch.randn(2, 3, 10),), 2 * 60),  # select, multiply by the slope
        # per grad_output element (2, 2): sigmoid 4, g s, g a s (1 - s) 4
        (nn.GLU(), (torch.randn(2, 4),), 9 * 4),
        (nn.Conv2d(3, 4, 3, padding_mode="reflect", padding=1), (torch.randn(2, 3, 8, 8),), _CONV_BACKWARD),
        (nn.Conv2d(3, 4, 3, padding_mode="replicate", padding=1), (torch.randn(2, 3, 8, 8),), _CONV_BACKWARD),
        # 2N + N for p = 2, N = 20
        (nn.MultiMarginLoss(p=2), (torch.randn(4, 5), torch.randint(0, 5, (4,))), 3 * 20),
        # the pair bound N C + a scale per element N
        (nn.MultiLabelMarginLoss(), (torch.randn(4, 5), torch.randint(0, 5, (4, 5))), 20 * 5 + 20),
        (
            nn.CTCLoss(),
            (
                torch.randn(10, 2, 6).log_softmax(-1),
                torch.randint(1, 6, (2, 4)),
                torch.full((2,), 10),
                torch.full((2,), 4),
            ),
            # 16 per lattice cell, B T (2 S + 1) = 2 x 10 x 9 cells; the mean's backward divides the
            # (2,) gradient by the target lengths and by B
            16 * 2 * 10 * 9 + 2 + 2,
        ),
    ],
)
def test_backward_ops_have_handlers(module, inputs, backward):
    inputs = tuple(t.clone().requires_grad_() if t.is_floating_point() else t for t in inputs)
    result = count_flops(module.train(), inputs, tracer="dispatch", backward=True)
    assert result.unsupported_ops() == {}
    assert result.by_phase()["backward"] == backward


# Antialiased (2, 3, 9, 11) -> (5, 7), torch's windows in exact arithmetic (two window edges fall on
# integers). Width 11 -> 7 (scale 11/7): bilinear windows 2, 3, 4, 3, 3, 3, 2 = 20, bicubic (support
# 22/7) 4, 6, 6, 7, 6, 5, 4 = 38, over 2 x 3 x 9 = 54 rows; height 9 -> 5 (scale 9/5): bilinear 3, 4,
# 3, 3, 3 = 16, bicubic 5, 6, 7, 6, 4 = 28, over 2 x 3 x 7 = 42 columns; 2 FLOPs per tap
_AA_BILINEAR = 2 * (20 * 54 + 16 * 42)
_AA_BICUBIC = 2 * (38 * 54 + 28 * 42)


@pytest.mark.parametrize(
    "fn, shapes, backward",
    [
        # L = 56 locations, d = 2, C = 3, bilinear w = 8, t = 7: L (3d + w) + L C t + d L C t
        (lambda x, g: F.grid_sample(x, g, align_corners=False), [(2, 3, 5, 6), (2, 4, 7, 2)], 56 * 14 + 3 * 56 * 3 * 7),
        # L = 168, d = 3, w = 22, t = 15
        (
            lambda x, g: F.grid_sample(x, g, align_corners=False),
            [(2, 3, 5, 6, 4), (2, 4, 7, 3, 3)],
            168 * 31 + 4 * 168 * 3 * 15,
        ),
        (lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", antialias=True), [(2, 3, 9, 11)], _AA_BILINEAR),
        (lambda x: F.interpolate(x, size=(5, 7), mode="bicubic", antialias=True), [(2, 3, 9, 11)], _AA_BICUBIC),
        # _cdist_backward once per input: B r1 r2 (3m + 1) each
        (torch.cdist, [(2, 5, 3), (2, 7, 3)], 2 * (2 * 5 * 7 * 10)),
        (F.pdist, [(6, 3)], 6 * 5 * 10),  # n (n - 1) (3m + 1)
        # abs of the (3, 9) complex spectrum: sgn (3 each) and grad x sgn (a complex mul, 6 each); then
        # the gradient is zero-padded to 16 bins and transformed back: one c2c of 16 points x 3 rows
        (lambda x: torch.fft.rfft(x).abs(), [(3, 16)], 27 * (3 + 6) + round(c2c(16, 3))),
        # gB: lu_solve with the adjoint (2 n^2 r); gA = -gB X^H: a (4, 3) x (3, 4) bmm per matrix, a negation
        (lambda a, b: torch.linalg.solve(a, b), [(2, 4, 4), (2, 4, 3)], 2 * (2 * 16 * 3) + 2 * (2 * 4 * 3 * 4) + 32),
        # grad_x (10, 16) x (3, 16, 8) and grad_w (8, 10) x (10, 16): 10 x 8 x 16 MACs each
        (
            lambda x, w: torch._grouped_mm(x, w, offs=torch.tensor([3, 7, 10], dtype=torch.int32)),
            [(10, 8), (3, 8, 16)],
            2 * 2 * 10 * 8 * 16,
        ),
    ],
)
def test_new_ops_backward(fn, shapes, backward):
    inputs = tuple(torch.randn(*s, requires_grad=True) for s in shapes)
    result = count_flops(Fn(fn), inputs, tracer="dispatch", backward=True)
    assert result.unsupported_ops() == {}
    assert result.by_phase()["backward"] == backward


def test_antialias_backward_equals_forward_taps():
    # the backward scatters through the same filter windows: the same 2 FLOPs per tap
    x = torch.randn(2, 3, 5, 8, requires_grad=True)
    result = count_flops(
        Fn(lambda a: F.interpolate(a, size=(5, 4), mode="bilinear", antialias=True)),
        x,
        tracer="dispatch",
        backward=True,
    )
    assert result.by_phase() == {"forward": 2 * 14 * 30, "backward": 2 * 14 * 30}


def test_complex_reductions():
    z = nc(3, 4, 5, dtype=torch.complex64)
    n = 60
    assert counts(torch.sum, z) == (0, 2 * n)  # complex adds
    assert counts(lambda t: t.mean(dim=1), z) == (0, 2 * (n + 15))  # sum + a divide per output, doubled
    assert counts(torch.prod, z) == (0, 6 * n)  # complex products


def test_trapezoid_diff_cov_cross():
    y = nc(4, 10)  # 4 rows of 10 samples
    rows, length = 4, 10
    # uniform spacing: sum (N) + end-point half terms (4 per row)
    assert counts(torch.trapezoid, y) == (0, 40 + 4 * rows)
    # sample points: diff(x) (L - 1), add, multiply, sum (3 per interval), halve (1 per row)
    assert counts(torch.trapezoid, y, torch.randn(length)) == (0, 9 + 3 * rows * 9 + rows)
    assert counts(torch.cumulative_trapezoid, y) == (0, 3 * rows * 9)
    # second difference along dim 0 of (5, 10): 4 x 10 + 3 x 10 subtracts
    assert counts(lambda t: torch.diff(t, n=2, dim=0), nc(5, 10)) == (0, 70)
    # cov of 4 variables x 10 observations: mean (N + V), check (1), centre (N),
    # V^2 O MACs, divide by O - 1 (V^2)
    v, o = 4, 10
    assert counts(torch.cov, y) == (v * v * o, 2 * v * v * o + 2 * 40 + v + 1 + v * v)
    assert counts(torch.corrcoef, y) == (v * v * o, 2 * v * v * o + 2 * 40 + v + 1 + v * v + v + 3 * v * v)
    for weights in ({"fweights": torch.randint(1, 3, (o,))}, {"aweights": torch.rand(o)}):
        for correction in (0, 1):
            fn = lambda t, c=correction, w=weights: torch.cov(t, correction=c, **w)
            assert counts(fn, y)[0] == v * v * o
    # cross product: 6 multiplies + 3 subtracts per 3-vector
    assert counts(torch.linalg.cross, torch.randn(4, 3), torch.randn(4, 3)) == (0, 36)
