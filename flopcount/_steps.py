"""The forwards ``generate()`` runs, as :func:`flopcount.count_generation` feeds them: the
prefill call (prompt, all-ones mask, decoder start token, ``logits_to_keep=1``) and each
decode step's inputs (the greedy token, the cache, the growing mask; or what the model's own
``prepare_inputs_for_generation`` makes of them), and the hook that keeps each output."""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from .errors import UsageError
from .inputs import is_dataless

__all__ = ["Decoding", "LastOutput", "Setup"]


class LastOutput:
    """Keeps the output of the model's own forward (a process-wide hook, removed on exit)."""

    def __init__(self, model: nn.Module):
        self._model = model
        self.value: Any = None
        self._handle: Any = None

    def __enter__(self) -> LastOutput:
        from torch.nn.modules import module as module_impl

        def keep(module: nn.Module, args: Any, output: Any) -> None:
            if module is self._model:
                self.value = output

        self._handle = module_impl.register_module_forward_hook(keep)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()

    def take(self) -> Any:
        value, self.value = self.value, None
        if value is None:
            raise UsageError("count_generation: the model's forward returned nothing to continue from")
        return value


def _field(output: Any, name: str) -> Any:
    if isinstance(output, Mapping) or hasattr(output, "keys"):
        try:
            return output[name]
        except (KeyError, TypeError):
            return None
    return getattr(output, name, None)


def _next_tokens(logits: Any) -> torch.Tensor:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise UsageError("count_generation: the model returned no (batch, positions, vocab) logits")
    with torch.no_grad():
        return logits[:, -1, :].argmax(dim=-1, keepdim=True)


class Setup:
    """The prefill call (prompt, mask, decoder start, ``logits_to_keep``) and what decoding needs."""

    def __init__(self, model: nn.Module, input_ids: torch.Tensor, kwargs: Optional[Mapping[str, Any]]):
        config = getattr(model, "config", None)
        self.encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        self.parameters = _forward_parameters(model)
        # (batch, P), or (batch, features, P) for speech
        self.batch, self.prompt = int(input_ids.shape[0]), int(input_ids.shape[-1])
        self.device = input_ids.device
        self.notes: List[str] = []
        if is_dataless(input_ids):
            self.notes.append(
                "count_generation on meta/fake tensors: the generated token ids have no value (a dense model costs the "
                "same whatever the ids); no early stop at an end-of-sequence token"
            )
        main = getattr(model, "main_input_name", "input_ids") if self.encoder_decoder else "input_ids"
        first: Dict[str, Any] = {main: input_ids, "use_cache": True}
        if "attention_mask" in self.parameters and not (kwargs and "attention_mask" in kwargs) and input_ids.dtype in _INT:
            if is_dataless(input_ids):
                # generate's all-ones mask would only be checked with .all(), which meta cannot answer
                self.notes.append("no attention mask was passed on meta (all positions valid, as generate's all-ones mask)")
            else:
                first["attention_mask"] = torch.ones(self.batch, self.prompt, dtype=torch.int64, device=self.device)
        if self.encoder_decoder:
            first["decoder_input_ids"] = torch.full((self.batch, 1), _decoder_start(model), dtype=torch.int64, device=self.device)
        if "logits_to_keep" in self.parameters:
            first["logits_to_keep"] = 1
        first.update(kwargs or {})
        self.first = first
        # transformers >= 5.24 names the cache argument ``cache`` (``past_key_values`` deprecated)
        self.cache_key = "cache" if "cache" in self.parameters else "past_key_values"
        # positions the cache holds after the prefill: the prompt, or the decoder's first token
        self.base = 1 if self.encoder_decoder else self.prompt


class Decoding:
    """What the next decode step is fed: the greedy token, the cache, the growing mask."""

    def __init__(self, model: nn.Module, output: Any, setup: Setup):
        self.setup = setup
        self.prepare = _step_preparer(model, setup)
        self.encoder_out = _field(output, "encoder_last_hidden_state") if setup.encoder_decoder else None
        self.mask = setup.first.get("attention_mask")
        self.notes: List[str] = []
        self.advance(output)

    def advance(self, output: Any) -> None:
        self.cache = _field(output, self.setup.cache_key)
        if self.cache is None:
            self.cache = _field(output, "past_key_values")
        self.tokens = _next_tokens(_field(output, "logits"))

    def call(self, step: int, width: int = 1) -> Dict[str, Any]:
        """The forward of decode step ``step``, or of ``width`` positions from it at once: as
        the model's ``prepare_inputs_for_generation`` makes it when it has one (Mamba drops
        the attention mask after the prefill), else the tokens, the cache and the mask."""
        call = self._call(step, width)
        if self.prepare is None:
            return call
        setup = self.setup
        ids = call.pop("decoder_input_ids" if setup.encoder_decoder else "input_ids")
        history = ids[:, :1].expand(-1, (1 if setup.encoder_decoder else setup.prompt) + step + width)
        try:
            return dict(self.prepare(history, next_sequence_length=width, is_first_iteration=False, **call))
        except Exception as exc:  # transformers' own helper: fall back to the plain inputs, and say so
            self.prepare = None
            self.notes.append(
                f"{type(exc).__name__} in the model's prepare_inputs_for_generation ({str(exc)[:120]}): decode steps "
                "were fed the greedy token, the cache and the all-ones mask instead"
            )
            return self._call(step, width)

    def _call(self, step: int, width: int) -> Dict[str, Any]:
        setup = self.setup
        tokens = self.tokens if width == 1 else self.tokens.expand(-1, width)
        call: Dict[str, Any] = {setup.cache_key: self.cache, "use_cache": True}
        if setup.encoder_decoder:
            from transformers.modeling_outputs import BaseModelOutput

            call["decoder_input_ids"] = tokens
            call["encoder_outputs"] = BaseModelOutput(last_hidden_state=self.encoder_out)
            if self.mask is not None:
                call["attention_mask"] = self.mask
        else:
            call["input_ids"] = tokens
            if self.mask is not None:
                call["attention_mask"] = torch.ones(setup.batch, setup.prompt + step + width, dtype=torch.int64, device=setup.device)
        if "logits_to_keep" in setup.parameters:
            call["logits_to_keep"] = 1
        return call


def _step_preparer(model: nn.Module, setup: Setup) -> Any:
    """The model's ``prepare_inputs_for_generation`` when it takes the arguments generate()
    gives it in transformers 5 (``cache``, ``next_sequence_length``), else None."""
    prepare = getattr(model, "prepare_inputs_for_generation", None)
    if not callable(prepare) or setup.cache_key != "cache":
        return None
    try:
        names = inspect.signature(prepare).parameters
    except (TypeError, ValueError):
        return None
    takes_length = "next_sequence_length" in names or any(p.kind is p.VAR_KEYWORD for p in names.values())
    return prepare if takes_length and "cache" in names else None


_INT = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _forward_parameters(model: nn.Module) -> Tuple[str, ...]:
    try:
        return tuple(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return ()


def _decoder_start(model: nn.Module) -> int:
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        for key in ("decoder_start_token_id", "bos_token_id", "pad_token_id"):
            value = getattr(source, key, None)
            if isinstance(value, int):
                return value
    return 0
