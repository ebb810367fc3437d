"""State-space models of transformers < 5.24 take their state as ``cache_params`` (Mamba,
Mamba2, FalconMamba in 5.17, the version on the GPU machine this was found on): count_generation
refused them ("returned no past_key_values"), and once the name was known it fed the decode steps
the growing attention mask, which their prepare_inputs_for_generation drops and their mixer
would broadcast (each step then costs the whole context). A small model with that interface; the
oracle is FlopCounterMode over the loop generate() runs for it: the prompt with the mask, then one
token per step with the state and no mask."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_generation

V, D, B, P, N = 40, 16, 2, 6, 4


class _State:
    """The recurrent state, updated in place (as transformers' Mamba cache is)."""

    def __init__(self) -> None:
        self.h: Optional[torch.Tensor] = None


class OldStyleSSM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.mix = nn.Linear(D, D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                cache_params: Optional[_State] = None, use_cache: Optional[bool] = None,
                logits_to_keep: int = 0) -> Dict[str, Any]:
        x = self.embed(input_ids)  # (B, T, D)
        if attention_mask is not None:  # as Mamba's mixer: (B, D, T) * (B, 1, L) broadcasts to L
            x = (x.transpose(1, 2) * attention_mask[:, None, :].to(x.dtype)).transpose(1, 2)
        if use_cache and cache_params is None:
            cache_params = _State()
        h = self.mix(x)
        if cache_params is not None:
            h = h + (cache_params.h if cache_params.h is not None else 0)
            cache_params.h = h[:, -1:].detach()
        logits = self.head(h[:, -logits_to_keep:] if logits_to_keep else h)
        return {"logits": logits, "cache_params": cache_params if use_cache else None}


def _generate_truth(model: nn.Module, ids: torch.Tensor, new: int) -> List[int]:
    """FLOPs of each forward of a greedy generate() for this interface."""
    flops = []
    with torch.no_grad():
        counter = FlopCounterMode(display=False)
        with counter:
            out = model(ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)
        flops.append(counter.get_total_flops())
        state = out["cache_params"]
        token = out["logits"][:, -1:].argmax(-1)
        for _ in range(new - 1):
            counter = FlopCounterMode(display=False)
            with counter:
                out = model(token, cache_params=state, use_cache=True, logits_to_keep=1)
            flops.append(counter.get_total_flops())
            token = out["logits"][:, -1:].argmax(-1)
    return flops


def test_a_cache_params_model_decodes_one_token_per_step() -> None:
    torch.manual_seed(0)
    model = OldStyleSSM().eval()
    ids = torch.randint(0, V, (B, P))
    truth = _generate_truth(model, ids, N)
    # by hand: mix B*T*D*D and head B*1*D*V MACs; a decode step has T = 1
    assert truth == [2 * (B * P * D * D + B * D * V)] + [2 * (B * D * D + B * D * V)] * (N - 1)
    result = count_generation(model, ids, new_tokens=N)
    assert [2 * result.prefill.macs] + [2 * s.macs for s in result.steps] == truth
