"""Issue #27 ("one engine, finished", branch onerule): a real run of the caller's model is set up
in one place (``flopcount/tracers/_real_run.py``), and every path that runs it gives back the
same: ``count_flops`` with tracer "dispatch", "jit" and "auto" (its real run after the fakes gave
up on a value read), and the decoding loop's uncounted forward (``Counter.catch_up``, which ran
the forward for its output only with a hand-written copy of the setup).

The same misbehaving model goes through each path, so the paths cannot drift apart unseen: its
forward writes everything a forward can write (train-mode BatchNorm statistics, a dropout draw,
an attribute, a hook registered on a submodule, the caller's input in place). Oracles: the model
called plainly does write each of those (``test_the_forward_writes_what_the_paths_give_back``),
conftest's ``snapshot``/``assert_same_state``, the process's RNG state and the input's values read
before the run; a failure's TraceError text, the same through the dispatch tracer and the catch-up."""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Dict

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount import FlopcountWarning, TraceError, count_flops
from flopcount.core.inputs import prepare_call
from flopcount.decoding.counted import Counter


class _Writes(nn.Module):
    """A forward that writes to the model, the process and its input; ``fail``: ``head`` raises;
    ``threaded``: ``head`` runs in a thread of the forward's own (the model in use elsewhere)."""

    def __init__(self, fail: bool = False, threaded: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(4, 2)
        self.fail = fail
        self.threaded = threaded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = tuple(x.shape)
        self.lin.register_forward_hook(_no_op)
        x.mul_(2)
        hidden = self.drop(self.bn(self.lin(x)))
        if bool(hidden.sum() > 0):  # a value read: fake tensors have none, "auto" runs it for real
            hidden = hidden + 1
        if self.fail:
            raise RuntimeError("boom in the forward")
        if self.threaded:
            done: Dict[str, torch.Tensor] = {}
            worker = threading.Thread(target=lambda: done.update(out=self.head(hidden)))
            worker.start()
            worker.join()
            return done["out"]
        return self.head(hidden)


def _no_op(module: nn.Module, args: Any, output: Any) -> None:
    return None


def _prepared(model: nn.Module) -> nn.Module:
    model.train()
    model.head.eval()  # mixed flags must survive
    model.head.weight.grad = torch.full_like(model.head.weight, 3.0)
    return model


def _dispatch(model: nn.Module, x: torch.Tensor) -> None:
    count_flops(model, kwargs={"x": x}, tracer="dispatch")


def _jit(model: nn.Module, x: torch.Tensor) -> None:
    count_flops(model, kwargs={"x": x}, tracer="jit")


def _auto(model: nn.Module, x: torch.Tensor) -> None:
    result = count_flops(model, kwargs={"x": x})
    assert any(w.startswith("tracer auto: counted one real run (dispatch)") for w in result.warnings)


def _catch_up(model: nn.Module, x: torch.Tensor) -> None:
    """The decoding loop's forward run for its output only: it must take the uncounted path."""
    assert Counter(model)._run_uncounted(prepare_call((), {"x": x})) is True


PATHS: Dict[str, Callable[[nn.Module, torch.Tensor], None]] = {
    "dispatch": _dispatch, "jit": _jit, "auto": _auto, "catch_up": _catch_up,
}


def test_the_forward_writes_what_the_paths_give_back() -> None:
    """The oracle: called plainly, the forward changes each thing the paths must give back."""
    model = _prepared(_Writes())
    before = snapshot(model)
    x = torch.randn(8, 4)
    given = x.clone()
    rng = torch.get_rng_state()
    model(x)
    assert not torch.equal(model.bn.running_mean, before["state"]["bn.running_mean"])
    assert model.bn.num_batches_tracked.item() == 1
    assert not torch.equal(torch.get_rng_state(), rng)
    assert model.seen == (8, 4)
    assert len(model.lin._forward_hooks) == 1
    assert torch.equal(x, given * 2)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_real_run_gives_everything_back(path: str) -> None:
    model = _prepared(_Writes())
    before = snapshot(model)
    x = torch.randn(8, 4)
    given = x.clone()
    rng = torch.get_rng_state()
    grad_mode = torch.is_grad_enabled()
    PATHS[path](model, x)
    assert_same_state(model, before)
    assert model.bn.num_batches_tracked.item() == 0
    assert torch.equal(torch.get_rng_state(), rng), "the forward's dropout draw reached the process's RNG"
    assert not hasattr(model, "seen")
    assert torch.equal(x, given) and x.grad is None and not x.requires_grad
    assert torch.is_grad_enabled() == grad_mode


@pytest.mark.parametrize("path", sorted(set(PATHS) - {"jit"}))
def test_each_real_run_leaves_a_model_used_elsewhere_as_that_thread_has_it(path: str) -> None:
    """A module of the run called by another thread meanwhile: nothing is written back, and a
    warning says so, whichever path ran it (not jit: torch.jit cannot trace what another
    thread computes, and refuses its output as a constant)."""
    model = _prepared(_Writes(threaded=True))
    x = torch.randn(8, 4)
    with pytest.warns(FlopcountWarning, match="the model ran in another thread while flopcount ran it for real"):
        PATHS[path](model, x)


def _failure(run: Callable[[], None]) -> str:
    with pytest.raises(TraceError) as caught:
        run()
    assert caught.value.module_path == ""
    return str(caught.value)


def test_a_failing_forward_is_the_same_error_through_the_tracer_and_the_catch_up() -> None:
    model = _prepared(_Writes(fail=True))
    before = snapshot(model)
    x = torch.randn(8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = _failure(lambda: _dispatch(model, x))
        auto = _failure(lambda: count_flops(model, kwargs={"x": x}))
        uncounted = _failure(lambda: _catch_up(model, x))
    described = prepare_call((), {"x": x}).description
    def expected(tracer: str) -> str:
        return f"forward failed in the root module (model) ({tracer}) with inputs {described}: RuntimeError: boom in the forward"

    # one wording; the tracer named is the one chosen (count_flops' default is auto: branch papercuts3)
    assert traced == uncounted == expected("dispatch tracer")
    assert auto == expected("auto tracer")
    assert_same_state(model, before)
