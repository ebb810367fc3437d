"""``count_flops(backward=True)`` of a gradient-checkpointed GPT-2 (2 layers, 64 wide, batch 2 x 16,
``use_reentrant=False``) at another commit and at this checkout, paired in one process (branch
sac): the recompute's composites now run under a probe dispatch mode (flopcount/tracers/_vocabulary.py,
``CompositeInterceptor._recomputed``). The other commit's package is imported as ``flopcount_base``
(``count_trees_ab.renamed_package``); rounds alternate the order; CPU time of the counting thread;
both sides must give the same ``to_dict()``.

    PYTHONPATH=. .venv/bin/python benchmarks/checkpoint_backward_ab.py [--commit main] [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from count_trees_ab import renamed_package  # noqa: E402

import flopcount  # noqa: E402

warnings.simplefilter("ignore")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", default="main")
    parser.add_argument("--rounds", type=int, default=30)
    options = parser.parse_args()
    import transformers

    torch.set_num_threads(1)
    into = Path(tempfile.mkdtemp())
    renamed_package(options.commit, into)
    sys.path.insert(0, str(into))
    import flopcount_base  # type: ignore[import-not-found]

    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 100, (2, 16))
    sides = {"base": flopcount_base.count_flops, "this": flopcount.count_flops}
    assert sides["base"](model, ids, backward=True).to_dict() == sides["this"](model, ids, backward=True).to_dict()
    times: dict = {side: [] for side in sides}
    for round_ in range(options.rounds):
        for side in ("base", "this") if round_ % 2 == 0 else ("this", "base"):
            start = time.thread_time()
            sides[side](model, ids, backward=True)
            times[side].append(1000 * (time.thread_time() - start))
    for side, values in times.items():
        print(f"{side}: median {statistics.median(values):.1f} ms, min {min(values):.1f} ms")
    ratios = [this / base for base, this in zip(times["base"], times["this"])]
    print(f"per-round ratio this/base: median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
