"""The fork server that stands in for ``python -c`` / ``python -m`` (conftest's ``fresh_python``,
``PythonServer`` in tests/_cli_server.py) reports what a new interpreter would: argv, working
directory, environment, streams, exit codes, a death by signal, a timeout. The expectations are
what subprocess.run documents for a real child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest


def test_argv_cwd_env_and_both_streams(fresh_python: Any, tmp_path: Any) -> None:
    code = ("import os, sys; print(sys.argv, os.getcwd(), os.environ['MARK'], sys.path[0] == '', "
            "'torch' in sys.modules, 'flopcount' in sys.modules); print('to stderr', file=sys.stderr); sys.exit(3)")
    done = fresh_python.run([sys.executable, "-c", code, "a", "b"], cwd=tmp_path, env={**os.environ, "MARK": "m1"},
                            capture_output=True, text=True)
    # a child of a server that imported torch (and nothing of flopcount), as python -c sets sys.argv and sys.path[0]
    assert done.stdout == f"['-c', 'a', 'b'] {tmp_path} m1 True True False\n"
    assert (done.stderr, done.returncode) == ("to stderr\n", 3)


def test_an_uncaught_exception_exits_1_with_its_traceback(fresh_python: Any) -> None:
    done = fresh_python.run([sys.executable, "-c", "raise ValueError('bad value')"], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.rstrip().endswith("ValueError: bad value")
    with pytest.raises(subprocess.CalledProcessError):
        fresh_python.run([sys.executable, "-c", "raise SystemExit(2)"], check=True)


def test_a_crash_is_minus_the_signal(fresh_python: Any) -> None:
    done = fresh_python.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert done.returncode == -signal.SIGSEGV


def test_a_module_as_main_and_stderr_into_stdout(fresh_python: Any) -> None:
    done = fresh_python.run([sys.executable, "-m", "flopcount", "--version"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    assert done.returncode == 0 and done.stdout.startswith("flopcount ") and done.stderr is None


def test_a_timeout_kills_the_child(fresh_python: Any) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        fresh_python.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    # the server still serves
    assert fresh_python.run([sys.executable, "-c", "pass"]).returncode == 0


def test_only_python_c_and_m_command_lines(fresh_python: Any) -> None:
    with pytest.raises(ValueError, match="PythonServer runs"):
        fresh_python.run(["bash", "-c", "true"])


def test_a_child_runs_with_the_test_process_s_torch_threads(fresh_python: Any) -> None:
    """Under pytest-xdist a worker runs torch on its share of the cores (tests/conftest.py); its
    child stands in for it while it waits, so it runs on as many threads, not on torch's default of
    one per core (whose OpenMP threads spun against the other worker's: a real generate() in
    tests/test_generation_fake_path.py's child took 2-3x the CPU). Two counts the test sets, each
    read back from the child's own torch."""
    import torch

    saved = torch.get_num_threads()
    seen = []
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            done = fresh_python.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                    capture_output=True, text=True, check=True)
            seen.append(int(done.stdout))
    finally:
        torch.set_num_threads(saved)
    assert seen == [1, 3]


def test_the_transformers_server_s_children_start_with_its_llama_and_the_torch_server_s_without(
    fresh_python: Any, fresh_python_with_transformers: Any
) -> None:
    """Two servers (tests/conftest.py): fresh_python's children have imported torch and nothing of
    transformers or flopcount (what tests/test_architecture.py's "no trainer framework" starts
    from); fresh_python_with_transformers's have transformers' LLaMA modelling code too, so that a
    child building a LLaMA does not import it again (~2.5 s of CPU), and nothing of flopcount."""
    code = ("import sys; print('torch' in sys.modules, 'transformers.models.llama.modeling_llama' in sys.modules, "
            "'flopcount' in sys.modules)")
    seen = [server.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
            for server in (fresh_python, fresh_python_with_transformers)]
    assert seen == [["True", "False", "False"], ["True", "True", "False"]]
