"""fvcore's ``FlopCountAnalysis`` (jit-based; it calls one MAC a "flop") on the wild4 cases it can
trace, to set beside ``silent_errors_wild4.py``: MultiheadAttention cross-attention with
``add_bias_kv`` (its ``linear`` MACs), einsum's trace and bilinear form, a spatial transformer,
kron, and the conv1d that ``torch.conv_tbc`` equals.

Run with the zoo environment, where fvcore is installed:
``/work/main/.venv-zoo/bin/python benchmarks/silent_errors_wild4_fvcore.py``.
"""

import warnings

import torch
import torch.nn.functional as F
from fvcore.nn import FlopCountAnalysis
from torch import nn

warnings.simplefilter("ignore")


class Ops(nn.Module):
    def __init__(s, f):
        super().__init__()
        s.f = f

    def forward(s, *a):
        return s.f(*a)


class Cross(nn.Module):
    def __init__(s, m, **kw):
        super().__init__()
        s.m, s.kw = m, kw

    def forward(s, q, k, v):
        return s.m(q, k, v, **s.kw)[0]


class STN(nn.Module):
    def __init__(s):
        super().__init__()
        s.loc = nn.Linear(144, 6)

    def forward(s, x):
        t = s.loc(x.flatten(1)).view(-1, 2, 3)
        return F.grid_sample(x, F.affine_grid(t, x.size(), align_corners=False), align_corners=False)


def fv(name, model, args):
    analysis = FlopCountAnalysis(model, args)
    analysis.unsupported_ops_warnings(False)
    analysis.uncalled_modules_warnings(False)
    print(f"{name}: fvcore MACs {analysis.total()} {dict(analysis.by_operator())} unsupported {dict(analysis.unsupported_ops())}")


torch.manual_seed(0)
q, k = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
fv("MHA cross add_bias_kv", Cross(nn.MultiheadAttention(16, 4, batch_first=True, add_bias_kv=True).eval()), (q, k, k))
fv("einsum ii", Ops(lambda a: torch.einsum("ii", a)), (torch.randn(7, 7),))
fv("einsum bi,ij,bj->b", Ops(lambda a, w, c: torch.einsum("bi,ij,bj->b", a, w, c)), (torch.randn(4, 6), torch.randn(6, 7), torch.randn(4, 7)))
fv("spatial transformer", STN(), (torch.randn(2, 3, 6, 8),))
fv("kron", Ops(torch.kron), (torch.randn(2, 3), torch.randn(4, 5)))
fv("conv1d = conv_tbc", nn.Conv1d(4, 6, 3, padding=1, bias=False), (torch.randn(2, 4, 5),))
