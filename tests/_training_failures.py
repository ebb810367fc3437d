"""What the trainer integrations' exit tests (HF Trainer, Lightning) make fail, and what they
compare: one copy for both, importing neither framework (a test of one must not be skipped
where the other is missing)."""

from __future__ import annotations

from typing import Any, Dict

import torch
from torch import nn

from flopcount.core.inputs import is_dataless

#: the per-module hook dictionaries a training call could leave behind, listed by name here
#: (not through flopcount.core.hooks, the convention under test)
HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
         "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")  # fmt: skip


def module_hooks(model: nn.Module) -> Dict[str, Any]:
    """Every hook of every module of ``model``, by module name and dictionary."""
    return {f"{name}.{attr}": list(getattr(m, attr)) for name, m in model.named_modules() for attr in HOOKS}


class Boom(RuntimeError):
    pass


class StepFails(torch.optim.SGD):
    """SGD whose second real step raises (steps on fake copies, flopcount's count, pass).
    Reset ``StepFails.real_steps`` before each run."""

    real_steps = 0

    def step(self, closure: Any = None) -> Any:
        if not any(is_dataless(p) for group in self.param_groups for p in group["params"]):
            StepFails.real_steps += 1
            if StepFails.real_steps == 2:
                raise Boom("optimizer step failed")
        return super().step(closure)


def raise_in_backward(grad: torch.Tensor) -> torch.Tensor:
    raise Boom("backward failed")
