"""Counting cost against the model's distinct structure (issue #32): the default count with
real weights, the default count of a meta copy (the same fast path since #32.1), and
``FlopCounterMode`` on a meta copy (no arithmetic either), interleaved in one process, one
thread, median of the rounds (the three models of ``bench_fastpath.CASES`` and the tests' tiny
2-layer LLaMA, whose count is mostly per-count fixed costs); then LLaMA-2-70B's config on meta at
4,096 tokens.

Each tool runs once per round (``_interleave.rounds``), after one warm-up call, in an order that
changes from round to round (a Williams design: each tool right after each other one once in
4 rounds, so use a multiple of 4 repeats): in a fixed order the first column always ran right
after ``FlopCounterMode``'s 100-250 ms forward and paid for the cold caches that left, 1.3-4 ms
CPU per count (``count_after.py``), which read as a cost of real weights (issue #32, realgap). The meta copy keeps the
model's ties (:func:`meta_copy`): both columns count the same model.
"reuse on" counts with ``FLOPCOUNT_REUSE=1`` (structural reuse), "reuse off" with ``=0``
(every call traced); each column sets it explicitly, whatever the default is.

Then the memory of the count itself (``tracemalloc`` peak of one ``count_flops``, Python
allocations: events, rows, the fake copy's objects) for LLaMA-2-70B's config on meta cut to
20, 40 and 80 layers, reuse on and off; with reuse on, also what the result keeps when the count
returns (its per-module rows: the result alone, read after a full collection with it and without
it; CPython's free lists keep blocks a count let go, which a plain reading takes for the result's)
and the slope from 20 to 80 layers: the peak's growth per layer and the part of it that is not the
result's rows (the count's own working set, issue #32 step 3); then that working set beyond the
model's own output too (what a plain forward's output holds on meta, its KV cache, with each of its
tensors as the fake a count makes: the forward runs under a fake mode), at the peak and at the
forward's end (where a deep count with a KV cache peaks; read there after a full collection with
CPython's type cache emptied, which makes it the same to a few bytes from run to run); and the peak
of each stage of the count (facts, trace, pricing, booking), which says where that working set is.

With ``--cpu`` the models are timed again by process CPU time (the same interleaving): on a machine
other processes load, wall time counts their share of the cores too.

    .venv/bin/python benchmarks/bench_reuse.py [--repeats 8] [--threads 1] [--skip-70b] [--skip-memory] [--only-memory] [--cpu]
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from _interleave import median, ratio, rounds  # noqa: E402
from bench_fastpath import CASES  # noqa: E402  (the same three models and inputs)
from torch import nn  # noqa: E402

from flopcount import count_flops  # noqa: E402

warnings.simplefilter("ignore")




def _count(model: nn.Module, inputs: Tuple[Any, ...], reuse: bool = False) -> Callable[[], Any]:
    def run() -> Any:
        old = os.environ.get("FLOPCOUNT_REUSE")
        os.environ["FLOPCOUNT_REUSE"] = "1" if reuse else "0"
        try:
            return count_flops(model, inputs)
        finally:
            if old is None:
                del os.environ["FLOPCOUNT_REUSE"]
            else:
                os.environ["FLOPCOUNT_REUSE"] = old

    return run


def _reused(model: nn.Module, inputs: Tuple[Any, ...]) -> int:
    from flopcount.core.inputs import prepare_call
    from flopcount.tracers import trace

    old = os.environ.get("FLOPCOUNT_REUSE")
    os.environ["FLOPCOUNT_REUSE"] = "1"
    try:
        return int(trace(model, prepare_call(inputs)).shape_cache.get("reused_calls", 0))
    finally:
        if old is None:
            del os.environ["FLOPCOUNT_REUSE"]
        else:
            os.environ["FLOPCOUNT_REUSE"] = old


def _flop_counter_mode(model: nn.Module, inputs: Tuple[Any, ...]) -> Callable[[], Any]:
    from torch.utils.flop_counter import FlopCounterMode

    def run() -> Any:
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(*inputs)
        return counter.get_total_flops()

    return run


def meta_copy(model: nn.Module, inputs: Tuple[Any, ...]) -> Tuple[nn.Module, Tuple[Any, ...]]:
    """A copy of ``model`` on the meta device that is the same model: tied parameters stay tied
    (``copy.deepcopy(model).to("meta")`` unties them: GPT-2's meta copy had 163 M parameters
    instead of 124 M, and its count took the untied model's cheaper walk), buffers and
    ``requires_grad`` as they are; the weights' data is not copied (each tensor's meta twin is
    put in the copier's memo first)."""
    memo: Dict[int, Any] = {}
    for module in model.modules():
        for param in module._parameters.values():
            if param is not None and id(param) not in memo:
                memo[id(param)] = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        for buffer in module._buffers.values():
            if buffer is not None and id(buffer) not in memo:
                memo[id(buffer)] = buffer.to("meta")
    return copy.deepcopy(model, memo), tuple(t.to("meta") for t in inputs)


def _cpu_timed(fns: Dict[str, Callable[[], Any]], spent: Dict[str, list]) -> Dict[str, Callable[[], Any]]:
    """``fns`` each recording its process CPU time into ``spent`` (one thread: what the count
    itself used, which other processes on a loaded machine move far less than wall time)."""

    def timed(name: str) -> Callable[[], Any]:
        fn = fns[name]

        def run() -> Any:
            start = time.process_time()
            try:
                return fn()
            finally:
                spent[name].append(time.process_time() - start)

        return run

    return {name: timed(name) for name in fns}


def tiny_llama() -> Tuple[nn.Module, Tuple[Any, ...]]:
    """The tests' tiny LLaMA (``tests/_layer_stacks.py``'s config) at 2 layers, batch 2 x 16 tokens:
    a count whose per-count fixed costs are most of its time, as in the test suite (issue #27)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=128, max_position_embeddings=64, use_cache=False,
    )
    return LlamaForCausalLM(config).eval(), (torch.randint(0, 128, (2, 16)),)


def models(repeats: int, cpu: bool = False) -> None:
    """Each model's four timings, interleaved; ``cpu``: process CPU time instead of wall time
    (the warm-up call left out), medians and per-round ratios the same way."""
    clock = "CPU time" if cpu else "wall time"
    print(f"| model ({clock}) | real weights, reuse on | meta copy, reuse off | meta copy, reuse on | FlopCounterMode, meta copy (tiny: real) |")
    print("|---|---|---|---|---|")
    for label, build in {**CASES, "tiny LLaMA 2 layers 2x16": tiny_llama}.items():
        torch.manual_seed(0)
        model, inputs = build()
        meta_model, meta_inputs = meta_copy(model, inputs)
        fns: Dict[str, Callable[[], Any]] = {
            "real": _count(model, inputs, reuse=True),
            "meta": _count(meta_model, meta_inputs),
            "meta_reuse": _count(meta_model, meta_inputs, reuse=True),
            # the tiny LLaMA's mask code reads a value (``.item()``), which FlopCounterMode cannot on
            # meta: its peer runs on the real weights (a small model: little arithmetic)
            "fcm": _flop_counter_mode(*((model, inputs) if label.startswith("tiny") else (meta_model, meta_inputs))),
        }
        spent: Dict[str, list] = {name: [] for name in fns}
        times, failures = rounds(_cpu_timed(fns, spent) if cpu else fns, repeats, balanced=True)
        if cpu:
            times = {name: (None if times[name] is None else spent[name][1:]) for name in fns}
        cells = []
        for name in fns:
            if name in failures:
                cells.append(f"failed: {failures[name]}")
                continue
            t, r = median(times[name]), ratio(times, name, "fcm")
            cells.append("-" if t is None else f"{t * 1e3:.1f} ms" + ("" if r is None else f" ({r:.2f}x)"))
        print(f"| {label} | " + " | ".join(cells) + " |")
        results = [fns[name]() for name in ("real", "meta", "meta_reuse")]
        same = all(r.by_module("flops") == results[0].by_module("flops") for r in results)
        params = {r.params for r in results}
        print(f"|  per-module rows equal (real, meta, meta reuse on): {same}; parameters {'/'.join(map(str, params))}; "
              f"calls reused: {_reused(meta_model, meta_inputs)} | | | | |")


def llama70b(repeats: int, tokens: int = 4096) -> None:
    from transformers import LlamaForCausalLM

    from flopcount.examples.hf import llama2_70b_config

    with torch.device("meta"):
        model = LlamaForCausalLM(llama2_70b_config()).eval()
    ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    fns = {"reuse off": _count(model, (ids,)), "reuse on": _count(model, (ids,), reuse=True)}
    collections = _FullPasses()
    cpu: Dict[str, list] = {name: [] for name in fns}
    passes: Dict[str, int] = {name: 0 for name in fns}

    def measured(name: str) -> Callable[[], Any]:
        fn = fns[name]

        def run() -> Any:
            before, start = collections.count, time.process_time()
            try:
                return fn()
            finally:
                cpu[name].append(time.process_time() - start)
                passes[name] += collections.count - before

        return run

    with collections:
        times, failures = rounds({name: measured(name) for name in fns}, repeats)
    for name in fns:
        if name in failures:
            print(f"LLaMA-2-70B meta 1x{tokens}, {name}: failed: {failures[name]}")
        else:
            result = fns[name]()
            spent = cpu[name][1:]  # the warm-up call left out
            print(
                f"LLaMA-2-70B meta 1x{tokens}, {name}: {median(times[name]):.3f} s median of {repeats} "
                f"(CPU {median(spent):.3f} s median, {sum(spent) / len(spent):.3f} s mean; "
                f"{passes[name]} full garbage-collector passes in {len(cpu[name])} counts; "
                f"{result.macs / 1e12:.3f} TMACs)"
            )


class _FullPasses:
    """Counts the garbage collector's full (generation 2) passes while entered: each walks the
    whole heap (every object of torch, transformers and the model), and when one falls inside a
    count it is part of that count's time."""

    def __init__(self) -> None:
        self.count = 0

    def _seen(self, phase: str, info: Dict[str, Any]) -> None:
        if phase == "start" and info.get("generation") == 2:
            self.count += 1

    def __enter__(self) -> _FullPasses:
        import gc

        gc.callbacks.append(self._seen)
        return self

    def __exit__(self, *exc: Any) -> None:
        import gc

        gc.callbacks.remove(self._seen)


def memory(tokens: int = 4096) -> None:
    import gc
    import tracemalloc

    from transformers import LlamaForCausalLM

    from flopcount.examples.hf import llama2_70b_config

    print("| layers | reuse on: peak, per layer | reuse off: peak, per layer | reuse on: the result alone, per layer "
          "| reuse on: allocated when the count returns, per layer | reuse on, a table read: peak; the result alone "
          "| events booked |")
    print("|---|---|---|---|---|---|---|")
    peaks: Dict[int, int] = {}
    kept: Dict[int, int] = {}
    ended: Dict[int, int] = {}
    read_kept: Dict[int, int] = {}
    outputs: Dict[int, float] = {}  # the model's own output as a count holds it (:func:`_own_output`)
    at_end: Dict[int, int] = {}  # alive at the forward's end (:func:`_at_forwards_end`)
    excess = _fake_beyond_meta()
    for layers in (20, 40, 80):
        config = llama2_70b_config()
        config.num_hidden_layers = layers
        with torch.device("meta"):
            model = LlamaForCausalLM(config).eval()
        ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
        cells = []
        for reuse in (True, False):
            run = _count(model, (ids,), reuse=reuse)
            run()
            gc.collect()
            tracemalloc.start()
            result = run()
            held, peak = tracemalloc.get_traced_memory()  # held: the result, and blocks CPython's free lists keep
            # the result alone: after a full collection (which empties the free lists) with it, less without it
            gc.collect()
            with_it = tracemalloc.get_traced_memory()[0]
            del result
            gc.collect()
            alone = with_it - tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            cells.append(f"{peak / 2**20:.1f} MiB, {peak / layers / 2**10:.0f} KiB")
            if reuse:
                peaks[layers], kept[layers], ended[layers] = peak, alone, held
        # since branch deferbook the count books its tables on first read: the peak of a count and
        # one table read, and what the result holds once read (its rows, the records let go)
        run = _count(model, (ids,), reuse=True)
        gc.collect()
        tracemalloc.start()
        result = run()
        result.by_module()
        read_peak = tracemalloc.get_traced_memory()[1]
        gc.collect()
        with_it = tracemalloc.get_traced_memory()[0]
        del result
        gc.collect()
        read_kept[layers] = with_it - tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        read = f"{read_peak / 2**20:.1f} MiB; {read_kept[layers] / 2**20:.2f} MiB, {read_kept[layers] / layers / 2**10:.1f} KiB"
        _at_forwards_end(model, ids)  # the reading's own first time (a process's first one holds more)
        at_end[layers] = _at_forwards_end(model, ids)
        plain, tensors = _own_output(model, ids)
        outputs[layers] = plain + tensors * excess
        rows = f"{kept[layers] / 2**20:.2f} MiB, {kept[layers] / layers / 2**10:.1f} KiB"
        end = f"{ended[layers] / 2**20:.2f} MiB, {ended[layers] / layers / 2**10:.1f} KiB"
        print(f"| {layers} | {cells[0]} | {cells[1]} | {rows} | {end} | {read} | {_events(model, ids)} |")
    # what one more layer costs (the slope from 20 to 80 layers), and the part of it the result keeps
    slope, rows_slope, end_slope, read_slope = ((d[80] - d[20]) / 60 / 2**10 for d in (peaks, kept, ended, read_kept))
    print(f"reuse on, per layer from 20 to 80 layers: the result alone +{rows_slope:.2f} KiB unread, "
          f"+{read_slope:.2f} KiB once a table is read")
    print(f"reuse on, per layer from 20 to 80 layers: peak +{slope:.1f} KiB, of which the result alone keeps "
          f"+{rows_slope:.1f} KiB (its per-module rows); the count's own working set +{slope - rows_slope:.1f} KiB "
          f"(at the peak of the stage whose peak is highest: the table below). The reading before 2026-11-27 "
          f"(all that is allocated when the count returns, free-list blocks included, taken for rows): "
          f"+{end_slope:.1f} KiB, working set +{slope - end_slope:.1f} KiB")
    output_slope, end_at_slope = ((d[80] - d[20]) / 60 / 2**10 for d in (outputs, at_end))
    print(f"reuse on, per layer from 20 to 80 layers: the model's own output as a count holds it +{output_slope:.2f} KiB "
          f"(a plain forward's output on meta, live, and each of its tensors as a fake: {excess:.0f} B beyond a meta "
          f"tensor); the count's own working set beyond the result's rows and that output: "
          f"+{slope - rows_slope - output_slope:.2f} KiB at the peak, +{end_at_slope - rows_slope - output_slope:.2f} KiB "
          f"at the forward's end (alive +{end_at_slope:.2f} KiB there, after a full collection with CPython's type cache "
          f"emptied: the same to a few bytes run to run; the rows beyond the names are made after it)")
    _stages(tokens)


def _fake_beyond_meta() -> float:
    """What a fake as a count makes it (``FakeMaker``: a ``FakeTensor`` and its Python state) holds
    beyond a meta tensor of the same metadata, per tensor, both live over 1,024 (``tracemalloc``)."""
    import gc
    import tracemalloc

    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from flopcount.tracers.fake.making import FakeMaker

    maker = FakeMaker(FakeTensorMode(), FakeTensor)
    shape, stride, meta = (1, 64, 128), (8192, 128, 1), torch.device("meta")
    maker.make(shape, stride, torch.float32, meta)  # the first: its state read once
    held = []
    for make in (lambda: maker.make(shape, stride, torch.float32, meta),
                 lambda: torch.empty_strided(shape, stride, dtype=torch.float32, device=meta)):
        gc.collect()
        sys._clear_type_cache()
        tracemalloc.start()
        made: list = [None] * 1024
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1024):
            made[i] = make()
        held.append(tracemalloc.get_traced_memory()[0] - before)
        tracemalloc.stop()
        del made
    return (held[0] - held[1]) / 1024


def _own_output(model: nn.Module, ids: torch.Tensor) -> Tuple[int, int]:
    """(what a plain forward's output holds alive, the tensors in it): the model on meta without
    flopcount (a LLaMA's: its KV cache, a ``DynamicLayer`` and two meta tensors a layer, and the
    logits), read after a full collection with the output and without it."""
    import gc
    import tracemalloc

    with torch.no_grad():
        model(ids)
    gc.collect()
    tracemalloc.start()
    try:
        with torch.no_grad():
            out = model(ids)
        tensors = _tensors_in(out)
        gc.collect()
        with_it = tracemalloc.get_traced_memory()[0]
        del out
        gc.collect()
        return with_it - tracemalloc.get_traced_memory()[0], tensors
    finally:
        tracemalloc.stop()


def _tensors_in(root: Any) -> int:
    """The tensors an object graph holds (a forward's output: the logits and the KV cache)."""
    import gc

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


def _at_forwards_end(model: nn.Module, ids: torch.Tensor) -> int:
    """Python memory alive (``tracemalloc``, above what was before the count) when the copy's
    outermost decoder stack (``LlamaModel.forward``) returns in a warm count, reuse on: where a deep
    count with a KV cache peaks, read after a full collection and with CPython's type attribute cache
    emptied (it keeps the last name looked up in each slot, which moves the peak by ~0.2 KiB a layer
    from run to run)."""
    import gc
    import tracemalloc

    run = _count(model, (ids,), reuse=True)
    run()
    seen: Dict[str, int] = {}

    def watch(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code.co_name == "forward" and type(frame.f_locals.get("self")).__name__ == "LlamaModel":
            sys.setprofile(None)
            gc.collect()
            sys._clear_type_cache()
            seen["end"] = tracemalloc.get_traced_memory()[0]

    gc.collect()
    sys._clear_type_cache()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        sys.setprofile(watch)
        try:
            run()
        finally:
            sys.setprofile(None)
        return seen["end"] - before
    finally:
        tracemalloc.stop()


def _stages(tokens: int) -> None:
    """Where the peak of a count is, reuse on: the count's stages run one by one as ``analyze``
    runs them, with ``tracemalloc``'s peak reset between them (what each stage holds at its
    start is in its peak): the model's facts, the trace (the fake copy of every module, the
    records), the pricing, the booking (the ledger's tables, the result's rows)."""
    import gc
    import tracemalloc

    from transformers import LlamaForCausalLM

    from flopcount.core import analysis
    from flopcount.core.inputs import prepare_call
    from flopcount.core.model_facts import model_facts
    from flopcount.core.results import aggregate
    from flopcount.examples.hf import llama2_70b_config
    from flopcount.handlers import default_registry
    from flopcount.tracers import trace

    stages = ("facts", "trace", "pricing", "booking")
    peaks: Dict[int, Dict[str, int]] = {}
    old = os.environ.get("FLOPCOUNT_REUSE")
    os.environ["FLOPCOUNT_REUSE"] = "1"
    try:
        for layers in (20, 40, 80):
            config = llama2_70b_config()
            config.num_hidden_layers = layers
            with torch.device("meta"):
                model = LlamaForCausalLM(config).eval()
            ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
            for measured in (False, True):
                gc.collect()
                if measured:
                    tracemalloc.start()
                seen: Dict[str, int] = {}

                def mark(stage: str) -> None:
                    if tracemalloc.is_tracing():
                        seen[stage] = tracemalloc.get_traced_memory()[1]
                        tracemalloc.reset_peak()

                call = prepare_call((ids,))
                facts = model_facts(model)
                mark("facts")
                run = trace(model, call, facts=facts)
                mark("trace")
                if hasattr(analysis, "cost_records"):
                    costed = analysis.cost_records(run.records, default_registry())
                else:  # a checkout before replays were one record (to measure "before" with this script)
                    costed = analysis.cost_events(run.events, default_registry())
                mark("pricing")
                # as ``analyze`` books: the trace and the facts let go first, what booking reads kept
                modules, summary, aliases, used = facts.module_infos(run.module_calls), facts.summary, facts.aliases, run.tracer
                del run, facts
                aggregate(costed, tracer=used, modules=modules, parameters=summary, aliases=aliases)
                mark("booking")
                if measured:
                    tracemalloc.stop()
                    peaks[layers] = seen
                del costed, modules
    finally:
        if old is None:
            del os.environ["FLOPCOUNT_REUSE"]
        else:
            os.environ["FLOPCOUNT_REUSE"] = old
    print("| reuse on, peak of each stage | " + " | ".join(stages) + " |")
    print("|---|" + "---|" * len(stages))
    for layers, seen in peaks.items():
        print(f"| {layers} layers | " + " | ".join(f"{seen[s] / 2**20:.2f} MiB" for s in stages) + " |")
    print("| per layer, 20 to 80 | " + " | ".join(f"+{(peaks[80][s] - peaks[20][s]) / 60 / 2**10:.1f} KiB" for s in stages) + " |")


def _events(model: nn.Module, ids: torch.Tensor) -> int:
    from flopcount.core.inputs import prepare_call
    from flopcount.tracers import trace

    return len(trace(model, prepare_call((ids,))).events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-70b", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--only-memory", action="store_true", help="the memory tables alone")
    parser.add_argument("--cpu", action="store_true", help="also time the models by process CPU time (a loaded machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"torch {torch.__version__}, {platform.machine()}, {args.threads} thread(s), median of {args.repeats}, "
          f"load average {' '.join(load)} at start, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if not args.only_memory:
        models(args.repeats)
        if args.cpu:
            models(args.repeats, cpu=True)
        if not args.skip_70b:
            llama70b(args.repeats)
    if not args.skip_memory:
        memory()


if __name__ == "__main__":
    main()
