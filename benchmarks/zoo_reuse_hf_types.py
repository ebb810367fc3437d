"""Structural reuse, the KV-cache reuse and generation's decode-step reuse on every transformers
causal-LM model type (issue #32 item 4, "Exactness is the contract", beyond the zoo).

For each model type of transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, the model is built
from its config class with every size shrunk in code (:func:`tiny_config`: 3 layers so that at
least one is replayed, hidden size 64, 4 heads, 2 key-value heads, head dim 16, intermediate
sizes 128, vocabulary 256, 4 experts with top-2, small windows; sub-configs shrunk the same way),
no download. A type whose config or model cannot be built, or whose plain forward fails, is
"not run", with the reason. Each model that runs (batch 2, ``input_ids`` of 12 tokens, eval mode):

* ``count_flops`` with reuse off vs on (``FLOPCOUNT_REUSE=0/1``), on the model with real weights
  and on a copy built on the meta device: everything a user can read, compared by
  ``zoo_reuse.compare_model``;
* ``count_generation(model, input_ids, NEW_TOKENS)`` with reuse off vs on, real and meta, compared
  in full (``to_dict`` and every step's rows); and the default (the steps between the traced
  ones costed as their affine continuation) against ``trace_every_step=True``;
* an independent oracle: ``torch.utils.flop_counter.FlopCounterMode`` run live on a real
  forward (SDPA on its math backend), compared on the contraction families it counts
  (``zoo_reuse_timm.flopcount_families``; docs/conventions.md, "Differences to
  torch.utils.flop_counter": ``_grouped_mm`` experts are not counted by torch, so a model that
  runs one is compared without it);
* the model and its inputs are left as found (``zoo.snapshot``), after each count.

Prints one line per model that differs or fails and a summary; exit status 1 on any difference::

    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/zoo_reuse_hf_types.py
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/zoo_reuse_hf_types.py --match qwen
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/zoo_reuse_hf_types.py --base   # count_flops only
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import zoo  # noqa: E402
from zoo_reuse import Tally, _first_difference, _rows, _with_reuse, compare_model  # noqa: E402
from zoo_reuse_timm import flopcount_families  # noqa: E402

import flopcount  # noqa: E402
from flopcount.errors import UsageError  # noqa: E402

BATCH, TOKENS, VOCAB, NEW_TOKENS = 2, 12, 256, 6
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 3, 64, 4, 2, 16, 128
#: the config attributes that give a number of layers (``tiny_config(layers=)`` sets them)
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers",
                "num_decoder_layers", "num_encoder_layers")
# config attribute -> the tiny value; set only where the config has the attribute
SIZES: Dict[str, Any] = {
    **dict.fromkeys(LAYER_COUNTS, LAYERS),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "embed_dim", "emb_dim", "dim", "word_embed_proj_dim"), HIDDEN),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads",
                     "encoder_attention_heads"), HEADS),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"), KV_HEADS),
    **dict.fromkeys(("head_dim", "attention_head_size", "kv_channels", "v_head_dim"), HEAD_DIM),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "decoder_ffn_dim", "encoder_ffn_dim",
                     "ffn_hidden_size", "d_ff", "d_inner", "ffn_size", "shared_expert_intermediate_size"), INTERMEDIATE),
    **dict.fromkeys(("moe_intermediate_size", "expert_intermediate_size"), 64),
    **dict.fromkeys(("vocab_size", "n_vocab"), VOCAB),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_seq_len", "n_ctx", "max_sequence_length",
                     "seq_length", "original_max_position_embeddings"), 64),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_total"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_k", "top_k", "moe_topk", "num_selected_experts"), 2),
    **dict.fromkeys(("sliding_window", "attention_window_size", "window_size", "local_window_size"), 8),
    "kv_lora_rank": 32, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "n_shared_experts": 1,
    "state_size": 16, "time_step_rank": 8, "mamba_d_state": 16, "mamba_n_heads": 8, "mamba_d_head": 16,
    # hybrids whose default layers are all state-space ones: one attention layer of the three
    "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
    "ssm_state_size": 16, "mamba_head_dim": 16, "mamba_num_heads": 8,
}
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
             "cls_token_id", "mask_token_id", "unk_token_id")
CONTRACTION_FAMILIES = ("convolution", "matmul")


def shortened_pattern(kinds: List[Any], layers: int = LAYERS) -> List[Any]:
    """A per-layer list (layer types, a hybrid's block types) made ``layers`` entries long (cut,
    or repeated from its start where it is shorter) that keeps two of its kinds in the first
    three where it has several: the first kind, another, the first again."""
    shortened = [kinds[index % len(kinds)] for index in range(layers)]
    distinct = list(dict.fromkeys(kinds))
    if len(set(map(str, shortened[:LAYERS]))) < min(2, len(distinct)):
        shortened[:LAYERS] = [distinct[0], distinct[1], distinct[0]]
    return shortened


def tiny_config(config: Any, layers: int = LAYERS) -> Any:
    """A config of ``config``'s class (a fresh default one) with every size it has shrunk, its
    sub-configs too: made by the class from the shrunk values, so that what it derives from them
    (layer types, rotary dimensions) follows; set on ``config`` where the class refuses them.
    ``layers``: the number of layers (benchmarks/zoo_replay_hf_types.py builds 14)."""
    from transformers import PretrainedConfig

    values = config.to_dict()
    changes: Dict[str, Any] = {key: value for key, value in SIZES.items() if key in values and values[key] is not None}
    for key in LAYER_COUNTS:
        if key in changes:
            changes[key] = layers
    if "qk_rope_head_dim" in changes and "head_dim" in changes:  # multi-head latent attention: rotary dims
        changes["head_dim"] = changes["qk_rope_head_dim"]
    if "attn_layer_indices" in values and not values["attn_layer_indices"]:
        changes["attn_layer_indices"] = [1]
    for key in TOKEN_IDS:
        token = values.get(key)
        if isinstance(token, int) and token >= VOCAB:
            changes[key] = min(VOCAB - 1, 2 + TOKEN_IDS.index(key))
    for key, value in values.items():
        if isinstance(value, list) and len(value) > LAYERS and key.endswith(("_pattern", "block_type", "_types")):
            changes[key] = shortened_pattern(value, layers)
    for key in list(vars(config)):
        value = getattr(config, key)
        if isinstance(value, PretrainedConfig):
            changes[key] = tiny_config(value, layers)
    try:
        with zoo.quiet():
            return type(config)(**changes)
    except Exception:
        for key, value in changes.items():
            setattr(config, key, value)
        return config


def build(model_type: str, class_name: str, device: Optional[str], layers: int = LAYERS) -> torch.nn.Module:
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = tiny_config(CONFIG_MAPPING[model_type](), layers)
    config.use_cache = True
    if hasattr(config, "is_decoder") and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        config.is_decoder = True  # BERT-like types as causal LMs
    model_class = getattr(transformers, class_name)
    if not isinstance(config, model_class.config_class) and hasattr(config, "text_config"):
        config = config.text_config  # a text-only class listed under its composite type (llama4)
    torch.manual_seed(0)
    with zoo.quiet(), torch.device(device) if device else contextlib.nullcontext():
        model = model_class(config)
    return model.eval()


def prompt(device: Optional[str]) -> torch.Tensor:
    ids = torch.randint(3, VOCAB - 1, (BATCH, TOKENS), generator=torch.Generator().manual_seed(1))
    return ids.to(device) if device else ids


def torch_contractions(model: torch.nn.Module, ids: torch.Tensor) -> Dict[str, int]:
    """FlopCounterMode's FLOPs of one real forward, by family, counted live; the forward ran
    plainly (the type is "not run" when this raises)."""
    counter = FlopCounterMode(display=False)
    with zoo.quiet(), torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), counter:
        model(ids)
    families = dict.fromkeys(CONTRACTION_FAMILIES, 0)
    for op, flops in counter.get_flop_counts()["Global"].items():
        name = op.__name__.split(".")[0]
        families["convolution" if "conv" in name else "matmul"] += int(flops)
    return families


def generation_rows(result: Any) -> Dict[str, Any]:
    return {"dict": result.to_dict(), "prefill": _rows(result.prefill), "steps": [_rows(step) for step in result.steps],
            "step totals": [(step.flops, step.macs) for step in result.steps]}


def generation_difference(model: torch.nn.Module, ids: torch.Tensor) -> Optional[str]:
    def generate(**options: Any) -> Any:
        return flopcount.count_generation(model, ids, NEW_TOKENS, **options)

    off = _with_reuse(False, generate)
    on = _with_reuse(True, generate)
    off_rows, on_rows = generation_rows(off), generation_rows(on)
    if off_rows != on_rows:
        return "count_generation " + _first_difference(off_rows, on_rows)
    every = _with_reuse(True, lambda: generate(trace_every_step=True))
    every_rows = generation_rows(every)
    every_rows["dict"].pop("warnings", None)  # the note on the steps continued differs, as it should
    on_rows["dict"].pop("warnings", None)
    if every_rows != on_rows:
        return "count_generation trace_every_step " + _first_difference(every_rows, on_rows)
    return None


def check(model_type: str, class_name: str, device: Optional[str], generate: bool) -> Tuple[Optional[str], int]:
    model = build(model_type, class_name, device)
    ids = prompt(device)
    theirs = torch_contractions(model, ids) if device is None else None
    before = zoo.snapshot(model, (ids,)) if device is None else None
    results: Dict[str, Any] = {}
    difference, reused = compare_model(model, (ids,), {}, predict=False, results=results)
    if difference is not None:
        return difference, reused
    if before is not None:
        changed = zoo.changes(before, zoo.snapshot(model, (ids,)))
        if changed:
            return f"count_flops changed the model or inputs: {', '.join(changed)}", reused
    try:
        difference = generation_difference(model, ids) if generate else None
    except UsageError as exc:  # refused, with its reason (a model that returns no cache): said, not a failure
        print(f"REFUSED {model_type}{' (meta)' if device else ''}: {zoo.first_line(exc)[:160]}", flush=True)
        difference = None
    if difference is not None:
        return difference, reused
    if before is not None:
        changed = zoo.changes(before, zoo.snapshot(model, (ids,)))
        if changed:
            return f"count_generation changed the model or inputs: {', '.join(changed)}", reused
    if theirs is not None:
        ours = flopcount_families(results["count"])
        grouped = results["count"].by_operator("flops").get("aten::_grouped_mm", 0)
        if ours != theirs and not grouped:
            return f"FlopCounterMode: flopcount {ours} vs torch {theirs}", reused
    return None, reused


def plain_forward_error(model_type: str, class_name: str) -> Optional[str]:
    """Why the type cannot be built and run without flopcount (None: it runs)."""
    try:
        model = build(model_type, class_name, None)
        with zoo.quiet(), torch.no_grad():
            model(prompt(None))
    except Exception as exc:
        return zoo.first_line(exc)[:160]
    return None


def plain_generate_error(model_type: str, class_name: str) -> Optional[str]:
    """Why ``model.generate`` (greedy, NEW_TOKENS) fails without flopcount (None: it runs)."""
    try:
        model = build(model_type, class_name, None)
        ids = prompt(None)
        with zoo.quiet(), torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
    except Exception as exc:
        return zoo.first_line(exc)[:160]
    return None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--match", default=None, help="only model types containing this text")
    parser.add_argument("--base", action="store_true",
                        help="the base models (MODEL_MAPPING_NAMES) of the types with no causal-LM class: count_flops only")
    args = parser.parse_args(argv)
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    mapping = dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if args.base:
        mapping = {t: c if isinstance(c, str) else c[0] for t, c in MODEL_MAPPING_NAMES.items()
                   if t not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES}
    types = [(t, c) for t, c in mapping.items() if not args.match or args.match in t]
    torch.set_num_threads(1)
    not_run: List[str] = []
    no_generate: List[str] = []
    tally = Tally(failure="FAILED")  # a plain forward ran: a model flopcount cannot count
    start, cpu_start = time.perf_counter(), time.process_time()
    for model_type, class_name in types:
        reason = plain_forward_error(model_type, class_name)
        if reason is not None:
            not_run.append(model_type)
            print(f"NOT RUN {model_type} ({class_name}): {reason}", flush=True)
            continue
        generate_error = "a base model (no language-model head)" if args.base else plain_generate_error(model_type, class_name)
        if generate_error is not None and not args.base:
            no_generate.append(model_type)
            print(f"NO GENERATE {model_type} ({class_name}): count_flops only; generate() fails: {generate_error}",
                  flush=True)
        for device in (None, "meta"):
            where = f"{model_type} ({class_name}){' (meta)' if device else ''}"
            clock = time.perf_counter()
            tally.run(where, device, lambda: check(model_type, class_name, device, generate_error is None), width=200)
            print(f"  {where}: {time.perf_counter() - clock:.1f} s", file=sys.stderr, flush=True)
    ran = len(types) - len(not_run)
    print(f"\n{len(types)} {'base' if args.base else 'causal-LM'} model types, {ran} built and ran a plain forward ({len(not_run)} not run; generate() fails on {len(no_generate)} "
          f"more, counted by count_flops only); "
          f"{tally.same + tally.differ} counts compared (real weights and meta copy): {tally.same} identical (count_flops "
          f"and count_generation, reuse off = on; on real weights, equal to FlopCounterMode), {tally.differ} differ, "
          f"{tally.failed} failed to count; reuse taken on {tally.reused_models} meta copies ({tally.reused_calls} calls); "
          f"transformers {transformers.__version__}, torch {torch.__version__}; "
          f"{time.perf_counter() - start:.0f} s wall, {time.process_time() - cpu_start:.0f} s CPU", flush=True)
    return 1 if tally.differ or tally.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
