"""``fake_copies`` as the memory estimate uses it (``storages=True``, ``dtype``, ``retie``):
the fakes' storages, dtypes, devices and ties against the real model's own tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount.core.inputs import flatten_tensors
from flopcount.errors import UsageError
from flopcount.tracers.fake.copies import fake_copies


class Shared(nn.Module):
    """A weight shared by two modules, a buffer that views part of a larger tensor, an int buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.b.weight = self.a.weight
        table = torch.randn(10, 8)
        self.register_buffer("window", table[2:5])  # storage: the whole 10x8 table
        self.register_buffer("steps", torch.zeros(3, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) + self.window.sum()


def _storage_bytes(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()


def test_storages_are_shared_and_sized_as_the_real_ones() -> None:
    model, x = Shared(), torch.randn(4, 8)
    copied = fake_copies(model, [x], storages=True)
    twin = copied.model
    assert twin.b.weight is twin.a.weight
    assert _storage_bytes(twin.window) == _storage_bytes(model.window) == 10 * 8 * 4
    assert twin.window.storage_offset() == model.window.storage_offset() == 16
    reals = [*model.parameters(), *model.buffers()]
    for real, fake in zip(reals, [*twin.parameters(), *twin.buffers()]):
        assert copied.twins[id(real)] is fake
        assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype)
    assert copied.twins[id(x)] is copied.tensors[0]


def test_fake_parameters_are_leaves_like_real_ones() -> None:
    """Not autograd views: autocast caches its low-precision copy of a leaf parameter only
    when it is not a view (a view made the autocast memory estimate 18 % low)."""
    model = Shared()
    twin = fake_copies(model, [], storages=True).model
    for (name, real), fake in zip(model.named_parameters(), twin.parameters()):
        assert isinstance(fake, nn.Parameter), name
        assert fake.is_leaf and not fake._is_view(), name
        assert fake.requires_grad == real.requires_grad, name


def test_dtype_casts_floating_tensors_and_meta_maps_to_cpu() -> None:
    model = Shared().to("meta")
    x = torch.randn(4, 8, device="meta")
    copied = fake_copies(model, [x], dtype=torch.bfloat16, storages=True)
    twin = copied.model
    assert twin.a.weight.dtype == torch.bfloat16 and twin.steps.dtype == torch.long
    assert _storage_bytes(twin.a.weight) == 8 * 8 * 2
    assert _storage_bytes(twin.steps) == 3 * 8
    assert {t.device.type for t in [*twin.parameters(), *twin.buffers(), *copied.tensors]} == {"cpu"}


def test_counting_copies_of_meta_stand_for_cpu_and_keep_dtype() -> None:
    # since #32.1 a meta weight's fake stands for a CPU one (as storages=True always did), so
    # kernels pick the layouts they pick for real weights and a meta model counts like the real one
    model = Shared().to("meta")
    twin = fake_copies(model, []).model
    assert twin.a.weight.device.type == "cpu" and twin.a.weight.dtype == torch.float32
    assert model.a.weight.device.type == "meta"  # the caller's model is untouched


def test_retie_restores_a_declared_tie_on_the_copy_only() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=64)
    model = transformers.GPT2LMHeadModel(config).to("meta")  # .to("meta") unties lm_head from wte
    assert model.lm_head.weight is not model.transformer.wte.weight
    copied = fake_copies(model, [], storages=True, retie=True)
    assert copied.model.lm_head.weight is copied.model.transformer.wte.weight
    assert len(copied.notes) == 1 and "lm_head.weight = transformer.wte.weight" in copied.notes[0]
    assert model.lm_head.weight is not model.transformer.wte.weight
    assert fake_copies(model, [], storages=True).notes == []


def test_a_sparse_tensor_is_refused_with_its_place() -> None:
    flat, rebuild = flatten_tensors(((torch.randn(2, 8).to_sparse(),), {}))
    with pytest.raises(UsageError, match="input tensor 0 is a torch.sparse_coo tensor"):
        fake_copies(Shared(), flat, rebuild, storages=True)
