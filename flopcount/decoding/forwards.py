"""The forwards ``generate()`` runs, as :func:`flopcount.count_generation` feeds them: the
generation options that change them (:func:`generation_options`: the cache implementation,
its length, chunked prefill, resolved from the model's ``generation_config`` and the
arguments as transformers 5 resolves them), the prefill call or calls (prompt, the mask
generate() makes, decoder start token, ``logits_to_keep=1``; one call per chunk with
``prefill_chunk_size``) and each decode step's inputs (the greedy token, the cache, the
growing mask; or what the model's own ``prepare_inputs_for_generation`` makes of them), and
the hook that keeps each output."""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from flopcount.core.inputs import is_dataless
from flopcount.errors import TraceError, UsageError, int_at_least

__all__ = ["Decoding", "FakeRefused", "GenerationOptions", "LastOutput", "Setup", "cache_of", "generation_options", "padded_rows"]

# transformers 5's cache implementations (``generation/configuration_utils.py``): the ones
# whose cache is a StaticCache of ``max_cache_len`` positions, and the dynamic ones.
_STATIC = ("static", "offloaded_static", "sliding_window", "hybrid", "hybrid_chunked", "offloaded_hybrid",
           "offloaded_hybrid_chunked")
_DYNAMIC = ("dynamic", "offloaded")
_REFUSED = {
    "quantized": "its quantize/dequantize work (optimum-quanto or HQQ kernels) is not modelled; count the dynamic "
                 "cache (cache_implementation='dynamic') for the attention and projections",
    "paged": "generate() switches to continuous batching, whose scheduling flopcount does not model",
}


@dataclass(frozen=True)
class GenerationOptions:
    """The options of ``generate()`` that change its forwards, resolved: ``static_len`` is
    the StaticCache's length (None: the model's own dynamic cache), ``prefill_chunk`` the
    prefill's chunk size (None: one prefill forward); ``notes`` say what was read and why."""

    cache_implementation: Optional[str] = None
    static_len: Optional[int] = None
    prefill_chunk: Optional[int] = None
    notes: Tuple[str, ...] = ()


def generation_options(model: nn.Module, prompt: int, new_tokens: int, given: Mapping[str, Any]) -> GenerationOptions:
    """The options ``model.generate(ids, max_new_tokens=new_tokens, **given)`` would run
    with: ``given`` (arguments not None) over the model's ``generation_config``, then as
    transformers 5 does: ``"hybrid"`` is the dynamic cache; a static cache holds
    ``max(prompt + new_tokens - 1, max_cache_len, the model's previous static length)``
    positions; a model that builds its own cache (Mamba...) ignores ``cache_implementation``.
    Options whose work flopcount does not model are refused with a UsageError."""
    config = getattr(model, "generation_config", None)

    def option(name: str) -> Any:
        return given[name] if given.get(name) is not None else getattr(config, name, None)

    where = {name: "argument" if given.get(name) is not None else "generation_config"
             for name in ("cache_implementation", "max_cache_len", "prefill_chunk_size")}
    impl, length, chunk = option("cache_implementation"), option("max_cache_len"), option("prefill_chunk_size")
    notes: List[str] = []
    for name, value in (("max_cache_len", length), ("prefill_chunk_size", chunk)):
        if value is not None:
            int_at_least(value, 1, f"count_generation: {name} ({where[name]})")
    if impl is not None and not isinstance(impl, str):
        raise UsageError(f"count_generation: cache_implementation ({where['cache_implementation']}) must be a string, got {impl!r}")
    beams = max(int(option("num_beams") or 1), int(option("num_return_sequences") or 1))
    if beams > 1:
        notes.append(
            f"generation_config asks for {beams} beams/sequences per prompt: counted greedy search (one sequence per "
            f"prompt); generate() would run a batch {beams}x as large"
        )
    if impl in _REFUSED:
        raise UsageError(f"count_generation: cache_implementation={impl!r} ({where['cache_implementation']}) is not honoured: {_REFUSED[impl]}")
    if impl is not None and impl not in _STATIC + _DYNAMIC:
        raise UsageError(
            f"count_generation: unknown cache_implementation {impl!r} ({where['cache_implementation']}); "
            f"transformers offers {', '.join(_DYNAMIC + _STATIC + tuple(_REFUSED))}"
        )
    if impl == "hybrid":  # transformers 5 unsets it in generate(): the dynamic (sliding) cache runs
        notes.append("cache_implementation='hybrid' runs the dynamic cache in transformers 5's generate(), as counted")
        impl = None
    encoder_decoder = is_encoder_decoder(model)
    builds_own = not _supports_cache_objects(model)
    if impl is not None and builds_own:
        notes.append(f"cache_implementation={impl!r} is ignored for {type(model).__name__}, as generate() ignores it "
                     "(the model builds its own cache)")
        impl = None
    if encoder_decoder and ((impl is not None and impl in _STATIC) or chunk is not None):
        raise UsageError(
            "count_generation: a static cache or prefill_chunk_size on an encoder-decoder is not honoured yet "
            "(its cross-attention cache is sized by the encoder's output); count the dynamic cache without chunking"
        )
    if chunk is not None and builds_own:
        raise UsageError(f"count_generation: prefill_chunk_size needs a cache object, which {type(model).__name__} "
                         "does not take (generate() refuses it too)")
    static_len = None
    if impl in _STATIC:
        previous = getattr(model, "_previous_max_cache_length", -1)
        static_len = max(prompt + new_tokens - 1, length or 0, previous if isinstance(previous, int) else -1)
        notes.append(
            f"cache_implementation={impl!r}: a StaticCache of {static_len} positions, attended over at every step, the "
            f"prefill included (max of prompt + new tokens - 1 = {prompt + new_tokens - 1}"
            + (f", max_cache_len={length}" if length else "")
            + (f", this model's previous static length {previous}" if isinstance(previous, int) and previous > 0 else "")
            + ")"
        )
        if "offloaded" in impl:
            notes.append(f"cache_implementation={impl!r}: counted without offloading (moving the cache between devices "
                         "is data movement, no FLOPs)")
    elif impl == "offloaded":
        notes.append("cache_implementation='offloaded': the dynamic cache's work (offloading moves data, no FLOPs)")
    if chunk is not None and chunk < prompt:
        notes.append(f"prefill_chunk_size={chunk}: the prompt of {prompt} positions is prefilled in "
                     f"{-(-prompt // chunk)} forwards, each through the cache")
    return GenerationOptions(impl, static_len, chunk if chunk is not None and chunk < prompt else None, tuple(notes))


def _supports_cache_objects(model: nn.Module) -> bool:
    """Whether generate() hands this model a Cache object (transformers' own test; models
    without it, Mamba-like ones, build their cache in ``prepare_inputs_for_generation``)."""
    check = getattr(type(model), "_supports_default_dynamic_cache", None)
    if not callable(check):
        return True
    try:
        return bool(check())
    except Exception:
        return True


def _new_cache(model: nn.Module, static_len: Optional[int]) -> Any:
    """The cache generate() makes: a StaticCache of ``static_len`` positions, or a DynamicCache."""
    from transformers import DynamicCache, StaticCache

    config: Any = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return DynamicCache(config=text) if static_len is None else StaticCache(config=text, max_cache_len=static_len)


_CACHE_KEYS = ("cache", "past_key_values", "cache_params")


def _generated_cache_key(model: nn.Module) -> Optional[str]:
    """The name generate() hands the model its dynamic cache under, by transformers' own rule: the
    key ``GenerationMixin._prepare_cache_for_generation`` writes (on a copy of the model's
    ``generation_config`` asking for the dynamic cache). transformers 5.24 writes ``cache``; 5.17
    ``past_key_values``, or ``cache_params`` for a class named like Mamba, whatever the forward's
    parameter is called (XLM's forward names it ``cache`` and, under 5.17, never receives it). None
    where the model has no such rule or makes no cache."""
    prepare = getattr(model, "_prepare_cache_for_generation", None)
    config = getattr(model, "generation_config", None)
    if not callable(prepare) or config is None:
        return None
    config = copy.deepcopy(config)
    config.cache_implementation = None
    config.use_cache = True
    made: Dict[str, Any] = {}
    try:
        prepare(generation_config=config, model_kwargs=made, generation_mode=None, batch_size=1, max_cache_length=1)
    except Exception:
        return None
    return next((key for key in made if key in _CACHE_KEYS), None)


def cache_of(output: Any, setup: Setup) -> Any:
    """The cache a forward returned (``cache`` in transformers >= 5.24, else ``past_key_values``)."""
    cache = _field(output, setup.cache_key)
    return _field(output, "past_key_values") if cache is None else cache


class LastOutput:
    """Keeps the output of the model's forward run by the thread that entered it: the output of
    that thread's outermost module call (the model, or the private twin a real-run tracer runs
    in its place). Process-wide hooks, removed on exit; another thread running the same model
    meanwhile is not heard (issue #29). With ``hooks=False`` it installs none: the tracer hands
    each output to :meth:`keep` (a fake run's copy; a process-wide hook would turn structural
    reuse off).

    ``encoder``: an encoder-decoder's encoder output, the encoder module's own output object
    (its class, every field), as the tracer hands it to :meth:`keep_encoder` during the prefill
    (the run's module stack: no hook of its own); generate() hands it to every decode step."""

    def __init__(self, hooks: bool = True):
        self.value: Any = None
        self.encoder: Any = None
        self._handles: List[Any] = []
        self._hooks = hooks
        self.no_cache = False

    def keep(self, output: Any) -> None:
        self.value = output
        if not any(_field(output, key) is not None for key in _CACHE_KEYS):
            # the model updates the cache it was handed in place (RecurrentGemma): on a fake run
            # that is the copy's, which the next forward would not see
            self.no_cache = True

    def keep_encoder(self, output: Any) -> None:
        self.encoder = output

    def __enter__(self) -> LastOutput:
        from torch.nn.modules import module as module_impl

        if not self._hooks:
            return self

        thread = threading.get_ident()
        depth = [0]

        def enter(module: nn.Module, args: Any) -> None:
            if threading.get_ident() == thread:
                depth[0] += 1

        def keep(module: nn.Module, args: Any, output: Any) -> None:
            if threading.get_ident() == thread:
                depth[0] -= 1
                if depth[0] == 0:
                    self.value = output

        self._handles = [
            module_impl.register_module_forward_pre_hook(enter),
            module_impl.register_module_forward_hook(keep, always_call=True),  # a forward that raised closes too
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def take(self) -> Any:
        if self.no_cache:
            raise FakeRefused("a fake run returned no cache to continue from")
        value, self.value = self.value, None
        if value is None:
            raise UsageError("count_generation: the model's forward returned nothing to continue from")
        return value


class FakeRefused(TraceError):
    """A forward of the decoding loop could not run on fake copies (or returned no cache to
    continue from): the loop is counted again with the dispatch tracer on the model as given."""


def _field(output: Any, name: str) -> Any:
    if isinstance(output, Mapping) or hasattr(output, "keys"):
        try:
            return output[name]
        except (KeyError, TypeError):
            return None
    return getattr(output, name, None)


def _encoder_outputs(output: Any, encoder: Any, given: Any) -> Any:
    """The encoder's output as generate() hands it to each decode step: the caller's own
    ``encoder_outputs=`` argument where one was given (``given``: generate() runs no encoder
    then and hands that object on as it is, whatever its class, a plain tuple included);
    else the encoder module's own output object, kept from the prefill (``encoder``: its class
    and every field, as Moonshine's ``attention_mask`` and NLLB-MoE's ``router_logits``); where
    none was kept (a model without ``get_encoder``), the prefill output's encoder last hidden state."""
    if given is not None:
        return given
    if encoder is not None:
        return encoder
    from transformers.modeling_outputs import BaseModelOutput

    return BaseModelOutput(last_hidden_state=_field(output, "encoder_last_hidden_state"))


def _next_tokens(logits: Any, output: Any = None) -> torch.Tensor:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        # a base model (hf:qwen2_vl builds Qwen2VLModel, as count does): hidden states, no head
        headless = "" if _field(output, "last_hidden_state") is None else (
            ": it returned hidden states (last_hidden_state) and no logits, a model without a language-model head; "
            "generate() runs a class with one (...ForCausalLM, ...ForConditionalGeneration)")
        raise UsageError(f"count_generation: the model returned no (batch, positions, vocab) logits{headless}")
    with torch.no_grad():
        return logits[:, -1, :].argmax(dim=-1, keepdim=True)


def _position_values(model: nn.Module, ids: torch.Tensor, mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The values of the position ids transformers' ``_prepare_position_ids_for_generation`` makes for a
    meta prompt of ``ids``' shape with ``mask`` (count_generation's own: all ones) or none, made again on
    CPU twins: that rule reads the mask and the shape only (a cumulative sum of the mask, else an
    arange), not the token ids. None for a model with a rule of its own (multimodal position ids),
    which may read more, and where the rule fails on the CPU."""
    try:
        from transformers.generation.utils import GenerationMixin
    except ImportError:  # a model of its own with transformers' method name: its rule is not known
        return None
    if not isinstance(model, GenerationMixin) or \
            type(model)._prepare_position_ids_for_generation is not GenerationMixin._prepare_position_ids_for_generation:
        return None
    try:
        twin_mask = {"attention_mask": torch.ones(mask.shape, dtype=mask.dtype)} if mask is not None else {}
        values = model._prepare_position_ids_for_generation(torch.zeros(ids.shape, dtype=ids.dtype), twin_mask)
    except Exception:  # transformers' own rule on plain CPU tensors: no value known, nothing checked
        return None
    return values if isinstance(values, torch.Tensor) and values.device.type == "cpu" else None


class Setup:
    """The prefill call (prompt, mask, decoder start, ``logits_to_keep``) and what decoding needs;
    ``first``: the prefill's arguments as given to the model's preparer; ``prefill_calls``: the
    prefill's forwards before the preparer (one per chunk with chunked prefill; each chunk after
    the first is fed the cache the one before returned); :meth:`prefill_call`: a prefill forward
    as generate() runs it, through the model's ``prepare_inputs_for_generation``."""

    def __init__(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        kwargs: Optional[Mapping[str, Any]],
        options: GenerationOptions = GenerationOptions(),
    ):
        self.encoder_decoder = is_encoder_decoder(model)
        self.parameters = tuple(_signature_parameters(model.forward))
        # (batch, P), or (batch, features, P) for speech
        self.batch, self.prompt = int(input_ids.shape[0]), int(input_ids.shape[-1])
        self.device = input_ids.device
        self.notes: List[str] = []
        if is_dataless(input_ids):
            self.notes.append(
                "count_generation on meta/fake tensors: the generated token ids have no value (a dense model costs the "
                "same whatever the ids); no early stop at an end-of-sequence token"
            )
        main = main_input_key(model)
        self._main_key = main
        first: Dict[str, Any] = {main: input_ids, "use_cache": True}
        # the mask generate() makes when none is given, for a decoder-only model only (an
        # encoder-decoder's encoder and decoder get none): all ones, or, on real ids holding the
        # pad token, the padded one it infers (:func:`_inferred_mask`); dropped again by
        # _feed_as_generate where it is all ones, after the position ids are made from it
        self._own_mask = not self.encoder_decoder and "attention_mask" in self.parameters \
            and not (kwargs and "attention_mask" in kwargs) and input_ids.dtype in _INT
        if self._own_mask:
            first["attention_mask"] = _inferred_mask(model, input_ids)
        if self.encoder_decoder:
            first["decoder_input_ids"] = torch.full((self.batch, 1), _decoder_start(model), dtype=torch.int64, device=self.device)
        if "logits_to_keep" in self.parameters:
            first["logits_to_keep"] = 1
        first.update(kwargs or {})
        # the name generate() hands the cache under (:func:`_generated_cache_key`): ``cache`` from
        # transformers 5.24, ``past_key_values`` (``cache_params`` for Mamba's classes) before, whatever
        # the forward names it; else the forward's own name
        generated_key = _generated_cache_key(model)
        self.cache_key = generated_key or next((k for k in _CACHE_KEYS if k in self.parameters), "past_key_values")
        if not any(k in first for k in _CACHE_KEYS):
            if options.static_len is not None:
                first[self.cache_key] = _new_cache(model, options.static_len)
            elif not self.encoder_decoder and (generated_key is not None or self.cache_key == "cache"
                                               and _supports_cache_objects(model)):
                # generate() makes the dynamic cache and hands it in (``_prepare_cache_for_generation``,
                # transformers 5.17 as 5.24): models that keep recurrent state in their modules
                # (RecurrentGemma) update it in place and return none. A model without transformers'
                # rule (no GenerationMixin) is handed one where its forward names it ``cache``, as before
                first[self.cache_key] = _new_cache(model, None)
        #: the prompt's position ids as generate() makes them (None: generate() passes none)
        self.positions: Optional[torch.Tensor] = None
        # the values of position ids made on meta, where they are known (:meth:`known_values`)
        self._position_values: WeakIdKeyDictionary = WeakIdKeyDictionary()
        if not self.encoder_decoder and input_ids.dtype in _INT:
            self._feed_as_generate(model, first, static=options.static_len is not None)
        self.first = first
        #: whether the prompt's keys are exactly its positions, nothing masked but by the model's own
        #: rule: no mask is handed on (none given, or one of all ones dropped as generate() drops it)
        #: and no argument but a mask was given (no position ids, token types or images of the caller's)
        self.unpadded = "attention_mask" not in first and not set(kwargs or {}) - {"attention_mask"}
        self.prefill_calls = [first] if options.prefill_chunk is None else _chunks(first, main, options.prefill_chunk)
        #: a padded prompt's sequences, where the mask proves them: per row, (start, length) of its real
        #: tokens (:func:`padded_rows`), for a decoder-only prompt given a mask and no other argument,
        #: prefilled in one forward or in chunks (each chunk handed the mask up to its end, the cache
        #: holding every row's positions, pads included, as one forward leaves it: read live); None
        #: otherwise (unpadded, or not proved)
        self.rows: Optional[Tuple[Tuple[int, int], ...]] = None
        if not self.encoder_decoder and not self.unpadded and set(kwargs or {}) == {"attention_mask"} \
                and first.get("attention_mask") is (kwargs or {}).get("attention_mask"):
            self.rows = padded_rows(first["attention_mask"], self.batch, self.prompt)
        # positions the cache holds after the prefill: the prompt, or the decoder's first token
        self.base = 1 if self.encoder_decoder else self.prompt
        self._main = main
        #: the model's ``prepare_inputs_for_generation`` as generate() calls it (:func:`_preparer`), or None
        self.preparer = _preparer(model, self.cache_key)
        self._prepare = self.preparer  # the prefill's: None after it failed once

    def chunk_start(self, index: int) -> int:
        """The prompt positions before prefill forward ``index`` (the ones its cache holds)."""
        return sum(int(call[self._main].shape[-1]) for call in self.prefill_calls[:index])

    def _feed_as_generate(self, model: nn.Module, first: Dict[str, Any], *, static: bool) -> None:
        """A decoder-only prompt's position ids and mask as generate() hands them on: where the
        forward takes ``position_ids`` and none was given, the model's own
        ``_prepare_position_ids_for_generation`` makes them from the mask (one row per prompt);
        then the mask is dropped where it is all ones, as generate() drops it (except for flash
        attention over a static cache). count_generation's own mask on meta is all ones by
        construction; on real ids, and a mask the caller gave, it is tested as generate() tests
        it, ``(mask == 1).all()``, which meta cannot answer for a mask given: there it is kept,
        and a note says so."""
        mask = first.get("attention_mask")
        make_positions = getattr(model, "_prepare_position_ids_for_generation", None)
        if "position_ids" in self.parameters and first.get("position_ids") is None and callable(make_positions):
            self.positions = make_positions(first[self._main_key], {"attention_mask": mask} if mask is not None else {})
            first["position_ids"] = self.positions
            if is_dataless(self.positions) and (mask is None or self._own_mask):
                values = _position_values(model, first[self._main_key], mask)
                if values is not None and values.shape == self.positions.shape:
                    self._position_values[self.positions] = values
        elif isinstance(first.get("position_ids"), torch.Tensor):
            self.positions = first["position_ids"]
        if not isinstance(mask, torch.Tensor) or (static and _flash_attention(model)) or not _drops_all_ones_mask():
            return
        if self._own_mask and is_dataless(mask):
            del first["attention_mask"]
        elif is_dataless(mask):
            self.notes.append("the attention_mask given was kept on meta: generate() drops a mask of all ones, "
                              "which meta cannot tell")
        elif bool((mask == 1).all()):
            del first["attention_mask"]

    def next_positions(self, step: int, width: int) -> Optional[torch.Tensor]:
        """The position ids of decode step ``step``'s ``width`` new positions, continuing the
        prompt's as generate() continues them (the last one plus 1, 2, ...), or None."""
        if self.positions is None:
            return None
        if is_dataless(self.positions):  # meta: no values to continue (an add on meta runs torch's Python refs)
            made = self.positions.new_empty((*self.positions.shape[:-1], width))
            values = self._position_values.get(self.positions)
            if values is not None:  # where the prompt's are known, so are these (the same rule on the CPU)
                self._position_values[made] = values[..., -1:] + torch.arange(step + 1, step + width + 1, dtype=values.dtype)
            return made
        last = self.positions[..., -1:]
        offsets = torch.arange(step + 1, step + width + 1, dtype=self.positions.dtype, device=self.positions.device)
        return last + offsets

    def known_values(self, tensors: Any) -> Tuple[Optional[torch.Tensor], ...]:
        """By place in ``tensors`` (a forward's), the value of each position-id tensor this setup made
        on meta whose value is known, else None: on meta, the prompt's position ids count_generation
        made from its own mask (all ones by construction) with the model's own rule, run again on the
        CPU (:func:`_position_values`), and each decode step's, which continue them. A fake run's
        index checks read them (``PreparedCall.known``): a table of positions is not read past on meta either."""
        return tuple(self._position_values.get(t) if isinstance(t, torch.Tensor) else None for t in tensors)

    def prefill_call(self, index: int, cache: Any = None) -> Dict[str, Any]:
        """Prefill forward ``index`` as generate()'s ``_prefill`` makes it: the call passed
        through the model's ``prepare_inputs_for_generation`` with ``is_first_iteration=True``
        (XLM appends its mask token to the prompt there). One forward is also told
        ``next_sequence_length``: the prompt's length where the cache is one of attention layers,
        else None; a chunk (``index`` > 0: fed ``cache``, the one the chunk before returned) is
        told none. An encoder-decoder's encoder input is no argument of the preparer (generate()
        has run the encoder before it): it is handed to the forward beside what the preparer
        makes. Without a preparer, or where it fails, the call as made (and a note says so)."""
        call = self.prefill_calls[index]
        if index:
            call = {**call, self.cache_key: cache if cache is not None else self.first.get(self.cache_key)}
        if self._prepare is None:
            return call
        ids_key = "decoder_input_ids" if self.encoder_decoder else "input_ids"
        arguments = {key: value for key, value in call.items() if key != ids_key}
        # generate() runs the encoder before the prefill: its input reaches the forward, not the preparer
        encoder_input = {self._main: arguments.pop(self._main)} if self.encoder_decoder and self._main in arguments else {}
        if len(self.prefill_calls) == 1:
            arguments["next_sequence_length"] = self._prefill_length(call)
        prepared = _prepared(self._prepare, call[ids_key], self.notes, "the prefill was fed its inputs as made, without "
                             "the preparer", is_first_iteration=True, **arguments)
        if prepared is None:
            self._prepare = None
            return call
        return {**encoder_input, **prepared}

    def _prefill_length(self, call: Mapping[str, Any]) -> Optional[int]:
        """The ``next_sequence_length`` generate()'s one-forward prefill hands the preparer: the
        prompt's length (all of it is new) for a decoder-only model given a cache with an
        attention layer; None for a cache of linear (recurrent) layers only, for no cache, and for
        an encoder-decoder (whose decoder gets no mask of the prompt's length)."""
        cache = call.get(self.cache_key)
        linear = getattr(cache, "is_linear", None)
        if self.encoder_decoder or cache is None or linear is None or all(linear):
            return None
        return self.prompt


def padded_rows(mask: Any, batch: int, prompt: int) -> Optional[Tuple[Tuple[int, int], ...]]:
    """Per row of a padded prompt's ``attention_mask``, the (start, length) of its real tokens,
    where the mask's values prove them: a (``batch``, ``prompt``) tensor with values (not meta
    or fake) of zeros and ones, each row's ones one run of at least one that starts or ends the
    row (left or right padding), some row padded. None for any other mask."""
    if not isinstance(mask, torch.Tensor) or is_dataless(mask) or tuple(mask.shape) != (batch, prompt) \
            or mask.dtype.is_floating_point or mask.dtype.is_complex:
        return None
    values = mask.detach().to("cpu", torch.int64)
    if not bool(((values == 0) | (values == 1)).all()) or bool((values == 1).all()):
        return None
    rows = []
    for row in values:
        ones = torch.nonzero(row).flatten()
        if not len(ones):
            return None
        start, length = int(ones[0]), len(ones)
        if int(ones[-1]) - start + 1 != length or (start and start + length != prompt):
            return None
        rows.append((start, length))
    return tuple(rows)


def _chunks(first: Dict[str, Any], main: str, size: int) -> List[Dict[str, Any]]:
    """The prefill as generate() chunks it: the prompt split into ``size`` positions, each
    chunk with the mask up to its end (the cache is added between calls)."""
    calls = []
    prompt = first[main]
    mask = first.get("attention_mask")
    positions = first.get("position_ids")
    for start in range(0, int(prompt.shape[-1]), size):
        call = {**first, main: prompt[..., start : start + size]}
        end = start + int(call[main].shape[-1])
        if isinstance(mask, torch.Tensor):
            call["attention_mask"] = mask[..., :end]
        if isinstance(positions, torch.Tensor):  # generate()'s _prefill slices them to the chunk
            call["position_ids"] = positions[..., start:end]
        calls.append(call)
    return calls


class Decoding:
    """What the next decode step is fed: the greedy token, the cache, the growing mask (and an
    encoder-decoder's encoder output: the caller's own ``encoder_outputs=`` argument where one was
    given, else ``encoder``, :attr:`LastOutput.encoder`; see :func:`_encoder_outputs`)."""

    def __init__(self, output: Any, setup: Setup, encoder: Any = None):
        self.setup = setup
        self.prepare = setup.preparer  # the decode steps': None after it failed once
        given = setup.first.get("encoder_outputs")
        self.encoder_outputs = _encoder_outputs(output, encoder, given) if setup.encoder_decoder else None
        self.mask = setup.first.get("attention_mask")
        self.notes: List[str] = []
        self.advance(output)

    def advance(self, output: Any) -> None:
        self.cache = cache_of(output, self.setup)
        if self.cache is None and self.setup.first.get(self.setup.cache_key) is not None:
            # a model that updates the cache it was handed in place may return none (RecurrentGemma,
            # whose recurrent state lives in its modules, set and read by its own forwards)
            self.cache = self.setup.first[self.setup.cache_key]
            note = ("the model returned no cache: it updates the one generate() hands it in place and keeps other "
                    "state in its modules (kv_cache_bytes counts the cache object only)")
            if note not in self.notes:
                self.notes.append(note)
        logits = _field(output, "logits")
        if self.setup.device.type == "meta" and isinstance(logits, torch.Tensor) and logits.device.type != "meta" \
                and is_dataless(logits):
            # a fake run's logits: the greedy token's shape and stride taken on a meta stand-in (the
            # same meta kernels; a fake's ops outside its mode cost ~10x as much), fed as the prompt was
            logits = torch.empty_strided(logits.shape, logits.stride(), dtype=logits.dtype, device="meta")
        tokens = _next_tokens(logits, output)
        if self.setup.device.type == "meta" and tokens.device.type != "meta":
            # a fake run's greedy tokens (valueless either way): fed as the meta prompt was
            tokens = torch.empty_strided(tokens.shape, tokens.stride(), dtype=tokens.dtype, device="meta")
        self.tokens = tokens

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
        prepared = _prepared(self.prepare, history, self.notes, "decode steps were fed the greedy token and the "
                             "cache without the preparer", next_sequence_length=width, is_first_iteration=False, **call)
        if prepared is None:
            self.prepare = None
            return self._call(step, width)
        return prepared

    def _call(self, step: int, width: int) -> Dict[str, Any]:
        setup = self.setup
        tokens = self.tokens if width == 1 else self.tokens.expand(-1, width)
        call: Dict[str, Any] = {setup.cache_key: self.cache, "use_cache": True}
        if setup.encoder_decoder:
            call["decoder_input_ids"] = tokens
            call["encoder_outputs"] = self.encoder_outputs
            if self.mask is not None:
                call["attention_mask"] = self.mask
        else:
            call["input_ids"] = tokens
            # state-space models of transformers < 5.24 (``cache_params``) decode without a mask:
            # their prepare_inputs_for_generation drops it, and the mixer would broadcast it
            if self.mask is not None and setup.cache_key != "cache_params":
                # the prompt's mask (a padded one kept: generate() drops only an all-ones mask) grown
                # by one valid position per token, as generate() grows it
                grown = torch.ones(setup.batch, step + width, dtype=self.mask.dtype, device=self.mask.device)
                call["attention_mask"] = torch.cat([self.mask, grown], dim=-1)
            positions = setup.next_positions(step, width)
            if positions is not None:
                call["position_ids"] = positions
        if "logits_to_keep" in setup.parameters:
            call["logits_to_keep"] = 1
        return call


def _preparer(model: nn.Module, cache_key: str) -> Any:
    """The model's ``prepare_inputs_for_generation`` when it takes the arguments generate()
    gives it in transformers 5 (the cache, under ``cache_key``, and ``next_sequence_length``; by name or through
    ``**kwargs``, as CpmAnt's and XLM's overrides take them), else None. generate() makes
    every forward's inputs with it, the prefill's included."""
    prepare = getattr(model, "prepare_inputs_for_generation", None)
    if not callable(prepare) or not _generate_tells_the_step_length():
        return None
    names = _signature_parameters(prepare)
    if any(p.kind is p.VAR_KEYWORD for p in names.values()):
        return prepare
    return prepare if "next_sequence_length" in names and cache_key in names else None


def _generate_tells_the_step_length() -> bool:
    """Whether this transformers' generate() hands the preparer ``next_sequence_length`` (transformers'
    own ``GenerationMixin.prepare_inputs_for_generation`` takes it: 5.17 and 5.24 do), the way
    :class:`Setup` and :class:`Decoding` call it."""
    from transformers import GenerationMixin

    return "next_sequence_length" in _signature_parameters(GenerationMixin.prepare_inputs_for_generation)


def _prepared(prepare: Any, ids: torch.Tensor, notes: List[str], instead: str, **arguments: Any) -> Optional[Dict[str, Any]]:
    """What ``prepare`` (the model's ``prepare_inputs_for_generation``) makes of ``ids`` and
    ``arguments``, or None where it raises: transformers' own helper, so the caller falls back to
    its plain inputs, and ``notes`` says so (``instead``: what was fed then)."""
    try:
        return dict(prepare(ids, **arguments))
    except Exception as exc:
        notes.append(f"{type(exc).__name__} in the model's prepare_inputs_for_generation ({str(exc)[:120]}): {instead}")
        return None


_INT = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@functools.cache
def _drops_all_ones_mask() -> bool:
    """Whether this transformers' generate() drops an all-ones attention mask before the first
    forward: from 5.18 on (huggingface/transformers#48814); before, it hands every forward the mask,
    grown by one column a step, and the model's mask checks run on it (an ``aten::sum`` over it,
    measured on 5.17)."""
    import transformers

    release = []
    for part in transformers.__version__.split(".")[:2]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        release.append(int(digits) if digits else 0)
    return tuple(release) >= (5, 18)


def _inferred_mask(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The attention mask generate() makes for a decoder-only prompt given without one, by
    transformers' own rule (``GenerationMixin._prepare_attention_mask_for_generation``, on a copy
    of the model's ``generation_config`` whose special tokens ``_prepare_special_tokens`` made
    tensors, as generate() does): ``input_ids != pad_token_id`` where the prompt holds the pad
    token and the pad token is not an end-of-sequence token, else all ones. All ones on meta (the
    ids have no values: a padded prompt's mask is not seen) and for a model without that rule."""
    ones = torch.ones(input_ids.shape[0], input_ids.shape[-1], dtype=torch.int64, device=input_ids.device)
    config = getattr(model, "generation_config", None)
    special_tokens = getattr(model, "_prepare_special_tokens", None)
    infer = getattr(model, "_prepare_attention_mask_for_generation", None)
    if is_dataless(input_ids) or config is None or not callable(special_tokens) or not callable(infer):
        return ones
    config = copy.deepcopy(config)  # _prepare_special_tokens writes the config it is given
    special_tokens(config, device=input_ids.device)
    return infer(input_ids, config, {})


def _flash_attention(model: nn.Module) -> bool:
    """Whether the model asks for flash attention (transformers' own test): generate() keeps
    an all-ones mask then under a static cache, to unpad its invalid positions."""
    try:
        from transformers.utils.generic import is_flash_attention_requested
    except ImportError:
        return False
    config = getattr(model, "config", None)
    return config is not None and bool(is_flash_attention_requested(config))


def main_input_key(model: nn.Module) -> str:
    """The keyword the prompt is fed under: ``input_ids``, or an encoder-decoder's own main
    input (``input_features`` for speech)."""
    return getattr(model, "main_input_name", "input_ids") if is_encoder_decoder(model) else "input_ids"


def split_prompt(
    model: nn.Module, input_ids: Any, kwargs: Optional[Mapping[str, Any]], who: str
) -> Tuple[torch.Tensor, Optional[Dict[str, Any]]]:
    """The prompt tensor and the prefill's keyword arguments from what the caller gave. A tokenizer's
    output (a ``BatchEncoding``, any mapping holding the prompt's key) is split as ``generate(**encoding)``
    splits it: the prompt, and every other entry (``attention_mask``) a keyword argument. Anything
    else must be a (batch, prompt length) tensor; a UsageError says what it is instead (float ids fail in
    the embedding's forward, which names the module, and the CLI adds SPEC:int64)."""
    key = main_input_key(model)
    if isinstance(input_ids, Mapping):
        entries = dict(input_ids)
        if key not in entries:
            raise UsageError(f"{who}: the {type(input_ids).__name__} given as the prompt has no {key!r} "
                             f"(its keys: {', '.join(map(str, entries)) or 'none'})")
        both = sorted(set(entries) & set(kwargs or {}) - {key})
        if both:
            raise UsageError(f"{who}: {', '.join(both)} given twice: in the {type(input_ids).__name__} given as the prompt and in kwargs")
        prompt = entries.pop(key)
        input_ids, kwargs = prompt, {**entries, **dict(kwargs or {})} or None
    if not isinstance(input_ids, torch.Tensor):
        raise UsageError(f"{who}: {key} must be a (batch, prompt length) tensor, got {type(input_ids).__name__}"
                         + (": make it one, e.g. torch.tensor([[1, 2, 3]]) for one prompt of 3 tokens"
                            if isinstance(input_ids, (list, tuple)) else ""))
    if input_ids.dim() < 2:
        raise UsageError(f"{who}: {key} must be a (batch, prompt length) tensor, got one of shape {tuple(input_ids.shape)}: "
                         f"add the batch dimension, e.g. {key}[None]")
    return input_ids, None if kwargs is None else dict(kwargs)


def is_encoder_decoder(model: nn.Module) -> bool:
    """Whether the model's config says it is an encoder-decoder (T5, Whisper...)."""
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def refuse_without_prompt_input(model: nn.Module, who: str) -> None:
    """A model whose forward cannot take the prompt (a vision model's ``forward(x)``) is refused
    by name, before its forward fails on an unexpected keyword argument."""
    key = main_input_key(model)
    parameters = _signature_parameters(model.forward)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    if parameters and key not in parameters and not takes_any:
        shown = ", ".join(parameters)
        raise UsageError(f"{who} counts generate() of a language model, whose forward takes the prompt as {key}; "
                         f"{type(model).__name__}.forward({shown}) takes no {key}")


def _signature_parameters(fn: Any) -> Mapping[str, inspect.Parameter]:
    """``fn``'s parameters by name (none when its signature cannot be read)."""
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}


def _decoder_start(model: nn.Module) -> int:
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        for key in ("decoder_start_token_id", "bos_token_id", "pad_token_id"):
            value = getattr(source, key, None)
            if isinstance(value, int):
                return value
    return 0
