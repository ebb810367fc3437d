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

The server only imports: it runs no torch op before forking, so no child inherits a thread pool
(OpenMP's threads do not survive a fork)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

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


def _child(conn: socket.socket, fds: List[int], request: Dict[str, Any]) -> None:
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        # the console script's sys.path: its own folder first, not this file's
        sys.path[0] = str(Path(sys.executable).parent)
        from flopcount.cli import main

        try:
            code = _exit_code(main())
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


def serve(socket_path: str) -> None:
    for name in PRELOAD:
        importlib.import_module(name)
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
            _child(conn, fds, request)
        conn.close()
        for fd in fds:
            os.close(fd)


class CliServer:
    """The server process and the folder holding its ``flopcount`` shim (put it first on PATH)."""

    def __init__(self, folder: Path, env: Optional[Dict[str, str]] = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        socket_path = str(folder / "cli.sock")
        self.bin = folder / "bin"
        self.bin.mkdir(exist_ok=True)
        shim = self.bin / "flopcount"
        shim.write_text(SHIM.format(python=sys.executable, socket_path=socket_path))
        shim.chmod(0o755)
        self.process = subprocess.Popen([sys.executable, __file__, socket_path], stdout=subprocess.PIPE, env=env, text=True)
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


if __name__ == "__main__":
    serve(sys.argv[1])
