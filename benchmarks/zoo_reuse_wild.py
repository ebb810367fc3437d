"""Structural reuse and the count itself on models built to break them (issue #32, #27 item 1):
diffusers and torch_geometric, small configs built in code (nothing downloaded).

For each model (batch 2 where it has one; eval mode, and a train-mode subset):

* reuse off vs on (``FLOPCOUNT_REUSE=0/1``), real weights and a copy built on the meta device
  where the model allows, comparing everything a user can read and predict(on="T4") on vs off
  (``zoo_reuse.compare_model``, the zoo's comparison);
* the model and its inputs left as found by the counts (``zoo.snapshot``, plus the edge caches
  torch_geometric's ``GCNConv(cached=True)`` writes on a plain attribute);
* an independent oracle: ``torch.utils.flop_counter.FlopCounterMode`` run live on a copy of
  the model with the same inputs (SDPA on the math backend, so torch counts it:
  docs/conventions.md, "Differences to torch.utils.flop_counter"), against the FLOPs of
  count_flops' contraction operators (those with MACs), convolutions and matmuls apart;
* ``predict(...).by_operator()`` FLOPs equal ``count_flops(...).by_operator("flops")`` (#27 item 1);
* the count on fake tensors (``tracer="auto"``) equal to a real run's (``tracer="dispatch"``)
  per operator (flops, macs): a data-dependent op given a wrong shape on fakes shows here.

Prints one line per model that differs or fails and a summary; exit status 1 on any difference.

    PYTHONPATH=. .venv-zoo/bin/python benchmarks/zoo_reuse_wild.py [--only diffusers|pyg] [--match NAME]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import zoo  # noqa: E402
import zoo_reuse  # noqa: E402
from zoo_nn import Case, Inputs  # noqa: E402

import flopcount  # noqa: E402

PARTS = ("diffusers", "pyg")
# plain attributes a module writes on its first call (GCNConv(cached=True)); not in the state_dict
CACHE_ATTRIBUTES = ("_cached_edge_index", "_cached_adj_t")
# where diffusers keeps a module's hooks (``enable_cache``, layerwise casting, offloading)
HOOK_REGISTRY = "_diffusers_hook"
# contractions flopcount counts that FlopCounterMode does not see as one (docs/conventions.md,
# "Differences to torch.utils.flop_counter"): an outer product runs as an elementwise ``mul``
# there, ``mv``/``dot``, ``cdist`` (whose matmul form runs inside its CPU kernel) and ``lstm``
# (one fused CPU kernel; GRU and RNN run as matmuls torch counts) have no formula
NOT_COUNTED_BY_TORCH = frozenset({
    "aten::outer", "aten::ger", "aten::addr", "aten::mv", "aten::addmv", "aten::dot", "aten::vdot", "aten::cdist",
    "aten::lstm",
})
REAL_RUN = "counted one real run"


# --------------------------------------------------------------------------- diffusers


def _unet2d() -> nn.Module:
    from diffusers import UNet2DModel

    return UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=2, block_out_channels=(32, 64),
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                       norm_num_groups=8, attention_head_dim=8)


def _unet2d_inputs() -> Inputs:
    return (torch.randn(2, 3, 16, 16), torch.tensor([10, 500])), {}


def _unet2d_condition() -> nn.Module:
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=2,
                                block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                attention_head_dim=8, norm_num_groups=8)


def _unet2d_condition_inputs() -> Inputs:
    return (torch.randn(2, 4, 16, 16), torch.tensor([10, 500])), {"encoder_hidden_states": torch.randn(2, 7, 32)}


def _vae() -> nn.Module:
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 64), layers_per_block=2,
                         latent_channels=4, norm_num_groups=8, sample_size=32)


class VaeEncode(nn.Module):
    """AutoencoderKL.encode, the posterior's mode: what a pipeline runs on an image."""

    def __init__(self) -> None:
        super().__init__()
        self.vae = _vae()

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.vae.encode(image).latent_dist.mode()


class VaeDecode(nn.Module):
    """AutoencoderKL.decode: latents to an image."""

    def __init__(self) -> None:
        super().__init__()
        self.vae = _vae()

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latents).sample


class VaeDecodeSliced(VaeDecode):
    """AutoencoderKL.decode one latent at a time (``enable_slicing``): the decoder called per sample."""

    def __init__(self) -> None:
        super().__init__()
        self.vae.enable_slicing()


class VaeDecodeTiled(VaeDecode):
    """AutoencoderKL.decode in overlapping tiles (``enable_tiling``, 8x8 latent tiles at 6 apart
    on 16x16 latents): nine decoder calls on tiles of 8 and of 4 latents a side."""

    def __init__(self) -> None:
        super().__init__()
        self.vae.enable_tiling()
        self.vae.tile_latent_min_size = 8
        self.vae.tile_sample_min_size = 16


def _unet2d_condition_checkpointed() -> nn.Module:
    model = _unet2d_condition()
    model.enable_gradient_checkpointing()
    return model


def _dit() -> nn.Module:
    from diffusers import DiTTransformer2DModel

    return DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
                                 num_layers=4, sample_size=8, patch_size=2, num_embeds_ada_norm=1000)


def _dit_inputs() -> Inputs:
    return (torch.randn(2, 4, 8, 8),), {"timestep": torch.tensor([10, 500]), "class_labels": torch.tensor([1, 7])}


def _transformer2d_dit() -> nn.Module:
    from diffusers import Transformer2DModel

    return Transformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
                              num_layers=4, sample_size=8, patch_size=2, norm_type="ada_norm_zero",
                              num_embeds_ada_norm=1000)


def _pixart() -> nn.Module:
    from diffusers import PixArtTransformer2DModel

    return PixArtTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
                                    num_layers=4, sample_size=8, patch_size=2, cross_attention_dim=16,
                                    caption_channels=12, norm_type="ada_norm_single", num_embeds_ada_norm=1000)


def _pixart_inputs() -> Inputs:
    kwargs = {"encoder_hidden_states": torch.randn(2, 5, 12), "timestep": torch.tensor([10, 500]),
              "added_cond_kwargs": {"resolution": None, "aspect_ratio": None}}
    return (torch.randn(2, 4, 8, 8),), kwargs


def _sd3() -> nn.Module:
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=4, attention_head_dim=8,
                                 num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
                                 pooled_projection_dim=8, out_channels=4, pos_embed_max_size=16)


def _sd3_inputs() -> Inputs:
    kwargs = {"encoder_hidden_states": torch.randn(2, 5, 16), "pooled_projections": torch.randn(2, 8),
              "timestep": torch.tensor([10, 500])}
    return (torch.randn(2, 4, 8, 8),), kwargs


def _flux() -> nn.Module:
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=3, num_single_layers=4, attention_head_dim=8,
                                  num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8,
                                  axes_dims_rope=(2, 2, 4))


def _flux_inputs() -> Inputs:
    kwargs = {"encoder_hidden_states": torch.randn(2, 5, 16), "pooled_projections": torch.randn(2, 8),
              "timestep": torch.tensor([0.1, 0.5]), "img_ids": torch.rand(16, 3) * 4, "txt_ids": torch.zeros(5, 3)}
    return (torch.randn(2, 16, 16),), kwargs


def _unet3d() -> nn.Module:
    from diffusers import UNet3DConditionModel

    return UNet3DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=2,
                                block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
                                up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"), cross_attention_dim=32,
                                attention_head_dim=8, norm_num_groups=8)


def _unet3d_inputs() -> Inputs:
    return (torch.randn(2, 4, 3, 16, 16), torch.tensor([10, 500])), {"encoder_hidden_states": torch.randn(2, 7, 32)}


def _unet2d_condition_masked_inputs() -> Inputs:
    """A padding mask on the text tokens (the last two of the second sample): a bias for cross-attention."""
    args, kwargs = _unet2d_condition_inputs()
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    kwargs["encoder_attention_mask"] = mask
    return args, kwargs


def _controlnet() -> nn.Module:
    from diffusers import ControlNetModel

    return ControlNetModel(in_channels=4, block_out_channels=(32, 64), layers_per_block=2,
                           down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), cross_attention_dim=32,
                           attention_head_dim=8, norm_num_groups=8, conditioning_embedding_out_channels=(16, 32))


def _controlnet_inputs() -> Inputs:
    kwargs = {"encoder_hidden_states": torch.randn(2, 7, 32), "controlnet_cond": torch.randn(2, 3, 32, 32)}
    return (torch.randn(2, 4, 16, 16), torch.tensor([10, 500])), kwargs


def _unet_sdxl() -> nn.Module:
    """SDXL's conditioning: text-time additional embeddings, two transformer layers per block."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=2,
                                block_out_channels=(32, 64), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                attention_head_dim=8, norm_num_groups=8, transformer_layers_per_block=2,
                                addition_embed_type="text_time", addition_time_embed_dim=8,
                                projection_class_embeddings_input_dim=32 + 6 * 8)


def _unet_sdxl_inputs() -> Inputs:
    kwargs = {"encoder_hidden_states": torch.randn(2, 7, 32), "cross_attention_kwargs": {"scale": 0.5},
              "added_cond_kwargs": {"text_embeds": torch.randn(2, 32), "time_ids": torch.randn(2, 6)}}
    return (torch.randn(2, 4, 16, 16), torch.tensor([10, 500])), kwargs


class ControlledUNet(nn.Module):
    """One denoising step of a ControlNet pipeline: the ControlNet's residuals into the UNet."""

    def __init__(self) -> None:
        super().__init__()
        self.controlnet = _controlnet()
        self.unet = _unet2d_condition()

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor,
                controlnet_cond: torch.Tensor) -> torch.Tensor:
        down, mid = self.controlnet(sample, timestep, encoder_hidden_states=encoder_hidden_states,
                                    controlnet_cond=controlnet_cond, conditioning_scale=0.8, return_dict=False)
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states,
                         down_block_additional_residuals=down, mid_block_additional_residual=mid).sample


def _controlled_inputs() -> Inputs:
    args = (torch.randn(2, 4, 16, 16), torch.tensor([10, 500]), torch.randn(2, 7, 32), torch.randn(2, 3, 32, 32))
    return args, {}


def _flux_guided() -> nn.Module:
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=3, attention_head_dim=8,
                                  num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8,
                                  axes_dims_rope=(2, 2, 4), guidance_embeds=True)


def _flux_guided_inputs() -> Inputs:
    args, kwargs = _flux_inputs()
    kwargs["guidance"] = torch.tensor([3.5, 3.5])
    return args, kwargs


def _cached(build: Callable[[], nn.Module], inputs: Callable[[], Inputs]) -> Callable[[], nn.Module]:
    """The model with diffusers' PyramidAttentionBroadcast (``enable_cache``: every other call of
    a self-attention returns the output of the call before), after one denoising step: the hooks
    hold a call counter and cached outputs, which the next forward's work depends on."""

    def made() -> nn.Module:
        from diffusers import PyramidAttentionBroadcastConfig

        model = build()
        config = PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2,
                                                 spatial_attention_timestep_skip_range=(100, 800),
                                                 current_timestep_callback=lambda: 500)
        model.enable_cache(config)
        args, kwargs = inputs()
        with torch.no_grad():
            model(*args, **kwargs)
        return model

    return made


def _cogvideox() -> nn.Module:
    from diffusers import CogVideoXTransformer3DModel

    return CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
                                       time_embed_dim=16, text_embed_dim=16, num_layers=3, sample_width=8,
                                       sample_height=8, sample_frames=5, patch_size=2, temporal_compression_ratio=4,
                                       max_text_seq_length=5)


def _cogvideox_inputs() -> Inputs:
    kwargs = {"encoder_hidden_states": torch.randn(2, 5, 16), "timestep": torch.tensor([10, 500])}
    return (torch.randn(2, 2, 4, 8, 8),), kwargs


def diffusers_cases() -> List[Case]:
    def case(name: str, build: Callable[[], nn.Module], inputs: Callable[[], Inputs], train: bool = False) -> Case:
        return Case(family="diffusers", name=name + (" (train)" if train else ""), build=build, inputs=inputs, train=train)

    return [
        case("UNet2DModel", _unet2d, _unet2d_inputs),
        case("UNet2DModel", _unet2d, _unet2d_inputs, train=True),
        case("UNet2DConditionModel", _unet2d_condition, _unet2d_condition_inputs),
        case("UNet2DConditionModel", _unet2d_condition, _unet2d_condition_inputs, train=True),
        case("AutoencoderKL.encode", VaeEncode, lambda: ((torch.randn(2, 3, 32, 32),), {})),
        case("AutoencoderKL.decode", VaeDecode, lambda: ((torch.randn(2, 4, 16, 16),), {})),
        case("AutoencoderKL.decode, slicing", VaeDecodeSliced, lambda: ((torch.randn(2, 4, 16, 16),), {})),
        case("AutoencoderKL.decode, tiling", VaeDecodeTiled, lambda: ((torch.randn(2, 4, 16, 16),), {})),
        case("UNet2DConditionModel, encoder_attention_mask", _unet2d_condition, _unet2d_condition_masked_inputs),
        case("UNet2DConditionModel, gradient checkpointing", _unet2d_condition_checkpointed,
             _unet2d_condition_inputs, train=True),
        case("DiTTransformer2DModel", _dit, _dit_inputs),
        case("Transformer2DModel (DiT)", _transformer2d_dit, _dit_inputs),
        case("PixArtTransformer2DModel", _pixart, _pixart_inputs),
        case("SD3Transformer2DModel", _sd3, _sd3_inputs),
        case("SD3Transformer2DModel", _sd3, _sd3_inputs, train=True),
        case("FluxTransformer2DModel", _flux, _flux_inputs),
        case("UNet3DConditionModel", _unet3d, _unet3d_inputs),
        case("ControlNetModel", _controlnet, _controlnet_inputs),
        case("UNet2DConditionModel SDXL (text_time, 2 layers/block, cross_attention_kwargs)", _unet_sdxl,
             _unet_sdxl_inputs),
        case("ControlNet + UNet2DConditionModel (residuals)", ControlledUNet, _controlled_inputs),
        case("FluxTransformer2DModel (guidance)", _flux_guided, _flux_guided_inputs),
        case("CogVideoXTransformer3DModel", _cogvideox, _cogvideox_inputs),
        case("CogVideoXTransformer3DModel, enable_cache (PAB), one step taken", _cached(_cogvideox, _cogvideox_inputs),
             _cogvideox_inputs),
        case("FluxTransformer2DModel, enable_cache (PAB), one step taken", _cached(_flux, _flux_inputs), _flux_inputs),
    ]


# --------------------------------------------------------------------------- torch_geometric

NODES, FEATURES, HIDDEN, CLASSES = 40, 16, 32, 8


def _graph() -> Tuple[torch.Tensor, torch.Tensor]:
    """Node features and a random directed edge list (with self loops and repeated edges)."""
    x = torch.randn(NODES, FEATURES)
    edge_index = torch.randint(0, NODES, (2, 160))
    return x, edge_index


def _graph_inputs() -> Inputs:
    x, edge_index = _graph()
    return (x, edge_index), {}


def _two_graphs() -> Inputs:
    """A batch of two graphs (nodes 0..24 and 25..39), ``batch`` naming each node's graph."""
    x = torch.randn(NODES, FEATURES)
    first = torch.randint(0, 25, (2, 90))
    second = torch.randint(25, NODES, (2, 60))
    batch = torch.cat([torch.zeros(25, dtype=torch.long), torch.ones(NODES - 25, dtype=torch.long)])
    return (x, torch.cat([first, second], dim=1), batch), {}


class PooledGNN(nn.Module):
    """A basic GNN then a global mean pool over ``batch``: the pool's output size is
    ``batch.max() + 1``, a value of the input (two graphs)."""

    def __init__(self, gnn: nn.Module):
        super().__init__()
        self.gnn = gnn
        self.head = nn.Linear(CLASSES, 3)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        from torch_geometric.nn import global_mean_pool

        return self.head(global_mean_pool(self.gnn(x, edge_index), batch))


class PointNet(nn.Module):
    """DynamicEdgeConv (the k nearest neighbours in feature space, recomputed per layer)."""

    def __init__(self) -> None:
        super().__init__()
        from torch_geometric.nn import MLP, DynamicEdgeConv

        self.conv1 = DynamicEdgeConv(MLP([2 * FEATURES, HIDDEN, HIDDEN]), k=4)
        self.conv2 = DynamicEdgeConv(MLP([2 * HIDDEN, HIDDEN, HIDDEN]), k=4)

    def forward(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, batch), batch)


class KnnEdgeConv(nn.Module):
    """DynamicEdgeConv's pattern without pyg-lib: EdgeConv layers on the k nearest neighbours
    in feature space (``topk`` of a ``cdist``, other graphs pushed away), recomputed per layer:
    the edges are values of the features, their number k·N a shape."""

    def __init__(self, layers: int = 3, k: int = 4) -> None:
        super().__init__()
        from torch_geometric.nn import MLP, EdgeConv

        self.k = k
        widths = [FEATURES] + [HIDDEN] * layers
        self.convs = nn.ModuleList([EdgeConv(MLP([2 * widths[i], HIDDEN, HIDDEN])) for i in range(layers)])

    def knn(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        distance = torch.cdist(x, x) + 1e6 * (batch[:, None] != batch[None, :])
        nearest = distance.topk(self.k, dim=1, largest=False).indices
        target = torch.arange(x.shape[0], device=x.device).repeat_interleave(self.k)
        return torch.stack([nearest.reshape(-1), target])

    def forward(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = conv(x, self.knn(x, batch))
        return x


class RadiusGraph(nn.Module):
    """SchNet's interaction graph without pyg-lib: the pairs of atoms of one molecule closer
    than the cutoff (``nonzero``: how many is data), with their distances."""

    def __init__(self, cutoff: float) -> None:
        super().__init__()
        self.cutoff = cutoff

    def forward(self, pos: torch.Tensor, batch: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        distance = torch.cdist(pos, pos)
        near = (distance < self.cutoff) & (batch[:, None] == batch[None, :])
        near.fill_diagonal_(False)
        edge_index = near.nonzero().t()
        return edge_index, distance[edge_index[0], edge_index[1]]


def _basic(kind: str, layers: int = 4, **options: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from torch_geometric.nn import models

        cls = getattr(models, kind)
        return cls(in_channels=FEATURES, hidden_channels=HIDDEN, num_layers=layers, out_channels=CLASSES, **options)

    return build


def _warm_cached_gcn() -> nn.Module:
    """GCN(cached=True) already run once on another graph (300 edges): its layers hold that
    graph's normalised edges, which every later call uses (the count's graph is not read)."""
    model = _basic("GCN", cached=True, add_self_loops=False)()
    other = torch.randint(0, NODES, (2, 300))
    with torch.no_grad():
        model(torch.randn(NODES, FEATURES), other)
    return model


def _hooked_gin() -> nn.Module:
    """GIN whose third layer has a message hook that doubles the messages (one more op): the
    four layers have one structure, but layer 2 must not be booked from layer 1."""
    model = _basic("GIN")()
    model.convs[2].register_message_forward_hook(lambda conv, inputs, out: out * 2)
    return model


class BatchGIN(nn.Module):
    """GIN over a torch_geometric ``Batch`` of two graphs (one object argument), then a mean
    pool per graph (``size=data.num_graphs``, a Python int of the batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.gnn = _basic("GIN")()
        self.head = nn.Linear(CLASSES, 3)

    def forward(self, data: Any) -> torch.Tensor:
        from torch_geometric.nn import global_mean_pool

        hidden = self.gnn(data.x, data.edge_index)
        return self.head(global_mean_pool(hidden, data.batch, size=data.num_graphs))


def _batch_inputs() -> Inputs:
    from torch_geometric.data import Batch, Data

    x, edge_index, batch = _two_graphs()[0]
    first, second = edge_index[:, :90], edge_index[:, 90:] - 25
    graphs = [Data(x=x[:25], edge_index=first), Data(x=x[25:], edge_index=second)]
    return (Batch.from_data_list(graphs),), {}


class ConvStack(nn.Module):
    """``layers`` copies of one message-passing layer on a graph, a ReLU between them."""

    def __init__(self, make: Callable[[], nn.Module], layers: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(FEATURES, HIDDEN)
        self.convs = nn.ModuleList([make() for _ in range(layers)])

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return x


def _transformer_convs() -> nn.Module:
    from torch_geometric.nn import TransformerConv

    return ConvStack(lambda: TransformerConv(HIDDEN, HIDDEN // 2, heads=2))


def _gated_graph_conv() -> nn.Module:
    """GatedGraphConv: one GRUCell called once per step (3 steps) under one name, in each of two layers."""
    from torch_geometric.nn import GatedGraphConv

    return ConvStack(lambda: GatedGraphConv(HIDDEN, num_layers=3), layers=2)


def _res_gated() -> nn.Module:
    from torch_geometric.nn import ResGatedGraphConv

    return ConvStack(lambda: ResGatedGraphConv(HIDDEN, HIDDEN))


class HeteroSAGE(nn.Module):
    """Three HeteroConv layers of SAGEConv over two node and three edge types (dict inputs
    keyed by strings and by tuples of strings)."""

    def __init__(self, layers: int = 3) -> None:
        super().__init__()
        from torch_geometric.nn import HeteroConv, SAGEConv

        types = (("paper", "cites", "paper"), ("author", "writes", "paper"), ("paper", "rev_writes", "author"))
        self.convs = nn.ModuleList([HeteroConv({t: SAGEConv((-1, -1) if i == 0 else HIDDEN, HIDDEN) for t in types})
                                    for i in range(layers)])

    def forward(self, x_dict: Dict[str, torch.Tensor], edge_index_dict: Dict[Any, torch.Tensor]) -> Dict[str, torch.Tensor]:
        for conv in self.convs:
            x_dict = {key: x.relu() for key, x in conv(x_dict, edge_index_dict).items()}
        return x_dict


def _hetero_inputs() -> Inputs:
    x_dict = {"paper": torch.randn(30, FEATURES), "author": torch.randn(12, 8)}
    edge_index_dict = {
        ("paper", "cites", "paper"): torch.randint(0, 30, (2, 80)),
        ("author", "writes", "paper"): torch.stack([torch.randint(0, 12, (40,)), torch.randint(0, 30, (40,))]),
        ("paper", "rev_writes", "author"): torch.stack([torch.randint(0, 30, (40,)), torch.randint(0, 12, (40,))]),
    }
    return (x_dict, edge_index_dict), {}


def _hetero_sage() -> nn.Module:
    """HeteroSAGE with its lazy input sizes made by one run (a lazy model is counted on a real run)."""
    model = HeteroSAGE()
    with torch.no_grad():
        model(*_hetero_inputs()[0])
    return model


def _points() -> Inputs:
    x, _, batch = _two_graphs()[0]
    return (x, batch), {}


def _schnet() -> nn.Module:
    from torch_geometric.nn.models import SchNet

    return SchNet(hidden_channels=32, num_filters=32, num_interactions=3, num_gaussians=16, cutoff=5.0,
                  interaction_graph=RadiusGraph(5.0))


def _molecules() -> Inputs:
    z = torch.randint(1, 10, (12,))
    pos = torch.randn(12, 3) * 2
    batch = torch.tensor([0] * 7 + [1] * 5)
    return (z, pos, batch), {}


def _dimenet() -> nn.Module:
    from torch_geometric.nn.models import DimeNet

    return DimeNet(hidden_channels=16, out_channels=1, num_blocks=2, num_bilinear=4, num_spherical=3, num_radial=4,
                   cutoff=5.0)


def pyg_cases() -> List[Case]:
    def case(name: str, build: Callable[[], nn.Module], inputs: Callable[[], Inputs] = _graph_inputs,
             train: bool = False) -> Case:
        return Case(family="pyg", name=name + (" (train)" if train else ""), build=build, inputs=inputs, train=train)

    return [
        case("GCN x4", _basic("GCN")),
        case("GCN x4", _basic("GCN"), train=True),
        case("GCN x4 cached", _basic("GCN", cached=True)),
        case("GCN x6 no self loops", _basic("GCN", layers=6, add_self_loops=False, normalize=True)),
        case("GCN x4 cached, no self loops", _basic("GCN", cached=True, add_self_loops=False)),
        case("GCN x4 cached, no self loops, warm", _warm_cached_gcn),
        case("GIN x4, message hook on layer 2", _hooked_gin),
        case("GIN x4 + pool on a Batch object", BatchGIN, _batch_inputs),
        case("GAT x4 no self loops", _basic("GAT", heads=2, add_self_loops=False)),
        case("GIN x4 batch_norm", _basic("GIN", norm="batch_norm"), train=True),
        case("TransformerConv x4", _transformer_convs),
        case("GatedGraphConv x2 (GRUCell x3)", _gated_graph_conv),
        case("ResGatedGraphConv x4", _res_gated),
        case("GraphSAGE x4 jk=lstm", _basic("GraphSAGE", jk="lstm")),
        case("GCN x4 no self loops, decomposed_layers=2", _basic("GCN", add_self_loops=False, decomposed_layers=2)),
        case("HeteroConv(SAGEConv) x3", _hetero_sage, _hetero_inputs),
        case("GAT x4", _basic("GAT", heads=2)),
        case("GAT x4", _basic("GAT", heads=2, dropout=0.5), train=True),
        case("GATv2 x3", _basic("GAT", layers=3, v2=True, heads=2)),
        case("GraphSAGE x4", _basic("GraphSAGE")),
        case("GraphSAGE x4 max", _basic("GraphSAGE", aggr="max")),
        case("GIN x4", _basic("GIN")),
        case("GIN x4", _basic("GIN"), train=True),
        case("EdgeCNN x3", _basic("EdgeCNN", layers=3)),
        case("PNA x3", _basic("PNA", layers=3, aggregators=["mean", "max", "std"], scalers=["identity", "amplification"],
                              deg=torch.tensor([0, 4, 8, 6, 2]))),
        case("GCN x4 + global_mean_pool", lambda: PooledGNN(_basic("GCN")()), _two_graphs),
        case("DynamicEdgeConv x2", PointNet, _points),
        case("EdgeConv x3 on knn (topk)", KnnEdgeConv, _points),
        case("SchNet", _schnet, _molecules),
        case("DimeNet", _dimenet, _molecules),
    ]


# --------------------------------------------------------------------------- checks


def left_as_found(model: nn.Module, inputs: Any) -> Dict[str, Any]:
    """``zoo.snapshot``, the tensors of a torch_geometric ``Data``/``Batch`` argument, and the
    edge caches a ``cached=True`` layer keeps on a plain attribute."""
    state = zoo.snapshot(model, inputs)
    args, _ = inputs
    graphs = [arg.to_dict() for arg in args if callable(getattr(arg, "to_dict", None))]
    state["graph objects"] = [zoo._digest(t) for t in zoo._tensors(graphs)]
    caches = []
    for name, module in model.named_modules():
        for attribute in CACHE_ATTRIBUTES:
            if hasattr(module, attribute):
                caches.append((name, attribute, repr(getattr(module, attribute))[:200]))
    state["attribute caches"] = caches
    hooks = []
    for name, module in model.named_modules():
        registry = getattr(module, HOOK_REGISTRY, None)
        for hook_name, hook in getattr(registry, "hooks", {}).items():
            held = vars(getattr(hook, "state", None) or hook)
            hooks.append((name, hook_name, [(k, _described(v)) for k, v in held.items()]))
    state["library hook state"] = hooks
    return state


def _described(value: Any) -> Any:
    """A hook state's value as a comparable digest (its tensors' bytes, not the objects)."""
    tensors = list(zoo._tensors(value))
    if tensors:  # a fake tensor left there by a count has no bytes: named by its class
        return [zoo._digest(t) if type(t) in (torch.Tensor, nn.Parameter) else type(t).__name__ for t in tensors]
    return repr(value)[:200]


def _contraction_flops(by_macs: Dict[str, int]) -> Dict[str, int]:
    """count_flops' contraction FLOPs (2 x MACs: an RNN op's FLOPs add its gates, which torch
    does not count) of the operators torch counts, convolutions and matmuls apart."""
    families = {"conv": 0, "matmul": 0}
    for op, macs in by_macs.items():
        if op not in NOT_COUNTED_BY_TORCH:
            families["conv" if "conv" in op else "matmul"] += 2 * macs
    return families


def flop_counter(twin: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, int]:
    """FlopCounterMode's FLOPs of one real forward of ``twin`` (a model built as the counted one
    was: ``copy.deepcopy`` would share a library hook's closure, and its state, with the counted
    model) on copies of the inputs (SDPA on the math backend, whose matmuls torch counts),
    convolutions and matmuls apart."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    args, kwargs = copy.deepcopy((args, kwargs))
    counter = FlopCounterMode(display=False)
    with zoo.quiet(), sdpa_kernel(SDPBackend.MATH), counter:
        twin(*args, **kwargs)
    families = {"conv": 0, "matmul": 0}
    for op, flops in counter.get_flop_counts()["Global"].items():
        families["conv" if "conv" in str(op) else "matmul"] += int(flops)
    return families


def _operators(result: Any) -> Dict[str, Tuple[int, int]]:
    return {op: (result.by_operator("flops")[op], result.by_operator("macs")[op]) for op in result.by_operator("flops")}


def oracles(model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], meta: bool,
            fresh: Callable[[], nn.Module]) -> List[str]:
    """What disagrees with FlopCounterMode, with predict, and with a real run (empty: all agree);
    the real runs on models ``fresh`` builds as ``model`` was built."""
    problems = []
    with zoo.quiet():
        counted = flopcount.count_flops(model, args, kwargs=kwargs or None)
        predicted = flopcount.predict(model, args, kwargs or None, on="T4")
    by_flops = counted.by_operator("flops")
    predicted_flops = {op: row.flops for op, row in predicted.by_operator().items()}
    if predicted_flops != by_flops:
        only = {op: (by_flops.get(op), predicted_flops.get(op)) for op in set(by_flops) | set(predicted_flops)
                if by_flops.get(op) != predicted_flops.get(op)}
        problems.append(f"predict by_operator FLOPs != count's (count, predict): {dict(sorted(only.items())[:4])}")
    if meta:
        return problems
    if not any(REAL_RUN in warning for warning in counted.warnings):  # counted on fakes: equal to a real run
        with zoo.quiet():
            real = flopcount.count_flops(fresh(), args, kwargs=kwargs or None, tracer="dispatch")
        fake_ops, real_ops = _operators(counted), _operators(real)
        if fake_ops != real_ops:
            only = {op: (fake_ops.get(op), real_ops.get(op)) for op in set(fake_ops) | set(real_ops)
                    if fake_ops.get(op) != real_ops.get(op)}
            problems.append(f"fake != real run (flops, macs): {dict(sorted(only.items())[:4])}")
    ours = _contraction_flops(counted.by_operator("macs"))
    torch_counts = flop_counter(fresh(), args, kwargs)
    before = left_as_found(model, (args, kwargs))
    with zoo.quiet():
        flopcount.count_flops(model, args, kwargs=kwargs or None, tracer="dispatch")
    changed = zoo.changes(before, left_as_found(model, (args, kwargs)))
    if changed:
        problems.append(f"a real run (tracer='dispatch') changed the model or inputs: {', '.join(changed)}")
    if ours != torch_counts:
        problems.append(f"contraction FLOPs {ours} != FlopCounterMode {torch_counts}")
    return problems


def runs(twin: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[str]:
    """Why the model itself cannot run on these inputs (None: it runs): ``twin`` built as the
    counted model is, the inputs copied."""
    args, kwargs = copy.deepcopy((args, kwargs))
    try:
        with zoo.quiet(), torch.no_grad():
            twin(*args, **kwargs)
    except Exception as exc:
        return zoo.first_line(exc)[:200]
    return None


def check(case: Case, device: Optional[str], predict: bool) -> Tuple[List[str], int, str]:
    """Problems found on one model (empty: none), the calls reused with reuse on, and how it
    was counted (on fakes, or a real run and why)."""
    def fresh() -> nn.Module:
        return zoo._build(case, device)

    try:
        model = fresh()
    except Exception as exc:
        raise ModelBroken(f"cannot be built: {zoo.first_line(exc)[:200]}") from exc
    args, kwargs = zoo._inputs_for(case, device=device)
    broken = runs(fresh(), args, kwargs)
    if broken is not None:
        raise ModelBroken(broken)
    before = left_as_found(model, (args, kwargs))
    difference, reused = zoo_reuse.compare_model(model, args, kwargs, predict=predict)
    problems = [] if difference is None else [difference]
    changed = zoo.changes(before, left_as_found(model, (args, kwargs)))
    if changed:
        problems.append(f"model or inputs changed by the counts: {', '.join(changed)}")
    if difference is None:
        problems += oracles(model, args, kwargs, meta=device is not None, fresh=fresh)
    with zoo.quiet():
        warnings = flopcount.count_flops(model, args, kwargs=kwargs or None).warnings
    real = [w for w in warnings if REAL_RUN in w]
    return problems, reused, real[0].split(" because ")[-1][:120] if real else "on fakes"


class ModelBroken(Exception):
    """The model fails on its inputs without flopcount (a library missing, meta inputs a
    data-dependent op cannot read): not a count's failure."""


def collect(only: Optional[str]) -> Tuple[List[Case], Dict[str, str]]:
    cases: List[Case] = []
    skipped: Dict[str, str] = {}
    for part, builder, module in (("diffusers", diffusers_cases, "diffusers"), ("pyg", pyg_cases, "torch_geometric")):
        if only not in (None, part):
            continue
        try:
            __import__(module)
        except ImportError:
            skipped[part] = f"{module} is not installed"
            continue
        if part == "diffusers":  # its logger's notices (a LoRA scale passed without PEFT), not ours
            import diffusers

            diffusers.utils.logging.set_verbosity_error()
        cases += builder()
    return cases, skipped


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=PARTS)
    parser.add_argument("--match", default=None, help="only models whose name contains this text")
    parser.add_argument("--no-meta", action="store_true", help="real weights only")
    args = parser.parse_args(argv)
    cases, skipped = collect(args.only)
    if args.match:
        cases = [c for c in cases if args.match in c.name]
    for part, why in skipped.items():
        print(f"SKIP   {part}: {why}", flush=True)
    torch.set_num_threads(1)
    same = differ = failed = broken = reused_models = reused_calls = 0
    start = time.perf_counter()
    for case in cases:
        for device in (None,) if args.no_meta else (None, "meta"):
            where = f"{case.family}/{case.name}{' (meta)' if device else ''}"
            try:
                problems, reused, how = check(case, device, predict=True)
            except ModelBroken as exc:
                broken += 1
                print(f"SKIP   {where}: the model itself fails: {exc}", flush=True)
                continue
            except Exception as exc:
                failed += 1
                print(f"FAIL   {where}: {zoo.first_line(exc)[:200]}", flush=True)
                continue
            if problems:
                differ += 1
                for problem in problems:
                    print(f"DIFFER {where}: {problem[:400]}", flush=True)
                continue
            same += 1
            print(f"ok     {where}: {how}, {reused} calls reused", flush=True)
            if device == "meta" and reused:
                reused_models += 1
                reused_calls += reused
    print(f"\n{len(cases)} models, {same + differ + failed + broken} counts (real weights and meta copy): {same} identical "
          f"and agreeing with the oracles, {differ} differ, {failed} could not be counted, {broken} not run (the model "
          f"itself fails on them); reuse taken on {reused_models} "
          f"meta copies ({reused_calls} calls); torch {torch.__version__}; {time.perf_counter() - start:.0f} s",
          flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
