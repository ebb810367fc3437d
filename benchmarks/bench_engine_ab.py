"""One count's wall time with the flopcount on PYTHONPATH, for A/B runs against another
checkout (best of 7 after two warm-up counts, one torch thread):

    PYTHONPATH=/path/to/old .venv/bin/python benchmarks/bench_engine_ab.py old resnet
    PYTHONPATH=. .venv/bin/python benchmarks/bench_engine_ab.py new resnet      # resnet | bert | gpt2

Run old and new alternately (the machine is shared and noisy) and compare the pairs.
"""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any, Tuple

import torch


def _model(which: str) -> Tuple[Any, Any]:
    if which == "bert":
        from transformers import BertConfig, BertModel

        return BertModel(BertConfig()).eval(), torch.randint(0, 1000, (1, 128))
    if which == "gpt2":
        from transformers import GPT2Config, GPT2Model

        return GPT2Model(GPT2Config()).eval(), torch.randint(0, 1000, (1, 256))
    from flopcount.examples.resnet import resnet50

    return resnet50().eval(), torch.randn(1, 3, 224, 224)


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    from flopcount import count_flops

    label, which = sys.argv[1], sys.argv[2]
    model, x = _model(which)
    for _ in range(2):
        count_flops(model, x)
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        count_flops(model, x)
        best = min(best, time.perf_counter() - start)
    print(label, which, round(best * 1e3, 1), "ms")


if __name__ == "__main__":
    main()
