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


def test_mixed_precision_without_fsdp_is_refused_before_the_model_is_built() -> None:
    """FSDP2 applies mixed_precision: without fsdp > 1 nothing would. main said so only after
    building (and, with a stack of layers, tracing) the model; now before ``build`` runs. With
    fsdp=2 the same call builds the model and plans it."""
    built = []

    def build() -> Any:
        built.append(1)
        return tiny_encoder()

    x = torch.randn(2, 16, 64)
    for ranks in ({}, {"fsdp": 1}, {"tp": 2}):
        with pytest.raises(UsageError, match=r"^mixed_precision is FSDP2's MixedPrecisionPolicy: it needs fsdp > 1 "
                           r"\(or cast the model in build\)$"):
            flopcount.plan(build, (x,), mixed_precision="bfloat16", on=None, **ranks)
    assert built == []
    flopcount.plan(build, (x,), fsdp=2, mixed_precision="bfloat16", on=None)
    assert built


def test_cli_mixed_precision_without_fsdp_is_one_line_at_exit_2(tmp_path: Any, monkeypatch: Any, capsys: Any) -> None:
    """The factory is not called: it would raise a line of its own."""
    from conftest import run_cli

    (tmp_path / "never.py").write_text("def build():\n    raise RuntimeError('the factory ran')\n")
    monkeypatch.chdir(tmp_path)
    for ranks in ((), ("--fsdp", "1"), ("--tp", "2")):
        code, out, err = run_cli(capsys, "plan", "never.py:build", "--input", "2x16x64", "--mixed-precision", "bfloat16", *ranks)
        assert code == 2 and out == "", (ranks, err)
        assert err == ("flopcount: error: --mixed-precision is FSDP2's MixedPrecisionPolicy: it needs --fsdp > 1 (or "
                       "cast the model with --dtype)\n"), (ranks, err)
