"""flopcount.serve(on="this machine") against real generate() runs on this machine (issue #31).

Five architectures (GPT-2, a LLaMA-style GQA decoder, a Mistral sliding-window decoder, Mamba,
T5), small configs in float32 on the CPU, batch 1 and 8: each forward of a real greedy
``generate()`` is timed (perf_counter around the model's forward, and for T5 around its
encoder, which generate() runs before the first forward), fastest of 5 runs per forward.
The prefill (T5: encoder + first decoder step), the first decode step and the last are
compared with serve's any-implementation bounds priced on this machine's measured roofs
(``named_roofs("this machine")``, what ``on="this machine"`` reads, read once for all cases):
ratio = bound / measured, which a true bound keeps at or below 1.0.

    .venv/bin/python benchmarks/serve_this_machine.py [--runs 5] [--new 8]

On a GPU (``--device cuda``): the same five models plus a 1.1B LLaMA-style decoder in bfloat16
(where the GPU is not launch-bound), built on the GPU; each forward is timed with CUDA events
(GPU time between markers: never more than the wall time, the stricter comparison); the bounds
are priced twice, on the GPU's roofs measured here and on its datasheet part
(``torch.cuda.get_device_name()``), and the larger ratio is reported.
"""

from __future__ import annotations

import argparse
import functools
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _clock import Clock  # noqa: E402

P = 128  # prompt tokens


def _models() -> Dict[str, Any]:
    import transformers

    common = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                  vocab_size=8000, max_position_embeddings=1024)
    return {
        "GPT-2": transformers.AutoConfig.for_model("gpt2", n_embd=256, n_layer=4, n_head=8, vocab_size=8000,
                                                   n_positions=1024),
        "LLaMA (GQA 8/2)": transformers.AutoConfig.for_model("llama", num_key_value_heads=2, **common),
        "Mistral (window 64)": transformers.AutoConfig.for_model("mistral", num_key_value_heads=2, sliding_window=64,
                                                                 **common),
        "Mamba": transformers.AutoConfig.for_model("mamba", hidden_size=256, state_size=16, num_hidden_layers=4,
                                                   vocab_size=8000, expand=2, conv_kernel=4),
        "T5": transformers.AutoConfig.for_model("t5", d_model=256, d_ff=1024, d_kv=32, num_heads=8, num_layers=4,
                                                num_decoder_layers=4, vocab_size=8000),
    }


def _gpu_models() -> Dict[str, Any]:
    import transformers

    big = transformers.AutoConfig.for_model(
        "llama", hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, torch_dtype="bfloat16")
    return {**_models(), "LLaMA 1.1B bf16 (GQA 32/4)": big}


def _build(config: Any, device: str = "cpu") -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    dtype = torch.bfloat16 if str(getattr(config, "torch_dtype", "")).endswith("bfloat16") else torch.float32
    with torch.device(device):
        if config.is_encoder_decoder:
            model = transformers.AutoModelForSeq2SeqLM.from_config(config)
        else:
            model = transformers.AutoModelForCausalLM.from_config(config)
    model = model.to(dtype)
    model.generation_config.eos_token_id = None
    if config.is_encoder_decoder:
        model.generation_config.decoder_start_token_id = config.pad_token_id  # T5 starts from its pad token
    return model.eval()


def _timed_generate(model: Any, ids: Any, new: int) -> List[float]:
    """Seconds of each forward generate() runs (T5: the encoder's time added to the first)."""
    import torch

    clock = Clock(ids.is_cuda)
    spans: List[Any] = []
    encoder_spans: List[Any] = []
    forward = model.forward

    @functools.wraps(forward)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock.start()
        out = forward(*args, **kwargs)
        spans.append(clock.stop(start))
        return out

    encoder = model.get_encoder() if model.config.is_encoder_decoder else None
    enc_forward = encoder.forward if encoder is not None else None
    if encoder is not None:
        @functools.wraps(enc_forward)
        def timed_encoder(*args: Any, **kwargs: Any) -> Any:
            start = clock.start()
            out = enc_forward(*args, **kwargs)
            encoder_spans.append(clock.stop(start))
            return out

        encoder.forward = timed_encoder
    model.forward = timed
    try:
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    finally:
        del model.forward
        if encoder is not None:
            del encoder.forward
    times = [Clock.seconds(span) for span in spans]
    times[0] += sum(Clock.seconds(span) for span in encoder_spans)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new", type=int, default=8)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    import torch

    import flopcount
    from flopcount.devices import Roofs, named_roofs
    from flopcount.devices.measured import best_of, measure_roofs

    warnings.filterwarnings("ignore")
    pricing: Dict[str, Roofs] = {}
    if args.device == "cuda":
        part = torch.cuda.get_device_name()
        pricing["measured"] = best_of(measure_roofs("cuda"), measure_roofs("cuda"))
        pricing["datasheet"] = named_roofs(part)
        models = _gpu_models()
        print(part, flush=True)
    else:
        # this machine's roofs, measured once (or read from the cache) under the same load as the runs
        pricing["measured"] = named_roofs("this machine")
        models = _models()
    for label, roofs in pricing.items():
        print(f"{label}: {roofs.describe()}", flush=True)
    rows: List[Tuple[str, int, str, float, float]] = []
    for name, config in models.items():
        model = _build(config, args.device)
        for batch in (1, 8):
            ids = torch.randint(0, 8000, (batch, P), device=args.device)
            runs = [_timed_generate(model, ids, args.new) for _ in range(args.runs)]
            fastest = [min(r[i] for r in runs) for i in range(len(runs[0]))]
            for label, roofs in pricing.items():
                result = flopcount.serve(model, ids, args.new, on=roofs)
                row = result.at(batch)
                assert row.first_step is not None and row.last_step is not None
                for what, bound, measured in (("prefill", row.prefill.seconds, fastest[0]),
                                              ("first step", row.first_step.seconds, fastest[1]),
                                              ("last step", row.last_step.seconds, fastest[-1])):
                    rows.append((name, batch, f"{what} ({label})", bound, measured))
                    print(f"{name:26s} B={batch}  {what:10s} {label:9s}  bound {bound * 1e3:9.4f} ms  "
                          f"measured {measured * 1e3:9.4f} ms  ratio {bound / measured:.3f}", flush=True)
        del model
    above = [r for r in rows if r[3] > r[4]]
    print(f"\n{len(rows)} comparisons, {len(above)} above 1.0 ({', '.join(f'{r[0]} B={r[1]} {r[2]}' for r in above) or 'none'}); "
          f"largest ratio {max(r[3] / r[4] for r in rows):.3f}")


if __name__ == "__main__":
    main()
