"""The count's own working set per repeated layer (issue #32's memory target: "memory of the count
itself does not grow with the number of repeated layers beyond the per-module rows"), read where a
deep count with a KV cache peaks: at the end of the model's forward (docs/performance.md,
countmem5 of 2026-11-29). Reuse on, a LLaMA-like stack on meta at 8, 16 and 32 layers.

The reading, per extra layer (a least-squares slope over the three depths):

* ``end``: Python memory alive (``tracemalloc``) when the copy's ``LlamaModel.forward`` returns,
  after a full collection (no garbage, no free-list blocks) and with CPython's type attribute
  cache emptied (it keeps the last name string looked up in each of its slots: CPython's, and
  where they land moves from run to run, ~0.2 KiB a layer);
* ``rows``: what the result alone holds once the count returns (with it, less without it);
* ``output``: the model's own output as a count holds it: the same model's plain forward on meta
  without flopcount (live: its KV cache, a ``DynamicLayer`` and two meta tensors a layer), plus, for
  each tensor in that output, what a fake as the count makes it (``FakeMaker``) holds beyond a meta
  tensor (live, over 1,024 of each): the forward runs under a fake mode, so its outputs are fakes;
* the working set: ``end - rows - output``. The rows beyond the module names (the result's
  ``ModuleInfo`` rows and tables, ~1.1 KiB a layer) are made after the forward, so this nets the
  count's structures alive there (the facts' module -> name dictionary, the lazily copied layer
  objects, the replays' records) against rows not made yet.
"""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch

from flopcount import count_flops
from tests.tracers._tiny_llama import tiny_llama

pytest.importorskip("transformers")

DEPTHS = (8, 16, 32)


def _llama_like(layers: int) -> torch.nn.Module:
    return tiny_llama(layers).eval()


def _ids() -> torch.Tensor:
    return torch.zeros(2, 16, dtype=torch.long, device="meta")


def _quiet() -> None:
    gc.collect()
    sys._clear_type_cache()


def _count_at_the_forwards_end(model: torch.nn.Module) -> Tuple[int, int]:
    """(alive when the copy's ``LlamaModel.forward`` returns, what the result alone holds), in
    bytes above what was alive before the count; a warm count (two before it)."""
    count_flops(model, (_ids(),))
    count_flops(model, (_ids(),))
    seen: Dict[str, int] = {}

    def watch(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code.co_name == "forward" and type(frame.f_locals.get("self")).__name__ == "LlamaModel":
            sys.setprofile(None)
            _quiet()
            seen["end"] = tracemalloc.get_traced_memory()[0]

    _quiet()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        sys.setprofile(watch)
        try:
            result = count_flops(model, (_ids(),))
        finally:
            sys.setprofile(None)
        assert result.reused_calls == len(model.model.layers) - 1
        _quiet()
        with_it = tracemalloc.get_traced_memory()[0]
        del result
        _quiet()
        return seen["end"] - before, with_it - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def _tensors_in(root: Any) -> int:
    """The tensors an object graph holds (the plain forward's output: logits and its KV cache)."""
    seen, pending, found = {id(root)}, [root], 0
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            found += 1
            continue
        for inner in gc.get_referents(item):
            if id(inner) not in seen and not isinstance(inner, (type, str, int, float)):
                seen.add(id(inner))
                pending.append(inner)
    return found


def _plain_output(model: torch.nn.Module) -> Tuple[int, int]:
    """(what a plain forward's output holds alive, the tensors in it): the same model on meta, no
    flopcount, read after a full collection with the output and without it."""
    with torch.no_grad():
        model(_ids())
    _quiet()
    tracemalloc.start()
    try:
        with torch.no_grad():
            out = model(_ids())
        tensors = _tensors_in(out)
        _quiet()
        with_it = tracemalloc.get_traced_memory()[0]
        del out
        _quiet()
        return with_it - tracemalloc.get_traced_memory()[0], tensors
    finally:
        tracemalloc.stop()


def _fake_beyond_meta() -> float:
    """What a fake as the count makes it (:class:`FakeMaker`: a ``FakeTensor`` and its Python state)
    holds beyond a meta tensor of the same metadata, per tensor, both live over 1,024."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from flopcount.tracers.fake.making import FakeMaker

    maker = FakeMaker(FakeTensorMode(), FakeTensor)
    maker.make((2, 16, 16), (256, 16, 1), torch.float32, torch.device("meta"))  # the first: its state read once

    def held(make: Any) -> int:
        _quiet()
        tracemalloc.start()
        try:
            made: List[Any] = [None] * 1024  # the list first: only the tensors are measured
            before = tracemalloc.get_traced_memory()[0]
            for i in range(1024):
                made[i] = make()
            return tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()

    fakes = held(lambda: maker.make((2, 16, 16), (256, 16, 1), torch.float32, torch.device("meta")))
    metas = held(lambda: torch.empty_strided((2, 16, 16), (256, 16, 1), dtype=torch.float32, device="meta"))
    return (fakes - metas) / 1024


def _slope(xs: Tuple[int, ...], ys: List[float]) -> float:
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)


def measured() -> str:
    """Per layer over DEPTHS: "end rows output working_set tensors_per_layer fake_beyond_meta"."""
    # a process's first count and forward import and cache what every later one reuses
    warm = _llama_like(4)
    count_flops(warm, (_ids(),))
    with torch.no_grad():
        warm(_ids())
    _quiet()
    # what is alive now (torch, transformers) left out of every later collection: each then walks
    # only what was made since (0.18 s a full collection here, a few ms so), and frees the same
    gc.freeze()
    try:
        _count_at_the_forwards_end(warm)  # the reading's own first time
        _plain_output(warm)
        excess = _fake_beyond_meta()
        ends, rows, outputs, tensors = [], [], [], []
        for layers in DEPTHS:
            model = _llama_like(layers)
            end, kept = _count_at_the_forwards_end(model)
            ends.append(end)
            rows.append(kept)
            if layers in DEPTHS[:2]:  # linear in depth: two depths say it (a forward on meta is slow under tracing)
                plain, held = _plain_output(model)
                tensors.append(held)
                outputs.append(plain + held * excess)
    finally:
        gc.unfreeze()
    end, row = _slope(DEPTHS, ends), _slope(DEPTHS, rows)
    output, per_layer = ((ys[1] - ys[0]) / (DEPTHS[1] - DEPTHS[0]) for ys in (outputs, tensors))
    return f"{end} {row} {output} {end - row - output} {per_layer} {excess}"


_MEASURE = """
import sys
sys.path[:0] = [{tests!r}, {tracers!r}]
import test_count_working_set as t
print(t.measured())
"""


def test_the_counts_working_set_per_layer_at_the_forwards_end(fresh_python_with_transformers):
    # measured in a process of its own, forked from conftest's server (torch and transformers'
    # LLaMA imported): a pytest worker that ran other tests holds other state
    tests = Path(__file__).resolve().parents[1]
    script = _MEASURE.format(tests=str(tests), tracers=str(tests / "tracers"))
    env = {**os.environ, "PYTHONPATH": str(tests.parent), "FLOPCOUNT_REUSE": "1"}
    done = fresh_python_with_transformers.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    end, row, output, working, tensors, excess = (float(x) for x in done.stdout.split()[-6:])
    said = (
        f"{working:.0f} B a layer beyond {row:.0f} B of rows and {output:.0f} B of the model's own output "
        f"({tensors:.0f} tensors a layer, a fake {excess:.0f} B beyond a meta tensor); {end:.0f} B alive at the forward's end"
    )
    # the oracles, each live in the child: the output holds the KV cache's two tensors a layer (a
    # DynamicLayer's keys and values); a fake's Python state beyond a meta tensor's is its
    # ``__dict__`` (a dict object and the values of the 30 keys CPython 3.11 gives a class's
    # instances: 64 + 272 B) and the larger object, ~0.35 KiB
    assert tensors == 2, said
    assert 300 < excess < 420, said
    # Measured (2026-11-29, this file's reading, three runs each, the same process state):
    # main 938f92d 459-459.5 B a layer (end 3,892.5, rows 2,418.9, output 1,014); branch countmem5
    # 356-357 B (end 3,789.6): structural reuse's set of modules left unkeyed (two ids a LLaMA
    # layer: its attention and MLP inside a keyed layer) a sorted array of 8 B ids, no longer a set
    # of ``int`` objects (-103 B a layer here, -150 B on LLaMA-2-70B's config at 20 -> 80 layers).
    # Every figure above is deterministic to a few bytes (no garbage, no free-list blocks, no type
    # cache strings): the bound sits midway. What is left (docs/performance.md, countmem5 of
    # 2026-11-29): the facts' module -> name dictionary (~0.46 KiB), the copied layer objects the
    # model's ``self.layers[:n]`` makes (~0.6 KiB), the replays' records (rows to be), against the
    # ``ModuleInfo`` rows and tables not made yet (~1.1 KiB)
    assert working < 408, said


def test_a_set_of_ids_as_a_sorted_array_holds_eight_bytes_an_id_and_answers_as_a_set():
    from flopcount.tracers._reuse import _Ids

    objects = [object() for _ in range(4096)]

    def held(ids: List[int]) -> int:
        _quiet()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            made = _Ids(ids)
            _quiet()
            return tracemalloc.get_traced_memory()[0] - before
        finally:
            del made
            tracemalloc.stop()

    few, many = [id(o) for o in objects[:1024]], [id(o) for o in objects[::-1]]  # the second not sorted
    held(few)  # a first instance's one-time costs
    # by hand: 8 B an id in the array's buffer, made at its length from the sorted list (a set of
    # the same ids held ~50-80 B an id: its table's 16 B slots at most 3/5 full, a 32 B ``int`` each)
    assert held(many) - held(few) == (4096 - 1024) * 8
    inside = _Ids([id(o) for o in objects[1::2]][::-1])
    assert len(inside) == 2048
    assert all(id(o) in inside for o in objects[1::2])
    assert not any(id(o) in inside for o in objects[::2])
    assert 0 not in inside and 2**64 - 1 not in inside and 0 not in _Ids(())
