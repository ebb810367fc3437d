"""plan() of a model whose forward never calls some of its parameters' modules: (a) a layer of
the repeated stack skipped (``continue`` at block 6 of 8: FSDP2 wraps it and it never runs),
(b) an unused head (``pooler``: its parameters are the root's, sharded with the root's group).

Before: (a) failed with ``AttributeError: 'FSDPParam' object has no attribute
'_unsharded_param'`` (torch's FSDPMemTracker read the unsharded copy of a group FSDP2 never
all-gathered, where FSDP2 itself checks for it and skips the group); (b) planned, with optimizer
state for the pooler that no real run makes (torch's optimizers skip a parameter without a
gradient), so state bytes and peak were high by its AdamW state. The real run's figures are
tests/plan/test_plan_skipped_gloo.py's (2 gloo ranks); here the oracles are hand counts and, for
one rank, torch's MemTracker on a real training loop in this process.

The hand counts (float32, 4 bytes; fsdp=2 shards dim 0 of each parameter over the 2 ranks; a
block is Linear(64, 64): 64*64 + 64 = 4160 elements, 16640 bytes, 8320 bytes a rank):

(a) SkippedLayer, 8 blocks, block 6 never runs: parameters 8 * 8320 = 66560; gradients
    7 * 8320 = 58240 (FSDP2 gives the never-run block none); AdamW state exp_avg + exp_avg_sq
    of the 7 blocks with gradients, 2 * 58240, plus one float32 ``step`` per parameter tensor
    (7 blocks * 2 tensors * 4 bytes = 56): 116536. Collectives: each of the 7 run blocks is
    all-gathered in forward and again in backward (resharded after forward) = 14 all-gathers of
    16640 bytes; 7 reduce-scatters of 16640 bytes (nothing for block 6).
(b) UnusedHead, 8 blocks + head Linear(64, 64) + pooler Linear(64, 32) (64*32 + 32 = 2080
    elements, 4160 bytes a rank): parameters 8 * 8320 + 8320 + 4160 = 79040; gradients 79040 -
    4160 = 74880; AdamW 2 * 74880 + 18 tensors * 4 = 149832. Collectives: the root group
    (head + pooler, 6240 elements = 24960 bytes) is all-gathered once (the root is not resharded
    after forward), each block twice: 17 all-gathers, 24960 + 16 * 16640 = 291200 bytes;
    reduce-scatters: 8 blocks + the root's, whose input holds only the head's gradient (FSDP2
    reduce-scatters the parameters that have one): 8 * 16640 + 16640 = 149760 bytes, 9 calls.
    Its 8 blocks are replayed (flopcount.step.replay) unless FLOPCOUNT_REUSE=0; (a)'s forward
    treats block 6 otherwise, so (a) is traced in full either way.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict

import pytest
import torch
from _live_oracles import loop_peaks
from _plan_gloo import SkippedLayer, UnusedHead, example_input

import flopcount

pytestmark = pytest.mark.usefixtures("replay_from_six_layers")  # 8 blocks replayed (conftest)

BLOCK = 8320  # one Linear(64, 64) block's bytes on one of 2 ranks
POOLER = 4160  # the pooler's bytes on one of 2 ranks

#: (builder, state bytes, {collective kind: (calls, tensor bytes)}) at fsdp=2: the docstring's counts
EXPECTED: Dict[str, Any] = {
    "skipped_layer": (
        SkippedLayer,
        {"parameters": 8 * BLOCK, "gradients": 7 * BLOCK, "optimizer_state": 2 * 7 * BLOCK + 7 * 2 * 4},
        {"all_gather": (14, 14 * 2 * BLOCK), "reduce_scatter": (7, 7 * 2 * BLOCK)},
    ),
    "unused_head": (
        UnusedHead,
        {"parameters": 9 * BLOCK + POOLER, "gradients": 9 * BLOCK, "optimizer_state": 2 * 9 * BLOCK + 18 * 4},
        {"all_gather": (17, 2 * (BLOCK + POOLER) + 16 * 2 * BLOCK), "reduce_scatter": (9, 9 * 2 * BLOCK)},
    ),
}


def _plan(name: str, **options: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP2's "returned a view tensor" (ReLU's output)
        return flopcount.plan(EXPECTED[name][0], (example_input(name),), on=None, **options)


@pytest.mark.parametrize("reuse", ["1", "0"], ids=["replay", "every-layer"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fsdp2_plan_of_a_model_with_a_module_never_called(name: str, reuse: str, monkeypatch: Any) -> None:
    monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
    planned = _plan(name, fsdp=2)
    _, state, comm = EXPECTED[name]
    assert dict(planned.state_bytes) == state
    assert {row.kind: (row.calls, row.tensor_bytes) for row in planned.comm} == comm
    # the optimizer state is held through the whole step: at the peak it is all of it
    assert planned.memory["optimizer_state"] == state["optimizer_state"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fsdp2_with_tp_plan_of_a_model_with_a_module_never_called(name: str) -> None:
    """fsdp=2 x tp=2: each block's Linear column-parallel over tp, then sharded over dp: a block's
    4160 elements are 1040 on a rank (4160 bytes); the head and pooler are FSDP's only (dp=2):
    8320 and 4160 bytes. AdamW as in the module docstring."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel

    tp_plan = {"layers.*.0": ColwiseParallel(output_layouts=Replicate())}
    planned = _plan(name, fsdp=2, tp=2, tp_plan=tp_plan)
    block = BLOCK // 2
    if name == "skipped_layer":
        state = {"parameters": 8 * block, "gradients": 7 * block, "optimizer_state": 2 * 7 * block + 7 * 2 * 4}
    else:
        with_grad = 8 * block + BLOCK
        state = {"parameters": with_grad + POOLER, "gradients": with_grad, "optimizer_state": 2 * with_grad + 18 * 4}
    assert dict(planned.state_bytes) == state


def _real_steady_peak(x: torch.Tensor) -> int:
    """torch's MemTracker on a real loop of UnusedHead (as tests/plan/test_plan_steady_state.py):
    the third step's peak, the steady state's."""
    torch.manual_seed(0)
    model = UnusedHead().train()
    peaks, opt = loop_peaks(model, x)
    assert peaks[1] == peaks[2]
    assert not any(p in opt.state for p in model.pooler.parameters())  # AdamW never made the pooler's state
    return peaks[2]


def test_one_rank_plan_of_an_unused_head_is_the_real_steady_state_peak() -> None:
    x = example_input("unused_head")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = _real_steady_peak(x)
    planned = _plan("unused_head")
    # one rank: 9 Linear(64, 64) of 4160 elements with gradients, AdamW's 2 tensors each + 18 steps
    assert planned.state_bytes["optimizer_state"] == 2 * 9 * 4160 * 4 + 18 * 4
    assert planned.peak_bytes == real
