"""Issue #32 (headreplay): a stack whose first layers are of other kinds (DeepSeek-V2/V3, Kimi-K2,
GLM-4.5-MoE: ``first_k_dense_replace`` dense MLP layers, then mixture-of-experts layers) is replayed
from the layers after that *head* (flopcount.step.replay: ``Stack.head``; the head's layers run as
they are in every cut run, the run's layer ``i`` is the list's layer ``head + i``), with the same
exactness check as a stack without one; a head that changes with the stack's depth is traced in full.

How the replay is observed: ``estimate_memory``'s ``_layered`` and ``plan``'s ``_layered_step`` give
figures only when the replay was taken (tests/_layer_stacks.py's spies), and ``find_stack``'s head
and period. Oracles: the same reading with ``FLOPCOUNT_REUSE=0`` (every layer traced), compared as
whole values; torch's MemTracker on a real steady-state AdamW step of the toy stacks
(tests/_live_oracles.py).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, List, Optional

import pytest
import torch
from _layer_stacks import LayerList as Net
from _layer_stacks import (
    assert_adamw_estimate_replayed_exactly,
    estimates_on_and_off,
    plans_on_and_off,
    spy_on_plan_replay,
)
from conftest import REPLAY_TESTS_MIN_LAYERS, assert_same_state, snapshot
from torch import nn

import flopcount
from flopcount.step import replay

pytest.importorskip("torch.distributed._tools.mem_tracker")

WIDTH = 32


class Windowed(nn.Module):
    """An MLP that, where it has a ``window`` (an int in one layer, None in the next, as Gemma-2's
    ``sliding_window``), gates its hidden units by their first ``window`` ones."""

    def __init__(self, window: Optional[int] = None, hidden: int = 64):
        super().__init__()
        self.window = window
        self.up = nn.Linear(WIDTH, hidden)
        self.down = nn.Linear(hidden, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        if self.window is not None:
            h = h * torch.sigmoid(h[..., : self.window].sum(-1, keepdim=True))
        return self.down(h)


class Dense(nn.Module):
    """A head layer's MLP, of another kind: wider and gated (DeepSeek's dense layers before its MoE ones)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(WIDTH, 96)
        self.up = nn.Linear(WIDTH, 96)
        self.down = nn.Linear(96, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class DepthReading(Dense):
    """A head layer's MLP that reads how many layers its stack holds (a plain reference to the list,
    not a submodule) and holds one copy of its input per layer at once: the cut runs' head differs
    from the whole model's, in its ops and its bytes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        copies = [x * 1.0 for _ in range(len(self.__dict__["stack"]))]
        return super().forward(torch.stack(copies).mean(0))


class Block(nn.Module):
    """A residual block around an MLP: one class for every layer, the MLP's kind differing (as
    transformers' DeepSeek-V3 decoder layer holds a dense MLP or a mixture of experts)."""

    def __init__(self, layer_idx: int, mlp: nn.Module):
        super().__init__()
        self.layer_idx = layer_idx  # differs in every layer: hidden from the cut runs
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


def _blocks(mlps: List[nn.Module]) -> Net:
    return Net([Block(i, mlp) for i, mlp in enumerate(mlps)])


#: the units after the head in the toy stacks: the tests' floor (conftest's replay_from_six_layers),
#: 2 units past the template's 3 and the check's 4, which the replay materializes and neither cut run
#: traced (these stacks held 24 layers after the head, for the default floor of 12 units, which is
#: test_a_head_is_taken_only_where_the_whole_list_is_not_a_run_and_the_run_holds_enough_units's)
UNITS = REPLAY_TESTS_MIN_LAYERS


def dense_head_then_identical() -> Net:
    """2 dense layers, then 6 identical ones: head 2, period 1, 6 units."""
    return _blocks([Dense(), Dense()] + [Windowed() for _ in range(UNITS)])


def dense_head_then_alternating() -> Net:
    """1 dense layer, then 12 layers windowed and full in turn: head 1, period 2, 6 units."""
    return _blocks([Dense()] + [Windowed(4 if i % 2 == 0 else None) for i in range(2 * UNITS)])


def depth_reading_head() -> Net:
    """A head layer that holds one copy of its input per layer of its stack, then 6 identical layers."""
    reading = DepthReading()
    net = _blocks([reading, Dense()] + [Windowed() for _ in range(UNITS)])
    object.__setattr__(reading, "stack", net.layers)  # in __dict__, not _modules: no module reachable twice
    return net


STACKS = {
    "head-2-period-1": (dense_head_then_identical, (2, 1, UNITS)),
    "head-1-period-2": (dense_head_then_alternating, (1, 2, UNITS)),
    "head-reads-depth": (depth_reading_head, None),
}


def _shape(stack: Optional[replay.Stack]) -> Any:
    return None if stack is None else (stack.head, stack.period, stack.units)


@pytest.mark.usefixtures("replay_from_six_layers")
@pytest.mark.parametrize("case", list(STACKS))
def test_estimate_memory_replays_the_run_after_a_head_with_the_same_figures(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    build, shape = STACKS[case]
    torch.manual_seed(0)
    model = build()
    stack = replay.find_stack(model)
    assert stack is not None
    assert _shape(stack) == (shape or (2, 1, UNITS))  # the depth-reading head is found too: the check refuses it
    assert stack.units > replay.Template.UNITS + 1  # units the replay materializes, traced by neither cut run
    x = torch.randn(8, WIDTH)
    assert_adamw_estimate_replayed_exactly(monkeypatch, model, x, replayed=shape is not None)


@pytest.mark.usefixtures("replay_from_six_layers")
@pytest.mark.parametrize("case", list(STACKS))
def test_plan_replays_the_run_after_a_head_with_the_same_figures(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    build, shape = STACKS[case]
    assert _shape(replay.find_stack(build())) == (shape or (2, 1, UNITS))
    x = torch.randn(8, WIDTH)
    on, off, used = plans_on_and_off(monkeypatch, build, (x,), fsdp=2, on="h100", link="nvlink4")
    assert used == [shape is not None, False]
    assert on == off  # peak, memory categories, state bytes, FLOPs, collectives, times


def test_a_head_is_taken_only_where_the_whole_list_is_not_a_run_and_the_run_holds_enough_units() -> None:
    """A list that is one run keeps no head (as before heads were tried); a head before 11 identical
    layers leaves a run under the floor (12 units): no stack; the floor counts the run's units only."""
    whole = replay.find_stack(_blocks([Windowed() for _ in range(replay.MIN_LAYERS)]))
    short = replay.find_stack(_blocks([Dense()] + [Windowed() for _ in range(replay.MIN_LAYERS - 1)]))
    enough = replay.find_stack(_blocks([Dense()] + [Windowed() for _ in range(replay.MIN_LAYERS)]))
    assert [_shape(whole), _shape(short), _shape(enough)] == [(0, 1, replay.MIN_LAYERS), None, (1, 1, replay.MIN_LAYERS)]


def _deepseek(dense: int, layers: int, key_value_heads: int = 4) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.for_model(
            "deepseek_v3", num_hidden_layers=layers, first_k_dense_replace=dense, hidden_size=64, intermediate_size=128,
            moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
            num_attention_heads=4, num_key_value_heads=key_value_heads, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=16, vocab_size=128, max_position_embeddings=64, use_cache=False,
        )
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config).train()

    return build


@pytest.mark.usefixtures("replay_from_six_layers")
@pytest.mark.parametrize("dense", [1, 3])
def test_deepseek_v3_estimate_replayed_after_its_dense_layers_with_the_same_figures(monkeypatch: pytest.MonkeyPatch, dense: int) -> None:
    """A tiny DeepSeek-V3 (4 routed experts): ``first_k_dense_replace`` dense layers, then 6 MoE
    layers (the floor lowered to 6 units: conftest's replay_from_six_layers, to keep it fast)."""
    model = _deepseek(dense, dense + replay.MIN_LAYERS)()
    assert _shape(replay.find_stack(model)) == (dense, 1, replay.MIN_LAYERS)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    before = snapshot(model)
    on, off, used = estimates_on_and_off(monkeypatch, model, (ids,), {}, backward=True, optimizer="adamw")
    assert used == [True, False]
    assert on == off
    assert_same_state(model, before)


@pytest.mark.usefixtures("replay_from_six_layers")
@pytest.mark.parametrize("dense", [1, 3])
def test_deepseek_v3_plan_replayed_after_its_dense_layers_with_the_same_figures(monkeypatch: pytest.MonkeyPatch, dense: int) -> None:
    build = _deepseek(dense, dense + replay.MIN_LAYERS)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    plan_on, plan_off, planned = plans_on_and_off(monkeypatch, build, (ids,), fsdp=2)
    assert planned == [True, False]
    assert plan_on == plan_off


@pytest.mark.usefixtures("replay_from_six_layers")
@pytest.mark.parametrize("dense", [0, 1])
def test_deepseek_v3_with_fewer_key_value_heads_plan_replayed_with_the_same_figures(monkeypatch: pytest.MonkeyPatch, dense: int) -> None:
    """mlawalk: a tiny DeepSeek-V3 whose config has 2 key/value heads for 4 query heads (the
    zoo's tiny configs of deepseek_v2/v3, axk1, glm4_moe_lite, sarvam_mla). Its multi-head latent
    attention expands K and V to every query head and ignores the count, but transformers' SDPA
    integration repeats them by ``num_attention_heads // num_key_value_heads`` where a mask is
    materialised: the branch transformers keeps for tracing, which plan's parent walk took (it
    did not answer transformers' "is tracing" probe as the step does), so the walk failed and the
    step was traced in full. The step itself runs the real branch (no mask, SDPA's is_causal):
    the walk now takes it too and the replay is taken, every figure as with the reuse off."""
    build = _deepseek(dense, dense + replay.MIN_LAYERS, key_value_heads=2)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    plan_on, plan_off, planned = plans_on_and_off(monkeypatch, build, (ids,), fsdp=2)
    assert planned == [True, False]
    assert plan_on == plan_off


@pytest.mark.usefixtures("replay_from_six_layers")
def test_deepseek_v3_with_fewer_key_value_heads_and_a_padded_mask_fails_as_transformers_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a padded attention mask the real forward of that config materialises the mask and
    repeats the already expanded K and V: transformers itself fails (nothing of flopcount's).
    The replay is refused (the walk fails as the forward does) and plan says the step failed,
    with the reuse on as off."""
    from flopcount.errors import TraceError

    build = _deepseek(1, 1 + replay.MIN_LAYERS, key_value_heads=2)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :3] = 0  # the first sequence padded on the left
    with pytest.raises(RuntimeError, match="must match the size"):
        build()(ids, attention_mask=mask)
    planned = spy_on_plan_replay(monkeypatch)
    for reuse in ("1", "0"):
        monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
        with warnings.catch_warnings(), pytest.raises(TraceError, match="must match the size"):
            warnings.simplefilter("ignore")
            flopcount.plan(build, (ids,), {"attention_mask": mask}, fsdp=2)
    assert planned == [False, False]
