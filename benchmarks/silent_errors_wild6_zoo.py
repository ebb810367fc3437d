"""The sixth silent-error sweep's model zoo (branch wild6): torchvision, timm and diffusers models
built from code (random weights, no downloads), counted by flopcount and compared with
``torch.utils.flop_counter.FlopCounterMode`` run live on the real forward. FlopCounterMode counts
``scaled_dot_product_attention`` on CPU as 0 (it only has formulas for the CUDA kernels), so every
attention model's oracle is FlopCounterMode's figure plus a hand count of its SDPA calls,
2 x L x S x (E + Ev) FLOPs each (the model's own head layout; named per model below).

Run with the zoo environment (torchvision, timm, diffusers):
``PYTHONPATH=. /work/main/.venv-zoo/bin/python benchmarks/silent_errors_wild6_zoo.py`` (about 2 min of CPU).
"""

import warnings

import timm
import torch
import torchvision.models as tvm
from _silent_errors import check, fcm
from diffusers import AutoencoderKL, UNet2DConditionModel, UNet2DModel
from torch import nn

warnings.simplefilter("ignore")
torch.manual_seed(0)


def attention(queries, keys, width, calls=1):
    """FLOPs of ``calls`` SDPA calls of ``queries`` x ``keys`` over ``width`` = heads x head dim."""
    return calls * 2 * 2 * queries * keys * width


def zoo(name, model, args, sdpa=0, tracers=("auto", "jit")):
    model = model.eval()
    torch_flops, _ = fcm(model, args)
    check(name + (f" (+ SDPA {sdpa})" if sdpa else ""), model, args, tracers=tracers, expect=torch_flops + sdpa)


x64 = torch.randn(1, 3, 64, 64)
x224 = torch.randn(1, 3, 224, 224)
zoo("tv resnet18", tvm.resnet18(), (x64,))
zoo("tv mobilenet_v3_small", tvm.mobilenet_v3_small(), (x64,))
zoo("tv efficientnet_b0", tvm.efficientnet_b0(), (x64,))
zoo("tv shufflenet_v2_x0_5", tvm.shufflenet_v2_x0_5(), (x64,))
zoo("tv regnet_y_400mf", tvm.regnet_y_400mf(), (x64,))
zoo("tv squeezenet1_1", tvm.squeezenet1_1(), (x64,))
zoo("tv swin_t (window attention: matmuls)", tvm.swin_t(), (x64,))
# 32 / 16 = 2 x 2 patches + class token = 5 tokens, width 64, 2 layers
zoo("tv VisionTransformer(32, 16, 2 layers, 4 heads, 64)", tvm.VisionTransformer(32, 16, 2, 4, 64, 128), (torch.randn(1, 3, 32, 32),),
    sdpa=attention(5, 5, 64, 2))
zoo("timm convnext_atto", timm.create_model("convnext_atto"), (x64,))
# 64 / 16 = 4 x 4 patches + class token = 17 tokens, width 192, 12 layers
zoo("timm deit_tiny img 64", timm.create_model("deit_tiny_patch16_224", img_size=64), (x64,), sdpa=attention(17, 17, 192, 12))
zoo("timm efficientformerv2_s0", timm.create_model("efficientformerv2_s0"), (x224,))
zoo("timm mobilevitv2_050", timm.create_model("mobilevitv2_050"), (x64,))
zoo("timm levit_128s", timm.create_model("levit_128s"), (x224,))
zoo("timm poolformer_s12", timm.create_model("poolformer_s12"), (x64,))
zoo("timm mixer_s16_224", timm.create_model("mixer_s16_224"), (x224,))
# XCA is channel attention (matmuls); the 2 class-attention layers: 1 query over 17 tokens, width 128
zoo("timm xcit_nano_12 img 64", timm.create_model("xcit_nano_12_p16_224", img_size=64), (x64,), sdpa=attention(1, 17, 128, 2))
# 240 / 12 = 20 x 20 + 1 = 401 tokens at width 96 (1 block per stage), 224 / 16 = 14 x 14 + 1 = 197 at
# width 192 (4 blocks per stage), 3 stages; the cross-attention is matmuls
zoo("timm crossvit_tiny_240", timm.create_model("crossvit_tiny_240"), (torch.randn(1, 3, 240, 240),),
    sdpa=attention(401, 401, 96, 3) + attention(197, 197, 192, 12))
# 56 / 14 = 4 x 4 + 1 = 17 tokens, width 192, 12 layers
zoo("timm eva02_tiny img 56", timm.create_model("eva02_tiny_patch14_224", img_size=56), (torch.randn(1, 3, 56, 56),),
    sdpa=attention(17, 17, 192, 12))


class Sample(nn.Module):
    def __init__(s, m):
        super().__init__()
        s.m = m

    def forward(s, *a):
        return s.m(*a, return_dict=False)[0]


DIFF = ("auto", "dispatch")
# AttnDownBlock2D (64 ch at 8 x 8), the mid block, AttnUpBlock2D's 2 layers: 4 self-attentions over 64 tokens
unet = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
                   down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                   norm_num_groups=8, attention_head_dim=8)
zoo("diffusers UNet2DModel", Sample(unet), (torch.randn(1, 3, 16, 16), torch.tensor([10])), sdpa=attention(64, 64, 64, 4), tracers=DIFF)
# CrossAttnDownBlock2D (32 ch, 16 x 16 = 256 tokens, 1 layer), mid (64 ch, 64 tokens), CrossAttnUpBlock2D (32 ch, 2 layers):
# each a self-attention and a cross-attention over the 7 text tokens
cond = UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
                            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                            cross_attention_dim=32, norm_num_groups=8, attention_head_dim=8)
zoo("diffusers UNet2DConditionModel", Sample(cond), (torch.randn(1, 4, 16, 16), torch.tensor([10]), torch.randn(1, 7, 32)),
    sdpa=3 * (attention(256, 256, 32) + attention(256, 7, 32)) + attention(64, 64, 64) + attention(64, 7, 64), tracers=DIFF)
# the encoder's and the decoder's mid-block attention, 64 ch at 8 x 8
vae = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                    up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8, sample_size=16)
zoo("diffusers AutoencoderKL", Sample(vae), (torch.randn(1, 3, 16, 16),), sdpa=attention(64, 64, 64, 2), tracers=DIFF)
