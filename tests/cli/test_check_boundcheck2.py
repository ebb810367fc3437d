"""``check --on "this machine"`` on the models whose bound was above a real run in the second
adversarial pass (branch boundcheck2): a budget the model meets must never FAIL. On toy
memory-bound roofs (10 GB/s, no cache, sane: the verdict is certain), each budget is set far
above the bytes any implementation must move, counted by hand, and below what main priced:

* 16 rows picked from a 4 MiB table the forward reads nothing else of: 128 B of indices and
  16 x 256 float32 rows (16 KiB) per op; main counted the whole table (0.42 ms at 10 GB/s);
* a ``torch.compile``-d chain of 60 elementwise ops on 1 MiB: one pass over its input (0.1 ms);
  main's eager bound was the per-op sum, 120 passes (12.6 ms), which the compiled model beats
  (24.1 ms against a 10.8 ms compiled run on the VM's roofs, docs/performance.md).
"""

from __future__ import annotations

import textwrap

import pytest

from flopcount.devices import Roofs
from tests.cli._cli_run import cli, toy_machine

TOY = Roofs({"float32": 1e15}, 1e10, "toy cpu", "measured")

MODELS = textwrap.dedent(
    """
    class Picked(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.randn(4096, 256))  # 4 MiB

        def forward(self, ids):
            return self.table.index_select(0, ids)

    class Chain(nn.Module):
        def forward(self, x):
            for i in range(20):
                x = torch.relu(x * 1.0001 + 0.001 * i)
            return x

    def compiled_chain():
        return torch.compile(Chain())
    """
)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    problems = toy_machine(tmp_path, monkeypatch, TOY)
    problems([])  # sane roofs: a bound over the budget would be a certain FAIL
    with open(tmp_path / "bcmodels.py", "a") as fh:
        fh.write(MODELS)


@pytest.mark.parametrize("spec, shape, budget", [
    # the 16 rows and indices: 16,512 B read + 16,384 B written = 3.3 us at 10 GB/s
    ("bcmodels.py:Picked", "16:int64", "0.1ms"),
    # one read of 256 x 1024 float32 (1 MiB): 0.105 ms at 10 GB/s
    ("bcmodels.py:compiled_chain", "256x1024", "1ms"),
])
def test_a_model_that_meets_its_budget_is_not_failed(machine, capsys, spec, shape, budget):
    code, out, err = cli(capsys, "check", spec, "-i", shape, "--max-latency", budget, "--on", "this machine")
    assert "FAIL" not in out, (out, err)
    assert code == 3, (out, err)  # a bound under the budget decides nothing without measuring: UNDECIDED


@pytest.mark.parametrize("bound", [["--bound", "eager"], []])  # this machine's default bound is eager
def test_a_compiled_models_eager_bound_says_why_it_is_the_any_implementation_bound(machine, capsys, bound):
    """walk27: asked for the eager bound (or by default on this machine), a ``torch.compile``-d
    model's check reads "any-implementation": its verdict says why (docs/profile.md: its eager
    bound is the any-implementation bound); main named the other bound without a word. 1 MiB read
    once at 10 GB/s is 0.105 ms > 0.01 ms: a certain FAIL."""
    code, out, err = cli(capsys, "check", "bcmodels.py:compiled_chain", "-i", "256x1024", "--max-latency", "0.01ms",
                         "--on", "this machine", *bound)
    assert code == 1, (out, err)
    assert "any-implementation lower bound on toy cpu, which is a torch.compile-d model's eager bound" in out, out
