"""This machine's roofs measured while other processes run (branch boundcheck2): the sanity
check read only the 1-minute load average, which lags a job that started seconds before (two
processes measuring at once; a CI job beside another). On the project's 2-core VM, passes
measured under load 10.8 agreed with each other (float32 57.9 GFLOP/s, DRAM 25.3 GB/s, against
218.7 and 94.1 quiet): with a load average that had not caught up they would have been cached as
this machine's roofs, and every later ``check --on "this machine"`` would have held models to a
bound 4x too high (a FAIL for a model that meets its budget). The threads of other processes
running while the passes run are now counted (``/proc/loadavg``'s runnable field less this
process's running threads, every 20 ms). Oracle: real competing processes, started here."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from flopcount.devices import MemoryLevel, Roofs
from flopcount.devices import measured as m

IDLE = (0.5, 0.5, 0.5)  # the load average before it has seen the competitors
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _fake(threads: int = CORES) -> Roofs:
    return Roofs({"float32": 5e10}, 2e10, "fake cpu", "measured", {"threads": threads}, (MemoryLevel("L2", 1e6, 8e10),))


def _slow_measure(device: torch.device) -> Roofs:
    time.sleep(0.15)  # long enough for the run-queue counts (every 20 ms)
    return _fake()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(m.NO_CACHE_ENV, raising=False)
    return tmp_path / "flopcount" / "roofs.json"


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="counts runnable threads from /proc (Linux)")
def test_roofs_measured_beside_other_running_processes_are_not_cached(cache_dir):
    # one busy process per core: every core has a thread of another process on it
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(CORES)]
    try:
        time.sleep(0.3)  # running
        roofs = m.machine_roofs("cpu", measure=_slow_measure, loadavg=lambda: IDLE, cores=CORES)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert roofs.doubts and any(d.startswith("other processes ran") for d in roofs.doubts), roofs.doubts
    assert not cache_dir.exists()


def test_roofs_measured_with_no_other_process_running_are_cached(cache_dir):
    # guard: nothing else running (counted as 0), a quiet load average: sane, cached
    roofs = m.machine_roofs("cpu", measure=_slow_measure, loadavg=lambda: IDLE, cores=CORES, running=lambda: 0)
    assert not roofs.doubts and cache_dir.exists()


def test_other_threads_are_a_problem_only_beyond_the_free_cores():
    one = _fake(threads=1)
    assert m.sanity(one, one, 0.5, 2, others=1) == []  # a 1-thread measurement beside one thread, on 2 cores
    assert m.sanity(one, one, 0.5, 2, others=2) == ["other processes ran 2 thread(s) beside this measurement's 1 on "
                                                     "the 2 cores (the median of the counts taken while it ran)"]
    assert m.sanity(one, one, 0.5, 2, others=None) == []  # not counted (a pass too short, not Linux)


def test_the_run_queue_is_read_from_proc(tmp_path):
    # 5 runnable threads system-wide, of which this process runs 2 (one R, one S, one R)
    (tmp_path / "loadavg").write_text("0.40 0.30 0.20 5/321 4242\n")
    for task, state in (("1", "R"), ("2", "S"), ("3", "R")):
        (tmp_path / "self" / "task" / task).mkdir(parents=True)
        (tmp_path / "self" / "task" / task / "stat").write_text(f"{task} (py thon) {state} 1 2 3\n")
    assert m.others_running(str(tmp_path)) == 3
    assert m.others_running(str(tmp_path / "missing")) is None
