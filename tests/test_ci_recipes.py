"""The CI recipes of docs/ci.md, run as written: the GitHub Actions workflow's flopcount steps on
two revisions of a small model (base branch as origin/main), and the pre-commit hook through
`pre-commit try-repo` on this repository. Expected figures are derived by hand below.

The shell steps, git and pre-commit run for real; the ``flopcount`` they find first on PATH is the
shim of tests/_cli_server.py, which runs the command in a child forked from a process that has
imported torch once (the dozen commands here each spent ~2.5 s of CPU importing it).
tests/cli/test_cli.py and tests/test_install.py run the real console script."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest
from _cli_server import CliServer

ROOT = Path(__file__).resolve().parents[1]
N, IN, OUT = 8, 16, 4

MODEL = textwrap.dedent(
    """
    from torch import nn

    def build():
        return nn.Sequential(nn.Linear({i}, {h}), nn.ReLU(), nn.Linear({h}, {o}))
    """
)
# the same costs, written another way: a refactor
MODEL_REFACTORED = textwrap.dedent(
    """
    from torch import nn

    def build():
        layers = [nn.Linear({i}, {h}), nn.ReLU(), nn.Linear({h}, {o})]
        return nn.Sequential(*layers)
    """
)


def _model(template: str, hidden: int) -> str:
    return template.format(i=IN, h=hidden, o=OUT)


def _workflow() -> Dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "docs" / "ci.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    workflows = [yaml.safe_load(block) for block in blocks if "jobs:" in block]
    assert len(workflows) == 1, "docs/ci.md holds one workflow"
    return dict(workflows[0])


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args], cwd=cwd, check=True,
                   capture_output=True, text=True)


def _base_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@pytest.fixture(scope="module")
def cli_server(tmp_path_factory: Any) -> Any:
    server = CliServer(tmp_path_factory.mktemp("cli-server"), _base_env())
    yield server
    server.close()


def _env(server: CliServer, extra: Dict[str, str]) -> Dict[str, str]:
    env = _base_env()
    env["PATH"] = os.pathsep.join([str(server.bin), str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


def _flopcount_steps(workflow: Dict[str, Any]) -> List[Dict[str, Any]]:
    (job,) = workflow["jobs"].values()
    command = re.compile(r"(^|\s)flopcount (count|diff|check|bench) ", re.M)
    return [step for step in job["steps"] if command.search(str(step.get("run", "")))]


def test_the_workflow_is_a_pull_request_job_with_the_four_steps():
    workflow = _workflow()
    trigger = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert "pull_request" in trigger
    runs = [step["run"] for step in _flopcount_steps(workflow)]
    assert len(runs) == 4
    assert "--format json --output" in runs[0] and "git worktree add" in runs[0]
    assert "--format json --output" in runs[1]
    assert "flopcount diff" in runs[2] and "--format markdown" in runs[2] and "$GITHUB_STEP_SUMMARY" in runs[2]
    assert "flopcount check" in runs[3] and "--baseline" in runs[3]


def _run_workflow(tmp_path: Path, server: CliServer, base_model: str, pr_model: str) -> tuple:
    workflow = _workflow()
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    _git(upstream, "init", "-q", "-b", "main")
    (upstream / "my_model.py").write_text(base_model)
    _git(upstream, "add", "-A")
    _git(upstream, "commit", "-qm", "base")
    _git(upstream, "checkout", "-qb", "pr")
    (upstream / "my_model.py").write_text(pr_model)
    _git(upstream, "commit", "-qam", "pull request")
    work = tmp_path / "work"
    _git(tmp_path, "clone", "-q", "-b", "pr", str(upstream), str(work))
    runner = tmp_path / "runner"
    runner.mkdir()
    summary = tmp_path / "summary.md"
    env_vars = {key: str(value) for key, value in workflow.get("env", {}).items()}
    env_vars.update(FLOPCOUNT_INPUT=f"{N}x{IN}", RUNNER_TEMP=str(runner), GITHUB_STEP_SUMMARY=str(summary))
    assert env_vars["FLOPCOUNT_ENTRY"] == "my_model.py:build"
    env = _env(server, env_vars)
    codes = []
    for step in _flopcount_steps(workflow):
        script = step["run"].replace("${{ github.base_ref }}", "main")
        assert "${{" not in script, "only github.base_ref is substituted here"
        proc = subprocess.run(["bash", "-e", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        codes.append((proc.returncode, proc.stdout, proc.stderr))
        if proc.returncode and step is not _flopcount_steps(workflow)[-1]:
            pytest.fail(f"step {step.get('name')} failed: {proc.stderr}")
    return codes, summary.read_text() if summary.exists() else ""


def test_the_workflow_gates_a_pull_request_that_grows_the_model(tmp_path, cli_server):
    h1, h2 = 32, 48
    codes, summary = _run_workflow(tmp_path, cli_server, _model(MODEL, h1), _model(MODEL, h2))
    gate_code, gate_out, gate_err = codes[-1]
    assert gate_code == 1, gate_err
    # the first layer grew most: N x IN x (h2 - h1) MACs = 2 x that in FLOPs
    assert f"0 (Linear) +{2 * N * IN * (h2 - h1) / 1000:.3f} K" in gate_err
    assert summary.startswith("### flopcount diff: ")
    lines = summary.splitlines()
    assert lines[2].startswith("**FLOPs +")
    macs = N * (h2 - h1) * (IN + OUT)  # both Linear layers widen by h2 - h1
    assert "| MACs " in summary and f"+{macs / 1000:.3f} K" in summary
    assert "<details>" in summary and "</details>" in summary


def test_the_workflow_passes_a_refactor_that_costs_the_same(tmp_path, cli_server):
    codes, summary = _run_workflow(tmp_path, cli_server, _model(MODEL, 32), _model(MODEL_REFACTORED, 32))
    assert codes[-1][0] == 0, codes[-1][2]
    assert "no cost change" in summary and "PASS" in codes[-1][1]


def _pre_commit() -> str:
    found = shutil.which("pre-commit") or str(Path(sys.executable).with_name("pre-commit"))
    if not Path(found).exists():
        pytest.skip("pre-commit is not installed")
    if not (ROOT / ".git").exists():
        pytest.skip("this checkout is not a git repository (try-repo clones it)")
    return found


@pytest.mark.parametrize("hidden, expected", [(32, 0), (40, 1)])
def test_pre_commit_try_repo_runs_the_hook_on_a_scratch_project(tmp_path, cli_server, hidden, expected):
    pre_commit = _pre_commit()
    project = tmp_path / "project"
    project.mkdir()
    _git(project, "init", "-q")
    # a project ignores bytecode: the hook's import rewrites my_model's .pyc (make test writes bytecode),
    # which pre-commit would report as a file the hook modified
    (project / ".gitignore").write_text("__pycache__/\n")
    (project / "my_model.py").write_text(_model(MODEL, 32))
    (project / "pyproject.toml").write_text(textwrap.dedent(
        f"""
        [tool.flopcount]
        entry = "my_model.py:build"
        input = ["{N}x{IN}"]
        baseline = "flopcount-baseline.json"
        max-growth = {{ flops = "2%", params = 0 }}
        """
    ))
    env = _env(cli_server, {"PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")})
    count = subprocess.run(["flopcount", "count", "my_model.py:build", "--input", f"{N}x{IN}", "--format", "json",
                            "--output", "flopcount-baseline.json", "-q"], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert count.returncode == 0, count.stderr
    # the count cached my_model's bytecode, which Python trusts while the source keeps its size and
    # its mtime's second: the edit below keeps the size (32 -> 40) and can land in the same second
    shutil.rmtree(project / "__pycache__", ignore_errors=True)
    (project / "my_model.py").write_text(_model(MODEL, hidden))
    _git(project, "add", "-A")
    proc = subprocess.run([pre_commit, "try-repo", str(ROOT), "flopcount-check", "--all-files"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == expected, out
    if expected:
        assert "- exit code: 1" in out and "grew past the allowance" in out
        # params grew most in the first layer, (IN + 1) x (hidden - 32), then the second, (hidden - 32) x OUT
        assert f"0 (Linear) +{(IN + 1) * (hidden - 32)}, 2 (Linear) +{(hidden - 32) * OUT})" in out
    else:
        assert "Passed" in out
