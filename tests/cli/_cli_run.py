"""One way for CLI tests to run ``flopcount`` in process: the exit code and what it printed."""

from flopcount.cli import main


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
