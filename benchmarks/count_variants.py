"""What a change to the default count would give, measured before it is built (issue #32, branch
resnet7): each variant swaps one piece of flopcount in this process only, round by round, and each
round runs the base count and every variant once, in an order that alternates (forward, then
reversed), so that a variant is compared with the base count of its own round. The figure is the
median of those per-round ratios of CPU time (the counting thread's), with their quartiles: on a
loaded machine single counts scatter by a few percent, the paired median far less.

A variant whose result must equal the base's (``to_dict()``, checked after the warm-up) is an
option; one marked "bound" drops something the count needs for exactness (the attribute-read log)
and only bounds what that thing costs.

``--read by_module`` (or ``to_dict``, ``by_operator``, ``cli-table``: what ``flopcount count`` prints) times each count with that read of its
result after it, inside the timed region: a reader pays for tables booked on first read.
Since branch deferbook the default count books its tables on first read: ``eager`` is the
count before it (the tables booked at once), ``deferred`` the default itself. ``set-back-always``
is the count before branch resnet9 (Python's and numpy's generators set back on every count's way
out, numpy's key arrays compared elementwise). ``containers-checked-all+eligible-in-full`` is the count
before branch resnet10 (a first call's state check asked every int and tuple attribute whether it is a
plain object; install tested a leaf's dictionaries before its children). ``always-keyed`` is the
policy before branch resnet11 (``FLOPCOUNT_REUSE=always``: every twin group keyed, whatever its
size and its blocks').

    PYTHONPATH=. .venv/bin/python benchmarks/count_variants.py [--model resnet50|bert|gpt2|70b]
        [--rounds 41] [--only reuse-off,eager,torch-untracked+eager] [--read by_module]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from count_phases import _cases  # noqa: E402

import flopcount.core.analysis as analysis  # noqa: E402
import flopcount.core.state as state  # noqa: E402
import flopcount.tracers as tracers  # noqa: E402
import flopcount.tracers._reuse as reuse  # noqa: E402
from flopcount import count_flops  # noqa: E402

warnings.simplefilter("ignore")

_SHORT = {"resnet50": "ResNet-50", "bert": "BERT-base", "gpt2": "GPT-2 small", "70b": "LLaMA-2-70B"}


class Variant(NamedTuple):
    on: Callable[[], None]
    off: Callable[[], None]
    bound: bool  # drops something exactness needs: its figure bounds a cost, it is no option


def _swapped(owner: Any, name: str, make: Callable[[Any], Any], bound: bool = False) -> Variant:
    """A variant that replaces ``owner.name`` with ``make(original)`` while it is on."""
    original = getattr(owner, name)
    replacement = make(original)
    return Variant(lambda: setattr(owner, name, replacement), lambda: setattr(owner, name, original), bound)


def _reuse_set(value: str) -> Variant:
    before = os.environ.get("FLOPCOUNT_REUSE")

    def on() -> None:
        os.environ["FLOPCOUNT_REUSE"] = value

    def off() -> None:
        if before is None:
            del os.environ["FLOPCOUNT_REUSE"]
        else:
            os.environ["FLOPCOUNT_REUSE"] = before

    return Variant(on, off, False)


def _nothing_wrapped(original: Any) -> Any:
    # the lazy copy as with reuse on, no module wrapped: no key, first call or replay
    def eligible(self: Any, module: Any) -> bool:
        return False

    return eligible


def _keyed_from(calls: int) -> Callable[[Any], Any]:
    # the default policy's decision replaced by a group size: a twin group keyed from ``calls`` calls
    def make(original: Any) -> Any:
        def pays(count: int, modules: int, answered: int = 0) -> bool:
            return count >= calls

        return pays

    return make


def _no_read_log(original: Any) -> Any:
    # the tracking classes without their __getattribute__: no read is logged, none keyed (wrong)
    def tracking_class(self: Any, cls: type) -> Any:
        made = original(self, cls)
        if made is None:
            return None
        return type(cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})

    return tracking_class


def _torch_classes_untracked(original: Any) -> Any:
    # torch.nn's own classes keyed as untracked ones are: every plain attribute, no read log
    def tracking_class(self: Any, cls: type) -> Any:
        if cls.__module__.startswith("torch.nn.modules."):
            return None
        return original(self, cls)

    return tracking_class


def _deferred_tables(original: Any) -> Any:
    # the tables booked on first read, as count_generation's forwards are (results.aggregate's ``deferred``)
    def aggregate(costed: Any, **kwargs: Any) -> Any:
        return original(costed, deferred=True, **kwargs)

    return aggregate


def _eager_tables(original: Any) -> Any:
    # the tables booked at once, as the default count did before branch deferbook
    def aggregate(costed: Any, **kwargs: Any) -> Any:
        return original(costed, **{**kwargs, "deferred": False})

    return aggregate


def _set_back_always(original: Any) -> Any:
    # the count before branch resnet9: the generators set back on every count's way out, and
    # numpy's key arrays compared elementwise
    @contextlib.contextmanager
    def preserved_random_modules(set_back: bool = True) -> Any:
        found = state.FoundRandom(state.random_states())
        try:
            yield found
        finally:
            if set_back:
                state.set_random_states(found.states)

    return preserved_random_modules


def _elementwise_comparison(original: Any) -> Any:
    def same_random_states(before: Any, after: Any) -> bool:
        if before[0] != after[0]:
            return False
        kind, keys, *rest = before[1]
        kind_after, keys_after, *rest_after = after[1]
        return kind == kind_after and rest == rest_after and bool((keys == keys_after).all())

    return same_random_states


def _containers_checked_all(original: Any) -> Any:
    # the first call's state check before branch resnet10: every attribute of every module asked
    # whether it is a container, a plain object or a generator (each int and tuple raising and
    # catching an error in ``plain_object``)
    def _containers(self: Any, order: List[Any]) -> List[Any]:
        found: List[Any] = []
        held = self._held_calls
        for module in order:
            state = vars(module)
            known = held.get(id(module))
            if known is None or known[0] != len(state):
                names = tuple([k for k, v in state.items()
                               if k not in reuse._SKIP and (reuse._container(v) or reuse.plain_object(v)
                                                            or reuse.random_generator(v))])
                known = held[id(module)] = (len(state), names)
            for name in known[1]:
                value = state.get(name)
                if reuse._container(value) or reuse.random_generator(value):
                    found.append((name, self._attribute(value)))
                elif reuse.plain_object(value):
                    found.append((name, self._object(value)))
        return found

    return _containers


def _eligible_in_full(original: Any) -> Any:
    # install's test of each module before branch resnet10: a leaf's dictionaries checked before its children
    def _eligible(self: Any, module: Any) -> bool:
        state = vars(module)
        return (module is not self._root and "forward" not in state and reuse._plain(state)
                and bool(dict.__len__(reuse.raw_children(state["_modules"]))))

    return _eligible


def _together(parts: List[Variant]) -> Variant:
    """Several variants on at once (``--only a+b``)."""
    if len(parts) == 1:
        return parts[0]

    def on() -> None:
        for part in parts:
            part.on()

    def off() -> None:
        for part in reversed(parts):
            part.off()

    return Variant(on, off, any(part.bound for part in parts))


def variants() -> Dict[str, Variant]:
    return {
        "reuse-off": _reuse_set("0"),
        "always-keyed": _reuse_set("always"),
        "nothing-wrapped": _swapped(reuse.Reuse, "_eligible", _nothing_wrapped),
        "none-keyed": _swapped(reuse, "_pays", _keyed_from(10**9)),
        "keyed-from-5": _swapped(reuse, "_pays", _keyed_from(5)),
        "keyed-from-3": _swapped(reuse, "_pays", _keyed_from(3)),
        "no-read-log": _swapped(reuse.Reuse, "_tracking_class", _no_read_log, bound=True),
        "torch-untracked": _swapped(reuse.Reuse, "_tracking_class", _torch_classes_untracked),
        "deferred": _swapped(analysis, "aggregate", _deferred_tables),
        "eager": _swapped(analysis, "aggregate", _eager_tables),
        "containers-checked-all": _swapped(reuse.Reuse, "_containers", _containers_checked_all),
        "eligible-in-full": _swapped(reuse.Reuse, "_eligible", _eligible_in_full),
        "set-back-always": _together([
            _swapped(tracers, "preserved_random_modules", _set_back_always),
            _swapped(tracers, "same_random_states", _elementwise_comparison),
        ]),
    }


def _cli_table(result: Any) -> str:
    # what ``flopcount count`` renders in its default format, the table
    from flopcount.report.render import render_count

    return render_count(result, "table", entry="model")


_READS: Dict[str, Callable[[Any], Any]] = {
    "by_module": lambda result: result.by_module(),
    "by_operator": lambda result: result.by_operator(),
    "to_dict": lambda result: result.to_dict(),
    "cli-table": _cli_table,
}


def _quartiles(values: List[float]) -> Tuple[float, float, float]:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 4], ordered[n // 2], ordered[(3 * n) // 4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", choices=sorted(_SHORT))
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    parser.add_argument("--read", default="", choices=["", *_READS],
                        help="read this of each result inside the timed region (default: nothing)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    known = variants()
    chosen = {name: _together([known[part] for part in name.split("+")]) for name in args.only.split(",")} if args.only else known
    (label, (model, inputs, _)), = _cases([args.model]).items()
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    read = _READS[args.read] if args.read else (lambda result: None)
    print(f"{label}, torch {torch.__version__}, 1 thread, {args.rounds} rounds, load {load}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}" + (f", each count read: {args.read}" if args.read else ""))
    base = count_flops(model, inputs).to_dict()
    for name, variant in chosen.items():
        variant.on()
        try:
            same = count_flops(model, inputs).to_dict() == base
        finally:
            variant.off()
        if not same and not variant.bound:
            raise SystemExit(f"variant {name} changed the result")
    names = ["base", *chosen]
    spent: Dict[str, List[float]] = {name: [] for name in names}
    gc.collect()
    gc.disable()
    try:
        for turn in range(args.rounds):
            for name in names if turn % 2 == 0 else names[::-1]:
                swapped = chosen.get(name)  # None: the base count
                if swapped is not None:
                    swapped.on()
                try:
                    start = time.thread_time()
                    read(count_flops(model, inputs))
                    spent[name].append(time.thread_time() - start)
                finally:
                    if swapped is not None:
                        swapped.off()
    finally:
        gc.enable()
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"{'variant':40s} {'median ms':>10s} {'ratio to base, paired: median (quartiles)':>44s}")
    for name in names:
        ratios = [mine / own for mine, own in zip(spent[name], spent["base"])]
        low, middle, high = _quartiles(ratios)
        note = "  (a bound: not exact)" if name in chosen and chosen[name].bound else ""
        print(f"{name:40s} {_quartiles(spent[name])[1] * 1e3:10.2f} {middle:22.3f} ({low:.3f}-{high:.3f}){note}")
    print(f"load at the end {load}")


if __name__ == "__main__":
    main()
