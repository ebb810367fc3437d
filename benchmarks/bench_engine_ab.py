"""One count's wall time with this checkout's flopcount, for A/B runs against another
checkout (best of 7 after two warm-up counts, one torch thread):

    PYTHONPATH=/path/to/old .venv/bin/python benchmarks/bench_engine_ab.py old resnet
    PYTHONPATH=. .venv/bin/python benchmarks/bench_engine_ab.py new resnet      # resnet | bert | gpt2

Run old and new alternately (the machine is shared and noisy) and compare the pairs.
"""
import sys, time, warnings
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(1)
from flopcount import count_flops
from transformers import BertConfig, BertModel, GPT2Config, GPT2Model
from flopcount.examples.resnet import resnet50
which = sys.argv[2]
if which == "bert":
    m = BertModel(BertConfig()).eval(); x = torch.randint(0, 1000, (1, 128))
elif which == "gpt2":
    m = GPT2Model(GPT2Config()).eval(); x = torch.randint(0, 1000, (1, 256))
else:
    m = resnet50().eval(); x = torch.randn(1, 3, 224, 224)
count_flops(m, x); count_flops(m, x)
b = 9
for _ in range(7):
    t = time.perf_counter(); count_flops(m, x); b = min(b, time.perf_counter() - t)
print(sys.argv[1], which, round(b * 1e3, 1), "ms")
