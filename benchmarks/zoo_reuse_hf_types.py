"""Structural reuse, the KV-cache reuse and generation's decode-step reuse on every transformers
model type of a task head (issue #32 item 4, "Exactness is the contract", beyond the zoo).

Each task (``TASKS``: one small entry each) is one of transformers' auto mappings, model type ->
class: ``causal-lm`` (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, the default), ``base``
(``MODEL_MAPPING_NAMES`` of the types with no causal-LM class), ``seq2seq``, ``masked-lm``,
``image-classification``, ``speech-seq2seq``, ``audio-classification``. Each model is built from
its config class with every size shrunk in code (:func:`tiny_config`: 3 layers so that at least
one is replayed, hidden size 64, 4 heads, 2 key-value heads, head dim 16, intermediate sizes
128, vocabulary 256, 4 experts with top-2, small windows; images of 64 pixels, whisper's 64
feature frames; sub-configs shrunk the same way), then the type's own values where it needs
some (``TYPE_CONFIG``: data, each entry with its reason), no download. A type whose config or
model cannot be built, or whose plain forward fails, is "not run", with the reason. Each model
that runs (batch 2, eval mode) is fed its main input (``main_input``: 12 token ids, 64-pixel
images, half a second of audio, feature frames), with 6 ``decoder_input_ids`` for an
encoder-decoder:

* ``count_flops`` with reuse off vs on (``FLOPCOUNT_REUSE=0/1``), on the model with real weights
  and on a copy built on the meta device: everything a user can read, compared by
  ``zoo_reuse.compare_model``;
* for the generating heads (causal-lm, seq2seq, speech-seq2seq) where ``model.generate`` runs:
  ``count_generation(model, main input, NEW_TOKENS)`` with reuse off vs on, real and meta,
  compared in full (``to_dict`` and every step's rows); and the default (the steps between the
  traced ones costed as their affine continuation) against ``trace_every_step=True``;
* an independent oracle: ``torch.utils.flop_counter.FlopCounterMode`` run live on a real
  forward (SDPA on its math backend), compared on the contraction families it counts
  (``zoo_reuse_timm.flopcount_families``; docs/conventions.md, "Differences to
  torch.utils.flop_counter": ``_grouped_mm`` experts are not counted by torch, so a model that
  runs one is compared without it; a NO ORACLE line where FlopCounterMode cannot follow the
  forward);
* the model and its inputs are left as found (``zoo.snapshot``), after each count.

Prints one line per model that differs or fails and a summary; exit status 1 on any difference::

    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/zoo_reuse_hf_types.py
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/zoo_reuse_hf_types.py --match qwen
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/zoo_reuse_hf_types.py llama gpt2   # these types only
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/zoo_reuse_hf_types.py --task seq2seq
    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/zoo_reuse_hf_types.py --base   # = --task base
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

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

BATCH, TOKENS, VOCAB, NEW_TOKENS, DECODER_TOKENS = 2, 12, 256, 6, 6
AUDIO_SAMPLES, AUDIO_FRAMES = 8000, 32  # half a second at 16 kHz; feature frames
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
    **dict.fromkeys(("vocab_size", "n_vocab", "vocab_size_per_layer_input"), VOCAB),  # Gemma-3n/4: a per-layer table
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
ROPE = {"rope_type": "default", "rope_theta": 10000.0}
QWEN4_EXP_TEXT = {"indexer_n_heads": HEADS, "indexer_kv_heads": 1, "indexer_head_dim": HEAD_DIM, "indexer_budget": 8,
                  "indexer_compress_ratio": 4, "linear_key_head_dim": HEAD_DIM, "linear_value_head_dim": HEAD_DIM,
                  "linear_num_key_heads": 2, "linear_num_value_heads": 4}
# model type -> the config values beyond SIZES that its tiny config needs to build and run a
# plain forward (found by the sweep's "not run" reasons); a dict value holds a sub-config's values
TYPE_CONFIG: Dict[str, Dict[str, Any]] = {
    # latent attention with a sparse-attention indexer: the keys expanded to every head (no
    # grouping); the indexer as many heads as the attention, of its head size
    **dict.fromkeys(("axk2", "deepseek_v32", "glm_moe_dsa"), {"num_key_value_heads": HEADS, "index_n_heads": HEADS,
                                                             "index_head_dim": HEAD_DIM, "index_topk": 8}),
    **dict.fromkeys(("codegen", "gptj"), {"rotary_dim": 8}),  # rotary dims within the head of 16
    **dict.fromkeys(("hunyuan_v1_dense", "hunyuan_v1_moe", "ministral"), {"head_dim": HEAD_DIM}),  # default None
    "nemotron": {"num_key_value_heads": KV_HEADS},
    "deepseek_v2": {"num_experts_per_tok": 2, "n_group": 1, "topk_group": 1},
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
    "kimi_linear": {"num_experts_per_token": 2, "linear_head_dim": HEAD_DIM, "linear_num_heads": HEADS},
    "bailing_hybrid": {"num_experts_per_token": 2, "num_expert_group": 1},
    "lfm2_moe": {"layer_types": ["full_attention", "conv", "full_attention"], "num_dense_layers": 1},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention", "linear_attention"]},
    "mamba2": {"n_groups": 1, "num_heads": 8, "expand": 2},  # 8 heads of 16 = 2 x hidden
    "falcon_h1": {"mamba_d_ssm": 128},
    "reformer": {"axial_pos_shape": [8, 8], "axial_pos_embds_dim": [32, 32], "local_attn_chunk_length": 4,
                 "lsh_attn_chunk_length": 4, "attn_layers": ["local", "lsh", "local"]},
    # rotary parameters per layer type
    "cohere_compass_text": {"rope_parameters": {"full_attention": ROPE, "sliding_attention": ROPE}},
    "gemma3n_text": {"num_kv_shared_layers": 0, "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 16,
                     "rope_parameters": {"full_attention": ROPE, "sliding_attention": ROPE}},
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},  # set by the parent config's defaults
    **dict.fromkeys(("musicgen", "musicgen_melody"), {"decoder": {"num_codebooks": 1}}),
    "xmod": {"default_language": "en_XX"},
    # two hybrid layers of three, sharing their attention block (the tied weights need two)
    "zamba": {"layers_block_type": ["hybrid", "linear_attention", "hybrid"]},
    # vision: per-stage heads [3, 6, 12, 24] kept, so the default width whose stages they divide
    "swinv2": {"embed_dim": 96},
    # and windows of 2 patches, within the last stage's 2 x 2 (a window larger than a stage's
    # patches is clipped, and its relative-position bias then does not fit)
    **dict.fromkeys(("swin", "donut-swin"), {"embed_dim": 96, "window_size": 2}),
    "squeezebert": {"embedding_size": HIDDEN},  # no projection between embedding and first layer
    "mobilebert": {"embedding_size": 32, "true_hidden_size": 32, "intra_bottleneck_size": 32},  # bottlenecks
    "esm": {"vocab_size": VOCAB, "pad_token_id": 1, "mask_token_id": 2},  # defaults None
    "esmc": {"num_key_value_heads": HEADS},  # no grouped keys (its key norm is over every head)
    "audio-spectrogram-transformer": {"max_length": 64},  # spectrogram frames
    # encoder-decoders whose default config has no decoder start token (generate() needs one)
    **dict.fromkeys(("t5", "longt5", "switch_transformers"), {"decoder_start_token_id": 0}),
    "qwen4_exp_text": QWEN4_EXP_TEXT,
    # latent attention: the keys expanded to every head
    "dots3_note_text": {"num_key_value_heads": HEADS},
    "dots3_note": {"text_config": {"num_key_value_heads": HEADS}},
    "xlstm": {"qk_dim_factor": 1.0},  # the recurrent step's state of query = value head size
    # three layers: one input, one recurrent, one output; no "mlp" layer types
    "dory": {"layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "n_input_layers": 1,
             "n_recurrent_layers": 1, "n_output_layers": 1, "rope_parameters": None},
    "qwen4_exp": {"text_config": QWEN4_EXP_TEXT},
}


def shortened_pattern(kinds: List[Any], layers: int = LAYERS) -> List[Any]:
    """A per-layer list (layer types, a hybrid's block types) made ``layers`` entries long (cut,
    or repeated from its start where it is shorter) that keeps two of its kinds in the first
    three where it has several: the first kind, another, the first again."""
    shortened = [kinds[index % len(kinds)] for index in range(layers)]
    distinct = list(dict.fromkeys(kinds))
    if len(set(map(str, shortened[:LAYERS]))) < min(2, len(distinct)):
        shortened[:LAYERS] = [distinct[0], distinct[1], distinct[0]]
    return shortened


def tiny_config(config: Any, values_of_type: Optional[Dict[str, Any]] = None, sizes: Mapping[str, Any] = SIZES,
                layers: int = LAYERS) -> Any:
    """A config of ``config``'s class (a fresh default one) with every size it has shrunk, its
    sub-configs too, then ``values_of_type`` (the type's TYPE_CONFIG entry; a dict value goes to
    that sub-config): made by the class from these values, so that what it derives from them
    (layer types, rotary dimensions) follows; set on ``config`` where the class refuses them.
    ``layers``: the number of layers (benchmarks/zoo_replay_hf_types.py builds 14)."""
    from transformers import PretrainedConfig

    values_of_type = values_of_type or {}

    values = config.to_dict()
    # a size given per stage (a list: hierarchical vision models' heads and widths) is kept
    changes: Dict[str, Any] = {key: value for key, value in sizes.items()
                               if key in values and values[key] is not None and not isinstance(values[key], list)}
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
    for key, value in vars(config).items():  # not getattr: a per-layer attribute refuses it (gemma4)
        if isinstance(value, PretrainedConfig):
            changes[key] = tiny_config(value, values_of_type.get(key), sizes, layers)
    changes.update({key: value for key, value in values_of_type.items() if not isinstance(changes.get(key), PretrainedConfig)})
    try:
        with zoo.quiet():
            return type(config)(**changes)
    except Exception:
        for key, value in changes.items():
            setattr(config, key, value)
        return config


@dataclass(frozen=True)
class Task:
    """One head of the sweep: the types of ``mapping`` (modeling_auto's model type -> class name)
    built with SIZES and ``sizes``, run on their main input (``main_input``), ``decoder_tokens``
    decoder ids beside it for an encoder-decoder; ``count_generation`` compared when
    ``generate`` (and ``model.generate`` runs)."""

    mapping: str
    generate: bool
    decoder_tokens: int = 0
    is_decoder: bool = False  # a BERT-like config made a causal decoder
    sizes: Mapping[str, Any] = field(default_factory=dict)
    without: Optional[str] = None  # the types of this mapping left out


IMAGE_SIZES = {"image_size": 64, "num_channels": 3}  # default patches: 16 of 16 pixels for a ViT
AUDIO_SIZES = {"max_source_positions": 32, "max_target_positions": 64}  # whisper: 64 feature frames
TASKS: Dict[str, Task] = {
    "causal-lm": Task("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", generate=True, is_decoder=True),
    "base": Task("MODEL_MAPPING_NAMES", generate=False, sizes={**IMAGE_SIZES, **AUDIO_SIZES},
                 without="MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "seq2seq": Task("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", generate=True, decoder_tokens=DECODER_TOKENS),
    "masked-lm": Task("MODEL_FOR_MASKED_LM_MAPPING_NAMES", generate=False),
    "image-classification": Task("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", generate=False, sizes=IMAGE_SIZES),
    "speech-seq2seq": Task("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", generate=True, decoder_tokens=DECODER_TOKENS,
                           sizes=AUDIO_SIZES),
    "audio-classification": Task("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", generate=False, sizes=AUDIO_SIZES),
}


def task_types(task: Task) -> Dict[str, str]:
    """The task's model types and their classes (the first where several are listed)."""
    from transformers.models.auto import modeling_auto

    left_out = getattr(modeling_auto, task.without) if task.without else {}
    mapping = getattr(modeling_auto, task.mapping)
    return {t: c if isinstance(c, str) else c[0] for t, c in mapping.items() if t not in left_out}


def build(model_type: str, class_name: str, device: Optional[str], task: Task, layers: int = LAYERS) -> torch.nn.Module:
    import transformers
    from transformers import CONFIG_MAPPING

    config = tiny_config(CONFIG_MAPPING[model_type](), TYPE_CONFIG.get(model_type), {**SIZES, **task.sizes}, layers)
    config.use_cache = True
    if hasattr(config, "is_decoder") and task.is_decoder:
        config.is_decoder = True  # BERT-like types as causal LMs
    model_class = getattr(transformers, class_name)
    if not isinstance(config, model_class.config_class):  # a class listed under its composite type: its part
        parts = [value for value in vars(config).values() if isinstance(value, model_class.config_class)]
        config = parts[0] if parts else config  # llama4's text_config, musicgen's decoder
    torch.manual_seed(0)
    with zoo.quiet(), torch.device(device) if device else contextlib.nullcontext():
        model = model_class(config)
    return model.eval()


def prompt(device: Optional[str]) -> torch.Tensor:
    ids = torch.randint(3, VOCAB - 1, (BATCH, TOKENS), generator=torch.Generator().manual_seed(1))
    return ids.to(device) if device else ids


def main_input(model: torch.nn.Module, device: Optional[str]) -> torch.Tensor:
    """The model's main input (``model.main_input_name``) of batch BATCH, shaped from its config:
    token ids (``prompt``), images of ``image_size`` pixels, AUDIO_SAMPLES samples of raw audio,
    a spectrogram, or feature frames (whisper's 2 x ``max_source_positions``, filter banks)."""
    config = model.config
    name = model.main_input_name
    generator = torch.Generator().manual_seed(1)
    if name == "pixel_values":
        vision = getattr(config, "vision_config", config)  # a composite's image part (CLIP)
        size = getattr(vision, "image_size", IMAGE_SIZES["image_size"])  # a convolutional net has none
        size = size if isinstance(size, int) else size[0]
        channels = getattr(vision, "num_channels", IMAGE_SIZES["num_channels"])
        tensor = torch.randn(BATCH, channels, size, size, generator=generator)
    elif name == "input_values" and hasattr(config, "max_length"):  # a spectrogram (AST)
        tensor = torch.randn(BATCH, config.max_length, config.num_mel_bins, generator=generator)
    elif name == "input_values":
        tensor = torch.randn(BATCH, AUDIO_SAMPLES, generator=generator)
    elif name == "input_features" and hasattr(config, "num_mel_bins"):
        tensor = torch.randn(BATCH, config.num_mel_bins, 2 * config.max_source_positions, generator=generator)
    elif name == "input_features" and hasattr(config, "feature_projection_input_dim"):  # w2v-BERT's filter banks
        tensor = torch.randn(BATCH, AUDIO_FRAMES, config.feature_projection_input_dim, generator=generator)
    elif name == "input_features":
        features = config.input_feat_per_channel * config.input_channels
        tensor = torch.randn(BATCH, AUDIO_FRAMES, features, generator=generator)
    else:
        return prompt(device)
    return tensor.to(device) if device else tensor


def inputs(model: torch.nn.Module, device: Optional[str], task: Task) -> Tuple[Tuple[torch.Tensor], Dict[str, Any]]:
    """The forward's arguments: the main input, and an encoder-decoder's decoder ids."""
    kwargs: Dict[str, Any] = {}
    if task.decoder_tokens:
        kwargs["decoder_input_ids"] = prompt(device)[:, : task.decoder_tokens]
    return (main_input(model, device),), kwargs


def torch_contractions(model: torch.nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Dict[str, int]]:
    """FlopCounterMode's FLOPs of one real forward, by family, counted live; the forward ran
    plainly (the type is "not run" when it raises). None where FlopCounterMode itself cannot
    follow the forward (its module tracker refuses a view of a parameter made under no_grad:
    DBRX's experts), said on a NO ORACLE line. The process's generator is set back after, so
    that the count that follows draws what this forward drew (VITS samples its durations)."""
    counter = FlopCounterMode(display=False)
    generator = torch.get_rng_state()
    try:
        with zoo.quiet(), torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), counter:
            model(*args, **kwargs)
    except Exception as exc:
        print(f"NO ORACLE {type(model).__name__}: FlopCounterMode raised {zoo.first_line(exc)[:120]}", flush=True)
        return None
    finally:
        torch.set_rng_state(generator)
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


def _changed(before: Any, model: torch.nn.Module, args: Any, kwargs: Any, reading: str) -> Optional[str]:
    """What ``reading`` changed of the model or its inputs since ``before`` (``zoo.snapshot``; None:
    not checked, a meta copy), said in one line; None when nothing."""
    if before is None:
        return None
    changed = zoo.changes(before, zoo.snapshot(model, (args, kwargs)))
    return f"{reading} changed the model or inputs: {', '.join(changed)}" if changed else None


def check(model_type: str, class_name: str, device: Optional[str], task: Task, generate: bool) -> Tuple[Optional[str], int]:
    model = build(model_type, class_name, device, task)
    args, kwargs = inputs(model, device, task)
    theirs = torch_contractions(model, args, kwargs) if device is None else None
    before = zoo.snapshot(model, (args, kwargs)) if device is None else None
    results: Dict[str, Any] = {}
    difference, reused = compare_model(model, args, kwargs, predict=False, results=results)
    if difference is not None:
        return difference, reused
    changed = _changed(before, model, args, kwargs, "count_flops")
    if changed is not None:
        return changed, reused
    try:
        difference = generation_difference(model, args[0]) if generate else None
    except UsageError as exc:  # refused, with its reason (a model that returns no cache): said, not a failure
        print(f"REFUSED {model_type}{' (meta)' if device else ''}: {zoo.first_line(exc)[:160]}", flush=True)
        difference = None
    if difference is not None:
        return difference, reused
    changed = _changed(before, model, args, kwargs, "count_generation")
    if changed is not None:
        return changed, reused
    if theirs is not None:
        ours = flopcount_families(results["count"])
        grouped = results["count"].by_operator("flops").get("aten::_grouped_mm", 0)
        if ours != theirs and not grouped:
            return f"FlopCounterMode: flopcount {ours} vs torch {theirs}", reused
    return None, reused


def plain_forward_error(model_type: str, class_name: str, task: Task) -> Optional[str]:
    """Why the type cannot be built and run without flopcount (None: it runs)."""
    try:
        model = build(model_type, class_name, None, task)
        args, kwargs = inputs(model, None, task)
        with zoo.quiet(), torch.no_grad():
            model(*args, **kwargs)
    except Exception as exc:
        return zoo.first_line(exc)[:160]
    return None


def plain_generate_error(model_type: str, class_name: str, task: Task) -> Optional[str]:
    """Why ``model.generate`` (greedy, NEW_TOKENS) fails without flopcount (None: it runs)."""
    try:
        model = build(model_type, class_name, None, task)
        main = main_input(model, None)
        mask = {"attention_mask": torch.ones_like(main)} if not main.is_floating_point() else {}
        with zoo.quiet(), torch.no_grad():
            model.generate(main, **mask, max_new_tokens=NEW_TOKENS, do_sample=False)
    except Exception as exc:
        return zoo.first_line(exc)[:160]
    return None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", help="only these model types (exact names; default: every type)")
    parser.add_argument("--match", default=None, help="only model types containing this text")
    parser.add_argument("--task", choices=TASKS, default="causal-lm",
                        help="which head: causal-lm (the default), base (MODEL_MAPPING_NAMES of the types with no "
                             "causal-LM class), seq2seq, masked-lm, image-classification, speech-seq2seq, "
                             "audio-classification")
    parser.add_argument("--base", action="store_true", help="the same as --task base")
    args = parser.parse_args(argv)
    import transformers

    task_name = "base" if args.base else args.task
    task = TASKS[task_name]
    types = [(t, c) for t, c in task_types(task).items()
             if (not args.match or args.match in t) and (not args.types or t in args.types)]
    torch.set_num_threads(1)
    not_run: List[str] = []
    no_generate: List[str] = []
    tally = Tally(failure="FAILED")  # a plain forward ran: a model flopcount cannot count
    start, cpu_start = time.perf_counter(), time.process_time()
    for model_type, class_name in types:
        reason = plain_forward_error(model_type, class_name, task)
        if reason is not None:
            not_run.append(model_type)
            print(f"NOT RUN {model_type} ({class_name}): {reason}", flush=True)
            continue
        generate_error = plain_generate_error(model_type, class_name, task) if task.generate else "no generation head"
        if generate_error is not None and task.generate:
            no_generate.append(model_type)
            print(f"NO GENERATE {model_type} ({class_name}): count_flops only; generate() fails: {generate_error}",
                  flush=True)
        for device in (None, "meta"):
            where = f"{model_type} ({class_name}){' (meta)' if device else ''}"
            clock = time.perf_counter()
            tally.run(where, device, lambda: check(model_type, class_name, device, task, generate_error is None),
                      width=200)
            print(f"  {where}: {time.perf_counter() - clock:.1f} s", file=sys.stderr, flush=True)
    ran = len(types) - len(not_run)
    generated = f"; generate() fails on {len(no_generate)} more, counted by count_flops only" if task.generate else ""
    print(f"\n{len(types)} {task_name} model types ({task.mapping}), {ran} built and ran a plain forward "
          f"({len(not_run)} not run{generated}); "
          f"{tally.same + tally.differ} counts compared (real weights and meta copy): {tally.same} identical (count_flops"
          f"{' and count_generation' if task.generate else ''}, reuse off = on; on real weights, equal to "
          f"FlopCounterMode), {tally.differ} differ, "
          f"{tally.failed} failed to count; reuse taken on {tally.reused_models} meta copies ({tally.reused_calls} calls); "
          f"transformers {transformers.__version__}, torch {torch.__version__}; "
          f"{time.perf_counter() - start:.0f} s wall, {time.process_time() - cpu_start:.0f} s CPU", flush=True)
    return 1 if tally.differ or tally.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
