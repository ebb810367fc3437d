"""Moved to :mod:`flopcount.devices` (measured roofs: :mod:`flopcount.devices.measured`);
these names stay importable from here as plain aliases."""

from __future__ import annotations

from ..devices import THIS_MACHINE, datasheet_roofs, named_roofs, roofs_for  # noqa: F401
from ..devices.measured import (  # noqa: F401
    CPU_DTYPES,
    CUDA_DTYPES,
    best_of,
    cache_path,
    machine_key,
    machine_roofs,
    measure_roofs,
    remember_roofs,
)
