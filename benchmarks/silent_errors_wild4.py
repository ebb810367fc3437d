"""Silent wrong counts on real code, fourth pass (branch wild4): patterns wild3 did not cover,
counted by every tracer (forward and ``backward=True``, batch > 1, non-contiguous and
channels_last inputs, train and eval) and compared with independent oracles:
``torch.utils.flop_counter.FlopCounterMode`` run live on the real forward (and backward), and a
hand count from docs/conventions.md where FlopCounterMode does not count the op (norms,
resampling, linear algebra, FFT, reductions, CPU flash attention...).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/silent_errors_wild4.py`` (about 2 min of CPU).
Two kinds of line (helpers in ``_silent_errors.py``, shared with wild3's sweep):
``fcm=`` lines compare 2 x MACs per tracer with FlopCounterMode (or ``hand=``, the contractions'
FLOPs by hand); ``hand=`` lines without ``fcm=`` compare all FLOPs (or one operator's) with the
hand count. "DIFF" lines are explained in docs/performance.md (branch wild4): FlopCounterMode's
gaps (CPU flash attention, ``mv``-like products run as ``mul``) and its grouped-convolution
backward, documented conventions, and what is left.
"""

import math
import warnings

import torch
import torch.nn.functional as F
from _silent_errors import Ops, check, check_flops
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_packed_sequence
from torch.utils.checkpoint import checkpoint

warnings.simplefilter("ignore")
torch.manual_seed(0)


def log2c(n):
    return math.ceil(math.log2(n))


# ---- scaled_dot_product_attention: scale, causal Lq != Lk, masks broadcast over heads, GQA, dropout
B, H, L, S, E = 2, 4, 5, 7, 8
q, k, v = torch.randn(B, H, L, E), torch.randn(B, H, S, E), torch.randn(B, H, S, E)
kg, vg = torch.randn(B, 2, S, E), torch.randn(B, 2, S, E)
SD = 2 * B * H * L * S * 2 * E
sdpa = F.scaled_dot_product_attention
check("sdpa scale=", Ops(lambda q, k, v: sdpa(q, k, v, scale=0.3)), (q, k, v), expect=SD)
check("sdpa is_causal Lq<Lk", Ops(lambda q, k, v: sdpa(q, k, v, is_causal=True)), (q, k, v), expect=SD)
check("sdpa float mask (L,S)", Ops(lambda q, k, v, m: sdpa(q, k, v, attn_mask=m)), (q, k, v, torch.randn(L, S)), expect=SD)
bmask = torch.rand(B, 1, L, S) > 0.3
bmask[..., 0] = True
check("sdpa bool mask (B,1,L,S)", Ops(lambda q, k, v, m: sdpa(q, k, v, attn_mask=m)), (q, k, v, bmask), expect=SD)
check("sdpa gqa causal", Ops(lambda q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True)), (q, kg, vg), expect=SD)
check("sdpa gqa mask", Ops(lambda q, k, v, m: sdpa(q, k, v, attn_mask=m, enable_gqa=True)), (q, kg, vg, torch.randn(L, S)), expect=SD)


class DropAttn(nn.Module):
    def forward(s, q, k, v):
        return sdpa(q, k, v, dropout_p=0.1 if s.training else 0.0)


check("sdpa dropout_p train", DropAttn().train(), (q, k, v), expect=SD)
check("sdpa Ev != E", Ops(lambda q, k, v: sdpa(q, k, v)), (q, k, torch.randn(B, H, S, 6)), expect=2 * B * H * L * S * (E + 6))
check("sdpa 3-D", Ops(lambda q, k: sdpa(q, k, k)), (q[0], k[0]), expect=2 * H * L * S * 2 * E)
check("sdpa q transposed", Ops(lambda q, k, v: sdpa(q, k, v)), (torch.randn(B, L, H, E).transpose(1, 2), k, v), expect=SD)
grads = (q.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_())
check("sdpa", Ops(lambda q, k, v: sdpa(q, k, v)), grads, backward=True, expect=SD * 7 // 2)  # fused bwd 2.5x
check("sdpa gqa", Ops(lambda q, k, v: sdpa(q, k, v, enable_gqa=True)), (q, kg.requires_grad_(), vg.requires_grad_()), backward=True, expect=SD * 7 // 2)
check("sdpa learnable mask (math path)", Ops(lambda q, k, v, m: sdpa(q, k, v, attn_mask=m)), (q, k, v, torch.randn(L, S).requires_grad_()), backward=True)

# ---- nn.MultiheadAttention: cross-attention, added keys (bias_kv, zero_attn), both masks, training
E, L, S = 16, 5, 7
qx, kx, vx = torch.randn(B, L, E), torch.randn(B, S, E), torch.randn(B, S, E)


class Cross(nn.Module):
    def __init__(s, m, **kw):
        super().__init__()
        s.m, s.kw = m, kw

    def forward(s, q, k, v):
        return s.m(q, k, v, **s.kw)[0]


def mha_macs(added=0, lq=L, lk=S, batch=B):
    return (2 * batch * lq + 2 * batch * lk) * E * E + 2 * batch * H * lq * (lk + added) * (E // H)


mha = nn.MultiheadAttention(E, H, batch_first=True).eval()
check("MHA cross need_weights=False", Cross(mha, need_weights=False), (qx, kx, kx), expect=2 * mha_macs())
check("MHA cross average_attn_weights=False", Cross(mha, average_attn_weights=False), (qx, kx, kx))
check("MHA cross need_weights=True", Cross(mha), (qx, kx, vx))
for bias_kv, zero_attn in ((True, False), (False, True), (True, True)):
    m = nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=bias_kv, add_zero_attn=zero_attn).eval()
    added = bias_kv + zero_attn
    tag = f"bias_kv={bias_kv} zero_attn={zero_attn}"
    check(f"MHA cross {tag} (fixed)", Cross(m, need_weights=False), (qx, kx, kx), expect=2 * mha_macs(added))
    check(f"MHA cross 3 inputs {tag} (fixed)", Cross(m), (qx, kx, vx), expect=2 * mha_macs(added))
kpm = torch.zeros(B, S, dtype=torch.bool)
kpm[0, 5:] = True
am = torch.zeros(L, S, dtype=torch.bool)
am[:, 6] = True
m = nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=True, add_zero_attn=True).eval()
check_flops("MHA both masks + added keys (fixed: raised)", Cross(m, key_padding_mask=kpm, attn_mask=am), (qx, kx, kx),
            B * S + L * S, op="aten::masked_fill_")
check_flops("MHA both masks + added keys: merge", Cross(m, key_padding_mask=kpm, attn_mask=am), (qx, kx, kx),
            B * H * L * (S + 2), op="aten::add")
mt = nn.MultiheadAttention(E, H, batch_first=True, dropout=0.1).train()
check("MHA train dropout need_weights", Cross(mt), (qx, kx, kx))
check("MHA train dropout no weights", Cross(mt, need_weights=False), (qx, kx, kx), expect=2 * mha_macs())
check("MHA", Cross(mha, need_weights=False), (qx, kx, kx), backward=True,
      expect=2 * (mha_macs() + (B * L + 2 * B * S + 2 * B * L) * E * E + 5 * B * H * L * S * (E // H)))
check("MHA unbatched (L, E)", Cross(nn.MultiheadAttention(E, H).eval(), need_weights=False), (qx[0], kx[0], kx[0]),
      expect=2 * mha_macs(batch=1))

# ---- TransformerEncoderLayer fast path and norm_first, nested path, decoder, nn.Transformer


class NoGrad(nn.Module):
    def __init__(s, m):
        super().__init__()
        s.m = m

    def forward(s, x, padding=None):
        with torch.no_grad():
            return s.m(x) if padding is None else s.m(x, src_key_padding_mask=padding)


TEL_MACS = 3 * 5 * (E * 3 * E + E * E + 2 * E * 32) + 3 * H * 5 * 5 * 2 * (E // H)
for norm_first in (False, True):
    layer = nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
    check(f"TEL eval fast path norm_first={norm_first}", NoGrad(layer.eval()), (torch.randn(3, 5, E),), expect=2 * TEL_MACS)
    check(f"TEL train norm_first={norm_first}", layer.train(), (torch.randn(3, 5, E),), expect=2 * TEL_MACS)
mask = torch.zeros(3, 5, dtype=torch.bool)
mask[0, 3:] = True
enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True, norm_first=True), 2,
                            enable_nested_tensor=False).eval()
check("TE norm_first padding mask", NoGrad(enc), (torch.randn(3, 5, E), mask), expect=2 * 2 * TEL_MACS)
enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True, activation="gelu"), 2).eval()
check("TE nested path gelu", NoGrad(enc), (torch.randn(3, 5, E), mask), expect=2 * 2 * TEL_MACS)


class Dec(nn.Module):
    def __init__(s):
        super().__init__()
        s.d = nn.TransformerDecoderLayer(E, H, 32, dropout=0.0, batch_first=True).eval()

    def forward(s, t, mem):
        return s.d(t, mem, tgt_is_causal=True, tgt_mask=nn.Transformer.generate_square_subsequent_mask(t.size(1)))


# self-attention on 15 tokens, cross-attention to 21 memory tokens, feed-forward; the encoder on 21 tokens
DEC = 15 * 16 * 64 + 3 * H * 25 * 2 * 4 + 15 * 16 * 32 + 21 * 16 * 32 + 3 * H * 35 * 2 * 4 + 15 * 16 * 64
ENC = 21 * 16 * 64 + 3 * H * 49 * 2 * 4 + 21 * 16 * 64
check("TDL causal", Dec(), (torch.randn(3, L, E), torch.randn(3, S, E)), expect=2 * DEC)
check("nn.Transformer", nn.Transformer(E, H, 1, 1, 32, dropout=0.0, batch_first=True).eval(), (torch.randn(3, S, E), torch.randn(3, L, E)),
      expect=2 * (DEC + ENC))

# ---- convolutions: transposed 1-D/3-D, "same" with every padding_mode, channels_last, conv_tbc
x = torch.randn(2, 4, 9)
check("F.conv_transpose1d g2 d2 op1", Ops(lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1, output_padding=1, groups=2, dilation=2)),
      (x, torch.randn(4, 3, 3)), expect=2 * 2 * 4 * 9 * 3 * 3)
x3 = torch.randn(2, 4, 5, 6, 7)
check("ConvTranspose3d g2", nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=(1, 0, 1), groups=2), (x3,),
      expect=2 * x3.numel() * 3 * 27)
check("ConvTranspose3d g2 (FCM ignores groups)", nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, groups=2, bias=False), (x3,),
      backward=True, expect=2 * 2 * x3.numel() * 3 * 27)
for mode in ("zeros", "reflect", "replicate", "circular"):
    conv = nn.Conv2d(4, 6, 3, padding="same", padding_mode=mode)
    check(f"conv same {mode}", conv, (torch.randn(2, 4, 8, 8),), expect=2 * 2 * 6 * 64 * 36)
    check(f"conv same {mode}", conv, (torch.randn(2, 4, 8, 8),), backward=True)
check("conv1d same reflect even dilated", nn.Conv1d(4, 6, 4, padding="same", padding_mode="reflect", dilation=3), (torch.randn(2, 4, 20),),
      expect=2 * 2 * 6 * 20 * 16)
check("conv3d same circular", nn.Conv3d(4, 6, (2, 3, 4), padding="same", padding_mode="circular"), (x3,), expect=2 * 2 * 6 * 210 * 4 * 24)
cl = nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect").to(memory_format=torch.channels_last)
check("conv reflect channels_last", cl, (torch.randn(2, 4, 8, 8).to(memory_format=torch.channels_last),), expect=2 * 2 * 6 * 64 * 36)


class TBC(nn.Module):
    def __init__(s):
        super().__init__()
        s.w, s.b = nn.Parameter(torch.randn(3, 4, 6)), nn.Parameter(torch.randn(6))

    def forward(s, x):
        return torch.conv_tbc(x, s.w, s.b, 1)


check("conv_tbc (fixed: unsupported)", TBC(), (torch.randn(5, 2, 4),), expect=2 * 5 * 2 * 6 * 4 * 3)

# ---- unfold / fold, Tensor.unfold windows
xf = torch.randn(2, 3, 8, 8)
check_flops("F.unfold", Ops(lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=2)), (xf,), 0)
cols = torch.randn(2, 18, 25)
check_flops("F.fold", Ops(lambda c: F.fold(c, (8, 9), (2, 3), padding=1, stride=2)), (cols,), cols.numel())
check_flops("F.unfold", Ops(lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=2)), (xf.clone().requires_grad_(),), 2 * 18 * 15,
            backward=True)
xw = torch.randn(2, 3, 20)
check_flops("Tensor.unfold windows mean", Ops(lambda x: x.unfold(-1, 5, 2).mean(-1)), (xw,), 2 * 3 * 8 * 5 + 2 * 3 * 8)
check("Tensor.unfold windows @ w", Ops(lambda x, w: x.unfold(-1, 5, 2) @ w), (xw, torch.randn(5)), expect=2 * 2 * 3 * 8 * 5)
check_flops("Tensor.unfold windows @ w (fixed: unsupported)", Ops(lambda x, w: x.unfold(-1, 5, 2) @ w), (xw.clone().requires_grad_(), torch.randn(5)),
            2 * 2 * 2 * 3 * 8 * 5 + 2 * 3 * 8 * 5, backward=True)

# ---- interpolate: bilinear/bicubic, align_corners, size vs scale_factor, antialias; grid_sample, affine_grid
xi = torch.randn(2, 3, 6, 8)
for mode, per in (("bilinear", 9), ("bicubic", 35)):
    for ac in (False, True):
        check_flops(f"interpolate {mode} ac={ac} size", Ops(lambda x, m=mode, a=ac: F.interpolate(x, size=(11, 13), mode=m, align_corners=a)),
                    (xi,), per * 6 * 11 * 13)
        check_flops(f"interpolate {mode} ac={ac} scale 1.5", Ops(lambda x, m=mode, a=ac: F.interpolate(x, scale_factor=1.5, mode=m, align_corners=a)),
                    (xi,), per * 6 * 9 * 12)
check_flops("interpolate bilinear recompute_scale_factor (fixed, wild4rest: jit +4)",
            Ops(lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear", recompute_scale_factor=True)), (xi,), 9 * 6 * 10 * 13)
check_flops("interpolate trilinear recompute_scale_factor (fixed, wild4rest: jit +6)",
            Ops(lambda x: F.interpolate(x, scale_factor=1.5, mode="trilinear", recompute_scale_factor=True)), (torch.randn(1, 1, 3, 4, 5),), 21 * 4 * 6 * 7)
check_flops("a user's torch.tensor(size).float() stays counted under jit",
            Ops(lambda x: x * (torch.tensor(x.size(-1)).float() * torch.tensor(1.5)).floor()), (xi,), xi.numel() + 2)
check_flops("interpolate linear 1-D", Ops(lambda x: F.interpolate(x, scale_factor=2.5, mode="linear")), (torch.randn(2, 3, 7),), 3 * 6 * 17)
check_flops("interpolate trilinear", Ops(lambda x: F.interpolate(x, size=(4, 5, 6), mode="trilinear")), (torch.randn(2, 3, 3, 4, 5),), 21 * 6 * 120)
check_flops("interpolate nearest-exact", Ops(lambda x: F.interpolate(x, scale_factor=2, mode="nearest-exact")), (xi,), 0)
# antialias down (6, 8) -> (3, 5): width pass windows 3+4+4+4+3 = ... summed by torch's rule (test_handlers_arith)
check_flops("interpolate bilinear channels_last", Ops(lambda x: F.interpolate(x, size=(11, 13), mode="bilinear")),
            (xi.to(memory_format=torch.channels_last),), 9 * 6 * 11 * 13)
check_flops("interpolate bicubic", Ops(lambda x: F.interpolate(x, size=(11, 13), mode="bicubic")), (xi.clone().requires_grad_(),),
            2 * 35 * 6 * 11 * 13, backward=True)
grid = torch.rand(2, 5, 7, 2) * 2 - 1
for mode, (t, w) in (("bilinear", (7, 8)), ("nearest", (0, 2)), ("bicubic", (35, 48))):
    for pm in ("zeros", "border", "reflection"):
        check_flops(f"grid_sample {mode} {pm}", Ops(lambda x, g, m=mode, p=pm: F.grid_sample(x, g, mode=m, padding_mode=p, align_corners=False)),
                    (xi, grid), 70 * (2 * 3 + w) + 70 * 3 * t)
theta = torch.randn(2, 2, 3)
check_flops("affine_grid (fixed: unsupported)", Ops(lambda t: F.affine_grid(t, (2, 3, 5, 7), align_corners=False)), (theta,),
            2 * 2 * 35 * 3 * 2 + 2 * (5 + 7))
check_flops("affine_grid 3-D (fixed: unsupported)", Ops(lambda t: F.affine_grid(t, (2, 3, 4, 5, 6), align_corners=True)), (torch.randn(2, 3, 4),),
            2 * 2 * 120 * 4 * 3)
check("affine_grid (bwd bmm = fwd size)", Ops(lambda t: F.affine_grid(t, (2, 3, 5, 7), align_corners=True)), (theta.clone().requires_grad_(),),
      backward=True, expect=2 * 2 * 2 * 35 * 3 * 2, tracers=("auto", "dispatch"))


class STN(nn.Module):
    def __init__(s):
        super().__init__()
        s.loc = nn.Linear(3 * 6 * 8, 6)

    def forward(s, x):
        t = s.loc(x.flatten(1)).view(-1, 2, 3)
        return F.grid_sample(x, F.affine_grid(t, x.size(), align_corners=False), align_corners=False)


check("spatial transformer (fixed: affine_grid)", STN(), (xi,), expect=2 * (2 * 144 * 6 + 2 * 48 * 3 * 2))
check("spatial transformer (fixed: affine_grid)", STN(), (xi,), backward=True, expect=2 * 2 * (2 * 144 * 6 + 2 * 48 * 3 * 2))

# ---- linear algebra (LAPACK counts, conventions.md): n = 5, r = 2, batch 3; m x n = 7 x 4
A = torch.randn(3, 5, 5)
A = A @ A.transpose(-1, -2) + 5 * torch.eye(5)
b, M = torch.randn(3, 5, 2), torch.randn(3, 7, 4)
la = torch.linalg
qr_r = 2 * 7 * 16 - 2 * 64 / 3
orgqr = 4 * 7 * 4 * 4 - 2 * 11 * 16 + 4 * 64 / 3
check_flops("linalg.solve", Ops(lambda A, b: la.solve(A, b)), (A, b), round(3 * (2 * 125 / 3 + 2 * 25 * 2)))
check_flops("linalg.solve left=False", Ops(lambda A, b: la.solve(A, b, left=False)), (A, torch.randn(3, 2, 5)), round(3 * (2 * 125 / 3 + 2 * 25 * 2)))
check_flops("linalg.cholesky", Ops(lambda A: la.cholesky(A)), (A,), round(3 * 125 / 3))
check_flops("linalg.qr reduced", Ops(lambda M: la.qr(M)[0]), (M,), round(3 * (qr_r + orgqr)))
check_flops("linalg.qr r", Ops(lambda M: la.qr(M, mode="r")[1]), (M,), round(3 * qr_r))
check_flops("linalg.svd thin", Ops(lambda M: la.svd(M, full_matrices=False)[0]), (M,), 3 * (14 * 7 * 16 + 8 * 64))
check_flops("linalg.svd full", Ops(lambda M: la.svd(M)[0]), (M,), 3 * (4 * 49 * 4 + 8 * 7 * 16 + 9 * 64))
# values only in the user's run (no gradient): every tracer since branch wild5 (auto/dispatch counted the vectors)
check_flops("linalg.svdvals (values only)", Ops(lambda M: la.svdvals(M)), (M,), round(3 * (4 * 7 * 16 - 4 * 64 / 3)))
check_flops("linalg.inv", Ops(lambda A: la.inv(A)), (A,), 3 * 2 * 125)
check_flops("linalg.lstsq", Ops(lambda M, b: la.lstsq(M, b).solution), (M, torch.randn(3, 7, 2)), round(3 * (qr_r + 4 * 7 * 2 * 4 - 2 * 2 * 16 + 16 * 2)))
# SVD drivers (fixed, wild4rest: priced as QR): Golub-Reinsch LS 4 M k^2 + 8 k^3, U^H B 4 M k r - 2 k^2 r, V diag(1/s) k r + 2 k^2 r
for drv in ("gelsd", "gelss"):
    check_flops(f"linalg.lstsq driver={drv} (fixed, wild4rest)", Ops(lambda M, b, d=drv: la.lstsq(M, b, driver=d).solution),
                (M, torch.randn(3, 7, 2)), 3 * (4 * 7 * 16 + 8 * 64 + 4 * 7 * 4 * 2 - 2 * 16 * 2 + 4 * 2 + 2 * 16 * 2))
check_flops("linalg.lstsq driver=gels", Ops(lambda M, b: la.lstsq(M, b, driver="gels").solution), (M, torch.randn(3, 7, 2)),
            round(3 * (qr_r + 4 * 7 * 2 * 4 - 2 * 2 * 16 + 16 * 2)))
check_flops("linalg.eigh", Ops(lambda A: la.eigh(A)[1]), (A,), 3 * 9 * 125)
check_flops("linalg.det", Ops(lambda A: la.det(A)), (A,), round(3 * (2 * 125 / 3 + 5)))
check_flops("linalg.solve_triangular", Ops(lambda A, b: la.solve_triangular(A.tril(), b, upper=False)), (A, b), 3 * 25 * 2)
check_flops("cholesky_solve", Ops(lambda A, b: torch.cholesky_solve(b, la.cholesky(A))), (A, b), round(3 * (125 / 3 + 2 * 25 * 2)))
check_flops("linalg.lu_solve", Ops(lambda A, b: la.lu_solve(*la.lu_factor(A), b)), (A, b), round(3 * (2 * 125 / 3 + 2 * 25 * 2)))
check("linalg.matrix_power 5", Ops(lambda A: la.matrix_power(A, 5)), (A,), expect=2 * 3 * 3 * 125)
check_flops("linalg.solve complex64 (4x)", Ops(lambda A, b: la.solve(A, b)), (A.to(torch.complex64), b.to(torch.complex64)),
            round(4 * 3 * (2 * 125 / 3 + 2 * 25 * 2)))

# ---- FFT convolution (FFTW convention: r2c/c2r 2.5 N log2 N, c2c 5 N log2 N)
xs, ks = torch.randn(2, 3, 16, 16), torch.randn(3, 16, 16)
r2c = 2.5 * 256 * 8
check_flops("rfft2 convolution", Ops(lambda x, k: torch.fft.irfft2(torch.fft.rfft2(x) * torch.fft.rfft2(k), s=(16, 16))), (xs, ks),
            round(6 * r2c + 3 * r2c + 6 * 2 * 3 * 16 * 9 + 6 * r2c + 2 * 3 * 256))
check_flops("fft2 ortho", Ops(lambda x: torch.fft.fft2(x, norm="ortho").abs()), (xs,), round(6 * 5 * 256 * 8 + 2 * 6 * 256 + 6 * 256))

# ---- scans, sorts, selections
x = torch.randn(4, 6, 10)
N = x.numel()
check_flops("cumsum", Ops(lambda x: torch.cumsum(x, 1)), (x,), N)
check_flops("cumsum transposed", Ops(lambda x: torch.cumsum(x.transpose(0, 2), 0)), (x,), N)
check_flops("logcumsumexp", Ops(lambda x: torch.logcumsumexp(x, 2)), (x,), 4 * N)
check_flops("cummax", Ops(lambda x: torch.cummax(x, 1)[0]), (x,), N)
check_flops("cumsum", Ops(lambda x: torch.cumsum(x, 1)), (x.clone().requires_grad_(),), 2 * N, backward=True)
check_flops("sort dim 1", Ops(lambda x: torch.sort(x, dim=1)[0]), (x,), N * log2c(6))
check_flops("sort stable descending", Ops(lambda x: torch.sort(x, descending=True, stable=True)[0]), (x,), N * log2c(10))
check_flops("argsort dim 0", Ops(lambda x: torch.argsort(x, dim=0).float()), (x,), N * log2c(4))
check_flops("msort (fixed: jit sorted the last dim)", Ops(torch.msort), (x,), N * log2c(4))
check_flops("topk", Ops(lambda x: torch.topk(x, 3)[0]), (x,), N)
check_flops("topk transposed largest=False", Ops(lambda x: torch.topk(x.transpose(1, 2), 2, dim=1, largest=False)[0]), (x,), N)
check_flops("kthvalue", Ops(lambda x: torch.kthvalue(x, 2, dim=1)[0]), (x,), N)
check_flops("where(x > 0, x, 0.0)", Ops(lambda x: torch.where(x > 0, x, 0.0)), (x,), 2 * N)
check_flops("where(x > 0, 1.0, -1.0)", Ops(lambda x: torch.where(x > 0, 1.0, -1.0)), (x,), 2 * N)
check_flops("where broadcast", Ops(lambda x, y: torch.where(x > 0, x, y)), (x, torch.randn(6, 1)), 2 * N)

# ---- einsum bilinear forms and diagonals, kron, tensordot, inner, complex products, _int_mm
a, W, c = torch.randn(4, 6), torch.randn(6, 7), torch.randn(4, 7)
check("einsum bi,ij,bj->b", Ops(lambda a, W, c: torch.einsum("bi,ij,bj->b", a, W, c)), (a, W, c), expect=2 * (4 * 6 * 7 + 4 * 7))
check("einsum bi,ij,bj->b", Ops(lambda a, W, c: torch.einsum("bi,ij,bj->b", a, W, c)), (a, W.clone().requires_grad_(), c), backward=True)
check_flops("einsum trace ii (fixed: n^2)", Ops(lambda a: torch.einsum("ii", a)), (torch.randn(7, 7),), 7)
check_flops("einsum bii->b (fixed: b n^2)", Ops(lambda a: torch.einsum("bii->b", a)), (torch.randn(3, 6, 6),), 18)
check_flops("einsum bii,bj->bj (fixed)", Ops(lambda a, w: torch.einsum("bii,bj->bj", a, w)), (torch.randn(3, 5, 5), torch.randn(3, 4)), 15 + 24)
check("einsum batch broadcast size 1", Ops(lambda a, b: torch.einsum("bij,bjk->bik", a, b)), (torch.randn(1, 4, 5), torch.randn(3, 5, 6)),
      expect=2 * 3 * 4 * 5 * 6)
check_flops("kron (fixed: jit unsupported)", Ops(torch.kron), (torch.randn(2, 3), torch.randn(4, 5)), 120)
check_flops("kron 3-D x 2-D (fixed)", Ops(torch.kron), (torch.randn(2, 3, 2), torch.randn(4, 5)), 240)
check("tensordot dims=2", Ops(lambda a, b: torch.tensordot(a, b, dims=2)), (torch.randn(3, 4, 5), torch.randn(4, 5, 6)), expect=2 * 3 * 20 * 6)
check("inner 3-D x 2-D", Ops(torch.inner), (torch.randn(3, 4, 5), torch.randn(6, 5)), expect=2 * 12 * 6 * 5)
check("addmv transposed", Ops(lambda v, m, x: torch.addmv(v, m.t(), x, beta=0.5)), (torch.randn(4), torch.randn(5, 4), torch.randn(5)), expect=40)
check("addbmm", Ops(lambda m, a, b: torch.addbmm(m, a, b)), (torch.randn(4, 6), torch.randn(3, 4, 5), torch.randn(3, 5, 6).requires_grad_()),
      backward=True, expect=2 * 2 * 360)
check("einsum complex64 (4 real MACs)", Ops(lambda a, b: torch.einsum("bij,bjk->bik", a, b)),
      (torch.randn(3, 4, 5, dtype=torch.complex64), torch.randn(3, 5, 6, dtype=torch.complex64)), expect=4 * 2 * 360)
check("matmul complex64 broadcast", Ops(lambda a, b: a @ b), (torch.randn(2, 1, 4, 5, dtype=torch.complex64), torch.randn(3, 5, 6, dtype=torch.complex64)),
      expect=4 * 2 * 720)
check("linear complex64", Ops(F.linear), (torch.randn(4, 5, dtype=torch.complex64), torch.randn(6, 5, dtype=torch.complex64)), expect=4 * 2 * 120)
i8a, i8b = torch.randint(-128, 127, (32, 64), dtype=torch.int8), torch.randint(-128, 127, (64, 16), dtype=torch.int8)
check("torch._int_mm int8 (fixed: unsupported)", Ops(torch._int_mm), (i8a, i8b), expect=2 * 32 * 64 * 16)

# ---- EmbeddingBag modes and per_sample_weights
idx, offsets, psw = torch.randint(0, 20, (12,)), torch.tensor([0, 5, 9]), torch.rand(12)
for mode in ("sum", "mean", "max"):
    check_flops(f"EmbeddingBag {mode}", nn.EmbeddingBag(20, 8, mode=mode), (idx, offsets), 96 + (24 if mode == "mean" else 0))
bag = nn.EmbeddingBag(20, 8, mode="sum")
check_flops("EmbeddingBag per_sample_weights", Ops(lambda i, o, p: bag(i, o, per_sample_weights=p)), (idx, offsets, psw), 192,
            tracers=("auto", "dispatch"))
check_flops("EmbeddingBag per_sample_weights (fixed: unsupported)", Ops(lambda i, o, p: bag(i, o, per_sample_weights=p)),
            (idx, offsets, psw.clone().requires_grad_()), 192, backward=True, op="aten::_embedding_bag_per_sample_weights_backward")
check_flops("EmbeddingBag 2-D mean", nn.EmbeddingBag(20, 8, mode="mean"), (torch.randint(0, 20, (3, 4)),), 96 + 24)
check_flops("EmbeddingBag include_last_offset (mean)", nn.EmbeddingBag(20, 8, include_last_offset=True), (idx, torch.tensor([0, 5, 9, 12])), 96 + 24)

# ---- norms on non-contiguous / channels_last input; the backward of a norm whose input needs no gradient
xn = torch.randn(2, 6, 5, 7)
N = xn.numel()


def norm(n, groups, affine=True):
    return 4 * n + 2 * groups + 2 * n + 2 * groups + (2 * n if affine else 0)


check_flops("GroupNorm channels_last", nn.GroupNorm(3, 6), (xn.to(memory_format=torch.channels_last),), norm(N, 6))
check_flops("InstanceNorm2d affine transposed", nn.InstanceNorm2d(6, affine=True), (xn.transpose(2, 3),), norm(N, 12))
check_flops("LayerNorm transposed", nn.LayerNorm(7), (xn.transpose(1, 2),), norm(N, 60))
check_flops("LayerNorm((5,7)) no affine permuted", nn.LayerNorm((5, 7), elementwise_affine=False), (xn.permute(1, 0, 2, 3),), norm(N, 12, False))
check_flops("RMSNorm transposed", nn.RMSNorm(7), (xn.transpose(1, 2),), 3 * N + 3 * 60 + N)
check_flops("BatchNorm2d channels_last train", nn.BatchNorm2d(6), (xn.to(memory_format=torch.channels_last),), norm(N, 6))


class Tabular(nn.Module):
    def __init__(s):
        super().__init__()
        s.bn, s.fc = nn.BatchNorm1d(16), nn.Linear(16, 4)

    def forward(s, x):
        return s.fc(s.bn(x))


class FrozenStem(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem, s.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)
        s.stem.requires_grad_(False)

    def forward(s, x):
        return s.bn(s.stem(x))


BNB = "aten::native_batch_norm_backward"
check_flops("input BatchNorm1d (fixed: auto booked grad_input)", Tabular(), (torch.randn(8, 16),), 3 * 128, backward=True, op=BNB)
check_flops("BatchNorm after a frozen stem (fixed)", FrozenStem(), (torch.randn(2, 3, 10, 10),), 3 * 1024, backward=True, op=BNB)
check_flops("InstanceNorm2d on the input (fixed)", nn.InstanceNorm2d(6, affine=True), (xn,), 3 * N, backward=True, op=BNB)
check_flops("input BatchNorm1d, input needs grad", Tabular(), (torch.randn(8, 16, requires_grad=True),), 13 * 128 + 32, backward=True, op=BNB)

# ---- recurrent layers: bidirectional, stacked, projections, packed round trips


def lstm_macs(steps, inp, hidden, proj, layers, dirs):
    out, total = proj or hidden, 0
    for layer in range(layers):
        size = inp if layer == 0 else out * dirs
        total += dirs * steps * (4 * hidden * size + 4 * hidden * out + hidden * proj)
    return total


for bi in (False, True):
    for proj in (0, 3):
        lstm = nn.LSTM(5, 8, num_layers=2, bidirectional=bi, proj_size=proj, batch_first=True)
        check(f"LSTM 2 layers bi={bi} proj={proj}", lstm, (torch.randn(3, 6, 5),), expect=2 * lstm_macs(18, 5, 8, proj, 2, 1 + bi))
check("LSTM 2 layers bi proj", nn.LSTM(5, 8, 2, bidirectional=True, proj_size=3, batch_first=True), (torch.randn(3, 6, 5),), backward=True)
check("GRU 3 layers bi", nn.GRU(5, 8, 3, bidirectional=True), (torch.randn(6, 3, 5),),
      expect=2 * (2 * 18 * (24 * 5 + 24 * 8) + 2 * 2 * 18 * (24 * 16 + 24 * 8)))
check("RNN relu 2 layers bi", nn.RNN(5, 8, 2, bidirectional=True, nonlinearity="relu"), (torch.randn(6, 3, 5),),
      expect=2 * (2 * 18 * (8 * 5 + 64) + 2 * 18 * (8 * 16 + 64)))


class PackedLSTM(nn.Module):
    def __init__(s):
        super().__init__()
        s.lstm, s.out = nn.LSTM(5, 8, 2, bidirectional=True, proj_size=3, batch_first=True), nn.Linear(6, 4)

    def forward(s, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        y, _ = pad_packed_sequence(s.lstm(packed)[0], batch_first=True, total_length=x.size(1))
        return s.out(y)


lengths = torch.tensor([6, 2, 4])
check("packed LSTM bi proj round trip", PackedLSTM(), (torch.randn(3, 6, 5), lengths), expect=2 * (lstm_macs(12, 5, 8, 3, 2, 2) + 18 * 24))
check("packed LSTM bi proj round trip", PackedLSTM(), (torch.randn(3, 6, 5), lengths), backward=True)


class PackSeq(nn.Module):
    def __init__(s):
        super().__init__()
        s.gru = nn.GRU(5, 8, bidirectional=True)

    def forward(s, a, b, c):
        return s.gru(pack_sequence([a, b, c], enforce_sorted=False))[1]


check("pack_sequence GRU (fixed: jit pad_sequence)", PackSeq(), (torch.randn(4, 5), torch.randn(6, 5), torch.randn(2, 5)),
      expect=2 * 2 * 12 * (24 * 5 + 24 * 8))

# ---- autocast with a disabled region, cdist compute modes, dropout, CTC, a head on a backbone's features


class Autocast(nn.Module):
    def __init__(s):
        super().__init__()
        s.a, s.b, s.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(s, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = s.a(x)
            with torch.autocast("cpu", enabled=False):
                h = s.b(h.float()).softmax(-1)
            return s.c(h)


check("autocast with enabled=False inside", Autocast(), (torch.randn(3, 8),), expect=2 * 3 * (128 + 256 + 64))
check("autocast with enabled=False inside", Autocast(), (torch.randn(3, 8),), backward=True)
ca, cb = torch.randn(2, 30, 8), torch.randn(2, 10, 8)
mm_form = 2 * 300 * 10
check_flops("cdist > 25 rows (mm form)", Ops(torch.cdist), (ca, cb), 2 * mm_form + 2 * (2 * 30 * 8 + 2 * 10 * 8) + 2 * 240 + 2 * 2 * 300)
check_flops("cdist donot_use_mm", Ops(lambda a, b: torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")), (ca, cb), 2 * 300 * 25)
check_flops("cdist use_mm, 20 rows", Ops(lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist")), (ca[:, :20], cb),
            2 * 2 * 200 * 10 + 2 * (2 * 20 * 8 + 2 * 10 * 8) + 2 * 160 + 2 * 2 * 200)
check_flops("cdist p=1", Ops(lambda a, b: torch.cdist(a, b, p=1)), (ca, cb), 2 * 300 * 24)
check_flops("Dropout train", nn.Dropout(0.2).train(), (torch.randn(4, 10),), 80)
check_flops("Dropout2d train channels_last", nn.Dropout2d(0.2).train(), (torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),), 96 + 6)
check_flops("Dropout eval", nn.Dropout(0.2).eval(), (torch.randn(4, 10),), 0)
ctc = Ops(lambda lp, t: F.ctc_loss(lp, t, [10, 10], [3, 2]))
check_flops("ctc_loss list lengths mean (fixed: jit -B)", ctc, (torch.randn(10, 2, 5).log_softmax(-1), torch.tensor([[1, 2, 3], [1, 2, 0]])),
            13 * (10 * 7 + 10 * 5) + 3 * 2 + 1)
backbone, head = nn.Linear(64, 64), nn.Linear(64, 4)
feats = backbone(torch.randn(8, 64))
check("head on a backbone's features (fixed: dispatch)", head, (feats,), backward=True, expect=2 * 3 * 8 * 64 * 4)


class CheckpointedHead(nn.Module):
    def __init__(s):
        super().__init__()
        s.a, s.b = nn.Linear(64, 16), nn.Linear(16, 4)

    def forward(s, x):
        return s.b(checkpoint(s.a, x, use_reentrant=True))


check("reentrant checkpoint head on features (fixed, wild4rest: dispatch)", CheckpointedHead(), (feats,), backward=True,
      expect=2 * (8 * 64 * 16 * 2 + 8 * 16 * 4 + 8 * 16 * 4 * 2 + 8 * 64 * 16 * 2))

# ---- blocks real code writes


class ConvNeXtBlock(nn.Module):
    def __init__(s, d=16):
        super().__init__()
        s.dw, s.ln = nn.Conv2d(d, d, 7, padding=3, groups=d), nn.LayerNorm(d)
        s.p1, s.p2, s.g = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.Parameter(torch.full((d,), 1e-6))

    def forward(s, x):
        y = s.dw(x).permute(0, 2, 3, 1)
        return x + (s.p2(F.gelu(s.p1(s.ln(y)))) * s.g).permute(0, 3, 1, 2)


xc = torch.randn(2, 16, 8, 8)
DW, LIN = 2 * 16 * 64 * 49, 2 * 64 * 16 * 64 * 2  # depthwise 7x7; both pointwise Linears
for cl in (False, True):
    block = ConvNeXtBlock().to(memory_format=torch.channels_last) if cl else ConvNeXtBlock()
    xin = xc.to(memory_format=torch.channels_last) if cl else xc
    check(f"ConvNeXt block channels_last={cl}", block, (xin,), expect=2 * (DW + LIN))
    # backward: the depthwise weight gradient (one forward; FlopCounterMode x groups) and the
    # Linears' weight and input gradients; the input needs no gradient
    check(f"ConvNeXt block channels_last={cl} (FCM: grouped bwd)", block, (xin,), backward=True, expect=2 * (2 * DW + 3 * LIN))


class WindowAttention(nn.Module):
    def __init__(s, d=16, heads=2, w=4):
        super().__init__()
        s.qkv, s.proj, s.h, s.w = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, w
        s.rpb = nn.Parameter(torch.randn((2 * w - 1) ** 2, heads))
        c = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")).flatten(1)
        r = (c[:, :, None] - c[:, None, :]).permute(1, 2, 0) + w - 1
        s.register_buffer("idx", (r[..., 0] * (2 * w - 1) + r[..., 1]).flatten(), persistent=False)

    def forward(s, x):
        b, hh, ww, d = x.shape
        w = s.w
        x = torch.roll(x, (-2, -2), (1, 2)).view(b, hh // w, w, ww // w, w, d).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, d)
        q, k, v = s.qkv(x).reshape(x.shape[0], w * w, 3, s.h, d // s.h).permute(2, 0, 3, 1, 4)
        a = (q * (d // s.h) ** -0.5) @ k.transpose(-2, -1)
        a = a + s.rpb[s.idx].view(w * w, w * w, -1).permute(2, 0, 1).unsqueeze(0)
        return s.proj((a.softmax(-1) @ v).transpose(1, 2).reshape(x.shape[0], w * w, d))


check("Swin window attention", WindowAttention(), (torch.randn(2, 8, 8, 16),), expect=2 * (128 * 16 * 64 + 8 * 2 * 16 * 16 * 8 * 2))
check("Swin window attention", WindowAttention(), (torch.randn(2, 8, 8, 16),), backward=True)


class Perceiver(nn.Module):
    def __init__(s, d=16, n=5):
        super().__init__()
        s.lat, s.q, s.kv = nn.Parameter(torch.randn(n, d)), nn.Linear(d, d), nn.Linear(d, 2 * d)

    def forward(s, x):
        k, v = s.kv(x).chunk(2, -1)
        return torch.einsum("bnm,bmd->bnd", torch.einsum("nd,bmd->bnm", s.q(s.lat), k).softmax(-1), v)


check("Perceiver cross-attention einsum", Perceiver(), (torch.randn(3, 7, 16),), expect=2 * (5 * 256 + 21 * 512 + 2 * 3 * 5 * 7 * 16))
check("Perceiver cross-attention einsum", Perceiver(), (torch.randn(3, 7, 16),), backward=True)
