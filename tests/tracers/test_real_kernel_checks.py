"""A count must fail where the real call fails (issue #29 items 4 and 21).

torch's meta kernels (what the default tracer's fake tensors run) skip the dtype checks of
the CPU kernels: ``nn.Linear(4, 4)`` on int64 inputs was counted as 32 MACs, complete,
while the real call raises "mat1 and mat2 must have the same dtype". The oracle of every
test here is the real call, run live: it raises, and the count raises flopcount's forward
error naming the module, with the real message; under every tracer, batch > 1, train and
eval. Mixed dtypes the real kernels accept are still counted.
"""

from __future__ import annotations

from typing import Callable, Tuple

import pytest
import torch
from conftest import assert_same_state, run_cli, snapshot
from torch import nn

from flopcount import TraceError, count_flops

TRACERS = ("auto", "dispatch", "jit")


class Named(nn.Module):
    """The failing layer inside a parent, so the error must name it."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.pre = nn.Identity()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.pre(x))


def _linear() -> nn.Module:
    return nn.Linear(4, 4)


CASES: dict = {
    "linear-int64": (_linear, lambda: torch.zeros(2, 4, dtype=torch.long)),
    "linear-bool": (_linear, lambda: torch.zeros(2, 4, dtype=torch.bool)),
    "linear-float64": (_linear, lambda: torch.zeros(2, 4, dtype=torch.float64)),
    "linear-complex64": (_linear, lambda: torch.zeros(2, 4, dtype=torch.complex64)),
    "half-linear-float": (lambda: nn.Linear(4, 4).half(), lambda: torch.randn(2, 4)),
    "linear-no-bias-int64": (lambda: nn.Linear(4, 4, bias=False), lambda: torch.zeros(2, 3, 4, dtype=torch.long)),
    "half-conv-float": (lambda: nn.Conv2d(3, 4, 3).half(), lambda: torch.randn(2, 3, 8, 8)),
    "conv-float64": (lambda: nn.Conv2d(3, 4, 3), lambda: torch.randn(2, 3, 8, 8, dtype=torch.float64)),
    "layer-norm-float64": (lambda: nn.LayerNorm(4), lambda: torch.randn(2, 3, 4, dtype=torch.float64)),
    "batch-norm-float64": (lambda: nn.BatchNorm1d(4), lambda: torch.randn(2, 4, dtype=torch.float64)),
    "gru-float64": (lambda: nn.GRU(4, 5, batch_first=True), lambda: torch.randn(2, 3, 4, dtype=torch.float64)),
}


def _real_error(make_model: Callable[[], nn.Module], make_input: Callable[[], torch.Tensor], train: bool) -> str:
    torch.manual_seed(0)
    model = Named(make_model()).train(train)
    with pytest.raises(Exception) as real:
        model(make_input())
    return str(real.value).strip().splitlines()[0]


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("tracer", TRACERS)
def test_count_fails_where_the_real_call_fails(tracer: str, case: str, train: bool) -> None:
    make_model, make_input = CASES[case]
    real = _real_error(make_model, make_input, train)  # the oracle: the real call, live
    torch.manual_seed(0)
    model = Named(make_model()).train(train)
    x = make_input()
    before = snapshot(model)
    with pytest.raises(TraceError) as counted:
        count_flops(model, x, tracer=tracer)
    text = str(counted.value)
    assert real in text, (real, text)
    assert "forward failed in module 'layer'" in text
    assert counted.value.module_path == "layer"
    assert_same_state(model, before)


class MixedPrecision(nn.Module):
    """Mixed dtypes the CPU kernels accept: bfloat16 activations through a float32 LayerNorm
    (the CPU kernel's mixed-precision path), a bool mask in attention, int64 token ids."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.emb(ids).to(torch.bfloat16))
        q = h.float().unsqueeze(1)
        mask = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


@pytest.mark.parametrize("tracer", TRACERS)
def test_mixed_dtypes_the_real_kernels_accept_are_counted(tracer: str) -> None:
    model = MixedPrecision()
    ids = torch.randint(0, 10, (2, 5))
    out = model(ids)  # the real call runs
    assert out.shape == (2, 1, 5, 8)
    r = count_flops(model, ids, tracer=tracer)
    # SDPA by hand (docs/conventions.md, Attention): QK^T and AV, B x H x L x L x E MACs each
    assert r.by_operator("macs")["aten::scaled_dot_product_attention"] == 2 * (2 * 1 * 5 * 5 * 8)
    assert r.complete


def _cases_for_cli() -> Tuple[str, ...]:
    return ("2x4:int64", "2x4:bool", "2x4:float64", "2x4:complex64")


@pytest.mark.parametrize("spec", _cases_for_cli())
def test_check_does_not_pass_a_model_whose_forward_fails(capsys: pytest.CaptureFixture, tmp_path, spec: str) -> None:
    """``flopcount check`` on a Linear fed inputs the real call refuses: exit 2 (bad input),
    one line naming the module and the real message, no traceback; it passed before."""
    path = tmp_path / "lin.py"
    path.write_text("from torch import nn\n\n\ndef build():\n    return nn.Linear(4, 4)\n")
    dtype = getattr(torch, spec.split(":")[1])
    with pytest.raises(RuntimeError) as real:
        nn.Linear(4, 4)(torch.zeros(2, 4, dtype=dtype))
    code, out, err = run_cli(capsys, "check", f"{path}:build", "--input", spec, "--max-macs", "1M")
    assert code == 2, (code, out, err)
    assert str(real.value).splitlines()[0] in err
    assert "Traceback" not in err
    assert "PASS" not in out


@pytest.mark.parametrize("tracer", TRACERS)
def test_wide_mixed_precision_batch_norm_is_counted(tracer: str) -> None:
    """bfloat16 activations through a float32 BatchNorm in training, 5,000 channels: the CPU
    kernel accepts it (the real call runs), so the count must too; the probe writes real
    running statistics (a stride-0 view of them would refuse the write)."""
    x = torch.randn(4, 5000, dtype=torch.bfloat16)
    nn.BatchNorm1d(5000).train()(x)  # the oracle: the real call runs
    model = nn.BatchNorm1d(5000).train()
    before = snapshot(model)
    r = count_flops(model, x, tracer=tracer)
    n, c = x.numel(), 5000
    # docs/conventions.md, Normalisation (training): statistics 4N + 2C, normalise 2N + 2C, affine 2N
    assert r.flops == 8 * n + 4 * c
    assert_same_state(model, before)
