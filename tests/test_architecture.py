"""The layout's promises (docs/internals.md): no import cycles between flopcount's modules,
results and reports without torch, and a CLI parser that answers --help without torch."""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, FrozenSet, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flopcount"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def _face_exports() -> Dict[str, str]:
    """``flopcount``'s lazy public names -> the module each loads (``_EXPORTS`` in __init__)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_EXPORTS":
            assert node.value is not None
            return {k: f"flopcount.{v}" for k, v in ast.literal_eval(node.value).items()}
    raise AssertionError("flopcount/__init__.py has no _EXPORTS table")


@functools.cache
def _imports(path: Path, top_level_only: bool = False, every_form: bool = False) -> FrozenSet[str]:
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return frozenset(_imports_of(path.read_text(), package, top_level_only, every_form))


def _imports_of(text: str, package: str, top_level_only: bool = False, every_form: bool = False) -> Set[str]:
    """Modules imported anywhere in the file (function-local imports too: a cycle held
    apart by a local import is still a cycle), or at module level only; never those
    under ``if TYPE_CHECKING:``. ``every_form``: also those, and a module reached through
    the face (``from flopcount import count_flops``, ``flopcount.serve``) or by name
    (``importlib.import_module("flopcount.memory")``)."""
    tree = ast.parse(text)
    face = _face_exports() if every_form else {}
    found: Set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test) and not every_form:
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
                if module == "flopcount":
                    found.update(face[a.name] for a in sub.names if a.name in face)
            elif every_form and isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                    and sub.value.id == "flopcount" and sub.attr in face:
                found.add(face[sub.attr])
            elif every_form and isinstance(sub, ast.Constant) and isinstance(sub.value, str) \
                    and re.fullmatch(r"flopcount(\.\w+)+", sub.value):
                found.add(sub.value)
    return found


def _graph(every_form: bool = False) -> Dict[str, Set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path, every_form=every_form) if m in modules and m != name}
            for name, path in modules.items()}


def test_no_import_cycles():
    graph = _graph()
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
    names loads none of them (flopcount.integrations.* import them when imported). In a child
    forked from conftest's server, which has imported torch and none of the frameworks (the
    child checks that too): torch's own import is not what this test is about."""
    frameworks = "('transformers', 'lightning', 'pytorch_lightning', 'tensorboard', 'accelerate')"
    code = (
        f"import sys; before = [m for m in {frameworks} if m in sys.modules], 'flopcount' in sys.modules; "
        "import flopcount; flopcount.count_flops; flopcount.StepTimer; flopcount.estimate_memory; "
        f"print(*before, [m for m in {frameworks} if m in sys.modules])"
    )
    out = fresh_python.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] False []"
    init = _imports(PACKAGE / "__init__.py")
    assert not any(m.startswith("flopcount.integrations") for m in init)


#: one package per reading; a reading imports the spine (core, handlers, tracers, decoding),
#: the step runner (step), the device model (devices) and timing (bench), never another reading
READINGS = ("counting", "generation", "memory", "profiling", "planning", "serving", "diffs")
#: the package's face: the only modules the top level holds besides packages
FACE = {"__init__.py", "__main__.py", "errors.py", "types.py", "units.py"}


def test_the_top_level_holds_only_the_face_and_packages():
    assert {p.name for p in PACKAGE.glob("*.py")} == FACE


#: the counting spine, the step runner, the device model and timing: shared by the readings
SPINE = ("core", "handlers", "tracers", "decoding", "step", "devices", "bench")


def _package_of(module: str) -> str:
    """``flopcount.serving.pricing`` -> ``serving`` (``""`` for the face)."""
    return module.split(".")[1] if module.count(".") else ""


def _arrows(graph: Dict[str, Set[str]], sources: Tuple[str, ...]) -> List[str]:
    """Imports from a module of a ``sources`` package into another reading's package."""
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if _package_of(name) in sources and _package_of(target) in READINGS and _package_of(target) != _package_of(name)
    )


def test_no_reading_imports_another():
    """Every form counts: module level, inside a function, under TYPE_CHECKING, through the
    face (``from flopcount import serve``) or by name (``importlib.import_module``)."""
    assert _arrows(_graph(every_form=True), READINGS) == []


def test_the_spine_imports_no_reading():
    assert _arrows(_graph(every_form=True), SPINE) == []


@pytest.mark.parametrize("source", [
    "from flopcount.counting.count import count_flops",
    "def f():\n    from flopcount.counting import count_flops",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flopcount.counting import count_flops",
    "def f():\n    from flopcount import count_flops",
    "import flopcount\ndef f(model):\n    return flopcount.count_flops(model)",
    "import importlib\ndef f():\n    return importlib.import_module('flopcount.counting')",
    "from .. import counting",
])
def test_an_arrow_between_readings_is_found_in_every_form(source: str):
    """The checks above see each way one reading could reach another: a planted module of
    ``serving`` importing ``counting``. The graph they used before missed the forms under
    TYPE_CHECKING, through the face and by name."""
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    found = {m for m in _imports_of(source, "flopcount.serving", every_form=True) if m in modules}
    arrows = _arrows({"flopcount.serving._planted": found}, READINGS)
    assert any(a.split(" -> ")[1] in ("flopcount.counting", "flopcount.counting.count") for a in arrows), arrows


def _cross_reading_pairs(package: Path) -> List[str]:
    """The pairs of places the ``duplicates`` tool finds (6+ identical or same-shape lines)
    whose two sides lie in two different readings."""
    tool = shutil.which("duplicates")
    if tool is None:
        pytest.skip("the duplicates tool is not installed")
    out = subprocess.run([tool, "--repo", str(package), "--most", "200", "--seconds", "120"],
                         capture_output=True, text=True, check=True).stdout
    assert "incomplete:" not in out, out
    pairs = []
    for line in out.splitlines():
        found = re.match(r"D\d+ (\S+):\d+-\d+ ~ (\S+):\d+-\d+", line)
        if found:
            a, b = (side.split("/")[0] for side in found.groups())
            if a != b and a in READINGS and b in READINGS:
                pairs.append(line)
    return pairs


def test_no_code_is_written_twice_across_two_readings():
    """Issue #27: two readings share no run of code, not even one alike only in shape
    (profiling's ProfileResult and serving's ServeFacts field lists were the last pair)."""
    assert _cross_reading_pairs(PACKAGE) == []


def _picture() -> Dict[str, Set[str]]:
    """docs/internals.md's first picture: folder (``""`` for the top level, ``tracers/fake``
    for a nested one) -> the ``*.py`` names written in its part of the picture."""
    text = (PACKAGE.parent / "docs" / "internals.md").read_text()
    block = text.split("```\n", 2)[1]
    assert block.startswith("flopcount/\n"), "the picture is the first code block of docs/internals.md"
    found: Dict[str, Set[str]] = {"": set()}
    folder = ""
    for line in block.splitlines()[1:]:
        top = re.match(r"  (\w+)/", line)
        nested = re.match(r"    (\w+)/", line)
        if top and (PACKAGE / top.group(1)).is_dir():
            folder = top.group(1)
        elif nested and (PACKAGE / folder.split("/")[0] / nested.group(1)).is_dir():
            folder = f"{folder.split('/')[0]}/{nested.group(1)}"
        found.setdefault(folder, set()).update(re.findall(r"\b(\w+\.py)\b", line))
    return found


def test_the_picture_lists_every_module_where_it_lives():
    """Issue #27: docs/internals.md's picture matches the folders: each module of flopcount
    (a package's __init__.py aside) is named in its folder's part, and each name there exists."""
    picture = _picture()
    folders = {"", *(str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)}
    missing, stale = [], []
    for folder in sorted(folders):
        path = PACKAGE / folder
        files = {p.name for p in path.glob("*.py") if p.name != "__init__.py" or folder == ""}
        missing += [f"{folder}/{name}".lstrip("/") for name in sorted(files - picture.get(folder, set()))]
        stale += [f"{folder}/{name}".lstrip("/") for name in sorted(picture.get(folder, set()) - files)]
    assert (missing, stale) == ([], [])
