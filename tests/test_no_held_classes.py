"""A count keeps none of the caller's classes, functions or tensors once it returns (the product's
promise to leave the process as found; issue #27 item 5's "nothing of the caller's is touched").

Before branch weakcls three per-class memos were ``functools.lru_cache``s (``core/state._slots``
and ``_kind_of``, ``tracers/_reuse._special``): every class a count met was held until 4,096 others
pushed it out; the memo of the globals a class's code names (``core/state._NAMED_GLOBALS``, weakly
keyed) held the class's functions and closure cells in its values, so a class whose own method
held it (the ``__class__`` cell of ``super()``) was held for good; the shared calls' price memo
(``core/analysis._PRICES``) held a handler given for one count; Lightning's step-signature memo
held the step function. Oracle: a weak reference to each object, dead once the caller dropped its
own references and the collector ran; the counts themselves against MACs derived by hand.
"""

from __future__ import annotations

import dataclasses
import gc
import weakref
from typing import Any, Callable, List, Tuple

import pytest
import torch
from torch import nn

from flopcount import Cost, count_flops

WIDTH, BATCH, BLOCKS = 8, 2, 3
#: one Linear(WIDTH, WIDTH) on a (BATCH, WIDTH) input: BATCH * WIDTH * WIDTH multiply-accumulates
LINEAR_MACS = BATCH * WIDTH * WIDTH


def _model_made_in_a_function(scale: float) -> Tuple[nn.Module, List[Any]]:
    """A model whose classes a function makes (one set per call, as an architecture search or a
    test fixture does): a config class, a slotted one, and a block that subclasses ``nn.Linear``,
    calls ``super()`` in its forward (a ``__class__`` cell), reads the function's ``scale`` and
    holds a 4 MiB tensor as a class attribute. Returns the model and what must not outlive it."""

    @dataclasses.dataclass
    class Config:
        shift: float = 0.0

    @dataclasses.dataclass(slots=True)
    class Flags:
        on: bool = True

    class Block(nn.Linear):
        table = torch.zeros(1 << 20)  # a class attribute holding a large tensor
        flags = Flags()

        def __init__(self) -> None:
            super().__init__(WIDTH, WIDTH)
            self.config = Config()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = super().forward(x) * scale
            return y + self.table[:WIDTH] if self.flags.on else y

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.Sequential(*[Block() for _ in range(BLOCKS)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.blocks(x)

    return Net(), [Net, Block, Config, Flags, Block.table]


def _all_gone(refs: List[weakref.ref]) -> List[str]:
    gc.collect()
    return [repr(ref()) for ref in refs if ref() is not None]


def _counted(make: Callable[[], Tuple[nn.Module, List[Any]]], **options: Any) -> Tuple[int, List[weakref.ref]]:
    """The MACs of one count of a freshly made model, and weak references to what it holds."""
    model, held = make()
    macs = count_flops(model, torch.randn(BATCH, WIDTH), **options).macs
    refs = [weakref.ref(obj) for obj in held + [model]]
    return macs, refs


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_classes_made_in_a_function_go_with_their_model(tracer: str) -> None:
    macs, refs = _counted(lambda: _model_made_in_a_function(0.5), tracer=tracer)
    assert macs == BLOCKS * LINEAR_MACS
    assert _all_gone(refs) == []


def test_a_class_attribute_tensor_is_freed_with_its_class() -> None:
    model, held = _model_made_in_a_function(2.0)
    table = weakref.ref(held[1].table)
    assert table().numel() == 1 << 20
    count_flops(model, torch.randn(BATCH, WIDTH))
    del model, held
    gc.collect()
    assert table() is None


def _traced_alone() -> Tuple[nn.Module, List[Any]]:
    model, held = _model_made_in_a_function(0.5)
    graph_module = torch.fx.symbolic_trace(model)
    return graph_module, [type(graph_module), *held]


def _traced_called_through_a_closure() -> Tuple[nn.Module, List[Any]]:
    """A traced graph that a wrapper made in a function calls by its closure (a pre-processing
    step around a graph): the wrapper's key reads its closure, and met the graph's own class."""
    graph_module = torch.fx.symbolic_trace(_model_made_in_a_function(0.5)[0])

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = nn.Linear(WIDTH, WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return graph_module(self.pre(x))

    return Wrapper(), [type(graph_module), Wrapper]


@pytest.mark.parametrize("make, linears", [(_traced_alone, BLOCKS), (_traced_called_through_a_closure, BLOCKS + 1)],
                         ids=["alone", "called-through-a-closure"])
def test_a_graph_modules_class_goes_with_it(make: Callable[[], Tuple[nn.Module, List[Any]]], linears: int) -> None:
    """Every ``torch.fx.GraphModule`` has a class of its own."""
    macs, refs = _counted(make)
    assert macs == linears * LINEAR_MACS
    assert _all_gone(refs) == []


def _architecture(index: int) -> Tuple[nn.Module, List[Any]]:
    """One candidate of an architecture search: its block and config classes made by ``type``,
    two blocks of it (the second call keyed: its module's plain attributes read)."""
    width = WIDTH + index % 3
    config_class = type(f"Config{index}", (), {"bias": 0.0})

    def __init__(self: nn.Module) -> None:
        nn.Module.__init__(self)
        self.inner = nn.Linear(WIDTH, width)
        self.config = config_class()

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x[..., :WIDTH]) + self.config.bias * width

    block_class = type(f"Block{index}", (nn.Module,), {"__init__": __init__, "forward": forward})
    return nn.Sequential(block_class(), block_class()), [block_class, config_class]


def test_a_sweep_of_fresh_classes_leaves_none_alive() -> None:
    refs: List[weakref.ref] = []
    for index in range(300):
        model, held = _architecture(index)
        result = count_flops(model, torch.randn(BATCH, WIDTH))
        assert result.macs == 2 * BATCH * WIDTH * (WIDTH + index % 3)
        refs += [weakref.ref(obj) for obj in held]
        del model, held, result
    assert len(refs) == 600
    assert _all_gone(refs) == []


def test_a_handler_given_for_one_count_is_not_kept() -> None:
    """``handlers=`` is for one count; the shared calls' price memo held the handler (with what its
    defaults and closure hold) past it."""
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
    def handler(call: Any, table: torch.Tensor = torch.zeros(1 << 16)) -> Cost:
        return Cost(macs=7, flops=14)

    result = count_flops(model, torch.randn(BATCH, WIDTH), handlers={"aten::relu": handler})
    assert result.macs == 2 * LINEAR_MACS + 7  # the ReLU priced by the handler
    again = count_flops(model, torch.randn(BATCH, WIDTH), handlers={"aten::relu": handler})
    assert again.macs == 2 * LINEAR_MACS + 7
    refs = [weakref.ref(handler), weakref.ref(handler.__defaults__[0])]
    del handler
    assert _all_gone(refs) == []
    assert count_flops(model, torch.randn(BATCH, WIDTH)).macs == 2 * LINEAR_MACS


def test_a_lightning_step_function_is_not_kept() -> None:
    """The Lightning callback reads whether a step takes ``batch_idx`` once per step function."""
    pytest.importorskip("lightning")
    from flopcount.integrations.lightning import _step_args

    def make() -> Tuple[Any, Any]:
        class Steps:
            def training_step(self, batch: Any) -> Any:
                return batch

            def validation_step(self, batch: Any, batch_idx: int) -> Any:
                return batch

        return Steps(), Steps

    steps, steps_class = make()
    assert _step_args(steps.training_step, "b", 3) == ("b",)
    assert _step_args(steps.validation_step, "b", 3) == ("b", 3)
    refs = [weakref.ref(steps_class.training_step), weakref.ref(steps_class.validation_step), weakref.ref(steps_class)]
    del steps, steps_class
    assert _all_gone(refs) == []
