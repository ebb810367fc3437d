"""What the trainer callbacks cost: once per new batch shape (the fake count), and per
training step after that (the hook, the lookups, the timing).

    PYTHONPATH=. /work/venvs/integ/bin/python benchmarks/bench_integrations.py [--steps 2000]

* HF ``FlopcountCallback`` on a tiny GPT-2 (2 layers, d=32) with gradient accumulation 2:
  per step = 2 pre-hook calls (the batch signature) + ``on_step_begin`` + ``on_step_end``
  + ``on_log``, called directly with the cache warm (median of 5 rounds of N steps);
  beside it, one real forward+backward of the same micro-batch, and the first count of a
  new shape (forward + backward + AdamW step, on fake copies).
* Lightning ``FlopcountMonitor``: ``on_train_batch_start`` + ``on_train_batch_end`` per
  batch with the cache warm (a stub trainer: the two hooks only).
"""

from __future__ import annotations

import argparse
import statistics
import time
import types
import warnings
from typing import Any, Callable, List

import torch


def _median_us(fn: Callable[[], Any], steps: int, rounds: int = 5) -> float:
    times: List[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        times.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(times)


def bench_hf(steps: int) -> None:
    import transformers

    from flopcount.integrations.hf import FlopcountCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 100, (2, 16))
    kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids, "num_items_in_batch": torch.tensor(32)}
    optimizer = torch.optim.AdamW(model.parameters())
    callback = FlopcountCallback(peak_flops=1e12)
    args = types.SimpleNamespace(torch_compile=False, bf16=False, fp16=False)
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        callback.on_train_begin(args, state, control, model=model)
    hook = next(iter(model._forward_pre_hooks.values()))

    def step() -> None:
        callback.on_step_begin(args, state, control)
        hook(model, (), kw)
        hook(model, (), kw)
        callback.on_step_end(args, state, control, optimizer=optimizer)
        callback.on_log(args, state, control, logs={"loss": 0.0})

    t0 = time.perf_counter()
    step()  # the first step of this shape: counted on fake copies
    first = time.perf_counter() - t0
    per_step = _median_us(step, steps)

    def real() -> None:
        model(**{k: v for k, v in kw.items() if k != "num_items_in_batch"}).loss.backward()

    real()
    real_us = _median_us(real, 20, rounds=3)
    callback.remove()
    print(f"HF FlopcountCallback, tiny GPT-2 (2x16 tokens, GA 2): first step of a new shape {first * 1e3:.1f} ms (fake count: "
          f"forward + backward + AdamW); then {per_step:.1f} us per optimizer step (2 hook calls + step begin/end + on_log)")
    print(f"  for scale: one real forward+backward of that micro-batch on this CPU: {real_us:.0f} us")


def bench_lightning(steps: int) -> None:
    from torch import nn

    from flopcount.integrations.lightning import FlopcountMonitor

    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    class Module(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def log(self, *args: Any, **kwargs: Any) -> None:
            pass

    module = Module()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    trainer = types.SimpleNamespace(optimizers=[optimizer], global_step=0, accumulate_grad_batches=1, num_training_batches=10**9,
                                    strategy=types.SimpleNamespace(root_device=torch.device("cpu")), sanity_checking=False)
    monitor = FlopcountMonitor(peak_flops=1e12)
    batch = (torch.randn(3, 8), torch.randint(0, 4, (3,)))

    def step() -> None:
        monitor.on_train_batch_start(trainer, module, batch, 0)
        trainer.global_step += 1
        monitor.on_train_batch_end(trainer, module, None, batch, 0)

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    per_step = _median_us(step, steps)
    print(f"Lightning FlopcountMonitor, MLP batch of 3: first batch of a new shape {first * 1e3:.1f} ms; then {per_step:.1f} us "
          "per batch (batch start + end, 5 pl_module.log calls stubbed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    options = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    bench_hf(options.steps)
    bench_lightning(options.steps)


if __name__ == "__main__":
    main()
