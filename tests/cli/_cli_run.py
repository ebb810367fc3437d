"""One way for CLI tests to run ``flopcount`` in process: the exit code and what it printed."""

import textwrap

from flopcount.cli import main

#: the head of a model file the CLI tests write: imports and the small MLP they count
#: (Linear 16 -> 32, ReLU, Linear 32 -> 8)
MLP_SOURCE = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(16, 32)
            self.l2 = nn.Linear(32, 8)

        def forward(self, x):
            return self.l2(torch.relu(self.l1(x)))

    """
)


#: a model file with ``build(h=32)``: ``Net(h)``, Linear(16, h) -> ReLU -> Linear(h, 8), the model the
#: gate's tests save, widen and diff (``h`` is the width that grows)
NET_SOURCE = textwrap.dedent(
    """
    from torch import nn

    class Net(nn.Module):
        def __init__(self, h=32):
            super().__init__()
            self.l1 = nn.Linear(16, h)
            self.act = nn.ReLU()
            self.l2 = nn.Linear(h, 8)

        def forward(self, x):
            return self.l2(self.act(self.l1(x)))

    def build(h=32):
        return Net(h)
    """
)


def cli(capsys, *args: str):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(code: int, out: str, err: str) -> str:
    """The one line a usage error prints (exit 2, nothing on stdout, no traceback), returned."""
    assert code == 2, err
    assert out == ""
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    return err


def toy_machine(tmp_path, monkeypatch, roofs):
    """``MLP_SOURCE`` written as ``bcmodels.py`` in ``tmp_path`` (the working folder), and this
    machine's roofs ``roofs``, measured (no cache); the function returned sets the sanity
    problems the measurement finds (branches boundcheck and hwroofs)."""
    from flopcount.devices import measured

    (tmp_path / "bcmodels.py").write_text(MLP_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLOPCOUNT_NO_ROOFS_CACHE", "1")
    monkeypatch.setattr(measured, "measure_roofs", lambda *a, **k: roofs)

    def problems(found):
        monkeypatch.setattr(measured, "sanity", lambda *a, **k: list(found))

    return problems
