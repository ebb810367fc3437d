"""The memory budget: byte units, the pyproject key, and the check against an estimated peak."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount.budget.check import Budget, budget_from_mapping, check_budget, load_budget_file, parse_bytes
from flopcount.errors import UsageError
from flopcount.memory.estimate import estimate_memory


@pytest.mark.parametrize(
    "text, expected",
    [
        ("16GB", 16 * 10**9),
        ("16GiB", 16 * 2**30),
        ("16 gib", 16 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5TB", 1_500_000_000_000),
        ("64KiB", 65_536),
        ("100", 100),
        ("100B", 100),
        (2e9, 2_000_000_000),
        (4096, 4096),
    ],
)
def test_byte_units_decimal_and_binary(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["16 gigs", "GB", "-1GB", "nan", True, "16G"])
def test_bad_sizes_are_usage_errors(text: object) -> None:
    with pytest.raises(UsageError, match="max-memory"):
        parse_bytes(text, "max-memory")  # type: ignore[arg-type]


def test_pyproject_key_and_merge(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.flopcount]\nmax-memory = "16GiB"\nmax-params = "25M"\n')
    budget = load_budget_file(path)
    assert budget == Budget(max_params=25_000_000, max_memory=16 * 2**30)
    assert budget.needs_memory and not Budget(max_params=1).needs_memory
    assert budget.merged(Budget(max_memory=8 * 10**9)).max_memory == 8 * 10**9
    with pytest.deprecated_call(match=r"x: max_memory: a bare 1024 \(read as 1,024 bytes\) is deprecated"):
        assert budget_from_mapping({"max_memory": 1024}, "x") == Budget(max_memory=1024)  # bytes, until 0.4
    with pytest.raises(UsageError, match="max-memory"):
        budget_from_mapping({"max-memory": "lots"}, "x")


def test_memory_budget_gates_on_the_estimated_peak() -> None:
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))
    peak = estimate_memory(model, torch.randn(64, 1024), backward=True).peak_bytes
    # REFERENCES.md: this step peaks at 68,460,552 bytes in MemTracker
    assert check_budget(Budget(max_memory=68_460_552), memory_bytes=peak).passed
    report = check_budget(Budget(max_memory=parse_bytes("65MiB")), memory_bytes=peak)
    assert not report.passed and report.exceeded[0].name == "memory"
    # one size unit across reports: decimal MB (68,460,552 B; 65 MiB = 68,157,440 B)
    assert report.lines[0].describe() == "memory 68.46 MB > 68.16 MB"
    assert report.to_dict()["lines"][0]["unit"] == "bytes"
    with pytest.raises(UsageError, match="memory"):
        check_budget(Budget(max_memory=1), params=3)
