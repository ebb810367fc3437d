"""The dispatch tracer's figures, printed side by side in one run:

1. transformers' LlamaForCausalLM built under torch.device("meta") (LLaMA-2-7B config at
   1x2048 tokens, 70B config at 1x4096), called with meta ``input_ids`` only: flopcount's
   wall time and peak RSS, its MACs against the analytical count, and what a bare
   dispatch pass, torch.utils.flop_counter.FlopCounterMode and fvcore do on the same
   model. Each measurement runs in its own subprocess so peak RSS is its own.
2. Overhead on real CPU tensors: count_flops(tracer="dispatch") wall time over one plain
   forward (torch.no_grad(), eval) of the same model: median of N interleaved rounds and the
   median of the per-round ratios, same process.

    .venv/bin/python benchmarks/bench_dispatch.py [--repeats 7] [--threads 1] [--skip-70b] [--only-overhead]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {
    "7b": ("LLaMA-2-7B", "llama2_7b_config", 2048),
    "70b": ("LLaMA-2-70B", "llama2_70b_config", 4096),
}


def analytical_macs(config, tokens: int) -> int:
    """Dense: T x (L x (2h^2 + 2h*kv + 3h*ff) + h*vocab); attention: L x 2 x T^2 x h."""
    h, L, ff, V = config.hidden_size, config.num_hidden_layers, config.intermediate_size, config.vocab_size
    kv = h * config.num_key_value_heads // config.num_attention_heads
    return tokens * (L * (2 * h * h + 2 * h * kv + 3 * h * ff) + h * V) + L * 2 * tokens * tokens * h


# --------------------------------------------------------------------------- child


def _child(tool: str, key: str) -> dict:
    """Runs in a fresh interpreter: build the meta model, run ``tool`` once, report."""
    import resource

    import torch
    from transformers import LlamaForCausalLM

    from examples import hf

    _, builder, tokens = CONFIGS[key]
    config = getattr(hf, builder)()
    start = time.perf_counter()
    with torch.device("meta"):
        model = LlamaForCausalLM(config).eval()
    build_s = time.perf_counter() - start
    ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    report: dict = {"build_s": build_s, "analytical_macs": analytical_macs(config, tokens)}
    start = time.perf_counter()
    try:
        if tool == "flopcount":
            from flopcount import count_flops

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = count_flops(model, ids)
            report.update(macs=result.macs, flops=result.flops, params=result.params, tracer=result.tracer,
                          unsupported=result.unsupported_ops())
        elif tool == "bare":
            from torch.utils._python_dispatch import TorchDispatchMode

            class Bare(TorchDispatchMode):
                """Just runs each op (answering .item() on meta with 0): the floor for any dispatch counter."""

                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    if func is torch.ops.aten._local_scalar_dense.default:
                        return 0
                    return func(*args, **(kwargs or {}))

            with Bare(), torch.no_grad():
                model(ids)
        elif tool == "flop_counter":
            from torch.utils.flop_counter import FlopCounterMode

            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                model(ids)
            report.update(flops=int(counter.get_total_flops()))
        elif tool == "fvcore":
            from fvcore.nn import FlopCountAnalysis

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                analysis = FlopCountAnalysis(model, (ids,))
                analysis.unsupported_ops_warnings(False)
                analysis.uncalled_modules_warnings(False)
                report.update(macs=int(analysis.total()))
        elif tool == "thop":
            import thop

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                macs, _ = thop.profile(model, inputs=(ids,), verbose=False)
            report.update(macs=int(macs))
        elif tool == "ptflops":
            from ptflops import get_model_complexity_info

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                macs, _ = get_model_complexity_info(
                    model, (tokens,), input_constructor=lambda _: {"input_ids": ids},
                    as_strings=False, print_per_layer_stat=False, verbose=False,
                )
            if macs is None:
                raise RuntimeError("get_model_complexity_info returned None (its forward failed; ptflops swallows the error)")
            report.update(macs=int(macs))
        else:
            raise ValueError(tool)
    except Exception as exc:  # a peer's failure is a result worth printing
        text = str(exc).strip().splitlines()
        report["error"] = f"{type(exc).__name__}: {text[0] if text else ''}"[:160]
    report["seconds"] = time.perf_counter() - start
    report["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return report


def run_child(tool: str, key: str, timeout: int = 900) -> dict:
    cmd = [sys.executable, __file__, "--child", tool, key]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"child exited {done.returncode}: {tail[:160]}"}
    return json.loads(lines[-1])


# --------------------------------------------------------------------------- overhead


def interleaved_times(fns, repeats: int):
    """Per function, its times over ``repeats`` rounds; each round runs every function
    once, in turn, so load from other processes hits them alike (one warm-up round)."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return times


def overhead(repeats: int) -> None:
    import torch

    from examples.hf import gpt2, token_ids
    from examples.resnet import resnet50
    from flopcount import count_flops

    torch.manual_seed(0)
    cases = [
        ("ResNet-50 1x3x224x224", resnet50().eval(), (torch.randn(1, 3, 224, 224),)),
        ("GPT-2 small 1x256 tokens", gpt2(), (token_ids(1, 256, 50257),)),
    ]
    print(f"\nOverhead on real CPU tensors ({torch.get_num_threads()} threads; median of {repeats} interleaved rounds; "
          "plain forward = eval + torch.no_grad())")
    print(f"{'model':28} {'plain fwd s':>12} {'dispatch s':>11} {'ratio':>7} {'ratio range':>13} {'jit s':>8}")
    for name, model, inputs in cases:
        def plain():
            with torch.no_grad():
                model(*inputs)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            forward, by_dispatch, by_jit = interleaved_times(
                [plain, lambda: count_flops(model, inputs, tracer="dispatch"), lambda: count_flops(model, inputs, tracer="jit")],
                repeats,
            )
        ratios = sorted(d / f for d, f in zip(by_dispatch, forward))
        print(f"{name:28} {statistics.median(forward):12.3f} {statistics.median(by_dispatch):11.3f} "
              f"{statistics.median(ratios):7.2f} {f'{ratios[0]:.2f}-{ratios[-1]:.2f}':>13} {statistics.median(by_jit):8.3f}")


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-70b", action="store_true")
    parser.add_argument("--only-overhead", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for the overhead part (0: torch's default)")
    parser.add_argument("--child", nargs=2, metavar=("TOOL", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(*args.child)))
        return

    import torch
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs")
    print("\nLlamaForCausalLM on the meta device, input_ids only (one fresh process per cell; "
          "peak RSS includes the interpreter, torch and transformers)")
    print(f"{'config':20} {'tool':13} {'seconds':>8} {'peak GB':>8}  result")
    keys = [] if args.only_overhead else ["7b"] if args.skip_70b else ["7b", "70b"]
    for key in keys:
        label, _, tokens = CONFIGS[key]
        for tool in ("flopcount", "bare", "flop_counter", "fvcore", "thop", "ptflops"):
            r = run_child(tool, key)
            if "error" in r:
                result = f"fails: {r['error']}"
            elif tool == "flopcount":
                same = "==" if r["macs"] == r["analytical_macs"] else "!="
                result = (f"MACs {r['macs']:,} {same} analytical {r['analytical_macs']:,}; "
                          f"params {r['params']:,}; tracer {r['tracer']}; unsupported {r['unsupported'] or 'none'}")
            elif tool == "flop_counter":
                result = f"FLOPs {r['flops']:,} (analytical x2 = {2 * r['analytical_macs']:,})"
            elif tool in ("fvcore", "thop", "ptflops"):
                result = f"MACs {r['macs']:,} (analytical {r['analytical_macs']:,})"
            else:
                result = "ran (counts nothing)"
            seconds = f"{r['seconds']:8.2f}" if "seconds" in r else f"{'-':>8}"
            rss = f"{r['peak_rss_gb']:8.2f}" if "peak_rss_gb" in r else f"{'-':>8}"
            print(f"{label + ' 1x' + str(tokens):20} {tool:13} {seconds} {rss}  {result}")
    if args.threads:
        torch.set_num_threads(args.threads)
    overhead(args.repeats)


if __name__ == "__main__":
    main()
