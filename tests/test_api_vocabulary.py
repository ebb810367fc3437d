"""One vocabulary in the API (issue #27 item 6): ``on=`` / ``--on`` names the modeled
hardware everywhere (``device=`` is where the model runs), unique class names, typed
diagnostics on every reading. The 0.2 names keep working for one release with a
DeprecationWarning (a warning line on stderr in the CLI).

Oracles: datasheet figures (T4: 8.1 TFLOP/s float32; A100 SXM: 312 TFLOP/s bfloat16 dense;
H100 SXM: 67 TFLOP/s float32 dense), FLOPs of a Linear by hand, a fake clock, and the
invariants that tie the records to the texts the 0.2 API already gave."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pkgutil
import textwrap
import warnings
from typing import Any, Dict, Set

import pytest
import torch
from conftest import FakeClock
from conftest import run_cli as cli
from torch import nn

import flopcount
from flopcount import Diagnostic, count_flops
from flopcount.core.deprecation import REMOVED_IN
from flopcount.errors import UsageError

# Linear(256 -> 512) on a 32 x 256 batch: 2 * 32 * 256 * 512 FLOPs; its working set
# (624,640 bytes) fits the T4's 4 MB L2, whose bandwidth is not published, so the bound is
# the FLOPs at the T4's float32 peak (as in tests/cli/test_profile_cli.py).
T4_LINEAR_S = 2 * 32 * 256 * 512 / 8.1e12


def _linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(256, 512).eval()


class _Bessel(nn.Module):
    """A Linear, then an op without a handler (``aten::special_bessel_j0``) once per call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.bessel_j0(self.fc(x))


# --------------------------------------------------------------------------- on= (the modeled hardware)


def test_predict_on_names_the_modeled_part_and_device_is_its_deprecated_name() -> None:
    x = torch.randn(32, 256)
    new = flopcount.predict(_linear(), x, on="t4")
    assert new.latency_s == pytest.approx(T4_LINEAR_S)
    with pytest.warns(DeprecationWarning, match=r"predict\(device=\.\.\.\).*on=") as caught:
        old = flopcount.predict(_linear(), x, device="t4")
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert old.latency_s == pytest.approx(T4_LINEAR_S) and old.roofs.device == new.roofs.device == "T4"
    with pytest.raises(UsageError, match="on="):
        flopcount.predict(_linear(), x, on="t4", device="t4")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the new name never warns
        flopcount.predict(_linear(), x, on="t4")


def _tiny() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))


def _summed(out: torch.Tensor) -> torch.Tensor:
    return out.sum()


def test_plan_on_names_the_modeled_gpu_and_device_is_its_deprecated_name() -> None:
    x = torch.randn(8, 64)
    new = flopcount.plan(_tiny, (x,), on="a100", optimizer="sgd", loss_fn=_summed)
    # two Linear(64 -> 64) forwards on 8 rows, by hand; the ReLU and the loss's sum over the
    # 8 x 64 outputs add one FLOP per element each
    assert new.flops["forward"] == 2 * (2 * 8 * 64 * 64) + 8 * 64 + 8 * 64
    with pytest.warns(DeprecationWarning, match=r"plan\(device=\.\.\.\).*on=") as caught:
        old = flopcount.plan(_tiny, (x,), device="a100", optimizer="sgd", loss_fn=_summed)
    assert caught[0].filename == __file__
    assert new.on == old.on == "A100 80GB SXM"
    with pytest.warns(DeprecationWarning, match=r"PlanResult\.device.*PlanResult\.on"):
        assert new.device == "A100 80GB SXM"  # 0.2's name of the field
    assert new.step_time is not None and old.step_time == new.step_time
    # 0.2's device=None meant "no step times"; it still does
    with pytest.warns(DeprecationWarning):
        none = flopcount.plan(_tiny, (x,), device=None, optimizer="sgd")
    assert none.step_time is None and flopcount.plan(_tiny, (x,), on=None, optimizer="sgd").step_time is None
    with pytest.raises(UsageError, match="on="):
        flopcount.plan(_tiny, (x,), on="a100", device="h100")


def _old_and_new(reading: str, old: str, on: Any) -> Any:
    """``reading`` called with the modeled part given as ``old=`` (0.2's name), and as ``on=``
    unless ``on`` is None (plan takes on=None as "no step times": not given here)."""
    x = torch.randn(8, 64)
    given = {old: "a100"} if on is None else {old: "a100", "on": on}
    if reading == "plan":
        return flopcount.plan(_tiny, (x,), optimizer="sgd", **given)
    if reading == "predict":
        return flopcount.predict(_tiny(), x, **given)
    clock = FakeClock()
    return flopcount.benchmark(_Ticking(clock), torch.zeros(2, 4), warmup=0, iters=3, flops=3.12e9, timer=clock, **given)


@pytest.mark.parametrize("reading, old", [("plan", "device"), ("predict", "device"), ("benchmark", "gpu_name")])
def test_each_reading_handles_the_old_name_of_on_in_the_same_words(reading: str, old: str) -> None:
    """One rule (core.deprecation.modeled_part) for plan, predict and benchmark: the 0.2 name
    warns with the same sentence at the caller's line, and both names given are refused with the
    same sentence (plan used to say "the modeled GPU" where the others say "the modeled hardware")."""
    warned = (rf"^{reading}\({old}=\.\.\.\) is deprecated and will be removed in flopcount 0\.4; "
              rf"use {reading}\(on=\.\.\.\): device= means where the model runs$")
    with pytest.warns(DeprecationWarning, match=warned) as caught:
        _old_and_new(reading, old, None)
    assert [w.filename for w in caught if w.category is DeprecationWarning][:1] == [__file__]
    with pytest.raises(UsageError) as refused:
        _old_and_new(reading, old, "t4")  # not plan's default part: plan takes on="h100" as on= not given
    assert str(refused.value) == f"{reading}: give the modeled hardware once, as on= ({old}= is its deprecated 0.2 name)"


class _Ticking(nn.Module):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.now += 1_000_000  # 1 ms per call
        return self.lin(x)


def test_benchmark_on_names_the_peak_part_and_gpu_name_is_its_deprecated_name() -> None:
    clock = FakeClock()
    model = _Ticking(clock)
    # A100 SXM dense bfloat16: 312 TFLOP/s (datasheet); 3.12e9 FLOPs in 1 ms = 3.12e12 FLOP/s
    new = flopcount.benchmark(model, torch.zeros(2, 4), warmup=0, iters=3, flops=3.12e9, on="a100", dtype=torch.bfloat16, timer=clock)
    assert new.peak_flops == pytest.approx(312e12) and new.mfu == pytest.approx(3.12e12 / 312e12)
    with pytest.warns(DeprecationWarning, match=r"benchmark\(gpu_name=\.\.\.\).*on="):
        old = flopcount.benchmark(model, torch.zeros(2, 4), warmup=0, iters=3, flops=3.12e9, gpu_name="a100",
                                  dtype=torch.bfloat16, timer=clock)
    assert old.peak_flops == new.peak_flops and old.mfu == pytest.approx(new.mfu)


def test_the_callbacks_peak_part_is_on() -> None:
    from flopcount.bench.peak import mfu_part
    from flopcount.integrations._rates import resolve_peak

    cpu = torch.device("cpu")
    # H100 SXM dense: 67 TFLOP/s float32 (torch's default: fp32 matmuls not in TF32), 989.5 bfloat16
    assert resolve_peak(cpu, torch.float32, None, on="h100") == (pytest.approx(67e12), "")
    assert resolve_peak(cpu, torch.bfloat16, None, on="h100") == (pytest.approx(989.5e12), "")
    with pytest.raises(UsageError, match="abacus"):  # the part is checked once, when the callback is made
        mfu_part("FlopcountCallback", "abacus", None)
    with pytest.raises(UsageError, match="once"):
        mfu_part("FlopcountCallback", "h100", 1e12)
    peak, note = resolve_peak(cpu, torch.float32, None)  # without on=: none on CPU, as before
    assert peak is None and "no MFU on CPU" in note


def test_step_timer_takes_on_as_the_callbacks_do() -> None:
    # the plain-loop timer took only peak_flops=: the callbacks' and benchmark's on= was missing
    clock = FakeClock()
    timer = flopcount.StepTimer(clock=clock, on="h100")  # no model: the part's float32 dense peak, 67 TFLOP/s
    assert timer.peak_flops == pytest.approx(67e12)
    timer.set_step_cost(67_000_000_000_000)  # 67 TFLOP in a step of 2 s: half the peak
    timer.start()
    clock.now += 2_000_000_000
    timer.step(num_samples=1)
    assert timer.summary().mfu.avg == pytest.approx(0.5)
    bf16 = nn.Linear(8, 8).to(torch.bfloat16)  # a model's dtype picks the column: 989.5 TFLOP/s bfloat16
    with_model = flopcount.StepTimer(on="h100", model=bf16, example_batch=torch.zeros(2, 8, dtype=torch.bfloat16))
    assert with_model.peak_flops == pytest.approx(989.5e12)
    with pytest.raises(UsageError, match="abacus"):
        flopcount.StepTimer(on="abacus")
    with pytest.raises(UsageError, match="once"):
        flopcount.StepTimer(on="h100", peak_flops=1e12)


def test_lightning_monitor_takes_on() -> None:
    pytest.importorskip("lightning")
    from flopcount.integrations.lightning import FlopcountMonitor

    assert FlopcountMonitor(on="h100").on == "h100"
    with pytest.raises(UsageError, match="abacus"):
        FlopcountMonitor(on="abacus")
    with pytest.raises(UsageError, match="once"):
        FlopcountMonitor(peak_flops=1e12, on="h100")


def test_lightning_monitor_on_sets_the_mfu_peak_in_a_real_fit() -> None:
    L = pytest.importorskip("lightning")
    import logging

    import torch.nn.functional as F
    from lightning.pytorch.loggers import Logger

    from flopcount.integrations.lightning import FlopcountMonitor

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 4)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Capture(Logger):
        name, version = "capture", 0

        def __init__(self) -> None:
            super().__init__()
            self.rows: list = []

        def log_metrics(self, metrics: Any, step: Any = None) -> None:
            self.rows.append(dict(metrics))

        def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
            pass

    logging.getLogger("lightning").setLevel(logging.ERROR)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8, 8), torch.randint(0, 4, (8,)))
    logger = Capture()
    trainer = L.Trainer(max_steps=2, logger=logger, callbacks=[FlopcountMonitor(on="h100")], log_every_n_steps=1,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        accelerator="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's own notes (few workers, ...)
        trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
    rows = [row for row in logger.rows if "flopcount/hfu" in row]
    # the H100 SXM's dense float32 peak (67 TFLOP/s, datasheet) is the denominator, on a CPU run
    assert rows and all(row["flopcount/hfu"] == pytest.approx(row["flopcount/tflops_per_s"] * 1e12 / 67e12) for row in rows)


def test_hf_callback_takes_on() -> None:
    pytest.importorskip("transformers")
    from flopcount.integrations.hf import FlopcountCallback

    assert FlopcountCallback(on="h100").on == "H100 SXM"
    with pytest.raises(UsageError, match="abacus"):
        FlopcountCallback(on="abacus")
    with pytest.raises(UsageError, match="once"):
        FlopcountCallback(peak_flops=1e12, on="h100")


MODELS = textwrap.dedent(
    """
    from torch import nn

    def mlp():
        return nn.Linear(256, 512)

    def tiny():
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    """
)


@pytest.fixture
def workdir(tmp_path: Any, monkeypatch: Any) -> Any:
    (tmp_path / "vocab_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cli_count_on_and_the_deprecated_predict_flag(workdir: Any, capsys: Any) -> None:
    code, out, err = cli(capsys, "count", "vocab_models.py:mlp", "-i", "32x256", "--on", "t4", "-f", "json", "-q")
    assert code == 0 and "deprecated" not in err
    assert json.loads(out)["predict"]["latency_s"] == pytest.approx(T4_LINEAR_S)
    code, old, err = cli(capsys, "count", "vocab_models.py:mlp", "-i", "32x256", "--predict", "t4", "-f", "json", "-q")
    assert code == 0 and json.loads(old)["predict"] == json.loads(out)["predict"]
    assert f"flopcount: warning: --predict is deprecated and will be removed in flopcount {REMOVED_IN}; use --on\n" in err
    assert "--predict" not in cli(capsys, "count", "--help")[1]  # hidden from --help
    code, _, err = cli(capsys, "count", "vocab_models.py:mlp", "-i", "32x256", "--on", "abacus", "-q")
    assert code == 2 and "abacus" in err


def test_cli_plan_on_and_the_deprecated_device_flag(workdir: Any, capsys: Any) -> None:
    args = ("plan", "vocab_models.py:tiny", "--input", "8x64", "--optimizer", "sgd", "-f", "json", "-q")
    code, out, err = cli(capsys, *args, "--on", "a100")
    assert code == 0 and "deprecated" not in err
    new = json.loads(out)
    assert new["on"] == new["device"] == "A100 80GB SXM" and new["step_time"] is not None  # 0.2's key kept
    code, out, err = cli(capsys, *args, "--device", "a100")
    assert code == 0 and json.loads(out) == new
    assert f"flopcount: warning: --device is deprecated and will be removed in flopcount {REMOVED_IN}; use --on\n" in err
    assert "--device" not in cli(capsys, "plan", "--help")[1]


# --------------------------------------------------------------------------- unique names


def test_bench_step_record_is_step_timing_and_the_old_name_warns() -> None:
    from flopcount.bench import StepTimer, StepTiming

    clock = FakeClock()
    timer = StepTimer(clock=clock)
    timer.start()
    clock.now += 2_000_000_000
    record = timer.step(num_samples=4)
    assert record == StepTiming(reader_cost=0.0, batch_cost=2.0, num_samples=4)  # 2 s of the fake clock
    for where in ("flopcount", "flopcount.bench", "flopcount.bench.steps"):
        module = importlib.import_module(where)
        for _ in range(2):  # every use warns (never cached)
            with pytest.warns(DeprecationWarning, match="StepTiming"):
                assert module.StepRecord is StepTiming
    assert "StepRecord" not in flopcount.__all__ and "StepTiming" in flopcount.__all__


def test_each_0_2_name_warns_at_the_callers_line() -> None:
    # Python shows a DeprecationWarning by default only where __main__ triggers it, and
    # ``-W error::DeprecationWarning:mymodule`` matches the module the warning points at: a
    # warning pointing into flopcount is hidden from a script and missed by that filter.
    # flopcount.StepRecord pointed at flopcount/__init__.py (its __getattr__ calls the one
    # that warns), so ``python script.py`` using it printed nothing.
    from flopcount.bench import StepTiming

    clock = FakeClock()
    uses = {
        "flopcount.StepRecord": lambda: flopcount.StepRecord,
        "flopcount.bench.StepRecord": lambda: importlib.import_module("flopcount.bench").StepRecord,
        "flopcount.bench.steps.StepRecord": lambda: importlib.import_module("flopcount.bench.steps").StepRecord,
        "predict(device=...)": lambda: flopcount.predict(_linear(), torch.zeros(2, 256), device="t4"),
        "benchmark(gpu_name=...)": lambda: flopcount.benchmark(
            _Ticking(clock), torch.zeros(2, 4), warmup=0, iters=1, timer=clock, gpu_name="t4"
        ),
    }
    for old, use in uses.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            use()
        deprecated = [w for w in caught if issubclass(w.category, DeprecationWarning)]
        assert [w.filename for w in deprecated] == [__file__], old
        assert str(deprecated[0].message).startswith(old), old
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from flopcount import StepRecord  # the import looks the name up twice (hasattr, then getattr)
    assert StepRecord is StepTiming
    assert {w.filename for w in caught} == {__file__}


def _public_classes() -> Dict[str, Set[str]]:
    """``{class name: modules defining a class of that name}`` over every module of flopcount
    (private modules included: a name is read in tracebacks and docs wherever it lives)."""
    found: Dict[str, Set[str]] = {}
    for info in pkgutil.walk_packages(flopcount.__path__, "flopcount."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (lightning, transformers, matplotlib) missing
            continue
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__ and not name.startswith("_"):
                found.setdefault(name, set()).add(module.__name__)
    return found


def test_no_two_classes_share_a_name() -> None:
    shared = {name: sorted(modules) for name, modules in _public_classes().items() if len(modules) > 1}
    assert shared == {}


# --------------------------------------------------------------------------- diagnostics on every reading

#: every public reading's result class; a new one is added here (the test below finds it)
READINGS = ("FlopResult", "GenerationResult", "MemoryEstimate", "PlanResult", "PredictResult", "ProfileResult",
            "BenchmarkResult", "DiffResult", "ModuleLatencyResult", "ServeResult")


def test_every_public_result_class_has_diagnostics() -> None:
    public = {name for name in flopcount.__all__ if name.endswith(("Result", "Estimate"))}
    assert public <= set(READINGS), f"add {sorted(public - set(READINGS))} to READINGS and give it diagnostics()"
    for name in READINGS:
        cls = getattr(flopcount, name)
        assert callable(getattr(cls, "diagnostics", None)), name
        assert "Diagnostic" in str(inspect.signature(cls.diagnostics).return_annotation), name


def test_predict_diagnostics_name_the_op_left_out() -> None:
    result = flopcount.predict(_Bessel(), torch.randn(3, 6), on="t4")
    unsupported = [d for d in result.diagnostics() if d.kind == "unsupported"]
    assert [d.op for d in unsupported] == ["aten::special_bessel_j0"] and all(d.makes_incomplete for d in unsupported)
    assert {d.text for d in result.diagnostics() if d.kind == "warning"} == set(result.warnings)
    assert not result.complete


def test_plan_diagnostics_carry_each_op_and_its_calls() -> None:
    from flopcount.core.registry import HandlerRegistry

    # an empty registry: every op is without a handler; one forward of two Linears is two
    # aten::linear calls (the composite, booked as count_flops books it: issue #27 item 1)
    result = flopcount.plan(_tiny, (torch.randn(8, 64),), on="a100", optimizer="sgd", registry=HandlerRegistry())
    unsupported = {d.op: d.count for d in result.diagnostics() if d.kind == "unsupported"}
    assert unsupported == dict(result.unsupported) and unsupported["aten::linear"] == 2
    assert [d.text for d in result.diagnostics() if d.kind == "warning"] == list(result.notes)


def test_generation_diagnostics_match_its_incomplete_reasons() -> None:
    from flopcount import GenerationResult

    prefill = count_flops(_Bessel(), torch.randn(2, 5, 6))
    step = count_flops(_Bessel(), torch.randn(2, 1, 6))
    result = GenerationResult(prefill=prefill, steps=(step, step), batch=2, prompt_tokens=5, new_tokens=3,
                              kv_cache_bytes=0, warnings=("a note of generation's own",))
    records = result.diagnostics()
    assert tuple(d.text for d in records if d.makes_incomplete) == result.incomplete_reasons()
    assert [(d.op, d.count) for d in records if d.kind == "unsupported"] == [("aten::special_bessel_j0", 1)] * 2
    assert Diagnostic("warning", "a note of generation's own") in records


def test_diff_diagnostics_say_which_side_is_short() -> None:
    a = count_flops(nn.Linear(6, 4), torch.randn(3, 6))
    b = count_flops(_Bessel(), torch.randn(3, 6))
    result = flopcount.diff(a, b, a_label="before", b_label="after")
    assert result.diagnostics() == tuple(Diagnostic("gap", f"after: {r}") for r in b.incomplete_reasons())
    assert all(d.makes_incomplete for d in result.diagnostics()) and not result.complete


def test_warnings_of_the_timed_readings_are_records() -> None:
    clock = FakeClock()
    timed = flopcount.benchmark(_Ticking(clock), torch.zeros(2, 4), warmup=0, iters=3, timer=clock)
    noted = dataclasses.replace(timed, warnings=("x", "y", "x"))
    assert noted.diagnostics() == (Diagnostic("warning", "x"), Diagnostic("warning", "y"))
    modules = flopcount.module_latency(nn.Sequential(nn.Linear(4, 4)), torch.zeros(2, 4), warmup=0, iters=2)
    assert [d.text for d in modules.diagnostics()] == list(dict.fromkeys(modules.warnings)) and modules.warnings
    estimate = flopcount.estimate_memory(nn.Linear(4, 4), torch.zeros(2, 4))
    noted_estimate = dataclasses.replace(estimate, warnings=("z",))
    assert noted_estimate.diagnostics() == (Diagnostic("warning", "z"),)


# --------------------------------------------------------------------------- seconds in the data


def test_benchmark_data_is_in_seconds_and_the_ms_names_warn() -> None:
    clock = FakeClock()
    model = _Ticking(clock)  # 1 ms per call on the fake clock
    r = flopcount.benchmark(model, torch.zeros(2, 4), warmup=0, iters=3, timer=clock)
    assert r.median_s == pytest.approx(1e-3) and r.stats.samples_s == pytest.approx((1e-3,) * 3)
    assert r.iters_per_s == pytest.approx(1e3) and r.throughput == pytest.approx(2e3)  # batch 2 / 1 ms
    for old, new in (("median_ms", "median_s"), ("mean_ms", "mean_s"), ("p90_ms", "p90_s"), ("p99_ms", "p99_s"),
                     ("min_ms", "min_s"), ("max_ms", "max_s"), ("std_ms", "std_s")):
        with pytest.warns(DeprecationWarning, match=f"BenchmarkResult.{old}.*{new}"):
            assert getattr(r, old) == pytest.approx(getattr(r, new) * 1e3)
        with pytest.warns(DeprecationWarning, match=f"LatencyStats.{old}"):
            assert getattr(r.stats, old) == pytest.approx(getattr(r.stats, new) * 1e3)
    with pytest.warns(DeprecationWarning, match="samples_ms") as caught:
        assert r.stats.samples_ms == pytest.approx((1.0,) * 3)
    assert caught[0].filename == __file__
    with pytest.warns(DeprecationWarning, match="compile_ms"):
        assert r.compile_ms is None  # not compiled
    data = r.to_dict(samples=True)
    assert data["median_s"] == pytest.approx(1e-3) and data["median_ms"] == pytest.approx(1.0)  # both, one release
    assert data["samples_s"] == pytest.approx([1e-3] * 3) and data["samples_ms"] == pytest.approx([1.0] * 3)
    assert "1 ms" in str(r) or "median 1 ms" in str(r)  # milliseconds when rendered


def test_compute_stats_takes_seconds_and_its_ms_form_warns() -> None:
    new = flopcount.compute_stats(samples_s=[0.001, 0.002, 0.004])
    assert new.median_s == pytest.approx(0.002) and new.mean_s == pytest.approx(0.007 / 3)
    with pytest.warns(DeprecationWarning, match=r"compute_stats\(samples_ms\)"):
        old = flopcount.compute_stats([1.0, 2.0, 4.0])  # 0.2: milliseconds, positional
    assert old.median_s == pytest.approx(new.median_s) and old.std_s == pytest.approx(new.std_s)


def test_module_latency_data_is_in_seconds_and_the_ms_names_warn() -> None:
    clock = FakeClock()
    r = flopcount.module_latency(nn.Sequential(_Ticking(clock)), torch.zeros(2, 4), warmup=0, iters=2, timer=clock)
    assert r.root.median_s == pytest.approx(1e-3) and r["0"].median_s == pytest.approx(1e-3)
    assert r.unhooked_median_s == pytest.approx(1e-3)
    with pytest.warns(DeprecationWarning, match="ModuleLatency.median_ms"):
        assert r.root.median_ms == pytest.approx(1.0)
    with pytest.warns(DeprecationWarning, match="unhooked_median_ms"):
        assert r.unhooked_median_ms == pytest.approx(1.0)
    with pytest.warns(DeprecationWarning, match="seconds=True"):
        old = r.by_module()  # 0.2: milliseconds
    new = r.by_module(seconds=True)
    assert (old[""], old["0"], old["0.lin"]) == (pytest.approx(1.0), pytest.approx(1.0), 0.0)  # the clock moves outside lin
    assert (new[""], new["0"], new["0.lin"]) == (pytest.approx(1e-3), pytest.approx(1e-3), 0.0)
    data = r.to_dict()
    assert data["unhooked_median_s"] == pytest.approx(1e-3) and data["unhooked_median_ms"] == pytest.approx(1.0)
    assert data["modules"][0]["median_s"] == pytest.approx(1e-3) and data["modules"][0]["median_ms"] == pytest.approx(1.0)


def test_profile_diagnostics_are_its_warnings() -> None:
    from flopcount.devices.roofline import Roofs

    roofs = Roofs({"float32": 1e12}, 1e11, "given", "given")
    result = flopcount.profile(nn.Linear(8, 8), torch.randn(4, 8), warmup=0, steps=1, roofs=roofs, keep_trace=False)
    noted = dataclasses.replace(result, warnings=("w", "w"))
    assert noted.diagnostics() == (Diagnostic("warning", "w"),)
    assert [d.text for d in result.diagnostics()] == list(dict.fromkeys(result.warnings))


def test_every_public_name_is_one_typed_re_export() -> None:
    """Issue #27: ``flopcount/__init__.py`` listed the public names three times (``_EXPORTS``, a
    literal ``__all__``, the typing imports). ``__all__`` is now ``_EXPORTS``'s names, and each
    name's typing import is the explicit re-export form (``from .m import X as X``), which mypy
    --strict and pyright read without a literal ``__all__``: the two lists must name the same set."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(flopcount.__file__)).read_text())
    typed = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), ast.dump(imp)
                for alias in imp.names:
                    assert alias.asname == alias.name, f"{alias.name} is not re-exported as itself"
                    typed[alias.name] = imp.module
    assert set(typed) == set(flopcount._EXPORTS) == set(flopcount.__all__)
    assert flopcount.__all__ == sorted(flopcount.__all__)
