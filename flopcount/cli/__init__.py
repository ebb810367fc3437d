"""The ``flopcount`` command: count, bench, check. Only wiring: parse arguments, load
the model, call the library, print. :func:`main` is the one place that prints and exits.

Exit codes: 0 ok; 1 a budget certainly exceeded (check); 2 usage error, bad ENTRY or
SPEC, model construction failure, a forward that fails, or ``--timeout`` running out (one
line on stderr naming what was still running; ``--debug`` adds the traceback); 3 incomplete (check could not decide a budget on an
incomplete count, or ``--strict`` and an op without a handler ran); 4 an internal error: a
bug in flopcount itself (an exception raised by flopcount's own code, not by the user's model
or input), reported as such; 130 interrupted.

stdout carries only the report: while the model is imported, built and run, anything
it prints goes to stderr.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
import warnings
from typing import List, Optional, Sequence

from flopcount.cli.deadline import CommandTimeout, deadline
from flopcount.cli.output import describe_error, is_internal, one_line, report_warnings, say, settle_format
from flopcount.cli.parser import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    build_parser,
    join_negative_values,
    parse_command_line,
)
from flopcount.errors import FlopcountError

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    try:
        args = parse_command_line(parser, join_negative_values(parser, list(sys.argv[1:] if argv is None else argv)))
    except SystemExit as exc:  # --help, --version, or an argparse error (already printed)
        return exc.code if isinstance(exc.code, int) else (EXIT_USAGE if exc.code else EXIT_OK)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    settle_format(args)
    caught: List[warnings.WarningMessage] = []
    args.said = set()  # what stderr said once (cli.output), shared by diff's two sides
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            from flopcount.cli.commands import run_command

            args.stdout = sys.stdout  # the report's stream; the model's own prints go to stderr
            with contextlib.redirect_stdout(sys.stderr), deadline(args, args.timeout):
                return run_command(args)
    except KeyboardInterrupt:
        say("interrupted", "error")
        return EXIT_INTERRUPTED
    except (CommandTimeout, Exception) as exc:  # Exception: also the model's own code failing outside a tracer
        if args.debug:
            traceback.print_exc()
        if isinstance(exc, CommandTimeout):
            message = f"--timeout {exc.seconds:g}: flopcount {args.command} stopped after {exc.seconds:g} s while {exc.what} was still running"
        elif isinstance(exc, FlopcountError):
            message = describe_error(exc)
        elif is_internal(exc):  # a bug of ours
            say(one_line(f"internal error in flopcount (a bug, not your input; please report it with the "
                         f"traceback --debug prints): {type(exc).__name__}: {exc}"), "error")
            return EXIT_INTERNAL
        else:
            message = f"{type(exc).__name__}: {exc}"
        say(one_line(message), "error")
        return EXIT_USAGE
    finally:
        report_warnings(caught, args)
