"""Parsing the CLI's text: quantities, input SPECs, NAME=SPEC, KEY=VALUE; example tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount.budget.check import parse_quantity
from flopcount.cli.specs import (
    InputSpec,
    make_tensor,
    parse_config_value,
    parse_kwarg,
    parse_spec,
    token_range,
)
from flopcount.errors import UsageError


@pytest.mark.parametrize(
    "text, expected",
    [
        ("25M", 25 * 10**6),
        ("5G", 5 * 10**9),
        ("1.5T", 1.5 * 10**12),
        ("2.5k", 2500),
        ("2K", 2000),
        ("3e9", 3 * 10**9),
        ("1.2E3", 1200),
        ("120", 120),
        ("0", 0),
        ("0.5", 0.5),
        ("1_000", 1000),
        (" 7 M ", 7 * 10**6),
        (42, 42),
        (2.5, 2.5),
    ],
)
def test_quantities(text, expected):
    value = parse_quantity(text)
    assert value == expected
    if float(expected).is_integer():
        assert isinstance(value, int)


@pytest.mark.parametrize("text", ["", "abc", "5Q", "-5", "inf", "nan", "1e999", "M", "5MM", "1.2.3", True])
def test_bad_quantities(text):
    with pytest.raises(UsageError):
        parse_quantity(text, "--max-flops")


@pytest.mark.parametrize(
    "text, shape, dtype",
    [
        ("1x3x224x224", (1, 3, 224, 224), torch.float32),
        ("1x128:int64", (1, 128), torch.int64),
        ("8", (8,), torch.float32),
        ("2X4:fp16", (2, 4), torch.float16),
        ("2,4:bf16", (2, 4), torch.bfloat16),
        ("2*4:bool", (2, 4), torch.bool),
        (" 4x16 : long ", (4, 16), torch.int64),
    ],
)
def test_specs(text, shape, dtype):
    assert parse_spec(text) == InputSpec(shape, dtype)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty"),
        ("4x", "(empty)"),
        ("x4", "(empty)"),
        ("4xa", "'a'"),
        ("4x2.5", "'2.5'"),
        ("0x16", "must be >= 1"),
        ("-1x16", "must be >= 1"),
        ("4x16:", "nothing after"),
        ("4x16:float8", "unknown dtype 'float8'"),
        ("4x16:int64:x", "unknown dtype"),
    ],
)
def test_bad_specs(text, fragment):
    with pytest.raises(UsageError) as info:
        parse_spec(text)
    assert fragment in str(info.value)


def test_spec_round_trips_as_text():
    for text in ("1x3x224x224", "1x128:int64", "2x4:bfloat16"):
        assert str(parse_spec(text)) == text


def test_kwarg_and_config():
    assert parse_kwarg("attention_mask=1x8:int64") == ("attention_mask", InputSpec((1, 8), torch.int64))
    for bad in ("mask", "=1x8", "3d=1x8", "a b=1x8"):
        with pytest.raises(UsageError):
            parse_kwarg(bad)
    assert parse_config_value("n_layer=2") == ("n_layer", 2)
    assert parse_config_value("dropout=0.1") == ("dropout", 0.1)
    assert parse_config_value("tie=false") == ("tie", False)
    assert parse_config_value("act=gelu_new") == ("act", "gelu_new")
    assert parse_config_value("name='7'") == ("name", "7")
    assert parse_config_value("x=none") == ("x", None)
    with pytest.raises(UsageError):
        parse_config_value("no_equals")


def test_token_ids_stay_within_the_smallest_embedding():
    model = nn.Sequential(nn.Embedding(1000, 4), nn.Embedding(7, 4))
    assert token_range(model) == 7
    assert token_range(nn.Linear(2, 2)) is None
    ids = make_tensor(InputSpec((4, 500), torch.int64), high=token_range(model), generator=torch.Generator().manual_seed(0))
    assert ids.dtype == torch.int64
    assert int(ids.min()) >= 0 and int(ids.max()) < 7
    for table in model:
        table(ids)  # every id is valid for both tables


def test_make_tensor_kinds():
    gen = torch.Generator().manual_seed(0)
    assert make_tensor(InputSpec((2, 3)), generator=gen).dtype == torch.float32
    assert make_tensor(InputSpec((2, 3), torch.float16), generator=gen).dtype == torch.float16
    assert make_tensor(InputSpec((2, 3), torch.bool), generator=gen).dtype == torch.bool
    assert bool(make_tensor(InputSpec((2, 3), torch.int64), ones=True).eq(1).all())
    small = make_tensor(InputSpec((100,), torch.int8), high=10_000, generator=gen)
    assert int(small.max()) <= 127
    meta = make_tensor(InputSpec((2, 3)), device="meta")
    assert meta.device.type == "meta" and meta.shape == (2, 3)
    a = make_tensor(InputSpec((5,)), generator=torch.Generator().manual_seed(3))
    b = make_tensor(InputSpec((5,)), generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
