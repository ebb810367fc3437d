"""CPU seconds of ``estimate_memory`` (an AdamW training step, 1 x 512 tokens) and ``plan`` on the
real DeepSeek-V3 config on the meta device (transformers' ``deepseek_v3`` defaults: 61 layers, the
first 3 dense, then 58 mixture-of-experts layers of 256 experts), whose stack begins with a *head* of
layers of another kind (issue #32, helper headreplay), and on LLaMA-2-70B (80 identical layers) as
the control. Run it with ``PYTHONPATH`` at the tree to time (the one before headreplay and the one
after, in turn: the machine is noisy); prints the median of ``--repeat`` calls' ``time.process_time``
(after one warm-up call unless ``--no-warm-up``), whether the layer replay was taken, a digest of the
whole result (equal in both trees and with ``FLOPCOUNT_REUSE=0``) and the load average (a reading that
raises: the CPU seconds to the error, and the error; ``deepseek_v3_fewer_kv_heads``, whose forward
transformers itself cannot run, helper mlawalk)::

    PYTHONPATH=. python benchmarks/replay_head_timing.py --model deepseek_v3 --reading estimate [--repeat 3]
    PYTHONPATH=. python benchmarks/replay_head_timing.py --model deepseek_v3 --reading plan --fsdp 8 --tp 1
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import statistics
import time
import warnings
from typing import Any, Callable, List, Optional

import torch
from torch import nn

import flopcount


def deepseek_v3() -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("deepseek_v3", use_cache=False)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config).train()  # float32: FSDP takes one dtype (the router's is float32)


def deepseek_v3_fewer_kv_heads() -> nn.Module:
    """DeepSeek-V3's config with 64 key/value heads for its 128 query heads, as the zoo's tiny
    configs of the multi-head latent attention types have (helper mlawalk): the attention expands K
    and V to every query head whatever the count, transformers' tracing branch repeats them by
    ``heads // num_key_value_heads`` and fails, its real branch (the step's) runs. Published configs
    have as many key/value heads as query heads; this one is real-shaped otherwise."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("deepseek_v3", use_cache=False, num_key_value_heads=64)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config).train()


def llama2_70b() -> nn.Module:
    from transformers import LlamaForCausalLM

    from flopcount.examples.hf import llama2_70b_config

    config = llama2_70b_config()
    config.use_cache = False
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(torch.bfloat16).train()


MODELS = {"deepseek_v3": deepseek_v3, "deepseek_v3_fewer_kv_heads": deepseek_v3_fewer_kv_heads, "llama2_70b": llama2_70b}


def spied() -> List[bool]:
    """Whether each reading took the layer replay (estimate's ``_layered``, plan's ``_layered_step``
    gave figures), in call order."""
    taken: List[bool] = []
    for module_name, function_name in (("flopcount.memory.estimate", "_layered"), ("flopcount.planning.plan", "_layered_step")):
        module = importlib.import_module(module_name)
        original = getattr(module, function_name)

        def spy(*args: Any, original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            made = original(*args, **kwargs)
            taken.append(made is not None)
            return made

        setattr(module, function_name, spy)
    return taken


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), required=True)
    parser.add_argument("--reading", choices=["estimate", "plan"], required=True)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--fsdp", type=int, default=8)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-warm-up", action="store_true")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    build = MODELS[args.model]
    ids = torch.randint(0, 1000, (1, args.tokens), generator=torch.Generator().manual_seed(1)).to("meta")
    taken = spied()
    if args.reading == "estimate":
        model = build()

        def reading() -> Any:
            return flopcount.estimate_memory(model, (ids,), backward=True, optimizer="adamw")
    else:
        def reading() -> Any:
            return flopcount.plan(build, (ids,), fsdp=args.fsdp, tp=args.tp)

    if not args.no_warm_up:
        reading()
    seconds = []
    result = None
    for _ in range(args.repeat):
        start = time.process_time()
        try:
            result = reading()
        except Exception as exc:  # a model the reading refuses: the CPU seconds it took to say so
            seconds.append(time.process_time() - start)
            said = str(exc).splitlines()[0][:160]
            print(f"{args.model} {args.reading} fsdp={args.fsdp} tp={args.tp}: raised after {statistics.median(seconds):.2f} s CPU "
                  f"(median of {len(seconds)}), replayed {taken[-1] if taken else None}: {type(exc).__name__}: {said}", flush=True)
            return
        seconds.append(time.process_time() - start)
    digest = hashlib.sha256(repr(result).encode()).hexdigest()[:16]
    load = open("/proc/loadavg").read().split()[:3]
    print(f"{args.model} {args.reading} fsdp={args.fsdp} tp={args.tp}: {statistics.median(seconds):.2f} s CPU "
          f"(median of {args.repeat}: {', '.join(f'{s:.2f}' for s in seconds)}), replayed {taken[-1] if taken else None}, "
          f"peak {result.peak_bytes:,} B, digest {digest}, load {' '.join(load)}", flush=True)


if __name__ == "__main__":
    main()
