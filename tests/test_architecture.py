"""The layout's promises (docs/internals.md): no import cycles between flopcount's modules,
results and reports without torch, and a CLI parser that answers --help without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, FrozenSet, Set

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flopcount"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, top_level_only: bool = False) -> Set[str]:
    """Modules imported anywhere in the file (function-local imports too: a cycle held
    apart by a local import is still a cycle), or at module level only; never those
    under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: Set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            continue
        if top_level_only and not isinstance(node, (ast.Import, ast.ImportFrom, ast.Try)):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Import):
                found.update(a.name for a in sub.names)
            elif isinstance(sub, ast.ImportFrom):
                if sub.level:
                    base = package.split(".")
                    base = base[: len(base) - (sub.level - 1)]
                    module = ".".join(base + ([sub.module] if sub.module else []))
                else:
                    module = sub.module or ""
                found.add(module)
                found.update(f"{module}.{a.name}" for a in sub.names)
    return found


def _graph() -> Dict[str, Set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


@pytest.fixture(scope="module")
def import_graph() -> Dict[str, FrozenSet[str]]:
    """The package's import graph, parsed once for the three tests that read it (~0.7 s each)."""
    return {name: frozenset(edges) for name, edges in _graph().items()}


def test_no_import_cycles(import_graph):
    graph = {name: set(edges) for name, edges in import_graph.items()}
    # a package's __init__ re-exporting its own submodules is not a cycle of concepts
    for name, edges in graph.items():
        graph[name] = {e for e in edges if not (e.startswith(name + ".") and (PACKAGE.parent / name.replace(".", "/")).is_dir())}
    state: Dict[str, int] = {}
    path: list = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_results_and_reports_import_no_torch():
    for path in [PACKAGE / "core" / "results.py", PACKAGE / "types.py", PACKAGE / "core" / "rendering.py", PACKAGE / "units.py",
                 *sorted((PACKAGE / "report").glob("*.py")), *sorted((PACKAGE / "diffs").glob("*.py"))]:
        imported = _imports(path, top_level_only=True)
        assert not any(m == "torch" or m.startswith("torch.") for m in imported), path.name


def test_a_diff_of_saved_reports_loads_no_torch(tmp_path):
    """``flopcount.diff`` of two JSON reports reads JSON only: no torch in the process."""
    report = {
        "schema_version": 1, "convention": "", "tracer": "dispatch", "inputs": "", "flops": 2, "macs": 1, "params": 3,
        "active_params": 3, "trainable_params": 3, "frozen_params": 0, "param_bytes_by_dtype": {"float32": 12},
        "buffer_bytes_by_dtype": {}, "size_bytes": 12, "bytes_read": 4, "bytes_written": 4, "by_phase": {},
        "by_operator": {}, "by_module": {"": {"type": "Net", "depth": 0, "calls": 1, "params": 3, "macs": 1, "flops": 2,
                                             "bytes_read": 4, "bytes_written": 4}},
        "unsupported_ops": {}, "complete": True, "incomplete_reasons": [], "warnings": [],
    }
    import json

    (tmp_path / "a.json").write_text(json.dumps(report))
    (tmp_path / "b.json").write_text(json.dumps({**report, "flops": 4}))
    code = (
        "import sys, flopcount; d = flopcount.diff(sys.argv[1], sys.argv[2]); d.to_markdown(); d.to_csv(); "
        "print(d.totals.delta('flops'), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.json"), str(tmp_path / "b.json")],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2", "False"]


def test_cli_parser_imports_no_torch():
    code = (
        "import sys; from flopcount.cli.parser import build_parser; build_parser(); "
        "import flopcount; flopcount.__version__; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_import_flopcount_imports_no_trainer_framework(fresh_python):
    """The integrations' frameworks stay optional: importing flopcount and using its main
    names loads none of them (flopcount.integrations.* import them when imported). In a process
    forked from one that imported torch only (none of them)."""
    code = (
        "import sys, flopcount; flopcount.count_flops; flopcount.StepTimer; flopcount.estimate_memory; "
        "print([m for m in ('transformers', 'lightning', 'pytorch_lightning', 'tensorboard', 'accelerate') if m in sys.modules])"
    )
    out = fresh_python.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    init = _imports(PACKAGE / "__init__.py")
    assert not any(m.startswith("flopcount.integrations") for m in init)


#: one package per reading; a reading imports the spine (core, handlers, tracers, decoding),
#: the step runner (step), the device model (devices) and timing (bench), never another reading
READINGS = ("counting", "generation", "memory", "profiling", "planning", "serving", "diffs")
#: the package's face: the only modules the top level holds besides packages
FACE = {"__init__.py", "__main__.py", "errors.py", "types.py", "units.py"}


def test_the_top_level_holds_only_the_face_and_packages():
    assert {p.name for p in PACKAGE.glob("*.py")} == FACE


def test_no_reading_imports_another(import_graph):
    graph = import_graph
    arrows = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if name.split(".")[1:2] != target.split(".")[1:2]
        and name.split(".")[1:2] and name.split(".")[1] in READINGS
        and target.split(".")[1:2] and target.split(".")[1] in READINGS
    )
    assert arrows == []


def test_the_spine_imports_no_reading(import_graph):
    graph = import_graph
    spine = ("core", "handlers", "tracers", "decoding", "step", "devices", "bench")
    arrows = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if len(name.split(".")) > 2 and name.split(".")[1] in spine
        and len(target.split(".")) > 1 and target.split(".")[1] in READINGS
    )
    assert arrows == []
