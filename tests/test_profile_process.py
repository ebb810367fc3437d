"""What profile (and this machine's roofs) do to the process and the user's files, and two
threads doing each at once (issue #27 item 5).

* torch's profiler is process-wide: before, two threads profiling at once crashed the process
  (SIGSEGV on torch 2.13); now the second waits for the first and both get their numbers;
* a profile inside a profile on the same thread is refused with a clear error;
* the roofs cache (the one file flopcount writes on its own) loses no entry when threads write
  it at once, and each library call that may measure or write says so in its docstring."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from typing import Any, List

import pytest
import torch
from conftest import ROOT
from torch import nn

import flopcount
from flopcount.devices import measured, named_roofs, roofs_for
from flopcount.devices.roofline import Roofs
from flopcount.errors import UsageError

ROOFS = Roofs({"float32": 1e11}, 1e10, "given", "given")

# Two models and their forward FLOPs, by hand (one FLOP per element for ReLU, docs/conventions.md):
# Linear(256, 256) on (64, 256): 2*64*256*256 = 8,388,608; ReLU 64*256 = 16,384;
# Linear(256, 8): 2*64*256*8 = 262,144; total 8,667,136.
# Conv2d(3, 8, 3) on (2, 3, 32, 32): 2*8*30*30 = 14,400 outputs of 3*3*3 = 27 multiply-adds:
# 2*27*14,400 = 777,600; ReLU 14,400; total 792,000.
SCRIPT = textwrap.dedent(
    """
    import json, sys, threading
    import torch
    from torch import nn
    import flopcount
    from flopcount.devices.roofline import Roofs

    torch.manual_seed(0)
    roofs = Roofs({"float32": 1e11}, 1e10, "given", "given")
    models = [nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8)), nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())]
    inputs = [torch.randn(64, 256), torch.randn(2, 3, 32, 32)]
    found = {0: [], 1: []}
    start = threading.Barrier(2)

    def work(i):
        start.wait()
        for _ in range(3):
            result = flopcount.profile(models[i], inputs[i], steps=2, warmup=1, roofs=roofs)
            found[i].append([sum(row.flops for row in result.rows), result.steps, len(result.unmatched)])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(found))
    """
)


def test_two_threads_profile_at_once_and_both_get_their_numbers(fresh_python: Any) -> None:
    # a child process (forked from one that imported torch only): before the lock, this crashed
    # it with a segmentation fault, which it reports as exit -11
    run = fresh_python.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**__import__("os").environ, "FLOPCOUNT_NO_ROOFS_CACHE": "1"})
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["0"] == [[8_667_136, 2, 0]] * 3
    assert found["1"] == [[792_000, 2, 0]] * 3


def test_a_profile_inside_a_profile_is_refused_clearly() -> None:
    class Nested(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            flopcount.profile(nn.Linear(4, 3), torch.randn(2, 4), steps=1, warmup=0, roofs=ROOFS)
            return self.lin(x)

    # the forward's failure comes back as the profile's own error (a TraceError naming the module), chained
    with pytest.raises(flopcount.FlopcountError, match="already inside profile") as caught:
        flopcount.profile(Nested(), torch.randn(2, 4), steps=1, warmup=0, roofs=ROOFS)
    cause: Any = caught.value
    while cause is not None and not isinstance(cause, UsageError):
        cause = cause.__cause__
    assert isinstance(cause, UsageError)
    # the lock is free again: a plain profile runs (Linear(4, 3) on (2, 4): 2*2*4*3 = 48 FLOPs)
    result = flopcount.profile(nn.Linear(4, 3), torch.randn(2, 4), steps=1, warmup=0, roofs=ROOFS)
    assert sum(row.flops for row in result.rows) == 48


def test_threads_writing_the_roofs_cache_lose_no_entry(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(measured.NO_CACHE_ENV, raising=False)
    # one cache key per thread, so every thread's entry must survive the others' writes
    monkeypatch.setattr(measured, "machine_key", lambda device: f"thread {threading.current_thread().name}")
    start = threading.Barrier(8)
    errors: List[BaseException] = []

    def work() -> None:
        try:
            start.wait()
            for _ in range(25):
                measured.remember_roofs(ROOFS, "cpu")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, name=f"w{i}") for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    stored = json.loads(measured.cache_path().read_text())
    # before: a read-modify-write raced another (and both wrote one scratch file): entries were lost
    assert sorted(stored) == sorted(f"thread w{i}" for i in range(8))
    assert not list(measured.cache_path().parent.glob("*.tmp"))


@pytest.mark.parametrize(
    "function",
    [flopcount.profile, flopcount.predict, measured.machine_roofs, measured.remember_roofs, named_roofs, roofs_for],
    ids=["profile", "predict", "machine_roofs", "remember_roofs", "named_roofs", "roofs_for"],
)
def test_library_calls_say_what_they_measure_and_write(function: Any) -> None:
    doc = " ".join((function.__doc__ or "").split())
    assert "roofs.json" in doc and "FLOPCOUNT_NO_ROOFS_CACHE" in doc
