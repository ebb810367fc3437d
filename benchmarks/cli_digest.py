"""A digest of what the ``flopcount`` command prints, to compare two trees (issue #27: a clean-up
of the CLI and the renderers must leave every report, message and exit code as it was).

    PYTHONPATH=. python benchmarks/cli_digest.py > after.txt
    git archive BASE | tar -x -C /tmp/base && cp benchmarks/cli_digest.py /tmp/base/benchmarks/
    (cd /tmp/base && PYTHONPATH=. python benchmarks/cli_digest.py) > before.txt
    diff before.txt after.txt

About 160 command lines run in this process (``flopcount.cli.main``) in a scratch folder holding a
small CNN factory, a token model, two saved reports and a pyproject-style config: ``--help`` of
every command, every output format of count (with ``--memory``, ``--on``, ``--operators``,
``--backward``, ``--optimizer``, ``--generate`` on a one-layer GPT-2), bench, check (budgets,
``--on`` bounds, ``--baseline`` gates, ``--fsdp``, a bare ``check`` reading its config), diff,
profile, plan, serve and roofs, and the bad inputs each refuses. Per line: the exit code and a
hash (SHA-256, first 16 hex digits) of stdout, stderr and the files written. What a timing moves
(bench, profile, a measured latency) is compared by its words only: numbers, unit prefixes,
spacing and the noise warnings left out. Needs transformers and matplotlib.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(width * 8 * 8, 16), nn.Dropout(0.1), nn.Linear(16, 4))

    def forward(self, x):
        return self.head(self.features(x))


def build(width: int = 8):
    return Net(width), (torch.randn(2, 3, 16, 16),)


def bigger():
    return Net(12), (torch.randn(2, 3, 16, 16),)


class Tok(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.lin = nn.Linear(16, 50)

    def forward(self, ids, mask=None, scale: float = 1.0):
        h = self.emb(ids) * scale
        if mask is not None:
            h = h * mask.unsqueeze(-1)
        return self.lin(h)


def tok():
    return Tok()
'''
CONFIG = '[tool.flopcount]\nentry = "model.py:build"\ninput = ["2x3x16x16"]\nmax-flops = "1G"\nmax-params = "1M"\n'
M = "model.py:build"
GPT = "hf:gpt2 --config n_layer=1 --config n_embd=32 --config n_head=2"
COMMANDS = [
    "--help", "count --help", "bench --help", "check --help", "diff --help", "profile --help", "plan --help",
    "serve --help", "roofs --help", "--version", "",
    f"count {M}", f"count {M} --depth 1", f"count {M} --format tree", f"count {M} --format json", f"count {M} --format csv",
    f"count {M} --format markdown --operators", f"count {M} --operators", f"count {M} --format html",
    f"count {M} --backward --depth 1", f"count {M} --optimizer adamw --memory --depth 1", f"count {M} --memory --format json",
    f"count {M} --memory --format markdown", f"count {M} --memory --format csv", f"count {M} --on h100",
    f"count {M} --on h100 --format json", f"count {M} --on h100 --format csv", f"count {M} --tracer jit",
    f"count {M} --tracer dispatch --format json", f"count {M} --device meta", f"count {M} --dtype bfloat16 --depth 0",
    f"count {M} --config width=4 --depth 0", f"count {M} --eval", f"count {M} --backward --eval --depth 0",
    f"count {M} --input 4x3x16x16 --depth 0", f"count {M} --input 4x3x16x16 --input 1x2", f"count {M} --input 4x3x8x8",
    "count model.py:tok --input 2x7:int64 --kwarg mask=2x7:bool --kwarg scale=float:0.5 --format json",
    "count model.py:tok --input 2x7:int64 --kwarg mask=2x7:int64 --kwarg mask=2x7:int64",
    "count model.py:tok --input 2x7:int64 --kwarg scale=int:x", "count model.py:tok",
    "count model.py:tok --input 2x7:int64 --strict", f"count {M} --input 0x3", f"count {M} --input 2x3:float99",
    "count nosuch.py:build", "count model.py:nope", "count model.py", "count example:resnet99",
    "count example:resnet18 --depth 0 --device meta", "count hf:nosuchmodel", f"count {M} --device cuda",
    f"count {M} --device tpu", f"count {M} --output /nonexistent/x.txt", f"count {M} --output model.py",
    f"count {M} --output out_count.txt", f"count {M} --plot out.png --depth 1", f"count {M} --plot out.xyz",
    f"count {M} --plot out.png --plot-kind sunburst", f"count {M} --generate 2", f"count {M} --tensorboard tb --generate 2",
    f"count {M} --max-flops 1G", f"count {M} --depth -1", f"count {M} --seed 2**70", f"count {M} --device meta --tracer jit",
    f"count {M} --memory --format html", f"count {M} --timeout 0", f"count {M} --timeout abc", f"count {M} --predict h100 --depth 0",
    f"count {GPT} --input 1x8:int64 --generate 3", f"count {GPT} --input 1x8:int64 --generate 3 --format json",
    f"count {GPT} --input 1x8:int64 --generate 3 --format csv", f"count {GPT} --input 1x8:int64 --generate 3 --format markdown",
    "count hf:gpt2 --config n_lay=1", "count hf:gpt2 --config n_layer=x1 --depth 0 --device meta",
    f"bench {M} --iters 3 --warmup 1", f"bench {M} --iters 3 --warmup 1 --format json", f"bench {M} --iters 3 --warmup 1 --format csv",
    f"bench {M} --iters 3 --warmup 1 --format markdown", f"bench {M} --iters 3 --warmup 1 --format tree --depth 1",
    f"bench {M} --iters 3 --warmup 1 --format html", f"bench {M} --iters 3 --duration 1", f"bench {M} --device meta",
    f"bench {M} --iters 3 --warmup 1 --plot bench.png -q",
    f"check {M} --max-flops 1G --max-params 30M", f"check {M} --max-flops 1K", f"check {M} --max-flops 1G --format json",
    f"check {M} --max-flops 1G --format csv", f"check {M} --max-flops 1G --format markdown",
    f"check {M} --max-flops 1G --format tree --depth 0", f"check {M} --max-flops 1G --format html",
    f"check {M} --max-memory 1GB --optimizer adam", f"check {M} --max-memory 1KB", f"check {M}", f"check {M} --max-latency 5",
    f"check {M} --max-latency -5ms", f"check {M} --max-latency 10s --on h100", f"check {M} --max-latency 1ns --on h100",
    f"check {M} --max-latency 10s --on h100 --bound eager", f"check {M} --bound any --max-flops 1G",
    f"check {M} --on h100 --max-flops 1G", f"check {M} --max-latency 10ms --max-latency-ms 5",
    f"check {M} --max-latency-ms 5000 --iters 3 --warmup 1 --format json", f"check {M} --max-memory 1GB --fsdp 2",
    f"check {M} --max-memory 1GB --fsdp 2 --format json", f"check {M} --max-growth flops=2%", f"check {M} --baseline base.json",
    f"check {M} --baseline base.json --max-growth flops=0,params=0", f"check {M} --config width=12 --baseline base.json",
    f"check {M} --config width=12 --baseline base.json --format json", f"check {M} --config width=12 --baseline base.json --format csv",
    f"check {M} --config width=12 --baseline base.json --format markdown", f"check {M} --baseline base.json --max-growth memory=5%",
    f"check {M} --baseline nosuch.json", f"check {M} --backward --baseline base.json",
    f"check {M} --max-growth bogus=1 --baseline base.json", "check", "check --config-file cfg.toml", "check --config-file nosuch.toml",
    f"check {M} --config-file cfg.toml --format json",
    "diff base.json big.json", "diff base.json big.json --format markdown", "diff base.json big.json --format json",
    "diff base.json big.json --format csv", "diff base.json big.json --top 2", "diff base.json big.json --input 2x3",
    f"diff base.json {M} --b-config width=12 --depth 1", f"diff {M} {M} --a-config width=4 --memory --format markdown",
    "diff base.json model.py:tok --a-input 2x3", f"diff {M} model.py:bigger --backward --top 3",
    f"profile {M} --steps 1 --warmup 0 --roofs 100G,10G --format json -q", f"profile {M} --steps 1 --warmup 0 --roofs 100G,10G -q",
    f"profile {M} --device meta", f"profile {M} --tracer jit", f"profile {M} --depth 1", f"profile {M} --roofs 1T", f"profile {M} --eval",
    f"profile {M} --plot-kind sunburst --plot x.png",
    f"plan {M} --fsdp 2 --format json", f"plan {M} --fsdp 2 --tp 1", f"plan {M} --fsdp 2 --format markdown --on a100",
    f"plan {M} --on nosuchgpu", f"plan {M} --link nosuchlink", f"plan {M} --device h100 --fsdp 1", f"plan {M} --fsdp 0",
    f"serve {GPT} --prompt 16 --new 4 --batch 1,8 --on h100,l4", f"serve {GPT} --prompt 16 --new 4 --format json",
    f"serve {GPT} --prompt 16 --new 4 --format markdown --weight-dtype int8", "serve hf:gpt2 --batch 0", "serve hf:gpt2 --batch x",
    "serve hf:gpt2 --reserve 2", "serve hf:gpt2 --on ,", "serve hf:gpt2 --on nosuch",
    "roofs h100", "roofs h100 --format json", "roofs 'H100 NVL' --matmul-tf32", "roofs h100 --remeasure", "roofs --matmul-tf32",
    "roofs nosuchpart",
]
VOLATILE = ("bench ", "profile ", "--max-latency-ms 5000")
WRITTEN = ("out_count.txt", "out.png", "bench.png", "x.png")


def _words(text: str) -> str:
    """A timed report's words: no numbers, unit prefixes, spacing or noise warnings."""
    kept = "\n".join(line for line in text.splitlines() if "noisy" not in line and "the first call took" not in line)
    kept = re.sub(r"[-+]?\d[\d.,]*(e[-+]?\d+)?", "#", re.sub(r"base64,[A-Za-z0-9+/=]+", "", kept))
    return " ".join(sorted({w for w in re.findall(r"[A-Za-z_]{4,}", kept) if not re.fullmatch(r"[KMGT]?(FLOPs?|MACs?)", w)}))


def _run(argv: list) -> tuple:
    from flopcount.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="flopcount-cli-digest-") as folder:
        os.chdir(folder)
        Path("model.py").write_text(MODELS)
        Path("cfg.toml").write_text(CONFIG)
        _run(["count", M, "--memory", "--format", "json", "-o", "base.json", "-q"])
        _run(["count", "model.py:bigger", "--format", "json", "-o", "big.json", "-q"])
        for line in COMMANDS:
            code, out, err = _run(shlex.split(line))
            files = ""
            for name in WRITTEN:
                if os.path.exists(name):
                    files += f"{name}:" + (Path(name).read_text() if name.endswith(".txt") else "written")
                    os.remove(name)
            if any(mark in f" {line} " for mark in VOLATILE):
                out, err = _words(out), _words(err)
            digest = hashlib.sha256("\0".join((out, err, files)).encode()).hexdigest()[:16]
            print(f"{code}  {digest}  {line}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
