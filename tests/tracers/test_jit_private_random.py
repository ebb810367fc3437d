"""jit's real run draws on generators of its own (issue #29 item 18, the jit half).

Before: jit's real run drew from the process's generator and set it back afterwards, so a
thread drawing meanwhile was rewound (repeats), a draw inside a TorchScript function was not
set back at all. Oracles: hand counts (derived below), the neighbour's
own 62-bit draws, the model run by the test itself from the same generator state, and
``torch.jit.trace``'s own graph (public torch) for the fused attention paths."""

from __future__ import annotations

from typing import Any, List
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from tracers.test_threads_process import Neighbour, _draw, _function_modes, assert_counted_run_draws_as_the_caller

from flopcount import count_flops
from flopcount.tracers import trace

B, T = 3, 5


class _Drawing(nn.Module):
    """Every way a forward draws: F.dropout, torch.randn_like, Tensor.uniform_, Tensor.random_,
    F.rrelu (training), torch.multinomial, and an LSTM's inter-layer dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.rnn = nn.LSTM(16, 8, num_layers=2, dropout=0.5, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.dropout(self.fc(x), 0.5, self.training)
        h = h + torch.randn_like(h)
        h = h * torch.empty_like(h).uniform_()
        h = h + torch.empty_like(h).random_(0, 4)
        h = F.rrelu(h, training=self.training)
        picks = torch.multinomial(h.detach().abs().flatten(0, 1) + 1e-3, 2)
        y, _ = self.rnn(h)
        return self.head(y) + picks.sum()


# Hand count: Linear(8, 16) on B*T rows; LSTM with 4 gates, hidden 8: per step and row
# 4*8*(in + 8) MACs, in = 16 for layer 1 and 8 for layer 2; Linear(8, 2) on B*T rows.
DRAWING_MACS = B * T * 8 * 16 + B * T * 4 * 8 * (16 + 8) + B * T * 4 * 8 * (8 + 8) + B * T * 8 * 2


@pytest.mark.parametrize("tracer", ["jit", "dispatch"])
def test_every_spelling_of_a_draw_leaves_a_drawing_neighbour_alone(tracer: str) -> None:
    torch.manual_seed(0)
    model = _Drawing().train()
    x = torch.randn(B, T, 8)
    with Neighbour(_draw) as neighbour:
        for _ in range(6):
            assert count_flops(model, x, tracer=tracer).macs == DRAWING_MACS
    draws = neighbour.results
    assert len(draws) > 1 and not neighbour.errors
    assert len(set(draws)) == len(draws), f"{len(draws) - len(set(draws))} repeated draws: the generator was rewound"
    assert set(neighbour.modes) == {0} and _function_modes() == 0


def test_an_eval_mode_rnn_with_dropout_leaves_a_drawing_neighbour_alone() -> None:
    # jit records aten::lstm, an op torch tags as drawing; in eval (train=False) it draws nothing,
    # so nothing is set back. Before: the generator was set back after every such count.
    torch.manual_seed(0)
    model = nn.LSTM(8, 8, num_layers=2, dropout=0.5, batch_first=True).eval()
    x = torch.randn(B, T, 8)
    with Neighbour(_draw) as neighbour:
        for _ in range(6):
            # 2 layers x T steps x B rows x 4 gates x 8 x (in + 8), in = 8 for both layers
            assert count_flops(model, x, tracer="jit").macs == 2 * T * B * 4 * 8 * (8 + 8)
    draws = neighbour.results
    assert len(draws) > 1 and not neighbour.errors
    assert len(set(draws)) == len(draws), f"{len(draws) - len(set(draws))} repeated draws: the generator was rewound"


@pytest.mark.parametrize("tracer", ["jit", "dispatch"])
def test_the_counted_run_draws_what_the_callers_call_draws(tracer: str) -> None:
    torch.manual_seed(0)
    assert_counted_run_draws_as_the_caller(_Drawing().train(), torch.randn(B, T, 8), tracer)


@torch.jit.script
def _scripted_noise(x: torch.Tensor) -> torch.Tensor:
    return x + torch.randn_like(x)


class _ScriptedDraw(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scripted_noise(self.fc(x))


@pytest.mark.parametrize("tracer", ["jit", "dispatch", "auto"])
def test_a_draw_inside_torchscript_leaves_the_callers_generator_as_found(tracer: str) -> None:
    # jit cannot redirect a draw made inside TorchScript (no Python call to see): it sets the
    # generator back, as before. Before, it did not, because the opaque call was not seen as a draw.
    model = _ScriptedDraw()
    x = torch.randn(B, T, 8)
    state = torch.get_rng_state()
    result = count_flops(model, x, tracer=tracer)
    assert result.macs == B * T * 8 * 8  # Linear(8, 8) on B*T rows; the noise add has no MAC
    assert torch.equal(torch.get_rng_state(), state)


def _fused_ops(model: nn.Module, x: torch.Tensor) -> List[str]:
    """The fused-path ops public ``torch.jit.trace`` records for this model."""
    with torch.no_grad():
        graph = torch.jit.trace(model, (x,), check_trace=False).inlined_graph
    return sorted({n.kind() for n in graph.nodes() if "native_multi_head" in n.kind() or "transformer_encoder" in n.kind()})


def _jit_ops(model: nn.Module, x: Any, private: bool) -> List[str]:
    from flopcount.core.state import PrivateRandomCalls

    with mock.patch.object(PrivateRandomCalls, "available", staticmethod(lambda: private)):
        return [event.call.op for event in trace(model, (x,), tracer="jit").events]


@pytest.mark.parametrize("which", ["mha", "encoder"])
def test_the_private_generators_keep_jits_fused_attention_paths(which: str) -> None:
    """A TorchFunctionMode turns off nn.MultiheadAttention's and the encoder's fused eval path
    (``has_torch_function``); the jit tracer takes it off the stack around them, so jit records
    the fused ops torch.jit.trace records, and exactly the ops it recorded before."""
    torch.manual_seed(0)
    if which == "mha":
        inner = nn.MultiheadAttention(16, 4, batch_first=True)

        class Wrap(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.attn = inner

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.attn(x, x, x, need_weights=False)[0]

        model: nn.Module = Wrap().eval()
    else:
        layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
        model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 6, 16)
    fused = _fused_ops(model, x)
    assert fused, "torch took no fused path here: the test would prove nothing"
    ops = _jit_ops(model, x, private=True)
    assert set(fused) <= set(ops)
    assert ops == _jit_ops(model, x, private=False)


class _Branches(nn.Module):
    """A forward that reads a tensor into Python itself (``user``: jit warns at that line, the
    user's), or only through ``torch._assert`` (torch's own code reads it: no note)."""

    def __init__(self, user: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.user = user

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.user:
            if h.sum() > -1e9:  # a Python bool of a tensor: a TracerWarning at this line
                h = h.relu()
        else:
            torch._assert(h.sum() > -1e9, "inside torch")
        return h


@pytest.mark.parametrize("user", [True, False], ids=["users-code", "torchs-code"])
def test_jits_notes_still_name_the_users_code_not_the_pass_through_mode(user: bool) -> None:
    # the mode is a Python frame between the forward and torch: a TracerWarning must still be
    # attributed to the forward's line (reported) or to torch's own code (left out), as before
    result = count_flops(_Branches(user), torch.randn(B, 8), tracer="jit")
    booleans = [w for w in result.warnings if "Python boolean" in w]
    assert len(booleans) == (1 if user else 0), result.warnings
    assert result.macs == B * 8 * 8
