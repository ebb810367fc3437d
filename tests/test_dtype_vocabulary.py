"""Issue #27 item 6, "one vocabulary in the API" (branch vocab): every public call that takes a
dtype reads it by one rule (``flopcount.core.dtypes.parse_dtype``, docs/api.md#dtypes): a
torch.dtype, torch's name for it, or the short names the CLI takes; anything else is one
UsageError naming the call, the argument and the names it takes. Before, ``benchmark`` and
``module_latency`` took only torch.dtypes, ``estimate_memory`` and ``plan`` no short names, and
``predict`` / ``serve`` took anything (``predict(dtype="bogus")`` priced at a column nobody has).
Also: ``serve`` refuses exactly the tp a serving engine refuses, and an unknown optimizer name
is said before the backward=True it would need next."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
import torch
from torch import nn

import flopcount
from flopcount.errors import UsageError

SPELLINGS = [torch.bfloat16, "bfloat16", "torch.bfloat16", "bf16", " BF16 "]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def _build() -> nn.Module:
    return _mlp()


X = torch.randn(4, 16)


def test_each_short_name_means_what_torch_means_by_it():
    """The oracle is torch: a short name that is also one of torch's own aliases (half, float,
    double, long, int, short) names the dtype torch's attribute is; the others (bf16, fp16...)
    name the dtype of the torch name they stand for, and that name is a torch dtype."""
    from flopcount.core.dtypes import parse_dtype
    from flopcount.types import DTYPE_ALIASES

    for short, name in DTYPE_ALIASES.items():
        assert isinstance(getattr(torch, name), torch.dtype), name
        own = getattr(torch, short, None)
        if isinstance(own, torch.dtype):
            assert own is getattr(torch, name), short
        assert parse_dtype(short, "x") is getattr(torch, name)
        assert parse_dtype(f"torch.{name}", "x") is parse_dtype(name.upper(), "x") is getattr(torch, name)


def test_docs_list_every_short_name():
    """docs/api.md#dtypes is where the names are written once: each short name is in its table."""
    from flopcount.types import DTYPE_ALIASES

    text = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    section = text.split("### Dtypes", 1)[1].split("\n## ", 1)[0]
    for short, name in DTYPE_ALIASES.items():
        assert re.search(rf"\|\s*`{name}`\s*\|[^\n]*`{short}`", section), (short, name)


#: (the call, the argument) -> a run of it with that dtype argument, returning the dtype it ran in
CALLS: Dict[str, Callable[[Any], Any]] = {
    "benchmark: dtype": lambda d: flopcount.benchmark(_mlp(), X, iters=2, warmup=0, dtype=d).dtype,
    "module_latency: dtype": lambda d: flopcount.module_latency(_mlp(), X, iters=1, warmup=0, dtype=d) and "bfloat16",
    "estimate_memory: dtype": lambda d: flopcount.estimate_memory(_mlp(), X, dtype=d).dtype,
    "estimate_memory: autocast": lambda d: flopcount.estimate_memory(_mlp(), X, autocast=d) and "bfloat16",
    "predict: dtype": lambda d: flopcount.predict(_mlp(), X, on="h100", dtype=d).dtype,
}


@pytest.mark.parametrize("spelling", SPELLINGS, ids=repr)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_call_takes_every_spelling(call: str, spelling: Any):
    """Before: benchmark/module_latency refused every name, estimate_memory "bf16" and " BF16 "."""
    assert CALLS[call](spelling) == "bfloat16"


def test_the_same_spelling_gives_the_same_numbers():
    """A name is the dtype: estimate_memory's peak under autocast="bf16" is torch.bfloat16's."""
    by_dtype = flopcount.estimate_memory(_mlp(), X, backward=True, autocast=torch.bfloat16).peak_bytes
    assert flopcount.estimate_memory(_mlp(), X, backward=True, autocast="bf16").peak_bytes == by_dtype


def test_plan_takes_a_short_name():
    result = flopcount.plan(_build, (X,), autocast="bf16", on=None)
    assert result.dtype == "bfloat16"


#: (the call, the argument) -> a run with a bad dtype argument
BAD: Dict[str, Callable[[Any], Any]] = {
    "benchmark: dtype": lambda d: flopcount.benchmark(_mlp(), X, iters=2, warmup=0, dtype=d),
    "module_latency: dtype": lambda d: flopcount.module_latency(_mlp(), X, iters=1, warmup=0, dtype=d),
    "estimate_memory: dtype": lambda d: flopcount.estimate_memory(_mlp(), X, dtype=d),
    "estimate_memory: autocast": lambda d: flopcount.estimate_memory(_mlp(), X, autocast=d),
    "plan: mixed_precision": lambda d: flopcount.plan(_build, (X,), mixed_precision=d, on=None),
    "plan: autocast": lambda d: flopcount.plan(_build, (X,), autocast=d, on=None),
    "predict: dtype": lambda d: flopcount.predict(_mlp(), X, on="h100", dtype=d),
    "serve: dtype": lambda d: flopcount.serve(_tiny_gpt2(), torch.randint(0, 100, (1, 4)), 1, dtype=d),
}


@pytest.mark.parametrize("bad", ["bf17", 3], ids=repr)
@pytest.mark.parametrize("call", sorted(BAD))
def test_one_error_names_the_argument_and_the_names(call: str, bad: Any):
    """Before: predict took "bf17" and 3 silently, serve failed after the count on an item size,
    benchmark's line named neither the call nor a name it takes."""
    with pytest.raises(UsageError) as info:
        BAD[call](bad)
    message = str(info.value)
    assert message.startswith(f"{call} must be "), message
    assert "bfloat16 (bf16)" in message and "docs/api.md#dtypes" in message
    assert (f"unknown dtype {bad!r}" if isinstance(bad, str) else "got int 3") in message


def test_a_timed_forward_takes_only_what_autocast_runs():
    """torch.autocast runs float16 and bfloat16 (float32: no autocast); an integer dtype is refused."""
    with pytest.raises(UsageError, match=r"^benchmark: dtype must be torch\.float32, torch\.float16, torch\.bfloat16 .*got torch\.int64"):
        flopcount.benchmark(_mlp(), X, iters=2, warmup=0, dtype=torch.int64)
    assert flopcount.benchmark(_mlp(), X, iters=2, warmup=0, dtype="fp32").dtype == "float32"


def test_predict_names_tf32_a_math_mode():
    """TF32 is float32 data under a math mode, not a dtype: the modes are given with the part."""
    with pytest.raises(UsageError, match=r"predict: dtype 'tf32' is a math mode of float32.*matmul_tf32=True"):
        flopcount.predict(_mlp(), X, on="h100", dtype="tf32")
    assert flopcount.predict(_mlp(), X, on="h100", dtype="int8").dtype == "int8"


def _tiny_gpt2() -> nn.Module:
    from flopcount.examples import hf

    return hf.gpt2(n_layer=1, n_embd=64, n_head=4, vocab_size=100, n_positions=32)


def test_serve_weight_dtype_takes_formats_and_float_names():
    pytest.importorskip("transformers")
    ids = torch.randint(0, 100, (1, 4))
    for given, priced in (("w8", "int8"), ("fp8", "float8_e4m3fn"), ("bf16", "bfloat16"), (torch.float16, "float16")):
        assert flopcount.serve(_tiny_gpt2(), ids, 1, weight_dtype=given).weight_dtype == priced
    with pytest.raises(UsageError, match=r"^serve: weight_dtype \(int8, int4 and fp8 are weight-only formats; any other\) "
                                         r"must be a floating torch\.dtype.*got 'int3'"):  # torch.int3 is a dtype, not floating
        flopcount.serve(_tiny_gpt2(), ids, 1, weight_dtype="int3")


# --------------------------------------------------------------------------- serve's tp rule


def _vllm_takes(heads: int, kv_heads: int, tp: int) -> bool:
    """vLLM's QKVParallelLinear (vllm/model_executor/layers/linear.py), written out by hand:
    ``divide(total_num_heads, tp)``; below tp KV heads ``divide(total_num_kv_heads, tp)``, from
    tp up ``divide(tp, total_num_kv_heads)`` replicas; ``divide`` asserts an exact division."""
    if heads % tp:
        return False
    return kv_heads % tp == 0 if tp < kv_heads else tp % kv_heads == 0


@pytest.mark.parametrize("heads, kv_heads", [(32, 8), (32, 32), (4, 2), (12, 4), (8, 1), (48, 12)])
def test_serve_refuses_exactly_what_vllm_refuses(heads: int, kv_heads: int):
    """Before: tp=64 on 32 heads and 8 KV heads (a multiple of the KV heads, above the heads) was
    priced; a real server refuses it (32 heads do not divide over 64 ranks)."""
    from flopcount.serving.serve import _whole_heads

    for tp in range(2, 2 * heads + 1):
        if _vllm_takes(heads, kv_heads, tp):
            _whole_heads(heads, kv_heads, tp)
        else:
            with pytest.raises(UsageError, match=rf"serve: tp={tp} does not"):
                _whole_heads(heads, kv_heads, tp)


def test_serve_refuses_tp_above_the_heads_before_counting(monkeypatch):
    """A tiny LLaMA with 4 heads and 2 KV heads: tp=8 is a multiple of the KV heads, but 4 heads
    do not split over 8 ranks; refused naming the heads, before generate() is counted."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=8, vocab_size=50, max_position_embeddings=64)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.zeros(1, 4, dtype=torch.int64, device="meta")
    serving = importlib.import_module("flopcount.serving.serve")

    def no_count(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("counted before the tp was refused")

    monkeypatch.setattr(serving, "serve_facts", no_count)
    with pytest.raises(UsageError, match=r"serve: tp=8 does not divide the model's 4 attention heads .*\(e\.g\. 2, 4\)"):
        flopcount.serve(model, ids, 2, on="h100", tp=8)


# --------------------------------------------------------------------------- optimizer= first


@pytest.mark.parametrize("call", ["count_flops", "estimate_memory"])
def test_an_unknown_optimizer_is_named_before_backward(call: str):
    """Before: "needs backward=True" first, then, once given, "unknown optimizer 'adamm'"."""
    with pytest.raises(UsageError, match=rf"^{call}: unknown optimizer 'adamm' \(known: sgd, sgd-momentum, adam, adamw, adagrad\)"):
        getattr(flopcount, call)(_mlp(), X, optimizer="adamm")
    with pytest.raises(UsageError, match="backward=True"):  # the name fixed, the next thing to fix
        getattr(flopcount, call)(_mlp(), X, optimizer="adam")


def test_plan_names_an_unknown_optimizer_before_building():
    """Before: plan built the model and traced the step (1.4 s here) before naming it."""
    built = []

    def build() -> nn.Module:
        built.append(1)
        return _mlp()

    with pytest.raises(UsageError, match=r"^plan: unknown optimizer 'adamm'"):
        flopcount.plan(build, (X,), optimizer="adamm", on=None)
    assert built == []
    flopcount.plan(build, (X,), optimizer="none", on=None)  # "none" is no optimizer, not an unknown name
    assert built  # built (once per planned run)
