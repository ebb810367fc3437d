"""A process's first count traces its forward once. ``torch._dynamo.utils`` imports
``numpy.random`` during the first fake run, and the check of the forward's random draws
(``core.state.random_states``) read numpy's generator as absent before that run and present after
it: a draw, so every first count with booked (reused) calls traced the forward a second time,
watched for draws. That is every ``flopcount count`` on the command line. Oracle: the number of
fake traces, counted in a child forked from the suite's server, which has imported torch and
nothing of numpy.random (asserted), beside the number of modules the copier copied (the toy
stack's 13, tests/tracers/test_reuse_lazy_copy.py's count by hand)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
assert "numpy.random" not in sys.modules, "the server imported numpy.random: the test checks nothing"
import torch
from _toy_stack import B, D, Stack
from flopcount import count_flops
from flopcount.tracers import _containers, dispatch

traces, copied = [], []
trace, module = dispatch.trace, _containers.TreeCopier.module

def counted_trace(*args, **kwargs):
    traces.append(1)
    return trace(*args, **kwargs)

def counted_module(self, value):
    if id(value) not in self.memo:
        copied.append(value)
    return module(self, value)

dispatch.trace, _containers.TreeCopier.module = counted_trace, counted_module
for _ in range(2):
    traces.clear(); copied.clear()
    torch.manual_seed(0)
    result = count_flops(Stack().eval(), (torch.randn(B, D),))
    print(len(traces), len(copied), result.reused_calls)
"""


def test_the_first_count_of_a_process_traces_once(fresh_python: Any) -> None:
    script = _SCRIPT.format(tests=str(ROOT / "tests"))
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT), "FLOPCOUNT_REUSE": "1"}
    done = fresh_python.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    # the first count and the second alike: one trace, 13 modules copied, 7 blocks booked from the first
    assert done.stdout.split("\n")[:2] == ["1 13 7", "1 13 7"], done.stdout
