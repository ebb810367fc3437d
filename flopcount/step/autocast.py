"""``estimate_memory(autocast=)``, ``plan(autocast=)``: which device autocast applies to, and the
note for an estimate made inside the caller's own ``torch.autocast`` (the dtype given is read by
:func:`flopcount.core.dtypes.parse_dtype`)."""

from __future__ import annotations

from typing import Any, List, Optional

import torch
from torch import nn

from flopcount.core.inputs import output_tensors

__all__ = ["ambient_autocast_note", "amp_device"]


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
