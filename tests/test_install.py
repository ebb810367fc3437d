"""A new user's first minutes: ``pip install .`` into a fresh virtual environment, then the
README quick start and ``flopcount count example:...`` from a directory that is not the checkout.

The fresh venv sees this interpreter's site-packages through a ``.pth`` line (torch, numpy,
tabulate: no download) but not the checkout, and not any editable install of flopcount (a
``.pth`` path line does not run the ``.pth`` files inside that folder)."""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # ~50 s on the shared 2-core machine (venv + pip install + three runs)

# published figures (REFERENCES.md): conv + linear MACs and parameters at 1x3x224x224
RESNET50_MACS = 4_089_184_256
RESNET50_PARAMS = 25_557_032
RESNET18_PARAMS = 11_689_512
RESNET18_GMACS = 1.814


def _run(args, cwd: Path, env) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"  # a copy, so the build leaves no build/ or egg-info in the checkout
    src.mkdir()
    shutil.copytree(ROOT / "flopcount", src / "flopcount", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    venv = tmp / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, env=env).stdout.strip()
    parents = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "_parent_site.pth").write_text("\n".join(parents) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-build-isolation",
          "--no-index", "--quiet", str(src)], tmp, env)
    work = tmp / "elsewhere"
    work.mkdir()
    return python, venv / "bin" / "flopcount", work, env


def test_installed_copy_is_the_one_imported(installed):
    python, _, work, env = installed
    where = _run([str(python), "-c", "import flopcount; print(flopcount.__file__)"], work, env).stdout.strip()
    assert str(python.parents[1]) in where and str(ROOT) not in where


def test_readme_quick_start_runs_anywhere(installed):
    python, _, work, env = installed
    block = re.search(r"## Quick start\s+```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README has a Quick start python block"
    out = _run([str(python), "-c", block.group(1)], work, env).stdout.splitlines()
    macs, flops, params = (int(x) for x in out[0].split())
    assert (macs, params) == (RESNET50_MACS, RESNET50_PARAMS)
    assert flops > 2 * macs  # conv/linear FLOPs plus BatchNorm, ReLU, pooling, adds
    assert any(line.startswith("layer3") for line in out)


def test_cli_example_entry_runs_anywhere(installed):
    _, flopcount, work, env = installed
    data = json.loads(_run([str(flopcount), "count", "example:resnet18", "--format", "json", "--quiet"], work, env).stdout)
    assert data["params"] == RESNET18_PARAMS
    assert abs(data["macs"] / 1e9 - RESNET18_GMACS) < 0.0005
    assert list(os.listdir(work)) == []  # nothing written where the user stood
