"""Mutation check of the handler tests: does a changed constant in a handler fail a test?

For a sample of handlers across the families, each mutant (one FLOP more per call, or the
cost doubled; planted by the ``_mutant`` pytest plugin, in a subprocess) runs the handler-level
tests with ``-x``: the family's own test file first, then the shared set. A mutant is
*killed* when a test fails, *survives* when all pass. Prints one line per mutant and a summary;
exits 1 if any mutant survived. Not part of ``make test`` (minutes of CPU).

    .venv/bin/python benchmarks/mutation_check.py [--only OP] [--kinds plus1,double] [--family-only]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Sequence, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

HANDLERS = "tests/handlers/test_handlers.py"
ARITH = "tests/handlers/test_handlers_arith.py"

#: (family, op names the mutant changes, the family's test file run first)
SAMPLE: Sequence[Tuple[str, Tuple[str, ...], str]] = (
    ("matmul", ("aten::mm",), HANDLERS),
    ("matmul", ("aten::addmm",), HANDLERS),
    ("matmul", ("aten::linear",), HANDLERS),
    ("moe", ("aten::_grouped_mm",), "tests/handlers/test_moe.py"),
    ("conv", ("aten::convolution",), HANDLERS),
    ("conv", ("aten::convolution_backward",), "tests/tracers/test_dispatch_backward.py"),
    ("pointwise", ("aten::add",), HANDLERS),
    ("pointwise", ("aten::gelu",), HANDLERS),
    ("pointwise", ("aten::glu_backward",), ARITH),
    ("reduce", ("aten::sum",), HANDLERS),
    ("reduce", ("aten::softmax",), HANDLERS),
    ("reduce", ("aten::quantile",), ARITH),
    ("norm", ("aten::layer_norm",), HANDLERS),
    ("norm", ("aten::batch_norm",), HANDLERS),
    ("pool", ("aten::max_pool2d",), HANDLERS),
    ("pool", ("aten::adaptive_avg_pool2d",), HANDLERS),
    ("attention", ("aten::scaled_dot_product_attention",), "tests/conformance/test_torch_flop_counter.py"),
    ("loss", ("aten::cross_entropy_loss",), HANDLERS),
    ("rnn", ("aten::lstm",), HANDLERS),
    ("fft", ("aten::_fft_r2c",), ARITH),
    ("linalg", ("aten::linalg_solve",), ARITH),
    ("distance", ("aten::cdist",), ARITH),
    ("sampling", ("aten::grid_sampler_2d",), ARITH),
    ("sampling", ("aten::_upsample_bilinear2d_aa",), ARITH),
    ("sampling", ("aten::_upsample_bicubic2d_aa",), ARITH),
    ("sampling", ("aten::grid_sampler_2d_backward",), ARITH),
    ("fft", ("aten::fft_ihfft2",), ARITH),
    ("linalg", ("aten::linalg_pinv",), ARITH),
    ("linalg", ("aten::ormqr",), ARITH),
    ("distance", ("aten::_pdist_backward",), ARITH),
    ("loss", ("aten::multilabel_margin_loss_backward",), ARITH),
    ("loss", ("aten::_ctc_loss_backward",), ARITH),
    ("pool", ("aten::fractional_max_pool2d_backward",), ARITH),
    ("indexing", ("aten::embedding_bag",), HANDLERS),
    ("quantized", ("quantized::linear",), "tests/handlers/test_quantized.py"),
)

#: run after the family's file: every handler-level test and the live-peer conformance cases
SHARED = (
    "tests/handlers",
    "tests/conformance",
    "tests/tracers/test_crosscheck.py",
    "tests/tracers/test_composite_formulas.py",
    "tests/tracers/test_dispatch_backward.py",
    "tests/tracers/test_agreement.py",
)


def run_mutant(ops: Sequence[str], kind: str, first: str, python: str, shared: bool = True) -> Tuple[str, float, str]:
    """(killed | survived | error, seconds, the first failing test or the error's last line)."""
    env = dict(os.environ)
    env["FLOPCOUNT_MUTANT"] = f"{','.join(ops)}:{kind}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
    paths = [first] + [p for p in SHARED if p != first and shared]
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "_mutant", "-p", "no:cacheprovider", "-W", "ignore", *paths]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode == 0:
        return "survived", seconds, ""
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    if proc.returncode == 1 and failed:
        return "killed", seconds, failed[0][len("FAILED ") :].split(" - ")[0]
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    return "error", seconds, tail[-1] if tail else f"exit {proc.returncode}"


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="run the mutants of this op only (repeatable)")
    parser.add_argument("--kinds", default="plus1,double", help="comma-separated: plus1, double")
    parser.add_argument("--family-only", action="store_true", help="run only each mutant's family test file (quick)")
    args = parser.parse_args(list(argv) or None)
    kinds = [k for k in args.kinds.split(",") if k]
    rows: List[Tuple[str, str, str, str, float, str]] = []
    for family, ops, first in SAMPLE:
        if args.only and not set(args.only) & set(ops):
            continue
        for kind in kinds:
            verdict, seconds, where = run_mutant(ops, kind, first, sys.executable, shared=not args.family_only)
            rows.append((family, ",".join(ops), kind, verdict, seconds, where))
            print(f"{family:10s} {','.join(ops):36s} {kind:7s} {verdict:8s} {seconds:6.1f}s  {where}", flush=True)
    counts = {v: sum(r[3] == v for r in rows) for v in ("killed", "survived", "error")}
    print(f"\n{len(rows)} mutants: {counts['killed']} killed, {counts['survived']} survived, {counts['error']} errors")
    return 0 if counts["survived"] == counts["error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
