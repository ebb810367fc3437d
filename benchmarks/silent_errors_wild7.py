"""Silent wrong counts on real code, seventh pass (branch wild7): the cases earlier passes found and
left (a ``torch.jit.freeze``-d module, a ``Parameter`` subclass below a lazy copy's root, a torch
function rebound before flopcount's tracers were imported, nested jagged tensors and
``flex_attention``, jit's bytes under autocast), then patterns the wild3-wild6 sweeps did not cover,
counted by every tracer (forward and ``backward=True``) against FlopCounterMode run live on the real
forward (and backward) or a hand count (docs/conventions.md) where FlopCounterMode counts nothing.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/silent_errors_wild7.py`` (about 20 s of CPU).
Line formats as in wild4-wild6 (helpers in ``_silent_errors.py``). Lines marked "(fixed)" DIFF or
raise on main; docs/performance.md (branch wild7) has the before/after table.
"""

import os
import subprocess
import sys
import textwrap
import warnings

import torch
import torch.nn.functional as F
from _silent_errors import Ops, check, check_flops
from torch import nn

import flopcount

warnings.simplefilter("ignore")
torch.manual_seed(0)


def outcome(name, model, args, **kwargs):
    """One line: each tracer's FLOPs, or the start of the error a user gets."""
    row = [name]
    for tracer in ("auto", "dispatch", "jit"):
        try:
            row.append(f"{tracer}={flopcount.count_flops(model, args, tracer=tracer, **kwargs).flops}")
        except Exception as e:  # the point is which error a user gets
            said = str(e).splitlines()[0]
            row.append(f"{tracer}={type(e).__name__}: ...{said[-150:]}")
    print(" | ".join(row), flush=True)


# ---- left by wild6: a torch.jit.freeze-d module (AttributeError 'training'; then its compilation's aten::equal)
mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
frozen = torch.jit.freeze(torch.jit.script(mlp).eval())
for i in range(3):  # hand: 2 x 3 x (128 + 64) addmm + 48 relu, every time
    check_flops(f"torch.jit.freeze'd MLP, count {i + 1} (fixed: AttributeError; then +aten::equal)", frozen, (torch.randn(3, 8),),
                2 * 3 * 192 + 48, tracers=("auto", "dispatch"))
outcome("torch.jit.freeze'd MLP under jit (a TraceError naming tracer='dispatch')", frozen, (torch.randn(3, 8),))


class FrozenInside(nn.Module):
    def __init__(s):
        super().__init__()
        s.frozen = torch.jit.freeze(torch.jit.script(nn.Sequential(nn.Linear(8, 16), nn.ReLU()).eval()))
        s.head = nn.Linear(16, 4)

    def forward(s, x):
        return s.head(s.frozen(x))


check("frozen child + eager head (fixed: AttributeError)", FrozenInside(), (torch.randn(3, 8),), tracers=("auto", "dispatch"))
check("frozen child + eager head (fixed: AttributeError)", FrozenInside(), (torch.randn(3, 8, requires_grad=True),), backward=True)


# ---- left by countmem/wild6: a Parameter subclass below the root of a lazy copy (the count fell back to a real run)
class Tagged(nn.Parameter):
    pass


class Inner(nn.Module):
    def __init__(s):
        super().__init__()
        s.weight = Tagged(torch.randn(16, 8))

    def forward(s, x):
        return x @ s.weight.t()


class Outer(nn.Module):
    def __init__(s):
        super().__init__()
        s.inner, s.head = Inner(), nn.Linear(16, 4)

    def forward(s, x):
        return s.head(s.inner(x))


r = flopcount.count_flops(Outer(), (torch.randn(3, 8),))
ran = [w for w in r.warnings if "real run" in w]
print(f"Parameter subclass below the root (fixed: a real run) | fcm=1152 | auto={2 * r.macs} {'ok' if not ran and 2 * r.macs == 1152 else 'DIFF'}"
      + (f" ({ran[0][:90]})" if ran else " (fake copy)"), flush=True)

# ---- a torch function rebound to a wrapper that calls it (each torch-function mode ran the wrapper again)
original_bn = F.batch_norm


def batch_norm_and_mix(x, *a, **k):
    return original_bn(x, *a, **k) + torch.einsum("nchw,cd->ndhw", x, torch.eye(x.shape[1]))


F.batch_norm = batch_norm_and_mix
three = nn.Sequential(*[layer for _ in range(3) for layer in (nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4))]).eval()
check("F.batch_norm rebound to a wrapper (+einsum) (fixed: wrapper x2)", three, (torch.randn(2, 4, 6, 6),),
      expect=2 * (3 * 2 * 16 * 9 * 36 + 3 * 2 * 16 * 36))
F.batch_norm = original_bn
original_ln = F.layer_norm


def fp32_layer_norm(x, *a, **k):
    return original_ln(x.float(), *a, **k).type_as(x) * 1.5


F.layer_norm = fp32_layer_norm
lnnet = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 16), nn.LayerNorm(16))
check_flops("F.layer_norm rebound to an fp32 wrapper, its scaling (fixed: x2 auto, x3 dispatch)", lnnet,
            (torch.randn(4, 16, requires_grad=True),), 4 * 64, backward=True, op="aten::mul")
F.layer_norm = original_ln

BOUND_FIRST = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from torch import nn
    original = F.batch_norm
    def counted(*a, **k):
        print("call", flush=True)
        return original(*a, **k)
    F.batch_norm = counted
    import flopcount
    m = nn.Sequential(*[l for _ in range(3) for l in (nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4))]).eval()
    print(flopcount.count_flops(m, (torch.randn(2, 4, 6, 6),)).macs)
    """
)
out = subprocess.run([sys.executable, "-c", BOUND_FIRST], capture_output=True, text=True, env=os.environ).stdout.split()
print(f"F.batch_norm rebound before import (fixed: later calls answered without it) | eager calls=3 | auto calls={out.count('call')} "
      f"{'ok' if out.count('call') == 3 else 'DIFF'}", flush=True)


# ---- left by wild6, loud: nested tensors, flex_attention
class NestedSDPA(nn.Module):
    def forward(s, q):
        nt = torch.nested.nested_tensor([q[0, :3], q[1, :5]], layout=torch.jagged).unflatten(-1, (2, 4)).transpose(1, 2)
        return F.scaled_dot_product_attention(nt, nt, nt).transpose(1, 2).flatten(-2).values()


outcome("nested jagged SDPA (loud; now says nested tensors)", NestedSDPA(), (torch.randn(2, 5, 8),))
from torch.nn.attention.flex_attention import flex_attention  # noqa: E402

outcome("flex_attention (loud; jit now names it)", Ops(flex_attention), (torch.randn(2, 3, 8, 16),) * 3)


# ---- left by wild6: jit's bytes under autocast (explained, not changed)
class AutocastLinear(nn.Module):
    def __init__(s):
        super().__init__()
        s.l = nn.Linear(64, 32)

    def forward(s, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return s.l(x)


row = ["Linear(64, 32) under bf16 autocast, bytes read / written"]
for tracer in ("auto", "dispatch", "jit"):
    res = flopcount.count_flops(AutocastLinear(), (torch.randn(8, 64),), tracer=tracer)
    row.append(f"{tracer}={res.bytes_read}/{res.bytes_written}")
print(" | ".join(row), flush=True)

# ---- a fresh sweep: patterns wild3-wild6 did not cover
x4 = torch.randn(4, 16)


class HookedGrad(nn.Module):
    """A gradient hook that computes (a projection of the gradient, as gradient-surgery methods do)."""

    def __init__(s):
        super().__init__()
        s.a, s.b = nn.Linear(16, 16), nn.Linear(16, 4)
        s.register_buffer("P", torch.randn(16, 16))

    def forward(s, x):
        h = s.a(x)
        if h.requires_grad:
            h.register_hook(lambda g: g @ s.P)
        return s.b(h)


check("tensor gradient hook with a matmul", HookedGrad(), (x4,), backward=True)


class SavedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w.t(), x.t() @ g


class UsesFunction(nn.Module):
    def __init__(s):
        super().__init__()
        s.w = nn.Parameter(torch.randn(16, 8))

    def forward(s, x):
        return SavedFunction.apply(x, s.w).tanh()


check("autograd.Function with save_for_backward", UsesFunction(), (x4,), tracers=("auto", "dispatch"))
check("autograd.Function with save_for_backward", UsesFunction(), (torch.randn(4, 16, requires_grad=True),), backward=True)


class PreHookStandardize(nn.Module):
    """Weight standardisation in a forward pre-hook (as some conv nets do it)."""

    def __init__(s):
        super().__init__()
        s.conv = nn.Conv2d(3, 8, 3)
        s.conv.register_forward_pre_hook(lambda m, a: (a[0] @ torch.eye(a[0].shape[-1]),))

    def forward(s, x):
        return s.conv(x)


check("forward pre-hook with a matmul", PreHookStandardize(), (torch.randn(2, 3, 8, 8),))


class SharedTwice(nn.Module):
    def __init__(s):
        super().__init__()
        s.l = nn.Linear(16, 16)

    def forward(s, x):
        return s.l(torch.relu(s.l(x)))


check("one Linear called twice", SharedTwice(), (x4,))
check("one Linear called twice", SharedTwice(), (torch.randn(4, 16, requires_grad=True),), backward=True)


class CellLoop(nn.Module):
    def __init__(s, cell):
        super().__init__()
        s.cell = cell

    def forward(s, x):
        h = torch.zeros(x.shape[1], 12)
        state = (h, h.clone()) if isinstance(s.cell, nn.LSTMCell) else h
        for t in range(x.shape[0]):
            state = s.cell(x[t], state)
        return state[0] if isinstance(state, tuple) else state


for cell in (nn.LSTMCell(8, 12), nn.GRUCell(8, 12), nn.RNNCell(8, 12, nonlinearity="relu")):
    check(f"{type(cell).__name__} in a Python loop (5 steps)", CellLoop(cell), (torch.randn(5, 3, 8),))
check("LSTMCell loop", CellLoop(nn.LSTMCell(8, 12)), (torch.randn(5, 3, 8, requires_grad=True),), backward=True)
check("SDPA enable_gqa (8 q heads, 2 kv heads) (FCM: 0 on CPU)", Ops(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
      (torch.randn(2, 8, 6, 16), torch.randn(2, 2, 6, 16), torch.randn(2, 2, 6, 16)), expect=2 * 2 * 8 * 6 * 6 * 32)
check("MHA need_weights averaged, kdim/vdim", nn.MultiheadAttention(16, 4, kdim=12, vdim=10, batch_first=True),
      (torch.randn(2, 5, 16), torch.randn(2, 7, 12), torch.randn(2, 7, 10)))
# FlopCounterMode counts CPU SDPA as 0: hand = its linears + 2 L S (E + Ev) per attention, self (5 x 5) and cross (5 x 7)
check("TransformerDecoderLayer (FCM: SDPA 0 on CPU)", nn.TransformerDecoderLayer(16, 4, 32, batch_first=True, dropout=0.0).eval(),
      (torch.randn(2, 5, 16), torch.randn(2, 7, 16)), expect=65536 + 2 * (2 * 5 * 5 * 32 + 2 * 5 * 7 * 32))
check_flops("pixel_shuffle / unshuffle (data movement)", Ops(lambda x: F.pixel_unshuffle(F.pixel_shuffle(x, 2), 2)), (torch.randn(2, 8, 4, 4),), 0)
check("Conv3d + MaxPool3d + AvgPool3d", nn.Sequential(nn.Conv3d(2, 4, 3), nn.MaxPool3d(2), nn.AvgPool3d(1)), (torch.randn(1, 2, 6, 6, 6),))
check_flops("MaxPool3d k2 s2 (hand: outputs x kernel volume, docs/conventions.md)", nn.MaxPool3d(2), (torch.randn(1, 2, 4, 4, 4),),
            2 * 8 * 8)
check_flops("addmv beta=0.5 alpha=2 (hand: the product only, as addmm)", Ops(lambda v, m, x: torch.addmv(v, m, x, beta=0.5, alpha=2.0)),
            (torch.randn(6), torch.randn(6, 5), torch.randn(5)), op="aten::addmv", expect=2 * 30, field="flops")
check("addr / outer-product update (FCM: 0)", Ops(lambda a, u, v: torch.addr(a, u, v)), (torch.randn(6, 5), torch.randn(6), torch.randn(5)),
      expect=2 * 30)
check("matrix_power 3", Ops(lambda m: torch.linalg.matrix_power(m, 3)), (torch.randn(2, 5, 5),))
check("baddbmm beta/alpha", Ops(lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0)),
      (torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5)))
check("channels_last batch 4 Conv2d + BN + linear head", nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8 * 36, 5)).eval(),
      (torch.randn(4, 3, 8, 8).to(memory_format=torch.channels_last),))
check("non-contiguous (transposed) input to Linear", nn.Linear(6, 5), (torch.randn(6, 4).t(),))
check("SyncBatchNorm on CPU eval (acts as BatchNorm)", nn.Sequential(nn.Conv2d(3, 4, 3), nn.SyncBatchNorm(4)).eval(), (torch.randn(2, 3, 6, 6),))
for act in (nn.PReLU(4), nn.Hardtanh(), nn.CELU(), nn.LogSigmoid(), nn.Threshold(0.1, 2.0), nn.Tanhshrink(), nn.Softmax2d()):
    rows = {}
    for tracer in ("auto", "dispatch", "jit"):
        try:
            rows[tracer] = flopcount.count_flops(act, (torch.randn(2, 4, 3, 3),), tracer=tracer).flops
        except Exception as e:
            rows[tracer] = "ERR " + type(e).__name__
    same = len(set(rows.values())) == 1
    print(f"{type(act).__name__} (tracers agree) | " + " | ".join(f"{k}={v}" for k, v in rows.items()) + (" ok" if same else " DIFF"), flush=True)
for loss, args in (
    (nn.MultiMarginLoss(), (torch.randn(4, 5), torch.tensor([0, 1, 2, 3]))),
    (nn.TripletMarginLoss(), (torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8))),
    (nn.NLLLoss(), (torch.randn(2, 5, 3, 3).log_softmax(1), torch.randint(0, 5, (2, 3, 3)))),
    (nn.PoissonNLLLoss(), (torch.randn(4, 5), torch.rand(4, 5))),
    (nn.GaussianNLLLoss(), (torch.randn(4, 5), torch.randn(4, 5), torch.rand(4, 5) + 0.1)),
    (nn.CosineEmbeddingLoss(), (torch.randn(4, 8), torch.randn(4, 8), torch.tensor([1, -1, 1, -1]))),  # fixed: jit 249
    (nn.HingeEmbeddingLoss(), (torch.randn(4, 5), torch.randint(0, 2, (4, 5)) * 2 - 1)),  # fixed: jit 161
    (nn.MarginRankingLoss(), (torch.randn(4), torch.randn(4), torch.tensor([1.0, -1.0, 1.0, -1.0]))),
    (nn.HingeEmbeddingLoss(), (torch.randn(4, 5), torch.randint(0, 2, (4, 5)).float() * 2 - 1)),
    (nn.SoftMarginLoss(), (torch.randn(4, 5), torch.randint(0, 2, (4, 5)).float() * 2 - 1)),
    (nn.MultiLabelSoftMarginLoss(), (torch.randn(4, 5), torch.randint(0, 2, (4, 5)).float())),
):
    rows = {}
    for tracer in ("auto", "dispatch", "jit"):
        try:
            r = flopcount.count_flops(loss, args, tracer=tracer)
            rows[tracer] = (r.flops, r.complete)
        except Exception as e:
            rows[tracer] = "ERR " + type(e).__name__ + " " + str(e)[:80]
    same = len(set(map(str, rows.values()))) == 1 and all(isinstance(v, tuple) and v[1] for v in rows.values())
    print(f"{type(loss).__name__} (tracers agree, complete) | " + " | ".join(f"{k}={v}" for k, v in rows.items()) + (" ok" if same else " DIFF"),
          flush=True)
check_flops("histc 10 bins (hand: N, one binning step an element)", Ops(lambda x: torch.histc(x, 10)), (torch.randn(50),), 50)
check("Upsample bilinear + conv", nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear"), nn.Conv2d(3, 4, 3)), (torch.randn(1, 3, 5, 5),))
check("F.pad reflect + circular + conv", Ops(lambda x, w: F.conv2d(F.pad(F.pad(x, (1, 1, 1, 1), mode="reflect"), (1, 1, 1, 1), mode="circular"), w)),
      (torch.randn(1, 3, 5, 5), torch.randn(4, 3, 3, 3)))
# FlopCounterMode raises with parameters: hand = the forward (4 x 6) and one vjp per output (4 x 4 x 6)
check("torch.func.jacrev of a Linear (FCM raises)", Ops(lambda x: torch.func.jacrev(nn.Linear(6, 4))(x)), (torch.randn(6),),
      tracers=("auto", "dispatch"), expect=2 * (24 + 96))
check("torch.func.hessian of tanh(z @ W) (fixed: 240)", Ops(lambda x: torch.func.hessian(lambda z: torch.tanh(z @ torch.ones(5, 3)).sum())(x)), (torch.randn(5),),
      tracers=("auto", "dispatch"))

# ---- more of the brief's list, each where wild3-wild6 had it only in another form
from torch.nn.utils import parametrizations as P  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402


class Ckpt(nn.Module):
    def __init__(s, reentrant):
        super().__init__()
        s.a, s.b, s.reentrant = nn.Linear(16, 32), nn.Linear(32, 4), reentrant

    def forward(s, x):
        return s.b(checkpoint(lambda t: torch.relu(s.a(t)), x, use_reentrant=s.reentrant))


for reentrant in (True, False):
    check(f"checkpoint(use_reentrant={reentrant}), input requires grad", Ckpt(reentrant), (torch.randn(4, 16, requires_grad=True),), backward=True)
check("P.orthogonal Linear (train: householder/matrix_exp)", P.orthogonal(nn.Linear(8, 8)), (torch.randn(4, 8),), tracers=("auto", "dispatch"))
check("P.orthogonal Linear", P.orthogonal(nn.Linear(8, 8)), (torch.randn(4, 8),), backward=True)
check("P.weight_norm Conv2d channels_last", P.weight_norm(nn.Conv2d(3, 8, 3)), (torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last),),
      backward=True)


class Packed(nn.Module):
    def __init__(s):
        super().__init__()
        s.gru = nn.GRU(8, 12, batch_first=True)

    def forward(s, x):
        out, _ = s.gru(pack_padded_sequence(x, torch.tensor([5, 3, 2]), batch_first=True))
        return pad_packed_sequence(out, batch_first=True)[0]


check("GRU on a packed batch (lengths 5, 3, 2)", Packed(), (torch.randn(3, 5, 8),), tracers=("auto", "dispatch"))
check("GRU on a packed batch", Packed(), (torch.randn(3, 5, 8),), backward=True)


class CompiledBlock(nn.Module):
    def __init__(s):
        super().__init__()
        s.block = torch.compile(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)), backend="eager")
        s.head = nn.Linear(16, 4)

    def forward(s, x):
        return s.head(s.block(x) + x)


check("torch.compile'd block + residual + head", CompiledBlock(), (torch.randn(4, 16, requires_grad=True),), backward=True)
qlstm = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.LSTM(8, 12)), {nn.LSTM}, dtype=torch.qint8)
r_q = flopcount.count_flops(qlstm, (torch.randn(5, 2, 8),))
print(f"dynamic int8 LSTM MACs (hand 4 x (8 + 12) x 12 x 10 = 9600) | auto={r_q.macs} {'ok' if r_q.macs == 9600 else 'DIFF'}", flush=True)
check("complex Linear (weights and input complex64)", nn.Linear(8, 4, dtype=torch.complex64), (torch.randn(3, 8, dtype=torch.complex64),),
      expect=4 * 2 * 3 * 32)
normal = torch.distributions.Normal(torch.zeros(4, 8), torch.ones(4, 8))


class Reparam(nn.Module):
    def __init__(s):
        super().__init__()
        s.mu, s.logvar = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(s, x):
        d = torch.distributions.Normal(s.mu(x), s.logvar(x).mul(0.5).exp())
        z = d.rsample()
        return z, d.log_prob(z).sum(-1), torch.distributions.kl_divergence(d, normal).sum(-1)


check("VAE reparameterisation: rsample, log_prob, kl_divergence (MACs)", Reparam(), (torch.randn(4, 8),))
# more than 25 rows: torch's matmul form, [-2 x1, |x1|^2, 1] @ [x2, 1, |x2|^2]^T, an inner dimension of D + 2
check("cdist p=2 batch 3 (FCM: 0; hand: matmul form)", Ops(lambda a, b: torch.cdist(a, b)), (torch.randn(3, 30, 8), torch.randn(3, 40, 8)),
      expect=2 * 3 * 30 * 40 * (8 + 2))
