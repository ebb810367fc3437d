"""flopcount's size (issue #27): lines per package, raw and without blank lines, comments and
docstrings, so a before/after of a clean-up is one command.

A line counts as code when it holds a token other than a comment and is not part of a module,
class or function docstring or of a bare string statement (an attribute's docstring). Raw lines
are what ``find flopcount -name '*.py' | xargs wc -l`` counts.

Run: ``python benchmarks/package_size.py [PACKAGE_DIR]`` (default: this checkout's flopcount/).
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence, Set, Tuple

_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def count(source: str) -> Tuple[int, int]:
    """(raw lines, code lines) of one file's text."""
    strings: Set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            strings.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    code: Set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            code.update(range(token.start[0], token.end[0] + 1))
    return len(source.splitlines()), len(code - strings)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default=str(Path(__file__).resolve().parents[1] / "flopcount"))
    root = Path(parser.parse_args(argv).package)
    raw: Counter = Counter()
    code: Counter = Counter()
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        key = parts[0] if len(parts) > 1 else "(top level)"
        lines, lines_of_code = count(path.read_text())
        raw[key] += lines
        code[key] += lines_of_code
    print(f"{'package':16s} {'code':>7s} {'raw':>7s}")
    for key, value in code.most_common():
        print(f"{key:16s} {value:7d} {raw[key]:7d}")
    print(f"{'total':16s} {sum(code.values()):7d} {sum(raw.values()):7d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
