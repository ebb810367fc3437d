"""MFU beside HFU (issue #28 item 6), each numerator derived by hand.

MFU counts model FLOPs: 3 x the forward of the model as written, unsharded, on the rank's
micro-batch, / tp (PaLM's 6N + 12·L·H·Q·T per token is 3 x its forward). HFU counts every FLOP
the rank ran: recomputation under activation checkpointing, work replicated on TP ranks.
Before, plan's "MFU" was forward + backward as run: the HFU."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

import flopcount

D, L, B, S, V = 32, 2, 2, 8, 96
N = B * S  # tokens of one micro-batch
BLOCK = 2 * N * D * 4 * D + 2 * N * 4 * D * D  # up [D -> 4D] and down [4D -> D], no bias: 16·N·D² FLOPs


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, 4 * D, bias=False)
        self.down = nn.Linear(4 * D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up(x))


class Net(nn.Module):
    def __init__(self, checkpointed: str = "", head: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.head = nn.Linear(D, V, bias=False) if head else None
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.checkpointed:
                with set_checkpoint_early_stop(self.checkpointed == "early-stop"):
                    x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x) if self.head is not None else x


def _plan(checkpointed: str) -> flopcount.PlanResult:
    x = torch.randn(B, S, D)
    return flopcount.plan(lambda: Net(checkpointed), (x,), optimizer=None, on="h100")


#: FLOPs each checkpointed block runs again in the backward. Without early stop: its whole
#: forward. With early stop (torch's default), recomputation stops once every tensor the block
#: saved for backward is back: `down` saves `up`'s output, nothing saves `down`'s, so only
#: `up` (2·N·D·4D) runs again.
RECOMPUTE = {"": 0, "full": BLOCK, "early-stop": 2 * N * D * 4 * D}


@pytest.mark.parametrize("checkpointed", ["", "full", "early-stop"], ids=["plain", "checkpointed", "early-stop"])
def test_activation_checkpointing_adds_its_recompute_to_hfu_only(checkpointed: str) -> None:
    result = _plan(checkpointed)
    # forward: the blocks, and the default loss's sum over N·D outputs (one FLOP per element)
    forward = L * BLOCK + N * D
    # backward: each Linear's dW and dX (2x its forward), less block 0's dX of `up` (the input
    # does not require grad: 2·N·D·4D); sum's backward is an expand (0)
    backward = 2 * L * BLOCK - 2 * N * D * 4 * D
    recompute = L * RECOMPUTE[checkpointed]
    assert result.flops["forward"] == forward
    assert result.flops["backward"] == backward + recompute
    assert result.model_flops == 3 * forward  # the same with or without checkpointing
    assert result.total_flops == forward + backward + recompute
    bounds = result.step_time
    assert bounds is not None and bounds.comm_s == 0  # one rank: nothing to communicate, times known
    assert not any("no link" in note for note in result.notes)
    assert bounds.mfu_overlap == pytest.approx(3 * forward / (bounds.overlap_s * bounds.peak_flops))
    assert bounds.hfu_overlap == pytest.approx((forward + backward + recompute) / (bounds.overlap_s * bounds.peak_flops))


def test_checkpointing_changes_hfu_not_mfu() -> None:
    plain, checkpointed = _plan(""), _plan("full")
    assert plain.model_flops == checkpointed.model_flops
    assert checkpointed.total_flops - plain.total_flops == L * BLOCK  # exactly one forward of each block


def test_tp_replicated_head_counts_in_hfu_once_per_rank_and_in_mfu_once() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    x = torch.randn(B, S, D)
    tp_plan = {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}  # the head is not sharded
    result = flopcount.plan(lambda: Net(head=True), (x,), tp=2, tp_plan=tp_plan, optimizer=None, on="h100",
                            link="nvlink4")
    head = 2 * N * D * V
    # each of the 2 ranks: half of every block, the whole head, the loss's sum over N·V logits
    forward = L * BLOCK // 2 + head + N * V
    backward = (2 * L * BLOCK - 2 * N * D * 4 * D) // 2 + 2 * head  # blocks halved; head's dX and dW in full
    assert result.flops["forward"] == forward
    assert result.total_flops == forward + backward
    # model FLOPs: 3 x the unsharded forward (the head once), shared by the 2 ranks
    model_forward = L * BLOCK + head + N * V
    assert result.model_flops == 3 * model_forward // 2
    bounds = result.step_time
    assert bounds is not None
    assert bounds.mfu_no_overlap / bounds.hfu_no_overlap == pytest.approx((3 * model_forward / 2) / (forward + backward))


def test_mfu_numerator_matches_palm_formula_on_a_llama() -> None:
    """PaLM (appendix B), as torchtitan and nanoGPT use it: 6·N + 12·L·H·Q·T FLOPs per token,
    N the parameters outside the embedding (the untied head included). flopcount's model FLOPs
    are 3 x every forward FLOP it counts: the matmul part is exactly PaLM's; the rest is
    3 x the forward's norms, RoPE, SiLU, softmax, residual adds and the loss."""
    from _plan_gloo import tiny_llama

    x = torch.randint(0, 128, (2, 16))
    result = flopcount.plan(tiny_llama, (x,), optimizer=None, on="h100")
    model = tiny_llama()
    layers, heads, head_dim, seq, tokens = 2, 4, 16, 16, 32
    matmul_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    palm = (6 * matmul_params + 12 * layers * heads * head_dim * seq) * tokens
    assert 3 * 2 * result.macs["forward"] == palm  # contractions: PaLM's count to the FLOP
    assert result.model_flops == 3 * result.flops["forward"]
    assert result.model_flops > palm


def test_model_flops_under_tp_are_the_unsharded_model_shared() -> None:
    """tp=1 reads the rank's own forward; tp=2 traces the unsharded model on meta: the same
    model FLOPs, halved (the built-in plan leaves the head and norms replicated, so the rank's
    forward is more than half of tp=1's)."""
    from _plan_gloo import tiny_llama

    x = torch.randint(0, 128, (2, 16))
    one = flopcount.plan(tiny_llama, (x,), optimizer=None, on=None)
    two = flopcount.plan(tiny_llama, (x,), tp=2, optimizer=None, on=None)
    assert two.model_flops == one.model_flops // 2
    assert 2 * two.flops["forward"] > one.flops["forward"]


def test_without_a_link_sharded_plans_have_no_utilisation_and_say_so() -> None:
    from _plan_gloo import tiny_encoder

    result = flopcount.plan(tiny_encoder, (torch.randn(2, 16, 64),), fsdp=2, on="h100")
    assert result.step_time is not None and result.step_time.comm_s is None
    assert result.step_time.mfu_overlap is None and result.step_time.hfu_overlap is None
    assert result.model_flops == 3 * result.flops["forward"]  # the numerator needs no link
    # the CLI's flag and the part's own links beside the API's keyword (the note said only "pass link=",
    # which a `flopcount plan` user cannot pass): H100 SXM's links per NVIDIA's H100 datasheet
    assert any("MFU and HFU not estimated (pass link=, on the command line --link; H100 SXM's: nvlink4, pcie5)" in note
               for note in result.notes)


def test_the_mfu_count_is_the_default_count_not_a_dispatch_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #32: the unsharded forward of a TP plan's model FLOPs was traced by the dispatch
    tracer on meta (every layer run: ~8 % of a 70B plan); the default count (fake copies,
    repeated blocks reused) gives the same events. Oracle: the hand count of
    test_tp_replicated_head_counts_in_hfu_once_per_rank_and_in_mfu_once."""
    import importlib

    plan_module = importlib.import_module("flopcount.planning.plan")  # the package re-exports plan()
    tracers = []
    trace = plan_module.trace

    def spy(*args: object, **kwargs: object) -> object:
        tracers.append(kwargs.get("tracer", "auto"))
        return trace(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(plan_module, "trace", spy)
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    x = torch.randn(B, S, D)
    tp_plan = {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}
    result = flopcount.plan(lambda: Net(head=True), (x,), tp=2, tp_plan=tp_plan, optimizer=None, on=None)
    assert tracers == ["auto"]
    assert result.model_flops == 3 * (L * BLOCK + 2 * N * D * V + N * V) // 2
