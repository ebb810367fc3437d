"""Real code the sixth silent-error sweep (branch wild6, ``benchmarks/silent_errors_wild6.py``)
found counted wrongly or not at all.

* ``torch.linalg.vecdot`` (a batched dot product, CompositeImplicit: ``(x.conj() * y).sum(dim)``):
  the dispatch tracers see the product and the sum; jit records the composite, which had no
  handler, so a jit count was incomplete (0 FLOPs).
* ``torch.istft`` (audio decoders, vocoders): jit records it whole, unsupported before (a jit
  count booked only the window). Torch runs (SpectralOps.cpp, read live with a dispatch mode):
  per signal and frame an inverse FFT of n_fft points and its normalisation, the window
  multiply, the overlap-add (``unfold_backward``); the window envelope (square, overlap-add);
  the check of the L kept samples (abs, min, lt, equal); the division by it.
* A ``torch.jit.trace``-d model (``TopLevelTracedModule``) raised ``KeyError: '_parameters'``
  before any tracer ran: a traced module keeps its parameters behind a property, not in its
  ``__dict__`` (a scripted one does), and ``model_facts`` read the ``__dict__``.

Oracle: hand counts derived from torch's source (FlopCounterMode counts none of these ops;
its addmm for the traced model), FFTs by FFTW's convention (docs/conventions.md "FFT")."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from flopcount import count_flops
from tests.handlers._fn import TRACERS, Fn

# ---- linalg.vecdot: the product (N; complex 6 N) and its sum (N; complex 2 N), N broadcast elements
VECDOT = [
    ("rows", lambda x, y: torch.linalg.vecdot(x, y), (torch.randn(4, 8), torch.randn(4, 8)), {"aten::mul": 32, "aten::sum": 32}),
    ("broadcast", lambda x, y: torch.linalg.vecdot(x, y), (torch.randn(3, 1, 8), torch.randn(5, 8)),
     {"aten::mul": 120, "aten::sum": 120}),
    ("complex dim 0", lambda x, y: torch.linalg.vecdot(x, y, dim=0),
     (torch.randn(4, 8, dtype=torch.complex64), torch.randn(4, 8, dtype=torch.complex64)), {"aten::mul": 6 * 32, "aten::sum": 2 * 32}),
]


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name,fn,args,hand", VECDOT, ids=[c[0] for c in VECDOT])
def test_vecdot_is_its_product_and_sum_under_every_tracer(tracer, name, fn, args, hand):
    result = count_flops(Fn(fn), args, tracer=tracer)
    assert result.complete
    assert {op: v for op, v in result.by_operator("flops").items() if v} == hand
    assert result.macs == 0


# ---- istft
def _fft(points: int, transforms: int, per: float) -> int:
    return round(per * points * math.log2(points) * transforms)


def _istft_hand(signals: int, frames: int, n_fft: int, hop: int, kept: int, two_sided_complex: bool = False) -> int:
    """As torch runs it, per signal and frame: inverse FFT (c2r 2.5 n log2 n; c2c 5 n log2 n) and
    its normalisation (a multiply per real output component), window multiply (complex: 6),
    overlap-add (1 each); the envelope: window squared (n_fft), its overlap-add (frames x n_fft);
    the check on the kept samples: abs and min (L each), lt and equal (1 each); the divide
    (L per signal; complex 11)."""
    per_sample = signals * frames * n_fft
    if two_sided_complex:
        inverse = _fft(n_fft, signals * frames, 5.0) + 2 * per_sample
        window, divide = 6 * per_sample, 11 * signals * kept
    else:
        inverse = _fft(n_fft, signals * frames, 2.5) + per_sample
        window, divide = per_sample, signals * kept
    return inverse + window + per_sample + (n_fft + frames * n_fft) + (2 * kept + 2) + divide


SPEC = torch.randn(2, 9, 17, dtype=torch.complex64)  # 2 signals, n_fft 16 (9 one-sided bins), 17 frames
HANN, HANN20, ONES = torch.hann_window(16), torch.hann_window(20), torch.ones(16)  # made outside the forward
# kept samples: 16 + 4 x 16 = 80 overlap-added, less 8 at each end when centred, or length=
ISTFT = [
    ("centred", lambda s: torch.istft(s, 16, 4, window=HANN), SPEC, _istft_hand(2, 17, 16, 4, 64)),
    ("no window (ones)", lambda s: torch.istft(s, 16, 4), SPEC, _istft_hand(2, 17, 16, 4, 64)),
    ("normalized", lambda s: torch.istft(s, 16, 4, window=HANN, normalized=True), SPEC, _istft_hand(2, 17, 16, 4, 64)),
    ("length shorter", lambda s: torch.istft(s, 16, 4, window=HANN, length=50), SPEC, _istft_hand(2, 17, 16, 4, 50)),
    ("length longer (zero padding)", lambda s: torch.istft(s, 16, 4, window=HANN, length=90), SPEC, _istft_hand(2, 17, 16, 4, 72)),
    ("not centred", lambda s: torch.istft(s, 16, 4, window=ONES, center=False, length=60), SPEC,
     _istft_hand(2, 17, 16, 4, 60)),
    ("unbatched, default hop n_fft // 4", lambda s: torch.istft(s, 16, window=HANN), SPEC[0], _istft_hand(1, 17, 16, 4, 64)),
    ("two-sided, complex output", lambda s: torch.istft(s, 16, 4, window=HANN, onesided=False, return_complex=True),
     torch.randn(2, 16, 17, dtype=torch.complex64), _istft_hand(2, 17, 16, 4, 64, two_sided_complex=True)),
    ("n_fft 20 hop 3", lambda s: torch.istft(s, 20, 3, window=HANN20), torch.randn(3, 11, 9, dtype=torch.complex64),
     _istft_hand(3, 9, 20, 3, 20 + 3 * 8 - 20)),
]


@pytest.mark.filterwarnings("ignore:A window was not provided", "ignore:The length of signal is shorter")
@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name,fn,spec,hand", ISTFT, ids=[c[0] for c in ISTFT])
def test_istft_priced_as_torch_runs_it(tracer, name, fn, spec, hand):
    result = count_flops(Fn(fn), (spec,), tracer=tracer)
    assert result.complete
    assert result.flops == hand


# ---- a torch.jit.trace-d model
def _traced() -> torch.jit.ScriptModule:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(3, 8))


def _addmm_flops(model: nn.Module, x: torch.Tensor, backward: bool = False) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        out = model(x)
        if backward:
            out.sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize("backward", [False, True])
def test_a_traced_model_is_counted_like_a_scripted_one(tracer, backward):
    model, x = _traced(), torch.randn(3, 8)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    result = count_flops(model, (x,), tracer=tracer, backward=backward)
    # FlopCounterMode live on the real run: 2 x 3 x (8 x 16 + 16 x 4) forward, the backward's mms
    assert 2 * result.macs == _addmm_flops(model, x, backward)
    assert result.params == 8 * 16 + 16 + 16 * 4 + 4
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
