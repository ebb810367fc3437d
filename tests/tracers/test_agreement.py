"""Every tracer gives the same operators, MACs and FLOPs (issue #9 finding 5, issue #12).

A zoo of torch.nn layers and small models at batch > 1, with 3-D, transposed and
non-contiguous inputs, in train and eval mode: ``by_operator()`` (zero rows dropped) for
FLOPs and for MACs is identical under ``tracer="jit"``, ``"dispatch"`` and ``"auto"``.
Where the MACs are simple they are also checked against a formula written here by hand,
else (the small zoo models) against FlopCounterMode run live.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F
from conftest import torch_contraction_flops
from torch import nn

from flopcount import count_flops

B = 3  # batch > 1 everywhere


def non_contiguous(*shape: int) -> torch.Tensor:
    """A tensor of ``shape`` whose last two dims are transposed in memory."""
    return torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)


class Fn(nn.Module):
    """A module whose forward is ``fn(self, *inputs)``, holding ``children``."""

    def __init__(self, fn: Callable[..., Any], **children: nn.Module):
        super().__init__()
        self.fn = fn
        for name, child in children.items():
            self.add_module(name, child)

    def forward(self, *inputs: Any) -> Any:
        return self.fn(self, *inputs)


def _mha_out(s: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
    out, weights = s.attn(q, k, v, **kw)
    # use the averaged weights too: jit drops work whose result is not used (issue #9.1)
    return out.sum() + (weights.sum() if weights is not None else 0)


E, H, L, S, FF = 8, 2, 5, 7, 16


def _mha_self_macs() -> int:
    # q/k/v and output projections + QK^T and AV
    return 4 * B * L * E * E + 2 * B * L * L * E


Case = Tuple[Callable[[], nn.Module], Callable[[], Tuple[Any, ...]], Optional[int]]

CASES: Dict[str, Case] = {
    # nn.Linear on 3-D, non-contiguous and transposed inputs (#9.5: dispatch counted the bias add)
    "linear_3d": (lambda: nn.Linear(8, 6), lambda: (torch.randn(B, 5, 8),), B * 5 * 8 * 6),
    "linear_3d_noncontiguous": (lambda: nn.Linear(8, 6), lambda: (non_contiguous(B, 5, 8),), B * 5 * 8 * 6),
    "linear_transposed": (lambda: nn.Linear(8, 6), lambda: (non_contiguous(B, 8),), B * 8 * 6),
    "linear_nobias": (lambda: nn.Linear(8, 6, bias=False), lambda: (non_contiguous(B, 5, 8),), B * 5 * 8 * 6),
    "flatten_linear": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 3)), lambda: (torch.randn(B, 3, 4),), B * 36),
    # attention
    "mha_self": (
        lambda: Fn(lambda s, x: _mha_out(s, x, x, x), attn=nn.MultiheadAttention(E, H, dropout=0.1, batch_first=True)),
        lambda: (torch.randn(B, L, E),),
        _mha_self_macs(),
    ),
    "mha_no_weights": (
        lambda: Fn(lambda s, x: _mha_out(s, x, x, x, need_weights=False), attn=nn.MultiheadAttention(E, H, batch_first=True)),
        lambda: (torch.randn(B, L, E),),
        _mha_self_macs(),
    ),
    "mha_key_padding_mask": (
        lambda: Fn(lambda s, x, m: _mha_out(s, x, x, x, key_padding_mask=m), attn=nn.MultiheadAttention(E, H, batch_first=True)),
        lambda: (torch.randn(B, L, E), torch.arange(L).expand(B, L) >= L - 1),
        _mha_self_macs(),
    ),
    "mha_cross_seq_first": (
        lambda: Fn(lambda s, x, y: _mha_out(s, x, y, y), attn=nn.MultiheadAttention(E, H)),
        lambda: (torch.randn(L, B, E), torch.randn(S, B, E)),
        B * L * E * E * 2 + 2 * B * S * E * E + 2 * B * L * S * E,
    ),
    "mha_kdim_vdim": (
        lambda: Fn(lambda s, x, y, z: _mha_out(s, x, y, z), attn=nn.MultiheadAttention(E, H, kdim=4, vdim=6, batch_first=True)),
        lambda: (torch.randn(B, L, E), torch.randn(B, S, 4), torch.randn(B, S, 6)),
        2 * B * L * E * E + B * S * (4 + 6) * E + 2 * B * L * S * E,
    ),
    "transformer_encoder_layer": (
        lambda: nn.TransformerEncoderLayer(E, H, FF, batch_first=True),
        lambda: (torch.randn(B, L, E),),
        _mha_self_macs() + 2 * B * L * E * FF,
    ),
    "transformer_encoder_layer_gelu_norm_first": (
        lambda: nn.TransformerEncoderLayer(E, H, FF, activation="gelu", norm_first=True, batch_first=True),
        lambda: (non_contiguous(B, L, E),),
        _mha_self_macs() + 2 * B * L * E * FF,
    ),
    "transformer_encoder": (
        lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, FF, batch_first=True), 2, enable_nested_tensor=False),
        lambda: (torch.randn(B, L, E),),
        2 * (_mha_self_macs() + 2 * B * L * E * FF),
    ),
    "transformer_decoder_layer": (
        lambda: nn.TransformerDecoderLayer(E, H, FF),
        lambda: (torch.randn(L, B, E), torch.randn(S, B, E)),
        _mha_self_macs() + 2 * B * L * E * E + 2 * B * S * E * E + 2 * B * L * S * E + 2 * B * L * E * FF,
    ),
    "sdpa": (
        lambda: Fn(lambda s, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        lambda: (torch.randn(B, H, L, 4), torch.randn(B, H, L, 4), non_contiguous(B, H, L, 4)),
        B * H * L * L * 8,
    ),
    # recurrent layers
    "rnn_relu_batch_first": (
        lambda: nn.RNN(4, 6, nonlinearity="relu", batch_first=True),
        lambda: (torch.randn(B, 7, 4),),
        B * 7 * (4 * 6 + 6 * 6),
    ),
    "rnn_tanh_bidirectional_2_layers": (
        lambda: nn.RNN(4, 6, num_layers=2, bidirectional=True, dropout=0.2),
        lambda: (non_contiguous(7, B, 4),),
        B * 7 * 2 * ((4 * 6 + 6 * 6) + (12 * 6 + 6 * 6)),
    ),
    "lstm": (lambda: nn.LSTM(4, 6, batch_first=True), lambda: (torch.randn(B, 7, 4),), B * 7 * 4 * 6 * (4 + 6)),
    "lstm_proj": (lambda: nn.LSTM(4, 6, num_layers=2, proj_size=3), lambda: (torch.randn(7, B, 4),), None),
    "gru_bidirectional": (
        lambda: nn.GRU(4, 6, batch_first=True, bidirectional=True),
        lambda: (torch.randn(B, 7, 4),),
        2 * B * 7 * 3 * 6 * (4 + 6),
    ),
    "lstm_cell": (lambda: nn.LSTMCell(4, 6), lambda: (torch.randn(B, 4),), B * 4 * 6 * (4 + 6)),
    "gru_cell": (lambda: nn.GRUCell(4, 6), lambda: (torch.randn(B, 4),), B * 3 * 6 * (4 + 6)),
    "rnn_cell": (lambda: nn.RNNCell(4, 6), lambda: (non_contiguous(B, 4),), B * 6 * (4 + 6)),
    # contractions (#9.5: einsum outer product counted 0 MACs under dispatch)
    "einsum_outer": (lambda: Fn(lambda s, a, b: torch.einsum("i,j->ij", a, b)), lambda: (torch.randn(5), torch.randn(6)), 30),
    "einsum_three_operands": (
        lambda: Fn(lambda s, a, b, c: torch.einsum("bij,bjk,bkl->bil", a, b, c)),
        lambda: (torch.randn(B, 4, 5), non_contiguous(B, 5, 6), torch.randn(B, 6, 2)),
        B * 4 * 5 * 6 + B * 4 * 6 * 2,
    ),
    "bilinear": (lambda: nn.Bilinear(4, 5, 3), lambda: (torch.randn(B, 7, 4), torch.randn(B, 7, 5)), B * 7 * 3 * 4 * 5),
    "matmul_broadcast": (
        lambda: Fn(lambda s, a, b: a @ b),
        lambda: (torch.randn(B, 1, 4, 5), non_contiguous(2, 5, 6)),
        B * 2 * 4 * 6 * 5,
    ),
    "matmul_vector": (
        lambda: Fn(lambda s, a, b: torch.matmul(a, b).sum() + a.matmul(b).sum()),
        lambda: (torch.randn(B, 4, 5), torch.randn(5)),
        2 * B * 4 * 5,
    ),
    "tensordot": (
        lambda: Fn(lambda s, a, b: torch.tensordot(a, b, dims=([1, 2], [0, 1]))),
        lambda: (torch.randn(B, 4, 5), torch.randn(4, 5, 6)),
        B * 6 * 4 * 5,
    ),
    "outer_inner": (
        lambda: Fn(lambda s, a, b: torch.outer(a, b).sum() + torch.inner(a, a)),
        lambda: (torch.randn(5), torch.randn(6)),
        30 + 5,
    ),
    # convolutions
    "conv1d_grouped_same": (lambda: nn.Conv1d(4, 8, 3, groups=2, padding="same"), lambda: (torch.randn(B, 4, 11),), B * 8 * 11 * 2 * 3),
    "conv2d_noncontiguous": (lambda: nn.Conv2d(3, 4, 3, stride=2), lambda: (non_contiguous(B, 3, 9, 9),), B * 4 * 4 * 4 * 3 * 9),
    "conv3d": (lambda: nn.Conv3d(2, 4, 3), lambda: (torch.randn(B, 2, 5, 5, 5),), B * 4 * 27 * 2 * 27),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(4, 2, 3, stride=2, groups=2), lambda: (torch.randn(B, 4, 5, 5),), B * 4 * 25 * 1 * 9),
    "conv_transpose1d": (lambda: nn.ConvTranspose1d(4, 2, 3), lambda: (torch.randn(B, 4, 5),), B * 4 * 5 * 2 * 3),
    # normalisation
    "batch_norm_1d": (lambda: nn.BatchNorm1d(4), lambda: (torch.randn(B, 4, 5),), 0),
    "batch_norm_2d": (lambda: nn.BatchNorm2d(3), lambda: (non_contiguous(B, 3, 4, 4),), 0),
    "batch_norm_no_stats": (lambda: nn.BatchNorm1d(4, track_running_stats=False), lambda: (torch.randn(B, 4),), 0),
    "layer_norm": (lambda: nn.LayerNorm(8), lambda: (non_contiguous(B, 5, 8),), 0),
    "group_norm": (lambda: nn.GroupNorm(2, 4), lambda: (torch.randn(B, 4, 5),), 0),
    "instance_norm": (lambda: nn.InstanceNorm2d(3, affine=True, track_running_stats=True), lambda: (torch.randn(B, 3, 4, 4),), 0),
    "rms_norm": (lambda: nn.RMSNorm(8), lambda: (torch.randn(B, 5, 8),), 0),
    # elementwise, softmax, dropout, losses
    "dropouts": (
        lambda: nn.Sequential(nn.Dropout(0.3), nn.Dropout2d(0.2), nn.AlphaDropout(0.1), nn.Dropout(0.0)),
        lambda: (torch.randn(B, 3, 4, 4),),
        0,
    ),
    "softmaxes": (lambda: nn.Sequential(nn.Softmax(-1), nn.LogSoftmax(1), nn.Softmin(1)), lambda: (non_contiguous(B, 4, 5),), 0),
    "activations": (
        lambda: nn.Sequential(
            nn.GELU(), nn.SiLU(), nn.PReLU(), nn.ELU(), nn.Hardswish(), nn.LeakyReLU(), nn.Softplus(), nn.Mish(),
            nn.Tanh(), nn.Sigmoid(), nn.ReLU6(), nn.GLU(), nn.LogSigmoid(),
        ),
        lambda: (non_contiguous(B, 4, 6),),
        0,
    ),
    "losses": (
        lambda: Fn(
            lambda s, x, t: F.cross_entropy(x, t)
            + F.cross_entropy(x, t, label_smoothing=0.1, reduction="sum")
            + F.nll_loss(F.log_softmax(x, 1), t)
            + F.mse_loss(x, x.flip(0))
            + F.l1_loss(x, x * 2)
            + F.smooth_l1_loss(x, x * 3)
            + F.binary_cross_entropy_with_logits(x, x.sigmoid())
            + F.kl_div(x, x.softmax(1), reduction="sum")
        ),
        lambda: (torch.randn(B, 5), torch.randint(0, 5, (B,))),
        0,
    ),
    # pooling, resampling, embeddings
    "pools_2d": (lambda: nn.Sequential(nn.MaxPool2d(2), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1)), lambda: (torch.randn(B, 3, 8, 8),), 0),
    "pools_1d": (
        lambda: nn.Sequential(nn.MaxPool1d(2), nn.AvgPool1d(2), nn.AdaptiveAvgPool1d(2), nn.AdaptiveMaxPool1d(1)),
        lambda: (torch.randn(B, 3, 16),),
        0,
    ),
    "adaptive_pools": (
        lambda: nn.Sequential(nn.AdaptiveAvgPool2d(3), nn.AdaptiveMaxPool2d(2), nn.LPPool2d(2, 1)),
        lambda: (torch.randn(B, 3, 8, 8),),
        0,
    ),
    "upsample": (
        lambda: nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear"), nn.Upsample(scale_factor=2, mode="nearest")),
        lambda: (torch.randn(B, 2, 4, 4),),
        0,
    ),
    "embedding_bag": (lambda: nn.EmbeddingBag(10, 4, mode="mean"), lambda: (torch.randint(0, 10, (B, 3)),), 0),
    "pixel_shuffle_fold": (
        lambda: nn.Sequential(nn.PixelShuffle(2), nn.Unfold(2), nn.Fold((4, 4), 2)),
        lambda: (torch.randn(B, 16, 2, 2),),
        0,
    ),
}


def _small_models() -> Dict[str, Case]:
    from examples.mobilenet import mobilenet_v2
    from examples.resnet import resnet18
    from examples.vit import vit_tiny

    return {
        "resnet18": (lambda: resnet18(num_classes=10), lambda: (torch.randn(2, 3, 32, 32),), None),
        "mobilenet_v2": (lambda: mobilenet_v2(num_classes=10), lambda: (torch.randn(2, 3, 32, 32),), None),
        "vit_tiny": (lambda: vit_tiny(), lambda: (torch.randn(2, 3, 32, 32),), None),
        "nn_transformer": (
            lambda: nn.Transformer(E, H, 1, 1, FF, batch_first=True),
            lambda: (torch.randn(B, L, E), non_contiguous(B, 4, E)),
            None,
        ),
    }


ALL = {**CASES, **_small_models()}


def _nonzero(values: Dict[str, int]) -> Dict[str, int]:
    return {op: v for op, v in values.items() if v}


def _count(model: nn.Module, inputs: Tuple[Any, ...], tracer: str) -> Any:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return count_flops(model, inputs, tracer=tracer)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", list(ALL))
def test_every_tracer_gives_the_same_operators_macs_and_flops(name: str, train: bool) -> None:
    build, make_inputs, hand_macs = ALL[name]
    torch.manual_seed(0)
    model = build().train(train)
    inputs = make_inputs()
    results = {tracer: _count(model, inputs, tracer) for tracer in ("jit", "dispatch", "auto")}
    jit = results["jit"]
    assert not jit.unsupported_ops(), jit.unsupported_ops()
    for tracer, result in results.items():
        assert result.unsupported_ops() == {}, (tracer, result.unsupported_ops())
        assert _nonzero(result.by_operator("flops")) == _nonzero(jit.by_operator("flops")), tracer
        assert _nonzero(result.by_operator("macs")) == _nonzero(jit.by_operator("macs")), tracer
        assert (result.macs, result.flops) == (jit.macs, jit.flops), tracer
    if hand_macs is not None:
        assert jit.macs == hand_macs
    else:  # the zoo models: FlopCounterMode run live on a fresh copy
        torch.manual_seed(0)
        assert 2 * jit.macs == torch_contraction_flops(build().train(train), inputs)


@pytest.mark.parametrize(
    "name", ["linear_3d_noncontiguous", "mha_self", "transformer_encoder_layer", "conv2d_noncontiguous", "bilinear", "einsum_outer"]
)
def test_dispatch_on_meta_tensors_gives_what_jit_gives_on_cpu(name: str) -> None:
    build, make_inputs, _ = ALL[name]
    torch.manual_seed(0)
    model = build().eval()
    inputs = make_inputs()
    on_cpu = _count(model, inputs, "jit")
    on_meta = _count(model.to("meta"), tuple(t.to("meta") for t in inputs), "dispatch")
    assert _nonzero(on_meta.by_operator("flops")) == _nonzero(on_cpu.by_operator("flops"))
    assert (on_meta.macs, on_meta.flops) == (on_cpu.macs, on_cpu.flops)


def test_backward_of_an_intercepted_composite_is_recorded_as_its_aten_ops() -> None:
    """Forward composites are one event; their backward runs as leaf aten ops (only the
    dispatch tracer sees backward): F.linear on a non-contiguous 3-D input is one
    aten::linear forward, and its input and weight gradients are two matmuls of its size."""
    model = nn.Linear(8, 6)
    x = non_contiguous(B, 5, 8).requires_grad_()
    r = count_flops(model, (x,), tracer="dispatch", backward=True)
    assert r.by_phase("macs") == {"forward": B * 5 * 8 * 6, "backward": 2 * B * 5 * 8 * 6}
    assert _nonzero(r.by_operator("macs"))["aten::linear"] == B * 5 * 8 * 6
    assert not x.grad and not model.weight.grad
