"""Structural reuse beside a jit trace in another thread (issue #32 review): the jit tracer's
process-wide module hooks (``tracers/jit/random.py``) answer their own thread only, so a count
in another thread meanwhile keeps reusing blocks; in the jit trace's own thread they act, and
reuse stays off there. Oracles: the number of calls booked from an earlier one, derived from
the model's structure, and hand-derived MACs."""

from __future__ import annotations

import threading

import torch
from torch import nn

from flopcount import count_flops
from flopcount.core.inputs import prepare_call
from flopcount.tracers import trace
from flopcount.tracers.jit.random import private_random_calls

B, D = 3, 8  # batch, width


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(6))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _count(model, inputs):
    run = trace(model, prepare_call(inputs))
    return int(run.shape_cache["reused_calls"]), count_flops(model, inputs).macs


def test_a_jit_traces_hooks_in_another_thread_leave_reuse_on(monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    torch.manual_seed(0)
    model, inputs = Stack(), (torch.randn(B, D),)
    entered, done = threading.Event(), threading.Event()
    failures = []

    def jit_trace_running() -> None:
        try:
            with private_random_calls():  # what the jit tracer holds around its trace
                entered.set()
                done.wait(30)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)
            entered.set()

    other = threading.Thread(target=jit_trace_running)
    other.start()
    try:
        assert entered.wait(30)
        assert not failures
        reused, macs = _count(model, inputs)
    finally:
        done.set()
        other.join(30)
    # blocks.0 traced, blocks.1-5 booked from it; 6 Linear(D, D) of B rows: 6 * B * D * D MACs
    assert reused == 5
    assert macs == 6 * B * D * D


def test_the_jit_traces_own_thread_traces_every_call(monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    torch.manual_seed(0)
    model, inputs = Stack(), (torch.randn(B, D),)
    with private_random_calls():  # its hooks act in this thread: a skipped call would miss them
        reused, macs = _count(model, inputs)
    assert reused == 0
    assert macs == 6 * B * D * D
    assert _count(model, inputs) == (5, macs)  # hooks gone: reused again


def test_a_users_process_wide_hook_turns_reuse_off_in_every_thread(monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    torch.manual_seed(0)
    model, inputs = Stack(), (torch.randn(B, D),)
    seen = []
    handle = nn.modules.module.register_module_forward_hook(lambda m, a, out: seen.append(type(m).__name__))
    try:
        result = []
        worker = threading.Thread(target=lambda: result.append(_count(model, inputs)))
        worker.start()
        worker.join(60)
    finally:
        handle.remove()
    assert result == [(0, 6 * B * D * D)]
    # the hook saw every block of the fake copy: 6 per run (the trace and the count)
    assert seen.count("Block") == 12
