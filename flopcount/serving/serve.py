"""``flopcount.serve``: serving bounds of a generative model on a part you may not have.

One count of what ``generate()`` runs (:func:`flopcount.decoding.counted.count_decoding`:
the prefill and every decode step, from the model's own code, with its own cache) gives per
sequence the FLOPs of each forward and the cache bytes each decode step reads and writes;
:mod:`flopcount.serving.pricing` prices them on the part with the one roofline function."""

from __future__ import annotations

import os
import time
from dataclasses import astuple, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from flopcount.core.diagnostics import estimated_text, say_estimated
from flopcount.core.dtypes import parse_dtype
from flopcount.core.inputs import is_dataless
from flopcount.core.params import TOP_K_KEYS, config_value, lookup_tables, routed_experts
from flopcount.core.traffic import is_floating
from flopcount.decoding.caches import cache_bytes, cache_dtype
from flopcount.decoding.counted import Decoded, Skipped, count_decoding
from flopcount.decoding.forwards import is_encoder_decoder, split_prompt
from flopcount.devices import MathModes, Roofs, column_of, find_part, is_this_machine, named_roofs
from flopcount.errors import UsageError, int_at_least
from flopcount.serving.counting import Counted, Derived, attention_flops, derive, held_per_step, real_prefills
from flopcount.serving.figures import ServeFacts, WeightTensor, Work
from flopcount.serving.pricing import (
    WEIGHT_FORMATS,
    Pricing,
    batches_of,
    compute_bound_batch,
    max_batch,
    price_batch_with,
    weight_format,
    weight_note,
    weights_held,
)
from flopcount.serving.result import ESTIMATED, ServeResult
from flopcount.types import ParamSummary, dtype_key, dtype_name

__all__ = ["check_before_count", "serve", "serve_facts", "serve_on", "stated_mask"]

#: the share of the part's memory kept back (vLLM's default gpu_memory_utilization is 0.9)
DEFAULT_RESERVE = 0.10


def serve(
    model: nn.Module,
    input_ids: torch.Tensor,
    new_tokens: int,
    *,
    on: Union[str, Roofs] = "h100",
    batch: Union[None, int, Sequence[int]] = None,
    dtype: Any = None,
    weight_dtype: Any = None,
    tp: int = 1,
    reserve: float = DEFAULT_RESERVE,
    kwargs: Optional[Mapping[str, Any]] = None,
    prompt_lengths: Optional[Sequence[int]] = None,
) -> ServeResult:
    """Serving bounds of ``model.generate(input_ids, max_new_tokens=new_tokens)`` (greedy)
    on the part ``on`` ("h100", "l4", "a100 40gb"..., "this machine", or a Roofs).

    ``input_ids``: the (B, P) prompt counted (meta tensors are fine); ``batch``: the batch
    size(s) to price (default B; every sequence costs the same, so one count serves all);
    ``dtype``: the compute dtype (default the model's); ``weight_dtype``: weights stored as
    "int8", "int4", "fp8" weight-only quantization would store them (scales included) or a
    float dtype; ``tp``: tensor-parallel ranks (per-rank work, and two all-reduces per layer
    over the part's first link); ``reserve``: the share of the part's memory kept back;
    ``kwargs``: the forward's other arguments (an ``attention_mask`` with padding whose values
    are known, on the CPU beside a meta model too, prices each sequence at its real tokens:
    docs/llm.md, "A padded prompt"); ``prompt_lengths``: instead of such a mask, each row's real
    tokens, the row left-padded to P (one length per row, each 1..P: the mask generate() is handed
    for it, made on the CPU, which a meta prompt cannot carry). Times are any-implementation lower
    bounds (see ``ServeResult.leaves_out``). The model and ``input_ids`` are left as found."""
    started = time.perf_counter()
    roofs, part_name, capacity, link = _part(on, tp)
    if not isinstance(reserve, (int, float)) or not 0 <= reserve < 1:
        raise UsageError(f"serve: reserve must be a fraction in [0, 1), got {reserve!r}")
    check_before_count(model, tp, dtype, weight_dtype)
    facts = serve_facts(model, input_ids, new_tokens, kwargs=kwargs, prompt_lengths=prompt_lengths)
    estimate = estimated_text(roofs, ESTIMATED)  # built once: stored on the result and warned
    result = _priced(facts, roofs, part_name, capacity, link, estimate, batch=batch, dtype=dtype,
                     weight_dtype=weight_dtype, tp=tp, reserve=reserve)
    say_estimated(estimate)
    return ServeResult(**{**result.__dict__, "wall_s": time.perf_counter() - started})


#: the config keys of the attention (query) heads and of the key/value heads (falling back to the former)
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
KV_HEAD_KEYS = ("num_key_value_heads", *HEAD_KEYS)


def _heads_of(model: nn.Module) -> Tuple[int, int]:
    """(attention heads, key/value heads) from the model's config; 0 where it does not say."""
    return config_value(model, HEAD_KEYS) or 0, config_value(model, KV_HEAD_KEYS) or 0


def _whole_heads(heads: int, kv_heads: int, tp: int) -> None:
    """Refuse a ``tp`` a serving engine refuses (vLLM's ``QKVParallelLinear``, in
    vllm/model_executor/layers/linear.py: ``divide(total_num_heads, tp_size)``, and the KV heads
    ``divide(total_num_kv_heads, tp_size)`` below tp, ``divide(tp_size, total_num_kv_heads)``
    replicas from tp up; TGI also requires the heads divisible by its shards): each rank gets
    whole attention heads, and whole KV heads or a replica of one. Any other tp would leave
    ranks unequal shares, which the per-rank figures (work, weights and cache / tp) understate."""
    if tp <= 1:
        return
    if heads and heads % tp:
        fits = [n for n in range(2, heads + 1) if heads % n == 0 and (not kv_heads or kv_heads % n == 0 or n % kv_heads == 0)]
        raise UsageError(f"serve: tp={tp} does not divide the model's {heads} attention heads (a serving engine gives each "
                         f"rank whole heads: vLLM, TGI): choose a tp that divides {heads} (e.g. {', '.join(map(str, fits[:6]))})")
    if kv_heads and kv_heads % tp and tp % kv_heads:
        fits = [n for n in range(2, kv_heads + 1) if kv_heads % n == 0][:6]
        raise UsageError(f"serve: tp={tp} does not split the model's {kv_heads} key/value heads evenly (tensor parallelism gives "
                         f"each rank whole heads): choose a tp that divides {kv_heads} (e.g. {', '.join(map(str, fits))}) "
                         "or a multiple of it (the heads replicated)")


def check_before_count(model: nn.Module, tp: int, dtype: Any, weight_dtype: Any) -> None:
    """What ``serve_on`` refuses that the model's config and the arguments already tell (a tp
    that splits the heads unevenly, a dtype not taken), said before the count (seconds to minutes)."""
    _whole_heads(*_heads_of(model), tp)
    dtype_names(dtype, weight_dtype)


def dtype_names(dtype: Any, weight_dtype: Any) -> Tuple[Optional[str], Optional[str]]:
    """``serve``'s compute ``dtype`` (floating) and ``weight_dtype`` (a weight-only format of
    pricing.WEIGHT_FORMATS or a floating dtype) as torch names, each read as every dtype
    argument is (:func:`flopcount.core.dtypes.parse_dtype`); None stays None."""
    compute = None if dtype is None else dtype_name(parse_dtype(dtype, "serve: dtype", "floating"))
    if weight_dtype is None:
        return compute, None
    if isinstance(weight_dtype, (str, torch.dtype)):
        key = dtype_key(weight_dtype) if isinstance(weight_dtype, str) else dtype_name(weight_dtype)
        if key in WEIGHT_FORMATS:
            return compute, WEIGHT_FORMATS[key]
    what = "serve: weight_dtype (int8, int4 and fp8 are weight-only formats; any other)"
    return compute, dtype_name(parse_dtype(weight_dtype, what, "floating"))


def _part(on: Union[str, Roofs], tp: int, modes: Optional[MathModes] = None) -> Tuple[Roofs, str, Optional[float], str]:
    """Roofs (a named part's under the float32 math ``modes``, default torch's), a name, the
    memory capacity in bytes (None: unknown) and the tp link."""
    int_at_least(tp, 1, "serve: tp")
    if isinstance(on, Roofs):
        if tp > 1:
            raise UsageError("serve: tp > 1 needs a named part (its link); a Roofs has no link")
        return on, on.device or "given roofs", None, ""
    if not isinstance(on, str):
        raise UsageError(f"serve: on= must be a part name ('h100', 'l4', 'this machine'...) or a Roofs, got {on!r}")
    if is_this_machine(on):
        if tp > 1:  # said before measuring the machine (seconds)
            raise UsageError("serve: tp > 1 on this machine is not modelled (no link between ranks)")
        # measured here (its operands are drawn on a generator of its own)
        return named_roofs(on), "this machine", float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), ""
    modes = MathModes() if modes is None else modes
    roofs = named_roofs(on, conv_tf32=modes.conv_tf32, matmul_tf32=modes.matmul_tf32)
    part = find_part(on)
    assert part is not None  # named_roofs resolved it
    link = part.links[0] if part.links else ""
    if tp > 1 and not link:
        raise UsageError(f"serve: {part.name} lists no link for tp={tp}")
    return roofs, part.name, float(part.memory_bytes), link


def serve_on(
    facts: ServeFacts, roofs: Roofs, part: str, capacity: Optional[float], link: str, *,
    batch: Union[None, int, Sequence[int]] = None, dtype: Any = None, weight_dtype: Any = None, tp: int = 1,
    reserve: float = DEFAULT_RESERVE,
) -> ServeResult:
    """Price counted :class:`ServeFacts` on a part (no torch runs: comparing parts and batch
    sizes costs one count)."""
    return _priced(facts, roofs, part, capacity, link, estimated_text(roofs, ESTIMATED), batch=batch, dtype=dtype,
                   weight_dtype=weight_dtype, tp=tp, reserve=reserve)


def _priced(
    facts: ServeFacts, roofs: Roofs, part: str, capacity: Optional[float], link: str, estimate: str, *,
    batch: Union[None, int, Sequence[int]], dtype: Any, weight_dtype: Any, tp: int, reserve: float,
) -> ServeResult:
    """:func:`serve_on`, with ``estimate``: the sentence saying the figures are estimates ("" where
    the roofs have no doubts), stored among the result's warnings."""
    _whole_heads(facts.heads, facts.kv_heads, tp)
    compute_name, weight_name = dtype_names(dtype, weight_dtype)
    compute = column_of(compute_name) if compute_name is not None else facts.model_dtype
    weights_as = weight_format(weight_name, compute)
    pricing = Pricing(facts, roofs, compute, weights_as, tp, link)
    usable = None if capacity is None else capacity * (1.0 - reserve)
    rows = tuple(price_batch_with(pricing, b, usable) for b in batches_of(batch, facts.counted_batch))
    warnings = list(facts.warnings)
    if tp > 1 and facts.kv_heads and facts.kv_heads < tp:
        warnings.append(f"{facts.kv_heads} KV heads over tp={tp}: each rank holds the cache of "
                        f"{facts.kv_heads}/{pricing.kv_split} of them (replicated)")
    if facts.cache_dtype and facts.cache_dtype != facts.model_dtype and compute != facts.model_dtype:
        warnings.append(f"the cache is kept in {facts.cache_dtype}, not the model's {facts.model_dtype}: priced as kept")
    if facts.top_k:
        warnings.append("mixture of experts: a forward over T tokens reads E x (1 - (1 - k/E)^T) of each layer's E "
                        "experts (uniform, independent routing, in expectation)")
    if estimate:
        warnings.append(estimate)
    return ServeResult(
        part=part, roofs=roofs, dtype=compute, weight_dtype=weights_as, tp=tp, facts=facts, batches=rows,
        weight_bytes=weights_held(facts, weights_as, compute) / tp, weight_note=weight_note(weights_as, compute),
        kv_bytes_per_sequence=facts.cache_held * pricing.scale / pricing.kv_split, capacity_bytes=capacity,
        reserve=reserve, max_batch=max_batch(pricing, usable), compute_bound_batch=compute_bound_batch(pricing),
        link=link, warnings=tuple(dict.fromkeys(warnings)),
    )


def serve_facts(
    model: nn.Module, input_ids: torch.Tensor, new_tokens: int, *, kwargs: Optional[Mapping[str, Any]] = None,
    derived: bool = True, prompt_lengths: Optional[Sequence[int]] = None,
) -> ServeFacts:
    """Count ``generate()``'s forwards at the prompt's batch B and at B + 1 (the first row
    repeated), and keep each figure as its per-sequence slope and the part no sequence adds:
    every shape of a forward is affine in the batch, so two counts price every batch exactly.

    ``derived`` (default): B + 1 is counted through its prefill and first two decode steps
    only, and every continued step's FLOPs from the calls that change, priced once per
    distinct call (:mod:`flopcount.serving.counting`: the same figures, checked as it goes);
    where a check fails, or with ``derived=False``, both batch sizes are counted in full.
    ``prompt_lengths``: each row's real tokens, the row left-padded (:func:`stated_mask`)."""
    input_ids, kwargs = split_prompt(model, input_ids, kwargs, "serve")
    if prompt_lengths is not None:
        if kwargs and kwargs.get("attention_mask") is not None:
            raise UsageError("serve: an attention_mask and prompt_lengths were both given: give one (prompt_lengths "
                             "stands for the mask of left-padded rows)")
        if is_encoder_decoder(model):
            raise UsageError("serve: prompt_lengths prices a decoder-only model's padded prompt; an encoder-decoder's "
                             "padded encoder input is priced as given (pass its attention_mask in kwargs)")
        kwargs = {**(kwargs or {}), "attention_mask": stated_mask(prompt_lengths, input_ids)}
    batch = int(input_ids.shape[0])
    wider = torch.cat([input_ids, input_ids[:1]])
    more = None if kwargs is None else {
        k: torch.cat([v, v[:1]]) if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == batch else v
        for k, v in kwargs.items()
    }
    counts = derive(model, input_ids, wider, new_tokens, kwargs, more) if derived else None
    if counts is None:
        one = count_decoding(model, input_ids, new_tokens, kwargs, who="serve")
        two = count_decoding(model, wider, new_tokens, more, who="serve")
        counts = Derived(_counted(one), _counted(two), one.cache, one.setup, one.notes)
    if counts.setup.rows is not None:
        counts = _padded(counts, real_prefills(model, input_ids, counts.setup.rows))
    return _facts(model, counts, new_tokens)


def stated_mask(lengths: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """The ``attention_mask`` of a (B, P) prompt whose row b holds ``lengths[b]`` real tokens after
    P - lengths[b] pads (left padding, as generate() expects of a decoder-only model): int64 zeros
    and ones, on the prompt's device, or on the CPU for a prompt without values (meta, fake), where
    its values prove each row's sequence (:func:`flopcount.decoding.forwards.padded_rows`). A
    UsageError says what is wrong with ``lengths``: not one whole number per row, or one outside 1..P."""
    batch, prompt = int(input_ids.shape[0]), int(input_ids.shape[-1])
    if isinstance(lengths, torch.Tensor) and lengths.dim() == 1 and not is_dataless(lengths) \
            and not (lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool):
        lengths = lengths.tolist()
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) \
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in lengths):
        raise UsageError(f"serve: prompt_lengths must be one whole number per prompt row (e.g. [512, 2048]), got {lengths!r}")
    if len(lengths) != batch:
        raise UsageError(f"serve: prompt_lengths gives {len(lengths)} lengths for the prompt's {batch} rows "
                         f"(input_ids of shape {tuple(input_ids.shape)}): give one per row")
    wrong = [n for n in lengths if not 1 <= n <= prompt]
    if wrong:
        raise UsageError(f"serve: prompt_lengths must each be 1..{prompt} (the prompt's {prompt} positions, input_ids of "
                         f"shape {tuple(input_ids.shape)}), got {', '.join(map(str, wrong))}")
    device = torch.device("cpu") if is_dataless(input_ids) else input_ids.device
    positions = torch.arange(prompt, device=device)
    starts = torch.tensor([prompt - n for n in lengths], device=device)
    return (positions[None, :] >= starts[:, None]).to(torch.int64)


def _padded(counts: Derived, real: Skipped) -> Derived:
    """A padded prompt's counts (``Setup.rows``: its sequences proved by the mask) priced at its
    sequences' real tokens: the prefill at ``real`` (:func:`real_prefills`: each sequence
    prefilled alone), the rest of the counted prefill left out; the decode steps' attention at
    each sequence's own positions and the pads' cache bytes left out, where the cache's layers
    are known (``DecodeMasks.pads``). B + 1 (the first row repeated) at B's figures per sequence:
    every sequence costs the counted batch's mean, so any batch size is priced from it."""
    one, two, rows = counts.one, counts.two, len(counts.setup.rows or ())
    ratio = (rows + 1) / rows
    masks = one.masks
    one = replace(one, prefill_skipped=Skipped(one.prefill_flops - real.flops, one.prefill_attention - real.attention),
                  pad_bytes=masks.pad_bytes)
    two = replace(two, prefill_skipped=Skipped(two.prefill_flops - real.flops * ratio, two.prefill_attention - real.attention * ratio),
                  step_skipped=[Skipped(s.flops * ratio, s.attention * ratio) for s in one.step_skipped],
                  pad_bytes=lambda written, stored: masks.pad_bytes(written, stored) * ratio)
    note = (f"a padded prompt ({rows} sequences of {', '.join(str(length) for _, length in counts.setup.rows or ())} tokens "
            f"in {counts.setup.prompt} positions): priced at each sequence's real tokens, as an engine that packs them runs "
            f"them (the prefill of each alone{'; each decode step over its own positions' if one.masks.pads else ''}), "
            "and any batch as sequences of the counted ones' mean; the count is what transformers computes, pads included")
    return replace(counts, one=one, two=two, notes=[*counts.notes, note])


def _counted(decoded: Decoded) -> Counted:
    return Counted(
        batch=decoded.setup.batch, prefill_flops=decoded.prefill.flops, prefill_macs=decoded.prefill.macs,
        prefill_attention=attention_flops(decoded.prefill), prefill_skipped=decoded.prefill_skipped, step_flops=[s.flops for s in decoded.steps],
        step_macs=[s.macs for s in decoded.steps], step_attention=[attention_flops(s) for s in decoded.steps],
        held={k: float(v) for k, v in decoded.held.items()}, stored=float(cache_bytes(decoded.cache)),
        largest_write=decoded.largest_write, results=[decoded.prefill, *decoded.steps],
        step_skipped=list(decoded.step_skipped), masks=decoded.masks,
    )


def _facts(model: nn.Module, counts: Derived, new_tokens: int) -> ServeFacts:
    """Each figure's slope in the batch and fixed part, from ``counts`` at B and B + 1."""
    one, two, setup = counts.one, counts.two, counts.setup
    b, n = one.batch, len(one.step_flops)
    scalars: List[Dict[str, float]] = []
    works: List[List[Work]] = []
    base = setup.base
    for counted in (one, two):
        masks = counted.masks
        # the positions a cache holds; of a static cache's slots, the ones written (step s feeds position base + s);
        # of a padded prompt's, the sequences' own
        held = {s: bytes_held - masks.empty_bytes(base + s + 1) - counted.pad_bytes(base + s + 1, False)
                for s, bytes_held in held_per_step(counted.held, n).items()}
        scalars.append({"cache_held": counted.stored - masks.empty_bytes(base + n) - counted.pad_bytes(base + n, True),
                        "kv_bytes_per_token": held[0] - held[-1] if n else 0.0,
                        "activation_bytes": float(counted.largest_write)})
        skipped = counted.step_skipped or [Skipped()] * n
        works.append([
            Work(flops=float(counted.prefill_flops), macs=float(counted.prefill_macs), cache_written=held[-1],
                 attention_flops=float(counted.prefill_attention), skipped_flops=counted.prefill_skipped.flops,
                 skipped_attention_flops=counted.prefill_skipped.attention),
            # a decode step reads the positions cached before it that its masks admit, and writes the new one;
            # what its masks leave out is an attention op's or an eager attention's (DecodeMasks.skipped_flops)
            *(Work(flops=float(counted.step_flops[s]), macs=float(counted.step_macs[s]),
                   cache_read=held[s - 1] - masks.unread_bytes(base + s), cache_written=max(0.0, held[s] - held[s - 1]),
                   attention_flops=float(counted.step_attention[s]), skipped_flops=skipped[s].flops,
                   skipped_attention_flops=skipped[s].attention)
              for s in range(n)),
        ])
    slopes: Dict[str, Any] = {key: scalars[1][key] - first for key, first in scalars[0].items()}
    fixed: Dict[str, Any] = {key: first - b * slopes[key] for key, first in scalars[0].items()}
    (slopes["prefill"], fixed["prefill"]), *steps = [_affine(x, y, b) for x, y in zip(*works)]
    slopes["steps"], fixed["steps"] = tuple(s for s, _ in steps), tuple(f for _, f in steps)
    fixed["activation_bytes"] = max(0.0, fixed["activation_bytes"])
    experts, k = _moe(model)
    heads, kv_heads = _heads_of(model)
    results = [*one.results, *two.results]
    notes = list(dict.fromkeys([*counts.notes, *(w for r in results for w in r.warnings)]))
    # the static cache's length: its full layers' slots (a sliding layer keeps min(W, max_cache_len))
    slots = sorted({mask.slots for mask, _ in one.masks.layers if mask.slots}, reverse=True)
    if slots:
        notes.append(f"a static cache of {slots[0]} slots: priced at the positions written ({setup.base} after the prefill, "
                     f"{setup.base + n} at the end: the attention's live keys, the cache read and written, the memory), as an "
                     f"engine with a paged cache holds them; transformers allocates all {slots[0]}")
    reasons = [r for res in results for r in res.incomplete_reasons()]
    if reasons:
        notes.append("the count is incomplete, the bounds leave that work out: " + "; ".join(dict.fromkeys(reasons)))
    return ServeFacts(
        prompt_tokens=setup.prompt, new_tokens=new_tokens, counted_batch=b,
        cache_dtype=cache_dtype(counts.cache), weights=tuple(_weights(model, experts)), model_dtype=_model_dtype(one.results[0].parameters),
        fixed=fixed, top_k=k if experts > 1 else 0,
        layers=config_value(model, ("num_hidden_layers", "n_layer", "num_layers")) or 0,
        hidden=config_value(model, ("hidden_size", "n_embd", "d_model")) or 0,
        heads=heads, kv_heads=kv_heads,
        encoder_decoder=setup.encoder_decoder, complete=not reasons, warnings=tuple(notes),
        sequence_lengths=tuple(length for _, length in setup.rows or ()), **slopes,
    )


def _affine(one: Work, two: Work, b: int) -> Tuple[Work, Work]:
    """(per sequence, fixed) of a forward's work counted at batches ``b`` (``one``) and b + 1."""
    slope = Work(*(y - x for x, y in zip(astuple(one), astuple(two))))
    return slope, Work(*(x - b * d for x, d in zip(astuple(one), astuple(slope))))


#: the config keys of a MoE layer's expert count, read by core.params' rule as its experts per token
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _moe(model: nn.Module) -> Tuple[int, int]:
    """(experts per MoE layer, experts per token) from the model's config, read by the rule
    ``core.params`` reads a config with (the text config first, then the whole one; the first
    positive int; the experts per token under ``TOP_K_KEYS``); (0, 0) for a dense model."""
    experts = config_value(model, EXPERT_KEYS)
    k = config_value(model, TOP_K_KEYS)
    return (experts, k) if experts and k else (0, 0)


def _model_dtype(parameters: ParamSummary) -> str:
    """The floating dtype holding most of the parameters' bytes (float32 when none)."""
    sizes = {name: size for name, size in parameters.bytes_by_dtype.items() if is_floating(name)}
    return max(sizes, key=lambda k: sizes[k]) if sizes else "float32"


def _weights(model: nn.Module, experts: int) -> List[WeightTensor]:
    """Each parameter once, with the kind serving prices it as (see :class:`WeightTensor`)."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    head_ids = {id(p) for p in head.parameters()} if isinstance(head, nn.Module) else set()
    tables = lookup_tables(model)
    # the routed experts' weights (core.params.routed_experts), with E each; none for a dense model. A
    # stacked block's (E, out) biases are priced as biases (compute dtype, read whole)
    blocks = routed_experts(model) if experts > 1 else ()
    expert_ids = {id(p): count for name, count, params in blocks for p in params
                  if p.dim() >= 3 or isinstance(model.get_submodule(name), nn.ModuleList)}
    out: List[WeightTensor] = []
    for p in model.parameters():  # each tensor once (parameters() skips a shared one)
        dtype = str(p.dtype).replace("torch.", "")
        rows = p.numel() // p.shape[-1] if p.dim() >= 1 and p.shape[-1] else 1
        if id(p) in head_ids:
            kind = "head"
        elif id(p) in tables:
            kind, rows = "table", p.shape[0] if p.dim() else 1
        elif id(p) in expert_ids:
            kind = "expert"
        elif p.dim() >= 2 and p.is_floating_point():
            kind = "matrix"
        else:
            kind = "other"
        out.append(WeightTensor(p.numel(), int(rows), dtype, kind, expert_ids.get(id(p), 1)))
    return out

