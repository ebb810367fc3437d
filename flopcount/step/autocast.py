"""``estimate_memory(autocast=)``, ``plan(autocast=, mixed_precision=)``: the dtype given, which
device autocast applies to, and the note for an estimate made inside the caller's own
``torch.autocast``."""

from __future__ import annotations

from typing import Any, List, Optional, Union

import torch
from torch import nn

from flopcount.core.inputs import output_tensors
from flopcount.errors import UsageError

__all__ = ["ambient_autocast_note", "amp_device", "floating_dtype"]


def floating_dtype(value: Union[None, str, torch.dtype], where: str) -> Optional[torch.dtype]:
    """``value`` (a torch.dtype or its name: "bfloat16", "torch.float16") as a floating
    torch.dtype; None stays None; anything else is a usage error naming ``where``."""
    if value is None:
        return None
    found = getattr(torch, value.strip().replace("torch.", ""), None) if isinstance(value, str) else value
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise UsageError(f"{where} must be a floating torch.dtype such as torch.bfloat16 (or its name), got {value!r}")
    return found


def ambient_autocast_note(amp: Optional[torch.dtype]) -> List[str]:
    """An estimate called inside ``torch.autocast`` (without ``autocast=``) runs its backward
    and optimizer step inside it too: say so, and how to get the AMP recipe instead."""
    if amp is not None or not any(torch.is_autocast_enabled(kind) for kind in ("cpu", "cuda")):
        return []
    return [
        "estimate_memory ran inside torch.autocast, so its backward and optimizer step did too (they keep "
        "low-precision weight copies alive); the AMP recipe leaves autocast before backward(): pass autocast=dtype instead"
    ]


def amp_device(model: nn.Module, args: Any, kwargs: Any) -> str:
    """The device type autocast applies to: the parameters' (else the inputs'), cpu by default."""
    return next((tensor.device.type for tensor in [*model.parameters(), *output_tensors((args, kwargs))]), "cpu")
