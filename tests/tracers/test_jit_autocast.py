"""tracer="jit" under torch.autocast books rows as the fake tracer does (docs/conventions.md,
"Autocast under jit"). The oracle is the fake tracer's rows on the same model: equal where the
two tracers agree without autocast; where they differ without it (layer norm's statistics), the
difference under autocast is the same one, checked by hand."""

from __future__ import annotations

from typing import Dict, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flopcount import count_flops

METRICS = ("flops", "macs", "bytes_read", "bytes_written")
BF16 = torch.bfloat16


class Projection(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))
        self.head = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class Attention(nn.Module):
    """Causal self-attention: packed qkv Linear, SDPA, out Linear, a matmul of the result."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.mix = nn.Parameter(torch.randn(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2) for t in self.qkv(x).split(d, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, d)
        return x + torch.matmul(self.out(a), self.mix)


class Block(nn.Module):
    """A pre-LN transformer block: LayerNorm, attention, LayerNorm, an addmm MLP (Conv1D-like) with GELU."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width)
        self.up_w, self.up_b = nn.Parameter(torch.randn(width, 4 * width)), nn.Parameter(torch.zeros(4 * width))
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        h = self.ln2(x)
        up = torch.addmm(self.up_b, h.reshape(-1, h.shape[-1]), self.up_w).reshape(*h.shape[:-1], -1)
        return x + self.down(F.gelu(up))


def _rows(model: nn.Module, x: torch.Tensor, tracer: str, autocast: bool) -> Dict[Tuple[str, str, str], int]:
    """(breakdown, metric, key) -> value, non-zero values only (a zero row is no cost: batch norm's
    ``empty`` is one the dispatch tracers see and jit does not)."""
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        result = count_flops(model, x, tracer=tracer)
    rows = {}
    for metric in METRICS:
        for breakdown in ("by_operator", "by_module"):
            for key, value in getattr(result, breakdown)(metric).items():
                if value:
                    rows[breakdown, metric, key] = value
    return rows


def _difference(model: nn.Module, x: torch.Tensor, autocast: bool) -> Dict[Tuple[str, str, str], int]:
    jit, fake = _rows(model, x, "jit", autocast), _rows(model, x, "auto", autocast)
    return {key: jit.get(key, 0) - fake.get(key, 0) for key in {*jit, *fake} if jit.get(key, 0) != fake.get(key, 0)}


def _models():
    torch.manual_seed(0)
    return {
        "projection": (Projection().eval(), torch.randn(3, 8)),
        "mlp": (nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).eval(), torch.randn(2, 16)),
        "conv": (ConvNet().eval(), torch.randn(2, 3, 12, 12)),
        "attention": (Attention().eval(), torch.randn(2, 6, 32)),
    }


@pytest.mark.parametrize("name", ["projection", "mlp", "conv", "attention"])
def test_jit_rows_under_autocast_equal_the_fake_tracers(name: str) -> None:
    """Before: jit booked autocast's casts inside F.linear/matmul/SDPA as ``aten::to`` ops (a bf16
    Linear(8, 4) on (3, 8) read 552 bytes more and wrote 264 more), and named the casts of other
    ops (conv, addmm) ``aten::to`` where the fake tracer has ``aten::_to_copy``."""
    model, x = _models()[name]
    assert _rows(model, x, "jit", autocast=True) == _rows(model, x, "auto", autocast=True)


def test_a_bf16_linear_reads_its_operands_as_passed() -> None:
    """Hand count, docs/conventions.md "Bytes": Linear(64, 32) on (8, 64) fp32 under bf16 autocast
    reads x, weight, bias in fp32 and writes the bf16 output; MACs 8·64·32."""
    model, x = nn.Linear(64, 32).eval(), torch.randn(8, 64)
    with torch.autocast("cpu", dtype=BF16):
        result = count_flops(model, x, tracer="jit")
    assert result.by_operator("bytes_read") == {"aten::linear": (8 * 64 + 32 * 64 + 32) * 4}
    assert result.by_operator("bytes_written") == {"aten::linear": 8 * 32 * 2}
    assert result.by_operator("macs") == {"aten::linear": 8 * 64 * 32}


def test_a_users_own_cast_in_the_call_is_still_booked() -> None:
    """``F.linear(x.to(bf16), w)`` under autocast: the user's cast is a call of its own, booked
    by every tracer (jit names it ``aten::to``, the dispatch tracers ``aten::_to_copy``); only the
    weight's and bias's casts are autocast's, inside the composite."""

    class Cast(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.to(BF16))

    x = torch.randn(3, 8)
    jit, fake = _rows(Cast().eval(), x, "jit", True), _rows(Cast().eval(), x, "auto", True)
    assert jit.pop(("by_operator", "bytes_read", "aten::to")) == fake.pop(("by_operator", "bytes_read", "aten::_to_copy")) == 3 * 8 * 4
    assert jit.pop(("by_operator", "bytes_written", "aten::to")) == fake.pop(("by_operator", "bytes_written", "aten::_to_copy")) == 3 * 8 * 2
    assert jit == fake


def test_layer_norms_statistics_are_the_one_difference_with_or_without_autocast() -> None:
    """Block: jit's ``aten::layer_norm`` returns the output only, the dispatch tracers see
    ``native_layer_norm`` also write mean and rstd (fp32 on CPU under autocast, whose layer norm
    runs in fp32): 2 norms × 12 rows × 2 statistics × 4 bytes, the same difference as without
    autocast; nothing else differs."""
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 6, 32)
    stats = 12 * 2 * 4
    expected = {
        ("by_operator", "bytes_written", "aten::layer_norm"): -2 * stats,
        ("by_module", "bytes_written", ""): -2 * stats,
        ("by_module", "bytes_written", "ln1"): -stats,
        ("by_module", "bytes_written", "ln2"): -stats,
    }
    assert _difference(model, x, autocast=True) == expected
    assert _difference(model, x, autocast=False) == expected


def test_tiny_gpt2_differs_under_autocast_only_as_without_it() -> None:
    pytest.importorskip("transformers")
    from flopcount.examples import hf

    torch.manual_seed(0)
    model = hf.gpt2(n_layer=1, n_embd=64, n_head=4, vocab_size=100, n_positions=32).eval()
    ids = torch.randint(0, 100, (1, 4))
    assert _difference(model, ids, autocast=True) == _difference(model, ids, autocast=False)


def test_a_transformer_encoder_layer_books_its_modules_as_the_fake_tracer() -> None:
    """nn.TransformerEncoderLayer in eval under autocast: jit records its unfused path, as the
    dispatch tracers do, so each child (self_attn, linear1, norm1...) has its row; FLOPs and MACs
    per module and per op equal the fake tracer's."""
    torch.manual_seed(0)
    model, x = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval(), torch.randn(2, 5, 32)
    jit, fake = _rows(model, x, "jit", True), _rows(model, x, "auto", True)
    flops = {key: value for key, value in fake.items() if key[1] in ("flops", "macs")}
    assert {key: value for key, value in jit.items() if key[1] in ("flops", "macs")} == flops
    assert flops["by_module", "macs", "linear1"] == 10 * 32 * 64
