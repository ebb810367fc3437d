"""The jit tracer's private generators change nothing jit records (issue #29 item 18).

jit's real run now passes every torch call through a TorchFunctionMode that draws random
numbers on private generators (flopcount/core/state.py ``PrivateRandomCalls``,
flopcount/tracers/jit/random.py). A TorchFunctionMode can change what torch runs (it turns off
``nn.MultiheadAttention``'s fused path, for one), so this script traces every model of the
coverage zoo (benchmarks/zoo.py: torch.nn layers, transformers, torchvision where installed)
with jit twice, in eval and in train mode: once as before (no mode; the process's generator,
set back afterwards) and once with the private generators, and compares the recorded op
sequence and the FLOPs / MACs by operator. Prints one line per difference and a summary.

    PYTHONPATH=. .venv/bin/python benchmarks/jit_private_random.py --only nn
    PYTHONPATH=. .venv-zoo/bin/python benchmarks/jit_private_random.py --only torchvision
    PYTHONPATH=. .venv/bin/python benchmarks/jit_private_random.py --timing   # what the mode costs

``--timing``: count_flops(tracer="jit") wall time with and without the private generators on
ResNet-50 (1x3x224x224, eval) and GPT-2 small (1x256 tokens, train mode: dropout draws), median
of 5 alternating runs each.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import zoo  # noqa: E402

from flopcount import count_flops  # noqa: E402
from flopcount.core.state import PrivateRandomCalls  # noqa: E402
from flopcount.tracers import trace  # noqa: E402


def _jit(case: Any, train: bool, private: bool) -> Tuple[List[str], Dict[str, int], Dict[str, int]]:
    model = zoo._build(case).train(train)
    args, kwargs = zoo._inputs_for(case)
    patch = mock.patch.object(PrivateRandomCalls, "available", staticmethod(lambda: private))
    with patch, zoo.quiet():
        torch.manual_seed(2)
        ops = [event.call.op for event in trace(model, args, kwargs or None, tracer="jit").events]
        torch.manual_seed(2)
        result = count_flops(model, args, kwargs=kwargs or None, tracer="jit")
    return ops, result.by_operator("flops"), result.by_operator("macs")


def _timing() -> None:
    import statistics

    from flopcount.examples.hf import gpt2_small_example
    from flopcount.examples.resnet import resnet50

    torch.manual_seed(0)
    gpt2, (ids,) = gpt2_small_example(256)
    cases = [("ResNet-50 1x3x224x224 eval", resnet50().eval(), torch.randn(1, 3, 224, 224)), ("GPT-2 small 1x256 train", gpt2.train(), ids)]
    for label, model, x in cases:
        times: Dict[bool, List[float]] = {False: [], True: []}
        with zoo.quiet():
            count_flops(model, x, tracer="jit")  # warm
            for _ in range(5):
                for private in (False, True):
                    with mock.patch.object(PrivateRandomCalls, "available", staticmethod(lambda: private)):
                        t0 = time.perf_counter()
                        count_flops(model, x, tracer="jit")
                        times[private].append(time.perf_counter() - t0)
        before, after = statistics.median(times[False]), statistics.median(times[True])
        print(f"{label}: jit count {before:.3f} s before, {after:.3f} s with private generators ({after / before - 1:+.1%})")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=zoo.PARTS, default=None)
    parser.add_argument("--timing", action="store_true", help="time the jit count with and without, then stop")
    parser.add_argument("--start", type=int, default=0, help="skip the first N models")
    parser.add_argument("--limit", type=int, default=None, help="compare at most N models")
    parser.add_argument("--match", default=None, help="only models whose name matches this regular expression (fullmatch)")
    options = parser.parse_args(argv)
    if options.timing:
        _timing()
        return 0
    cases, _ = zoo.collect(options.only)
    if options.match:
        cases = [case for case in cases if re.fullmatch(options.match, case.name)]
    cases = cases[options.start :][: options.limit]
    compared = differ = failed = 0
    started = time.perf_counter()
    for case in cases:
        for train in (False, True):
            label = f"{case.family}/{case.name} ({'train' if train else 'eval'})"
            try:
                before = _jit(case, train, private=False)
            except Exception as exc:  # jit cannot trace it at all: nothing to compare
                print(f"skip  {label}: {zoo.first_line(exc)}", file=sys.stderr)
                failed += 1
                continue
            try:
                after = _jit(case, train, private=True)
            except Exception as exc:
                print(f"DIFF  {label}: traced before, fails with private generators: {zoo.first_line(exc)}")
                differ += 1
                continue
            compared += 1
            if before != after:
                differ += 1
                what = [name for name, a, b in zip(("op sequence", "flops by op", "macs by op"), before, after) if a != b]
                print(f"DIFF  {label}: {', '.join(what)}")
            print(f"done  {label}", file=sys.stderr, flush=True)
    print(
        f"{compared} model x mode pairs compared, {differ} differ, {failed} not traceable by jit at all; "
        f"{time.perf_counter() - started:.0f} s; torch {torch.__version__}"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
