"""Private torch symbols replaced by public ones (issue #27 item 4, 2026-11-27): the paths that
used them, checked against independent oracles.

* jit's unpool refusal: read from the public ``F.max_unpool*d`` frame and its ``output_size``
  argument, not from the name of torch's private ``_unpool_output_size``;
* an exported program's recorded example inputs: flattened by its own ``call_spec.in_spec``
  (``TreeSpec.flatten_up_to``), not ``torch.utils._pytree.tree_leaves``.

(The step's backward entry credit, now a public multi-grad hook instead of ModTracker's
``_get_append_fn`` replaced, is checked against torch's MemTracker run live by
tests/test_memory_replay_module_peaks.py.)
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flopcount import TraceError, count_flops
from flopcount.tracers.jit.sizes import default_unpool_size

B, C = 3, 4


class _TracedSize(nn.Module):
    """``output_size`` read from the input's shape: under jit those sizes are traced values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled, indices = F.max_pool2d(x, 2, return_indices=True)
        return F.max_unpool2d(pooled, indices, 2, output_size=x.shape[-2:]) + 1


def test_a_traced_output_size_is_named_as_such_under_jit() -> None:
    # before: "without output_size ... pass output_size", for a call that passed one
    with pytest.raises(TraceError, match=r"^torch.jit cannot trace F.max_unpool\*d in the root module \(model\): its output_size holds traced sizes") as info:
        count_flops(_TracedSize(), (torch.randn(B, C, 6, 6),), tracer="jit")
    assert "without output_size" not in str(info.value)


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_a_traced_output_size_is_counted_by_the_other_tracers(tracer: str, mode: str) -> None:
    # the add runs on the unpooled (B, C, 6, 6): 1 FLOP per element
    model = _TracedSize().train(mode == "train")
    assert count_flops(model, (torch.randn(B, C, 6, 6),), tracer=tracer).by_operator()["aten::add"] == B * C * 36


@pytest.mark.parametrize(
    "dims,spatial,kernel,stride,padding",
    [(1, (11,), 3, None, 0), (2, (9, 7), 3, 2, 1), (2, (8, 8), 2, None, 0), (3, (5, 6, 4), 2, 1, 0)],
)
def test_default_unpool_size_is_what_nn_max_unpool_makes(
    dims: int, spatial: Sequence[int], kernel: int, stride: Optional[int], padding: int
) -> None:
    # oracle: nn.MaxUnpool{dims}d run live, without output_size (its default) and with one
    x = torch.randn(B, C, *spatial)
    pool = getattr(nn, f"MaxPool{dims}d")(kernel, stride, padding, return_indices=True)
    unpool = getattr(nn, f"MaxUnpool{dims}d")(kernel, stride, padding)
    pooled, indices = pool(x)
    live = unpool(pooled, indices)
    assert default_unpool_size(pooled.shape, dims, kernel, stride, padding) == tuple(live.shape[2:])
    # given: the module makes exactly that size (the mode passes a given size through untouched)
    given = tuple(spatial)
    assert tuple(unpool(pooled, indices, output_size=given).shape[2:]) == given


class _ConstantThenTensors(nn.Module):
    def forward(self, x: torch.Tensor, n: int, *, y: torch.Tensor) -> torch.Tensor:
        return x.sum(0) * n + y.sum(0)


def test_recorded_inputs_follow_the_programs_input_spec() -> None:
    # a constant between two tensors with dynamic first dimensions: each tensor's size is its own
    # recorded example's (3 and 5, the example inputs given to torch.export), the constant kept
    from flopcount.cli.artifacts import artifact_from_program

    batch, rows = torch.export.Dim("batch", min=2, max=64), torch.export.Dim("rows", min=2, max=64)
    x, y = torch.randn(3, 4), torch.randn(5, 4)
    program = torch.export.export(_ConstantThenTensors(), (x, 2), {"y": y}, dynamic_shapes=({0: batch}, None, {0: rows}))
    loaded = artifact_from_program("mixed.pt2", program, "cpu")
    assert loaded.inputs is not None and loaded.kwargs is not None
    assert tuple(loaded.inputs[0].shape) == (3, 4) and loaded.inputs[1] == 2
    assert tuple(loaded.kwargs["y"].shape) == (5, 4)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_the_static_unpool_size_read_leaves_no_tracer_warning(mode: str) -> None:
    # the default size is read as ints while jit traces (no private pause of the tracer): the
    # graph takes them as constants and the tracer's warning about that read is flopcount's own,
    # not the model's. Hand count: max_pool2d(2) on 8x8 -> 4x4, unpooled to 8x8, then * 2: one
    # FLOP per output element.
    from tests.tracers.test_jit_unpool import _PoolUnpool

    result = count_flops(_PoolUnpool(2, 2, None, 0).train(mode == "train"), (torch.randn(B, C, 8, 8),), tracer="jit")
    assert result.by_operator()["aten::mul"] == B * C * 64
    assert not [w for w in result.warnings if "TracerWarning" in str(w)]


def test_the_fast_fake_maker_stands_down_under_torchs_fake_debug_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    # tracers/fake/making.py no longer reads torch's private FakeTensorConfig: under its debug mode
    # each fake the constructor makes records its own traceback, which the maker's check against a
    # constructor-made fake sees differ, so every fake is made by the constructor (oracle: torch's
    # constructor; each fake carries a traceback of its own, as torch's debug mode promises)
    from torch._subclasses import fake_tensor as ft

    from flopcount.tracers.fake.making import FakeMaker

    monkeypatch.setattr(ft.FakeTensorConfig, "debug", True)
    maker = FakeMaker(ft.FakeTensorMode(allow_non_fake_inputs=True), ft.FakeTensor)
    cpu = torch.device("cpu")
    with torch._C._DisableTorchDispatch():
        first = maker.make((4, 5), (5, 1), torch.float32, cpu)
        second = maker.make((2, 3), (3, 1), torch.float16, cpu, requires_grad=True, is_param=True)
    assert maker._fast is False
    assert vars(first)["_debug_trace"] is not vars(second)["_debug_trace"]
    assert (second.shape, second.dtype, second.requires_grad, isinstance(second, nn.Parameter)) == ((2, 3), torch.float16, True, True)


def test_no_code_of_the_module_call_reads_its_dict_but_the_registry_lookups() -> None:
    # tracers/_reuse.py leaves out of a reuse key the ``__dict__`` reads made by nn.Module's own
    # code (``_MODULE_CODE``). It held the code of the call machinery (private ``_call_impl`` and
    # ``_wrapped_call_impl``) too, which never reads ``__dict__``: oracle, a module called with
    # every kind of hook, forward and backward, its ``__dict__`` reads recorded with the code
    # that made each. The registry lookups (``__getattr__`` of ``self.weight``, ``__setattr__``)
    # are the only nn.Module code among them, and each is in the set
    import sys

    from torch.nn.modules import module as module_impl

    from flopcount.tracers._reuse import _MODULE_CODE

    readers = []

    class Probe(nn.Linear):
        def __getattribute__(self, name: str) -> object:
            if name == "__dict__":
                readers.append(sys._getframe(1).f_code)
            return super().__getattribute__(name)

    model = Probe(4, 3)
    hooks = [
        model.register_forward_pre_hook(lambda m, a: None),
        model.register_forward_pre_hook(lambda m, a, k: None, with_kwargs=True),
        model.register_forward_hook(lambda m, a, o: None),
        model.register_forward_hook(lambda m, a, k, o: None, with_kwargs=True, always_call=True),
        model.register_full_backward_pre_hook(lambda m, g: None),
        model.register_full_backward_hook(lambda m, gi, go: None),
        module_impl.register_module_forward_pre_hook(lambda m, a: None),
        module_impl.register_module_forward_hook(lambda m, a, o: None),
    ]
    readers.clear()  # construction's reads (register_parameter) are not a call's
    try:
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()
        model.scale = 2.0  # an assignment's registry lookup
    finally:
        for handle in hooks:
            handle.remove()
    module_code = {code for code in readers if code.co_filename == module_impl.__file__}
    assert {code.co_name for code in module_code} == {"__getattr__", "__setattr__"}
    assert module_code <= _MODULE_CODE


class _TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(C, 6), nn.Linear(6, 2)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x))) * scale


def _exported_and_flops() -> tuple:
    """An exported module (its specs hold a keyword argument) and FlopCounterMode's count of
    the eager model it came from, run live."""
    from torch.utils.flop_counter import FlopCounterMode

    model, x, scale = _TwoLayers(), torch.randn(B, C), torch.randn(B, 2)
    program = torch.export.export(model, (x,), {"scale": scale})
    counter = FlopCounterMode(display=False)
    with counter:
        model(x, scale=scale)
    return program, x, scale, int(counter.get_total_flops())


def test_the_copy_shares_the_specs_an_exported_program_hands_out() -> None:
    # tracers/fake/copies.py shares pytree specs with a fake copy instead of deep-copying them
    # (a deep copy trips torch's FutureWarning about ``LeafSpec``): their type is now the one
    # torch.export's public ModuleCallSignature declares for ``in_spec``, not the private
    # ``torch.utils._pytree.TreeSpec`` named. Oracle: the type of the specs a real exported
    # program carries (its public ``call_spec``), and torch's own warning seen without sharing
    from flopcount.tracers.fake.copies import _shared_types

    program, *_ = _exported_and_flops()
    spec = program.call_spec.in_spec
    assert isinstance(spec, _shared_types())
    assert isinstance(program.call_spec.out_spec, _shared_types())


def _leaf_spec_warnings(run: Callable[[], object]) -> int:
    """How many of torch's FutureWarnings about ``LeafSpec`` (what a deep copy of a pytree spec
    raised in torch 2.13) ``run()`` shows."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return len([w for w in caught if "LeafSpec" in str(w.message)])


def test_an_exported_module_is_counted_on_a_fake_copy_sharing_its_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fake copy holds the exported module's very spec objects, and its count is
    # FlopCounterMode's of the eager model (addmm x2: 2*B*C*6 + 2*B*6*2 FLOPs), with no warning
    # from a deep copy of its specs
    import copy

    from flopcount.tracers.fake import copies

    program, x, scale, flops = _exported_and_flops()
    assert flops == 2 * B * C * 6 + 2 * B * 6 * 2
    module = program.module()
    spec_type = type(program.call_spec.in_spec)
    specs = {name: value for name, value in vars(module).items() if isinstance(value, spec_type)}
    copied = copies.fake_copies(module, [x])
    assert specs and all(vars(copied.model)[name] is value for name, value in specs.items())
    result: list = []
    shown = _leaf_spec_warnings(lambda: result.append(count_flops(module, (x,), {"scale": scale}, tracer="auto")))
    assert result[0].by_operator()["aten::linear"] == flops and shown == 0
    # the oracle for the warning: where torch warns on a spec's deep copy (2.13; 2.14.1 does not),
    # the same count with the specs deep-copied shows it
    copy_warns = _leaf_spec_warnings(lambda: copy.deepcopy(program.call_spec.in_spec)) > 0
    monkeypatch.setattr(copies, "_shared_types", lambda: (torch.fx.Graph, torch.fx.Node))
    unshared = _leaf_spec_warnings(lambda: count_flops(program.module(), (x,), {"scale": scale}, tracer="auto"))
    assert (unshared > 0) == copy_warns
