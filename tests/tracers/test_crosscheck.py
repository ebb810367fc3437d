"""Live cross-checks against independent tools, run in the test:
MACs equal fvcore's FlopCountAnalysis; FLOPs equal torch.utils.flop_counter.FlopCounterMode
on contraction ops (and on attention where torch counts it: the meta device)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from examples.mobilenet import mobilenet_v2
from examples.resnet import resnet18, resnet50
from flopcount import count_flops

CONTRACTIONS = {
    "aten::linear", "aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::matmul",
    "aten::_convolution", "aten::convolution", "aten::einsum", "aten::mv", "aten::dot",
}
ATTENTION = "aten::scaled_dot_product_attention"
FVCORE_CONTRACTIONS = {"conv", "linear", "addmm", "bmm", "matmul", "einsum", "mm", "baddbmm"}


def fvcore_macs(model, inputs) -> int:
    fvcore_nn = pytest.importorskip("fvcore.nn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = fvcore_nn.FlopCountAnalysis(model, inputs)
        analysis.unsupported_ops_warnings(False)
        analysis.uncalled_modules_warnings(False)
        # fvcore also counts norms and pooling; compare its contraction handlers only
        return int(sum(v for op, v in analysis.by_operator().items() if op in FVCORE_CONTRACTIONS))


def torch_flops(model, args=(), kwargs=None) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(*args, **(kwargs or {}))
    return int(counter.get_total_flops())


def contraction_macs(result) -> int:
    return sum(v for op, v in result.by_operator("macs").items() if op in CONTRACTIONS)


class MatmulNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 24)
        self.w = nn.Parameter(torch.randn(24, 12))

    def forward(self, x):
        h = self.proj(x)                      # (B, T, 24)
        a = h @ h.transpose(1, 2)             # bmm via matmul broadcasting
        b = torch.einsum("btd,de->bte", h, self.w)
        return torch.matmul(a, b).sum()


@pytest.mark.parametrize(
    "build, shape",
    [
        (lambda: resnet18(), (1, 3, 64, 64)),
        (lambda: mobilenet_v2(), (2, 3, 64, 64)),
        (lambda: nn.Sequential(nn.Conv1d(4, 8, 5, stride=2, dilation=2, groups=2)), (2, 4, 33)),
        (lambda: nn.Sequential(nn.Conv3d(2, 4, 3, padding=1, stride=(1, 2, 2))), (1, 2, 5, 8, 8)),
    ],
)
def test_cnn_macs_equal_fvcore(build, shape):
    model = build().eval()
    x = torch.randn(*shape)
    r = count_flops(model, x)
    assert contraction_macs(r) == fvcore_macs(model, x)
    assert r.macs == contraction_macs(r)


def test_transposed_conv_macs_equal_fvcore():
    model = nn.Sequential(nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1, groups=2)).eval()
    x = torch.randn(2, 6, 9, 9)
    assert count_flops(model, x).macs == fvcore_macs(model, x)


def test_matmul_family_macs_equal_fvcore_and_flops_equal_torch():
    model = MatmulNet().eval()
    x = torch.randn(2, 5, 16)
    r = count_flops(model, x)
    assert r.macs == fvcore_macs(model, (x,))
    assert 2 * r.macs == torch_flops(model, (x,))


class EinsumOperandTuple(nn.Module):
    """ProphetNet's ngram attention: ``torch.einsum(equation, (a, b))``, the operands in one tuple."""

    def forward(self, query, key):
        return torch.einsum("bnhtc,bnhsc->bnhts", (query, key))


@pytest.mark.parametrize("tracer", ["dispatch", "auto", "jit"])
def test_einsum_operands_in_one_tuple_equal_flop_counter_mode(tracer):
    # the binder took the tuple's first tensor as the operand list (its slices as operands): the
    # handler raised on every tracer but jit (transformers' ProphetNetForCausalLM could not be counted)
    query, key = torch.randn(2, 2, 4, 12, 16), torch.randn(2, 2, 4, 24, 16)
    model = EinsumOperandTuple()
    result = count_flops(model, (query, key), tracer=tracer)
    assert result.flops == torch_flops(model, (query, key))
    assert result.macs == 2 * 2 * 4 * 12 * 24 * 16


@pytest.mark.parametrize("train", [False, True])
def test_cnn_flops_equal_flop_counter_mode(train):
    model = resnet50().train(train)
    x = torch.randn(1, 3, 64, 64)
    r = count_flops(model, x)
    assert 2 * contraction_macs(r) == torch_flops(model, (x,))


def test_flops_are_twice_macs_for_contraction_only_model():
    model = nn.Sequential(nn.Linear(10, 20, bias=True), nn.Linear(20, 3, bias=False))
    r = count_flops(model, torch.randn(7, 10))
    assert r.flops == 2 * r.macs == 2 * 7 * (10 * 20 + 20 * 3)


def _hf_case(kind):
    pytest.importorskip("transformers")
    from examples import hf

    if kind == "gpt2":
        model = hf.gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=128)
        dense = 2 * (64 * 3 * 64 + 64 * 64 + 64 * 256 + 256 * 64) + 64 * 500  # c_attn, c_proj, mlp.c_fc, mlp.c_proj; tied lm_head
    else:
        model = hf.bert(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=500)
        dense = 2 * (4 * 64 * 64 + 64 * 128 + 128 * 64) + 64 * 64  # q, k, v, o, intermediate, output; pooler
    return model, dense


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_transformers_contractions_equal_flop_counter_and_analytical(kind):
    from examples.hf import token_ids

    model, dense_per_token = _hf_case(kind)
    seq = 32
    ids = token_ids(1, seq, 500)
    r = count_flops(model, (ids,))
    by_op = r.by_operator("macs")
    attention = by_op.get(ATTENTION, 0)
    # analytical: dense part (pooler runs on one token for BERT) and attention layers x 2 x T^2 x d
    if kind == "gpt2":
        assert contraction_macs(r) == seq * dense_per_token
    else:
        assert contraction_macs(r) == seq * (dense_per_token - 64 * 64) + 64 * 64
    assert attention == 2 * 2 * seq * seq * 64
    # torch counts the contractions on CPU, but 0 for the CPU attention kernel
    assert 2 * contraction_macs(r) == torch_flops(model, (ids,))
    assert r.macs == contraction_macs(r) + attention


def test_sdpa_matches_flop_counter_on_meta_device():
    import torch.nn.functional as F

    class Attn(nn.Module):
        def forward(self, q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    shapes = dict(q=(2, 8, 33, 16), k=(2, 8, 47, 16), v=(2, 8, 47, 24))
    cpu = [torch.randn(*s) for s in shapes.values()] + [torch.zeros(33, 47)]
    meta = [t.to("meta") for t in cpu]
    r = count_flops(Attn(), tuple(cpu))
    torch_on_meta = torch_flops(Attn(), tuple(meta))
    assert r.flops == torch_on_meta == 2 * 2 * 8 * 33 * 47 * (16 + 24)
    # the peer's blind spot this test guards against: CPU's fused kernel (E == Ev) counts 0 in torch
    same = [torch.randn(2, 8, 33, 16), torch.randn(2, 8, 47, 16), torch.randn(2, 8, 47, 16), torch.zeros(33, 47)]
    assert torch_flops(Attn(), tuple(same)) == 0
    assert count_flops(Attn(), tuple(same)).flops == 2 * 2 * 8 * 33 * 47 * (16 + 16)
