"""The ``flopcount`` command: count, bench, check. Only wiring: parse arguments, load
the model, call the library, print. :func:`main` is the one place that prints and exits.

Exit codes: 0 ok; 1 a budget certainly exceeded (check); 2 usage error, bad ENTRY or
SPEC, model construction failure, or a forward that fails (one line on stderr;
``--debug`` adds the traceback); 3 incomplete (check could not decide a budget on an
incomplete count, or ``--strict`` and an op without a handler ran); 130 interrupted.

stdout carries only the report: while the model is imported, built and run, anything
it prints goes to stderr.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
import warnings
from typing import List, Optional, Sequence

from ..errors import FlopcountError
from .output import describe_error, one_line, report_warnings, say
from .parser import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, build_parser

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or an argparse error (already printed)
        return exc.code if isinstance(exc.code, int) else (EXIT_USAGE if exc.code else EXIT_OK)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    caught: List[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            from .commands import COMMANDS

            args.stdout = sys.stdout  # the report's stream; the model's own prints go to stderr
            with contextlib.redirect_stdout(sys.stderr):
                return COMMANDS[args.command_name](args)
    except KeyboardInterrupt:
        say("interrupted", "error")
        return EXIT_INTERRUPTED
    except FlopcountError as exc:
        if args.debug:
            traceback.print_exc()
        say(one_line(describe_error(exc)), "error")
        return EXIT_USAGE
    except Exception as exc:  # a model's own code failing outside a tracer (e.g. during the benchmark)
        if args.debug:
            traceback.print_exc()
        say(one_line(f"{type(exc).__name__}: {exc}"), "error")
        return EXIT_USAGE
    finally:
        report_warnings(caught, args)
