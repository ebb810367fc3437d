"""Imports inside flopcount are absolute (``from flopcount.core.ledger import Ledger``; issue #27):
the face and its consumers (cli/, report/, budget/, diffs/, integrations/, examples/, profiling/,
bench/ and the top-level modules) hold no relative import. integrations/lightning.py, cli/,
bench/loop.py and the package ``__init__`` files had some."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

PACKAGE = Path(__file__).resolve().parents[1] / "flopcount"
FACE = ("cli", "report", "budget", "diffs", "integrations", "examples", "profiling", "bench")


def _relative_imports(files: List[Path]) -> List[str]:
    return [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in files
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]


def test_no_relative_import_in_the_face_and_its_consumers() -> None:
    files = [path for name in FACE for path in (PACKAGE / name).rglob("*.py")] + sorted(PACKAGE.glob("*.py"))
    assert _relative_imports(files) == []
    # dynamic imports too: the lazy exports of flopcount/__init__.py name their modules absolutely
    assert 'import_module(f".' not in (PACKAGE / "__init__.py").read_text()


def test_no_relative_import_anywhere_in_the_package() -> None:
    # devices/, handlers/ and two tracers/ modules had the last ones
    assert _relative_imports(sorted(PACKAGE.rglob("*.py"))) == []
