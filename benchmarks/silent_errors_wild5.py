"""Silent wrong counts on real code, fifth pass (branch wild5): patterns the wild3/wild4 sweeps
did not cover, counted by every tracer (forward and ``backward=True``) and compared with
independent oracles: ``torch.utils.flop_counter.FlopCounterMode`` run live on the real forward
(and backward), and a hand count from docs/conventions.md where it counts nothing (LAPACK,
comparisons, reductions, sparse products, CPU flash attention...).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/silent_errors_wild5.py`` (about 1 min of CPU; 70 lines).
Line formats as in wild4 (helpers in ``_silent_errors.py``): ``fcm=`` lines compare 2 x MACs per
tracer with FlopCounterMode (or ``hand=``), ``hand=`` lines without ``fcm=`` compare all FLOPs
(or one operator's). Lines marked "(fixed)" DIFF on main; docs/performance.md (branch wild5) has
the before/after table and the three cases explained rather than changed.
"""

import math
import warnings

import torch
import torch.nn.functional as F
from _silent_errors import Ops, check, check_flops
from torch import nn
from torch.nn.utils import parametrizations as P
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

warnings.simplefilter("ignore")
torch.manual_seed(0)
la = torch.linalg
D = torch.distributions


def svdvals_hand(m, n):
    """Golub-Reinsch values only, per matrix: 4 m n^2 - 4 n^3 / 3 (n = min)."""
    m, n = max(m, n), min(m, n)
    return 4 * m * n * n - 4 * n**3 / 3


# ---- fixed: values-only linear algebra (auto/dispatch counted the vectors a dispatch mode forces)
A, S = torch.randn(2, 4, 6), torch.randn(5, 5)
SPD = S @ S.T + 5 * torch.eye(5)
SV_A, SV_S = round(2 * svdvals_hand(4, 6)), round(svdvals_hand(5, 5))
check_flops("svdvals (fixed)", Ops(la.svdvals), (A,), SV_A)
check_flops("eigvalsh (fixed)", Ops(la.eigvalsh), (SPD,), round(4 * 5**3 / 3))
check_flops("eigvals (fixed)", Ops(la.eigvals), (S,), 10 * 5**3)
check_flops("matrix_norm ord=2 (fixed)", Ops(lambda a: la.matrix_norm(a, 2)), (A,), SV_A + 8)
check_flops("matrix_norm nuc (fixed)", Ops(lambda a: la.matrix_norm(a, "nuc")), (A,), SV_A + 8)
check_flops("linalg.norm ord=2 dims (1, 2) (fixed)", Ops(lambda a: la.norm(a, 2, dim=(1, 2))), (A,), SV_A + 8)
check_flops("torch.norm p=nuc (fixed)", Ops(lambda a: torch.norm(a, "nuc", (1, 2))), (A,), SV_A + 8)
check_flops("cond (fixed)", Ops(la.cond), (S,), SV_S + 1)
check_flops("cond nuc (fixed)", Ops(lambda a: la.cond(a, "nuc")), (S,), SV_S + 16)
check_flops("cond fro (jit: was unsupported)", Ops(lambda a: la.cond(a, "fro")), (S,), 2 * 125 + 25 + 2 * 51 + 2)
check_flops("matrix_rank (fixed)", Ops(lambda a: la.matrix_rank(a).float()), (A,), SV_A + 20)
check_flops("matrix_rank hermitian (fixed)", Ops(lambda a: la.matrix_rank(a, hermitian=True).float()), (SPD,),
            round(4 * 5**3 / 3) + 5 + 5 + 1 + 1 + 5 + 5)


class SpectralPenalty(nn.Module):
    def __init__(s):
        super().__init__()
        s.w = nn.Parameter(torch.randn(4, 6))

    def forward(s, x):
        return (x @ s.w.T).sum() + la.svdvals(s.w).sum()


check_flops("svdvals(weight) penalty: forward values only (fixed)", SpectralPenalty(), (torch.randn(3, 6),),
            round(svdvals_hand(4, 6)), op="aten::linalg_svdvals")
check_flops("svdvals(weight) penalty: thin SVD with a gradient", SpectralPenalty(), (torch.randn(3, 6),),
            14 * 6 * 16 + 8 * 64, backward=True, op="aten::_linalg_svd")

# ---- fixed: composites jit priced as one element-wise op; ops that left a count incomplete
X, Y = torch.randn(3, 4), torch.randn(4)
check_flops("isclose broadcast (fixed: jit N)", Ops(torch.isclose), (X, Y), 7 * 12 + 3 * 4)
check_flops("isclose equal_nan (fixed: jit N)", Ops(lambda a, b: torch.isclose(a, b, equal_nan=True)), (X, Y), 7 * 12 + 3 * 4 + 12 + 4)
check_flops("isclose int64 (fixed: jit 0)", Ops(torch.isclose), (torch.arange(6), torch.arange(6)), 6 * 6 + 3 * 6)


class CloseOrNot(nn.Module):
    def forward(s, a, b):
        return a * 2 if torch.allclose(a, b) else a - b


check_flops("allclose branch (fixed: unsupported)", CloseOrNot(), (X, X.clone()), 10 * 12 + 12 + 12)
mu, L3 = torch.randn(5, 3), torch.tril(torch.rand(3, 3)) + torch.eye(3)
# its symmetric check isclose(C, C.mT) runs on the covariance expanded to the batch, (5, 3, 3): 3 abs per element
check_flops("MultivariateNormal(covariance_matrix=) symmetric check (fixed: jit)",
            Ops(lambda m, c, y: D.MultivariateNormal(m, covariance_matrix=c).log_prob(y)), (mu, L3 @ L3.T, torch.randn(5, 3)),
            3 * 45, op="aten::abs")
check_flops("nanmean dim (fixed: jit N + M)", Ops(lambda x: torch.nanmean(x, 1)), (X,), 3 * 12 + 3)
check_flops("Normal log_prob (fixed: _is_all_true unsupported)", Ops(lambda m, s, y: D.Normal(m, s).log_prob(y)),
            (mu, torch.rand(5, 3) + 0.5, torch.randn(5, 3)), 15 * 15)
check_flops("index_reduce amax (fixed: unsupported)", Ops(lambda s, i, x: s.index_reduce(0, i, x, "amax")),
            (torch.randn(3, 10), torch.tensor([0, 2, 2, 1]), torch.randn(4, 10)), 40)
check_flops("index_reduce mean (fixed: unsupported)", Ops(lambda s, i, x: s.index_reduce(0, i, x, "mean")),
            (torch.randn(3, 10), torch.tensor([0, 2, 2, 1]), torch.randn(4, 10)), 70)
check_flops("segment_reduce mean (fixed: unsupported)", Ops(lambda d, n: torch.segment_reduce(d, "mean", lengths=n)),
            (torch.randn(10, 4), torch.tensor([3, 3, 4])), 52)
check_flops("scatter_reduce amax include_self=False", Ops(lambda s, i, x: s.scatter_reduce(1, i, x, "amax", include_self=False)),
            (torch.randn(4, 3), torch.randint(0, 3, (4, 10)), torch.randn(4, 10)), 40)


class VAE(nn.Module):
    def __init__(s):
        super().__init__()
        s.enc, s.dec = nn.Linear(8, 6), nn.Linear(3, 8)

    def forward(s, x):
        m, logv = s.enc(x).chunk(2, -1)
        q = D.Normal(m, (0.5 * logv).exp())
        kl = D.kl_divergence(q, D.Normal(torch.zeros_like(m), torch.ones_like(m))).sum()
        return ((s.dec(q.rsample()) - x) ** 2).sum() + kl


check("VAE Normal rsample + kl", VAE(), (torch.randn(4, 8),))
check("VAE Normal rsample + kl", VAE(), (torch.randn(4, 8),), backward=True)

# ---- the model is a graph: FX, torch.export, make_fx, torch.compile (inductor on CPU)
mlp = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))
x6 = torch.randn(4, 6)
check("fx symbolic_trace GraphModule", torch.fx.symbolic_trace(mlp), (x6,))
check("fx symbolic_trace GraphModule", torch.fx.symbolic_trace(mlp), (x6,), backward=True)
check("make_fx aten graph", torch.fx.experimental.proxy_tensor.make_fx(mlp)(x6), (x6,))
cnn = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
xi = torch.randn(2, 3, 10, 10)
check("export conv-bn eval .module()", torch.export.export(cnn.eval(), (xi,)).module(), (xi,))
check("export conv-bn train .module()", torch.export.export(cnn.train(), (xi,)).module(), (xi,), backward=True)
check_flops("export svdvals .module() FLOPs (fixed)", torch.export.export(Ops(la.svdvals), (A,)).module(), (A,), SV_A)
check("torch.compile inductor", torch.compile(mlp), (x6,))
check("torch.compile inductor", torch.compile(mlp), (x6,), backward=True)

# ---- parametrizations (new API), packed unsorted batch_first RNNs, layouts, expanded inputs
sn = P.spectral_norm(nn.Linear(8, 12))
check("P.spectral_norm train: + power iteration (mv x 2, vdot)", sn.train(), (torch.randn(4, 8),), expect=2 * (384 + 2 * 96 + 96 + 12))
check("P.spectral_norm eval: sigma (mv, vdot)", sn.eval(), (torch.randn(4, 8),), expect=2 * (384 + 96 + 12))
check("P.weight_norm conv1d", P.weight_norm(nn.Conv1d(4, 6, 3)), (torch.randn(2, 4, 9),), backward=True)
for orth_map in ("matrix_exp", "cayley", "householder"):
    check(f"P.orthogonal {orth_map}", P.orthogonal(nn.Linear(6, 6), orthogonal_map=orth_map), (torch.randn(4, 6),))


class PackedRNN(nn.Module):
    def __init__(s, rnn):
        super().__init__()
        s.rnn = rnn

    def forward(s, x, lengths):
        out, _ = s.rnn(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        return pad_packed_sequence(out, batch_first=True)[0]


lengths, xs = torch.tensor([3, 7, 5]), torch.randn(3, 7, 8)
for name, rnn, gates in (("GRU", nn.GRU, 3), ("LSTM", nn.LSTM, 4), ("RNN", nn.RNN, 1)):
    check(f"packed enforce_sorted=False batch_first {name}", PackedRNN(rnn(8, 16, batch_first=True)), (xs, lengths),
          expect=2 * 15 * gates * 16 * 24)
check("packed enforce_sorted=False batch_first LSTM", PackedRNN(nn.LSTM(8, 16, batch_first=True)), (xs, lengths), backward=True)
check("GRU batch_first, transposed input", nn.GRU(8, 16, batch_first=True), (torch.randn(5, 2, 8).transpose(0, 1),),
      expect=2 * 10 * 3 * 16 * 24)
c3 = nn.Conv3d(4, 6, 3)
x3 = torch.randn(2, 4, 6, 7, 8).to(memory_format=torch.channels_last_3d)
check("Conv3d channels_last_3d", c3, (x3,))
check("Conv3d channels_last_3d", c3, (x3,), backward=True)
check("ConvTranspose3d groups 2 dilation 2 output_padding 1", nn.ConvTranspose3d(4, 6, 3, stride=2, groups=2, dilation=2, output_padding=1),
      (torch.randn(2, 4, 3, 4, 5),))
check("ConvTranspose1d groups 3 dilation 2 output_padding 2", nn.ConvTranspose1d(6, 9, 4, stride=3, groups=3, dilation=2, output_padding=2),
      (torch.randn(2, 6, 7),))
check("complex Conv2d (torch: three real convolutions)", nn.Conv2d(2, 3, 3, dtype=torch.complex64), (torch.randn(1, 2, 5, 5, dtype=torch.complex64),))
check("complex Linear +bwd weight grad (4 real MACs per complex)", nn.Linear(6, 4, dtype=torch.complex64),
      (torch.randn(3, 6, dtype=torch.complex64),), backward=True, loss=lambda o: o.abs().sum(), expect=2 * 4 * 2 * 72)
check("Linear on an expanded input", nn.Linear(6, 5), (torch.randn(1, 6).expand(8, 6),), backward=True)
check("Conv2d on an expanded batch", nn.Conv2d(3, 4, 3), (torch.randn(1, 3, 6, 6).expand(4, 3, 6, 6),), backward=True)
check("bmm of an expanded batch", Ops(lambda a, b: a @ b), (torch.randn(1, 4, 5).expand(3, 4, 5), torch.randn(3, 5, 6)))


class SetupContextMM(torch.autograd.Function):
    @staticmethod
    def forward(a, w):
        return a @ w

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        a, w = ctx.saved_tensors
        return g @ w.t(), a.t() @ g


class UsesFunction(nn.Module):
    def __init__(s):
        super().__init__()
        s.w = nn.Parameter(torch.randn(6, 5))

    def forward(s, a):
        return SetupContextMM.apply(a, s.w)


check("autograd.Function setup_context + once_differentiable", UsesFunction(), (torch.randn(4, 6, requires_grad=True),), backward=True)

# ---- autocast bf16 on CPU; attention fast paths in eval; sparse products; ensembles


class BF16(nn.Module):
    def __init__(s, m):
        super().__init__()
        s.m = m

    def forward(s, *a):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return s.m(*a).float()


cnn1 = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
check("autocast bf16 conv-bn-conv", BF16(cnn1), (torch.randn(2, 3, 9, 9),), backward=True)
check("autocast bf16 conv channels_last", BF16(cnn1), (torch.randn(2, 3, 9, 9).to(memory_format=torch.channels_last),), backward=True)
check("autocast bf16 SDPA", BF16(Ops(F.scaled_dot_product_attention)), (torch.randn(2, 4, 5, 8),) * 3, expect=2 * 2 * 4 * 5 * 5 * 16)
check("Embedding max_norm + Linear", nn.Sequential(nn.Embedding(10, 6, max_norm=1.0), nn.Linear(6, 3)), (torch.randint(0, 10, (4, 5)),), backward=True)
E, H, Lq = 16, 4, 5
MHA = 2 * (3 * Lq * 4 * E * E + 3 * H * Lq * Lq * 2 * (E // H))


class SelfAttn(nn.Module):
    def __init__(s, m, **kw):
        super().__init__()
        s.m, s.kw = m, kw

    def forward(s, x, *masks):
        with torch.no_grad():
            return s.m(x, x, x, *masks, **s.kw)[0]


mha = nn.MultiheadAttention(E, H, batch_first=True).eval()
kpm = torch.zeros(3, Lq, dtype=torch.bool)
kpm[0, 3:] = True
check("MHA eval fast path key_padding_mask", SelfAttn(mha), (torch.randn(3, Lq, E), kpm), expect=MHA)
check("MHA eval causal attn_mask is_causal", SelfAttn(mha, need_weights=False, attn_mask=nn.Transformer.generate_square_subsequent_mask(Lq), is_causal=True),
      (torch.randn(3, Lq, E),), expect=MHA)
idx = torch.tensor([[0, 1, 1, 3, 4], [2, 0, 3, 1, 4]])
coo = torch.sparse_coo_tensor(idx, torch.randn(5), (5, 6)).coalesce()
check("torch.sparse.mm COO @ dense", Ops(torch.sparse.mm), (coo, torch.randn(6, 7)), expect=2 * 5 * 7)
check("CSR @ dense", Ops(lambda s, d: s @ d), (coo.to_sparse_csr(), torch.randn(6, 7)), expect=2 * 5 * 7)
check("torch.sparse.addmm", Ops(torch.sparse.addmm), (torch.randn(5, 7), coo, torch.randn(6, 7)), expect=2 * 5 * 7)

# ---- resampling and FFT not swept before: 5-D grid_sample, irfftn
L5 = 2 * 2 * 3 * 4  # output locations
check_flops("grid_sample 5-D trilinear", Ops(lambda a, g: F.grid_sample(a, g, align_corners=False)),
            (torch.randn(2, 3, 4, 5, 6), torch.rand(2, 2, 3, 4, 3) * 2 - 1), L5 * (3 * 3 + 22) + L5 * 3 * 15)
check_flops("grid_sample 5-D nearest", Ops(lambda a, g: F.grid_sample(a, g, mode="nearest", align_corners=False)),
            (torch.randn(2, 3, 4, 5, 6), torch.rand(2, 2, 3, 4, 3) * 2 - 1), L5 * (3 * 3 + 3))
check_flops("irfftn s=(8, 16)", Ops(lambda a: torch.fft.irfftn(a, s=(8, 16))), (torch.randn(2, 8, 9, dtype=torch.complex64),),
            2 * (round(2.5 * 128 * math.log2(128)) + 128))

# ---- explained, not changed (docs/performance.md, branch wild5)


class Encoder(nn.Module):
    def __init__(s):
        super().__init__()
        layer = nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True, activation="gelu")
        s.enc = nn.TransformerEncoder(layer, 2).eval()

    def forward(s, x, padding):
        with torch.no_grad():
            return s.enc(x, src_key_padding_mask=padding)


# the eager run's nested-tensor bookkeeping (logical_not x 2, argmin, cumsum: torch.profiler), which
# the dispatch modes switch off (their slow path): jit counts what eager runs
check_flops("TransformerEncoder nested path: the mask's logical_not x 2 (jit = eager)", Encoder(), (torch.randn(3, Lq, E), kpm), 2 * 15,
            op="aten::logical_not")
check_flops("one_hot's index range check (dispatch: real aminmax; auto: fakes skip it)", Ops(lambda i, w: F.one_hot(i, 10).float() @ w),
            (torch.randint(0, 10, (3, 4)), torch.randn(10, 6)), 24, op="aten::aminmax")
