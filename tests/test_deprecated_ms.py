"""The 0.2 millisecond names (issue #27 item 6) come from one mechanism, core.deprecation.ms_aliases:
every ``*_ms`` attribute of a result is one of its declared aliases, warns, and equals its ``_s``
field x 1000 (seconds -> milliseconds by hand, 1 s = 1000 ms); ``to_dict`` writes each alias's key
beside the seconds key."""

from __future__ import annotations

import warnings
from typing import Any, List, Tuple

import pytest

from flopcount.bench.modules import ModuleLatency, ModuleLatencyResult
from flopcount.bench.result import BenchmarkResult
from flopcount.bench.stats import compute_stats


def _results() -> List[Tuple[Any, Tuple[str, ...]]]:
    stats = compute_stats(samples_s=[1e-3, 2e-3, 4e-3])
    bench = BenchmarkResult(stats, device="cpu", timing="perf_counter", warmup=1, batch_size=2, compile_s=0.25)
    module = ModuleLatency("", "Linear", 0, 1, median_s=1e-3, mean_s=2e-3, min_s=5e-4)
    modules = ModuleLatencyResult((module,), iters=3, warmup=1, device="cpu", timing="perf_counter", unhooked_median_s=7e-4)
    # the names docs/migration.md lists for each class
    return [
        (stats, ("median", "mean", "p90", "p99", "min", "max", "std", "iqr", "samples")),
        (bench, ("median", "mean", "p90", "p99", "min", "max", "std", "compile")),
        (module, ("median", "mean", "min")),
        (modules, ("unhooked_median",)),
    ]


@pytest.mark.parametrize("index", range(4))
def test_every_ms_name_is_a_declared_alias_that_warns_and_scales(index: int) -> None:
    result, documented = _results()[index]
    cls = type(result)
    assert tuple(cls.MS_ALIASES) == documented
    ms_names = {name for name in dir(cls) if name.endswith("_ms")}
    assert ms_names == {f"{stem}_ms" for stem in documented}  # no alias written by hand beside the mechanism
    for stem in documented:
        seconds = getattr(result, f"{stem}_s")
        with pytest.warns(DeprecationWarning, match=rf"{cls.__name__}\.{stem}_ms .*{stem}_s"):
            old = getattr(result, f"{stem}_ms")
        if isinstance(seconds, tuple):
            assert old == pytest.approx(tuple(v * 1000 for v in seconds))
        else:
            assert old == pytest.approx(seconds * 1000)


@pytest.mark.parametrize("index", range(4))
def test_to_dict_writes_each_alias_key_beside_the_seconds_key(index: int) -> None:
    result, documented = _results()[index]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # writing the 0.2 keys is no deprecated use
        data = result.to_dict(samples=True) if "samples" in documented else result.to_dict()
    for stem in documented:
        seconds = data[f"{stem}_s"]
        if isinstance(seconds, list):
            assert data[f"{stem}_ms"] == pytest.approx([v * 1000 for v in seconds])
        else:
            assert data[f"{stem}_ms"] == pytest.approx(seconds * 1000)
