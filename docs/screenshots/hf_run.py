"""The run behind docs/img/integrations_tensorboard.png: a tiny GPT-2 trained for 30 CPU steps
by transformers.Trainer (batch 2, gradient accumulation 2, sequences of 8-32 tokens padded to
the longest, so the batch shape changes), logging to TensorBoard with FlopcountCallback.

    PYTHONPATH=. python docs/screenshots/hf_run.py /tmp/tb_hf
"""

import os
import sys
from typing import Dict, List

import torch
import transformers

from flopcount.integrations.hf import FlopcountCallback

logdir = sys.argv[1]
os.environ["TENSORBOARD_LOGGING_DIR"] = f"{logdir}/tiny-gpt2"  # transformers 5 has no logging_dir argument
torch.manual_seed(0)
torch.set_num_threads(1)  # a 2-core machine shared with other jobs: two threads stall on contention
config = transformers.GPT2Config(
    n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0
)
model = transformers.GPT2LMHeadModel(config)
data = [{"input_ids": torch.randint(0, 100, (int(n),))} for n in torch.randint(8, 33, (120,))]


def pad(items: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    n = max(len(i["input_ids"]) for i in items)
    ids = torch.zeros(len(items), n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, item in enumerate(items):
        ids[row, : len(item["input_ids"])] = item["input_ids"]
        mask[row, : len(item["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


args = transformers.TrainingArguments(
    output_dir=f"{logdir}/out",
    report_to=["tensorboard"],
    per_device_train_batch_size=2,
    gradient_accumulation_steps=2,
    max_steps=30,
    logging_steps=1,
    use_cpu=True,
    save_strategy="no",
    disable_tqdm=True,
    dataloader_num_workers=0,
    seed=0,
)
trainer = transformers.Trainer(
    model, args, train_dataset=data, data_collator=pad, callbacks=[FlopcountCallback(peak_flops=1e11)]
)
trainer.train()
print({k: v for k, v in trainer.state.log_history[-2].items() if k.startswith("flopcount/")})
