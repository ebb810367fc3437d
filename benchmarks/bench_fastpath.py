"""The default path (counting on fake copies) beside the peers and beside the floor.

1. floor: per-op cost on ResNet-50 and GPT-2 small of a plain forward, a bare forward of
   meta copies, an empty TorchDispatchMode around the real forward, a bare FakeTensorMode
   forward, and flopcount (auto = fake copies; dispatch = real run).
2. peers: count_flops (default) beside FlopCounterMode, fvcore, thop, ptflops (aten)
   and a plain forward, on ResNet-50 1x3x224^2, BERT-base 1x128, GPT-2 small 1x256.
3. a forward over a TFLOP: 12 x Linear(4096, 4096) on 1x1024x4096 (count vs forward).
4. a LLaMA-style model of about 1 B parameters with real random fp32 weights, 1x2048
   tokens: count time and peak RSS beyond the weights (own subprocess).

Every comparison is interleaved in one process (each tool once per round, in turn) and
reported as the median of the rounds; ratios are per-round medians too.

    .venv/bin/python benchmarks/bench_fastpath.py [--repeats 5] [--threads 1] [--skip-llama] [--only SECTION]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from _interleave import median, ratio, rounds  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from flopcount import count_flops  # noqa: E402

warnings.simplefilter("ignore")


# --------------------------------------------------------------------------- models


def resnet50_case() -> Tuple[nn.Module, Tuple[Any, ...]]:
    from examples.resnet import resnet50

    return resnet50().eval(), (torch.randn(1, 3, 224, 224),)


def bert_case() -> Tuple[nn.Module, Tuple[Any, ...]]:
    from examples.hf import bert, token_ids

    return bert().eval(), (token_ids(1, 128, 30522),)


def gpt2_case() -> Tuple[nn.Module, Tuple[Any, ...]]:
    from examples.hf import gpt2_small_example

    model, inputs = gpt2_small_example(256)
    return model.eval(), inputs


CASES = {"ResNet-50 1x3x224x224": resnet50_case, "BERT-base 1x128": bert_case, "GPT-2 small 1x256": gpt2_case}


# --------------------------------------------------------------------------- tools


def plain(model: nn.Module, inputs: Tuple[Any, ...]) -> Callable[[], Any]:
    def run() -> None:
        with torch.no_grad():
            model(*inputs)

    return run


def flopcount_default(model: nn.Module, inputs: Tuple[Any, ...]) -> Callable[[], Any]:
    return lambda: count_flops(model, inputs)


def flopcount_dispatch(model: nn.Module, inputs: Tuple[Any, ...]) -> Callable[[], Any]:
    return lambda: count_flops(model, inputs, tracer="dispatch")


def flop_counter_mode(model: nn.Module, inputs: Tuple[Any, ...]) -> Callable[[], Any]:
    from torch.utils.flop_counter import FlopCounterMode

    def run() -> None:
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(*inputs)
        counter.get_total_flops()

    return run


def fvcore_tool(model: nn.Module, inputs: Tuple[Any, ...]) -> Callable[[], Any]:
    from fvcore.nn import FlopCountAnalysis

    def run() -> None:
        analysis = FlopCountAnalysis(model, inputs)
        analysis.unsupported_ops_warnings(False)
        analysis.uncalled_modules_warnings(False)
        analysis.total()

    return run


def thop_tool(model: nn.Module, inputs: Tuple[Any, ...]) -> Callable[[], Any]:
    from thop import profile

    def run() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            profile(model, inputs=inputs, verbose=False)

    return run


def ptflops_tool(model: nn.Module, inputs: Tuple[Any, ...]) -> Callable[[], Any]:
    from ptflops import get_model_complexity_info

    names = list(__import__("inspect").signature(model.forward).parameters)

    def run() -> None:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            macs, _ = get_model_complexity_info(
                model, (1,), input_constructor=lambda _: dict(zip(names, inputs)),
                as_strings=False, print_per_layer_stat=False, backend="aten",
            )
        if macs is None:
            raise RuntimeError("ptflops returned None")

    return run


PEERS = {"FlopCounterMode": flop_counter_mode, "fvcore": fvcore_tool, "thop": thop_tool, "ptflops (aten)": ptflops_tool}


# --------------------------------------------------------------------------- sections


class _Empty(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _copies(model: nn.Module, inputs: Tuple[Any, ...], make: Callable[[torch.Tensor], torch.Tensor]) -> Tuple[nn.Module, Tuple[Any, ...]]:
    memo: Dict[int, Any] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        made = make(t)
        if isinstance(t, nn.Parameter):
            made = nn.Parameter(made, requires_grad=False) if made.device.type == "meta" else made
        memo[id(t)] = made
    return copy.deepcopy(model, memo), tuple(make(x) for x in inputs)


def section_floor(repeats: int) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    print("\n## 1. Per-op floor (µs per aten op; median of rounds)")
    print("| model | ops | plain forward | meta copies, no mode | empty TorchDispatchMode (real) | FakeTensorMode, no recorder | flopcount dispatch (real) | flopcount default (fake) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in ("ResNet-50 1x3x224x224", "GPT-2 small 1x256"):
        model, inputs = CASES[name]()
        n_ops = len([e for e in count_flops(model, inputs, tracer="dispatch").by_operator("count").values()])
        n_ops = sum(count_flops(model, inputs, tracer="dispatch").by_operator("count").values())
        meta_model, meta_inputs = _copies(model, inputs, lambda t: torch.empty_like(t, device="meta"))
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake_model, fake_inputs = _copies(model, inputs, lambda t: fake_mode.from_tensor(t, static_shapes=True))

        def empty_mode() -> None:
            with _Empty(), torch.no_grad():
                model(*inputs)

        def fake_bare() -> None:
            with fake_mode, torch.no_grad():
                fake_model(*fake_inputs)

        fns = {
            "plain": plain(model, inputs),
            "meta": plain(meta_model, meta_inputs),
            "empty": empty_mode,
            "fake": fake_bare,
            "dispatch": flopcount_dispatch(model, inputs),
            "default": flopcount_default(model, inputs),
        }
        times, failures = rounds(fns, repeats)
        cells = []
        for key in fns:
            m = median(times[key])
            cells.append(f"{m / n_ops * 1e6:.0f}" if m is not None else f"fails ({failures[key]})")
        print(f"| {name} | {n_ops} | " + " | ".join(cells) + " |")


def section_peers(repeats: int) -> None:
    print("\n## 2. Default count_flops beside the peers (seconds, median of rounds; ratio = per-round median)")
    print("| model | plain forward | flopcount default | " + " | ".join(PEERS) + " | default / fastest peer | default / forward |")
    print("|---|---|---|" + "---|" * len(PEERS) + "---|---|")
    for name, case in CASES.items():
        model, inputs = case()
        fns: Dict[str, Callable[[], Any]] = {"forward": plain(model, inputs), "flopcount": flopcount_default(model, inputs)}
        for peer, tool in PEERS.items():
            fns[peer] = tool(copy.deepcopy(model), inputs)  # thop adds buffers: each peer gets its own copy
        times, failures = rounds(fns, repeats)
        medians = {k: median(v) for k, v in times.items()}
        peers_ok = [p for p in PEERS if medians[p] is not None]
        fastest = min(peers_ok, key=lambda p: medians[p]) if peers_ok else None  # type: ignore[arg-type, return-value]
        cells = [f"{medians[k]:.3f}" if medians[k] is not None else f"fails ({failures[k]})" for k in fns]
        vs_peer = ratio(times, "flopcount", fastest) if fastest else None
        vs_fwd = ratio(times, "flopcount", "forward")
        print(f"| {name} | " + " | ".join(cells) + f" | **{vs_peer:.2f}** ({fastest}) | {vs_fwd:.2f} |")


def section_tflop(repeats: int) -> None:
    print("\n## 3. A forward over a TFLOP: 12 x Linear(4096, 4096), input 1x1024x4096 fp32")
    model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(12)]).eval()
    x = torch.randn(1, 1024, 4096)
    expected = 12 * 1024 * 4096 * 4096
    result = count_flops(model, x)
    times, _ = rounds({"forward": plain(model, (x,)), "flopcount": flopcount_default(model, (x,))}, repeats)
    print(f"forward {median(times['forward']):.3f} s, count_flops {median(times['flopcount']):.4f} s, "
          f"ratio {ratio(times, 'flopcount', 'forward'):.4f}; MACs {result.macs:,} (12*1024*4096^2 = {expected:,}: "
          f"{'equal' if result.macs == expected else 'DIFFERENT'}); forward FLOPs {result.flops / 1e12:.3f} T")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def llama_child() -> Dict[str, Any]:
    import resource

    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=20, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
        model.model.rotary_emb.inv_freq.copy_(
            1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
        ) if hasattr(model.model, "rotary_emb") else None
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 32000, (1, 2048))
    count_flops(nn.Linear(2, 2), torch.randn(1, 2))  # warm the imports
    before = _rss_bytes()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    result = count_flops(model, ids)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    h, L, ff, V, T = 2048, 20, 5632, 32000, 2048
    kv = h * 8 // 32
    analytical = T * (L * (2 * h * h + 2 * h * kv + 3 * h * ff) + h * V) + L * 2 * T * T * h
    return {"params": params, "seconds": seconds, "rss_before": before, "peak_growth": max(0, peak - max(before, peak_before)),
            "macs": result.macs, "analytical": analytical, "warnings": list(result.warnings), "tracer": result.tracer}


def section_llama() -> None:
    print("\n## 4. LLaMA-style, ~1 B parameters, real random fp32 weights on CPU, 1x2048 tokens (own process)")
    out = subprocess.run([sys.executable, __file__, "--llama-child"], capture_output=True, text=True, env=dict(os.environ))
    if out.returncode != 0:
        print("failed:", out.stderr[-2000:])
        return
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"parameters {r['params']:,} ({r['params'] * 4 / 2**30:.2f} GiB fp32); count_flops {r['seconds']:.2f} s; "
          f"peak RSS growth during the count {r['peak_growth'] / 2**20:.0f} MiB; MACs {r['macs']:,} vs analytical "
          f"{r['analytical']:,} ({'equal' if r['macs'] == r['analytical'] else 'DIFFERENT'}); warnings {r['warnings']}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-llama", action="store_true")
    parser.add_argument("--only", choices=["floor", "peers", "tflop", "llama"])
    parser.add_argument("--llama-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.llama_child:
        print(json.dumps(llama_child()))
        return
    print(f"torch {torch.__version__}, python {platform.python_version()}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, {args.threads} torch thread(s), {args.repeats} interleaved rounds, "
          f"load average {os.getloadavg()[0]:.1f}")
    sections = {"floor": lambda: section_floor(args.repeats), "peers": lambda: section_peers(args.repeats),
                "tflop": lambda: section_tflop(max(3, args.repeats // 2)), "llama": section_llama}
    for key, run in sections.items():
        if args.only and key != args.only:
            continue
        if key == "llama" and args.skip_llama:
            continue
        run()


if __name__ == "__main__":
    main()
