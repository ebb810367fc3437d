"""FlopcountMonitor leaves the module as found on every exit path of a real Lightning
``fit()`` (issue #29 item 9): a failure in the loss, the backward or the optimizer step.

The monitor hooks nothing (Lightning hands callbacks the batch); what it sets on the module,
``flops_per_batch`` for ThroughputMonitor, goes in ``on_exception``. Oracle: the module's own
hook dictionaries and attributes read before ``fit``, and the monitor's record of counts (a
later forward of a new shape must add nothing)."""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _training_failures import Boom, StepFails, module_hooks, raise_in_backward
from torch import nn

from flopcount.core.inputs import is_dataless

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="needs lightning")


@functools.cache
def _failing() -> Any:
    """The LightningModule below, made on first use: lightning imported at collection cost every
    pytest-xdist worker ~0.4-0.75 s of CPU, also the one that runs none of these tests."""
    import lightning as L

    class Failing(L.LightningModule):
        """Linear(8, 16) -> ReLU -> Linear(16, 4), cross-entropy; fails at its second real step where told."""

        def __init__(self, where: str) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
            self.where = where
            self.real_steps = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            if not is_dataless(x):
                self.real_steps += 1
                if self.real_steps == 2 and self.where == "loss":
                    raise Boom("loss failed")
                if self.real_steps == 2 and self.where == "backward":
                    loss.register_hook(raise_in_backward)
            return loss

        def configure_optimizers(self) -> Any:
            return StepFails(self.parameters(), lr=0.1)

    return Failing


@pytest.mark.parametrize("where", ["loss", "backward", "optimizer"])
def test_a_fit_that_raises_leaves_the_module_as_found(where: str) -> None:
    import lightning as L

    from flopcount.integrations.lightning import FlopcountMonitor

    torch.manual_seed(0)
    StepFails.real_steps = 0
    module = _failing()(where)
    before = module_hooks(module)
    data = torch.utils.data.TensorDataset(torch.randn(12, 8), torch.randint(0, 4, (12,)))
    monitor = FlopcountMonitor(peak_flops=1e10)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, callbacks=[monitor], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    with pytest.raises(Boom):
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=3))
    assert module.real_steps >= 1, "the failure came before any step: the test would prove nothing"
    assert monitor.counter.train, "the monitor counted no step: the test would prove nothing"
    assert module_hooks(module) == before
    assert "flops_per_batch" not in vars(module)
    counted = (dict(monitor.counter.train), dict(monitor.counter.eval), monitor.total_flops)
    with torch.no_grad():
        for n in (5, 7):  # the user's own forwards afterwards, new shapes
            module(torch.randn(n, 8))
    assert (dict(monitor.counter.train), dict(monitor.counter.eval), monitor.total_flops) == counted
    assert module_hooks(module) == before
