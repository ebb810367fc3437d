"""``check --on "this machine"`` on roofs measured under load (branch boundcheck): such roofs are
below what the machine does (on this project's VM, under load 5-7, float32 33 GFLOP/s in one pass
and 200 in the next, DRAM 12.6 GB/s against 104 quiet), so the bound on them can be above a real
run: a dynamic int8 MLP that runs in 2.4 ms FAILed a 3 ms budget with "latency >= 8.0 ms". A
bound on roofs that failed the sanity check decides nothing: UNDECIDED, never FAIL; on sane roofs
over the budget it is still a certain FAIL."""

from __future__ import annotations

import pytest

from flopcount.devices import Roofs
from tests.cli._cli_run import cli, toy_machine

# 8 x 16 -> 32 -> 8: 2 * 8 * (16 * 32 + 32 * 8) MAC FLOPs + 8 * 32 ReLU = 12,544 FLOPs; at the
# toy 1 MFLOP/s float32 roof (memory at 1 TB/s never binds) the eager bound is 12.544 ms
FLOPS = 2 * 8 * (16 * 32 + 32 * 8) + 8 * 32
TOY = Roofs({"float32": 1e6}, 1e12, "toy cpu", "measured")


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """This machine's roofs are the toy ones, measured (no cache), with the sanity problems given."""
    return toy_machine(tmp_path, monkeypatch, TOY)


def test_a_bound_on_roofs_measured_under_load_does_not_fail_a_budget(machine, capsys):
    machine(["load average 7.04 above the 2 cores"])
    code, out, err = cli(capsys, "check", "bcmodels.py:Mlp", "-i", "8x16", "--max-latency", "1ms", "--on", "this machine")
    assert code == 3, (out, err)
    assert f"latency   1.000 ms  ~ {FLOPS / 1e6 * 1e3:.3f} ms  UNDECIDED" in out
    assert "UNDECIDED: latency is not decided without measuring" in out and "over the budget, but not a certain bound" in out
    assert "on roofs measured under load (load average 7.04 above the 2 cores)" in out


def test_a_bound_on_sane_roofs_over_the_budget_is_a_certain_fail(machine, capsys):
    machine([])
    code, out, err = cli(capsys, "check", "bcmodels.py:Mlp", "-i", "8x16", "--max-latency", "1ms", "--on", "this machine")
    assert code == 1, (out, err)
    assert f"latency   1.000 ms  >= {FLOPS / 1e6 * 1e3:.3f} ms  FAIL" in out
