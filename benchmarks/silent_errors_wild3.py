"""Silent wrong counts on real code, third pass (branch wild3): small models written the way
users write them, counted by every tracer (forward and ``backward=True``) and compared with
independent oracles: ``torch.utils.flop_counter.FlopCounterMode`` run live on the real
forward (and backward), and a hand count where FlopCounterMode does not count the op.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/silent_errors_wild3.py`` (about 2 min of CPU).
Each line: the case, FlopCounterMode's FLOPs (contractions only), the hand count if any, then
2 x flopcount's MACs per tracer with "ok" when it equals the hand count (else FlopCounterMode).
"DIFF" lines are explained in docs/performance.md (branch wild3): FlopCounterMode's gaps
(mv, cdist, bilinear's backward, quantized ops, the mkldnn LSTM), its grouped-convolution
backward, the documented conventions (complex 4 real MACs, padded fast path), and what is left.
"""

import functools
import math  # noqa: F401
import warnings

import torch
import torch.ao.quantization as tq
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from _silent_errors import Ops, check
from torch import nn
from torch.ao.quantization import quantize_dynamic
from torch.func import functional_call, grad, grad_and_value, hessian, jacfwd, jacrev, jvp, linearize, vjp, vmap
from torch.nn.utils import parametrizations as P
from torch.nn.utils import parametrize
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

warnings.simplefilter("ignore")


# ---- custom autograd.Function, addmm/baddbmm, cdist, Bilinear, einsum, transposed and channels_last convs, complex, FFT


# custom autograd Function
class MyLin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x


class CF(nn.Module):
    def __init__(s):
        super().__init__()
        s.w = nn.Parameter(torch.randn(24, 16))

    def forward(s, x):
        return MyLin.apply(x, s.w)


x = torch.randn(5, 16, requires_grad=False)
check("custom Function", CF(), (x,), expect=2 * 5 * 16 * 24)
check("custom Function", CF(), (x,), backward=True, expect=2 * (5 * 16 * 24 + 5 * 24 * 16 + 24 * 5 * 16))


# addmm/baddbmm beta/alpha
class AB(nn.Module):
    def __init__(s):
        super().__init__()
        s.w = nn.Parameter(torch.randn(16, 8))
        s.b = nn.Parameter(torch.randn(4, 8))

    def forward(s, x, y, z):
        a = torch.addmm(s.b, x, s.w, beta=0.5, alpha=2.0)
        c = torch.baddbmm(z, y, y.transpose(1, 2), beta=0.0, alpha=0.3)
        return a.sum() + c.sum()


check("addmm/baddbmm", AB(), (torch.randn(4, 16), torch.randn(3, 5, 7), torch.randn(3, 5, 5)))
check("addmm/baddbmm", AB(), (torch.randn(4, 16), torch.randn(3, 5, 7), torch.randn(3, 5, 5)), backward=True)


# cdist
class CD(nn.Module):
    def forward(s, a, b):
        return torch.cdist(a, b)


check("cdist", CD(), (torch.randn(2, 30, 8), torch.randn(2, 40, 8)))
# bilinear
check("Bilinear", nn.Bilinear(6, 7, 5), (torch.randn(4, 6), torch.randn(4, 7)), expect=2 * 4 * 6 * 7 * 5)
check("Bilinear", nn.Bilinear(6, 7, 5), (torch.randn(4, 6), torch.randn(4, 7)), backward=True)


# einsum
class ES(nn.Module):
    def forward(s, a, b, c):
        x = torch.einsum("...ij,...jk->...ik", a, b)  # broadcast ellipsis
        y = torch.einsum("bii->bi", c)  # diagonal
        z = torch.einsum("bij,bij->b", a, a)  # elementwise+reduce
        w = torch.einsum("bhid,bhjd->bhij", a.unsqueeze(1).expand(2, 3, 4, 5), a.unsqueeze(1).expand(2, 3, 4, 5))
        return x.sum() + y.sum() + z.sum() + w.sum()


check("einsum", ES(), (torch.randn(2, 4, 5), torch.randn(5, 6), torch.randn(2, 3, 3)))

# conv transpose with groups/dilation/output_padding
ct = nn.ConvTranspose2d(8, 12, 3, stride=2, padding=1, output_padding=1, groups=4, dilation=2)
check("ConvT2d g4 d2 op1", ct, (torch.randn(2, 8, 9, 9),))
check("ConvT2d g4 d2 op1", ct, (torch.randn(2, 8, 9, 9),), backward=True)
ct1 = nn.ConvTranspose1d(4, 6, 5, stride=3, output_padding=2, dilation=1)
check("ConvT1d op2", ct1, (torch.randn(2, 4, 11),))
# channels_last conv
cv = nn.Conv2d(8, 16, 3, padding=1).to(memory_format=torch.channels_last)
check("conv channels_last", cv, (torch.randn(2, 8, 10, 10).to(memory_format=torch.channels_last),))
check("conv channels_last", cv, (torch.randn(2, 8, 10, 10).to(memory_format=torch.channels_last),), backward=True)
# noncontiguous input linear
lin = nn.Linear(10, 7)
check("linear noncontig", lin, (torch.randn(10, 3, 4).permute(1, 2, 0),))
check("linear noncontig", lin, (torch.randn(10, 3, 4).permute(1, 2, 0),), backward=True)


# complex matmul
class CM(nn.Module):
    def __init__(s):
        super().__init__()
        s.w = nn.Parameter(torch.randn(8, 6, dtype=torch.cfloat))

    def forward(s, x):
        return (x @ s.w).abs()


check("complex matmul", CM(), (torch.randn(3, 8, dtype=torch.cfloat),))


# FFT conv
class FC(nn.Module):
    def forward(s, x, k):
        return torch.fft.irfft(torch.fft.rfft(x, n=64) * torch.fft.rfft(k, n=64), n=64)


check("fft conv", FC(), (torch.randn(2, 3, 40), torch.randn(2, 3, 25)))

# ---- grouped transposed conv, torch.func, checkpoint, parametrizations, a submodule under no_grad and grad

ct = nn.ConvTranspose2d(8, 12, 3, stride=2, padding=1, output_padding=1, groups=1, dilation=2)
check("ConvT2d g1", ct, (torch.randn(2, 8, 9, 9),), backward=True)
check(
    "ConvT2d g4 input grad",
    nn.ConvTranspose2d(8, 12, 3, stride=2, groups=4),
    (torch.randn(2, 8, 9, 9).requires_grad_(),),
    backward=True,
    expect=2 * 3 * 2 * 8 * 81 * 3 * 9,
)

# torch.func

mlp = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))


class FCall(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x):
        p = {k: v * 2 for k, v in s.m.named_parameters()}
        return functional_call(s.m, p, (x,))


check("functional_call", FCall(), (torch.randn(4, 6),), expect=2 * 4 * (60 + 30))
check("functional_call", FCall(), (torch.randn(4, 6),), backward=True)


class PerSample(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x):
        params = dict(s.m.named_parameters())

        def loss(p, xi):
            return functional_call(s.m, p, (xi.unsqueeze(0),)).sum()

        g = vmap(grad(loss), in_dims=(None, 0))(params, x)
        return sum(v.sum() for v in g.values())


check("vmap(grad) per-sample", PerSample(), (torch.randn(4, 6),))


class Jac(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x):
        return vmap(jacrev(s.m))(x)


check("vmap(jacrev)", Jac(), (torch.randn(4, 6),))


class Hess(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = nn.Linear(6, 1)

    def forward(s, x):
        return hessian(lambda z: torch.tanh(s.m(z)).sum())(x)


check("hessian", Hess(), (torch.randn(6),))


class VChunk(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x, y):
        f = vmap(lambda a, b: s.m(a) * b.sum(), in_dims=(1, 0), chunk_size=3)
        return f(x, y)


check("vmap in_dims chunk", VChunk(), (torch.randn(5, 7, 6), torch.randn(7, 2)), expect=2 * 35 * 90)


class NestedV(nn.Module):
    def __init__(s):
        super().__init__()
        s.w = nn.Parameter(torch.randn(6, 4))

    def forward(s, x):
        return vmap(vmap(lambda r: r @ s.w))(x)


check("nested vmap", NestedV(), (torch.randn(3, 5, 6),), expect=2 * 15 * 24)
check("nested vmap", NestedV(), (torch.randn(3, 5, 6),), backward=True, expect=4 * 15 * 24)
check("vmap chunk", VChunk(), (torch.randn(5, 7, 6), torch.randn(7, 2)), backward=True)


# checkpoint
class Blk(nn.Module):
    def __init__(s):
        super().__init__()
        s.a = nn.Linear(8, 16)
        s.b = nn.Linear(16, 8)

    def forward(s, x):
        return s.b(torch.relu(s.a(x)))


class CK(nn.Module):
    def __init__(s, re):
        super().__init__()
        s.re = re
        s.stem = nn.Linear(8, 8)
        s.blk = Blk()
        s.blk2 = Blk()

    def forward(s, x):
        h = s.stem(x)
        h = checkpoint(s.blk, h, use_reentrant=s.re)
        h = checkpoint(lambda z: s.blk2(z) + s.blk(z), h, use_reentrant=s.re)
        return h


for re in (True, False):
    check(f"checkpoint re={re}", CK(re), (torch.randn(3, 8),), backward=True)
    check(f"checkpoint re={re} x grad", CK(re), (torch.randn(3, 8).requires_grad_(),), backward=True)

# parametrizations

wn = P.weight_norm(nn.Linear(8, 6))
check("weight_norm", wn, (torch.randn(4, 8),))
check("weight_norm", wn, (torch.randn(4, 8),), backward=True)
sn = P.spectral_norm(nn.Linear(8, 6)).eval()
check("spectral_norm eval", sn, (torch.randn(4, 8),))
sn2 = P.spectral_norm(nn.Linear(8, 6))
check("spectral_norm train", sn2, (torch.randn(4, 8),))
check("spectral_norm train", sn2, (torch.randn(4, 8),), backward=True)
orth = P.orthogonal(nn.Linear(6, 6))
check("orthogonal", orth, (torch.randn(4, 6),))
check("orthogonal", orth, (torch.randn(4, 6),), backward=True)


class Twice(nn.Module):
    def __init__(s):
        super().__init__()
        s.l = nn.Linear(8, 8)

    def forward(s, x):
        with torch.no_grad():
            a = s.l(x)
        return s.l(a) + s.l(x)


check("same submodule no_grad+grad", Twice(), (torch.randn(3, 8),), backward=True, expect=2 * (3 * 64 * 3 + 2 * 3 * 64))

# ---- packed and padded sequences through LSTM/GRU/RNN: MACs = steps x directions x gates x hidden x
# (input + hidden) per layer (a second layer's input is hidden x directions)


class Packed(nn.Module):
    def __init__(self, cls, **kw):
        super().__init__()
        self.rnn = cls(5, 7, batch_first=True, **kw)

    def forward(self, x, lengths):
        p = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(p)
        return pad_packed_sequence(out, batch_first=True)[0]


def rnn_macs(gates, steps, layers, directions):
    first = steps * directions * gates * 7 * (5 + 7)
    return first + (layers - 1) * steps * directions * gates * 7 * (7 * directions + 7)


lens = torch.tensor([6, 2, 4])
for cls, gates in ((nn.LSTM, 4), (nn.GRU, 3), (nn.RNN, 1)):
    for kw in ({}, {"num_layers": 2}, {"bidirectional": True}):
        layers, directions = kw.get("num_layers", 1), 2 if kw.get("bidirectional") else 1
        packed_hand = 2 * rnn_macs(gates, int(lens.sum()), layers, directions)
        check(f"packed {cls.__name__} {kw}", Packed(cls, **kw), (torch.randn(3, 6, 5), lens), expect=packed_hand)
        padded_hand = 2 * rnn_macs(gates, 18, layers, directions)
        check(
            f"padded {cls.__name__} {kw}",
            cls(5, 7, batch_first=True, **kw),
            (torch.randn(3, 6, 5),),
            tracers=("auto",),
            expect=padded_hand,
        )


# ---- no_grad/inference_mode in forward, MoE routing, autocast bf16, causal SDPA
# no_grad inside forward, backward
class NG(nn.Module):
    def __init__(s):
        super().__init__()
        s.a = nn.Linear(8, 8)
        s.b = nn.Linear(8, 4)

    def forward(s, x):
        with torch.no_grad():
            t = s.a(x)
        return s.b(t * x)


check("no_grad in forward", NG(), (torch.randn(3, 8),), backward=True, expect=2 * (3 * 64 + 3 * 32 + 3 * 32))
check(
    "no_grad in forward x grad",
    NG(),
    (torch.randn(3, 8).requires_grad_(),),
    backward=True,
    expect=2 * (3 * 64 + 3 * 32 + 3 * 32 * 2),
)


class IM(nn.Module):
    def __init__(s):
        super().__init__()
        s.a = nn.Linear(8, 8)
        s.b = nn.Linear(8, 4)

    def forward(s, x):
        with torch.inference_mode():
            t = s.a(x)
        return s.b(t.clone())


check("inference_mode in forward", IM(), (torch.randn(3, 8),), backward=True, expect=2 * (3 * 64 + 3 * 32 + 3 * 32))
check("inference_mode in forward", IM(), (torch.randn(3, 8),), expect=2 * (3 * 64 + 3 * 32))


# MoE with index_add_
class MoE(nn.Module):
    def __init__(s, E=4, k=2):
        super().__init__()
        s.gate = nn.Linear(8, E)
        s.ex = nn.ModuleList(nn.Linear(8, 8) for _ in range(E))
        s.k = k

    def forward(s, x):
        logits = s.gate(x)
        w, idx = logits.softmax(-1).topk(s.k, -1)
        out = torch.zeros_like(x)
        counts = torch.bincount(idx.flatten(), minlength=len(s.ex))
        for e, n in enumerate(counts.tolist()):
            if n == 0:
                continue
            tok, slot = (idx == e).nonzero(as_tuple=True)
            y = s.ex[e](x[tok]) * w[tok, slot, None]
            out.index_add_(0, tok, y)
        return out


x = torch.randn(10, 8)
check("MoE index_add_", MoE(), (x,), expect=2 * (10 * 8 * 4 + 10 * 2 * 64))
check("MoE index_add_", MoE(), (x,), backward=True)


class MoE2(MoE):
    def forward(s, x):
        logits = s.gate(x)
        w, idx = logits.softmax(-1).topk(s.k, -1)
        out = torch.zeros_like(x)
        for e in range(len(s.ex)):
            tok, slot = torch.where(idx == e)
            y = s.ex[e](x[tok]) * w[tok, slot, None]
            out = out.scatter_add(0, tok[:, None].expand(-1, 8), y)
        return out


check("MoE scatter_add", MoE2(), (x,), expect=2 * (10 * 8 * 4 + 10 * 2 * 64))
check("MoE scatter_add", MoE2(), (x,), backward=True)


# autocast bf16 on CPU
class AC(nn.Module):
    def __init__(s):
        super().__init__()
        s.a = nn.Linear(8, 16)
        s.b = nn.Linear(16, 4)

    def forward(s, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return s.b(torch.relu(s.a(x))).float()


check("autocast bf16", AC(), (torch.randn(3, 8),))
check("autocast bf16", AC(), (torch.randn(3, 8),), backward=True)


# SDPA with mask / gqa
class Att(nn.Module):
    def forward(s, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


q = torch.randn(2, 4, 10, 16)
k = torch.randn(2, 4, 12, 16)
v = torch.randn(2, 4, 12, 8)
check("sdpa causal L!=S", Att(), (q, k, v), expect=2 * 2 * 4 * 10 * 12 * (16 + 8))

# ---- dynamic quantization, torch.compile, torch.export
# quantize_dynamic

m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
qm = quantize_dynamic(m, {nn.Linear}, dtype=torch.qint8)
check("qdyn Linear", qm, (torch.randn(5, 16),), expect=2 * 5 * (16 * 32 + 32 * 8))
check("qdyn Linear 3d", qm, (torch.randn(2, 5, 16),), expect=2 * 10 * (16 * 32 + 32 * 8))
lstm = nn.LSTM(6, 10, num_layers=2, batch_first=True)
ql = quantize_dynamic(lstm, {nn.LSTM}, dtype=torch.qint8)
check("qdyn LSTM", ql, (torch.randn(3, 7, 6),), expect=2 * 21 * (4 * 10 * 6 + 4 * 10 * 10 + 4 * 10 * 10 + 4 * 10 * 10))
qlf = quantize_dynamic(nn.Sequential(nn.Linear(16, 32)), {nn.Linear}, dtype=torch.float16)
check("qdyn Linear fp16", qlf, (torch.randn(5, 16),), expect=2 * 5 * 16 * 32)
gru = nn.GRU(6, 10, batch_first=True, bidirectional=True)
qg = quantize_dynamic(gru, {nn.GRU}, dtype=torch.qint8)
check("qdyn GRU bi", qg, (torch.randn(3, 7, 6),), expect=2 * 21 * 2 * (3 * 10 * 6 + 3 * 10 * 10))
# compile
mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
cm = torch.compile(mlp, backend="eager")
check("compile eager", cm, (torch.randn(3, 8),), expect=2 * 3 * (128 + 64))
check("compile eager", cm, (torch.randn(3, 8),), backward=True, expect=2 * 3 * (128 + 64) * 2 + 2 * 3 * 64)


class Wrap(nn.Module):
    def __init__(s):
        super().__init__()
        s.inner = torch.compile(nn.Linear(8, 8), backend="aot_eager")
        s.out = nn.Linear(8, 2)

    def forward(s, x):
        return s.out(s.inner(x))


check("compiled submodule aot_eager", Wrap(), (torch.randn(3, 8),), expect=2 * 3 * (64 + 16))
check("compiled submodule aot_eager", Wrap(), (torch.randn(3, 8),), backward=True)
# export
ep = torch.export.export(mlp, (torch.randn(3, 8),))
check("exported module", ep.module(), (torch.randn(3, 8),), expect=2 * 3 * (128 + 64))
check("exported module", ep.module(), (torch.randn(3, 8),), backward=True)


# ---- addbmm/addmv/addr/outer/kron/tensordot/multi_dot, matmul broadcasting, unfold, padding modes, cells, MHA
A = torch.randn(3, 4, 5)
Bm = torch.randn(3, 5, 6)
M = torch.randn(4, 6)
check("addbmm", Ops(lambda m, a, b: torch.addbmm(m, a, b, beta=0.5)), (M, A, Bm), expect=2 * 3 * 4 * 5 * 6)
check(
    "addmv",
    Ops(lambda v, m, x: torch.addmv(v, m, x, alpha=2)),
    (torch.randn(4), torch.randn(4, 5), torch.randn(5)),
    expect=2 * 20,
)
check("addr", Ops(lambda m, a, b: torch.addr(m, a, b)), (torch.randn(4, 5), torch.randn(4), torch.randn(5)))
check("outer", Ops(lambda a, b: torch.outer(a, b)), (torch.randn(4), torch.randn(5)))
check("kron", Ops(lambda a, b: torch.kron(a, b)), (torch.randn(2, 3), torch.randn(4, 5)))
check(
    "tensordot",
    Ops(lambda a, b: torch.tensordot(a, b, dims=([1, 2], [0, 1]))),
    (torch.randn(3, 4, 5), torch.randn(4, 5, 6)),
    expect=2 * 3 * 20 * 6,
)
check(
    "multi_dot",
    Ops(lambda a, b, c: torch.linalg.multi_dot([a, b, c])),
    (torch.randn(10, 3), torch.randn(3, 20), torch.randn(20, 2)),
)
check(
    "einsum 3 operands",
    Ops(lambda a, b, c: torch.einsum("ij,jk,kl->il", a, b, c)),
    (torch.randn(10, 3), torch.randn(3, 20), torch.randn(20, 2)),
)
check(
    "matmul bcast 4d@3d",
    Ops(lambda a, b: a @ b),
    (torch.randn(2, 1, 4, 5), torch.randn(3, 5, 6)),
    expect=2 * 2 * 3 * 4 * 5 * 6,
)
check("matmul 1d@3d", Ops(lambda a, b: a @ b), (torch.randn(5), torch.randn(3, 5, 6)), expect=2 * 3 * 5 * 6)
check("matmul 3d@1d", Ops(lambda a, b: a @ b), (torch.randn(3, 4, 5), torch.randn(5)), expect=2 * 3 * 4 * 5)
check("linear 1d", nn.Linear(5, 3), (torch.randn(5),), expect=2 * 15)
check(
    "matmul 3d(noncontig)@2d",
    Ops(lambda a, b: a.transpose(0, 1) @ b),
    (torch.randn(4, 3, 5), torch.randn(5, 6)),
    expect=2 * 3 * 4 * 5 * 6,
)
check(
    "matmul 3d(noncontig)@2d",
    Ops(lambda a, b: a.transpose(0, 1) @ b),
    (torch.randn(4, 3, 5), torch.randn(5, 6).requires_grad_()),
    backward=True,
    expect=2 * 2 * 3 * 4 * 5 * 6,
)
check(
    "unfold conv",
    Ops(lambda x, w: (w.view(8, -1) @ F.unfold(x, 3, padding=1)).view(2, 8, 6, 6)),
    (torch.randn(2, 4, 6, 6), torch.randn(8, 4, 3, 3)),
    expect=2 * 2 * 8 * 36 * 36,
)
check("conv same even", nn.Conv1d(4, 6, 4, padding="same"), (torch.randn(2, 4, 10),), expect=2 * 2 * 6 * 10 * 4 * 4)
check(
    "conv circular",
    nn.Conv2d(4, 6, 3, padding=2, padding_mode="circular", dilation=2),
    (torch.randn(2, 4, 7, 7),),
    expect=2 * 2 * 6 * 49 * 4 * 9,
)
check("conv3d depthwise", nn.Conv3d(6, 12, 3, groups=6, stride=2), (torch.randn(2, 6, 7, 7, 7),), backward=True)
check(
    "conv3d depthwise xgrad",
    nn.Conv3d(6, 12, 3, groups=6, stride=2),
    (torch.randn(2, 6, 7, 7, 7).requires_grad_(),),
    backward=True,
)


class Cells(nn.Module):
    def __init__(s):
        super().__init__()
        s.c = nn.LSTMCell(5, 7)
        s.g = nn.GRUCell(7, 7)
        s.r = nn.RNNCell(7, 3, nonlinearity="relu")

    def forward(s, x):
        h = c = torch.zeros(x.size(1), 7)
        o = []
        for t in range(x.size(0)):
            h, c = s.c(x[t], (h, c))
            h = s.g(h, h)
            o.append(s.r(h))
        return torch.stack(o)


check("cells", Cells(), (torch.randn(4, 3, 5),), expect=2 * 12 * (4 * 7 * 12 + 3 * 7 * 14 + 3 * 10))
check("cells", Cells(), (torch.randn(4, 3, 5),), backward=True)
check(
    "LSTM proj",
    nn.LSTM(5, 8, proj_size=3, batch_first=True),
    (torch.randn(2, 6, 5),),
    expect=2 * 12 * (4 * 8 * 5 + 4 * 8 * 3 + 8 * 3),
)
mha = nn.MultiheadAttention(16, 4, kdim=10, vdim=12, batch_first=True)
check(
    "MHA kdim/vdim",
    mha,
    (torch.randn(2, 5, 16), torch.randn(2, 7, 10), torch.randn(2, 7, 12)),
    expect=2 * (10 * 16 * 16 + 14 * 10 * 16 + 14 * 12 * 16 + 2 * 4 * 5 * 7 * 4 * 2 + 10 * 16 * 16),
)
check("MHA kdim/vdim", mha, (torch.randn(2, 5, 16), torch.randn(2, 7, 10), torch.randn(2, 7, 12)), backward=True)
mha2 = nn.MultiheadAttention(16, 4, batch_first=True, add_bias_kv=True, add_zero_attn=True).eval()
x = torch.randn(2, 5, 16)
check("MHA bias_kv zero_attn", mha2, (x, x, x), expect=2 * (10 * 16 * 48 + 2 * 4 * 5 * 7 * 4 * 2 + 10 * 16 * 16))

# ---- gradient penalty, forward-mode AD, selective checkpointing, frozen backbone, hooks, max_norm, torch.cond


# gradient penalty
class GP(nn.Module):
    def __init__(s):
        super().__init__()
        s.d = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(s, x):
        x = x.detach().requires_grad_(True)
        out = s.d(x)
        (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        return out.mean() + ((g.norm(2, dim=1) - 1) ** 2).mean()


check("grad penalty", GP(), (torch.randn(4, 8),))
check("grad penalty", GP(), (torch.randn(4, 8),), backward=True)
# jvp / jacfwd

mlp = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))


class JVP(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x, t):
        return jvp(s.m, (x,), (t,))[1]


# primal, tangent and x 0^T for the weights' zero tangents: 3 x 4 x 90 MACs
check("jvp", JVP(), (torch.randn(4, 6), torch.randn(4, 6)), expect=2 * 3 * 4 * 90)


class JF(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x):
        return jacfwd(s.m)(x)


# primal, the 6 tangents and x 0^T for the weights' zero tangents: (2 + 6) x 90 MACs
check("jacfwd", JF(), (torch.randn(6),), expect=2 * (2 + 6) * 90)


# selective checkpoint (Blk as above)


def policy(ctx, op, *a, **k):
    return (
        CheckpointPolicy.MUST_SAVE
        if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        else CheckpointPolicy.PREFER_RECOMPUTE
    )


class SAC(nn.Module):
    def __init__(s):
        super().__init__()
        s.blk = Blk()
        s.head = nn.Linear(8, 4)

    def forward(s, x):
        h = checkpoint(
            s.blk, x, use_reentrant=False, context_fn=functools.partial(create_selective_checkpoint_contexts, policy)
        )
        return s.head(h)


check("selective checkpoint (save mm)", SAC(), (torch.randn(3, 8),), backward=True)
check("selective checkpoint (save mm) xgrad", SAC(), (torch.randn(3, 8).requires_grad_(),), backward=True)


def policy2(ctx, op, *a, **k):
    return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.relu.default else CheckpointPolicy.PREFER_RECOMPUTE


class SAC2(SAC):
    def forward(s, x):
        h = checkpoint(
            s.blk, x, use_reentrant=False, context_fn=functools.partial(create_selective_checkpoint_contexts, policy2)
        )
        return s.head(h)


check("selective checkpoint (save relu)", SAC2(), (torch.randn(3, 8),), backward=True)
seq = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])


class CS(nn.Module):
    def __init__(s):
        super().__init__()
        s.seq = seq

    def forward(s, x):
        return checkpoint_sequential(s.seq, 2, x, use_reentrant=False)


check("checkpoint_sequential", CS(), (torch.randn(3, 8),), backward=True)


class Nested(nn.Module):
    def __init__(s):
        super().__init__()
        s.blk = Blk()
        s.blk2 = Blk()

    def forward(s, x):
        def outer(z):
            return s.blk2(checkpoint(s.blk, z, use_reentrant=False))

        return checkpoint(outer, x, use_reentrant=False)


check("nested checkpoint", Nested(), (torch.randn(3, 8),), backward=True)
check("nested checkpoint xgrad", Nested(), (torch.randn(3, 8).requires_grad_(),), backward=True)


# frozen backbone
class Frozen(nn.Module):
    def __init__(s):
        super().__init__()
        s.bb = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
        s.head = nn.Linear(16, 4)
        s.bb.requires_grad_(False)

    def forward(s, x):
        return s.head(s.bb(x))


check("frozen backbone", Frozen(), (torch.randn(3, 8),), backward=True, expect=2 * (3 * (128 + 256 + 64) + 3 * 64))


# tensor hook in forward
class Hook(nn.Module):
    def __init__(s):
        super().__init__()
        s.a = nn.Linear(8, 8)
        s.b = nn.Linear(8, 8)
        s.p = nn.Parameter(torch.randn(8, 8))

    def forward(s, x):
        h = s.a(x)
        if h.requires_grad:
            h.register_hook(lambda g: g @ s.p.detach())
        return s.b(h)


check(
    "grad hook with matmul",
    Hook(),
    (torch.randn(3, 8),),
    backward=True,
    expect=2 * (3 * 64 * 2 + 3 * 64 * 2 + 3 * 64 + 3 * 64),
)


# Embedding max_norm
class EM(nn.Module):
    def __init__(s):
        super().__init__()
        s.e = nn.Embedding(20, 8, max_norm=1.0)
        s.l = nn.Linear(8, 4)

    def forward(s, i):
        return s.l(s.e(i))


check("embedding max_norm", EM(), (torch.randint(0, 20, (3, 5)),), expect=2 * 15 * 32)


# cond
class Cond(nn.Module):
    def __init__(s):
        super().__init__()
        s.a = nn.Linear(8, 8)
        s.b = nn.Linear(8, 8)

    def forward(s, x):
        return torch.cond(x.sum() > 0, lambda z: s.a(z), lambda z: s.b(s.b(z)), (x,))


check("torch.cond", Cond(), (torch.ones(3, 8),), expect=2 * 3 * 64)
check("torch.cond neg", Cond(), (-torch.ones(3, 8),), expect=2 * 2 * 3 * 64)

# ---- forward-mode AD through common layers, hessian, linearize

mlp = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))


class JVP(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x, t):
        return jvp(s.m, (x,), (t,))[1]


rs = check("jvp", JVP(), (torch.randn(4, 6), torch.randn(4, 6)))
print({k: v for k, v in rs["auto"].by_operator("count").items()})


class JF(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x):
        return jacfwd(s.m)(x)


check("jacfwd", JF(), (torch.randn(6),))


class DualNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x, t):
        with fwAD.dual_level():
            return fwAD.unpack_dual(s.m(fwAD.make_dual(x, t))).tangent


check("forward_ad dual", DualNet(), (torch.randn(4, 6), torch.randn(4, 6)))


class ConvJ(nn.Module):
    def __init__(s):
        super().__init__()
        s.c = nn.Conv2d(3, 4, 3)
        s.n = nn.LayerNorm(6)
        s.b = nn.BatchNorm2d(4).eval()

    def forward(s, x, t):
        def f(z):
            return s.n(s.b(s.c(z)))

        return jvp(f, (x,), (t,))[1]


check("jvp conv+ln+bn", ConvJ(), (torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)))


class ConvD(ConvJ):
    def forward(s, x, t):
        with fwAD.dual_level():
            return fwAD.unpack_dual(s.n(s.b(s.c(fwAD.make_dual(x, t))))).tangent


check("dual conv+ln+bn", ConvD(), (torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)))


class Att(nn.Module):
    def forward(s, q, t):
        return jvp(lambda z: F.scaled_dot_product_attention(z, z, z), (q,), (t,))[1]


check("jvp sdpa", Att(), (torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)))


class H(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x):
        return hessian(lambda z: s.m(z).sum())(x)


check("hessian", H(), (torch.randn(6),))


class Lin(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x, t):
        out, f = linearize(s.m, x)
        return f(t)


check("linearize", Lin(), (torch.randn(4, 6), torch.randn(4, 6)))


# ---- linalg.multi_dot and chain_matmul orders
md = Ops(lambda *t: torch.linalg.multi_dot(list(t)))
check("multi_dot 3", md, (torch.randn(10, 3), torch.randn(3, 20), torch.randn(20, 2)))
check("multi_dot 3 other order", md, (torch.randn(2, 20), torch.randn(20, 3), torch.randn(3, 10)))
check(
    "multi_dot 5",
    md,
    (torch.randn(7, 30), torch.randn(30, 5), torch.randn(5, 40), torch.randn(40, 3), torch.randn(3, 11)),
)
check("multi_dot 1d ends", md, (torch.randn(30), torch.randn(30, 5), torch.randn(5, 40), torch.randn(40)))
check("multi_dot 2", md, (torch.randn(4, 6), torch.randn(6, 5)))
check(
    "chain_matmul",
    Ops(lambda *t: torch.chain_matmul(*t)),
    (torch.randn(7, 30), torch.randn(30, 5), torch.randn(5, 40), torch.randn(40, 3)),
)
check(
    "multi_dot 4 bwd",
    md,
    (torch.randn(7, 30), torch.randn(30, 5).requires_grad_(), torch.randn(5, 40), torch.randn(40, 3)),
    backward=True,
)


# ---- TransformerEncoderLayer fast path, GQA, expanded bmm, parametrize.cached, EmbeddingBag, MHA weights
enc = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
x = torch.randn(3, 7, 16)
mask = torch.zeros(3, 7, dtype=torch.bool)
mask[0, 5:] = True
mask[1, 3:] = True


class E(nn.Module):
    def __init__(s):
        super().__init__()
        s.e = enc

    def forward(s, x, m):
        with torch.no_grad():
            return s.e(x, src_key_padding_mask=m)


rs = check("TEL fast path pad mask", E(), (x, mask))
q = torch.randn(2, 8, 5, 16)
k = torch.randn(2, 2, 5, 16)
check(
    "sdpa gqa",
    Ops(lambda q, k: F.scaled_dot_product_attention(q, k, k, enable_gqa=True)),
    (q, k),
    expect=2 * 2 * 8 * 5 * 5 * 32,
)
check(
    "bmm expanded",
    Ops(lambda a, b: torch.bmm(a.expand(4, 5, 6), b)),
    (torch.randn(1, 5, 6), torch.randn(4, 6, 7)),
    expect=2 * 4 * 5 * 6 * 7,
)
check(
    "baddbmm bcast",
    Ops(lambda c, a, b: torch.baddbmm(c, a, b)),
    (torch.randn(5, 7), torch.randn(4, 5, 6), torch.randn(4, 6, 7)),
    expect=2 * 4 * 5 * 6 * 7,
)


class Twice(nn.Module):
    def __init__(s):
        super().__init__()
        s.l = nn.Linear(8, 8)

    def forward(s, a, b):
        return s.l(a).sum() + s.l(b).sum()


check("module twice bwd", Twice(), (torch.randn(3, 8), torch.randn(5, 8)), backward=True, expect=2 * (8 * 64 * 2))


class Sym(nn.Module):
    def forward(s, X):
        return X.triu() + X.triu(1).transpose(-1, -2)


class Cached(nn.Module):
    def __init__(s):
        super().__init__()
        s.l = nn.Linear(8, 8)
        parametrize.register_parametrization(s.l, "weight", Sym())

    def forward(s, x):
        with parametrize.cached():
            return s.l(s.l(x))


check("parametrize cached", Cached(), (torch.randn(3, 8),), expect=2 * 2 * 3 * 64)
check("parametrize cached", Cached(), (torch.randn(3, 8),), backward=True)
eb = nn.EmbeddingBag(20, 8, mode="sum")
check("embedding_bag psw", eb, (torch.randint(0, 20, (12,)), torch.tensor([0, 5, 9]), torch.rand(12)))
mha = nn.MultiheadAttention(16, 4, batch_first=True)


class MW(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mha

    def forward(s, x, m):
        return s.m(x, x, x, key_padding_mask=m, need_weights=True, average_attn_weights=True)[0]


check("MHA need_weights", MW(), (x, mask), expect=2 * (21 * 16 * 48 + 2 * 3 * 4 * 7 * 7 * 4 + 21 * 16 * 16))
check("MHA need_weights", MW(), (x, mask), backward=True)

# ---- ConvTranspose output_size, vjp, grad_and_value, QAT, stft

ct = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1)


class CTO(nn.Module):
    def __init__(s):
        super().__init__()
        s.c = ct

    def forward(s, x):
        return s.c(x, output_size=[16, 16])


check("ConvT output_size", CTO(), (torch.randn(2, 4, 8, 8),), expect=2 * 2 * 4 * 64 * 6 * 9)
mlp = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))


class V(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x, g):
        out, f = vjp(s.m, x)
        return f(g)[0]


check("vjp", V(), (torch.randn(4, 6), torch.randn(4, 3)), expect=2 * 4 * (90 + 90))


class GV(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = mlp

    def forward(s, x):
        g, v = grad_and_value(lambda z: s.m(z).sum())(x)
        return g


check("grad_and_value", GV(), (torch.randn(4, 6),), expect=2 * 4 * (90 + 90))
# QAT


class Q(nn.Module):
    def __init__(s):
        super().__init__()
        s.q = tq.QuantStub()
        s.c = nn.Conv2d(3, 8, 3)
        s.r = nn.ReLU()
        s.l = nn.Linear(8 * 6 * 6, 5)
        s.dq = tq.DeQuantStub()

    def forward(s, x):
        return s.dq(s.l(s.r(s.c(s.q(x))).flatten(1)))


qm = Q().train()
qm.qconfig = tq.get_default_qat_qconfig("fbgemm")
qm = tq.prepare_qat(qm)
qm(torch.randn(2, 3, 8, 8))
check("QAT conv+linear", qm, (torch.randn(2, 3, 8, 8),), expect=2 * (2 * 8 * 36 * 27 + 2 * 288 * 5))
check("QAT conv+linear", qm, (torch.randn(2, 3, 8, 8),), backward=True)


class ST(nn.Module):
    def forward(s, x):
        return torch.stft(x, 64, hop_length=16, window=torch.hann_window(64), return_complex=True).abs()


rs = check("stft", ST(), (torch.randn(2, 256),))
r = rs.get("auto")
if r is not None:
    print("   stft flops by op", r.by_operator())
