"""Is flopcount's latency lower bound a bound? Held against real runs on this machine and
against published GPU results.

Part 1 (this machine): for each (model, batch, dtype, layout, threads) case, the eager bound
(``predict(...).bound_s("eager")``: the per-op roofline sum, or the any-implementation bound
where that is larger) on roofs measured here for that thread count, against the fastest of
``--runs`` (>= 5) timed runs of the same program. ``bound / fastest`` must not exceed 1.0
beyond 2 % timer noise; the script prints each ratio, the median ratio and Spearman's rank
correlation between bound and fastest. The roofs are measured for this run and not cached
(the load check would refuse to cache them while other jobs run; the load is printed).

Part 2 (datasheet parts): the any-implementation bound of the published workload on the
named part, against the published throughput or latency; no published result may be faster
than the bound. Sources:

* NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md,
  "Training performance results" (pytorch-21.03 NGC container), 1 GPU, batch 256:
  DGX A100 80GB: TF32 938 img/s, mixed precision 2470 img/s; DGX-1 V100 16GB: FP32 367 img/s,
  mixed precision 1200 img/s. "Inference performance: NVIDIA T4": FP32 batch 64 428 img/s,
  mixed precision batch 256 1198 img/s.
* NVIDIA NeMo Framework user guide, Performance, Llama-2 "Inference Performance",
  configuration 1 (chatbot: 128 input tokens, 20 output tokens), Llama-2-7B, batch 1, TP 1,
  1 GPU: average latency 234.0 ms on A100 80GB SXM4 and 153.8 ms on H100 80GB HBM3.

Part 1 on a GPU (``--device cuda``): the same cases built on the GPU (the thread-count cases
are left out), each run timed with CUDA events around the call (GPU time between the
markers, which is never more than the wall time: the stricter comparison), against three
bounds: ``predict(on="this gpu")``'s (the roofs measured here, best of two measurements, each
rate raised to the datasheet's: ``devices.gpu_ceiling``), the one on the raw measurement (shown,
not judged: tuned kernels beat our short measurements by a few per cent, which is why the ceiling
exists) and the one on the datasheet part ``torch.cuda.get_device_name()`` names
(``predict(on=...)``, what a user without the GPU gets). A case is ABOVE when the "this gpu" or
the datasheet bound exceeds its fastest run by more than 2 %.

``--break`` adds a second list (:func:`breaking_cases`, branch boundcheck): cases chosen to break
the bound — causal attention at long sequence (the CPU flash kernel skips the masked half),
dynamic int8 Linear (fbgemm's int8 products), ``torch._int_mm``, GRU, grouped and depthwise convolutions in
channels_last, a weight reused from cache, ops that are only overhead, an EmbeddingBag, batch
64, one thread.

``--break2`` adds a third (:func:`second_pass_cases`, branch boundcheck2): transposed
convolutions, upsampling, norm-heavy blocks, GQA, FFTs, sort/topk/cumsum, gathers from and
indexed writes into 64 MiB, fp16, and training steps (``predict(backward=True)`` against a
forward + backward), frozen layers included.

Run: ``PYTHONPATH=. python benchmarks/bound_suite.py [--runs 5] [--quick] [--break] [--break2] [--skip-first] [--only TEXT]
[--device cuda] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import statistics
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from _clock import Clock
from _ranks import spearman
from torch import nn

import flopcount
from flopcount.devices import Roofs, gpu_ceiling, named_roofs
from flopcount.devices.measured import best_of, measure_roofs

NOISE = 1.02  # a ratio up to 2 % above 1.0 is timer noise


@dataclass
class Case:
    name: str
    build: Callable[[], Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]]
    threads: int = 0  # 0: torch's default
    train: bool = False
    fresh: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None  # new kwargs per run (a cache)


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "?"


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    saved = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


# --------------------------------------------------------------------------- models


def _cast(model: nn.Module, x: torch.Tensor, dtype: torch.dtype, channels_last: bool = False) -> Tuple[nn.Module, torch.Tensor]:
    model = model.to(dtype).eval()
    x = x.to(dtype) if x.is_floating_point() else x
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, x


def cnn(name: str, batch: int, dtype: torch.dtype = torch.float32, channels_last: bool = False, size: int = 224):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        from flopcount.examples import mobilenet, resnet

        factory = {"resnet18": resnet.resnet18, "resnet50": resnet.resnet50, "mobilenet_v2": mobilenet.mobilenet_v2}[name]
        model, x = _cast(factory(), torch.randn(batch, 3, size, size), dtype, channels_last)
        return model, (x,), {}

    return build


def conv_stack(depthwise: bool, batch: int, dtype: torch.dtype = torch.float32, channels_last: bool = False):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        ch = 128 if depthwise else 64
        layers: List[nn.Module] = []
        for _ in range(8 if depthwise else 4):
            layers += [nn.Conv2d(ch, ch, 3, padding=1, groups=ch if depthwise else 1), nn.ReLU()]
        model, x = _cast(nn.Sequential(*layers), torch.randn(batch, ch, 56, 56), dtype, channels_last)
        return model, (x,), {}

    return build


class Elementwise(nn.Module):
    """60 elementwise ops on one activation (cache-resident when small)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(20):
            x = torch.relu(x * 1.0001 + 0.001 * i)
        return x


def elementwise(shape: Tuple[int, ...], dtype: torch.dtype = torch.float32):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        return Elementwise().eval(), (torch.randn(*shape, dtype=dtype),), {}

    return build


def mlp(batch: int, dtype: torch.dtype = torch.float32, width: int = 2048):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        model, x = _cast(nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)),
                         torch.randn(batch, width), dtype)
        return model, (x,), {}

    return build


def lstm(batch: int, seq: int = 32):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        return nn.LSTM(256, 512, num_layers=2, batch_first=True).eval(), (torch.randn(batch, seq, 256),), {}

    return build


def embedding(rows: int, dim: int, ids: int, batch: int = 1):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        return nn.Embedding(rows, dim).eval(), (torch.randint(0, rows, (batch, ids)),), {}

    return build


class RecSys(nn.Module):
    """Embedding-heavy: a big table, a sum over 20 ids per sample, then an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(200_000, 64)
        self.head = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids).sum(1))


def recsys(batch: int):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        return RecSys().eval(), (torch.randint(0, 200_000, (batch, 20)),), {}

    return build


class CacheUpdate(nn.Module):
    """A 64 MiB static KV cache updated in place at one position (index_copy_)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(16, 2048, 512))  # 16 x 2048 x 512 x 4 B = 64 MiB

    def forward(self, pos: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return self.cache.index_copy_(1, pos, new)


def cache_update():
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        return CacheUpdate().eval(), (torch.tensor([7]), torch.randn(16, 1, 512)), {}

    return build


def bert(batch: int, seq: int = 128, dtype: torch.dtype = torch.float32):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        from transformers import BertConfig, BertModel

        cfg = BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                         vocab_size=8000)
        model = BertModel(cfg).to(dtype).eval()
        return model, (torch.randint(0, 8000, (batch, seq)),), {}

    return build


def _gpt2(dtype: torch.dtype = torch.float32) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8000, n_positions=512, eos_token_id=0, bos_token_id=0)
    return GPT2LMHeadModel(cfg).to(dtype).eval()


def gpt2_prefill(batch: int, seq: int = 128, dtype: torch.dtype = torch.float32):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        return _gpt2(dtype), (torch.randint(0, 8000, (batch, seq)),), {"use_cache": False}

    return build


def gpt2_decode(static: bool, past: int = 128):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        from transformers import StaticCache

        model = _gpt2()
        ids = torch.randint(0, 8000, (1, past))
        with torch.no_grad():
            if static:
                cache = StaticCache(config=model.config, max_cache_len=2 * past)
                model(ids, past_key_values=cache, cache_position=torch.arange(past), use_cache=True)
                kwargs = {"past_key_values": cache, "cache_position": torch.tensor([past]), "use_cache": True}
            else:
                cache = model(ids, use_cache=True).past_key_values
                kwargs = {"past_key_values": cache, "use_cache": True}
        return model, (ids[:, -1:],), kwargs

    return build


def _fresh_cache(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """A dynamic cache grows by one token per call: each run (and the trace) gets a copy."""
    return {**kwargs, "past_key_values": copy.deepcopy(kwargs["past_key_values"])}


def cases(quick: bool) -> List[Case]:
    bf16 = torch.bfloat16
    every = [
        Case("resnet18 b1 fp32", cnn("resnet18", 1)),
        Case("resnet18 b1 fp32 1 thread", cnn("resnet18", 1), threads=1),
        Case("resnet18 b4 fp32", cnn("resnet18", 4)),
        Case("resnet18 b1 fp32 channels_last", cnn("resnet18", 1, channels_last=True)),
        Case("resnet18 b1 bf16", cnn("resnet18", 1, bf16)),
        Case("resnet18 b2 fp32 train step", cnn("resnet18", 2, size=128), train=True),
        Case("resnet50 b1 fp32", cnn("resnet50", 1)),
        Case("resnet50 b1 fp32 1 thread", cnn("resnet50", 1), threads=1),
        Case("mobilenet_v2 b1 fp32", cnn("mobilenet_v2", 1)),
        Case("mobilenet_v2 b8 fp32 channels_last", cnn("mobilenet_v2", 8, channels_last=True)),
        Case("depthwise 8x3x3 b1 fp32", conv_stack(True, 1)),
        Case("depthwise 8x3x3 b1 fp32 1 thread", conv_stack(True, 1), threads=1),
        Case("conv 4x3x3 b1 fp32", conv_stack(False, 1)),
        Case("conv 4x3x3 b1 fp32 1 thread", conv_stack(False, 1), threads=1),
        Case("conv 4x3x3 b1 bf16 channels_last", conv_stack(False, 1, bf16, channels_last=True)),
        Case("bert-small b1 s128 fp32", bert(1)),
        Case("bert-small b4 s128 fp32", bert(4)),
        Case("bert-small b1 s128 bf16", bert(1, dtype=bf16)),
        Case("gpt2-small prefill b1 s128 fp32", gpt2_prefill(1)),
        Case("gpt2-small prefill b1 s128 bf16", gpt2_prefill(1, dtype=bf16)),
        Case("gpt2-small decode dynamic cache", gpt2_decode(False), fresh=_fresh_cache),
        Case("gpt2-small decode static cache", gpt2_decode(True)),
        Case("embedding 1M x 64, 16 ids", embedding(1_000_000, 64, 16)),
        Case("recsys table 200k x 64, b128", recsys(128)),
        Case("static cache index_copy_ 64 MiB", cache_update()),
        Case("elementwise x60 1x64x56x56", elementwise((1, 64, 56, 56))),
        Case("elementwise x60 1x64x56x56 1 thread", elementwise((1, 64, 56, 56)), threads=1),
        Case("elementwise x60 8x64x112x112", elementwise((8, 64, 112, 112))),
        Case("mlp 2x2048 b1 fp32", mlp(1)),
        Case("mlp 2x2048 b1 fp32 1 thread", mlp(1), threads=1),
        Case("mlp 2x2048 b128 fp32", mlp(128)),
        Case("mlp 2x2048 b128 bf16", mlp(128, bf16)),
        Case("mlp 2x2048 b128 fp32 train step", mlp(128), train=True),
        Case("lstm 2x512 b1 s32", lstm(1)),
        Case("lstm 2x512 b16 s32", lstm(16)),
    ]
    return every[:8] if quick else every


class Attention(nn.Module):
    """One SDPA call on (B, H, S, D) queries, keys and values (the CPU flash kernel)."""

    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


def sdpa(seq: int, causal: bool, dtype: torch.dtype = torch.float32, heads: int = 8, dim: int = 64, batch: int = 1):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        q, k, v = (torch.randn(batch, heads, seq, dim, dtype=dtype) for _ in range(3))
        return Attention(causal).eval(), (q, k, v), {}

    return build


def gru(batch: int, seq: int = 32):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        return nn.GRU(256, 512, num_layers=2, batch_first=True).eval(), (torch.randn(batch, seq, 256),), {}

    return build


def grouped_conv(groups: int, batch: int, dtype: torch.dtype = torch.float32, channels_last: bool = False):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        layers: List[nn.Module] = []
        for _ in range(4):
            layers += [nn.Conv2d(128, 128, 3, padding=1, groups=groups), nn.ReLU()]
        model, x = _cast(nn.Sequential(*layers), torch.randn(batch, 128, 56, 56), dtype, channels_last)
        return model, (x,), {}

    return build


def quantized_mlp(batch: int, width: int = 2048):
    """``quantize_dynamic``'s int8 Linear (fbgemm: int8 weights, activations quantized per call)."""
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)).eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        return model, (torch.randn(batch, width),), {}

    return build


class IntMm(nn.Module):
    """``torch._int_mm`` called directly (int8 x int8 in int32): the int8 roof measures it since
    branch hwroofs (it ran above fbgemm's dynamic linear, which alone set the roof before)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randint(-128, 128, (width, width), dtype=torch.int8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch._int_mm(x, self.weight)


def int_mm(rows: int, width: int):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        return IntMm(width), (torch.randint(-128, 128, (rows, width), dtype=torch.int8),), {}

    return build


class Reused(nn.Module):
    """One Linear applied ``times`` times: its weight stays in cache after the first call."""

    def __init__(self, width: int, times: int) -> None:
        super().__init__()
        self.layer = nn.Linear(width, width)
        self.times = times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.times):
            x = self.layer(x)
        return x


def reused(width: int, times: int, batch: int = 1, dtype: torch.dtype = torch.float32):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        model, x = _cast(Reused(width, times), torch.randn(batch, width), dtype)
        return model, (x,), {}

    return build


class Tiny(nn.Module):
    """Ops on 16 numbers: each call is dispatch and launch overhead, no work."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(50):
            x = torch.tanh(x) + x
        return x


class BagModel(nn.Module):
    """An EmbeddingBag (sum of 20 rows per sample) from a 1M x 64 table, then a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(1_000_000, 64, mode="sum")
        self.head = nn.Linear(64, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(ids))


def embedding_bag(batch: int):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        return BagModel().eval(), (torch.randint(0, 1_000_000, (batch, 20)),), {}

    return build


class MoE(nn.Module):
    """Top-2 of 8 experts (Linear(1024, 4096) -> GELU -> Linear(4096, 1024), 32 MiB each):
    a batch-1 token reads 2 experts' weights, not all 8."""

    def __init__(self, experts: int = 8, width: int = 1024, hidden: int = 4096) -> None:
        super().__init__()
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
                                     for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.router(x).softmax(-1).topk(2, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            if rows.numel():
                out[rows] += weights[rows, slot, None] * expert(x[rows])
        return out


class UnusedHead(nn.Module):
    """A Linear(256, 256) body beside a 64 MiB Linear(4096, 4096) head this forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(256, 256)
        self.head = nn.Linear(4096, 4096)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class SlicedTable(nn.Module):
    """A learned positional table of 8192 x 1024 (32 MiB), of which a forward reads its first rows."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(8192, 1024))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pos[: x.shape[-2]]


def small(module: Callable[[], nn.Module], shape: Tuple[int, ...], dtype: torch.dtype = torch.float32):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        return module().eval(), (torch.randn(*shape, dtype=dtype),), {}

    return build


def breaking_cases() -> List[Case]:
    """Cases chosen to break the bound (``--break``): work a kernel skips (causal attention),
    integer kernels, cache-resident weights, overhead-only ops, layouts and thread counts the
    first list does not hold."""
    bf16 = torch.bfloat16
    return [
        Case("sdpa b1 h8 s2048 d64 fp32", sdpa(2048, False)),
        Case("sdpa causal b1 h8 s2048 d64 fp32", sdpa(2048, True)),
        Case("sdpa causal b1 h8 s2048 d64 fp32 1 thread", sdpa(2048, True), threads=1),
        Case("sdpa causal b1 h8 s4096 d64 fp32", sdpa(4096, True)),
        Case("sdpa causal b1 h8 s2048 d64 bf16", sdpa(2048, True, bf16)),
        Case("gru 2x512 b1 s32", gru(1)),
        Case("gru 2x512 b16 s32", gru(16)),
        Case("gru 2x512 b16 s32 1 thread", gru(16), threads=1),
        Case("lstm 2x512 b64 s32 1 thread", lstm(64), threads=1),
        Case("grouped conv g4 4x3x3 b1 fp32", grouped_conv(4, 1)),
        Case("grouped conv g4 4x3x3 b1 fp32 channels_last", grouped_conv(4, 1, channels_last=True)),
        Case("grouped conv g32 4x3x3 b8 fp32 channels_last", grouped_conv(32, 8, channels_last=True)),
        Case("depthwise 8x3x3 b1 fp32 channels_last", conv_stack(True, 1, channels_last=True)),
        Case("depthwise 8x3x3 b1 bf16 channels_last", conv_stack(True, 1, bf16, channels_last=True)),
        Case("conv 4x3x3 b16 fp32 channels_last", conv_stack(False, 16, channels_last=True)),
        Case("int8 dynamic mlp 2x2048 b1", quantized_mlp(1)),
        Case("int8 dynamic mlp 2x2048 b64", quantized_mlp(64)),
        Case("int8 dynamic mlp 2x2048 b64 1 thread", quantized_mlp(64), threads=1),
        Case("int8 dynamic mlp 2x2048 b256", quantized_mlp(256)),
        Case("int8 _int_mm 64x2048x2048", int_mm(64, 2048)),
        Case("int8 _int_mm 512x2048x2048", int_mm(512, 2048)),
        Case("int8 _int_mm 1024x1024x1024", int_mm(1024, 1024)),
        Case("mlp 2x2048 b64 fp32", mlp(64)),
        Case("mlp 2x2048 b64 bf16", mlp(64, bf16)),
        Case("mlp 2x2048 b64 bf16 1 thread", mlp(64, bf16), threads=1),
        Case("reused linear 512 x50 b1 fp32", reused(512, 50)),
        Case("reused linear 512 x50 b1 fp32 1 thread", reused(512, 50), threads=1),
        Case("reused linear 256 x200 b1 fp32", reused(256, 200)),
        Case("reused linear 1024 x20 b64 fp32", reused(1024, 20, 64)),
        Case("reused linear 1024 x20 b64 bf16", reused(1024, 20, 64, bf16)),
        Case("tiny ops x100 on 16 floats", small(Tiny, (16,))),
        Case("tiny ops x100 on 16 floats 1 thread", small(Tiny, (16,)), threads=1),
        Case("elementwise x60 1x16x56x56 (L2)", elementwise((1, 16, 56, 56))),
        Case("elementwise x60 1x16x56x56 (L2) 1 thread", elementwise((1, 16, 56, 56)), threads=1),
        Case("elementwise x60 1x64x56x56 bf16", elementwise((1, 64, 56, 56), bf16)),
        Case("embedding_bag 1M x 64, 20 ids, b128", embedding_bag(128)),
        Case("moe top-2 of 8 experts (32 MiB each) b1", small(MoE, (1, 1024))),
        Case("unused 64 MiB head, Linear(256) b1", small(UnusedHead, (1, 256))),
        Case("positional table 32 MiB, 16 rows read", small(SlicedTable, (1, 16, 1024))),
        Case("embedding 1M x 64, 64x128 ids 1 thread", embedding(1_000_000, 64, 128, 64), threads=1),
    ]


class Picked(nn.Module):
    """One call on its inputs (and the module's ``source`` buffer where given): the ops of the
    second pass (:func:`second_pass_cases`) each in a model of its own."""

    def __init__(self, call: Callable[..., torch.Tensor], source: Optional[torch.Tensor] = None, **layers: nn.Module) -> None:
        super().__init__()
        self.call = call
        if source is not None:
            self.register_buffer("source", source)
        for name, layer in layers.items():
            self.add_module(name, layer)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.call(self, *inputs)


def picked(call: Callable[..., torch.Tensor], *inputs: Callable[[], torch.Tensor],
           source: Optional[Callable[[], torch.Tensor]] = None, **layers: Callable[[], nn.Module]):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        model = Picked(call, None if source is None else source(), **{k: v() for k, v in layers.items()})
        return model.eval(), tuple(make() for make in inputs), {}

    return build


def _repeated(layer: str, times: int = 8):
    def call(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        for _ in range(times):
            x = getattr(m, layer)(x)
        return x

    return call


def _frozen(build, trainable: int = 2):
    """``build``'s model with all but its last ``trainable`` parameters frozen."""
    def frozen() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        model, args, kwargs = build()
        for p in list(model.parameters())[:-trainable]:
            p.requires_grad_(False)
        return model.train(), args, kwargs

    return frozen


def _deep_mlp(batch: int, width: int, depth: int):
    def build() -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
        layers: List[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers[:-1]), (torch.randn(batch, width),), {}

    return build


def second_pass_cases() -> List[Case]:
    """Cases of the second adversarial pass (``--break2``, branch boundcheck2): op families the
    first two lists do not hold (transposed convolutions, upsampling, norm-heavy blocks, GQA,
    FFTs, sorts, scans, gathers and indexed writes into 64 MiB, fp16 on a CPU without fp16
    units) and training steps (``predict(backward=True)`` against forward + backward), frozen
    layers included."""
    f16, bf16 = torch.float16, torch.bfloat16
    rows = lambda: torch.randn(32768, 512)  # noqa: E731  (64 MiB)
    ids16 = lambda: torch.randint(0, 32768, (16,))  # noqa: E731
    return [
        Case("convtranspose 64->64 k4 s2 b1 56", picked(lambda m, x: m.up(x), lambda: torch.randn(1, 64, 56, 56),
                                                         up=lambda: nn.ConvTranspose2d(64, 64, 4, 2, 1))),
        Case("convtranspose 256->128 k2 s2 b4 28", picked(lambda m, x: m.up(x), lambda: torch.randn(4, 256, 28, 28),
                                                           up=lambda: nn.ConvTranspose2d(256, 128, 2, 2))),
        Case("interpolate nearest x2 1x64x112", picked(lambda m, x: nn.functional.interpolate(x, scale_factor=2),
                                                        lambda: torch.randn(1, 64, 112, 112))),
        Case("interpolate bilinear x2 1x64x112", picked(lambda m, x: nn.functional.interpolate(x, scale_factor=2, mode="bilinear"),
                                                         lambda: torch.randn(1, 64, 112, 112))),
        Case("layernorm x8 8x512x768", picked(_repeated("norm"), lambda: torch.randn(8, 512, 768), norm=lambda: nn.LayerNorm(768))),
        Case("layernorm x8 8x512x768 bf16", picked(_repeated("norm"), lambda: torch.randn(8, 512, 768, dtype=bf16),
                                                    norm=lambda: nn.LayerNorm(768).to(bf16))),
        Case("groupnorm x8 8x256x32x32", picked(_repeated("norm"), lambda: torch.randn(8, 256, 32, 32),
                                                 norm=lambda: nn.GroupNorm(32, 256))),
        Case("gqa sdpa causal 32q/8kv s1024 d64", picked(
            lambda m, q, k, v: nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
            lambda: torch.randn(1, 32, 1024, 64), lambda: torch.randn(1, 8, 1024, 64), lambda: torch.randn(1, 8, 1024, 64))),
        Case("gqa decode 32q/8kv past 4096 d128", picked(
            lambda m, q, k, v: nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True),
            lambda: torch.randn(1, 32, 1, 128), lambda: torch.randn(1, 8, 4096, 128), lambda: torch.randn(1, 8, 4096, 128))),
        Case("fft rfft2 64x256x256", picked(lambda m, x: torch.fft.rfft2(x), lambda: torch.randn(64, 256, 256))),
        Case("fft fft2 complex64 1024x1024", picked(lambda m, x: torch.fft.fft2(x), lambda: torch.randn(1024, 1024, dtype=torch.complex64))),
        Case("sort 4M", picked(lambda m, x: torch.sort(x)[0], lambda: torch.randn(1 << 22))),
        Case("topk 16 of 8x1M", picked(lambda m, x: torch.topk(x, 16)[0], lambda: torch.randn(8, 1 << 20))),
        Case("cumsum 4096x4096 dim 1", picked(lambda m, x: torch.cumsum(x, 1), lambda: torch.randn(4096, 4096))),
        Case("gather 16x2048 of 64 MiB", picked(lambda m, x, i: torch.gather(x, 2, i), lambda: torch.randn(16, 2048, 512),
                                                 lambda: torch.randint(0, 512, (16, 2048, 1)))),
        Case("index_select 16 rows of 64 MiB", picked(lambda m, x, i: x.index_select(0, i), rows, ids16)),
        Case("x[ids] 16 rows of 64 MiB", picked(lambda m, x, i: x[i], rows, ids16)),
        Case("take 16 of 64 MiB", picked(lambda m, x, i: torch.take(x, i), rows, ids16)),
        Case("scatter_add_ 16 rows into 64 MiB", picked(lambda m, i, v: m.source.scatter_add_(0, i, v),
                                                         lambda: torch.randint(0, 32768, (16, 512)), lambda: torch.randn(16, 512), source=rows)),
        Case("index_put_ accumulate 16 rows into 64 MiB", picked(lambda m, i, v: m.source.index_put_((i,), v, accumulate=True),
                                                                  ids16, lambda: torch.randn(16, 512), source=rows)),
        Case("tiny ops x400 b1 on 8 floats", small(Tiny, (1, 8))),
        Case("mlp 2x2048 b128 fp16", mlp(128, f16)),
        Case("conv 4x3x3 b1 fp16", conv_stack(False, 1, f16)),
        Case("conv 4x3x3 b1 bf16 (NCHW)", conv_stack(False, 1, bf16)),
        Case("matmul 2048 x 2048^T", picked(lambda m, a, b: a @ b.t(), lambda: torch.randn(2048, 2048), lambda: torch.randn(2048, 2048))),
        Case("train mlp 2x2048 b128 1 thread", mlp(128), threads=1, train=True),
        Case("train linear 2048 b256", _deep_mlp(256, 2048, 1), train=True),
        Case("train mlp 2x2048 b128 first layer frozen", _frozen(mlp(128), trainable=2), train=True),
        Case("train frozen 2x2048 backbone + head b128", _frozen(lambda: (nn.Sequential(
            nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)), (torch.randn(128, 2048),), {})),
            train=True),
        Case("train mlp 2x2048 b128 bf16", mlp(128, bf16), train=True),
        Case("train conv 4x3x3 b2 1 thread", conv_stack(False, 2), threads=1, train=True),
        Case("train gpt2-small b1 s128", gpt2_prefill(1), train=True),
        Case("train lstm 2x512 b16 s32", lstm(16), train=True),
    ]


def gpu_cases() -> List[Case]:
    """Work large enough that a GPU is not launch-bound: how close the bound comes to a real run."""
    bf16 = torch.bfloat16
    return [
        Case("mlp 2x8192 b8192 bf16", mlp(8192, bf16, width=8192)),
        Case("mlp 2x8192 b8192 fp32", mlp(8192, width=8192)),
        Case("resnet50 b128 bf16 channels_last", cnn("resnet50", 128, bf16, channels_last=True)),
        Case("resnet50 b64 fp32 train step", cnn("resnet50", 64), train=True),
        Case("bert-small b64 s512 bf16", bert(64, 512, bf16)),
        Case("gpt2-small prefill b16 s512 bf16", gpt2_prefill(16, 512, bf16)),
        Case("elementwise x60 64x64x224x224", elementwise((64, 64, 224, 224))),
    ]


# --------------------------------------------------------------------------- timing


def _loss(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().sum()
    if isinstance(out, (tuple, list)):
        return _loss(out[0])
    return _loss(out[0] if not hasattr(out, "logits") else out.logits)


def fastest(case: Case, model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], runs: int,
            device: str = "cpu") -> float:
    """The fastest of ``runs`` timed calls (after two warm-ups)."""
    best = math.inf
    clock = Clock(device.startswith("cuda"))
    for i in range(runs + 2):
        kw = case.fresh(kwargs) if case.fresh else kwargs
        if clock.cuda:
            torch.cuda.synchronize()
        if case.train:
            model.zero_grad(set_to_none=True)
            t0 = clock.start()
            _loss(model(*args, **kw)).backward()
            took = clock.seconds(clock.stop(t0))
        else:
            with torch.no_grad():
                t0 = clock.start()
                model(*args, **kw)
                took = clock.seconds(clock.stop(t0))
        if i >= 2:
            best = min(best, took)
    return best


def roofs_here(n_threads: int, budget_s: float) -> Roofs:
    with threads(n_threads):
        return best_of(measure_roofs("cpu", budget_s=budget_s), measure_roofs("cpu", budget_s=budget_s))


def chosen(args: argparse.Namespace) -> List[Case]:
    """The first list (``--quick``: its first 8), then with ``--break`` the second, with
    ``--break2`` the third (``--skip-first``: without the first); ``--only`` keeps the cases whose name holds that text."""
    first = [] if args.skip_first else cases(args.quick)
    every = first + (breaking_cases() if args.breaking else []) + (second_pass_cases() if args.second else [])
    return [case for case in every if args.only in case.name]


def this_machine(args: argparse.Namespace) -> List[Dict[str, Any]]:
    results = []
    roofs_by_threads: Dict[int, Roofs] = {}
    for case in chosen(args):
        with threads(case.threads):
            n = torch.get_num_threads()
            if n not in roofs_by_threads:
                print(f"measuring roofs at {n} thread(s) (load {loadavg()}) ...", file=sys.stderr)
                roofs_by_threads[n] = roofs_here(n, args.roofs_budget)
                print("  " + roofs_by_threads[n].describe(), file=sys.stderr)
            roofs = roofs_by_threads[n]
            model, inputs, kwargs = case.build()
            kw = case.fresh(kwargs) if case.fresh else kwargs
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                predicted = flopcount.predict(model, inputs, kw, on=roofs, backward=case.train,
                                              loss_fn=_loss if case.train else None)
                before = loadavg()
                best = fastest(case, model, inputs, kwargs, args.runs)
            bound = predicted.bound_s("eager")
            row = {
                "case": case.name, "threads": n, "bound_s": bound, "per_op_s": predicted.latency_s,
                "any_s": predicted.any_s, "fastest_s": best, "ratio": bound / best, "load": before,
                "complete": predicted.complete,
            }
            results.append(row)
            flag = "  ABOVE" if row["ratio"] > NOISE else ""
            print(f"{case.name:40s} bound {bound * 1e3:9.3f} ms  fastest {best * 1e3:9.3f} ms  "
                  f"ratio {row['ratio']:.3f}{flag}  (load {before})", flush=True)
    return results


def on_gpu(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Part 1 on a GPU: each case built on it, CUDA-event timed, against the bound on the
    GPU's measured roofs under the datasheet ceiling (``on="this gpu"``), on the raw
    measurement (not judged) and on its datasheet part."""
    name = torch.cuda.get_device_name()
    measured = best_of(measure_roofs("cuda", budget_s=args.roofs_budget), measure_roofs("cuda", budget_s=args.roofs_budget))
    sheet = named_roofs(name)
    print(f"{name}\n  measured: {measured.describe()}\n  datasheet: {sheet.describe()}", flush=True)
    results = []
    for case in chosen(args) + gpu_cases():
        if case.threads:
            continue
        torch.manual_seed(0)
        with torch.device("cuda"):
            model, inputs, kwargs = case.build()
        kw = case.fresh(kwargs) if case.fresh else kwargs
        row: Dict[str, Any] = {"case": case.name}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for label, roofs in (("measured", measured), ("datasheet", sheet), ("gpu", gpu_ceiling(measured, sheet))):
                predicted = flopcount.predict(model, inputs, kw, on=roofs, backward=case.train,
                                              loss_fn=_loss if case.train else None)
                row[f"bound_{label}_s"] = predicted.bound_s("eager")
                row["complete"] = predicted.complete
            row["fastest_s"] = best = fastest(case, model, inputs, kwargs, args.runs, "cuda")
        row["ratio_measured"] = row["bound_measured_s"] / best
        row["ratio_datasheet"] = row["bound_datasheet_s"] / best
        row["ratio_gpu"] = row["bound_gpu_s"] / best
        results.append(row)
        flag = "  ABOVE" if max(row["ratio_gpu"], row["ratio_datasheet"]) > NOISE else ""
        print(f"{case.name:36s} bound {row['bound_gpu_s'] * 1e3:9.4f} ms (raw measured {row['bound_measured_s'] * 1e3:9.4f},"
              f" datasheet {row['bound_datasheet_s'] * 1e3:9.4f})  fastest {best * 1e3:9.4f} ms  ratio "
              f"{row['ratio_gpu']:.3f} (raw {row['ratio_measured']:.3f}, datasheet {row['ratio_datasheet']:.3f}){flag}", flush=True)
        del model, inputs, kwargs, kw
        torch.cuda.empty_cache()
    return results


# --------------------------------------------------------------------------- published


def _resnet50_meta(batch: int, dtype: torch.dtype) -> Tuple[nn.Module, torch.Tensor]:
    from flopcount.examples import resnet

    with torch.device("meta"):
        model = resnet.resnet50().to(dtype)
        x = torch.empty(batch, 3, 224, 224, dtype=dtype)
    return model, x


def _llama7b_meta() -> nn.Module:
    from transformers import LlamaForCausalLM

    from flopcount.examples.hf import llama2_7b_config

    with torch.device("meta"):
        return LlamaForCausalLM(llama2_7b_config()).to(torch.float16).eval()


def published() -> List[Dict[str, Any]]:
    rows = []
    warnings.simplefilter("ignore")
    # ResNet-50 v1.5 training, batch 256 on one GPU (DeepLearningExamples README).
    # TF32 / FP32: the model in float32 (cuDNN convolutions in TF32 on Ampere, the part's
    # default math mode); mixed precision: every floating tensor priced in float16 (a lower
    # bound: AMP keeps some work in float32).
    for part, precision, dtype, published_ips in (
        ("A100 80GB SXM", "TF32", None, 938.0),
        ("A100 80GB SXM", "AMP", "float16", 2470.0),
        ("V100 SXM2", "FP32", None, 367.0),
        ("V100 SXM2", "AMP", "float16", 1200.0),
    ):
        model, x = _resnet50_meta(256, torch.float32)
        result = flopcount.predict(model, x, on=part, dtype=dtype, backward=True)
        bound = result.any_s
        rows.append({"what": f"ResNet-50 training b256 {precision}", "part": named_roofs(part).device,
                     "bound_s": bound, "published_s": 256 / published_ips,
                     "published": f"{published_ips:g} img/s", "bound": f"{256 / bound:,.0f} img/s"})
    # ResNet-50 v1.5 inference on a T4 (same README): FP32 b64 428 img/s, AMP b256 1198 img/s
    for precision, dtype, batch, published_ips in (("FP32", None, 64, 428.0), ("AMP", "float16", 256, 1198.0)):
        model, x = _resnet50_meta(batch, torch.float32)
        result = flopcount.predict(model, x, on="t4", dtype=dtype)
        rows.append({"what": f"ResNet-50 inference b{batch} {precision}", "part": "T4", "bound_s": result.any_s,
                     "published_s": batch / published_ips, "published": f"{published_ips:g} img/s",
                     "bound": f"{batch / result.any_s:,.0f} img/s"})
    # Llama-2-7B fp16, 128 input tokens then 20 output tokens, batch 1 (NeMo docs): the prefill
    # (which yields the first token) and 19 decode steps. A decode step is bounded by a 1-token
    # forward without the cache (the real step also reads the cache: more time, not less).
    model = _llama7b_meta()
    for part, published_ms in (("A100 80GB SXM", 234.0), ("H100 SXM", 153.8)):
        prefill = flopcount.predict(model, torch.zeros(1, 128, dtype=torch.long, device="meta"), on=part).any_s
        step = flopcount.predict(model, torch.zeros(1, 1, dtype=torch.long, device="meta"), on=part).any_s
        bound = prefill + 19 * step
        rows.append({"what": "Llama-2-7B fp16 128 in / 20 out b1", "part": part, "bound_s": bound,
                     "published_s": published_ms / 1e3, "published": f"{published_ms:g} ms",
                     "bound": f"{bound * 1e3:.1f} ms"})
    for row in rows:
        row["ratio"] = row["bound_s"] / row["published_s"]
        flag = "  FASTER THAN THE BOUND" if row["ratio"] > 1.0 else ""
        print(f"{row['what']:38s} {row['part']:14s} bound {row['bound']:>12s}  published {row['published']:>10s}  "
              f"bound/published time {row['ratio']:.3f}{flag}", flush=True)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="timed runs per case (>= 5; the fastest counts)")
    parser.add_argument("--roofs-budget", type=float, default=1.0, help="seconds per roof measurement (two are taken)")
    parser.add_argument("--quick", action="store_true", help="the first 8 cases only")
    parser.add_argument("--break", dest="breaking", action="store_true",
                        help="also the cases chosen to break the bound (breaking_cases)")
    parser.add_argument("--break2", dest="second", action="store_true",
                        help="also the second pass's cases (second_pass_cases: new op families, training steps)")
    parser.add_argument("--skip-first", action="store_true", help="leave the first list out (with --break or --break2)")
    parser.add_argument("--only", default="", help="only the cases whose name holds this text")
    parser.add_argument("--skip-published", action="store_true")
    parser.add_argument("--json", default=None, help="write every figure to this file")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="part 1 on this machine's CPU or GPU")
    args = parser.parse_args(argv)
    if args.runs < 5:
        parser.error("--runs must be >= 5")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, default threads {torch.get_num_threads()}, "
          f"load {loadavg()}", flush=True)
    here = on_gpu(args) if args.device == "cuda" else this_machine(args)
    if args.device == "cuda":
        for r in here:
            r["bound_s"] = max(r["bound_gpu_s"], r["bound_datasheet_s"])
            r["ratio"] = max(r["ratio_gpu"], r["ratio_datasheet"])
        raw = max(here, key=lambda r: r["ratio_measured"])
        print(f"\nraw measured roofs (not judged): max ratio {raw['ratio_measured']:.3f} ({raw['case']}), "
              f"{sum(r['ratio_measured'] > NOISE for r in here)} above 1.02", flush=True)
    ratios = [r["ratio"] for r in here]
    above = [r for r in here if r["ratio"] > NOISE]
    rho = spearman([r["bound_s"] for r in here], [r["fastest_s"] for r in here])
    print(f"\n{len(here)} cases: median bound/fastest {statistics.median(ratios):.3f}, "
          f"max {max(ratios):.3f}, Spearman rho {rho:.3f}; above 1.02: {len(above)} "
          f"({', '.join(r['case'] for r in above) or 'none'}); load at the end {loadavg()}", flush=True)
    sheet = [] if args.skip_published else published()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"this_machine": here, "published": sheet, "spearman": rho,
                       "median_ratio": statistics.median(ratios)}, fh, indent=1)
    return 1 if above or any(r["ratio"] > 1.0 for r in sheet) else 0


if __name__ == "__main__":
    raise SystemExit(main())
