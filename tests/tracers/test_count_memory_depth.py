"""What a count holds per repeated layer (issue #32's memory target: the count's memory flat in
depth beyond the per-module rows), on a LLaMA-like stack on meta at two depths, reuse on. Each
figure is the growth per extra layer of what one object graph holds alive (``tracemalloc``,
after a full collection: no garbage, no free-list blocks), against a bound derived by hand from
CPython's object layout: a tuple is 16 B of collector header + 24 B of header + 8 B per item; a
slotted object 16 + 16 + 8 B per slot; a module's name is measured with ``sys.getsizeof`` (the
string itself, which the result holds), a dict of the same keys built by insertion likewise. The
model is checked to be left as found."""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc
from pathlib import Path
from typing import Any, Callable, List, Tuple

import pytest
import torch
from conftest import assert_same_state, snapshot

from flopcount import count_flops
from flopcount.core.inputs import prepare_call
from flopcount.core.model_facts import model_facts
from flopcount.tracers import trace
from tests.tracers._tiny_llama import tiny_llama

pytest.importorskip("transformers")

SHALLOW, DEEP = 8, 24
TUPLE, OBJECT, ITEM = 16 + 24, 16 + 16, 8


def _llama_like(layers: int) -> torch.nn.Module:
    return tiny_llama(layers).eval()


def _ids() -> torch.Tensor:
    return torch.zeros(2, 16, dtype=torch.long, device="meta")  # batch 2


def _held(make: Callable[[], Any], keep: Callable[[Any], Any]) -> int:
    """Bytes that ``keep(make())`` alone holds alive: traced memory with it, less without it."""
    gc.collect()
    tracemalloc.start()
    try:
        kept = keep(make())
        gc.collect()
        with_it = tracemalloc.get_traced_memory()[0]
        del kept
        gc.collect()
        return with_it - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def _per_layer(measure: Callable[[torch.nn.Module], int]) -> Tuple[float, List[torch.nn.Module]]:
    models = [_llama_like(SHALLOW), _llama_like(DEEP)]
    shallow, deep = (measure(m) for m in models)
    return (deep - shallow) / (DEEP - SHALLOW), models


def _layer(model: torch.nn.Module, i: int = 3) -> List[str]:
    """The names of layer ``i``'s modules (itself and below)."""
    return [name for name, _ in model.named_modules() if name == f"model.layers.{i}" or name.startswith(f"model.layers.{i}.")]


def _names_per_layer(deep: torch.nn.Module) -> float:
    """The bytes of the names the extra layers add, per layer (layers 8-23: most names one digit longer)."""
    return sum(sys.getsizeof(n) for i in range(SHALLOW, DEEP) for n in _layer(deep, i)) / (DEEP - SHALLOW)


def _records(model: torch.nn.Module) -> int:
    facts = model_facts(model)  # alive throughout: its names are not the records'
    trace(model, prepare_call((_ids(),)), facts=facts)  # warm: the shape cache's tables
    return _held(lambda: trace(model, prepare_call((_ids(),)), facts=facts), lambda run: run.records)


def _result(model: torch.nn.Module) -> int:
    count_flops(model, (_ids(),))  # warm
    # the result alone: the names are the model's too, so they are measured by hand below. Its
    # tables are not read: it holds what books them when first read (the costed records)
    return _held(lambda: count_flops(model, (_ids(),)), lambda r: r)


def _result_read(model: torch.nn.Module) -> int:
    count_flops(model, (_ids(),))  # warm

    def read(result: Any) -> Any:
        result.by_module()  # its tables booked: the records let go, the rows kept
        return result

    return _held(lambda: count_flops(model, (_ids(),)), read)


def _facts_as_a_count_reads_them(model: torch.nn.Module) -> int:
    def read(facts: Any) -> Any:
        facts.names  # the tracers name modules through it: every count reads it
        return facts

    return _held(lambda: model_facts(model), read)


MEASURES = {"records": _records, "result": _result, "result read": _result_read, "facts": _facts_as_a_count_reads_them}

_MEASURE = """
import sys
sys.path[:0] = [{tests!r}, {tracers!r}]
import test_count_memory_depth as t
print(t._per_layer(t.MEASURES[{kind!r}])[0])
"""


def _measured(fresh_python: Any, kind: str) -> Tuple[float, List[torch.nn.Module]]:
    """``_per_layer(MEASURES[kind])`` in a process of its own, forked from conftest's server (which
    has imported torch and transformers' LLaMA: fresh_python_with_transformers), reuse on; with the two models, built here, that the bounds are read
    from. In a pytest-xdist worker that had run other tests, a per-layer figure once read 1.5 B
    over its bound that it met alone: the worker's state, not the count."""
    tests = Path(__file__).resolve().parents[1]
    script = _MEASURE.format(tests=str(tests), tracers=str(tests / "tracers"), kind=kind)
    env = {**os.environ, "PYTHONPATH": str(tests.parent), "FLOPCOUNT_REUSE": "1"}
    done = fresh_python.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    return float(done.stdout.split()[-1]), [_llama_like(SHALLOW), _llama_like(DEEP)]


def test_a_replayed_layer_is_one_record_holding_its_modules_names(fresh_python_with_transformers):
    per_layer, models = _measured(fresh_python_with_transformers, "records")
    m = len(_layer(models[0]))  # 13: the layer, attention and its 4 projections, MLP and its 4, 2 norms
    # one ReplayedCall (3 slots) + its stacks' view (3 slots) + the names of its m modules (a tuple of
    # m) + its own stack ("model", "model.layers.i": a tuple of 2) + its place in the records tuple.
    # Before: a tuple per distinct stack (13, of 3-4 names) instead of the view and the names: ~1,100 B
    assert per_layer <= (OBJECT + 3 * ITEM) * 2 + (TUPLE + m * ITEM) + (TUPLE + 2 * ITEM) + ITEM, per_layer


@pytest.mark.parametrize("kind", ["result", "result read"])
def test_the_result_keeps_per_layer_its_names_and_one_slotted_row_per_module(fresh_python_with_transformers, kind):
    """Before its tables are read, and after: the default count books them on first read
    (branch deferbook), so an unread result holds its costed records (per replayed layer one
    record, the names of its modules: ~380 B) where a read one holds its rows; both within the
    rows' bound. Before (the deferral alone): the booking to come held a list of the modules
    beside the result's tuple, 8 B per module over it (2,529.9 against 2,450.4)."""
    per_layer, models = _measured(fresh_python_with_transformers, kind)
    names = _layer(models[0])

    def table(model: torch.nn.Module) -> int:
        d = {}
        for name, _ in model.named_modules():
            d[name] = None
        return sys.getsizeof(d)

    # per module: its name (a new string per layer, held by the result), one ModuleInfo (5 slots),
    # its place in the result's tuple of modules, and an entry in each of two dicts by module
    # (totals, and the table of ops: equal tables are one object, shared by the layers). Before: a
    # ModuleInfo with an attribute table (+40 B) and each module's parameter count its own int
    dicts = 2 * (table(models[1]) - table(models[0])) / (DEEP - SHALLOW)
    bound = _names_per_layer(models[1]) + len(names) * (OBJECT + 5 * ITEM + ITEM) + dicts
    assert per_layer <= bound, (per_layer, bound)


def _table_per_layer(models: List[torch.nn.Module]) -> float:
    """The bytes a dictionary keyed by every module (built by insertion) grows by per layer."""

    def table(model: torch.nn.Module) -> int:
        d = {}
        for name, module in model.named_modules():
            d[module] = name
        return sys.getsizeof(d)

    return (table(models[1]) - table(models[0])) / (DEEP - SHALLOW)


def test_the_facts_hold_per_module_its_name_and_no_pair(fresh_python_with_transformers):
    per_layer, models = _measured(fresh_python_with_transformers, "facts")
    names = _layer(models[0])
    params = sum(1 for n, _ in models[0].named_parameters() if n.startswith("model.layers.3."))
    # names (new strings), the one dictionary module -> name (``names``, which ``modules`` is read
    # through), each module's own parameter count (one int object for equal sizes: a reference),
    # each parameter in the tuple of parameters. Before: one (name, module) pair per module besides
    # (16 + 24 + 16 = 56 B each); then (78e3e91) a tuple of names and one of modules beside the
    # dictionary: 2 x 8 B per module over this bound
    bound = _names_per_layer(models[1]) + _table_per_layer(models) + len(names) * ITEM + params * ITEM
    assert per_layer <= bound, (per_layer, bound)
    facts = model_facts(models[0])
    assert list(facts.modules) == list(models[0].named_modules())
    assert list(reversed(facts.modules)) == list(reversed(list(models[0].named_modules())))
    assert facts.modules[3] == list(models[0].named_modules())[3] and facts.modules[-1] == list(models[0].named_modules())[-1]
    assert facts.names == {module: name for name, module in models[0].named_modules()}


def test_the_facts_of_modules_that_compare_equal_keep_each_module(monkeypatch):
    """A module class that compares by value: the facts still list every module once by
    identity, in walk order (the one dictionary by module would merge equal ones)."""

    class Same(torch.nn.Linear):
        def __eq__(self, other: object) -> bool:
            return isinstance(other, Same)

        def __hash__(self) -> int:
            return 0

    model = torch.nn.Sequential(Same(2, 2), torch.nn.ReLU(), Same(2, 2))
    facts = model_facts(model)
    # every module by identity (torch's own ``named_modules()`` drops a module equal to an earlier one)
    walked = [(name, id(module)) for name, module in model.named_modules(remove_duplicate=False)]
    assert [(name, id(module)) for name, module in facts.modules] == walked
    assert len(facts.modules) == 4 and facts.modules[3][0] == "2"


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_counting_leaves_the_model_as_found(monkeypatch, train):
    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).train(train)  # real weights: their values are compared after
    before = snapshot(model)
    result = count_flops(model, (torch.zeros(2, 16, dtype=torch.long),))
    assert result.reused_calls == 3
    assert_same_state(model, before)


def test_a_count_keeps_nothing_the_ledger_made_once_it_returns(monkeypatch):
    """What the ledger allocates for a count is the count's: once its result is let go, nothing
    it made stays allocated, at any depth. Before (branch countmem3), a process-wide cache of the
    owners of every booked stack (``functools.lru_cache``) kept each stack and its owners for the
    life of the process: a tuple of 4-5 owners per module of a layer, and the stack it was keyed
    by (78e3e91: 2.9 KiB per layer here by this reading; 5.6 KiB per LLaMA-2-70B layer). The
    first count of each depth is measured (a warm-up on 2 layers first): a second count of the
    same model would find such a cache filled already."""
    from flopcount.core import ledger

    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    count_flops(_llama_like(2), (_ids(),))  # warm: the shape cache's tables, torch's own

    def kept_from_ledger(layers: int) -> int:
        model = _llama_like(layers)
        gc.collect()
        # 16 frames: the ledger's own frame is within the innermost few of whatever it allocates (the
        # parent of branch countmem3 fails the same with 4, 8, 16 or 64: 29,454 against 75,360 B);
        # 64 recorded every allocation of the count with a traceback four times as deep (7 s -> 3 s)
        tracemalloc.start(16)
        try:
            result = count_flops(model, (_ids(),))
            del result
            gc.collect()
            traces = tracemalloc.take_snapshot().traces
        finally:
            tracemalloc.stop()
        return sum(t.size for t in traces if any(frame.filename == ledger.__file__ for frame in t.traceback))

    shallow, deep = kept_from_ledger(SHALLOW), kept_from_ledger(DEEP)
    # by hand: nothing per layer. (One 56 B block, the same at every depth and count, is
    # CPython's: made by a dict display in ``_first_ordered`` and kept by the interpreter.)
    assert deep == shallow, (shallow, deep)
