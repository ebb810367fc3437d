"""Exact FLOPs, TFLOP/s and MFU in Lightning: :class:`FlopcountMonitor`.

>>> trainer = L.Trainer(callbacks=[FlopcountMonitor()])  # doctest: +SKIP

Lightning hands callbacks the batch, so nothing is hooked: a batch of a new signature is counted
once on fake copies, every later one is a lookup; metrics go through ``pl_module.log`` once per
optimizer step, and ``pl_module.flops_per_batch`` is set for ``ThroughputMonitor`` (docs/integrations.md,
"Lightning").
"""

from __future__ import annotations

import inspect
import time
import warnings
from typing import Any, List, Mapping, Optional

import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from flopcount.bench.peak import mfu_part
from flopcount.core.weakcache import PerObject
from flopcount.errors import FlopcountWarning
from flopcount.integrations._counting import StepCounter, batch_signature, hookless_twin
from flopcount.integrations._rates import (
    PREFIX,
    Window,
    model_dtype,
    model_flops,
    resolve_peak,
    window_metrics,
)

__all__ = ["FlopcountMonitor", "lightning_loss"]

_PRECISION_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}


def lightning_loss(output: Any) -> Any:
    """The loss Lightning backpropagates: the tensor ``training_step`` returns, or its
    ``"loss"`` entry."""
    return output["loss"] if isinstance(output, Mapping) else output


class _Step(nn.Module):
    """``module.<method>(*args)`` as a forward, so the step is counted like a model."""

    def __init__(self, module: nn.Module, method: str):
        super().__init__()
        self.module = module
        self.method = method

    def forward(self, *args: Any) -> Any:
        with warnings.catch_warnings():  # `self.log` on the detached copy warns: nothing to log to
            warnings.simplefilter("ignore")
            return getattr(self.module, self.method)(*args)


class FlopcountMonitor(Callback):
    """Logs ``flopcount/flops_per_step``, ``tflops_per_s``, ``mfu``, ``hfu``, ``samples_per_s`` (and
    ``total_flops``, ``val_flops``) via ``pl_module.log``.

    ``peak_flops``: FLOP/s for the MFU (default: the GPU's dense datasheet peak at the
    trainer's precision; on CPU no MFU unless given: a measured CPU rate is not a peak).
    ``on``: the modeled part whose dense datasheet peak the MFU uses instead ("h100",
    "a100 40gb pcie", ...; :mod:`flopcount.devices.parts`), e.g. a GPU the table does not
    recognise by its reported name.
    Counts run on a hookless twin of the module (same parameters, none of its hooks, no
    trainer reference): its hooks are never replayed and the module is not touched. Each
    ``fit`` counts afresh. Step time: the wall time of the
    optimizer step's batches, ``on_train_batch_start`` to ``on_train_batch_end`` (data
    loading excluded), with a CUDA synchronisation at each batch end on GPU.
    """

    def __init__(self, peak_flops: Optional[float] = None, *, on: Optional[str] = None):
        self._part = mfu_part("FlopcountMonitor", on, peak_flops)  # an unknown part is said here, not at fit start
        self.peak_flops = peak_flops
        self.on = on
        self.counter = StepCounter(lightning_loss)
        self.total_flops = 0
        self._peak: Optional[float] = None
        self._set_attribute: Optional[nn.Module] = None
        self._window = Window()
        self._step_flops: Optional[int] = 0
        self._step_seconds = 0.0
        self._step_samples = 0
        self._t0 = 0.0
        self._global_step = 0
        self._batch_flops: Optional[int] = None
        self._batch_forward = 0
        self._step_forward = 0
        self._frozen = False
        self._val_flops = 0

    # -- setup / teardown -----------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        # every fit counts afresh: another Trainer may bring another module or optimizer under the same shapes
        self.counter = StepCounter(lightning_loss)
        self.total_flops = 0
        precision = str(getattr(trainer, "precision", "32"))
        dtype = next((d for key, d in _PRECISION_DTYPES.items() if precision.startswith(key)), model_dtype(pl_module))
        self._peak, note = resolve_peak(trainer.strategy.root_device, dtype, self.peak_flops, self._part)
        if note:
            warnings.warn(f"FlopcountMonitor: {note}", FlopcountWarning, stacklevel=2)
        if not hasattr(pl_module, "flops_per_batch"):
            pl_module.flops_per_batch = None
            self._set_attribute = pl_module

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._remove_attribute()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._remove_attribute()

    def _remove_attribute(self) -> None:
        if self._set_attribute is not None:
            vars(self._set_attribute).pop("flops_per_batch", None)
            self._set_attribute = None

    # -- training -------------------------------------------------------------------
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        args = _step_args(pl_module.training_step, batch, batch_idx)
        sig = batch_signature(args, {})
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        if sig not in self.counter.train or id(optimizer) not in self.counter.optimizer:
            self.counter.count_train(sig, _Step(_detached_twin(pl_module), "training_step"), args, {}, optimizer)
        cost = self.counter.train.get(sig)
        opt = self.counter.optimizer_flops(optimizer)
        self._batch_flops = None if cost is None else cost.flops
        self._batch_forward = 0 if cost is None else cost.forward
        self._frozen = cost is not None and cost.frozen
        if self._set_attribute is not None:
            steps = _steps_optimizer(trainer, batch_idx)
            pl_module.flops_per_batch = None if cost is None or opt is None else cost.flops + (opt if steps else 0)
        self._global_step = trainer.global_step
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        self._step_seconds += time.perf_counter() - self._t0
        self._step_samples += _batch_size(batch)
        if self._step_flops is not None:
            self._step_flops = None if self._batch_flops is None else self._step_flops + self._batch_flops
        self._step_forward += self._batch_forward
        if trainer.global_step == self._global_step:
            return  # accumulating gradients: the optimizer has not stepped yet
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        opt = self.counter.optimizer_flops(optimizer)
        flops = None if self._step_flops is None or opt is None else self._step_flops + opt
        if flops is not None:
            self.total_flops += flops
            self._window.add(flops, self._step_seconds, None, self._step_samples,
                             model_flops=model_flops(self._step_forward, flops, self._frozen))
            metrics = window_metrics(self._window, self._peak)
            metrics[PREFIX + "total_flops"] = float(self.total_flops)
            for name, value in metrics.items():
                pl_module.log(name, value, on_step=True, on_epoch=False)
        self._window = Window()
        self._step_flops, self._step_seconds, self._step_samples, self._step_forward = 0, 0.0, 0, 0

    # -- validation -----------------------------------------------------------------
    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking:
            return
        args = _step_args(pl_module.validation_step, batch, batch_idx)
        sig = batch_signature(args, {})
        if sig not in self.counter.eval:
            with torch.no_grad():
                self.counter.count_eval(sig, _Step(_detached_twin(pl_module), "validation_step"), args, {})
        flops = self.counter.eval.get(sig)
        if flops is not None:
            self._val_flops += flops

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or not self._val_flops:
            return
        pl_module.log(PREFIX + "val_flops", float(self._val_flops), on_step=False, on_epoch=True, reduce_fx="sum")
        self._val_flops = 0


def _step_args(method: Any, batch: Any, batch_idx: int) -> tuple:
    """``(batch, batch_idx)``, or ``(batch,)`` for a step that takes the batch only."""
    return (batch,) if _takes_batch_only(getattr(method, "__func__", method)) else (batch, batch_idx)


def _batch_only(function: Any) -> bool:
    try:
        params = [p for p in inspect.signature(function).parameters.values() if p.kind is not p.VAR_KEYWORD]
    except (TypeError, ValueError):
        return False
    if params and params[0].name == "self":
        params = params[1:]
    return len(params) == 1 and params[0].kind is not params[0].VAR_POSITIONAL


# per step function, read once; kept while the function lives (an lru_cache held the user's
# LightningModule class's functions, and through a ``super()`` cell the class, for good)
_takes_batch_only = PerObject(_batch_only)


def _steps_optimizer(trainer: Any, batch_idx: int) -> bool:
    """Whether the batch ``batch_idx`` ends a gradient-accumulation cycle."""
    every = max(int(getattr(trainer, "accumulate_grad_batches", 1)), 1)
    total = getattr(trainer, "num_training_batches", float("inf"))
    return (batch_idx + 1) % every == 0 or batch_idx + 1 >= total


def _batch_size(batch: Any) -> int:
    """The leading dimension of the first tensor in the batch."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values: List[Any] = list(batch.values()) if isinstance(batch, Mapping) else list(batch) if isinstance(batch, (list, tuple)) else []
    return next((size for size in map(_batch_size, values) if size), 0)


def _detached_twin(pl_module: nn.Module) -> nn.Module:
    """The module tree as a hookless twin (shared parameters, no user hooks) whose modules
    hold no trainer reference (the fake copy would otherwise deep-copy the Trainer, and
    ``self.log`` would log fakes); ``pl_module`` itself is not touched."""
    twin = hookless_twin(pl_module)
    for module in twin.modules():
        if "_trainer" in vars(module):
            vars(module)["_trainer"] = None
    return twin
