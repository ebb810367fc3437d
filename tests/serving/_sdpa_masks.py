"""What transformers' own ``generate()`` hands SDPA, read live: the oracle of serve's
windowed, chunked, static-cache and decode-step tests (test_serve_window, test_serve_decode)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch


class AdmittedScores(torch.overrides.TorchFunctionMode):
    """Per SDPA call, in call order: the scores its mask admits times its heads and batch rows
    (``scores``; the True entries of an explicit mask, the triangle of an ``is_causal`` call, all
    of a call with neither) and its key length (``keys``); per call handed an explicit mask, that
    mask's first batch row and head (``masks``)."""

    def __init__(self) -> None:
        super().__init__()
        self.scores: List[int] = []
        self.keys: List[int] = []
        self.masks: List[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            query, key = args[0], args[1]
            batch, heads, lq, lk = query.shape[0], query.shape[1], query.shape[-2], key.shape[-2]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            if mask is None:
                allowed = torch.ones(lq, lk, dtype=torch.bool)
                self.scores.append(int((allowed.tril() if kwargs.get("is_causal", False) else allowed).sum()) * batch * heads)
            else:
                allowed = (mask if mask.dtype == torch.bool else mask == 0).expand(batch, heads, lq, lk)
                self.masks.append(allowed[0, 0])
                self.scores.append(int(allowed.sum()))
            self.keys.append(lk)
        return func(*args, **kwargs)


def generated(model: Any, ids: torch.Tensor, new: int, **kwargs: Any) -> AdmittedScores:
    """What ``model.generate(ids, max_new_tokens=new)`` (greedy) hands SDPA."""
    with torch.no_grad(), AdmittedScores() as seen:
        model.generate(ids, max_new_tokens=new, do_sample=False, **kwargs)
    return seen


def tiny_causal_lm(model_type: str, tiny: Dict[str, Any], chunk: Optional[int] = None, **config: Any) -> Any:
    """A tiny real causal LM of ``model_type`` (SDPA, seed 0, no end-of-sequence token: it runs
    every step asked), prefilling in chunks of ``chunk`` positions where given."""
    import transformers

    if model_type == "llama4_text":
        cfg: Any = transformers.Llama4TextConfig(**{**tiny, "intermediate_size_mlp": 128, "num_local_experts": 2},
                                                 **config, attn_implementation="sdpa")
    else:
        cfg = transformers.AutoConfig.for_model(model_type, **tiny, **config, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.prefill_chunk_size = chunk
    return model
