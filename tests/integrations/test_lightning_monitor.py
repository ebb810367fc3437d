"""FlopcountMonitor in a real Lightning Trainer (CPU, a few steps, gradient accumulation 2,
a short last batch), next to Lightning's own ThroughputMonitor.

Oracles: each batch's training step counted with ``count_flops(..., backward=True)`` on a
module computing the same loss, the optimizer phase of ``count_flops(optimizer=<the
trainer's SGD>)``, and the forward MACs by hand (B x (8x16 + 16x4)) and live with
``FlopCounterMode``."""

from __future__ import annotations

import functools
import importlib.util
import logging
from types import SimpleNamespace
from typing import Any, Dict, List, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="needs lightning")

PEAK = 1e10


@functools.cache
def _lightning() -> SimpleNamespace:
    """lightning, and this file's classes that derive from its own, made on first use: imported at
    collection (torchmetrics and its plotting with it, ~0.4-0.75 s of CPU), lightning cost every
    pytest-xdist worker that much, also the one that runs none of these tests."""
    import lightning as L
    from lightning.pytorch.callbacks import ThroughputMonitor
    from lightning.pytorch.loggers import Logger

    from flopcount.integrations.lightning import FlopcountMonitor

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
            self.seen: List[Tuple[int, Any]] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", F.cross_entropy(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    class Capture(Logger):
        name = "capture"
        version = 0

        def __init__(self) -> None:
            super().__init__()
            self.rows: List[Dict[str, float]] = []

        def log_metrics(self, metrics, step=None):
            self.rows.append(dict(metrics))

        def log_hyperparams(self, *args, **kwargs):
            pass

    class SeenFlops(L.Callback):
        """What ThroughputMonitor reads: ``pl_module.flops_per_batch`` at each batch end."""

        def __init__(self) -> None:
            self.values: List[Any] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.values.append(pl_module.flops_per_batch)

    return SimpleNamespace(L=L, ThroughputMonitor=ThroughputMonitor, FlopcountMonitor=FlopcountMonitor, Tiny=Tiny,
                           Capture=Capture, SeenFlops=SeenFlops)


class Loss(nn.Module):
    """The oracle's model: the same loss as Tiny.training_step."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


def test_lightning_trainer_logs_the_exact_step_flops():
    lt = _lightning()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(10, 8), torch.randint(0, 4, (10,)))
    loader = torch.utils.data.DataLoader(data, batch_size=3)  # batches of 3, 3, 3, 1
    module, logger, seen = lt.Tiny(), lt.Capture(), lt.SeenFlops()
    monitor = lt.FlopcountMonitor(peak_flops=PEAK)
    throughput = lt.ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0], window_size=2)
    trainer = lt.L.Trainer(
        max_epochs=1, accumulate_grad_batches=2, logger=logger, callbacks=[monitor, seen, throughput], log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, limit_val_batches=2,
        num_sanity_val_steps=0, accelerator="cpu",
    )
    trainer.fit(module, loader, loader)

    oracle = Loss(module.net)
    batches = [tuple(b) for b in loader]
    per_batch = [count_flops(oracle, b, backward=True).flops for b in batches]
    optimizer_flops = count_flops(oracle, batches[0], backward=True, optimizer=trainer.optimizers[0]).by_phase()["optimizer"]
    expected = [per_batch[0] + per_batch[1] + optimizer_flops, per_batch[2] + per_batch[3] + optimizer_flops]
    logged = [row["flopcount/flops_per_step"] for row in logger.rows if "flopcount/flops_per_step" in row]
    assert logged == expected
    assert monitor.total_flops == sum(expected)
    rows = [row for row in logger.rows if "flopcount/flops_per_step" in row]
    assert all(row["flopcount/hfu"] == pytest.approx(row["flopcount/tflops_per_s"] * 1e12 / PEAK) for row in rows)
    # MFU: 3 x the step's batches' forward FLOPs over the same seconds (PaLM's convention)
    forward = [count_flops(oracle, b, backward=True).by_phase()["forward"] for b in batches]
    for row, model in zip(rows, [3 * (forward[0] + forward[1]), 3 * (forward[2] + forward[3])]):
        seconds = row["flopcount/flops_per_step"] / (row["flopcount/tflops_per_s"] * 1e12)
        assert row["flopcount/mfu"] == pytest.approx(model / seconds / PEAK)

    # ThroughputMonitor read the batch's FLOPs (optimizer on the batch that steps it) and logged a rate
    assert seen.values == [per_batch[0], per_batch[1] + optimizer_flops, per_batch[2], per_batch[3] + optimizer_flops]
    assert any("train/device/flops_per_sec" in row for row in logger.rows)

    for x, _ in batches[:1] + batches[-1:]:  # forward MACs: by hand and live
        sig_cost = next(c for s, c in monitor.counter.train.items() if ((x.shape[0], 8), torch.float32) in s)
        assert sig_cost.forward_macs == x.shape[0] * (8 * 16 + 16 * 4)
        with torch.no_grad(), FlopCounterMode(display=False) as peer:
            module.net(x)
        assert 2 * sig_cost.forward_macs == peer.get_total_flops()

    with torch.no_grad():
        val = sum(count_flops(oracle, b).flops for b in batches[:2])
    assert [row["flopcount/val_flops"] for row in logger.rows if "flopcount/val_flops" in row] == [val]

    assert "flops_per_batch" not in vars(module)  # the attribute set for ThroughputMonitor is gone
    assert module._trainer is trainer


def test_monitor_replays_no_hook_and_a_second_fit_counts_afresh():
    """Issue #29 items 8 and 10 for Lightning. Oracles: the user's own hook on ``net`` sees
    exactly the trainer's real forwards (4 batches), never a count's; a second fit of another
    module (wider net, same batch shapes) logs that module's FLOPs, counted by count_flops."""
    lt = _lightning()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8, 8), torch.randint(0, 4, (8,)))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    monitor = lt.FlopcountMonitor(peak_flops=PEAK)
    first, second = lt.Tiny(), lt.Tiny()
    second.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    seen: List[str] = []
    first.net.register_forward_hook(lambda m, a, o: seen.append(type(o).__name__))
    logged = []
    for module in (first, second):
        logger = lt.Capture()
        trainer = lt.L.Trainer(max_epochs=1, logger=logger, callbacks=[monitor], log_every_n_steps=1, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0, accelerator="cpu")
        trainer.fit(module, loader)
        if module is first:
            assert seen == ["Tensor"] * 4  # the trainer's 4 real batches; no fake copy ran the user's hook
        oracle = Loss(module.net)
        batch = next(iter(loader))
        step = count_flops(oracle, tuple(batch), backward=True, optimizer=trainer.optimizers[0]).flops
        logged.append(([row["flopcount/flops_per_step"] for row in logger.rows if "flopcount/flops_per_step" in row], step))
    for values, step in logged:
        assert values == [step] * 4
