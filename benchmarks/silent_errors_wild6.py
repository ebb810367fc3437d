"""Silent wrong counts on real code, sixth pass (branch wild6): patterns the wild3/wild4/wild5
sweeps did not cover, counted by every tracer (forward and ``backward=True``) and compared with
independent oracles: ``torch.utils.flop_counter.FlopCounterMode`` run live on the real forward
(and backward), and a hand count from docs/conventions.md where it counts nothing (FFTs,
reductions, quantized kernels, complex element-wise products...). The model zoo (torchvision,
timm, diffusers built from code) is in ``silent_errors_wild6_zoo.py``.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/silent_errors_wild6.py`` (about 10 s of CPU; 53 lines + 6).
Line formats as in wild4/wild5 (helpers in ``_silent_errors.py``): ``fcm=`` lines compare 2 x MACs
per tracer with FlopCounterMode (or ``hand=``), ``hand=`` lines without ``fcm=`` compare all FLOPs
(or one operator's). Lines marked "(fixed)" DIFF or raise on main; docs/performance.md (branch
wild6) has the before/after table and the cases explained rather than changed.
"""

import math
import warnings

import torch
import torch.ao.quantization as Q
import torch.nn.functional as F
from _silent_errors import Ops, check, check_flops
from torch import nn
from torch.nn.utils import parametrizations as P
from torch.utils.checkpoint import checkpoint

warnings.simplefilter("ignore")
torch.manual_seed(0)
la = torch.linalg
C64 = torch.complex64

# ---- fixed: composites jit records whole that had no handler (the count was incomplete)
check_flops("linalg.vecdot (fixed: jit unsupported)", Ops(la.vecdot), (torch.randn(4, 8), torch.randn(4, 8)), 2 * 32)
check_flops("linalg.vecdot broadcast (fixed: jit unsupported)", Ops(la.vecdot), (torch.randn(3, 1, 8), torch.randn(5, 8)), 2 * 120)
check_flops("linalg.vecdot complex dim=0 (fixed: jit unsupported)", Ops(lambda x, y: la.vecdot(x, y, dim=0)),
            (torch.randn(4, 8, dtype=C64), torch.randn(4, 8, dtype=C64)), 8 * 32)
HANN = torch.hann_window(16)
SPEC = torch.randn(2, 9, 17, dtype=C64)


def istft_hand(signals, frames, n_fft, kept, complex_out=False):
    """c2r (c2c) + normalisation, window, overlap-add; envelope; its check; the divide."""
    t = signals * frames * n_fft
    fft = round((5.0 if complex_out else 2.5) * n_fft * math.log2(n_fft) * signals * frames) + t * (2 if complex_out else 1)
    return fft + t * (6 if complex_out else 1) + t + n_fft + frames * n_fft + 2 * kept + 2 + signals * kept * (11 if complex_out else 1)


check_flops("istft (fixed: jit unsupported)", Ops(lambda s: torch.istft(s, 16, 4, window=HANN)), (SPEC,), istft_hand(2, 17, 16, 64))
check_flops("istft length=50 (fixed: jit unsupported)", Ops(lambda s: torch.istft(s, 16, 4, window=HANN, length=50)), (SPEC,),
            istft_hand(2, 17, 16, 50))
check_flops("istft two-sided return_complex (fixed: jit unsupported)",
            Ops(lambda s: torch.istft(s, 16, 4, window=HANN, onesided=False, return_complex=True)),
            (torch.randn(2, 16, 17, dtype=C64),), istft_hand(2, 17, 16, 64, complex_out=True))

# ---- fixed: a torch.jit.trace-d model (KeyError '_parameters' before any tracer ran)
mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
traced = torch.jit.trace(mlp, torch.randn(3, 8))
check("torch.jit.trace model (fixed: KeyError)", traced, (torch.randn(3, 8),), tracers=("auto", "dispatch"), expect=2 * 3 * (128 + 64))
check("torch.jit.trace model (fixed: KeyError)", traced, (torch.randn(3, 8),), backward=True, tracers=("auto", "dispatch"))


class Scripted(nn.Module):
    def __init__(s):
        super().__init__()
        s.a, s.b = torch.jit.script(nn.Sequential(nn.Linear(8, 16), nn.ReLU())), nn.Linear(16, 4)

    def forward(s, x):
        return s.b(s.a(x))


check("jit.script submodule (jit: TraceError, says use dispatch)", Scripted(), (torch.randn(3, 8),), tracers=("auto", "dispatch"),
      expect=2 * 3 * (128 + 64))

# ---- compile boundaries, out= and in-place on views
class Disabled(nn.Module):
    def __init__(s):
        super().__init__()
        s.l1, s.l2 = nn.Linear(8, 16), nn.Linear(16, 4)

    @torch.compiler.disable
    def head(s, x):
        return s.l2(x)

    def forward(s, x):
        return s.head(s.l1(x).relu())


class CompiledChild(nn.Module):
    def __init__(s):
        super().__init__()
        s.a, s.b = torch.compile(nn.Linear(8, 16), backend="eager"), nn.Linear(16, 4)

    def forward(s, x):
        return s.b(s.a(x))


check("torch.compiler.disable method", Disabled(), (torch.randn(3, 8),), expect=2 * 3 * (128 + 64))
check("torch.compile'd child (eager backend)", CompiledChild(), (torch.randn(3, 8),), expect=2 * 3 * (128 + 64))
check("torch.compile'd child (eager backend)", CompiledChild(), (torch.randn(3, 8),), backward=True)


class OutMM(nn.Module):
    def forward(s, a, b):
        c = torch.empty(a.shape[0], b.shape[1])
        torch.mm(a, b, out=c)
        return torch.baddbmm(c.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), out=torch.empty(1, *c.shape))


class AddmmView(nn.Module):
    def forward(s, x, w):
        y = x.clone()
        y[:, :3].addmm_(x[:, :4], w)
        return y


check("mm out= + baddbmm out=", OutMM(), (torch.randn(4, 5), torch.randn(5, 6)), expect=2 * 2 * 4 * 5 * 6)
check("addmm_ on a view (FCM: 0, its in-place addmm_ has no formula)", AddmmView(), (torch.randn(5, 6), torch.randn(4, 3)), expect=2 * 5 * 4 * 3)


class InplaceViews(nn.Module):
    def forward(s, x):
        y = x.clone()
        y[:, 1:4].mul_(2).add_(1)
        y.diagonal().exp_()
        y.t()[0].sigmoid_()
        return y


check_flops("in-place ops on views (mul, add 18; exp 6; sigmoid 4 x 6)", InplaceViews(), (torch.randn(6, 6),), 18 + 18 + 6 + 24)


class AddOut(nn.Module):
    def forward(s, a, b):
        c = torch.empty(4, 10)
        torch.add(a, b, alpha=2, out=c)
        torch.sum(a, 1, out=torch.empty(4))
        return c


check_flops("add(alpha=2, out=), sum(out=)", AddOut(), (torch.randn(4, 10), torch.randn(4, 10)), 40 + 40)

# ---- checkpoint inside autocast; parametrizations on convolutions; vmap ensembles
class CheckpointAutocast(nn.Module):
    def __init__(s, reentrant):
        super().__init__()
        s.l1, s.l2, s.reentrant = nn.Linear(8, 16), nn.Linear(16, 4), reentrant

    def forward(s, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = checkpoint(lambda t: s.l1(t).relu(), x, use_reentrant=s.reentrant)
            return s.l2(h).float()


for reentrant in (True, False):
    check(f"checkpoint(use_reentrant={reentrant}) inside autocast bf16", CheckpointAutocast(reentrant), (torch.randn(3, 8),), backward=True)
# weight (4, 27): sigma = u . W v needs mv 108 (+ the power iteration's two mv 216 in train) + vdot 4
conv_out = 2 * 4 * 16 * 27
check("P.spectral_norm Conv2d train (FCM: no mv)", P.spectral_norm(nn.Conv2d(3, 4, 3)).train(), (torch.randn(2, 3, 6, 6),),
      expect=2 * (conv_out + 324 + 4))
check("P.spectral_norm Conv2d eval (FCM: no mv)", P.spectral_norm(nn.Conv2d(3, 4, 3)).eval(), (torch.randn(2, 3, 6, 6),),
      expect=2 * (conv_out + 108 + 4))
base = nn.Linear(6, 5)
stacked = torch.func.stack_module_state([nn.Linear(6, 5) for _ in range(4)])[0]


class Ensemble(nn.Module):
    def __init__(s):
        super().__init__()
        s.w, s.b = nn.Parameter(stacked["weight"]), nn.Parameter(stacked["bias"])

    def forward(s, x):
        def one(w, b, x):
            return torch.func.functional_call(base, {"weight": w, "bias": b}, (x,))

        return torch.vmap(one, in_dims=(0, 0, None))(s.w, s.b, x)


check("vmap(functional_call) ensemble (FCM: bmm's b)", Ensemble(), (torch.randn(3, 6),), tracers=("auto", "dispatch"), expect=2 * 4 * 3 * 30)
check("vmap(functional_call) ensemble", Ensemble(), (torch.randn(3, 6),), backward=True)

# ---- static and FX int8 quantization (hand: conv 2 x 8 x 36 x 27, linear 2 x 288 x 5 MACs)


class QConvNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.q, s.c, s.r, s.l, s.dq = Q.QuantStub(), nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Linear(288, 5), Q.DeQuantStub()

    def forward(s, x):
        return s.dq(s.l(s.r(s.c(s.q(x))).flatten(1)))


def quantized(fuse):
    m = QConvNet().eval()
    m.qconfig = Q.get_default_qconfig("fbgemm")
    if fuse:
        Q.fuse_modules(m, [["c", "r"]], inplace=True)
    Q.prepare(m, inplace=True)
    m(torch.randn(2, 3, 8, 8))
    return Q.convert(m, inplace=True)


QMACS = 2 * 8 * 36 * 27 + 2 * 288 * 5
check("static int8 conv + linear (jit: TraceError, packed params)", quantized(False), (torch.randn(2, 3, 8, 8),),
      tracers=("auto", "dispatch"), expect=2 * QMACS)
check("static int8 conv-relu fused + linear", quantized(True), (torch.randn(2, 3, 8, 8),), tracers=("auto", "dispatch"), expect=2 * QMACS)
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx  # noqa: E402

fx_net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(288, 5)).eval()
prepared = prepare_fx(fx_net, Q.get_default_qconfig_mapping("fbgemm"), (torch.randn(2, 3, 8, 8),))
prepared(torch.randn(2, 3, 8, 8))
check("FX graph mode int8 conv-relu + linear", convert_fx(prepared), (torch.randn(2, 3, 8, 8),), tracers=("auto", "dispatch"), expect=2 * QMACS)

# ---- complex: LLaMA's rotary embedding (view_as_complex * freqs: 6 FLOPs per complex product), contractions
freqs = torch.polar(torch.ones(5, 4), torch.randn(5, 4)).view(1, 5, 1, 4)


def rope(x):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(3).type_as(x)


check_flops("LLaMA rotary view_as_complex * freqs", Ops(rope), (torch.randn(2, 5, 3, 8),), 6 * 2 * 5 * 3 * 4)
check_flops("LLaMA rotary view_as_complex * freqs", Ops(rope), (torch.randn(2, 5, 3, 8, requires_grad=True),), 2 * 6 * 2 * 5 * 3 * 4,
            backward=True)
check("complex bmm (FCM: 1 real MAC per complex MAC)", Ops(torch.bmm), (torch.randn(2, 3, 4, dtype=C64), torch.randn(2, 4, 5, dtype=C64)),
      expect=4 * 2 * 2 * 3 * 4 * 5)
check_flops("complex addmm", Ops(torch.addmm), (torch.randn(3, 5, dtype=C64), torch.randn(3, 4, dtype=C64), torch.randn(4, 5, dtype=C64)),
            4 * 2 * 60)
check_flops("complex vdot", Ops(torch.vdot), (torch.randn(8, dtype=C64), torch.randn(8, dtype=C64)), 4 * 2 * 8)
check_flops("complex div, exp, add, sum (11, 2, 2, 2 per element)", Ops(lambda x, y: (x / y).exp() + y), (torch.randn(10, dtype=C64),) * 2,
            10 * (11 + 2 + 2))

# ---- einsum spellings not swept before; distances; scatter_reduce; searchsorted
a4, b4 = torch.randn(2, 1, 4, 5), torch.randn(3, 5, 6)
check("einsum ...ij,...jk->...ik broadcast batch", Ops(lambda x, y: torch.einsum("...ij,...jk->...ik", x, y)), (a4, b4), expect=2 * 6 * 4 * 5 * 6)
check("einsum i,i-> dot", Ops(lambda x, y: torch.einsum("i,i->", x, y)), (torch.randn(8), torch.randn(8)), expect=2 * 8)
check("einsum i,j->ij outer", Ops(lambda x, y: torch.einsum("i,j->ij", x, y)), (torch.randn(8), torch.randn(5)), expect=2 * 40)
check("einsum bhqd,bhkd->bhqk", Ops(lambda x, y: torch.einsum("bhqd,bhkd->bhqk", x, y)), (torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5)),
      expect=2 * 2 * 3 * 4 * 6 * 5)
check_flops("einsum ii->i (a diagonal: a view)", Ops(lambda x: torch.einsum("ii->i", x)), (torch.randn(5, 5),), 0)
check_flops("einsum iij->j (diagonal then sum)", Ops(lambda x: torch.einsum("iij->j", x)), (torch.randn(5, 5, 3),), 15)
x1, x2 = torch.randn(2, 5, 3), torch.randn(2, 7, 3)
check_flops("cdist p=1: B r1 r2 3m", Ops(lambda a, b: torch.cdist(a, b, p=1)), (x1, x2), 2 * 35 * 3 * 3)
check_flops("cdist p=inf: B r1 r2 3m", Ops(lambda a, b: torch.cdist(a, b, p=float("inf"))), (x1, x2), 2 * 35 * 3 * 3)
check_flops("cdist p=0.5: B r1 r2 (4m + 1)", Ops(lambda a, b: torch.cdist(a, b, p=0.5)), (x1, x2), 2 * 35 * 13)
check_flops("cdist p=2 direct (<= 25 rows): B r1 r2 (3m + 1)", Ops(torch.cdist), (x1, x2), 2 * 35 * 10)
# matmul form: B r1 r2 (m + 2) MACs + row norms 2 r1 m + 2 r2 m, the -2 scale r1 m, clamp and sqrt 2 r1 r2
check_flops("cdist p=2 matmul form (> 25 rows)", Ops(torch.cdist), (torch.randn(2, 30, 3), torch.randn(2, 40, 3)),
            2 * 2 * 1200 * 5 + 2 * (2 * 30 * 3 + 2 * 40 * 3 + 30 * 3 + 2 * 1200))
for red in ("sum", "prod", "amin"):
    check_flops(f"scatter_reduce {red}: numel(index)", Ops(lambda s, i, x, r=red: s.scatter_reduce(1, i, x, r)),
                (torch.randn(4, 3), torch.randint(0, 3, (4, 10)), torch.randn(4, 10)), 40)
check_flops("scatter_reduce mean (+ numel(self))", Ops(lambda s, i, x: s.scatter_reduce(1, i, x, "mean")),
            (torch.randn(4, 3), torch.randint(0, 3, (4, 10)), torch.randn(4, 10)), 40 + 12)
check_flops("bucketize / searchsorted (documented: 0, a gather)", Ops(lambda x, bd: torch.bucketize(x, bd).float()),
            (torch.randn(4, 5), torch.linspace(-2, 2, 9)), 0)

# ---- resampling and layers not swept before
# area is adaptive_avg_pool2d: 9 x 8 -> 3 x 4 sums windows of 3 x 2 (W = 6 M) and divides once per output (M = 72)
check_flops("interpolate area", Ops(lambda x: F.interpolate(x, size=(3, 4), mode="area")), (torch.randn(2, 3, 9, 8),), 7 * 72)
check("AdaptiveLogSoftmaxWithLoss", nn.AdaptiveLogSoftmaxWithLoss(16, 100, [10, 40], div_value=2.0),
      (torch.randn(8, 16), torch.randint(0, 100, (8,))))
check("ConvTranspose2d depthwise dilated channels_last", nn.ConvTranspose2d(6, 6, 3, stride=2, groups=6, dilation=2),
      (torch.randn(2, 6, 5, 5).to(memory_format=torch.channels_last),), expect=2 * 2 * 6 * 25 * 9)
check("LSTM proj_size bidirectional 2 layers", nn.LSTM(6, 10, proj_size=4, bidirectional=True, num_layers=2), (torch.randn(3, 2, 6),))
check("Bilinear no bias on 3-D (FCM: 0)", nn.Bilinear(6, 7, 5, bias=False), (torch.randn(2, 4, 6), torch.randn(2, 4, 7)), expect=2 * 8 * 6 * 7 * 5)
check("conv2d groups 3 dilation 2 padding same", nn.Conv2d(6, 9, 3, groups=3, dilation=2, padding="same"), (torch.randn(2, 6, 7, 7),),
      expect=2 * 2 * 9 * 49 * 2 * 9)

# ---- explained, not changed (docs/performance.md, branch wild6)
import flopcount  # noqa: E402


class LinearBF16(nn.Module):
    def __init__(s):
        super().__init__()
        s.l = nn.Linear(64, 32)

    def forward(s, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return s.l(x)


# the dispatch tracers book the fused linear's own operands as passed (fp32 x, W, b: 10,368 bytes),
# jit sees autocast's casts as separate `to` ops (docs/conventions.md "What a tracer cannot see")
for tracer in ("auto", "dispatch", "jit"):
    r = flopcount.count_flops(LinearBF16(), (torch.randn(8, 64),), tracer=tracer)
    print(f"autocast bf16 Linear bytes ({tracer}): read {dict((k, v) for k, v in r.by_operator('bytes_read').items() if v)}"
          f" written {dict((k, v) for k, v in r.by_operator('bytes_written').items() if v)}")


def outcome(name, model, args):
    row = [name]
    for tracer in ("auto", "dispatch", "jit"):
        try:
            row.append(f"{tracer}={flopcount.count_flops(model, args, tracer=tracer).flops}")
        except Exception as e:  # the point is which error a user gets
            row.append(f"{tracer}={type(e).__name__}")
    print(" | ".join(row), flush=True)


class NestedSDPA(nn.Module):
    def forward(s, q):
        nt = torch.nested.nested_tensor([q[0, :3], q[1, :5]], layout=torch.jagged).unflatten(-1, (2, 4)).transpose(1, 2)
        return F.scaled_dot_product_attention(nt, nt, nt).transpose(1, 2).flatten(-2).values()


outcome("nested jagged SDPA (loud: a TraceError naming the op)", NestedSDPA(), (torch.randn(2, 5, 8),))
from torch.nn.attention.flex_attention import flex_attention  # noqa: E402

outcome("flex_attention (loud; FlopCounterMode raises too)", Ops(flex_attention), (torch.randn(2, 3, 8, 16),) * 3)
outcome("torch.jit.freeze'd module (loud: AttributeError 'training')", torch.jit.freeze(torch.jit.script(mlp).eval()), (torch.randn(3, 8),))
