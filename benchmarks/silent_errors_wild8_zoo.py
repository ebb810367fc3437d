"""Silent wrong numbers on real code, eighth pass (branch wild8), the model zoo: timm, diffusers
and torch_geometric models (``/work/main/.venv-zoo``, torch 2.14), each reading against an oracle
run live.

* ``estimate_memory`` against MemTracker on the real step: eval (the forward under
  ``no_grad``) and train (forward, the default loss, backward; with AdamW where named: its state
  made by a first step), batch 2, channels_last models and inputs, a transposed (non-contiguous)
  input;
* ``count_flops(..., backward=True)`` against FlopCounterMode around a real forward + backward
  (timm's gradient checkpointing, a linear probe on a frozen backbone; ViT with timm's explicit
  attention: FlopCounterMode does not count CPU SDPA; no depthwise convolutions: FlopCounterMode's
  grouped weight gradient ignores ``groups``, docs/performance.md wild3);
* ``optimizer=`` of timm's ``create_optimizer_v2`` (param groups without weight decay for norms
  and biases) against the real step's ops, priced by docs/conventions.md.

Run: ``cd benchmarks && PYTHONPATH=.. /work/main/.venv-zoo/bin/python silent_errors_wild8_zoo.py``
(about 3 min of CPU). Each line ends "ok" or "DIFF"; the last line counts them.
"""

import collections
import contextlib
import copy
import io
import warnings

import torch
from _silent_errors import StepOps, check
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from wild_memory import _NoHook, real_peak

import flopcount

warnings.simplefilter("ignore")
torch.manual_seed(0)
TALLY = collections.Counter()


def line(text, ok):
    TALLY["ok" if ok else "DIFF"] += 1
    print(f"{text} {'ok' if ok else 'DIFF'}", flush=True)


def eval_peak(model, args):
    """MemTracker's peak of the real forward under ``no_grad`` on a copy."""
    model, args = copy.deepcopy(model), copy.deepcopy(args)
    tracker = MemTracker()
    tracker.track_external(model, *[a for a in args if isinstance(a, torch.Tensor)])
    for p in model.parameters():  # MemTracker hooks every parameter, which raises on frozen ones
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
    with tracker, torch.no_grad():
        out = model(*args)
        del out
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return int(peak["Total"])


def memory(name, model, args, train, optimizer=None):
    try:
        truth = real_peak(model, args, optimizer, None) if train else eval_peak(model, args)
    except Exception as e:
        truth = f"ERR {type(e).__name__}: {str(e)[:100]}"
    try:
        from wild_memory import OPTIMIZERS

        got = flopcount.estimate_memory(model, args, backward=train, optimizer=OPTIMIZERS[optimizer] if optimizer else None).peak_bytes
    except Exception as e:
        got = f"ERR {type(e).__name__}: {str(e)[:200]}"
    line(f"{name} {'train' if train else 'eval'}{' + ' + optimizer if optimizer else ''} | MemTracker={truth} | estimate={got}", got == truth)


class Sample(nn.Module):
    """A diffusers model's ``.sample`` output as a tensor."""

    def __init__(s, model, **options):
        super().__init__()
        s.model, s.options = model, options

    def forward(s, *args):
        return s.model(*args, **s.options).sample


def checked(name, model, args, **kwargs):
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        check(name, model, args, **kwargs)
    print(said.getvalue(), end="", flush=True)
    TALLY["DIFF" if "DIFF" in said.getvalue().splitlines()[0] else "ok"] += 1


import timm  # noqa: E402
from timm.optim import create_optimizer_v2  # noqa: E402

print("## estimate_memory against MemTracker")
for arch, size in [("resnet18", 64), ("vit_tiny_patch16_224", 32), ("convnext_atto", 64), ("efficientnet_b0", 64),
                   ("mobilenetv3_small_050", 64)]:
    model = timm.create_model(arch, pretrained=False, num_classes=10, **({"img_size": size} if arch.startswith("vit") else {}))
    x = torch.randn(2, 3, size, size)
    memory(f"timm {arch} b2", model.eval(), (x,), False)
    memory(f"timm {arch} b2", model.train(), (x,), True)
    if not arch.startswith("vit"):
        last = copy.deepcopy(model).to(memory_format=torch.channels_last)
        memory(f"timm {arch} channels_last", last.eval(), (x.to(memory_format=torch.channels_last),), False)
        memory(f"timm {arch} channels_last", last.train(), (x.to(memory_format=torch.channels_last),), True)
    memory(f"timm {arch} transposed input", model.train(), (torch.randn(2, 3, size, size).transpose(2, 3),), True, "adamw")

from diffusers import AutoencoderKL, UNet2DConditionModel, UNet2DModel  # noqa: E402

unet = Sample(UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
                          down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                          norm_num_groups=8))
vae = Sample(AutoencoderKL(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                           up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8, layers_per_block=1),
             sample_posterior=False)
cond = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
                            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                            cross_attention_dim=16, norm_num_groups=8, attention_head_dim=8)


class Conditioned(nn.Module):
    def __init__(s, model):
        super().__init__()
        s.model = model

    def forward(s, x, t, context):
        return s.model(x, t, encoder_hidden_states=context).sample


for name, model, args in [
    ("diffusers UNet2DModel", unet, (torch.randn(2, 3, 16, 16), torch.tensor([10, 20]))),
    ("diffusers AutoencoderKL", vae, (torch.randn(2, 3, 32, 32),)),
    ("diffusers UNet2DConditionModel", Conditioned(cond), (torch.randn(2, 4, 8, 8), torch.tensor([1, 2]), torch.randn(2, 5, 16))),
]:
    memory(name, model.eval(), args, False)
    memory(name, model.train(), args, True)

from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE  # noqa: E402

nodes, edges = torch.randn(30, 16), torch.randint(0, 30, (2, 80))
for kind in (GCN, GAT, GraphSAGE, GIN):
    model = kind(16, 32, 2, out_channels=4)
    memory(f"torch_geometric {kind.__name__}", model.eval(), (nodes, edges), False)
    memory(f"torch_geometric {kind.__name__}", model.train(), (nodes, edges), True)

print("\n## backward=True against FlopCounterMode live (2 x MACs)")
resnet = timm.create_model("resnet18", pretrained=False, num_classes=10)
checked("timm resnet18", resnet.eval(), (torch.randn(2, 3, 32, 32),), backward=True, tracers=("auto", "dispatch"))
resnet.set_grad_checkpointing(True)
checked("timm resnet18, set_grad_checkpointing", resnet.train(), (torch.randn(2, 3, 32, 32),), backward=True, tracers=("auto", "dispatch"))
resnet.set_grad_checkpointing(False)
resnet.requires_grad_(False)
resnet.get_classifier().requires_grad_(True)
checked("timm resnet18, linear probe (frozen backbone)", resnet.eval(), (torch.randn(2, 3, 32, 32),), backward=True, tracers=("auto", "dispatch"))
timm.layers.set_fused_attn(False)  # timm's explicit q @ k^T and attn @ v: FlopCounterMode counts them
vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32)
checked("timm vit_tiny (explicit attention)", vit.eval(), (torch.randn(2, 3, 32, 32),), backward=True, tracers=("auto", "dispatch"))
vit.set_grad_checkpointing(True)
checked("timm vit_tiny, set_grad_checkpointing", vit.train(), (torch.randn(2, 3, 32, 32),), backward=True, tracers=("auto", "dispatch"))

print("\n## timm's optimizers against the real step's ops (conventions' prices)")


model, x = timm.create_model("resnet18", pretrained=False, num_classes=10), torch.randn(2, 3, 32, 32)
for name in ("adamw", "lion", "sgd", "adan"):
    real = copy.deepcopy(model)
    opt = create_optimizer_v2(real, name, lr=1e-3, weight_decay=0.05)
    for first in (True, False):
        opt.zero_grad()
        real(x).sum().backward()
        if first:
            opt.step()
    with StepOps() as ops:
        opt.step()
    try:
        ours = flopcount.count_flops(model, (x,), backward=True, optimizer=create_optimizer_v2(model, name, lr=1e-3, weight_decay=0.05))
        got = ours.by_phase()["optimizer"]
    except Exception as e:
        got = f"ERR {type(e).__name__}: {str(e)[:150]}"
    line(f"timm create_optimizer_v2({name!r}) ({type(opt).__name__}, groups without weight decay) | real step={ops.flops}"
         f"{' unpriced ' + str(sorted(ops.unpriced)) if ops.unpriced else ''} | count={got}", got == ops.flops and not ops.unpriced)

print(f"\n{TALLY['ok'] + TALLY['DIFF']} lines: {TALLY['ok']} ok, {TALLY['DIFF']} DIFF")
