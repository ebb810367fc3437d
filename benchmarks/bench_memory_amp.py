"""Figures for docs/memory.md, "Mixed precision" and "Tied weights on meta": estimate_memory
with autocast=torch.bfloat16 against torch's MemTracker on a real cpu step of the same AMP
recipe (forward and loss under autocast, backward and a warmed Adam step outside), the same
estimate made inside the caller's autocast, and GPT-2 after model.to("meta").

    .venv/bin/python benchmarks/bench_memory_amp.py
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the truth: tests/_live_oracles.py

from _live_oracles import amp_step_peak

from examples.resnet import resnet18
from flopcount.memory.estimate import estimate_memory

Case = Tuple[str, Callable[[], nn.Module], Callable[[], Tuple[Tuple[Any, ...], Dict[str, Any]]]]


def gpt2(tie: bool = True) -> nn.Module:
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=128, vocab_size=1000, tie_word_embeddings=tie)
    config._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(config)


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )


def gpt2_inputs() -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    ids = torch.randint(0, 1000, (4, 128), generator=torch.Generator().manual_seed(0))
    return (ids,), {"labels": ids, "use_cache": False}


CASES: List[Case] = [
    ("GPT-2 (2 layers, d=128, eager), batch 4 x 128", gpt2, gpt2_inputs),
    ("CNN (2 conv + BatchNorm), batch 4, 3x32x32", cnn, lambda: ((torch.randn(4, 3, 32, 32),), {})),
    ("ResNet-18 (BatchNorm, train mode), batch 8, 3x112x112", resnet18, lambda: ((torch.randn(8, 3, 112, 112),), {})),
]


def pct(a: int, b: int) -> str:
    return f"{(a - b) / b * 100:+.2f}%"


def main() -> int:
    print(f"torch {torch.__version__}")
    print("| model | step | estimate, autocast= | MemTracker (real cpu, recipe) | difference | estimate inside autocast | "
          "MemTracker (real, all inside) | inside vs recipe |")
    print("|---|---|---|---|---|---|---|---|")
    for name, make, inputs in CASES:
        torch.manual_seed(0)
        model = make()
        args, kwargs = inputs()
        for adam in (False, True):
            opt: Optional[str] = "adam" if adam else None
            recipe = estimate_memory(model, args, kwargs, backward=True, optimizer=opt, autocast=torch.bfloat16).peak_bytes
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    inside = estimate_memory(model, args, kwargs, backward=True, optimizer=opt).peak_bytes
            truth, truth_inside = (
                amp_step_peak(model, args, kwargs, backward=True, adam=adam, amp=torch.bfloat16, everything_under_autocast=inside)
                for inside in (False, True)
            )
            step = "fwd+bwd+Adam" if adam else "fwd+bwd"
            print(f"| {name} | {step} | {recipe:,} | {truth:,} | {pct(recipe, truth)} | {inside:,} | {truth_inside:,} | "
                  f"{pct(inside, recipe)} |")
    torch.manual_seed(0)
    model = gpt2()
    args, kwargs = gpt2_inputs()
    tied = estimate_memory(model, args, kwargs, backward=True, optimizer="adam").peak_bytes
    on_meta = copy.deepcopy(model).to("meta")
    ids = args[0].to("meta")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        retied = estimate_memory(on_meta, (ids,), {**kwargs, "labels": ids}, backward=True, optimizer="adam").peak_bytes
    untied = estimate_memory(gpt2(tie=False), args, kwargs, backward=True, optimizer="adam").peak_bytes
    print()
    print(f"GPT-2 fwd+bwd+Adam: tied on cpu {tied:,}; after .to('meta') (tie restored) {retied:,}; "
          f"the same model untied (what .to('meta') holds) {untied:,} ({pct(untied, tied)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
