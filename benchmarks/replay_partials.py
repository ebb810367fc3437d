"""The layer replay on a stack whose layers each hold a functools.partial activation (Gemma,
Starcoder2: transformers' GELUTanh): estimate_memory and plan of a 28-layer tiny Gemma, CPU
seconds (median of 3) and a figure of each, to run on two trees in turn (docs/performance.md,
"gemmareplay"): ``PYTHONPATH=TREE python benchmarks/replay_partials.py``."""
import time, warnings, torch, flopcount, sys
from transformers import GemmaConfig, GemmaForCausalLM
warnings.simplefilter("ignore")
torch.set_num_threads(1)
cfg = GemmaConfig(num_hidden_layers=28, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256, use_cache=False)
torch.manual_seed(0)
m = GemmaForCausalLM(cfg)
ids = torch.randint(0, 256, (2, 16))
out = []
for reading in ("estimate", "plan"):
    ts = []
    for _ in range(3):
        t = time.process_time()
        if reading == "estimate":
            r = flopcount.estimate_memory(m, (), {"input_ids": ids, "labels": ids}, backward=True, optimizer="adamw")
            key = r.peak_bytes
        else:
            r = flopcount.plan(lambda: GemmaForCausalLM(cfg), (), {"input_ids": ids, "labels": ids}, on="h100", fsdp=4, optimizer="adamw")
            key = r.macs["forward"]
        ts.append(time.process_time() - t)
    out.append(f"{reading} {sorted(ts)[1]:.2f}s cpu (median of 3) figure {key}")
print(flopcount.__file__, *out, sep="\n  ")
