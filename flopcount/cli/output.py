"""What the CLI writes besides the report: one-line messages, warnings and progress on
stderr (stdout carries only the report)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Set, Tuple

from flopcount.cli.deadline import stage
from flopcount.core.deprecation import is_renamed
from flopcount.errors import FlopcountError, FlopcountWarning, TraceError, UsageError


def say(message: str, kind: str = "") -> None:
    print(f"flopcount: {kind}: {message}" if kind else f"flopcount: {message}", file=sys.stderr, flush=True)


def slash_hint(text: str) -> str:
    """For a missing path written with backslashes on a system whose folders are separated by
    ``/`` (a Windows path in a CI step or a pyproject.toml run on Linux): what it would be here,
    and whether that exists; "" otherwise."""
    if "\\" not in text or os.sep == "\\":
        return ""
    here = text.replace("\\", "/")
    found = " exists" if Path(here).expanduser().exists() else ""
    return f" (written with \\, as on Windows: folders are separated by / here, {here}{found})"


def one_line(text: str) -> str:
    return " ".join(text.split())


def is_internal(exc: BaseException) -> bool:
    """True when ``exc`` was raised by flopcount's own code: the innermost frame of its
    traceback that is neither torch's nor the standard library's nor another installed
    package's is in the flopcount package (the shipped example models excepted). An error
    raised in the user's model, or by torch on the user's behalf, has a user frame deeper
    down and is not ours."""
    package = Path(__file__).resolve().parents[1]
    examples = package / "examples"
    ours = False
    tb = exc.__traceback__
    while tb is not None:
        raw = tb.tb_frame.f_code.co_filename
        path = Path(raw).resolve() if not raw.startswith("<") else None
        if path is not None and package in path.parents:
            ours = examples not in path.parents
        elif not _is_library(raw):
            ours = False
        tb = tb.tb_next
    return ours


def _is_library(path: str) -> bool:
    """torch, the standard library and installed packages (site-packages), or frozen code."""
    return path.startswith("<") or "site-packages" in path or "dist-packages" in path or path.startswith(_STDLIB)


_STDLIB = sysconfig.get_paths()["stdlib"]


def describe(exc: BaseException) -> str:
    """``TypeName: the message`` on one line (the artifacts' and the user's code's failures)."""
    text = one_line(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def describe_error(exc: FlopcountError) -> str:
    text = str(exc)
    if isinstance(exc, TraceError) and exc.module_path and exc.module_path not in text:
        text = f"{text} (module: {exc.module_path})"
    return text


def report_notes(result: Any, args: argparse.Namespace) -> None:
    """Why the count may be short (always, even with --quiet: it qualifies every number),
    then the result's other warnings (unless --quiet), one line each on stderr."""
    from flopcount.report.notes import incomplete_lines, other_warnings

    reasons = incomplete_lines(result)
    if reasons:
        say(f"the count may be short ({len(reasons)} reason(s)):", "INCOMPLETE")
        for text in reasons:
            args.said.add(one_line(text))
            say(one_line(text), "INCOMPLETE")
    if not args.quiet:
        for text in other_warnings(result):
            _say_once(args, one_line(text))


def report_warnings(caught: Sequence[warnings.WarningMessage], args: argparse.Namespace) -> None:
    for w in () if args.quiet else caught:
        renamed_name = issubclass(w.category, DeprecationWarning) and is_renamed(str(w.message))  # a 0.2 name: say it
        ours = issubclass(w.category, FlopcountWarning) or renamed_name
        if ours or args.debug:  # else torch.jit TracerWarnings and the like: noise for this report
            _say_once(args, one_line(str(w.message)), "" if ours else f"{w.category.__name__}: ")


def _say_once(args: argparse.Namespace, text: str, prefix: str = "") -> None:
    """A warning on stderr, unless this run said ``text`` already (``args.said``, main's)."""
    said: Set[str] = args.said
    if text not in said:
        said.add(text)
        say(prefix + text, "warning")


def progress(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        say(message)


def refuse_without_section_form(fmt: str, flag: str) -> None:
    """A reading added to a count (``--memory``, ``--on``) has a table, tree, markdown and JSON
    form, no HTML or CSV one: one line naming ``flag`` (said before any work is done)."""
    if fmt not in ("table", "tree", "markdown", "json"):
        raise UsageError(f"{flag} has no {fmt} form; use --format table, tree, markdown or json")


def with_section(text: str, fmt: str, flag: str, key: str, data: Dict[str, Any], table: Callable[[str], str]) -> str:
    """A count's report with one more reading (``--memory``, ``--on``): the JSON document's
    ``key``, or ``table(tabulate format)`` after the text; a format without a form for it: one line naming ``flag``."""
    if fmt == "json":
        return json.dumps({**json.loads(text), key: data}, indent=2)
    refuse_without_section_form(fmt, flag)
    return text.rstrip("\n") + "\n\n" + table("github" if fmt == "markdown" else "simple")


def written(args: argparse.Namespace, flag: str, path: str, write: Callable[[], Any], said: str = "") -> None:
    """Make the missing folders above ``path`` (the value of ``flag``), run ``write`` (it writes
    ``path``), then say ``said`` (default ``wrote PATH``) on stderr, and the folder made; an
    OSError there is the user's (a full disk, a folder gone): one line naming the flag."""
    folder = Path(path).parent
    made = next((p for p in (folder, *folder.parents) if not p.exists() and p.name != ".."), None)  # the deepest
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write()
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {exc.strerror or exc}") from exc
    progress(args, (said or f"wrote {path}") + (f" (made the folder {made})" if made is not None else ""))


def iteration_progress(label: str = "timed calls") -> Callable[[int, Optional[int]], None]:
    """Benchmark progress on stderr (``  warm-up 3/10 calls``, ``  12 timed calls``), at most
    about twice a second and always at the end of a counted phase; stdout stays clean."""
    last = [0.0]

    def report(done: int, total: Optional[int]) -> None:
        now = time.monotonic()
        if (total is None or done < total) and now - last[0] < 0.5:
            return
        last[0] = now
        say(f"  {label} {done}/{total}" if total else f"  {label} {done}")

    return report


class DefaultFormat(str):
    """``--format``'s default, ``table``, when the user gave none: it holds the command's formats,
    of which ``--output``'s suffix may pick one (:func:`settle_format`)."""

    formats: Tuple[str, ...] = ()


#: the formats an ``--output`` suffix names
SUFFIX_FORMATS = {".json": "json", ".csv": "csv", ".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html"}


def settle_format(args: argparse.Namespace) -> None:
    """``--format`` as the command runs it: where the user gave none, the one ``--output``'s suffix
    names if the command writes it (``-o report.json`` writes JSON, which ``diff`` and ``check
    --baseline`` read back), else ``table``; where the user gave one that another suffix names
    (``-f csv -o report.json``), it is kept and a warning says so; so for a suffix naming a format
    the command does not write (``roofs -o roofs.csv``: a table, said)."""
    chosen = getattr(args, "format", None)
    if not isinstance(chosen, str):
        return
    output = getattr(args, "output", None)
    implied = SUFFIX_FORMATS.get(Path(output).suffix.lower()) if output else None
    if isinstance(chosen, DefaultFormat):
        args.format = implied if implied in chosen.formats else "table"
        if implied is not None and args.format != implied and not getattr(args, "quiet", False):
            say(f"--output {output} gets --format table: this command writes {' or '.join(chosen.formats)}, not the "
                f"{implied} its suffix names", "warning")
    elif implied is not None and implied != chosen and not getattr(args, "quiet", False):
        say(f"--output {output} gets --format {chosen}, not the {implied} its suffix names", "warning")


def emit(text: str, args: argparse.Namespace) -> None:
    """Write the report (the one thing on stdout) to ``--output`` or stdout."""
    stage(args, "writing the report")
    if not text.endswith("\n"):
        text += "\n"
    if args.output:
        written(args, "--output", args.output, lambda: Path(args.output).write_text(text, encoding="utf-8"))
    else:
        stream = getattr(args, "stdout", None) or sys.stdout
        try:
            stream.write(text)
            stream.flush()
        except OSError as exc:  # a full disk (ENOSPC), a closed pipe (EPIPE): the user's I/O, not a bug
            _silence(stream)
            raise UsageError(f"writing the report to stdout failed: {exc.strerror or exc}; --output FILE writes it to a file") from exc


def _silence(stream: Any) -> None:
    """Point the failed stream's file at /dev/null, so that the interpreter's own flush at exit
    does not fail a second time with a traceback of its own."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
