"""``estimate_memory`` of a float32 mixture-of-experts model (branch stepsweep).

transformers 5 runs the experts through ``aten::_grouped_mm``, whose meta kernel (what a fake
tensor runs) takes bfloat16 only: the estimate's fake step failed in ``mlp.experts`` on every
float32 MoE type (afmoe, aria_text, mixtral, qwen3_moe...) while a real training step runs and
``count_flops`` and ``plan`` (whose dispatch recorder takes the stand-in of
flopcount/tracers/fake/meta_kernels.py) count it. The estimate's step now takes the same
stand-in (``meta_kernels.KernelStandIns``): an empty output of the real kernel's shape and dtype.

Oracle: torch's MemTracker run live on a real AdamW loop of the same model (the steady state's
third step, tests/_live_oracles.py ``loop_peaks``): the real CPU kernel takes float32, and the
rows are tokens x k whatever the routing, so the peak is the same to the byte; with the reuse
on and off (``FLOPCOUNT_REUSE``).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from _live_oracles import loop_peaks
from conftest import assert_same_state, snapshot

import flopcount
from flopcount.tracers.fake.meta_kernels import ROUTING_NOTE

transformers = pytest.importorskip("transformers")

def _mixtral(layers: int) -> torch.nn.Module:
    config = transformers.MixtralConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=4, num_experts_per_tok=2, vocab_size=128, max_position_embeddings=64, use_cache=False,
    )
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(config).train()


def _ids() -> torch.Tensor:
    return torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("reuse", ["1", "0"])
def test_a_float32_mixture_of_experts_training_step_is_estimated_as_memtracker_measures_it(
    reuse: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
    model, ids = _mixtral(layers=2), _ids()
    before = snapshot(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimate = flopcount.estimate_memory(model, (ids,), backward=True, optimizer="adamw")
        torch.manual_seed(0)
        peaks, _ = loop_peaks(copy.deepcopy(model), ids)
    assert_same_state(model, before)
    assert peaks[1] == peaks[2]  # the steady state
    assert estimate.peak_bytes == peaks[2]
    assert ROUTING_NOTE in estimate.warnings

