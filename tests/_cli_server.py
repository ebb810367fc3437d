"""A fork server for the ``flopcount`` command where a test runs it through another program (the
CI recipes of docs/ci.md: the workflow's bash steps, pre-commit's hook).

Each ``flopcount`` process starts Python and imports torch, about 2.5 s of CPU here, and the CI
recipes run a dozen of them. The server imports those modules once; a ``flopcount`` shim put first
on PATH hands each invocation (argv, working directory, environment and its stdin, stdout and
stderr themselves, passed as file descriptors) to a child forked from the server, which runs the
console script's function (``flopcount.cli:main``) and sends back its exit code, which the shim
exits with. Bash, git and pre-commit stay real, and so do the files, streams and exit codes they
see; what the shim skips is the interpreter's start and torch's import (so what torch reads from the
environment when imported is the server's: the tests here set none of it).
``tests/cli/test_cli.py`` and ``tests/test_install.py`` run the real console script.

The same server, started with ``preload=("torch",)``, stands in for ``python -c CODE`` and ``python -m
MODULE`` in tests that need a process of their own but not a fresh interpreter
(:class:`PythonServer`, the ``fresh_python`` fixture of tests/conftest.py): a process-wide flag set
for good, a peak RSS, a crash that must not take pytest with it. Its children have imported torch
and nothing of flopcount, transformers or lightning; a test that checks what importing flopcount
does to a bare interpreter (torch not imported) keeps a real one. A second such server, started
with transformers' LLaMA modelling code preloaded too (conftest's ``fresh_python_with_transformers``),
serves the children that build transformers models.

The server only imports: it runs no torch op before forking, so no child inherits a thread pool
(OpenMP's threads do not survive a fork). A ``python`` child runs with the test process's number of
torch threads (its share of the cores under pytest-xdist, tests/conftest.py), as the test would have
run the same code itself."""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import traceback
import types
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

#: what a ``flopcount count / check / diff`` imports on its way (python -X importtime)
PRELOAD = (
    "torch", "torch._dynamo", "flopcount.cli", "flopcount.cli.commands", "flopcount.cli.entry",
    "flopcount.counting.count", "flopcount.diffs", "flopcount.report",
)

SHIM = '''#!{python} -S
# flopcount, served by tests/_cli_server.py (a fork of a process that has imported torch)
import json, os, socket, struct, sys

conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect({socket_path!r})
payload = json.dumps({{"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(conn, [struct.pack("!Q", len(payload))], [0, 1, 2])
conn.sendall(payload)
reply = b""
while len(reply) < 4:
    chunk = conn.recv(4 - len(reply))
    if not chunk:
        sys.stderr.write("flopcount (test shim): the forked command died without an exit code\\n")
        sys.exit(70)
    reply += chunk
sys.exit(struct.unpack("!i", reply)[0])
'''


def _read(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the shim hung up")
        data += chunk
    return data


def _exit_code(value: Any) -> int:
    """What ``sys.exit(value)`` leaves as the process's status."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    sys.stderr.write(f"{value}\n")
    return 1


def _run_python(request: Dict[str, Any]) -> int:
    """``python -c CODE ARGS`` or ``python -m MODULE ARGS`` in this (forked) process: sys.argv and
    sys.path[0] as the interpreter sets them, PYTHONPATH entries the server lacks put after it."""
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[1:1] = extra
    if "threads" in request:
        # the test process's share of the cores (tests/conftest.py), not torch's default of one
        # thread per core: the test waits while its child runs, so the child stands in for it
        import torch

        torch.set_num_threads(request["threads"])
    if "code" in request:
        sys.argv = ["-c", *request["args"]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main
        exec(compile(request["code"], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = ["-m", *request["args"]]
        sys.path[0] = os.getcwd()
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    return 0


def _child(conn: socket.socket, fds: List[int], request: Dict[str, Any], reply: bool = True) -> None:
    """Runs the request with the given stdin, stdout and stderr and exits with its code, which it
    sends back itself when ``reply`` (a ``python`` request's waiter sends it instead)."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        try:
            if "argv" in request:
                sys.argv = list(request["argv"])
                # the console script's sys.path: its own folder first, not this file's
                sys.path[0] = str(Path(sys.executable).parent)
                from flopcount.cli import main

                code = _exit_code(main())
            else:
                code = _run_python(request)
        except SystemExit as stop:
            code = _exit_code(stop.code)
        except BaseException:
            traceback.print_exc()
            code = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                code = 120  # what Python exits with when flushing stdout at exit fails
    finally:
        try:
            if reply:
                conn.sendall(struct.pack("!i", code))
        finally:
            os._exit(code)


def _reap(flags: int) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, flags)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _stop(signum: int, frame: Any) -> None:
    _reap(0)
    os._exit(0)


def _waiter(conn: socket.socket, fds: List[int], request: Dict[str, Any]) -> None:
    """Forks the child that runs the request and sends back how it ended: its exit code, or minus
    the signal that killed it (as subprocess reports it), so that a crash is seen as one."""
    try:
        pid = os.fork()
        if pid == 0:
            _child(conn, fds, request, reply=False)
        for fd in fds:
            os.close(fd)
        conn.sendall(struct.pack("!i", pid))
        _, status = os.waitpid(pid, 0)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        conn.sendall(struct.pack("!i", code))
    finally:
        os._exit(0)


def serve(socket_path: str, preload: Sequence[str] = PRELOAD) -> None:
    for name in preload:
        importlib.import_module(name)
    # What the imports made lives as long as every child (modules, torch's op tables: ~350,000
    # objects with torch alone) and is never garbage: frozen, so that no child's garbage
    # collection walks it again. A child's collections still walk everything the child makes,
    # which is what a test that must survive a collection (tests/test_generation_fake_path.py)
    # needs; a full one walked the whole heap before, ~0.17 s each, many times a child.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(16)
    # children are waited for (not left to the kernel), so that their CPU time counts in this
    # process's children's and in the suite's (/usr/bin/time)
    signal.signal(signal.SIGTERM, _stop)
    parent = os.getppid()
    listener.settimeout(5.0)
    print("ready", flush=True)
    while True:
        _reap(os.WNOHANG)
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            if os.getppid() != parent:  # the test process is gone (killed): do not outlive it
                _stop(signal.SIGTERM, None)
            continue
        conn.settimeout(None)
        header, fds, _, _ = socket.recv_fds(conn, 8, 3)
        header += _read(conn, 8 - len(header))
        (size,) = struct.unpack("!Q", header)
        request = json.loads(_read(conn, size))
        if os.fork() == 0:
            listener.close()
            if "argv" in request:
                _child(conn, fds, request)
            _waiter(conn, fds, request)
        conn.close()
        for fd in fds:
            os.close(fd)


class CliServer:
    """The server process and the folder holding its ``flopcount`` shim (put it first on PATH)."""

    def __init__(self, folder: Path, env: Optional[Dict[str, str]] = None, preload: Sequence[str] = PRELOAD) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.socket_path = str(folder / "cli.sock")
        self.bin = folder / "bin"
        self.bin.mkdir(exist_ok=True)
        shim = self.bin / "flopcount"
        shim.write_text(SHIM.format(python=sys.executable, socket_path=self.socket_path))
        shim.chmod(0o755)
        self.process = subprocess.Popen([sys.executable, __file__, self.socket_path, ",".join(preload)],
                                        stdout=subprocess.PIPE, env=env, text=True)
        assert self.process.stdout is not None
        ready = self.process.stdout.readline().strip()
        if ready != "ready":
            self.close()
            raise RuntimeError(f"the flopcount test server did not start (exit {self.process.returncode})")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()


class PythonServer:
    """``python -c`` / ``python -m`` run in a child forked from a process that has imported torch
    (and nothing of flopcount), or the modules ``preload`` names: :meth:`run` takes subprocess.run's
    arguments for those two command lines and returns what it would. Started on the first run; the
    server's ``sys.path`` is this process's, so the children import the flopcount this process imports."""

    def __init__(self, folder: Path, preload: Sequence[str] = ("torch",)) -> None:
        self.folder = folder
        self.preload = tuple(preload)
        self.server: Optional[CliServer] = None

    def run(self, args: Sequence[str], *, cwd: Any = None, env: Optional[Dict[str, str]] = None,
            stdin: Any = None, stdout: Any = None, stderr: Any = None, capture_output: bool = False,
            text: bool = False, timeout: Optional[float] = None, check: bool = False) -> subprocess.CompletedProcess[Any]:
        if len(args) < 3 or args[0] != sys.executable or args[1] not in ("-c", "-m"):
            raise ValueError(f"PythonServer runs [sys.executable, '-c' or '-m', ...], not {list(args)!r}")
        if self.server is None:
            path = os.pathsep.join(p for p in sys.path if p)
            self.server = CliServer(self.folder, {**os.environ, "PYTHONPATH": path}, preload=self.preload)
        request: Dict[str, Any] = {"cwd": str(cwd or os.getcwd()), "env": dict(os.environ if env is None else env),
                                   "args": list(args[3:])}
        if "torch" in sys.modules:
            # torch's threads as this process has them: under pytest-xdist each worker runs one per
            # core it shares (tests/conftest.py), and a child left at torch's default of one per core
            # spun its OpenMP threads against the other worker (a real generate() took 2-3x the CPU)
            request["threads"] = sys.modules["torch"].get_num_threads()
        request["code" if args[1] == "-c" else "module"] = args[2]
        if capture_output:
            stdout = stderr = subprocess.PIPE
        with contextlib.ExitStack() as stack:
            streams: List[Any] = []
            for index, given in enumerate((stdin, stdout, stderr)):
                if given == subprocess.PIPE:
                    given = stack.enter_context(tempfile.TemporaryFile())
                elif given == subprocess.DEVNULL:
                    given = stack.enter_context(open(os.devnull, "rb" if index == 0 else "wb"))
                elif given == subprocess.STDOUT and index == 2:
                    given = streams[1]
                elif given is None:
                    # no stdin to read; stdout and stderr this process's own (pytest captures them)
                    given = stack.enter_context(open(os.devnull, "rb")) if index == 0 else index
                streams.append(given)
            fds = [s if isinstance(s, int) else s.fileno() for s in streams]
            conn = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            conn.connect(self.server.socket_path)
            payload = json.dumps(request).encode()
            socket.send_fds(conn, [struct.pack("!Q", len(payload))], fds)
            conn.sendall(payload)
            conn.settimeout(timeout)
            (pid,) = struct.unpack("!i", _read(conn, 4))
            try:
                (code,) = struct.unpack("!i", _read(conn, 4))
            except socket.timeout:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(list(args), timeout or 0.0) from None
            captured: List[Any] = []
            for given, stream in ((stdout, streams[1]), (stderr, streams[2])):
                data: Any = None
                if given == subprocess.PIPE:
                    stream.seek(0)
                    data = stream.read()
                    data = data.decode() if text else data
                captured.append(data)
        done = subprocess.CompletedProcess(list(args), code, captured[0], captured[1])
        if check:
            done.check_returncode()
        return done

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


if __name__ == "__main__":
    serve(sys.argv[1], [name for name in sys.argv[2].split(",") if name] if len(sys.argv) > 2 else PRELOAD)
