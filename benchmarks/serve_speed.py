"""Speed of flopcount.serve on a LLaMA-2-70B config on meta (issue #31): prompt 2,048, 256 new
tokens, three batch sizes (1, 8, 64) on H100 and L4, in a fresh process: wall time, CPU time and
peak RSS of the whole call (model built before the clock starts). With ``--generation``, the same
for ``count_generation`` (issue #32's target: 128 new tokens after a 128-token prompt, under 1 s).

    .venv/bin/python benchmarks/serve_speed.py [--layers 80] [--prompt 2048] [--new 256] [--full] [--profile]
    .venv/bin/python benchmarks/serve_speed.py --generation [--prompt 128] [--new 128] [--profile]

``--full`` counts both batch sizes in full (``serve_facts(..., derived=False)``, the path
before the derivation of issue #31's speed target), for a before/after in one process kind.
``--profile`` runs the call under cProfile and prints where the time goes: the forwards traced
(each one: the dispatch tracer over all layers), their costing and booking, the continued
steps, the pricing (cProfile's own overhead inflates every figure, about 2.5x). Every run also
prints the CPU time Python's garbage collector took (``gc.callbacks``) and how many full
collections ran: cProfile books a collection to whichever call was allocating when it started.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import resource
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: (label, file suffix, function name) of the calls the profile breakdown reports
WHERE: List[Tuple[str, str, str]] = [
    ("forwards traced (dispatch tracer, all layers)", "flopcount/tracers/__init__.py", "trace"),
    ("  of which the model's own code on meta kernels", "flopcount/core/state.py", "__torch_dispatch__"),
    ("costing events (handlers, bytes)", "flopcount/core/analysis.py", "cost_events"),
    ("booking a traced forward (aggregate)", "flopcount/core/results.py", "aggregate"),
    ("continued steps, count_generation (Affine.result_at)", "flopcount/decoding/runs.py", "result_at"),
    ("  of which their totals (reprice_deferred; tables on first read)", "flopcount/core/results.py", "reprice_deferred"),
    ("continued steps, serve derived (_continued)", "flopcount/serving/counting.py", "_continued"),
    ("pricing on the parts (serve_on)", "flopcount/serving/serve.py", "serve_on"),
]


def _profiled(call: Callable[[], Any]) -> Tuple[Any, List[str]]:
    profile = cProfile.Profile()
    result = profile.runcall(call)
    stats: Dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    lines = []
    for label, suffix, name in WHERE:
        calls, seconds = 0, 0.0
        for (path, _, function), (_, primitive, _, cumulative, _) in stats.items():
            if path.endswith(suffix) and function == name:
                calls += primitive
                seconds += cumulative
        lines.append(f"    {label:55s} {calls:5d} calls {seconds:7.2f} s")
    return result, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens (2048; 128 with --generation)")
    parser.add_argument("--new", type=int, default=None, help="new tokens (256; 128 with --generation)")
    parser.add_argument("--full", action="store_true", help="count both batch sizes in full (no derivation)")
    parser.add_argument("--generation", action="store_true", help="time count_generation instead of serve")
    parser.add_argument("--profile", action="store_true", help="print where the time goes (under cProfile)")
    args = parser.parse_args()
    prompt = args.prompt or (128 if args.generation else 2048)
    new = args.new or (128 if args.generation else 256)
    import torch
    import transformers

    from flopcount import count_generation
    from flopcount.devices import named_roofs
    from flopcount.serving import serve_facts, serve_on

    warnings.filterwarnings("ignore")
    # meta-llama/Llama-2-70b-hf config.json
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=args.layers, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=False)
    started = time.perf_counter()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    built = time.perf_counter() - started
    ids = torch.zeros(1, prompt, dtype=torch.int64, device="meta")
    timings: Dict[str, float] = {}

    def run_serve() -> Any:
        wall0 = time.perf_counter()
        facts = serve_facts(model, ids, new, derived=not args.full)
        timings["counting"] = time.perf_counter() - wall0
        return [serve_on(facts, named_roofs(part), part, capacity, link, batch=[1, 8, 64])
                for part, capacity, link in (("H100 SXM", 80e9, "nvlink4"), ("L4", 24e9, "pcie4"))]

    def run_generation() -> Any:
        return count_generation(model, ids, new)

    collector = [0.0, 0, 0.0]  # CPU seconds, full collections, start of the current one

    def collected(phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            collector[2] = time.process_time()
        else:
            collector[0] += time.process_time() - collector[2]
            collector[1] += info["generation"] == 2

    gc.callbacks.append(collected)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if args.profile:
        results, lines = _profiled(run_generation if args.generation else run_serve)
    else:
        results, lines = (run_generation if args.generation else run_serve)(), []
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    gc.callbacks.remove(collected)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    profiled = " (under cProfile)" if args.profile else ""
    if args.generation:
        print(f"LLaMA-2-70B ({args.layers} layers), count_generation, prompt {prompt}, {new} new{profiled}:")
        print(f"  {wall:.2f} s wall, {cpu:.2f} s CPU, peak RSS {peak / 1e9:.2f} GB; model built on meta in {built:.1f} s "
              f"(not included); {results.flops / 1e12:.3f} TFLOPs, decode {results.decode_flops / 1e12:.4f} TFLOPs")
    else:
        how = "both batch sizes counted in full" if args.full else "derived"
        print(f"LLaMA-2-70B ({args.layers} layers), prompt {prompt}, {new} new, batches 1, 8, 64 on H100 and L4 "
              f"({how}){profiled}:")
        print(f"  serve: {wall:.1f} s wall ({timings['counting']:.1f} s counting, the rest pricing), {cpu:.1f} s CPU, "
              f"peak RSS {peak / 1e9:.2f} GB; model built on meta in {built:.1f} s (not included)")
        for result in results:
            for row in result.batches:
                print(f"  {result.part:9s} B={row.batch:3d}  TTFT >= {row.ttft_s * 1e3:8.1f} ms  ITL >= "
                      f"{row.first_step.seconds * 1e3 if row.first_step else 0:7.2f} ms  tok/s <= "
                      f"{row.tokens_per_s or 0:9.1f}  fits: {row.fits}")
    print(f"  garbage collection: {collector[0]:.2f} s CPU, {collector[1]} full collection(s)")
    if lines:
        print("  where the time goes (cumulative, under cProfile):")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
