"""nn.EmbeddingBag counted by hand (docs/conventions.md, index-accumulate ops): one FLOP per
looked-up element (indices x dim: an add for sum/mean, a compare for max), a multiply per
looked-up element with per_sample_weights, and a divide per output element for mean. Every
tracer, batch > 1, 2-D bags and 1-D input with offsets."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount import count_flops

TRACERS = ("jit", "dispatch", "auto")
NUM, DIM = 10, 4


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize(
    "mode, expected",
    [
        ("sum", 3 * 5 * DIM),  # 3 bags of 5 indices: 15 looked-up rows of 4
        ("mean", 3 * 5 * DIM + 3 * DIM),  # + a divide per (3, 4) output element
        ("max", 3 * 5 * DIM),  # a compare per looked-up element
    ],
)
def test_bags_of_a_2d_input(tracer, mode, expected):
    bag = nn.EmbeddingBag(NUM, DIM, mode=mode)
    before = snapshot(bag)
    result = count_flops(bag, torch.randint(0, NUM, (3, 5)), tracer=tracer)
    assert (result.macs, result.flops) == (0, expected)
    assert result.unsupported_ops() == {}
    assert_same_state(bag, before)


@pytest.mark.parametrize("tracer", TRACERS)
def test_offsets_and_per_sample_weights(tracer):
    bag = nn.EmbeddingBag(NUM, DIM, mode="sum")
    indices, offsets = torch.randint(0, NUM, (7,)), torch.tensor([0, 2, 5])
    weights = torch.rand(7)
    # 7 looked-up rows of 4: an add each, and a multiply each by its sample weight
    result = count_flops(bag, (indices, offsets, weights), tracer=tracer)
    assert result.flops == 2 * 7 * DIM
    mean = nn.EmbeddingBag(NUM, DIM, mode="mean")
    # 3 bags of 2, 3 and 2 indices: 7 x 4 adds + a divide per (3, 4) output element
    assert count_flops(mean, (indices, offsets), tracer=tracer).flops == 7 * DIM + 3 * DIM
