"""Cases the count-speed changes of issue #32 could break, each counted with structural reuse on
and off (``FLOPCOUNT_REUSE=0``: every call traced) and against an independent figure:
``FlopCounterMode`` run live on a copy of the real model, or MACs derived by hand.

* the reuse key of a tracked module (class, training flag, parameters and buffers, hook flags:
  ``_reuse.Reuse._own_part``): identical blocks but one in eval mode, or with a buffer of
  another dtype, must not share a key;
* tensors kept as plain attributes, found by the model facts' walk (``tensor_attributes``) and
  faked with the copy: a mask of another shape in one block;
* views answered by the shape cache on their argument's storage (``shape_cache._view``): a
  view written in place, a transposed view fed to a matmul, a view of a view.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Tuple

import pytest
import torch
from conftest import torch_contraction_flops
from torch import nn

from flopcount import count_flops

B, D, H = 3, 8, 16


def _rows(result: Any) -> Any:
    return {
        "dict": result.to_dict(),
        **{metric: (result.by_operator(metric), result.by_module(metric), result.by_module_and_operator(metric),
                    result.by_phase(metric)) for metric in ("macs", "flops", "count", "bytes_read")},
        "calls": [(m.name, m.calls) for m in result.modules],
    }


def _both(monkeypatch: pytest.MonkeyPatch, model: nn.Module, inputs: Tuple[Any, ...], tracer: str = "auto") -> Any:
    on_as = "always" if os.environ.get("FLOPCOUNT_REUSE") == "always" else "1"  # reuse_always's policy kept
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, inputs, tracer=tracer)
    monkeypatch.setenv("FLOPCOUNT_REUSE", on_as)
    on = count_flops(model, inputs, tracer=tracer)
    assert _rows(on) == _rows(off)
    return on


class Masked(nn.Module):
    """Linear(D, H) -> dropout -> masked -> Linear(H, D), residual; the mask a plain attribute."""

    def __init__(self, hidden: int = H) -> None:
        super().__init__()
        self.up = nn.Linear(D, hidden)
        self.drop = nn.Dropout(0.1)
        self.down = nn.Linear(hidden, D)
        self.mask = torch.ones(hidden)  # a tensor attribute, neither parameter nor buffer
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.up(x)) * self.mask * self.scale
        return self.down(h) + x


class Stack(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Masked() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _macs(model: Stack, rows: int) -> int:
    # each block: rows x (D x hidden + hidden x D), hidden = its up layer's width
    return sum(rows * 2 * D * block.up.out_features for block in model.blocks)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_one_block_in_another_mode_is_keyed_apart(monkeypatch: pytest.MonkeyPatch, train: bool) -> None:
    torch.manual_seed(0)
    model = Stack().train(train)
    model.blocks[2].train(not train)  # its dropout runs (or not) unlike the others'
    x = torch.randn(B, D)
    on = _both(monkeypatch, model, (x,))
    assert on.macs == _macs(model, B) == torch_contraction_flops(copy.deepcopy(model), (x,)) // 2
    # invariant: each block's rows are those of the same block counted alone, in its own mode
    # (a block in train mode drops: its dropout has a cost an eval-mode one does not)
    rows = on.by_module_and_operator("flops")
    for i, block in enumerate(model.blocks):
        alone = count_flops(block, (x,)).by_module_and_operator("flops")[""]
        assert rows[f"blocks.{i}"] == alone
    assert rows["blocks.2"] != rows["blocks.1"]


class Scaled(Masked):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up(x) * self.scale.float()) + x  # a cast only where scale is not float32


def test_a_buffer_of_another_dtype_is_keyed_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Stack().eval()
    model.blocks = nn.ModuleList(Scaled() for _ in range(4))
    model.blocks[1].scale = torch.ones(1, dtype=torch.float64)
    x = torch.randn(B, D)
    on = _both(monkeypatch, model, (x,))
    assert on.macs == _macs(model, B) == torch_contraction_flops(copy.deepcopy(model), (x,)) // 2
    ops = on.by_module_and_operator("count")
    assert [sum(n for op, n in ops[f"blocks.{i}"].items() if "to_copy" in op) for i in range(4)] == [0, 1, 0, 0]


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_a_tensor_attribute_of_another_shape_in_one_block(monkeypatch: pytest.MonkeyPatch, tracer: str) -> None:
    torch.manual_seed(0)
    model = Stack().eval()
    model.blocks[3] = Masked(hidden=24)  # its mask (a plain attribute) has 24 entries
    x = torch.randn(5, D)
    on = _both(monkeypatch, model, (x,), tracer=tracer)
    assert on.macs == _macs(model, 5) == torch_contraction_flops(copy.deepcopy(model), (x,)) // 2
    rows = on.by_module_and_operator("flops")
    assert rows["blocks.3"]["aten::mul"] == 2 * 5 * 24  # two products of 5 x 24 elements (mask, then scale)
    assert rows["blocks.0"]["aten::mul"] == 2 * 5 * H


def test_a_tensor_attribute_on_meta_is_faked_with_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    model = copy.deepcopy(Stack().eval()).to("meta")
    for block in model.blocks:
        block.mask = torch.ones(H, device="meta")
    on = _both(monkeypatch, model, (torch.randn(B, D, device="meta"),))
    assert on.macs == _macs(model, B)
    assert all(block.mask.device.type == "meta" for block in model.blocks)  # the caller's, untouched


class Views(nn.Module):
    """Views the shape cache answers: a view written in place, a transpose fed to a matmul,
    a view of a view; attention-like, 2 heads of width D // 2."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, D // 2).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2)  # b x 2 x t x t
        scores.view(b, 2, t * t).mul_(0.5)  # in place through a view
        out = scores.softmax(-1) @ v
        return out.transpose(1, 2).reshape(b, t, D)


class ViewStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(Views(), nn.Linear(D, D)) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) + x
        return x


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_views_answered_by_the_shape_cache(monkeypatch: pytest.MonkeyPatch, train: bool) -> None:
    torch.manual_seed(0)
    model = ViewStack().train(train)
    x = torch.randn(2, 5, D)
    on = _both(monkeypatch, model, (x,))
    # per layer: qkv 2*5 x D x 3D, scores and AV 2 x 2 heads x 5 x 5 x D/2 each, output D x D
    per_layer = 2 * 5 * D * 3 * D + 2 * (2 * 2 * 5 * 5 * (D // 2)) + 2 * 5 * D * D
    assert on.macs == 3 * per_layer == torch_contraction_flops(copy.deepcopy(model), (x,)) // 2
    dispatch = count_flops(model, (x,), tracer="dispatch")
    assert _rows(dispatch)["macs"] == _rows(on)["macs"]
    assert on.by_operator("count") == dispatch.by_operator("count")


class Seen(nn.Module):
    """A leaf that records its own class each time it runs."""

    def __init__(self, note: Any) -> None:
        super().__init__()
        self.note = note  # one function for every module: shared with the fake copy, not copied
        self.fc = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.note(type(self))
        return self.fc(x)


class Leaf(nn.Linear):
    """A leaf (not wrapped by reuse: no children) that records its own class."""

    def __init__(self, note: Any) -> None:
        super().__init__(D, D)
        self.note = note

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.note(type(self))
        return super().forward(x)


class Outer(nn.Module):
    def __init__(self, seen: list) -> None:
        super().__init__()

        def note(cls: type) -> None:
            seen.append(cls)

        self.head = Leaf(note)  # runs outside every keyed call (the root's own forward)
        self.blocks = nn.ModuleList(nn.Sequential(Seen(note), nn.ReLU()) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(x)
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.usefixtures("reuse_always")  # 3 small blocks: keyed (the default policy would trace them)
def test_a_module_keeps_its_own_class_outside_first_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (issue #32, count speed): every module of the copy ran as a read-logging subclass
    for the whole count, so each attribute read paid a Python ``__getattribute__`` (~3,200 reads
    per ResNet-50 count outside any first call, where nothing is logged). Now only the modules
    of a first call's subtree are swapped, while it runs: the root's own modules keep their
    class (before: the logging subclass). Oracle: ``type(self)`` inside the forward; MACs by
    hand (4 Linears D x D on B rows); reuse on equals reuse off."""
    seen: list = []
    model = Outer(seen)
    on = _both(monkeypatch, model, (torch.randn(B, D),))
    assert on.macs == 4 * B * D * D
    seen.clear()
    count_flops(model, (torch.randn(B, D),))
    assert seen[0] is Leaf  # the head, outside every first call (before: the logging subclass)
    # blocks.0 is the first call of its key: its subtree logs reads (the subclass, while it runs);
    # blocks.1 and blocks.2 are booked from it (not run)
    assert len(seen) == 2 and seen[1] is not Seen and issubclass(seen[1], Seen)
