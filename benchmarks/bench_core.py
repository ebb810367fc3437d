"""Analysis wall time: flopcount.count_flops (jit tracer) vs fvcore's FlopCountAnalysis,
same process, same models, median of N interleaved rounds, reported as a ratio.

    .venv/bin/python benchmarks/bench_core.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _interleave import median, rounds

from examples.hf import gpt2, token_ids
from examples.resnet import resnet50
from flopcount import count_flops


def fvcore_run(model, inputs):
    from fvcore.nn import FlopCountAnalysis

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            analysis = FlopCountAnalysis(model, inputs)
            analysis.unsupported_ops_warnings(False)
            analysis.uncalled_modules_warnings(False)
            analysis.total()
            analysis.by_module()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    cases = [
        ("ResNet-50 1x3x224x224", resnet50().eval(), (torch.randn(1, 3, 224, 224),)),
        ("GPT-2 small 1x256 tokens", gpt2(), (token_ids(1, 256, 50257),)),
        # fvcore cannot trace transformers>=5's DynamicCache output: compare without the cache too
        ("GPT-2 small, use_cache=False", gpt2(), (token_ids(1, 256, 50257),), {"use_cache": False}),
    ]
    print(f"torch {torch.__version__}, python {platform.python_version()}, {platform.machine()}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}")
    print(f"{'model':28} {'forward s':>10} {'flopcount s':>12} {'fvcore s':>10} {'flopcount/fvcore':>17}")
    for name, model, inputs, *rest in cases:
        kwargs = rest[0] if rest else {}

        def forward():
            with torch.no_grad():
                model(*inputs, **kwargs)

        def ours():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                count_flops(model, inputs, kwargs=kwargs, tracer="jit")

        target = _kw_wrapper(model, kwargs, inputs) if kwargs else (model, inputs)
        times, failures = rounds({"forward": forward, "flopcount": ours, "fvcore": fvcore_run(*target)}, args.repeats)
        medians = {tool: median(values) for tool, values in times.items()}
        t_fwd, t_ours, t_fv = medians["forward"], medians["flopcount"], medians["fvcore"]
        if t_fv is None:
            print(f"{name:28} {t_fwd:10.3f} {t_ours:12.3f} {'fails':>10}  fvcore: {failures['fvcore']}")
        else:
            print(f"{name:28} {t_fwd:10.3f} {t_ours:12.3f} {t_fv:10.3f} {t_ours / t_fv:17.2f}")


def _kw_wrapper(model, kwargs, inputs):
    """fvcore passes positional inputs only: bind the keyword arguments in a thin wrapper."""

    class WithKwargs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, *args):
            return self.inner(*args, **kwargs)

    return WithKwargs(), inputs


if __name__ == "__main__":
    main()
