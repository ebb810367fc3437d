"""Data apart from presentation (issue #19 item 4): no reading imports ``flopcount.report``
in any form; readings reach their renderers through ``flopcount.core.rendering``, which imports
the report package on the first render; and every rendering method of every reading gives
what the report function, called directly, gives."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
from conftest import FakeClock
from torch import nn

import flopcount
from flopcount.core import rendering
from flopcount.core.results import FlopResult
from flopcount.devices.roofline import Roofs
from flopcount.report import bench as report_bench
from flopcount.report import budget as report_budget
from flopcount.report import export, generation, memory, plan, profile, roofline_plot, table, tree

PACKAGE = Path(__file__).resolve().parents[1] / "flopcount"
REPORT = "flopcount.report"
#: the one module allowed to reach flopcount.report, dynamically (importlib, on a miss)
WIRING = PACKAGE / "core" / "rendering.py"


def _package_of(path: Path) -> List[str]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return parts if path.name == "__init__.py" else parts[:-1]


def _report_imports(path: Path, source: Optional[str] = None) -> List[str]:
    """Every way the module at ``path`` names flopcount.report in an import: module level,
    under ``TYPE_CHECKING``, inside functions; absolute, relative, ``from X import report``;
    and ``importlib.import_module``/``__import__`` of a literal report name."""
    package = _package_of(path)
    found: List[str] = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        names: List[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and path != WIRING:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                target = str(node.args[0].value)
                names = [target, "flopcount" + target if target.startswith(".") else target]
        found.extend(f"line {node.lineno}: {name}" for name in names if name == REPORT or name.startswith(REPORT + "."))
    return found


def test_no_reading_imports_report_in_any_form() -> None:
    checked = [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] not in ("report", "cli")]
    assert PACKAGE / "core" / "results.py" in checked and PACKAGE / "budget" / "check.py" in checked and WIRING in checked
    offenders = {str(p.relative_to(PACKAGE)): hits for p in checked if (hits := _report_imports(p))}
    assert offenders == {}


@pytest.mark.parametrize("where", ["results.py", "bench/result.py", "profiling/result.py"])
def test_the_scan_sees_every_spelling(where: str) -> None:
    """The scanner's own oracle: each spelling of a report import, as if written in a reading
    module (relative levels 1 and 2), is found (module level, TYPE_CHECKING, function-local)."""
    dots = "." * where.count("/")
    spellings = [
        f"from .{dots}report.table import module_table",
        f"from .{dots} import report",
        "import flopcount.report.export",
        "from flopcount import report",
        "from flopcount.report import table",
        f"if TYPE_CHECKING:\n    from .{dots}report.bench import benchmark_text",
        f"def f():\n    from .{dots}report.memory import memory_table",
        "import importlib\nimportlib.import_module('flopcount.report')",
        "def f():\n    __import__('flopcount.report.table')",
    ]
    for code in spellings:
        assert _report_imports(PACKAGE / where, code), code
    assert _report_imports(PACKAGE / where, f"from .{dots}rendering import render\nfrom .{dots}units import show_value\n") == []


def test_report_is_imported_on_the_first_render_only(fresh_python: Any) -> None:
    # a bare interpreter: importing flopcount loads neither the renderers nor torch
    code = "import sys, flopcount\nprint('flopcount.report' in sys.modules, 'torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    # then counting (in a process that had imported torch only) loads no renderer, rendering does
    code = (
        "import sys\n"
        "import flopcount\n"
        "assert 'flopcount.report' not in sys.modules\n"
        "import torch, flopcount.core.results\n"
        "from flopcount.counting.count import count_flops\n"
        "result = count_flops(torch.nn.Linear(4, 3), torch.zeros(2, 4))\n"
        "print('flopcount.report' in sys.modules, 'tabulate' in sys.modules)\n"
        "result.table()\n"
        "print('flopcount.report' in sys.modules, 'matplotlib' in sys.modules)\n"
    )
    out = fresh_python.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "True", "False"]


# -------------------------------------------------------------------- the registry itself


def test_a_reading_without_a_renderer_is_an_internal_error_naming_it() -> None:
    class Orphan:
        pass

    with pytest.raises(rendering.RendererError, match=r"no renderer for Orphan as 'table'"):
        rendering.render(Orphan(), "table")
    assert not isinstance(rendering.RendererError("x"), flopcount.FlopcountError)  # the CLI: exit 4, not 2


def test_an_unknown_form_lists_the_forms_the_reading_has(linear: FlopResult) -> None:
    with pytest.raises(rendering.RendererError, match=r"FlopResult as 'html'.*csv, dict, operator_table, table, tree"):
        rendering.render(linear, "html")


def test_two_renderers_for_one_form_is_an_error(linear: FlopResult) -> None:
    with pytest.raises(rendering.RendererError, match=r"two renderers for FlopResult.table"):
        rendering.renders("FlopResult", "table")(lambda result: "")
    assert rendering.renderer(linear, "table") is table.module_table


def test_a_subclass_renders_with_its_base_class_renderer(linear: FlopResult) -> None:
    class MyResult(FlopResult):
        pass

    mine = MyResult(**{f.name: getattr(linear, f.name) for f in fields(linear)})
    assert mine.table() == table.module_table(linear)
    assert mine.to_csv() == export.result_to_csv(linear)


# ------------------------------------------- every rendering method = the report function


@pytest.fixture(scope="module")
def linear() -> FlopResult:
    return flopcount.count_flops(nn.Linear(4, 3), torch.zeros(2, 4))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 4 * 4, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)))


ROOFS = Roofs({"float32": 1e11}, 1e10, "test roofs", "given")
X = torch.randn(2, 3, 6, 6)


@pytest.fixture(scope="module")
def readings() -> Dict[str, Any]:
    torch.manual_seed(0)
    net = _Net()
    count = flopcount.count_flops(net, X, backward=True)
    steps = tuple(flopcount.count_flops(net, X[:1]) for _ in range(2))
    clock = FakeClock()
    return {
        "count": count,
        "generation": flopcount.GenerationResult(count, steps, batch=2, prompt_tokens=6, new_tokens=3, kv_cache_bytes=4096),
        "memory": flopcount.estimate_memory(net, X, backward=True, optimizer="adam"),
        "plan": flopcount.plan(_Net, (X,), fsdp=2, loss_fn=lambda out: out.sum()),
        "profile": flopcount.profile(net, X, roofs=ROOFS, warmup=0, steps=1),
        "predict": flopcount.predict(net, X, on=ROOFS),
        "bench": flopcount.benchmark(_Ticking(clock), torch.zeros(2, 4), warmup=1, iters=5, timer=clock),
        "budget": flopcount.check_result(count, flopcount.Budget(max_flops=1e3, max_params=1e6, max_latency_s=0.005),
                                         latency_s=0.0015),
    }


class _Ticking(nn.Module):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.now += 2_000_000  # 2 ms a call
        return x


Case = Tuple[str, Callable[[Any], Any], Callable[[Any], Any]]
CASES: List[Case] = [
    ("count", lambda r: r.table(), lambda r: table.module_table(r)),
    ("count", lambda r: r.table(1, show_zero=False), lambda r: table.module_table(r, 1, show_zero=False)),
    ("count", lambda r: str(r), lambda r: table.module_table(r)),
    ("count", lambda r: r.operator_table(), lambda r: table.operator_table(r)),
    ("count", lambda r: r.tree(), lambda r: tree.module_tree(r)),
    ("count", lambda r: r.tree(1), lambda r: tree.module_tree(r, 1)),
    ("count", lambda r: r.to_dict(), lambda r: export.result_to_dict(r)),
    ("count", lambda r: r.to_json(), lambda r: json.dumps(export.result_to_dict(r), indent=2)),
    ("count", lambda r: r.to_json(None), lambda r: json.dumps(export.result_to_dict(r), indent=None)),
    ("count", lambda r: r.to_csv(), lambda r: export.result_to_csv(r)),
    ("count", lambda r: r.to_csv(1), lambda r: export.result_to_csv(r, 1)),
    ("count", lambda r: r.to_markdown(), lambda r: table.module_table(r, fmt="github")),
    ("count", lambda r: r.to_markdown(1), lambda r: table.module_table(r, 1, fmt="github")),
    ("generation", lambda r: r.table(), lambda r: generation.generation_table(r)),
    ("generation", lambda r: str(r), lambda r: generation.generation_table(r)),
    ("generation", lambda r: r.to_dict(), lambda r: generation.generation_to_dict(r)),
    ("generation", lambda r: r.to_json(), lambda r: json.dumps(generation.generation_to_dict(r), indent=2)),
    ("memory", lambda r: r.table(), lambda r: memory.memory_table(r)),
    ("memory", lambda r: r.table(None, "github"), lambda r: memory.memory_table(r, None, "github")),
    ("memory", lambda r: r.to_dict(), lambda r: memory.memory_to_dict(r)),
    ("memory", lambda r: r.to_json(), lambda r: json.dumps(memory.memory_to_dict(r), indent=2)),
    ("plan", lambda r: r.table(), lambda r: plan.plan_table(r)),
    ("plan", lambda r: str(r), lambda r: plan.plan_table(r)),
    ("plan", lambda r: r.to_markdown(), lambda r: plan.plan_markdown(r)),
    ("profile", lambda r: r.table(), lambda r: profile.profile_table(r)),
    ("profile", lambda r: r.table("op", 3), lambda r: profile.profile_table(r, by="op", limit=3)),
    ("profile", lambda r: str(r), lambda r: profile.profile_table(r)),
    ("profile", lambda r: r.to_markdown("module"), lambda r: profile.profile_table(r, by="module", limit=None, fmt="github")),
    ("profile", lambda r: r.to_csv(), lambda r: profile.profile_csv(r)),
    ("profile", lambda r: r.to_csv("operator"), lambda r: profile.profile_csv(r, by="operator")),
    ("predict", lambda r: r.table(), lambda r: profile.predict_table(r)),
    ("predict", lambda r: r.table(2), lambda r: profile.predict_table(r, limit=2)),
    ("predict", lambda r: str(r), lambda r: profile.predict_table(r)),
    ("bench", lambda r: str(r), lambda r: report_bench.benchmark_text(r)),
    ("budget", lambda r: r.table(), lambda r: report_budget.budget_table(r)),
    ("budget", lambda r: r.table("github"), lambda r: report_budget.budget_table(r, "github")),
]


@pytest.mark.parametrize("reading, method, direct", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_rendering_method_is_its_report_function(readings: Dict[str, Any], reading: str, method: Any, direct: Any) -> None:
    got, expected = method(readings[reading]), direct(readings[reading])
    assert got == expected
    assert got  # a rendering that is empty on both sides would prove nothing


def test_budget_line_uses_the_shared_value_formatter(readings: Dict[str, Any]) -> None:
    line = next(line for line in readings["budget"].lines if line.name == "latency")
    assert line.describe() == "latency 1.500 ms <= 5.000 ms"  # seconds in the data, ms in the text
    from flopcount.report.budget import show_value

    assert show_value(1.5, "ms") == "1.500 ms"  # still importable where it used to live


def test_chrome_trace_and_roofline_plot_go_through_the_report(readings: Dict[str, Any], tmp_path: Path) -> None:
    result = readings["profile"]
    result.export_chrome_trace(str(tmp_path / "trace.json"))
    expected = json.loads(json.dumps(profile.enriched_trace(result.trace, result.trace_args)))
    assert json.loads((tmp_path / "trace.json").read_text()) == expected
    pytest.importorskip("matplotlib")
    result.plot_roofline(str(tmp_path / "a.svg"), label_top=2)
    roofline_plot.plot_roofline(result, tmp_path / "b.svg", label_top=2)
    assert (tmp_path / "a.svg").stat().st_size > 0
    assert (tmp_path / "a.svg").read_text().count("<path") == (tmp_path / "b.svg").read_text().count("<path")


def test_a_profile_without_its_trace_says_so_before_writing(readings: Dict[str, Any], tmp_path: Path) -> None:
    from dataclasses import replace

    bare = replace(readings["profile"], trace=None)
    with pytest.raises(ValueError, match="kept no trace"):
        bare.export_chrome_trace(str(tmp_path / "t.json"))
    assert not (tmp_path / "t.json").exists()
