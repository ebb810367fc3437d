"""One training step (issue #27 item 2): one loss rule, one runner, one memory tracker.

Oracles: hand-derived FLOPs of a tiny model (derivations beside each test), and, for the
memory parity, the construction itself plus torch's MemTracker on a real step
(tests/test_memory*.py hold estimate_memory to it; here plan must equal estimate_memory
to the byte on three models). Before this change:
* ``count_flops(backward=True)`` and ``plan`` differentiated loss AND logits of a model
  called with labels (estimate_memory and the HF callback only the loss):
  ``test_every_entry_point_differentiates_the_loss_the_model_returns`` failed for both;
* ``plan`` had no ``autocast=`` and ``estimate_memory`` no ``loss_fn=``: the parity tests
  on the AMP model and with a custom loss failed (TypeError);
* ``estimate_memory(autocast=)`` inside the caller's ``torch.autocast`` cleared the
  caller's weight-cast cache: ``test_the_callers_autocast_cache_survives`` failed.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict

import pytest
import torch
from torch import nn

import flopcount
from flopcount.integrations._counting import StepCounter, batch_signature

pytest.importorskip("torch.distributed._tools.mem_tracker")

B, D, C = 3, 8, 5  # batch, features, classes


class Scored(nn.Module):
    """An HF-style model called with ``labels``: returns ``{"loss": ..., "logits": ...}``."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(D, C, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Dict[str, torch.Tensor]:
        logits = self.head(x)
        return {"loss": (logits * labels).sum(), "logits": logits}


def _hf_loss(outputs: Any) -> Any:  # what the HF callback hands StepCounter (integrations/hf.py's hf_loss)
    from flopcount.integrations.hf import hf_loss

    return hf_loss(outputs)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("tracer", ["auto", "dispatch"])  # jit sees no backward (a UsageError)
def test_every_entry_point_differentiates_the_loss_the_model_returns(tracer: str, mode: str) -> None:
    # Hand derivation, batch B, x (B, D) not requiring grad, W (C, D), labels (B, C):
    #   logits = x @ W^T; loss = sum(logits * labels)
    #   d loss / d logits = labels (expanded seed x labels): one aten::mul of B*C elements -> B*C FLOPs
    #   d loss / d W^T = x^T @ (d loss / d logits): aten::mm (D x B)(B x C) -> 2*B*C*D FLOPs
    #   (sum's backward is an expand, transposes are views: 0 FLOPs)
    # Differentiating the logits as well (the old rule of count_flops and plan) adds an
    # aten::add of the two logits gradients: B*C FLOPs more.
    expected = B * C + 2 * B * C * D
    torch.manual_seed(0)
    x, labels = torch.randn(B, D), torch.randn(B, C)
    model = Scored().train(mode == "train")
    counted = flopcount.count_flops(model, (x,), kwargs={"labels": labels}, backward=True, tracer=tracer)
    assert counted.by_phase()["backward"] == expected
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planned = flopcount.plan(Scored, (x,), {"labels": labels}, optimizer="none", device=None)
    assert planned.flops["backward"] == expected
    counter = StepCounter(_hf_loss)
    cost = counter.count_train(batch_signature((x,), {"labels": labels}), model, (x,), {"labels": labels})
    assert cost is not None and cost.backward == expected


def test_without_a_returned_loss_every_floating_output_is_differentiated() -> None:
    # Two outputs, logits (B, C) and h = logits * 2 (B, C): the default loss is their sum.
    # Backward with ones seeds: d/dh = 1 -> mul by 2 (B*C), add to d/dlogits = 1 (B*C),
    # then x^T @ g: 2*B*C*D. Total 2*B*C + 2*B*C*D.
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(D, C, bias=False)

        def forward(self, x: torch.Tensor) -> Any:
            logits = self.head(x)
            return logits, logits * 2

    x = torch.randn(B, D)
    counted = flopcount.count_flops(Two(), (x,), backward=True)
    assert counted.by_phase()["backward"] == 2 * B * C + 2 * B * C * D
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planned = flopcount.plan(Two, (x,), optimizer="none", device=None)
    assert planned.flops["backward"] == 2 * B * C + 2 * B * C * D


# ---------------------------------------------------------------- plan == estimate_memory


def _encoder() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.LayerNorm(96), nn.Linear(96, 48))


def _gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=32, vocab_size=97)
    config._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(config)


def _case(name: str) -> Any:
    gen = torch.Generator().manual_seed(0)
    if name == "encoder":
        return _encoder, (torch.randn(4, 16, 32, generator=gen),), {}, {}
    if name == "mlp-amp":
        return _mlp, (torch.randn(256, 48, generator=gen),), {}, {"autocast": torch.bfloat16}
    ids = torch.randint(0, 97, (2, 16), generator=gen)
    return _gpt2, (ids,), {"labels": ids, "use_cache": False}, {}


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("name", ["encoder", "mlp-amp", "gpt2-labels"])
def test_a_one_rank_plan_is_estimate_memorys_training_step(name: str, optimizer: str) -> None:
    build, args, kwargs, options = _case(name)
    model = build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planned = flopcount.plan(build, args, kwargs, optimizer=optimizer, device=None, **options)
        estimated = flopcount.estimate_memory(model, args, kwargs, backward=True, optimizer=optimizer, **options)
    assert planned.peak_bytes == estimated.peak_bytes
    # the categories agree too: parameters, gradients and optimizer state at the peak
    assert planned.memory.get("gradients", 0) == estimated.at_peak.gradients
    assert planned.memory.get("optimizer_state", 0) == estimated.at_peak.optimizer_state


def test_a_custom_loss_is_the_same_step_in_plan_and_estimate_memory() -> None:
    def first_row(outputs: torch.Tensor) -> torch.Tensor:
        return outputs[:, 0].square().mean()

    build, args, kwargs, _ = _case("encoder")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planned = flopcount.plan(build, args, optimizer="adam", loss_fn=first_row, device=None)
        estimated = flopcount.estimate_memory(build(), args, backward=True, optimizer="adam", loss_fn=first_row)
    assert planned.peak_bytes == estimated.peak_bytes


def test_autocast_changes_the_plans_peak_as_the_recipe_does() -> None:
    # bf16 activations: the autocast plan's peak is below the fp32 one, parameters are the same
    build, args, _, options = _case("mlp-amp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        amp = flopcount.plan(build, args, optimizer="adamw", device=None, **options)
        full = flopcount.plan(build, args, optimizer="adamw", device=None)
    assert amp.peak_bytes < full.peak_bytes
    assert amp.state_bytes == full.state_bytes
    assert amp.dtype == "bfloat16"


# ---------------------------------------------------------------- the caller's autocast


def test_the_callers_autocast_cache_survives() -> None:
    # Oracle: torch's autocast cache. Inside one autocast region a leaf fp32 weight is cast to
    # bf16 once and the cast reused (the same storage is saved for backward by both calls);
    # a cleared cache makes a second cast with new storage.
    lin = nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)  # so addmm saves the weight's cast for backward
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first = lin(x)
        cache_on = torch.is_autocast_cache_enabled()
        flopcount.estimate_memory(_mlp(), torch.randn(8, 48), backward=True, autocast=torch.bfloat16)
        assert torch.is_autocast_cache_enabled() == cache_on
        second = lin(x)
    saved_first = first.grad_fn._saved_mat2  # addmm's mat2: the cached cast, transposed
    saved_second = second.grad_fn._saved_mat2
    assert saved_first.dtype == torch.bfloat16
    assert saved_first.untyped_storage().data_ptr() == saved_second.untyped_storage().data_ptr()


def test_the_nested_estimate_is_the_recipes_peak() -> None:
    # the same estimate inside and outside the caller's autocast (the forward's casts die with
    # it either way: cached outside, not cached inside)
    model, x = _mlp(), torch.randn(8, 48)
    alone = flopcount.estimate_memory(model, x, backward=True, optimizer="adam", autocast=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        nested = flopcount.estimate_memory(model, x, backward=True, optimizer="adam", autocast=torch.bfloat16)
    assert nested.peak_bytes == alone.peak_bytes
