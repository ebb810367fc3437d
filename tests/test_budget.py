"""Budgets: merging, pass/fail at the boundary, and the [tool.flopcount] table."""

from __future__ import annotations

import pytest

from flopcount.budget.check import Budget, budget_from_mapping, check_budget, load_budget_file
from flopcount.errors import UsageError


def test_flags_win_over_the_file():
    file_budget = Budget(max_params=10, max_flops=100)
    flags = Budget(max_flops=50, max_macs=20)
    merged = file_budget.merged(flags)
    assert merged == Budget(max_params=10, max_flops=50, max_macs=20)
    assert merged.limits() == {"params": 10, "flops": 50, "macs": 20}
    assert not Budget()
    assert Budget(max_latency_s=0.003).needs_latency


def test_equal_passes_and_above_fails():
    report = check_budget(Budget(max_params=100, max_flops=1000), params=100, flops=1001)
    assert [(line.name, line.passed) for line in report.lines] == [("params", True), ("flops", False)]
    assert not report.passed
    assert [line.name for line in report.exceeded] == ["flops"]
    assert report.to_dict()["exceeded"] == ["flops"]
    table = report.table()
    assert "PASS" in table and "FAIL" in table


def test_size_is_megabytes_of_ten_to_the_six_bytes():
    report = check_budget(Budget(max_size_mb=2), size_bytes=2_000_001)
    (line,) = report.lines
    assert line.actual == pytest.approx(2.000001)
    assert not line.passed
    assert check_budget(Budget(max_size_mb=2), size_bytes=2_000_000).passed


def test_only_set_limits_are_checked_and_missing_actuals_are_errors():
    assert check_budget(Budget(max_macs=5), macs=5, flops=10**12).lines[0].name == "macs"
    with pytest.raises(UsageError):
        check_budget(Budget(max_latency_s=0.005), params=1)


def test_csv_has_raw_numbers():
    text = check_budget(Budget(max_flops=5_000_000_000), flops=4_000_000_000).to_csv()
    assert text.splitlines() == [
        "budget,limit,actual,unit,status",
        "flops,5000000000,4000000000,FLOPs,PASS",
        "overall,,,,PASS",
    ]


def test_mapping_accepts_dashes_underscores_and_suffixes():
    budget = budget_from_mapping({"max-params": "25M", "max_flops": 5e9, "max-size-mb": 100, "max-latency-s": "0.0025"}, "x")
    assert budget == Budget(max_params=25_000_000, max_flops=5_000_000_000, max_size_mb=100, max_latency_s=0.0025)


@pytest.mark.parametrize(
    "body, fragment",
    [
        ('[tool.flopcount]\nmax-parms = "1K"\n', "unknown key 'max-parms'"),
        ('[tool.flopcount]\nmax-params = "lots"\n', "max-params"),
        ("[tool.flopcount]\nmax-params = [1]\n", "max-params must be a number"),
        ("[tool.flopcount]\nmax-params = true\n", "max-params must be a number"),
        ("[tool.flopcount]\nmax-flops = -3\n", "max-flops"),
        ("[tool.flopcount\nmax-params = 1\n", "not valid TOML"),
        ("[tool]\nflopcount = 3\n", "must be a table"),
    ],
)
def test_malformed_files_name_the_file_and_key(tmp_path, body, fragment):
    path = tmp_path / "pyproject.toml"
    path.write_text(body)
    with pytest.raises(UsageError) as info:
        load_budget_file(path)
    assert fragment in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file_or_table(tmp_path):
    assert not load_budget_file(tmp_path / "pyproject.toml")
    with pytest.raises(UsageError):
        load_budget_file(tmp_path / "pyproject.toml", required=True)
    other = tmp_path / "other.toml"
    other.write_text('[project]\nname = "x"\n')
    assert not load_budget_file(other)
    ok = tmp_path / "ok.toml"
    ok.write_text('[tool.flopcount]\nmax-macs = "3G"\n')
    assert load_budget_file(ok) == Budget(max_macs=3_000_000_000)


# --------------------------------------------------------------------------- issue #9, finding 2


@pytest.mark.parametrize(
    "lower_bound, allow, flops, expected",
    [
        # a count that can only be short: over the limit is certain, under it is undecided
        (True, False, 1001, "FAIL"),
        (True, False, 999, "INCOMPLETE"),
        (True, True, 999, "PASS"),
        # a count a placeholder may have pushed either way decides nothing
        (False, False, 1001, "INCOMPLETE"),
        (False, False, 999, "INCOMPLETE"),
        (False, True, 1001, "FAIL"),
        (False, True, 999, "PASS"),
    ],
)
def test_an_incomplete_count_never_passes(lower_bound, allow, flops, expected):
    report = check_budget(
        Budget(max_flops=1000, max_params=10), flops=flops, params=10,
        incomplete_reasons=["x ran 1x without a handler"], lower_bound=lower_bound, allow_incomplete=allow,
    )
    assert report.status == expected
    assert report.passed is (expected == "PASS")
    assert report.to_dict()["status"] == expected and report.to_dict()["complete"] is False
    assert report.verdict().startswith(expected)
    assert report.to_csv().splitlines()[-1] == f"overall,,,,{expected}"
    params_line = next(line for line in report.lines if line.name == "params")
    assert params_line.status == "PASS" and params_line.bound == "exact"  # params never depend on the count


def test_a_certain_fail_wins_over_incomplete():
    report = check_budget(Budget(max_params=10, max_flops=1000), params=11, flops=5, incomplete_reasons=["gap"])
    assert report.status == "FAIL"
    assert [line.status for line in report.lines] == ["FAIL", "INCOMPLETE"]


def test_check_result_reads_the_completeness_of_a_real_count():
    import torch
    from torch import nn

    from flopcount import count_flops
    from flopcount.budget.check import check_result

    if not hasattr(torch.ops.flopcount_budget_test, "mystery"):
        torch.library.define("flopcount_budget_test::mystery", "(Tensor x) -> Tensor")
        torch.library.impl("flopcount_budget_test::mystery", "CompositeExplicitAutograd")(lambda x: x * 2)
        torch.library.register_fake("flopcount_budget_test::mystery")(lambda x: torch.empty_like(x))

    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 5)

        def forward(self, x):
            return torch.ops.flopcount_budget_test.mystery(self.fc(x))

    for tracer in ("jit", "dispatch", "auto"):
        result = count_flops(Custom(), torch.randn(3, 2, 6), tracer=tracer)
        assert result.macs == 3 * 2 * 6 * 5 and not result.complete
        report = check_result(result, Budget(max_macs=10**6))
        assert report.status == "INCOMPLETE" and report.lines[0].bound == "lower"
        assert report.incomplete_reasons == result.incomplete_reasons()
        assert check_result(result, Budget(max_macs=10**6), allow_incomplete=True).status == "PASS"
        assert check_result(result, Budget(max_macs=3 * 2 * 6 * 5 - 1)).status == "FAIL"
    # complete counts are unaffected
    full = count_flops(nn.Linear(6, 5), torch.randn(3, 6))
    assert check_result(full, Budget(max_macs=90)).status == "PASS"


def test_invalid_utf8_names_the_file(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_bytes(b"[tool.flopcount]\nmax-params = 1 # \xff\n")
    with pytest.raises(UsageError, match="UTF-8") as info:
        load_budget_file(path)
    assert str(path) in str(info.value)


def test_a_memory_verdict_rests_on_the_memory_estimate_alone():
    # issue #20.4: the count's reasons (here an op without a handler) do not qualify budgets that
    # do not come from the count: no "(on an incomplete count)" after a memory or params verdict
    report = check_budget(
        Budget(max_memory=2_000, max_params=10), memory_bytes=1_500, params=10, incomplete_reasons=["x ran 1x"]
    )
    assert report.verdict() == "PASS: all 2 budget(s) met"
    assert report.complete and report.to_dict()["incomplete_reasons"] == []
    with_flops = check_budget(Budget(max_memory=2_000, max_flops=100), memory_bytes=1_500, flops=5,
                              incomplete_reasons=["x ran 1x"], allow_incomplete=True)
    assert with_flops.verdict() == "PASS: all 2 budget(s) met (on an incomplete count, allowed)"
