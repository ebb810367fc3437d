"""The torch.nn part of the coverage zoo: every layer class in ``torch.nn.modules`` that
builds with simple arguments, each with a small input (batch 2, non-contiguous where the
layer takes a float tensor), and a hand-derived MAC count for the contraction layers.

Formulas (1 MAC = one multiply-accumulate, biases not counted, docs/conventions.md):
Linear rows·in·out; Conv M·(C_in/groups)·k; ConvTranspose N_in·(C_out/groups)·k;
Bilinear rows·out·in1·in2; RNN/LSTM/GRU steps·batch·gates·H·(in + H) per layer;
attention B·H·Lq·Lk·(E + Ev) per SDPA.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

Inputs = Tuple[Tuple[Any, ...], Dict[str, Any]]


@dataclass(frozen=True)
class Case:
    """One model of the zoo: how to build it and its inputs, and what it should cost."""

    family: str
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], Inputs]
    train: bool = False
    ref_macs: Optional[int] = None  # MACs expected on ``inputs`` (or on ``ref_inputs``)
    ref_source: str = ""
    ref_inputs: Optional[Callable[[], Inputs]] = None  # other inputs the reference is stated for (run on meta)
    ref_params: Optional[int] = None
    note: str = ""
    ref_build: Optional[Callable[[], nn.Module]] = None  # the model the reference is stated for, if not ``build``


def nc(*shape: int) -> torch.Tensor:
    """A non-contiguous float tensor of ``shape`` (the transpose of a contiguous one)."""
    if len(shape) < 2:
        return torch.randn(*shape)
    flipped = shape[:-2] + (shape[-1], shape[-2])
    return torch.randn(*flipped).transpose(-1, -2)


def _one(*tensors: Any) -> Callable[[], Inputs]:
    def make() -> Inputs:
        return tuple(t.clone() for t in tensors), {}  # clone keeps the strides: still non-contiguous

    return make


def _in(factory: Callable[[], Tuple[Any, ...]]) -> Callable[[], Inputs]:
    def make() -> Inputs:
        return factory(), {}

    return make


def _x(*shape: int) -> Callable[[], Inputs]:
    """One fresh non-contiguous float input of ``shape``."""

    def make() -> Inputs:
        return (nc(*shape),), {}

    return make


X1 = _x(2, 4, 6)  # (N, C, L) or (B, T, F)
X2 = _x(2, 4, 5, 5)
X3 = _x(2, 4, 3, 4, 4)

# Classes that are not layers, or need arguments this table cannot invent.
SKIPPED: Dict[str, str] = {
    "Module": "base class",
    "Container": "deprecated container base class",
    "Sequential": "container (its members are listed)",
    "ModuleList": "container without forward",
    "ModuleDict": "container without forward",
    "ParameterList": "container without forward",
    "ParameterDict": "container without forward",
    "RNNBase": "base class (needs a mode string; RNN/LSTM/GRU listed)",
    "RNNCellBase": "base class without forward",
    "SyncBatchNorm": "forward needs torch.distributed in training (BatchNorm*d listed)",
}


def _layer(name: str, *args: Any, **kwargs: Any) -> Callable[[], nn.Module]:
    """A constructor of ``torch.nn.<name>(*args, **kwargs)``."""

    def build() -> nn.Module:
        module: nn.Module = getattr(nn, name)(*args, **kwargs)
        return module

    return build


def _rnn_macs(gates: int, inp: int, hidden: int, steps: int, layers: int = 1, dirs: int = 1) -> int:
    total, width = 0, inp
    for _ in range(layers):
        total += dirs * steps * gates * hidden * (width + hidden)
        width = hidden * dirs
    return total


def _attn(batch: int, heads: int, lq: int, lk: int, head_dim: int) -> int:
    return batch * heads * lq * lk * 2 * head_dim


def _mha(batch: int, lq: int, lk: int, d: int, heads: int) -> int:
    """q and out projections on Lq rows, k and v on Lk rows, then attention."""
    return batch * (2 * lq + 2 * lk) * d * d + _attn(batch, heads, lq, lk, d // heads)


def _enc_layer(batch: int, seq: int, d: int, heads: int, ff: int) -> int:
    return _mha(batch, seq, seq, d, heads) + batch * seq * 2 * d * ff


def _dec_layer(batch: int, lt: int, lm: int, d: int, heads: int, ff: int) -> int:
    return _mha(batch, lt, lt, d, heads) + _mha(batch, lt, lm, d, heads) + batch * lt * 2 * d * ff


def _pooled(dims: int) -> Tuple[Any, ...]:
    """A max-pooled input and its indices, as MaxUnpool takes them."""
    x = nc(*((2, 4) + (8,) * dims))
    fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[dims]
    out, idx = fn(x, 2, return_indices=True)
    return (out, idx)


def _specs() -> List[Tuple[str, Callable[[], nn.Module], Callable[[], Inputs], Optional[int]]]:
    """(label, constructor, inputs, reference MACs or None) for each layer we can build."""
    specs: List[Tuple[str, Callable[[], nn.Module], Callable[[], Inputs], Optional[int]]] = []

    def add(label: str, ctor: Callable[[], nn.Module], inputs: Callable[[], Inputs], ref: Optional[int] = None) -> None:
        specs.append((label, ctor, inputs, ref))

    # activations and shape layers: zero MACs
    for name in ("CELU ELU GELU Hardshrink Hardsigmoid Hardswish Hardtanh Identity LeakyReLU LogSigmoid Mish PReLU "
                 "ReLU ReLU6 RReLU SELU SiLU Sigmoid Softplus Softshrink Softsign Tanh Tanhshrink Dropout AlphaDropout "
                 "Flatten").split():
        add(name, getattr(nn, name), X1, 0)
    add("GELU(tanh)", lambda: nn.GELU(approximate="tanh"), X1, 0)
    for name in ("Softmax", "Softmin", "LogSoftmax"):
        add(name, _layer(name, dim=-1), X1, 0)
    add("GLU", nn.GLU, X1, 0)
    add("Threshold", lambda: nn.Threshold(0.1, 0.0), X1, 0)
    add("Softmax2d", nn.Softmax2d, X2, 0)
    add("Dropout1d", nn.Dropout1d, X1, 0)
    add("Dropout2d", nn.Dropout2d, X2, 0)
    add("Dropout3d", nn.Dropout3d, X3, 0)
    add("FeatureAlphaDropout", nn.FeatureAlphaDropout, X2, 0)
    add("Unflatten", lambda: nn.Unflatten(1, (2, 2)), X1, 0)
    add("ChannelShuffle", lambda: nn.ChannelShuffle(2), X2, 0)
    add("PixelShuffle", lambda: nn.PixelShuffle(2), _one(nc(2, 8, 3, 3)), 0)
    add("PixelUnshuffle", lambda: nn.PixelUnshuffle(2), _one(nc(2, 2, 6, 6)), 0)

    # contractions
    add("Linear", lambda: nn.Linear(6, 5), X1, 2 * 4 * 6 * 5)
    add("Linear(no bias)", lambda: nn.Linear(6, 5, bias=False), X1, 2 * 4 * 6 * 5)
    add("LazyLinear", lambda: nn.LazyLinear(5), X1, 2 * 4 * 6 * 5)
    add("Bilinear", lambda: nn.Bilinear(6, 5, 3), _one(nc(2, 4, 6), nc(2, 4, 5)), 2 * 4 * 3 * 6 * 5)
    conv_in = {1: (2, 4, 10), 2: (2, 4, 8, 8), 3: (2, 4, 5, 6, 6)}
    for d, shape in conv_in.items():
        out_sp = [s - 2 for s in shape[2:]]
        k = 3**d
        conv_ref = 2 * 6 * _prod(out_sp) * 4 * k
        tconv_ref = _prod(shape) * 6 * k
        add(f"Conv{d}d", _layer(f"Conv{d}d", 4, 6, 3), _one(nc(*shape)), conv_ref)
        add(f"LazyConv{d}d", _layer(f"LazyConv{d}d", 6, 3), _one(nc(*shape)), conv_ref)
        add(f"ConvTranspose{d}d", _layer(f"ConvTranspose{d}d", 4, 6, 3), _one(nc(*shape)), tconv_ref)
        add(f"LazyConvTranspose{d}d", _layer(f"LazyConvTranspose{d}d", 6, 3), _one(nc(*shape)),
            tconv_ref)
    add("Conv2d(groups=2,stride=2)", lambda: nn.Conv2d(4, 6, 3, stride=2, groups=2), _one(nc(2, 4, 8, 8)),
        2 * 6 * 3 * 3 * 2 * 9)
    add("Conv2d(depthwise)", lambda: nn.Conv2d(4, 4, 3, padding=1, groups=4), _one(nc(2, 4, 8, 8)),
        2 * 4 * 8 * 8 * 1 * 9)
    add("Embedding", lambda: nn.Embedding(10, 6), _one(torch.randint(0, 10, (2, 5))), 0)
    add("EmbeddingBag", lambda: nn.EmbeddingBag(10, 6), _one(torch.randint(0, 10, (2, 5))), 0)

    # recurrent (input (B, T, F) with batch_first, non-contiguous)
    seq = X1  # (2, 4, 6): batch 2, 4 steps, 6 features
    add("RNN", lambda: nn.RNN(6, 5, batch_first=True), seq, _rnn_macs(1, 6, 5, 8))
    add("RNN(relu,2 layers)", lambda: nn.RNN(6, 5, num_layers=2, nonlinearity="relu", batch_first=True), seq,
        _rnn_macs(1, 6, 5, 8, layers=2))
    add("LSTM", lambda: nn.LSTM(6, 5, batch_first=True), seq, _rnn_macs(4, 6, 5, 8))
    add("LSTM(bidirectional)", lambda: nn.LSTM(6, 5, batch_first=True, bidirectional=True), seq,
        _rnn_macs(4, 6, 5, 8, dirs=2))
    add("GRU", lambda: nn.GRU(6, 5, batch_first=True), seq, _rnn_macs(3, 6, 5, 8))
    add("RNNCell", lambda: nn.RNNCell(6, 5), _one(nc(2, 6)), _rnn_macs(1, 6, 5, 2))
    add("LSTMCell", lambda: nn.LSTMCell(6, 5), _one(nc(2, 6)), _rnn_macs(4, 6, 5, 2))
    add("GRUCell", lambda: nn.GRUCell(6, 5), _one(nc(2, 6)), _rnn_macs(3, 6, 5, 2))

    # attention and transformer layers: d=8, 2 heads, ff=16, batch_first, batch 2
    add("MultiheadAttention", lambda: nn.MultiheadAttention(8, 2, batch_first=True),
        _in(lambda: (nc(2, 5, 8), nc(2, 6, 8), nc(2, 6, 8))), _mha(2, 5, 6, 8, 2))
    add("TransformerEncoderLayer", lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
        _one(nc(2, 5, 8)), _enc_layer(2, 5, 8, 2, 16))
    add("TransformerDecoderLayer", lambda: nn.TransformerDecoderLayer(8, 2, 16, batch_first=True),
        _in(lambda: (nc(2, 5, 8), nc(2, 6, 8))), _dec_layer(2, 5, 6, 8, 2, 16))
    add("TransformerEncoder",
        lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2,
                                      enable_nested_tensor=False),
        _one(nc(2, 5, 8)), 2 * _enc_layer(2, 5, 8, 2, 16))
    add("TransformerDecoder",
        lambda: nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, batch_first=True), 2),
        _in(lambda: (nc(2, 5, 8), nc(2, 6, 8))), 2 * _dec_layer(2, 5, 6, 8, 2, 16))
    add("Transformer",
        lambda: nn.Transformer(8, 2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16, batch_first=True),
        _in(lambda: (nc(2, 6, 8), nc(2, 5, 8))), _enc_layer(2, 6, 8, 2, 16) + _dec_layer(2, 5, 6, 8, 2, 16))

    # pooling
    for d, shape in ((1, (2, 4, 8)), (2, (2, 4, 8, 8)), (3, (2, 4, 4, 6, 6))):
        x = _x(*shape)
        add(f"AvgPool{d}d", _layer(f"AvgPool{d}d", 2), x, 0)
        add(f"MaxPool{d}d", _layer(f"MaxPool{d}d", 2), x, 0)
        add(f"AdaptiveAvgPool{d}d", _layer(f"AdaptiveAvgPool{d}d", 3), x, 0)
        add(f"AdaptiveMaxPool{d}d", _layer(f"AdaptiveMaxPool{d}d", 3), x, 0)
        add(f"LPPool{d}d", _layer(f"LPPool{d}d", 2, 2), x, 0)
        add(f"MaxUnpool{d}d", _layer(f"MaxUnpool{d}d", 2), _in(functools.partial(_pooled, d)), 0)
    add("FractionalMaxPool2d", lambda: nn.FractionalMaxPool2d(2, output_size=3), _one(nc(2, 4, 8, 8)), 0)
    add("FractionalMaxPool3d", lambda: nn.FractionalMaxPool3d(2, output_size=2), _one(nc(2, 4, 4, 6, 6)), 0)

    # normalisation
    for d, x in ((1, X1), (2, X2), (3, X3)):
        add(f"BatchNorm{d}d", _layer(f"BatchNorm{d}d", 4), x, 0)
        add(f"LazyBatchNorm{d}d", _layer(f"LazyBatchNorm{d}d"), x, 0)
        add(f"InstanceNorm{d}d", _layer(f"InstanceNorm{d}d", 4, affine=True), x, 0)
        add(f"LazyInstanceNorm{d}d", _layer(f"LazyInstanceNorm{d}d"), x, 0)
    add("GroupNorm", lambda: nn.GroupNorm(2, 4), X2, 0)
    add("LayerNorm", lambda: nn.LayerNorm(6), X1, 0)
    add("RMSNorm", lambda: nn.RMSNorm(6), X1, 0)
    add("LocalResponseNorm", lambda: nn.LocalResponseNorm(2), X2, 0)
    add("CrossMapLRN2d", lambda: nn.CrossMapLRN2d(3), X2, 0)

    # padding
    for kind in ("Constant", "Circular", "Reflection", "Replication", "Zero"):
        for d, x in ((1, X1), (2, X2), (3, X3)):
            args = (1, 0.5) if kind == "Constant" else (1,)
            add(f"{kind}Pad{d}d", _layer(f"{kind}Pad{d}d", *args), x, 0)

    # resampling
    add("Upsample(nearest)", lambda: nn.Upsample(scale_factor=2), X2, 0)
    add("Upsample(bilinear)", lambda: nn.Upsample(scale_factor=2, mode="bilinear"), X2, 0)
    add("Upsample(bicubic)", lambda: nn.Upsample(scale_factor=2, mode="bicubic"), X2, 0)
    add("Upsample(trilinear)", lambda: nn.Upsample(scale_factor=2, mode="trilinear"), X3, 0)
    add("UpsamplingBilinear2d", lambda: nn.UpsamplingBilinear2d(scale_factor=2), X2, 0)
    add("UpsamplingNearest2d", lambda: nn.UpsamplingNearest2d(scale_factor=2), X2, 0)
    add("Fold", lambda: nn.Fold(output_size=(4, 4), kernel_size=2), _one(nc(2, 12, 9)), 0)
    add("Unfold", lambda: nn.Unfold(kernel_size=2), _one(nc(2, 3, 4, 4)), 0)

    # distances and losses (inputs (2, 5) unless the loss needs more)
    add("CosineSimilarity", nn.CosineSimilarity, _in(lambda: (nc(2, 4, 6), nc(2, 4, 6))), 0)
    add("PairwiseDistance", nn.PairwiseDistance, _in(lambda: (nc(2, 6), nc(2, 6))), 0)
    pair = _in(lambda: (nc(2, 5), torch.randn(2, 5)))
    for name in ("L1Loss", "MSELoss", "SmoothL1Loss", "HuberLoss", "MultiLabelSoftMarginLoss", "PoissonNLLLoss"):
        add(name, getattr(nn, name), pair, 0)
    add("SoftMarginLoss", nn.SoftMarginLoss, _in(lambda: (nc(2, 5), torch.randn(2, 5).sign())), 0)
    add("BCELoss", nn.BCELoss, _in(lambda: (torch.rand(5, 2).t(), torch.rand(2, 5))), 0)
    add("BCEWithLogitsLoss", nn.BCEWithLogitsLoss, _in(lambda: (nc(2, 5), torch.rand(2, 5))), 0)
    add("KLDivLoss", lambda: nn.KLDivLoss(reduction="batchmean"),
        _in(lambda: (F.log_softmax(nc(2, 5), -1), F.softmax(torch.randn(2, 5), -1))), 0)
    add("CrossEntropyLoss", nn.CrossEntropyLoss, _in(lambda: (nc(2, 5), torch.tensor([1, 3]))), 0)
    add("CrossEntropyLoss(3-D,smoothing)", lambda: nn.CrossEntropyLoss(label_smoothing=0.1),
        _in(lambda: (nc(2, 5, 3), torch.randint(0, 5, (2, 3)))), 0)
    add("NLLLoss", nn.NLLLoss, _in(lambda: (F.log_softmax(nc(2, 5), -1), torch.tensor([1, 3]))), 0)
    add("NLLLoss2d", nn.NLLLoss2d, _in(lambda: (F.log_softmax(nc(2, 3, 4, 4), 1), torch.randint(0, 3, (2, 4, 4)))), 0)
    add("GaussianNLLLoss", nn.GaussianNLLLoss, _in(lambda: (nc(2, 5), torch.randn(2, 5), torch.rand(2, 5) + 0.1)), 0)
    add("CosineEmbeddingLoss", nn.CosineEmbeddingLoss, _in(lambda: (nc(2, 5), nc(2, 5), torch.tensor([1.0, -1.0]))), 0)
    add("HingeEmbeddingLoss", nn.HingeEmbeddingLoss, _in(lambda: (nc(2, 5), torch.randn(2, 5).sign())), 0)
    add("MarginRankingLoss", nn.MarginRankingLoss,
        _in(lambda: (torch.randn(2), torch.randn(2), torch.tensor([1.0, -1.0]))), 0)
    add("MultiLabelMarginLoss", nn.MultiLabelMarginLoss,
        _in(lambda: (nc(2, 5), torch.tensor([[3, 0, -1, 1, 0], [1, 2, 4, -1, 0]]))), 0)
    add("MultiMarginLoss", nn.MultiMarginLoss, _in(lambda: (nc(2, 5), torch.tensor([1, 3]))), 0)
    add("TripletMarginLoss", nn.TripletMarginLoss, _in(lambda: (nc(2, 5), nc(2, 5), nc(2, 5))), 0)
    add("TripletMarginWithDistanceLoss", nn.TripletMarginWithDistanceLoss, _in(lambda: (nc(2, 5), nc(2, 5), nc(2, 5))),
        0)
    add("CTCLoss", nn.CTCLoss, _in(lambda: (F.log_softmax(torch.randn(6, 2, 4), -1), torch.tensor([[1, 2], [3, 1]]),
                                            torch.tensor([6, 5]), torch.tensor([2, 2]))), 0)
    add("AdaptiveLogSoftmaxWithLoss", lambda: nn.AdaptiveLogSoftmaxWithLoss(6, 10, cutoffs=[4]),
        _in(lambda: (nc(8, 6), torch.tensor([0, 1, 2, 3, 4, 5, 8, 9]))),
        8 * 6 * (4 + 1) + 4 * (6 * 1 + 1 * 6))  # head on 8 rows; tail 6 -> 6 // 4 -> 6 on the 4 targets >= 4
    add("LinearCrossEntropyLoss", lambda: nn.LinearCrossEntropyLoss(6, 5),
        _in(lambda: (nc(8, 6), torch.randint(0, 5, (8,)))), 8 * 6 * 5)
    return specs


def _prod(values: Any) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


# Layers whose count depends on train/eval: they also get an eval row.
MODE_SENSITIVE = ("Dropout", "BatchNorm", "InstanceNorm", "MultiheadAttention", "Transformer", "RReLU", "AlphaDropout")


def cases() -> List[Case]:
    out: List[Case] = []
    for label, ctor, inputs, ref in _specs():
        source = "formula" if ref else ("no contraction" if ref == 0 else "")
        out.append(Case("nn", label, ctor, inputs, train=True, ref_macs=ref, ref_source=source, note="train"))
        if any(key in label for key in MODE_SENSITIVE):
            out.append(Case("nn", f"{label} (eval)", ctor, inputs, train=False, ref_macs=ref, ref_source=source,
                            note="eval"))
    # the nested-tensor fast path of TransformerEncoder (eval + key padding mask)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    out.append(Case(
        "nn", "TransformerEncoder (eval, padding mask)",
        lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2),
        lambda: ((nc(2, 5, 8),), {"src_key_padding_mask": mask.clone()}),
        train=False, ref_macs=None, note="eval, nested-tensor fast path (8 of 10 tokens valid)",
    ))
    return out


def unlisted() -> Dict[str, str]:
    """Every ``torch.nn.modules`` class with no row, and why."""
    covered = {label.split("(")[0].split(" ")[0] for label, _, _, _ in _specs()}
    names = sorted(n for n, c in inspect.getmembers(nn.modules, inspect.isclass) if issubclass(c, nn.Module))
    return {n: SKIPPED.get(n, "no spec yet") for n in names if n not in covered}
