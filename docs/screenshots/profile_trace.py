"""The trace behind docs/img/profile_tensorboard*.png: ResNet-18 (batch 2, 224x224, one CPU
thread) profiled by flopcount, exported where the TensorBoard profiler plugin finds a run.

    PYTHONPATH=. python docs/screenshots/profile_trace.py /tmp/tb_profile
"""

import sys

import torch

import flopcount
from flopcount.examples.resnet import resnet18

torch.manual_seed(0)
torch.set_num_threads(1)
model, x = resnet18().eval(), torch.randn(2, 3, 224, 224)
result = flopcount.profile(model, x, warmup=1, steps=2)
result.export_chrome_trace(f"{sys.argv[1]}/resnet18/flopcount.pt.trace.json")  # run "resnet18", worker "flopcount"
print(result.table())
