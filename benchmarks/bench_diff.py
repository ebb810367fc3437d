"""Time of `flopcount diff` on LLaMA-70B-sized models (80 layers, built on meta from
transformers' LlamaConfig): the diff of two saved JSON reports (target < 0.2 s), and the diff
of two 70B configs against the time of counting both (target < 2x).

    PYTHONPATH=. python benchmarks/bench_diff.py [--tokens 4096] [--repeats 5]

B is the same model with a wider MLP (intermediate_size 28672 -> 30720). Counts run in this
process through the CLI's main() (stdout to a file), after a one-layer warm-up that pays the
transformers import; the report diff is timed in-process (load both, diff, render markdown:
what `flopcount diff a.json b.json --format markdown` does) and as a fresh process."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List

SHARED = ["hidden_size=8192", "num_attention_heads=64", "num_key_value_heads=8", "vocab_size=32000",
          "max_position_embeddings=4096", "num_hidden_layers=80"]
A_ONLY, B_ONLY = "intermediate_size=28672", "intermediate_size=30720"


def _config(pairs: List[str], flag: str = "--config") -> List[str]:
    return [part for pair in pairs for part in (flag, pair)]


def _cli(args: List[str]) -> float:
    from flopcount.cli import main

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(args)
    seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"flopcount {' '.join(args)} exited {code}")
    return seconds


def _median(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    import flopcount

    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of count A, count B, diff (medians)")
    args = parser.parse_args()
    common = ["--device", "meta", "--input", f"1x{args.tokens}:int64", "-q"]
    _cli(["count", "hf:llama", "--config", "num_hidden_layers=1", "--config", "hidden_size=64", "--config", "intermediate_size=64",
          "--config", "num_attention_heads=4", "--config", "num_key_value_heads=4", *common])  # the imports, outside the timing

    with tempfile.TemporaryDirectory() as tmp:
        a_json, b_json = str(Path(tmp) / "a.json"), str(Path(tmp) / "b.json")
        rounds = []
        for _ in range(args.rounds):  # interleaved, so load from other jobs hits all three alike
            count_a = _cli(["count", "hf:llama", *_config(SHARED + [A_ONLY]), *common, "--format", "json", "--output", a_json])
            count_b = _cli(["count", "hf:llama", *_config(SHARED + [B_ONLY]), *common, "--format", "json", "--output", b_json])
            both = _cli(["diff", "hf:llama", "hf:llama", *_config(SHARED), "--a-config", A_ONLY, "--b-config", B_ONLY,
                         "--device", "meta", "--input", f"1x{args.tokens}:int64", "-q", "--format", "markdown"])
            rounds.append((count_a, count_b, both))
        count_a, count_b, both = (statistics.median(r[i] for r in rounds) for i in range(3))
        modules = len(json.loads(Path(a_json).read_text())["by_module"])
        size = Path(a_json).stat().st_size

        def report_diff() -> None:
            flopcount.diff(a_json, b_json).to_markdown()

        in_process = _median(report_diff, args.repeats)
        diff = flopcount.diff(a_json, b_json)
        fresh = _median(lambda: subprocess.run([sys.executable, "-m", "flopcount", "diff", a_json, b_json, "--format", "markdown"],
                                               check=True, capture_output=True), max(1, args.repeats // 2))
        startup = _median(lambda: subprocess.run([sys.executable, "-m", "flopcount", "--version"], check=True, capture_output=True),
                          max(1, args.repeats // 2))

    print(f"LLaMA-70B-sized reports: {modules} modules, {size / 1e3:.0f} kB of JSON each; B - A: "
          f"FLOPs {diff.totals.delta('flops') / 1e12:+.3f} T ({100 * (diff.totals.relative('flops') or 0):+.2f}%), "
          f"params {diff.totals.delta('params') / 1e9:+.3f} G")
    print(f"diff of two JSON reports (load + diff + markdown), in process, median of {args.repeats}: {in_process:.3f} s "
          f"(target < 0.2 s)")
    print(f"  as a fresh process: {fresh:.3f} s, of which 'flopcount --version' startup alone {startup:.3f} s")
    print(f"diff of two 70B configs on meta, 1x{args.tokens} tokens, median of {args.rounds} interleaved rounds: {both:.2f} s; "
          f"counting A {count_a:.2f} s + B {count_b:.2f} s = {count_a + count_b:.2f} s; ratio {both / (count_a + count_b):.2f}x "
          "(target < 2x)")
    print("  rounds (count A, count B, diff): " + "; ".join(", ".join(f"{t:.2f}" for t in r) for r in rounds))


if __name__ == "__main__":
    main()
