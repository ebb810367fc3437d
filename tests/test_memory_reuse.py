"""Issue #32 for ``estimate_memory`` and ``plan``: the optimizer's warm-up (the step that makes
its state before the measured step, so every step is sized in the steady state) steps one
parameter per kind on fake tensors and clones its state for the others.

Oracles: the number of parameters a full step would step is counted by hand from the model
(every trainable parameter); the kinds by hand from the layer shapes; the state a full warm-up
makes is torch's own ``opt.step()`` on every parameter (reuse off); and the readings are the
same to the byte with the reuse on and off (``FLOPCOUNT_REUSE=0``), on tiny LLaMA / GPT-2 /
encoder stacks, batch > 1, several optimizers, with and without autocast. The live MemTracker
oracle of the steady-state step is tests/plan/test_plan_steady_state.py (unchanged, reuse on).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from torch import nn

from flopcount.memory.estimate import estimate_memory
from flopcount.step.optimizers import build_optimizer, warm_up

sys.path.insert(0, str(Path(__file__).resolve().parent / "plan"))
from _plan_gloo import BATCH, SEQ, VOCAB, tiny_encoder, tiny_gpt2, tiny_llama

pytestmark = pytest.mark.usefixtures("replay_from_six_layers")  # 6-7-layer stacks, replayed with the reuse on (conftest)


def _stack(layers: int = 6) -> nn.Module:
    return nn.Sequential(*[nn.Linear(32, 32) for _ in range(layers)], nn.Linear(32, 8))


def _fake_optimizer(model: nn.Module, spec: Any) -> Tuple[Any, torch.optim.Optimizer, List[torch.Tensor]]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        params = [torch.empty_strided(p.shape, p.stride(), dtype=p.dtype).requires_grad_(p.requires_grad) for p in model.parameters()]
        opt, _ = build_optimizer(spec, {}, [p for p in params if p.requires_grad], "test")  # in the mode, as estimate_memory
    return mode, opt, params


def _stepped(opt: torch.optim.Optimizer) -> List[int]:
    """How many parameters had a gradient at each ``opt.step()`` (what the step walks)."""
    seen: List[int] = []
    opt.register_step_pre_hook(
        lambda o, args, kwargs: seen.append(sum(p.grad is not None for g in o.param_groups for p in g["params"]))
    )
    return seen


def _value(scalar: torch.Tensor) -> Any:
    """A fake scalar's value where fake tensors keep one (a constant), else None."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    try:
        return scalar.item()
    except DataDependentOutputException:
        return None


def _state_meta(opt: torch.optim.Optimizer, params: List[torch.Tensor]) -> List[Any]:
    """Per parameter in order: its state keys, each tensor's metadata (and a scalar's value)."""
    out = []
    for p in params:
        entry = []
        for key, value in opt.state.get(p, {}).items():
            if isinstance(value, torch.Tensor):
                scalar = _value(value) if value.dim() == 0 else None
                entry.append((key, tuple(value.shape), value.stride(), value.dtype, value.device, scalar))
            else:
                entry.append((key, value))
        out.append(entry)
    return out


@pytest.mark.parametrize(
    "spec",
    ["adamw", "adam", "sgd-momentum", torch.optim.RMSprop, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax,
     torch.optim.Adadelta, "adagrad"],
)
def test_warm_up_steps_one_parameter_per_kind_and_makes_the_full_state(spec: Any) -> None:
    # by hand: 6 Linear(32, 32) + Linear(32, 8) = 14 trainable parameters of 4 kinds
    # (32x32 weight, 32 bias, 8x32 weight, 8 bias); a full warm-up steps all 14
    model = _stack()
    mode, full_opt, full_params = _fake_optimizer(model, spec)
    with mode:
        full_seen = _stepped(full_opt)
        warm_up(full_opt, "test", reuse=False)
    mode, opt, params = _fake_optimizer(model, spec)
    with mode:
        seen = _stepped(opt)
        warm_up(opt, "test", reuse=True)
    assert full_seen == [14] and seen == [4]
    assert list(opt.state) == params == [p for g in opt.param_groups for p in g["params"]]  # in step order
    assert _state_meta(opt, params) == _state_meta(full_opt, full_params)
    assert all(p.grad is None for p in params)
    storages = [v.untyped_storage()._cdata for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert len(set(storages)) == len(storages)  # one storage per state tensor, as a full warm-up makes


def test_warm_up_reuse_is_off_with_the_switch_and_for_other_optimizers(monkeypatch: pytest.MonkeyPatch) -> None:
    class MyAdam(torch.optim.Adam):  # a subclass may keep state across parameters: stepped in full
        pass

    model = _stack()
    mode, opt, _ = _fake_optimizer(model, MyAdam)
    with mode:
        seen = _stepped(opt)
        warm_up(opt, "test", reuse=True)
    assert seen == [14]
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    mode, opt, _ = _fake_optimizer(model, "adamw")
    with mode:
        seen = _stepped(opt)
        warm_up(opt, "test", reuse=True)
    assert seen == [14]


def test_frozen_and_grouped_parameters_keep_their_kinds() -> None:
    # two groups (different lr): a kind never crosses a group; frozen parameters get no state
    model = _stack()
    model[0].requires_grad_(False)
    mode, _, params = _fake_optimizer(model, "adam")
    trainable = [p for p in params if p.requires_grad]
    with mode:
        opt = torch.optim.Adam([{"params": trainable[:4]}, {"params": trainable[4:], "lr": 0.1}])
        seen = _stepped(opt)
        warm_up(opt, "test", reuse=True)
        full = torch.optim.Adam([{"params": trainable[:4]}, {"params": trainable[4:], "lr": 0.1}])
        warm_up(full, "test", reuse=False)
    # by hand: group 0 = layers 1-2 (kinds: 32x32, 32), group 1 = layers 3-5 and the head
    # (32x32, 32, 8x32, 8): 6 parameters stepped of 12
    assert seen == [6]
    assert _state_meta(opt, params) == _state_meta(full, params)
    assert params[0] not in opt.state and params[1] not in opt.state


def _llama_call() -> Tuple[Callable[[], nn.Module], Tuple[Any, ...], Dict[str, Any]]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return tiny_llama, (), {"input_ids": ids, "labels": ids}


def _gpt2_call() -> Tuple[Callable[[], nn.Module], Tuple[Any, ...], Dict[str, Any]]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return lambda: tiny_gpt2(tied=True), (ids,), {}


def _encoder_call() -> Tuple[Callable[[], nn.Module], Tuple[Any, ...], Dict[str, Any]]:
    return tiny_encoder, (torch.randn(BATCH, SEQ, 64, generator=torch.Generator().manual_seed(2)),), {}


CASES = {"llama": _llama_call, "gpt2-tied": _gpt2_call, "encoder": _encoder_call}
OPTIMIZERS: Dict[str, Any] = {
    "adamw": "adamw",
    "sgd-momentum": "sgd-momentum",
    "nadam": lambda ps: torch.optim.NAdam(ps, lr=0.01),
    "rmsprop": torch.optim.RMSprop,
}


def _both(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], Any]) -> Tuple[Any, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
        on = fn()
        monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
        off = fn()
    return on, off


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "autocast-bf16"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("case", list(CASES))
def test_estimate_memory_is_the_same_to_the_byte_with_reuse_on_and_off(
    monkeypatch: pytest.MonkeyPatch, case: str, optimizer: str, autocast: Any
) -> None:
    build, args, kwargs = CASES[case]()
    torch.manual_seed(0)
    model = build().train()
    on, off = _both(
        monkeypatch,
        lambda: estimate_memory(model, args, kwargs, backward=True, optimizer=OPTIMIZERS[optimizer], autocast=autocast),
    )
    assert on == off  # peak, categories at the peak, peak module and phase, every module's figures


@pytest.mark.parametrize("fsdp,tp", [(2, 1), (2, 2)])
@pytest.mark.parametrize("case", ["llama", "gpt2-tied"])
def test_plan_per_rank_figures_are_the_same_with_reuse_on_and_off(
    monkeypatch: pytest.MonkeyPatch, case: str, fsdp: int, tp: int
) -> None:
    import flopcount

    build, args, kwargs = CASES[case]()
    ids = kwargs.get("input_ids", args[0] if args else None)
    on, off = _both(monkeypatch, lambda: flopcount.plan(build, (ids,), fsdp=fsdp, tp=tp, on="h100", link="nvlink4"))
    assert on == off  # peak and categories, state bytes, FLOPs by phase and operator, collectives, times
