"""Every reading leaves the class data of the model's module classes and the globals their
forwards write as found (issue #27 item 5, branch asfound).

Before: a fake copy's modules and a real run's private twin share the caller's classes, so a
forward's ``type(self).calls += 1`` advanced the caller's class once per call of every reading
(count_flops by 14 on 14 blocks, estimate_memory by 38 with the layer replay's cut runs and 14
without, profile by 70), a ``global STEP; STEP += 1`` likewise, and a class-level cache kept what
the run put in it (on fakes: fake tensors). Oracles: the values read by the test before the call;
the counts against the hand formula (a stack of Linear(D, D): B * D * D MACs each) and
``FlopCounterMode`` run live (forward + backward); reuse on and off alike."""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import pytest
import torch
from torch import nn

import flopcount
from flopcount.devices.roofline import Roofs

STEP = 0  # a module-level global the forwards advance (``global STEP; STEP += 1``)
LAYERS, B, D = 14, 2, 8
MACS = LAYERS * B * D * D  # forward: one (B, D) x (D, D) product per block
ROOFS = Roofs({"float32": 1e11}, 1e10, "test roofs", "given")


class _Counted(nn.Module):
    #: a base's counter, advanced through the subclass (``type(self).base_calls += 1`` binds a new one on it)
    base_calls = 0


class _Block(_Counted):
    calls = 0  # the class's own counter
    seen: Dict[Tuple[int, ...], torch.Tensor] = {}  # a class-level cache filled in place

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global STEP
        STEP += 1
        type(self).calls += 1
        type(self).base_calls += 1
        type(self).seen[tuple(x.shape)] = x
        if self.fail:
            raise ValueError("this block refuses")
        return self.lin(x)


class _Stack(nn.Module):
    def __init__(self, fail_at: int = -1) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block(fail=i == fail_at) for i in range(LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _state() -> Tuple[Any, ...]:
    """What the forwards write outside the model, as the caller sees it."""
    own = vars(_Block)
    cache = tuple((key, id(value)) for key, value in own["seen"].items())
    return STEP, own.get("calls"), own.get("base_calls", "not bound"), _Counted.base_calls, id(own["seen"]), cache


def _live_flops(backward: bool) -> int:
    """FlopCounterMode's contraction FLOPs of one forward (and backward), run live on a stack of
    the same Linear layers that writes nothing outside itself."""
    from torch.utils.flop_counter import FlopCounterMode

    plain = nn.Sequential(*(nn.Linear(D, D) for _ in range(LAYERS)))
    counter = FlopCounterMode(display=False)
    with counter:
        out = plain(X)
        if backward:
            out.sum().backward()
    return counter.get_total_flops()


def _blocks_timed(result: Any) -> int:
    """How many blocks module_latency timed once per forward."""
    return sum(1 for row in result.modules if row.type_name == "_Block" and row.calls == 1)


MODEL = _Stack()
X = torch.randn(B, D)
LIVE_TRAINING = _live_flops(backward=True)

# each reading of MODEL on X, with the figure it must give and that figure's oracle
READINGS: Dict[str, Tuple[Callable[[nn.Module], Any], Callable[[Any], Any], Any]] = {
    "count_flops": (lambda m: flopcount.count_flops(m, (X,)), lambda r: r.macs, MACS),
    "count_flops_dispatch": (lambda m: flopcount.count_flops(m, (X,), tracer="dispatch"), lambda r: r.macs, MACS),
    "count_flops_jit": (lambda m: flopcount.count_flops(m, (X,), tracer="jit"), lambda r: r.macs, MACS),
    "count_flops_backward": (lambda m: flopcount.count_flops(m, (X,), backward=True), lambda r: 2 * r.macs, LIVE_TRAINING),
    "predict": (lambda m: flopcount.predict(m, (X,), on=ROOFS), lambda r: r.column_sum("macs"), MACS),
    "estimate_memory": (lambda m: flopcount.estimate_memory(m, (X,)), lambda r: r.params, LAYERS * (D * D + D)),
    "estimate_memory_backward": (lambda m: flopcount.estimate_memory(m, (X,), backward=True), lambda r: r.params,
                                 LAYERS * (D * D + D)),
    "profile": (lambda m: flopcount.profile(m, X, roofs=ROOFS, warmup=1, steps=2), lambda r: r.flops, 2 * MACS),
    "benchmark": (lambda m: flopcount.benchmark(m, X, iters=2, warmup=1), lambda r: r.iters, 2),
    "module_latency": (lambda m: flopcount.module_latency(m, X, iters=2, warmup=1), _blocks_timed, LAYERS),
}  # fmt: skip


@pytest.fixture(params=["on", "off"])
def reuse(request: Any, monkeypatch: Any) -> str:
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1" if request.param == "on" else "0")
    return request.param


@pytest.mark.parametrize("reading", sorted(READINGS))
def test_a_reading_leaves_class_data_and_globals_as_found(reading: str, reuse: str) -> None:
    run, figure, expected = READINGS[reading]
    before = _state()
    result = run(MODEL)
    assert _state() == before
    assert figure(result) == expected


@pytest.mark.parametrize("reading", sorted(READINGS))
def test_a_forward_that_raises_leaves_them_as_found_too(reading: str, reuse: str) -> None:
    run, _, _ = READINGS[reading]
    failing = _Stack(fail_at=7)
    before = _state()
    with pytest.raises(Exception):
        run(failing)
    assert _state() == before


@pytest.mark.parametrize("fail_at", [-1, 7])
def test_plan_leaves_them_as_found(fail_at: int, reuse: str) -> None:
    before = _state()
    if fail_at < 0:
        result = flopcount.plan(lambda: _Stack(), (X,), fsdp=2, on=None)
        assert result.flops["forward"] == 2 * MACS + B * D  # and the default loss: the sum of the (B, D) output
    else:
        with pytest.raises(Exception):
            flopcount.plan(lambda: _Stack(fail_at=fail_at), (X,), fsdp=2, on=None)
    assert _state() == before


def test_a_class_level_cache_is_given_back_its_entries() -> None:
    """The choice documented in docs/internals.md ("left as found"): a dict, list or set the class
    holds keeps its identity and gets its entries back; before, a count left a fake tensor in it,
    which the caller's next real call would have read."""
    _Block.seen.clear()
    cache = _Block.seen
    flopcount.count_flops(MODEL, (X,))
    assert _Block.seen is cache and cache == {}


def _counting_llama() -> nn.Module:
    """test_generation's tiny LLaMA whose decoder layers count their calls on their class and in
    :data:`STEP` (their class swapped for a subclass that does)."""
    from test_generation import _llama
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    class CountingLayer(LlamaDecoderLayer):
        calls = 0

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            global STEP
            STEP += 1
            type(self).calls += 1
            return super().forward(*args, **kwargs)

    model = _llama("cpu")
    for layer in model.model.layers:
        layer.__class__ = CountingLayer
    return model


def test_count_generation_and_serve_leave_them_as_found(reuse: str) -> None:
    pytest.importorskip("transformers")
    from test_generation import VOCAB, N, P, prefill_macs, step_macs
    from test_generation import B as LLAMA_B

    model = _counting_llama()
    kind = type(model.model.layers[0])
    ids = torch.randint(0, VOCAB, (LLAMA_B, P))
    before = STEP, kind.calls
    result = flopcount.count_generation(model, ids, new_tokens=N)
    assert (STEP, kind.calls) == before
    assert result.macs == prefill_macs() + sum(step_macs(s) for s in range(N - 1))
    served = flopcount.serve(model, ids, N, on="h100", batch=[LLAMA_B])
    assert (STEP, kind.calls) == before
    assert served.facts.prefill.macs == prefill_macs() / LLAMA_B  # per sequence
    model(ids)  # the oracle's premise: the model's own call advances both
    assert (STEP, kind.calls) == (before[0] + 2, before[1] + 2)
