"""One optimizer step after the backward, on fake twins of the parameters.

The step's ops depend only on the parameters (shapes, dtypes, devices), on which of them
received a gradient, and on the optimizer's settings, never on values; so it runs on
fake twins in a FakeTensorMode of its own, whichever tracer ran forward and backward
(fake copies or the real model). The optimizer is warmed up by one unrecorded step on
zero gradients, so the recorded step is the steady state (Adam's moments exist). The
user's parameters, gradients and optimizer are never touched.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Sequence

import torch
from torch import nn

from flopcount.step.optimizers import OptimizerSpec, build_optimizer, warm_up
from flopcount.tracers.fake.copies import quiet_fake_logs

__all__ = ["FakeOptimizerStep"]


class FakeOptimizerStep:
    """``spec`` rebuilt on fake twins of ``params`` (the user's model's parameters, in
    ``model.parameters()`` order); ``trained[i]`` says whether ``params[i]`` got a gradient
    in the backward. Enter :meth:`running` and call :meth:`step` to run the one step."""

    def __init__(self, spec: OptimizerSpec, params: Sequence[nn.Parameter], trained: Sequence[bool], caller: str):
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.mode = FakeTensorMode(allow_non_fake_inputs=False)
        with self.mode, quiet_fake_logs():
            twins: Dict[int, torch.Tensor] = {id(param): _twin(param) for param in dict.fromkeys(params)}  # a tensor once
            self.optimizer, self.name = build_optimizer(spec, twins, [twins[id(p)] for p in params], caller)
            warm_up(self.optimizer, caller, reuse=True)  # fakes: one step per kind of parameter
            for param, got_grad in zip(params, trained):
                twin = twins[id(param)]
                if got_grad and twin.grad is None:  # a tied parameter: one gradient
                    twin.grad = torch.zeros_like(twin)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self.mode, quiet_fake_logs(), torch.no_grad():
            yield

    def step(self) -> Any:
        return self.optimizer.step()


def _twin(param: torch.Tensor) -> torch.Tensor:
    """A fake parameter with ``param``'s shape, strides, dtype and device (meta as cpu)."""
    device = torch.device("cpu") if param.device.type == "meta" else param.device
    made = torch.empty_strided(tuple(param.shape), tuple(param.stride()), dtype=param.dtype, device=device)
    return nn.Parameter(made, requires_grad=param.requires_grad)
