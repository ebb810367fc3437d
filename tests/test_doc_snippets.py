"""Every ```python block in README.md and docs/*.md runs, so the docs cannot rot.

Blocks of one file run in order in one namespace, from the repository root. A block whose
first line is ``# doctest: skip`` is not run (kept for CUDA-only snippets). An example's
``subprocess.run([sys.executable, "-m" or "-c", ...])`` runs in a process forked from one that has
imported torch (conftest's ``fresh_python``), not in a new interpreter."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path):
    return [block for block in FENCE.findall(path.read_text()) if not block.lstrip().startswith("# doctest: skip")]


def test_docs_have_examples():
    assert sum(len(python_blocks(p)) for p in DOCS) >= 5


@pytest.mark.parametrize("path", [p for p in DOCS if python_blocks(p)], ids=lambda p: p.name)
def test_python_examples_run(path: Path, monkeypatch, tmp_path, stored_machine_roofs, fresh_python):
    real_run = subprocess.run
    # the examples' tempfile.mkdtemp() folders (docs/profile.md's trace and plot, 1.2 MB a run) go
    # under pytest's tmp_path, not the machine's /tmp, where each suite run left one behind
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def run(args, *rest, **kwargs):
        if not rest and isinstance(args, list) and args[:1] == [sys.executable] and args[1:2] in (["-c"], ["-m"]):
            return fresh_python.run(args, **kwargs)
        return real_run(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    namespace = {"__name__": f"doc_{path.stem}"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for index, block in enumerate(python_blocks(path)):
            try:
                exec(compile(block, f"{path.name}[block {index}]", "exec"), namespace)
            except Exception as exc:  # name the block: a doc example is what failed
                raise AssertionError(f"{path.name}, python block {index} failed: {type(exc).__name__}: {exc}\n{block}") from exc
