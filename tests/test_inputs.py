"""count_flops accepts every input shape a user has: tensor, tuple, list, dict, nested, kwargs.

Expected MACs are derived by hand: a Linear(i, o) on N rows costs N*i*o MACs."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from conftest import torch_contraction_flops
from torch import nn

from flopcount import count_flops


class TwoArgs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)
        self.b = nn.Linear(6, 4)

    def forward(self, x, y, scale=1.0):
        return self.a(x) * scale + self.b(y)


class ListIn(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)

    def forward(self, xs):
        return [self.a(x) for x in xs]


class DictInDictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.img = nn.Linear(8, 4)
        self.txt = nn.Linear(6, 4)

    def forward(self, batch):
        return {"image": self.img(batch["image"]), "text": self.txt(batch["nested"]["text"]), "n": 3}


class KwargsOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)

    def forward(self, *, input_ids=None, mask=None):
        out = self.a(input_ids)
        return out if mask is None else out * mask


def test_single_tensor():
    r = count_flops(nn.Linear(8, 4), torch.randn(5, 8))
    assert r.macs == 5 * 8 * 4
    assert r.flops == 2 * r.macs


def test_tuple_is_unpacked_as_positional_arguments():
    r = count_flops(TwoArgs(), (torch.randn(3, 8), torch.randn(3, 6)))
    assert r.macs == 3 * 8 * 4 + 3 * 6 * 4
    assert r.by_module("macs")["a"] == 3 * 8 * 4
    assert r.by_module("macs")["b"] == 3 * 6 * 4


def test_tuple_with_python_scalar_and_kwargs():
    r = count_flops(TwoArgs(), (torch.randn(3, 8),), kwargs={"y": torch.randn(2, 3, 6), "scale": 2.0})
    assert r.by_module("macs")["a"] == 3 * 8 * 4
    assert r.by_module("macs")["b"] == 2 * 3 * 6 * 4


def test_list_is_one_argument():
    r = count_flops(ListIn(), [torch.randn(2, 8), torch.randn(7, 8)])
    assert r.macs == (2 + 7) * 8 * 4
    assert r.modules[1].calls == 2  # module "a" ran twice and accumulates both calls


@pytest.mark.parametrize("mapping", [dict, OrderedDict])
def test_nested_dict_input_and_dict_output(mapping):
    batch = mapping(image=torch.randn(2, 8), nested={"text": torch.randn(9, 6)})
    r = count_flops(DictInDictOut(), batch)
    assert r.by_module("macs") == {"": 2 * 8 * 4 + 9 * 6 * 4, "img": 2 * 8 * 4, "txt": 9 * 6 * 4}


def test_kwargs_only_with_empty_inputs():
    r = count_flops(KwargsOnly(), (), kwargs={"input_ids": torch.randn(4, 8)})
    assert r.macs == 4 * 8 * 4
    r2 = count_flops(KwargsOnly(), kwargs={"input_ids": torch.randn(4, 8), "mask": torch.ones(4, 4)})
    assert r2.macs == 4 * 8 * 4
    assert r2.flops == 2 * 4 * 8 * 4 + 4 * 4  # plus one multiply per output element for the mask


def test_model_output_dataclass():
    pytest.importorskip("transformers")
    from examples.hf import gpt2, token_ids

    model = gpt2(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    r = count_flops(model, (token_ids(1, 8, 100),))
    assert 2 * r.macs == torch_contraction_flops(model, (token_ids(1, 8, 100),))  # live peer
