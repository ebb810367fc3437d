"""A lazy copy's parameter and buffer dictionaries (``fake/copies._TreeCopier._lazy``, branch resnet13):
made in one pass over a module's tensors when the forward first reaches the module, each tensor's key
found by one bisection in the read-ahead (``KeyTable``), and every kind of entry kept as before: its
place, a tie inside one dictionary, ``None``, a tensor not read ahead, one faked another way.

Oracles: the keys ``copies.reuse_key`` reads from each real tensor, the caller's dictionary's order
and identities, and the fakes' metadata against the real tensors'."""

from __future__ import annotations

import torch
from torch import nn

from flopcount.core.model_facts import model_facts
from flopcount.tracers.fake import copies


def _other_fake(*shape: int) -> torch.Tensor:
    """A FakeTensor of another mode than the copy's: not faked from a key read ahead (the fast
    constructor cannot make its fake: it is made when read ahead, above the dispatch, branch wild7)."""
    with copies._fake_types()[1]():
        return torch.empty(*shape)


class _Held(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))
        self.register_parameter("none", None)
        self.tied = self.w  # the same tensor under a second name of one dictionary
        self.register_buffer("stat", torch.zeros(4, dtype=torch.float64))
        self.register_buffer("odd", _other_fake(5))
        self.register_buffer("count", torch.tensor(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Held()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_a_copied_modules_dictionaries_find_each_key_once_and_keep_every_entry(monkeypatch):
    model = _Outer()
    facts = model_facts(model)
    made = copies.fake_copies(model, [], lazy=True, names=facts.names, shared_hooks=copies.SharedHooks(),
                              attributes=facts.tensor_attributes, modules=facts.modules)
    held = model.inner
    late = nn.Parameter(torch.randn(2, 2))
    held.register_parameter("late", late)  # after the read-ahead: its key is read when the module is copied
    names_before = list(held._parameters)
    finds = []
    find = copies.KeyTable.find

    def counted(self, ident):
        finds.append(ident)
        return find(self, ident)

    monkeypatch.setattr(copies.KeyTable, "find", counted)
    keys_before = len(made.lazy.keys_read())
    copied = made.lazy.copy_of(held)
    # one bisection a tensor inside the pass (the parent called KeyTable.find once for each tensor read
    # ahead, then looked each one up again in a dictionary of positions)
    assert finds == []
    fake = copies._fake_types()[0]
    raw = vars(copied)["_parameters"]
    assert list(dict.keys(raw)) == names_before == ["w", "none", "tied", "late"]
    w, none, tied, late_raw = dict.values(raw)
    assert type(w) is copies.Pending and tied is w and w.real is held.w  # one Pending: the tie kept
    assert w.key == copies.reuse_key(held.w, fake)
    assert none is None
    assert type(late_raw) is copies.Pending and late_raw.key == copies.reuse_key(late, fake)
    buffers = vars(copied)["_buffers"]
    assert list(dict.keys(buffers)) == ["stat", "odd", "count"]
    stat, odd, count = dict.values(buffers)
    assert type(stat) is copies.Pending and stat.key == copies.reuse_key(held.stat, fake)
    assert type(count) is copies.Pending and count.key == copies.reuse_key(held.count, fake)
    # faked another way (when read ahead): a fake of the copy's mode, not the caller's other one
    assert isinstance(odd, fake) and odd is not held.odd and odd.fake_mode is not held.odd.fake_mode
    assert (tuple(odd.shape), odd.dtype) == ((5,), torch.float32)
    # the read-ahead let go of the keys the copy now holds (w, stat, count; odd was faked when read
    # ahead and never held there, late was never in it)
    assert len(made.lazy.keys_read()) == keys_before - 3
    # read, the Pendings give one fake per real tensor, of its metadata
    assert copied.w is copied.tied
    for name in ("w", "late", "stat", "count"):
        real, read = getattr(held, name), getattr(copied, name)
        assert isinstance(read, fake)
        assert (tuple(read.shape), read.stride(), read.dtype, read.requires_grad) == (
            tuple(real.shape), real.stride(), real.dtype, real.requires_grad
        )
    assert isinstance(copied.w, nn.Parameter) and not isinstance(copied.stat, nn.Parameter)
    made.lazy.release()
