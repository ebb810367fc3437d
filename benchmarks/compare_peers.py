"""flopcount beside fvcore, thop, ptflops (pytorch and aten backends), torchinfo and
torch.utils.flop_counter.FlopCounterMode: the number each reports, normalised to MACs,
against flopcount and the analytical value; ops missed; failures; state changes; speed.

    .venv/bin/python benchmarks/compare_peers.py [--repeats 3] > comparison.txt

Prints Markdown tables (docs/comparison.md holds a recorded run and its reading).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import platform
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples import hf
from examples.mobilenet import mobilenet_v2
from examples.resnet import resnet50
from examples.vit import vit_b_16
from flopcount import count_flops

SEQ = 128


# --------------------------------------------------------------------------- models


class SmallCNN(nn.Module):
    """Conv-BN-ReLU x2, pooling, a linear head; run in train mode for the state check."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        return self.fc(x.mean((2, 3)))


class DictRouter(nn.Module):
    """Dict input, dict output, and a branch decided by the data (a norm threshold)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(64, 128)
        self.deep = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128))
        self.head = nn.Linear(128, 8)

    def forward(self, batch):
        h = torch.relu(self.enc(batch["x"]))
        if h.norm() > 0:  # always true here: the deep path runs
            h = self.deep(h)
        return {"logits": self.head(h * batch["mask"])}


def _dense(*pairs: Tuple[int, int]) -> int:
    return sum(a * b for a, b in pairs)


def models() -> List[Tuple[str, Callable[[], nn.Module], Callable[[], Tuple[Any, ...]], Optional[int], bool]]:
    """(name, builder, inputs (positional tuple), analytical MACs or None, train mode)."""
    d, L, ff, T = 768, 12, 3072, SEQ
    bert_dense = T * L * (4 * d * d + 2 * d * ff) + d * d  # + pooler on one token
    gpt2_dense = T * (L * (4 * d * d + 2 * d * ff) + d * 50257)  # tied LM head, once per token
    attention = L * 2 * T * T * d
    h, kv, f, layers, vocab = 256, 64, 688, 2, 1000
    llama = T * (layers * (2 * h * h + 2 * h * kv + 3 * h * f) + h * vocab) + layers * 2 * T * T * h
    vit_tokens = 197
    vit = 196 * 768 * 3 * 16 * 16 + 12 * (vit_tokens * (4 * d * d + 2 * d * ff) + 2 * vit_tokens**2 * d) + d * 1000
    router = 4 * _dense((64, 128), (128, 128), (128, 128), (128, 8))
    return [
        ("small CNN + BN (train)", SmallCNN, lambda: (torch.randn(8, 3, 32, 32),), None, True),
        ("ResNet-50", resnet50, lambda: (torch.randn(1, 3, 224, 224),), 4_089_184_256, False),
        ("MobileNetV2", mobilenet_v2, lambda: (torch.randn(1, 3, 224, 224),), 300_774_272, False),
        ("ViT-B/16", vit_b_16, lambda: (torch.randn(1, 3, 224, 224),), vit, False),
        ("BERT-base (128 tok)", hf.bert, lambda: (hf.token_ids(1, T, 30522),), bert_dense + attention, False),
        ("GPT-2 small (128 tok)", hf.gpt2, lambda: (hf.token_ids(1, T, 50257),), gpt2_dense + attention, False),
        ("LLaMA-style GQA (128 tok)", hf.llama, lambda: (hf.token_ids(1, T, 1000),), llama, False),
        ("dict in/out + control flow", DictRouter, lambda: ({"x": torch.randn(4, 64), "mask": torch.ones(4, 128)},), router, False),
    ]


# --------------------------------------------------------------------------- tools


@dataclass
class Reading:
    value: Optional[float] = None      # as the tool reports it
    macs: Optional[float] = None       # normalised
    missed: str = ""
    error: str = ""


def run_flopcount(model, inputs) -> Reading:
    r = count_flops(model, inputs)
    missed = ", ".join(r.unsupported_ops())
    return Reading(r.macs, r.macs, missed)


def run_fvcore(model, inputs) -> Reading:
    from fvcore.nn import FlopCountAnalysis

    a = FlopCountAnalysis(model, inputs)
    a.unsupported_ops_warnings(False)
    a.uncalled_modules_warnings(False)
    total = a.total()
    missed = sorted(op for op in a.unsupported_ops() if not op.startswith("aten::") or _arith(op))
    return Reading(total, total, ", ".join(missed[:6]) + (" ..." if len(missed) > 6 else ""))


def run_thop(model, inputs) -> Reading:
    from thop import profile

    with contextlib.redirect_stdout(io.StringIO()):
        macs, _ = profile(model, inputs=inputs, verbose=False)
    return Reading(macs, macs)


def _ptflops(backend: str):
    def run(model, inputs) -> Reading:
        from ptflops import get_model_complexity_info

        names = list(__import__("inspect").signature(model.forward).parameters)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            macs, _ = get_model_complexity_info(
                model, (1,), input_constructor=lambda _: dict(zip(names, inputs)),
                as_strings=False, print_per_layer_stat=False, backend=backend,
            )
        if macs is None:
            raise RuntimeError("ptflops returned None (it swallowed an error)")
        return Reading(macs, macs)

    return run


def run_torchinfo(model, inputs) -> Reading:
    from torchinfo import summary

    s = summary(model, input_data=list(inputs), verbose=0)
    return Reading(s.total_mult_adds, s.total_mult_adds)


def run_flop_counter(model, inputs) -> Reading:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        model(*inputs)
    flops = counter.get_total_flops()
    return Reading(flops, flops / 2)


def _arith(op: str) -> bool:
    return not any(word in op for word in ("view", "reshape", "size", "Int", "to", "transpose", "permute", "contiguous"))


TOOLS: Dict[str, Tuple[str, Callable[[nn.Module, Tuple[Any, ...]], Reading]]] = {
    "flopcount": ("MACs (and FLOPs)", run_flopcount),
    "fvcore": ("MACs, called 'flops'", run_fvcore),
    "thop": ("MACs", run_thop),
    "ptflops (pytorch)": ("MACs", _ptflops("pytorch")),
    "ptflops (aten)": ("MACs", _ptflops("aten")),
    "torchinfo": ("mult-adds", run_torchinfo),
    "FlopCounterMode": ("FLOPs", run_flop_counter),
}


# --------------------------------------------------------------------------- state


def state_of(model: nn.Module) -> Dict[str, Any]:
    from torch.nn.modules import module as mod

    return {
        "sd": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "training": [m.training for m in model.modules()],
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
        "global": len(mod._global_forward_hooks) + len(mod._global_forward_pre_hooks),
    }


def state_change(before: Dict[str, Any], model: nn.Module) -> str:
    after = state_of(model)
    notes = []
    added = set(after["sd"]) - set(before["sd"])
    if added:
        notes.append(f"+{len(added)} buffers ({sorted(added)[0].rsplit('.', 1)[-1]})")
    if any(not torch.equal(before["sd"][k], after["sd"][k]) for k in before["sd"] if k in after["sd"]):
        notes.append("BN stats changed")
    if before["training"] != after["training"]:
        notes.append("training flags changed")
    if after["hooks"] != before["hooks"] or after["global"] != before["global"]:
        notes.append(f"hooks left ({after['hooks'] - before['hooks']:+d})")
    return "; ".join(notes) or "unchanged"


# --------------------------------------------------------------------------- run


def measure(tool, build_model, make_inputs, train: bool, repeats: int):
    proto = build_model().train(train)
    inputs = make_inputs()
    model = copy.deepcopy(proto)
    before = state_of(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reading = tool(model, inputs)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Reading(error=f"{type(exc).__name__}: {first[:80]}"), state_change(before, model), None
    change = state_change(before, model)
    times = []
    for _ in range(repeats):
        fresh = copy.deepcopy(proto)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tool(fresh, inputs)
        times.append(time.perf_counter() - start)
    return reading, change, statistics.median(times)


def fmt_g(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.0f}"


def pct(value: Optional[float], ref: Optional[float]) -> str:
    if value is None or not ref:
        return "-"
    diff = 100.0 * (value - ref) / ref
    return "0" if abs(diff) < 0.005 else f"{diff:+.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated model name prefixes")
    args = parser.parse_args()
    torch.manual_seed(0)
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    for name in ("fvcore", "thop", "ptflops", "torchinfo"):
        try:
            from importlib.metadata import version

            versions[name] = version(name if name != "thop" else "thop")
        except Exception:
            versions[name] = "not installed"
    print(f"python {platform.python_version()}, {platform.machine()}, {torch.get_num_threads()} threads; "
          + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print("calflops: not installed here (needs accelerate); DeepSpeed's profiler: not installed here.\n")
    summary: Dict[str, List[float]] = {}
    for model_name, build, make_inputs, analytical, train in models():
        if args.only and not any(model_name.startswith(p) for p in args.only.split(",")):
            continue
        print(f"### {model_name}" + (f" — analytical {analytical:,} MACs" if analytical else ""))
        print()
        print("| tool | reports | as MACs | vs flopcount | vs analytical | missed ops | state after | time s | time / flopcount |")
        print("|---|---|---|---|---|---|---|---|---|")
        ours = None
        ours_time = None
        for tool_name, (unit, tool) in TOOLS.items():
            reading, change, seconds = measure(tool, build, make_inputs, train, args.repeats)
            if tool_name == "flopcount":
                ours, ours_time = reading.macs, seconds
            if reading.error:
                print(f"| {tool_name} | **fails**: {reading.error} | - | - | - | - | {change} | - | - |")
                continue
            ratio = seconds / ours_time if ours_time else None
            if ratio is not None and tool_name != "flopcount":
                summary.setdefault(tool_name, []).append(ratio)
            print(
                f"| {tool_name} | {fmt_g(reading.value)} {unit} | {fmt_g(reading.macs)} | {pct(reading.macs, ours)} | "
                f"{pct(reading.macs, analytical)} | {reading.missed or '-'} | {change} | {seconds:.3f} | "
                f"{'-' if ratio is None else f'{ratio:.2f}'} |"
            )
        print()
    print("### Median time ratio to flopcount over the models each tool ran")
    print()
    for tool_name, ratios in summary.items():
        print(f"- {tool_name}: {statistics.median(ratios):.2f}x ({len(ratios)} models)")


if __name__ == "__main__":
    main()
