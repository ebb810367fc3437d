"""Counting on a CUDA GPU: the paths CI (no GPU) never runs. Run on a lent GPU by
``benchmarks/gpu_checks.sh``; skipped elsewhere.

* Each scaled-dot-product-attention backend a user can select with ``torch.nn.attention.sdpa_kernel``
  (flash, memory-efficient, cuDNN, math), forward and forward+backward, on the layout transformers
  uses (heads transposed out of (batch, seq, heads, dim): a non-contiguous query), every tracer.
* Structural reuse on a CUDA model: the same rows with reuse on and off, and the same total as the
  peer over a real forward on the GPU.

Oracles: ``torch.utils.flop_counter.FlopCounterMode`` over a real run on the GPU, under the same
backend (its per-operator FLOPs name the kernel that ran), and the hand formula for attention's two
contractions: 2 x (2 B H L S D) FLOPs forward.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import pytest
import torch
import torch.nn.functional as F
from conftest import cuda
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops

B, H, L, D = 2, 4, 128, 64
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


class Attend(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


def _qkv(dtype: torch.dtype, grad: bool) -> Tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    # (batch, seq, heads, dim) made (batch, heads, seq, dim) by a transpose: not contiguous
    return tuple(torch.randn(B, L, H, D, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_(grad)
                 for _ in range(3))


def _peer(model: nn.Module, inputs: Tuple[torch.Tensor, ...], backward: bool) -> Dict[str, int]:
    """Per-operator FLOPs of one real run on the GPU (FlopCounterMode's keys made aten::name)."""
    with FlopCounterMode(display=False) as counter:
        out = model(*inputs)
        if backward:
            out.sum().backward()
    torch.cuda.synchronize()
    return {"aten::" + str(op).split(".", 1)[1]: int(n) for op, n in counter.get_flop_counts().get("Global", {}).items() if n}


def _assert_counts_as_the_peer(result: Any, expected: Dict[str, int]) -> None:
    """torch counts contractions only (2 FLOPs per MAC): our MACs are the same work. Our forward
    books every backend under one name (``aten::scaled_dot_product_attention``, docs/conventions.md);
    a backward books the kernel the fake or real run chose, which must be the one the GPU ran."""
    assert 2 * result.macs == sum(expected.values())
    ours = result.by_operator("flops")
    assert {op: ours.get(op) for op in expected if op.endswith("_backward")} == {
        op: n for op, n in expected.items() if op.endswith("_backward")}


@cuda
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "train"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_each_sdpa_backend_counts_as_the_kernel_that_runs(tracer, backend, causal, backward):
    if backward and tracer == "jit":
        pytest.skip("backward=True needs the dispatch tracer")
    model = Attend(causal)
    inputs = _qkv(torch.float16, backward)
    with sdpa_kernel([BACKENDS[backend]]):
        try:
            expected = _peer(model, inputs, backward)
        except RuntimeError as error:  # this GPU / build has no such kernel for these inputs
            pytest.skip(f"{backend}: {error}".splitlines()[0])
        for t in inputs:
            t.grad = None
        before = [t.detach().clone() for t in inputs]
        result = count_flops(model, inputs, tracer=tracer, backward=backward)
    # the caller's tensors are left as found (values, and no .grad from our backward)
    assert all(torch.equal(a, b) and a.grad is None for a, b in zip(inputs, before))
    # forward: two contractions of B*H*L*L*D MACs each (causal counted whole, as torch does)
    assert backward or sum(expected.values()) == 2 * 2 * B * H * L * L * D
    _assert_counts_as_the_peer(result, expected)


@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
def test_default_backend_choice_on_fake_tensors_is_the_real_one(dtype):
    """With no sdpa_kernel context, the backward kernel our fake trace books is the one the GPU ran
    (fp32 has no flash kernel: another backend runs)."""
    model = Attend(causal=True)
    inputs = _qkv(dtype, True)
    expected = _peer(model, inputs, True)
    for t in inputs:
        t.grad = None
    _assert_counts_as_the_peer(count_flops(model, inputs, backward=True), expected)


def _gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    GPT2Config, GPT2LMHeadModel = transformers.GPT2Config, transformers.GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=512, n_embd=128, n_layer=6, n_head=4, n_positions=256)
    return GPT2LMHeadModel(config).eval().cuda()


@cuda
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_reuse_on_a_cuda_model_matches_reuse_off_and_the_real_run(monkeypatch, train):
    model = _gpt2().train(train)
    ids = torch.randint(0, 512, (3, 96), device="cuda")
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, (ids,))
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    on = count_flops(model, (ids,))
    assert on.to_dict() == off.to_dict()
    assert on.by_module("flops") == off.by_module("flops")
    with torch.no_grad():
        expected = _peer(model, (ids,), False)
    _assert_counts_as_the_peer(on, expected)


@cuda
def test_measured_float32_roof_is_true_float32_and_tf32_convs_have_their_own():
    """On an H100 the float32 roof was a cuDNN convolution's TF32 rate (72-77 TFLOP/s, above the
    67 TFLOP/s float32 datasheet peak); the true float32 GEMM reached 52."""
    from flopcount.devices import find_part, part_roofs
    from flopcount.devices.measured import measure_roofs

    assert not torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32  # torch's defaults
    roofs = measure_roofs("cuda", ["float32"], budget_s=1.0)
    assert dict(roofs.math) == {"conv": "tfloat32"}
    part = find_part(torch.cuda.get_device_name())
    if part is not None:
        assert roofs.peak_flops["float32"] <= 1.02 * part_roofs(part).peak("float32", "matmul")
