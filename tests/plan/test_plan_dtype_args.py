"""plan and estimate_memory read a dtype argument by one rule (core.dtypes.parse_dtype, "floating"): a
floating torch.dtype or its name; plan took a non-floating torch.dtype (torch.int8) silently before."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _plan_gloo import tiny_encoder

import flopcount
from flopcount.errors import UsageError


@pytest.mark.parametrize("bad", [torch.int8, torch.complex64, "int64", "float128", 3])
def test_plan_and_estimate_memory_refuse_the_same_dtypes(bad: Any) -> None:
    x = torch.randn(2, 16, 64)
    with pytest.raises(UsageError, match=r"^plan: mixed_precision must be a floating torch\.dtype"):
        flopcount.plan(tiny_encoder, (x,), fsdp=2, mixed_precision=bad, on=None)
    with pytest.raises(UsageError, match=r"^plan: autocast must be a floating torch\.dtype"):
        flopcount.plan(tiny_encoder, (x,), fsdp=2, autocast=bad, on=None)
    with pytest.raises(UsageError, match=r"^estimate_memory: dtype must be a floating torch\.dtype"):
        flopcount.estimate_memory(tiny_encoder(), x, dtype=bad)
    with pytest.raises(UsageError, match=r"^estimate_memory: autocast must be a floating torch\.dtype"):
        flopcount.estimate_memory(tiny_encoder(), x, autocast=bad)


@pytest.mark.parametrize("name", ["bfloat16", "torch.bfloat16", " float16 ", torch.bfloat16])
def test_a_floating_dtype_or_its_name_is_taken(name: Any) -> None:
    from flopcount.core.dtypes import parse_dtype

    expected = torch.float16 if "float16" in str(name) and "bfloat" not in str(name) else torch.bfloat16
    assert parse_dtype(name, "here", "floating") is expected
