"""One way for CLI tests to run ``flopcount`` in process: the exit code and what it printed."""

from flopcount.cli import main


def cli(capsys, *args: str):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err
