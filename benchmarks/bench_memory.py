"""Figures for docs/memory.md: estimate_memory on big models (on meta) beside the
16-bytes-per-parameter rule, the time each estimate took, and estimate vs torch's
MemTracker on a real cpu run of the same step for small models.

    .venv/bin/python benchmarks/bench_memory.py [--quick]

--quick skips the 70B estimate and the bfloat16 rows.
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.resnet import resnet18, resnet50
from flopcount.memory.estimate import MemoryEstimate, estimate_memory

GIB = 2**30


def gib(value: float) -> str:
    return f"{value / GIB:.2f}"


def timed(fn: Callable[[], MemoryEstimate]) -> Tuple[MemoryEstimate, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def llama(layers: Optional[int] = None, size: str = "7b") -> nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    if size == "70b":  # LLaMA-2-70B's published shape
        config = LlamaConfig(
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
        )
    else:  # transformers' LlamaConfig defaults are LLaMA-2-7B's shape
        config = LlamaConfig()
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def big_rows(quick: bool) -> List[List[str]]:
    rows = []
    cases: List[Tuple[str, Callable[[], nn.Module], Any, Dict[str, Any], Dict[str, Any]]] = []
    x = torch.empty(32, 3, 224, 224, device="meta")
    cases.append(("ResNet-50, batch 32, training step (SGD momentum)", resnet50, x, {}, {"optimizer": "sgd-momentum"}))
    cases.append(("ResNet-50, batch 32, training step (Adam)", resnet50, x, {}, {"optimizer": "adam"}))
    ids = torch.zeros(1, 2048, dtype=torch.long, device="meta")
    cases.append(("LLaMA-2-7B, 1x2048, inference (fp32, KV cache on)", llama, (), {"input_ids": ids}, {}))
    cases.append(
        ("LLaMA-2-7B, 1x2048, inference (fp32, use_cache=False)", llama, (), {"input_ids": ids, "use_cache": False}, {})
    )
    train_kw = {"input_ids": ids, "labels": ids}
    cases.append(("LLaMA-2-7B, 1x2048, training step (fp32, AdamW)", llama, (), train_kw, {"optimizer": "adamw"}))
    if not quick:
        cases.append(
            (
                "LLaMA-2-7B, 1x2048, inference (bf16)",
                llama,
                (),
                {"input_ids": ids},
                {"dtype": torch.bfloat16, "backward": False},
            )
        )
        cases.append(
            (
                "LLaMA-2-7B, 1x2048, training step (bf16, AdamW)",
                llama,
                (),
                train_kw,
                {"dtype": torch.bfloat16, "optimizer": "adamw"},
            )
        )
        cases.append(
            (
                "LLaMA-2-70B, 1x2048, training step (fp32, AdamW)",
                lambda: llama(size="70b"),
                (),
                train_kw,
                {"optimizer": "adamw"},
            )
        )
    for label, build, inputs, kwargs, options in cases:
        model = build() if build is not resnet50 else build().to("meta")
        options = dict(options)
        if "optimizer" in options:
            options["backward"] = True
        result, seconds = timed(lambda m=model: estimate_memory(m, inputs, kwargs, **options))  # type: ignore[misc]
        n = result.params
        rule = f"{gib(16 * n)}" if options.get("optimizer") in ("adam", "adamw") else "-"
        at = result.at_peak
        rows.append(
            [
                label,
                f"{n / 1e6:,.1f} M",
                gib(result.peak_bytes),
                gib(at.parameters),
                gib(at.gradients),
                gib(at.optimizer_state),
                gib(at.activations + at.temporaries + at.inputs + at.buffers),
                f"{result.peak_phase} of '{result.peak_module or '(model)'}'",
                rule,
                f"{seconds:.1f}",
            ]
        )
        print("  done:", label, f"{seconds:.1f} s", file=sys.stderr)
        del model
    return rows


def truth_peak(model: nn.Module, inputs: Any, backward: bool, optimizer: Optional[str]) -> Tuple[int, float]:
    """MemTracker's peak on a real cpu run of the same step (optimizer warmed up by one step)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model = copy.deepcopy(model)
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    opt = torch.optim.Adam(model.parameters()) if optimizer else None
    if opt is not None:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
    tracker = MemTracker()
    extra: List[Any] = [opt] if opt is not None else []
    tracker.track_external(model, *extra, *[a for a in args if isinstance(a, torch.Tensor)])
    start = time.perf_counter()
    with tracker:
        with torch.set_grad_enabled(backward):
            out = model(*args)
            if backward:
                loss = (out if isinstance(out, torch.Tensor) else out.logits).sum()
                del out
                loss.backward()
                del loss
        if opt is not None:
            opt.step()
    seconds = time.perf_counter() - start
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return peak["Total"], seconds


def small_models() -> List[Tuple[str, Callable[[], nn.Module], Callable[[], Any]]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    def gpt2() -> nn.Module:
        config = GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=128, vocab_size=1000)
        return GPT2LMHeadModel(config).train()

    return [
        (
            "MLP 1024-4096-1024, batch 64",
            lambda: nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)),
            lambda: torch.randn(64, 1024),
        ),
        (
            "ResNet-18 (BatchNorm, train mode), batch 8, 3x112x112",
            lambda: resnet18().train(),
            lambda: torch.randn(8, 3, 112, 112),
        ),
        (
            "TransformerEncoderLayer d=256, batch 8 x 128",
            lambda: nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True).train(),
            lambda: torch.randn(8, 128, 256),
        ),
        ("GPT-2 (2 layers, d=128), batch 4 x 128", gpt2, lambda: torch.randint(0, 1000, (4, 128))),
    ]


def truth_rows() -> List[List[str]]:
    rows = []
    for label, build, make_inputs in small_models():
        torch.manual_seed(0)
        model, inputs = build(), make_inputs()
        for backward, optimizer, mode in (
            (False, None, "inference"),
            (True, None, "fwd+bwd"),
            (True, "adam", "fwd+bwd+Adam"),
        ):
            result, est_s = timed(lambda: estimate_memory(model, inputs, backward=backward, optimizer=optimizer))
            truth, real_s = truth_peak(model, inputs, backward, optimizer)
            rows.append(
                [
                    label,
                    mode,
                    f"{result.peak_bytes:,}",
                    f"{truth:,}",
                    f"{100 * (result.peak_bytes - truth) / truth:+.2f}%",
                    f"{est_s:.2f}",
                    f"{real_s:.2f}",
                ]
            )
    return rows


def table(headers: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 70B and bfloat16 rows")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    machine = f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads"
    print(f"# estimate_memory figures: {machine}\n")
    print("## Big models on meta (GiB = 2^30 bytes; '16 B/param' = the 16-bytes-per-parameter rule for Adam)\n")
    headers = ["step", "params", "peak GiB", "params GiB", "grads GiB", "optimizer GiB", "activations+temps GiB"]
    headers += ["peak in", "16 B/param GiB", "estimate s"]
    print(table(headers, big_rows(args.quick)))
    print("\n## Estimate vs torch MemTracker on a real cpu run of the same step (bytes)\n")
    headers = ["model", "step", "estimate", "MemTracker (real cpu)", "difference", "estimate s", "real run s"]
    print(table(headers, truth_rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
