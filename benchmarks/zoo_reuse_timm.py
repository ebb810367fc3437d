"""Structural reuse, and the count itself, on timm (issue #32's exactness beyond the zoo; #27 item 1).

timm is the largest zoo of vision architectures built from repeated blocks (ViT, Swin's
alternating shifted windows, MaxViT, CoAtNet, EVA's rotary embeddings, BEiT's relative-position
tables, LeViT's eval-mode attention-bias cache, CaiT's class-attention blocks, FastViT's and
RepVGG's reparameterisable branches, NFNet's weight standardisation...). For each model of
``MODELS`` (about one per timm module, the smallest variant or the one with unusual blocks;
``timm.create_model(name, pretrained=False)``, batch 2 at the model's default input size, eval
mode; ``TRAIN`` again in train mode):

* reuse off vs on (``FLOPCOUNT_REUSE=0/1``), on the model with real weights and on a copy built
  on the meta device: everything a user can read, compared by ``zoo_reuse.compare_model``
  (``to_dict``, ``by_operator``/``by_module``/``by_module_and_operator``/``by_phase`` for every
  metric, module calls, ``predict(on="T4")``);
* an independent oracle: ``torch.utils.flop_counter.FlopCounterMode`` run live on the same
  model and inputs (on a deep copy in train mode, whose batch norms update their statistics),
  with SDPA on its math backend (torch has no formula for the CPU flash kernel; the math path
  is the two ``bmm`` the SDPA formula counts). torch counts convolutions and the matmul family
  only, so the comparison is per family: flopcount's ``by_operator("flops")`` summed over
  ``CONVOLUTIONS`` equals torch's over its convolutions, and over ``MATMULS`` equals torch's
  ``mm``/``addmm``/``bmm``/``baddbmm`` (docs/conventions.md, "Differences to
  torch.utils.flop_counter": bias adds are not counted by either);
* ``predict(m).by_operator()`` FLOPs equal ``count_flops(m).by_operator("flops")`` (issue #27
  item 1);
* the model and its inputs are left as found (``zoo.snapshot``: state_dict with buffers such
  as LeViT's cached attention biases, training flags, hooks, requires_grad, the inputs, RNG).

Prints one line per model that differs or fails and a summary; exit status 1 on any
difference. Needs timm (optional, never a requirement of flopcount)::

    PYTHONPATH=. /work/main/.venv-zoo/bin/python benchmarks/zoo_reuse_timm.py
    PYTHONPATH=. /work/main/.venv-zoo/bin/python benchmarks/zoo_reuse_timm.py --match levit
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, List, Mapping, Optional, Tuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import zoo  # noqa: E402
from zoo_nn import Case  # noqa: E402
from zoo_reuse import Tally, compare_model  # noqa: E402

# About one model per timm module (timm.list_modules()), the smallest variant, plus the variants
# with unusual blocks; timm's own test_* models are small versions of its main families.
MODELS = """
test_vit test_vit2 test_vit3 test_vit4 test_vit_relpos test_convnext test_convnext2 test_convnext3 test_efficientnet
test_efficientnet_evos test_efficientnet_gn test_efficientnet_ln test_byobnet test_coatnet test_maxvit test_nfnet
test_resnet test_mambaout
vit_tiny_patch16_224 deit_tiny_distilled_patch16_224 deit3_small_patch16_224 beit_base_patch16_224 beitv2_base_patch16_224
eva02_tiny_patch14_224 vit_small_patch16_rope_mixed_224 vit_small_patch16_dinov3 vit_pe_core_tiny_patch16_384
vit_relpos_small_patch16_rpn_224 vit_srelpos_small_patch16_224 vit_small_r26_s32_224 vit_tiny_r_s16_p8_224
flexivit_small vit_dwee_patch16_reg1_gap_256 cait_xxs24_224 xcit_nano_12_p16_224 convit_tiny crossvit_tiny_240
pit_ti_224 tnt_s_patch16_224 levit_128s levit_conv_128s volo_d1_224 swin_tiny_patch4_window7_224
swinv2_tiny_window8_256 swinv2_cr_tiny_ns_224 swin_s3_tiny_224
convnext_atto convnext_zepto_rms convnextv2_atto maxvit_pico_rw_256 maxvit_rmlp_pico_rw_256 maxxvitv2_nano_rw_256
coatnet_pico_rw_224 coatnet_nano_cc_224 coatnext_nano_rw_224
efficientnet_b0 tf_efficientnet_b0 efficientnet_cc_b0_4e efficientnetv2_rw_t tf_efficientnetv2_b0 mixnet_s tinynet_e
mnasnet_small mobilenetv2_035 mobilenetv1_100 fbnetc_100 spnasnet_100 lcnet_035
mobilenetv3_small_050 mobilenetv4_conv_small_035 mobilenetv4_hybrid_medium fbnetv3_b hardcorenas_a ghostnet_050
ghostnetv2_100 ghostnetv3_050 repghostnet_050 rexnet_100
regnetx_002 regnety_002 regnetz_005 regnetz_b16 repvgg_a0 mobileone_s0 gernet_s resnet33ts gcresnet33ts eca_resnext26ts
bat_resnext26ts botnet26t_256 halonet26t lambda_resnet26t haloregnetz_b
dm_nfnet_f0 nf_regnet_b0 nf_resnet26 eca_nfnet_l0
mixer_s32_224 gmixer_12_224 gmlp_ti16_224 resmlp_12_224 pvt_v2_b0 twins_pcpvt_small twins_svt_small coat_lite_mini coat_tiny
hrnet_w18_small dla34 dla46x_c dpn48b densenet121 vovnet39a ese_vovnet19b_dw cspresnet50 cs3darknet_s cspnext_tiny darknet17
efficientformer_l1 efficientformerv2_s0 mobilevit_xxs mobilevitv2_050 fastvit_t8 fastvit_mci0 repvit_m0_9 edgenext_xx_small
poolformer_s12 poolformerv2_s12 convformer_s18 caformer_s18 inception_next_atto mambaout_femto starnet_s050 fasternet_t0
efficientvit_b0 efficientvit_m0 efficientvim_m1 shvit_s1 swiftformer_xs lowformer_b0 tiny_vit_5m_224 gcvit_xxtiny
davit_tiny focalnet_tiny_srf nest_tiny hiera_tiny_224 hieradet_small mvitv2_tiny sequencer2d_s visformer_tiny
nextvit_small rdnet_tiny vitamin_small_224
resnet10t resnet18d resnetaa34d resnetblur18 resnetrs50 seresnet18 ecaresnet26t skresnet18 resnest14d res2net50_14w_8s
resnetv2_18 resnetv2_50d_frn legacy_seresnet18 selecsls42 tresnet_m xception41 legacy_xception inception_v3
convmixer_768_32 vgg11 hgnetv2_b0 hgnet_tiny lcnetv2_small iformer_t csatv2 cpubone_nano
eva02_small_patch14_224 vit_pwee_patch16_reg1_gap_256 vit_small_patch16_18x2_224 vit_base_patch16_xp_224 vit_little_patch16_reg4_gap_256
vit_medium_patch16_gap_256 vit_relpos_medium_patch16_cls_224 vit_base_patch16_rope_reg1_gap_256 vit_small_patch16_rope_224
mobilenetv4_conv_aa_medium efficientnet_b0_g8_gn efficientnet_blur_b0 fastvit_sa12 repvit_m1 starnet_s1 xcit_nano_12_p8_224
convnext_atto_ols convnext_zepto_rms_ols swinv2_cr_tiny_224 maxvit_nano_rw_256 maxxvit_rmlp_nano_rw_256 coatnet_rmlp_nano_rw_224
crossvit_9_dagger_240 levit_conv_128 levit_256d pvt_v2_b2_li coat_lite_tiny nest_tiny_jx tnt_s_legacy_patch16_224
mvitv2_small_cls hiera_small_abswin_256 sam2_hiera_tiny resnet50_clip_gap resnet50_mlp regnetz_c16_evos regnetz_b16_evos
resnetv2_50d_gn resnetv2_50d_evos nf_seresnet26 nf_ecaresnet26 nfnet_l0 res2next50 dla60_res2next dpn68b densenetblur121d
selecsls42b ese_vovnet19b_slim eca_vovnet39b hrnet_w18_small_v2 gernet_m mobileone_s1 repvgg_b1g4 repghostnet_058
ghostnetv2_130 rexnetr_100 tinynet_a lcnet_050 mobilenetv3_large_075 tf_mobilenetv3_small_minimal_100
mobilenetv4_conv_blur_medium efficientformerv2_s1 swiftformer_s mambaout_kobe cspresnext50 darknet21 sedarknet21
focalnet_tiny_lrf edgenext_x_small edgenext_small_rw efficientvit_m1 efficientvit_b1 tiny_vit_11m_224 convit_small
deit_tiny_patch16_224 beit3_base_patch16_224 vit_base_patch16_siglip_224 vit_base_patch32_clip_quickgelu_224 vit_base_patch16_plus_240
vit_base_patch16_rpn_224 gmlp_s16_224 resmlp_24_224 mixer_s16_224 poolformer_s24 convformer_s36 caformer_s36
samvit_base_patch16_224 qwen3_vit_88m gemma4_vit_167m naflexvit_base_patch16_gap mobilenetv5_300m_enc inception_v4
inception_resnet_v2 nasnetalarge pnasnet5large deepseek_vit_412m
""".split()
# Counted again in train mode (dropout, drop path, batch-norm statistics, LeViT's bias cache unused).
TRAIN = """
test_vit test_convnext test_efficientnet test_nfnet test_resnet test_coatnet test_maxvit levit_128s cait_xxs24_224
swin_tiny_patch4_window7_224 fastvit_t8 repvgg_a0 mobileone_s0 dm_nfnet_f0 efficientnet_b0 resnet18d
deit_tiny_distilled_patch16_224 crossvit_9_dagger_240 efficientformer_l1 repvit_m0_9 convnext_atto regnetx_002
efficientvit_m0 tiny_vit_5m_224 maxvit_pico_rw_256 coatnet_pico_rw_224 gcvit_xxtiny hrnet_w18_small xcit_nano_12_p16_224
volo_d1_224 sequencer2d_s beit_base_patch16_224 mobilevit_xxs shvit_s1
""".split()
BATCH = 2
# smaller inputs than the default configuration (768 x 768, 546 x 546) where the model allows them
INPUT_SIZES = {
    "qwen3_vit_88m": (3, 256, 256), "gemma4_vit_167m": (3, 256, 256), "mobilenetv5_300m_enc": (3, 256, 256),
    "deepseek_vit_412m": (3, 224, 224), "naflexvit_base_patch16_gap": (3, 224, 224),
}
# flopcount's operators in the two families FlopCounterMode counts (torch counts no other op)
CONVOLUTIONS = frozenset({"aten::convolution"})
MATMULS = frozenset({
    "aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::einsum",
    "aten::tensordot", "aten::scaled_dot_product_attention",
})
TORCH_CONVOLUTIONS = frozenset({"convolution", "_convolution", "convolution_overrideable", "cudnn_convolution",
                                "_slow_conv2d_forward"})


@dataclasses.dataclass(frozen=True)
class Variant:
    """A model built or called other than by default: ``create`` keywords of
    ``timm.create_model``, an input ``size``, a ``dtype``, channels-last weights and input,
    gradient checkpointing (train mode)."""

    name: str
    label: str
    create: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    size: Optional[Tuple[int, int, int]] = None
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    checkpointing: bool = False
    train: bool = False
    #: called with the built model (in its mode) and its inputs before the counts
    prepare: Optional[Callable[[torch.nn.Module, Tuple[Any, ...]], None]] = None
    #: the meta copy is prepared on the CPU, then moved (timm's reparameterisation cannot run on meta)
    prepare_on_cpu: bool = False
    #: the grad mode the counts run under (the oracle runs with grad on)
    grad_mode: Optional[Callable[[], ContextManager[Any]]] = None


def warm_forward(model: torch.nn.Module, args: Tuple[Any, ...]) -> None:
    """One forward before counting: LeViT's eval-mode attention-bias cache then holds a tensor
    (real or meta) that the count's fake copy meets."""
    with torch.no_grad():
        model(*args)


def reparameterized(model: torch.nn.Module, args: Tuple[Any, ...]) -> None:
    """timm's inference reparameterisation in place (FastViT, MobileOne, RepVGG, RepViT, RepGhost:
    each block's branches fused into one convolution)."""
    from timm.utils.model import reparameterize_model

    reparameterize_model(model, inplace=True)


def mixed_modes(model: torch.nn.Module, args: Tuple[Any, ...]) -> None:
    """Every other block (or stage) in train mode, the rest in eval: equal blocks that differ
    only in their training flag."""
    blocks = getattr(model, "blocks", None) or getattr(model, "stages", None)
    for block in list(blocks)[::2]:
        block.train()


# What the default models do not exercise: position embeddings resampled in the forward
# (dynamic_img_size), smaller windows, channels-last strides, bfloat16, drop path in train mode
# with gradient checkpointing (timm's checkpoint_seq), feature extraction (features_only; the
# "hook" kind registers forward hooks on the model, which reuse must not cross).
VARIANTS = [
    Variant("vit_tiny_patch16_224", "dynamic size 160x128", create={"dynamic_img_size": True}, size=(3, 160, 128)),
    Variant("eva02_tiny_patch14_224", "dynamic size 168x196", create={"dynamic_img_size": True}, size=(3, 168, 196)),
    Variant("vit_relpos_small_patch16_rpn_224", "160x192", create={"img_size": (160, 192)}, size=(3, 160, 192)),
    Variant("swin_tiny_patch4_window7_224", "192, window 6", create={"img_size": 192, "window_size": 6},
            size=(3, 192, 192)),
    Variant("resnet18", "channels last", channels_last=True),
    Variant("convnext_atto", "channels last", channels_last=True),
    Variant("efficientnet_b0", "channels last", channels_last=True),
    Variant("resnet18", "bfloat16", dtype=torch.bfloat16),
    Variant("vit_tiny_patch16_224", "bfloat16", dtype=torch.bfloat16),
    Variant("convnext_atto", "bfloat16", dtype=torch.bfloat16),
    Variant("resnet18", "features_only", create={"features_only": True}),
    Variant("convnext_atto", "features_only, hooks", create={"features_only": True, "feature_cls": "hook"}),
    Variant("efficientnet_b0", "features_only", create={"features_only": True}),
    Variant("vit_tiny_patch16_224", "drop path 0.1, checkpointing", create={"drop_path_rate": 0.1},
            checkpointing=True, train=True),
    Variant("convnext_atto", "drop path 0.1, checkpointing", create={"drop_path_rate": 0.1}, checkpointing=True,
            train=True),
    Variant("efficientnet_b0", "drop path 0.2", create={"drop_path_rate": 0.2}, train=True),
    Variant("swin_tiny_patch4_window7_224", "drop path 0.1", create={"drop_path_rate": 0.1}, train=True),
    Variant("levit_128s", "after an eval forward", prepare=warm_forward),
    Variant("levit_conv_128s", "after an eval forward", prepare=warm_forward),
    Variant("vit_tiny_patch16_224", "drop path 0.1, every other block in train mode", create={"drop_path_rate": 0.1},
            prepare=mixed_modes),
    Variant("convnext_atto", "every other stage in train mode", prepare=mixed_modes),
    Variant("levit_128s", "every other stage in train mode", prepare=mixed_modes),
    Variant("efficientvit_m0", "after an eval forward", prepare=warm_forward),
    Variant("efficientformer_l1", "after an eval forward", prepare=warm_forward),
    Variant("efficientformerv2_s0", "after an eval forward", prepare=warm_forward),
    Variant("tiny_vit_5m_224", "after an eval forward", prepare=warm_forward),
    Variant("fastvit_t8", "reparameterized", prepare=reparameterized, prepare_on_cpu=True),
    Variant("mobileone_s0", "reparameterized", prepare=reparameterized, prepare_on_cpu=True),
    Variant("repvgg_a0", "reparameterized", prepare=reparameterized, prepare_on_cpu=True),
    Variant("repvit_m0_9", "reparameterized", prepare=reparameterized, prepare_on_cpu=True),
    Variant("repghostnet_050", "reparameterized", prepare=reparameterized, prepare_on_cpu=True),
    Variant("vit_tiny_patch16_224", "counted under no_grad", grad_mode=torch.no_grad),
    Variant("resnet18", "counted under inference_mode", grad_mode=torch.inference_mode),
    Variant("levit_128s", "counted under inference_mode", grad_mode=torch.inference_mode),
]


def _case(variant: Variant) -> Case:
    import timm

    def build() -> torch.nn.Module:
        model = timm.create_model(variant.name, pretrained=False, **variant.create)
        if variant.checkpointing:
            model.set_grad_checkpointing(True)
        if variant.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model.to(variant.dtype)

    def inputs() -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        size = variant.size or INPUT_SIZES.get(variant.name) or timm.get_pretrained_cfg_value(variant.name, "input_size")
        x = torch.randn(BATCH, *size, dtype=variant.dtype)
        if variant.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return (x,), {}

    return Case(family="timm", name=variant.name, build=build, inputs=inputs, train=variant.train, note=variant.label)


def torch_families(model: torch.nn.Module, args: Tuple[Any, ...]) -> Dict[str, int]:
    """FlopCounterMode's FLOPs of one forward, by family (convolution, matmul), counted live."""
    counter = FlopCounterMode(display=False)
    # with grad on: under no_grad, the ModuleTracker of FlopCounterMode asserts on a parameter
    # expanded in the forward (timm's attention-pool latent: test_vit3, cait, pit, vit_pe_core)
    with zoo.quiet(), sdpa_kernel([SDPBackend.MATH]), counter:
        model(*args)
    families = {"convolution": 0, "matmul": 0}
    for op, flops in counter.get_flop_counts()["Global"].items():
        name = op.__name__.split(".")[0]
        families["convolution" if name in TORCH_CONVOLUTIONS else "matmul"] += int(flops)
    return families


def flopcount_families(result: Any) -> Dict[str, int]:
    """flopcount's ``by_operator("flops")`` summed over the same families."""
    by_operator = result.by_operator("flops")
    return {
        "convolution": sum(v for op, v in by_operator.items() if op in CONVOLUTIONS),
        "matmul": sum(v for op, v in by_operator.items() if op in MATMULS),
    }


def oracle_difference(model: torch.nn.Module, args: Tuple[Any, ...], results: Dict[str, Any]) -> Optional[str]:
    """flopcount's FLOPs against FlopCounterMode's, and predict's against count's (None: equal)."""
    runnable = copy.deepcopy(model) if model.training else model
    theirs = torch_families(runnable, args)
    ours = flopcount_families(results["count"])
    if ours != theirs:
        return f"FlopCounterMode: flopcount {ours} vs torch {theirs}"
    counted = {op: v for op, v in results["count"].by_operator("flops").items() if v}
    predicted = {op: row.flops for op, row in results["predict"].by_operator().items() if row.flops}
    if counted != predicted:
        ops = sorted(op for op in set(counted) | set(predicted) if counted.get(op) != predicted.get(op))
        return f"predict by_operator FLOPs differ from count's: {[(op, counted.get(op), predicted.get(op)) for op in ops[:4]]}"
    return None


def plain_state(model: torch.nn.Module) -> List[Tuple[str, Any]]:
    """Each module's plain attributes that ``zoo.snapshot`` does not see: their names, and the
    keys of those that are dictionaries (LeViT's ``attention_bias_cache``, filled by an
    eval-mode forward)."""
    state = []
    for name, module in model.named_modules():
        attributes = vars(module)
        dictionaries = {key: sorted(map(str, value)) for key, value in attributes.items()
                        if isinstance(value, dict) and not key.startswith("_")}
        state.append((name, (sorted(attributes), dictionaries)))
    return state


def check(variant: Variant, device: Optional[str]) -> Tuple[Optional[str], int]:
    """The first difference for one model on one device (None: none) and the calls reused.
    An exception is the count's (the model cannot be counted); the oracle's is said apart."""
    case = _case(variant)
    built_on = None if variant.prepare_on_cpu else device
    model = zoo._build(case, built_on)
    args, kwargs = zoo._inputs_for(case, device=built_on)
    if variant.prepare is not None:
        variant.prepare(model, args)
    if built_on != device:
        model = model.to(device)
        args, kwargs = zoo._inputs_for(case, device=device)
    before = (zoo.snapshot(model, args), plain_state(model)) if device is None else None
    results: Dict[str, Any] = {}
    with variant.grad_mode() if variant.grad_mode is not None else contextlib.nullcontext():
        difference, reused = compare_model(model, args, kwargs, predict=True, results=results)
    if difference is not None or before is None:
        return difference, reused
    changed = zoo.changes(before[0], zoo.snapshot(model, args))
    if plain_state(model) != before[1]:
        changed.append("plain attributes")
    if changed:
        return f"the count changed the model or inputs: {', '.join(changed)}", reused
    try:
        difference = oracle_difference(model, args, results)
    except Exception as exc:
        return f"oracle (FlopCounterMode run) raised: {zoo.first_line(exc)[:150]}", reused
    return difference, reused


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--match", default=None, help="only models whose name contains this text")
    parser.add_argument("--variants", action="store_true", help="only VARIANTS")
    parser.add_argument("--no-train", action="store_true", help="eval mode only")
    parser.add_argument("--models", nargs="+", default=None, help="these timm models instead of MODELS (eval mode)")
    args = parser.parse_args(argv)
    import timm

    cases = [Variant(name, "") for name in (args.models or MODELS)]
    if not args.no_train and not args.models:
        cases += [Variant(name, "train", train=True) for name in TRAIN]
    if not args.models:
        cases += [variant for variant in VARIANTS if not (args.no_train and variant.train)]
    if args.variants:
        cases = list(VARIANTS)
    if args.match:
        cases = [c for c in cases if args.match in c.name]
    torch.set_num_threads(1)
    tally = Tally(failure="FAILED")  # counted with reuse off too: a model flopcount cannot count
    start, cpu_start = time.perf_counter(), time.process_time()
    for case in cases:
        for device in (None, "meta"):
            where = f"{case.name}{f' ({case.label})' if case.label else ''}{' (meta)' if device else ''}"
            clock = time.perf_counter()
            tally.run(where, device, lambda: check(case, device), width=200)
            print(f"  {where}: {time.perf_counter() - clock:.1f} s", file=sys.stderr, flush=True)
    trained = sum(1 for c in cases if c.train)
    varied = sum(1 for c in cases if c.label and c.label != "train")
    print(f"\n{len(cases)} model cases ({len(cases) - trained} eval, {trained} train; {varied} variants), {tally.same + tally.differ} "
          f"counts compared (real weights and meta copy): {tally.same} identical (and, on real weights, equal to "
          f"FlopCounterMode), {tally.differ} differ, {tally.failed} could not be counted; reuse taken on "
          f"{tally.reused_models} meta copies ({tally.reused_calls} calls); "
          f"timm {timm.__version__}, torch {torch.__version__}; {time.perf_counter() - start:.0f} s wall, "
          f"{time.process_time() - cpu_start:.0f} s CPU", flush=True)
    return 1 if tally.differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
