"""Shared test helpers: the repo root on sys.path (for examples/), and model-state snapshots."""

from __future__ import annotations

import gc
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

import pytest

# the shared replay checks assert in tests/_layer_stacks.py: pytest's messages show their operands
pytest.register_assert_rewrite("_layer_stacks")

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Python's cyclic garbage collector, run less often: its default (a young collection every 700
# net allocations) makes collections of a test process whose heap holds torch, transformers and
# their modules cost ~12 % of the suite's CPU; at 50,000 about 5 % (docs/performance.md, "The main
# suite's time"). A test that needs garbage gone calls gc.collect(); see also
# pytest_collection_finish, which moves what collection loaded out of every later collection.
gc.set_threshold(50_000, 20, 10)

# torch is imported here only where tests run: pytest-xdist's controller process, which only
# hands tests to its workers, loads this file too before it starts them, and importing torch
# there (~1.2 s of CPU) delayed every worker's start by as much (docs/performance.md, "The main
# suite, third pass"). Fn and cuda, which need torch, are made on first use (__getattr__ below).
#
# Under pytest-xdist (`make test`'s parallel part) each worker gets its share of the cores:
# torch's default of one intra-op thread per core in every worker oversubscribes them, and
# OpenMP's spinning threads then made 2 workers slower than 1 process (docs/internals.md).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    import torch

    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, _CORES // _WORKERS))


@pytest.fixture
def reuse_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Structural reuse keys every twin group (``FLOPCOUNT_REUSE=always``, the policy before branch
    resnet11): for tests of the reuse key on stacks of 2 or 3 small blocks, whose groups the default
    policy traces (keying them costs more than it saves: ``tracers._reuse._pays``)."""
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")


def _make_fn() -> Any:
    import torch

    class Fn(torch.nn.Module):
        """A module whose forward is a plain function (op-level cases run as a model)."""

        def __init__(self, fn: Any) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, *args: Any) -> Any:
            return self.fn(*args)

    Fn.__module__, Fn.__qualname__ = __name__, "Fn"
    return Fn


def _make_cuda() -> Any:
    import torch

    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


#: made on first use (``from conftest import Fn, cuda``), so that loading this file imports no torch:
#: ``Fn``, a module whose forward is a plain function (op-level cases run as a model); ``cuda``,
#: the mark of a test that needs a CUDA GPU (skipped where none is present)
_LAZY = {"Fn": _make_fn, "cuda": _make_cuda}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = globals()[name] = _LAZY[name]()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class FakeClock:
    """A clock (integer ns) that only moves when a test moves it."""

    def __init__(self) -> None:
        self.now = 0
        self.ticks = 0  # what a test model counts on it (its forwards: a timed run's twin shares the clock)

    def __call__(self) -> int:
        return self.now


def snapshot(model: torch.nn.Module) -> Dict[str, Any]:
    """Everything flopcount promises to leave untouched."""
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
        "keys": list(model.state_dict().keys()),
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "hooks": [
            (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks), len(getattr(m, "_backward_pre_hooks", {})))
            for m in model.modules()
        ],
        "buffers": [id(b) for b in model.buffers()],
        "global_hooks": _global_hooks(),
    }


def _global_hooks() -> tuple:
    from torch.nn.modules import module as mod

    return tuple(len(getattr(mod, name, {})) for name in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks"))


def assert_same_state(model: torch.nn.Module, before: Dict[str, Any]) -> None:
    import torch

    after = snapshot(model)
    assert after["keys"] == before["keys"], "state_dict keys changed"
    for key, value in before["state"].items():
        assert torch.equal(after["state"][key], value), f"{key} changed"
    for name in ("training", "requires_grad", "hooks", "buffers", "global_hooks"):
        assert after[name] == before[name], f"{name} changed"
    for g0, g1 in zip(before["grads"], after["grads"]):
        assert (g0 is None) == (g1 is None) and (g0 is None or torch.equal(g0, g1)), "a .grad changed"


@pytest.fixture(autouse=True)
def _quiet_flopcount_warnings():
    from flopcount import FlopcountWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlopcountWarning)
        yield


#: the depth from which the replay's exactness tests (6-8-layer stacks) were written to replay:
#: flopcount.step.replay.MIN_LAYERS before replaymin raised the default from the measurement
REPLAY_TESTS_MIN_LAYERS = 6


@pytest.fixture
def replay_from_six_layers(monkeypatch: Any) -> None:
    """flopcount.step.replay's threshold at :data:`REPLAY_TESTS_MIN_LAYERS`, so that the tests
    of the replay's exactness keep replaying their 6-8-layer stacks (the default replays only
    deeper ones, where it pays). Used per file, ``pytestmark = pytest.mark.usefixtures(...)``."""
    from flopcount.step import replay

    monkeypatch.setattr(replay, "MIN_LAYERS", REPLAY_TESTS_MIN_LAYERS)


def run_cli(capsys: Any, *args: str) -> Any:
    """Run the flopcount CLI in-process: (exit code, stdout, stderr)."""
    from flopcount.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def torch_contraction_flops(model: torch.nn.Module, inputs: Any) -> int:
    """The live peer for MACs: ``FlopCounterMode``'s total over one no-grad forward (it counts
    contractions only, 2 FLOPs per MAC), with SDPA on its math path and the MHA fast path off so
    that torch counts attention as the ``bmm`` it runs. Runs the model: pass a copy you may change."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
            model(*inputs)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return counter.get_total_flops()


@pytest.fixture(scope="session")
def fresh_python(tmp_path_factory: Any) -> Any:
    """Runs ``[sys.executable, "-c" or "-m", ...]`` as subprocess.run does, in a child forked from
    a server that has imported torch once (tests/_cli_server.py, PythonServer): for tests that need
    a process of their own but not torch's import again (~2.5 s of CPU each). Started on first use."""
    from _cli_server import PythonServer

    server = PythonServer(tmp_path_factory.mktemp("python-server"))
    yield server
    server.close()


#: what fresh_python_with_transformers's server imports: transformers' LLaMA modelling code, and with it
#: the model machinery every transformers model imports (modeling_utils: torch.distributed.tensor,
#: torch._dynamo, accelerate), ~2.5 s of CPU in a process that has torch
TRANSFORMERS_PRELOAD = ("torch", "transformers.models.llama.modeling_llama")


@pytest.fixture(scope="session")
def fresh_python_with_transformers(tmp_path_factory: Any) -> Any:
    """As :func:`fresh_python`, from a server that has imported TRANSFORMERS_PRELOAD too: for the
    tests whose child builds transformers models (the per-layer memory readings of
    tests/tracers/test_count_memory_depth.py and test_reuse_lazy_copy.py, test_dispatch.py's peak
    RSS, test_generation_fake_path.py's five families), each of which imported them again. A server
    of its own, so that fresh_python's children still start without transformers
    (tests/test_architecture.py's "no trainer framework"). Started on first use."""
    from _cli_server import PythonServer

    server = PythonServer(tmp_path_factory.mktemp("python-server-transformers"), preload=TRANSFORMERS_PRELOAD)
    yield server
    server.close()


@pytest.fixture(scope="session")
def llama7_one_rank_plan() -> Any:
    """``plan(tiny_llama7, (example_input("llama7"),), fsdp=1, on=None)`` (tests/plan/_plan_gloo.py's
    7-layer GQA LLaMA), made once per process: tests/plan/test_plan_vocabulary.py and
    tests/tracers/test_hf_tracing.py check the same plan against different oracles (count_flops;
    the real loop), ~1.2 s of CPU each time it is made. A frozen PlanResult: tests read it only."""
    plan_dir = str(ROOT / "tests" / "plan")
    if plan_dir not in sys.path:
        sys.path.insert(0, plan_dir)
    import _plan_gloo as gloo

    import flopcount

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopcount.plan(gloo.tiny_llama7, (gloo.example_input("llama7"),), fsdp=1, on=None)


@pytest.fixture(scope="session")
def _roofs_cache(tmp_path_factory: Any) -> Any:
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(autouse=True)
def _private_cache_dir(_roofs_cache: Any, monkeypatch: Any) -> None:
    """Roofs measured by a test (flopcount.profile without roofs=) are cached in a session
    folder, never in the user's ~/.cache; tests that need their own folder set it again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(_roofs_cache))


@pytest.fixture(scope="session")
def _roofs_of_this_machine() -> Any:
    """This machine's roofs, measured for real with a short budget, once per process: the
    default budget measures the same figures here in ~9 s instead of ~1 s."""
    from flopcount.devices.measured import measure_roofs

    return measure_roofs("cpu", budget_s=0.05)


@pytest.fixture
def stored_machine_roofs(_private_cache_dir: None, _roofs_of_this_machine: Any) -> Any:
    """This machine's roofs (measured once per process), stored in the session's roofs cache
    before a test whose ``on="this machine"`` (or ``flopcount.profile`` without ``roofs=``) reads
    them, where measuring them is not what the test checks; stored again for each test, as other
    tests may have stored other roofs there since."""
    from flopcount.devices.measured import remember_roofs

    # stored unchecked: under the other jobs' load the sanity checks would refuse to cache it
    return remember_roofs(_roofs_of_this_machine, "cpu")


#: the test files that take longest: seconds summed over their tests' phases (setup, call, teardown)
#: among the 400 longest in `pytest -n 2 --dist worksteal -m "not serial" --durations=400` (2026-11-28
#: 13:23-13:39 UTC, main f5679e3, load 0.5 -> 5.6; docs/performance.md, "Issue #27: the main suite's
#: forked children (branch suitefast4)"), the files of 6 s or more. Wall seconds of a loaded run, not
#: CPU: a test that waits for a forked child (conftest's fresh_python) holds its worker for the
#: child's time, and --durations books it there. What is left out (tests under ~0.8 s) needs no
#: place: work-stealing moves such tests one by one. The files whose children suitefast4 made
#: cheaper are booked at what their tests took after it, interleaved with before (0.48x
#: test_count_memory_depth.py, 0.37x test_reuse_lazy_copy.py, test_generation_fake_path.py's
#: subprocess test 57 -> 12 s). Under pytest-xdist each worker starts with its share, see _heavy_files_first
HEAVY_FILES = {
    "test_replay_heads.py": 153, "test_replay_periods.py": 123, "plan/test_plan_layers.py": 107,
    "test_memory_reuse.py": 75, "tracers/test_hf_tracing.py": 69, "test_memory_layers.py": 64,
    "test_generation_limits.py": 59, "test_generation_deferred_steps.py": 56, "test_doc_snippets.py": 46,
    "test_generation_options.py": 43, "tracers/test_count_memory_depth.py": 42, "cli/test_artifacts.py": 41,
    "test_install.py": 41, "test_memory_replay_module_peaks.py": 36, "serving/test_serve_derived.py": 28,
    "test_ci_recipes.py": 25, "plan/test_plan_analytic.py": 23, "test_generation_fake_path.py": 20,
    "serving/test_serve.py": 18, "plan/test_plan_skipped_modules.py": 16, "test_replay_partial_activations.py": 16,
    "plan/test_plan_cli.py": 13, "test_replay_threshold.py": 13, "test_generation.py": 13, "test_profile_marks.py": 11,
    "cli/test_cli_issue29.py": 10, "tracers/test_reuse_lazy_copy.py": 10, "test_architecture.py": 10,
    "tracers/test_shape_cache.py": 9, "test_memory_review.py": 9, "test_rendering.py": 9,
    "plan/test_plan_tp_refusals.py": 8, "tracers/test_dispatch.py": 8, "plan/test_plan_vocabulary.py": 8,
    "plan/test_plan_encoder.py": 8, "cli/test_cli.py": 7, "test_private_torch.py": 7, "test_training_step.py": 7,
    "test_generation_model_prepare.py": 7, "plan/test_plan_utilisation.py": 6,
}


def _heavy_files_first(items: List[Any], workers: int) -> List[Any]:
    """The items reordered, whole files at a time, so that each of the ``workers`` starts with a
    share of HEAVY_FILES (largest first, each to the least loaded worker). pytest-xdist's
    work-stealing hands worker k the k-th contiguous slice of the items and, when a worker runs out,
    moves tests from the end of another's queue: without this, the long files sat where the
    alphabet put them, and a long test that started last kept one worker busy while the other idled.
    Files keep their own order; every worker collects the same order, as xdist requires."""
    by_file: Dict[str, List[Any]] = {}
    for item in items:
        by_file.setdefault(os.path.relpath(item.path, Path(__file__).parent).replace(os.sep, "/"), []).append(item)
    heavy = sorted((name for name in by_file if name in HEAVY_FILES), key=lambda name: -HEAVY_FILES[name])
    if not heavy:
        return items
    shares: List[List[Any]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for name in heavy:
        k = loads.index(min(loads))
        shares[k].extend(by_file[name])
        loads[k] += HEAVY_FILES[name]
    light = [item for name, group in by_file.items() if name not in HEAVY_FILES for item in group]
    ordered: List[Any] = []
    for k in range(workers):
        # worker k's slice: its heavy files, then light items up to an equal share of the count
        size = (len(items) - len(ordered)) // (workers - k)
        fill = max(0, size - len(shares[k])) if k < workers - 1 else len(light)
        ordered += shares[k] + light[:fill]
        del light[:fill]
    return ordered


def pytest_collection_finish(session: Any) -> None:
    """Everything alive once the tests are collected (torch, transformers, lightning and the test
    modules: ~370,000 objects that live as long as the process) is moved out of the garbage
    collector's sight (gc.freeze, after a collection, so no garbage is kept). A full collection
    then walks only what the tests made: ~0.05 s instead of ~0.2 s, and libraries call it often
    (accelerate's free_memory on each Trainer.train: the Trainer tests' CPU fell by a third)."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    """After the last test of a file (its module fixtures torn down), what it left alive is frozen
    too (gc.collect() first, so no garbage is kept): the modules transformers imports for each
    model type, torch's and flopcount's caches, alive for good, leave every later collection's
    walk. Two test files call gc.unfreeze() (tests/tracers/test_count_collection.py,
    tests/test_generation_collection.py), which put the whole heap back in view for the rest of
    their worker's tests: each test of tests/tracers/test_reuse_garbage.py (a full collection,
    then walks of the heap) took ~1.5 s after them instead of ~0.07 s. The check is on the file
    only: gc.get_freeze_count() walks every frozen object (~50 ms late in a worker's run), too
    slow to ask after each test (docs/performance.md, "The main suite, third pass")."""
    yield
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
        gc.freeze()


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config: Any, items: Any) -> None:
    """Under pytest-xdist, each worker starts with its share of the long files (_heavy_files_first).
    The serial tests in tests/plan run real gloo ranks, forked from a server that imports
    torch and transformers once (tests/plan/_plan_gloo.py, ~3 s): when any is selected, start it
    now, in the background, so that those imports overlap the tests before the first run."""
    if _WORKERS > 1:
        items[:] = _heavy_files_first(list(items), _WORKERS)
    if any(item.path.parent.name == "plan" and item.get_closest_marker("serial") for item in items):
        import _plan_gloo

        _plan_gloo.start_fork_server()
