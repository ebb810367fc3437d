"""The ``flopcount`` argument parser: the subcommands, their options and help texts.
Imports no torch, so ``--help``, ``--version`` and argument errors answer at once."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import textwrap
from typing import Any, Dict, Iterable, List, NoReturn, Set, Tuple

from flopcount.budget.check import QUANTITY_EXAMPLES, parse_bytes, parse_quantity
from flopcount.cli.output import DefaultFormat
from flopcount.core.deprecation import renamed
from flopcount.errors import UsageError, did_you_mean
from flopcount.types import OPTIMIZERS, TRACERS, dtype_key

FORMATS = ("table", "tree", "json", "csv", "markdown", "html")
BENCH_DTYPES = ("float32", "float16", "bfloat16")


def _float_dtype(text: str) -> str:
    """A ``--dtype`` as its torch name, read as every dtype argument is (types.dtype_key: ``bf16``,
    as ``--input 1x8:bf16`` writes it, is bfloat16); a name it does not know is left for argparse's
    choices to name."""
    key = dtype_key(text)
    return key if key in BENCH_DTYPES else text

EXIT_OK, EXIT_BUDGET, EXIT_USAGE, EXIT_INCOMPLETE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: a bug in flopcount itself (never the user's input or model): says so, asks for a report
EXIT_INTERNAL = 4

_ENTRY_TEXT = """\
ENTRY
  package.module:attr     an importable module (the working directory is searched)
  path/to/file.py:attr    a Python file
      attr is an nn.Module, or a callable (factory or Module class) returning an
      nn.Module, a (module, example_inputs) pair or a (module, inputs, kwargs)
      triple; --config KEY=VALUE are passed to the callable as keyword arguments.
  hf:MODEL_TYPE           a transformers model from its default config, random
                          weights, no download (hf:gpt2, hf:bert, hf:llama);
                          --config KEY=VALUE overrides config fields
  tv:NAME                 torchvision.models.get_model(NAME, weights=None)
  example:NAME            an architecture shipped with flopcount, built from code:
                          resnet18, resnet50, mobilenet_v2, vit_b_16, vit_tiny
                          (and gpt2, bert, llama with transformers installed)
  model.pt2               a torch.export program (torch.export.save), counted on
                          its own example input shapes; --input overrides them
  model.pt                a TorchScript file (torch.jit.save); needs --input
  hf:./folder             a local Hugging Face config (a folder or config.json):
  hf:path/config.json     the class its "architectures" names, random weights
  A torch.save pickle (.pt/.pth of a module or state_dict) is refused: reading it
  could run code from the file.

SPEC
  dims joined by 'x', optional ':dtype' (default float32): 1x3x224x224, 1x128:int64.
  Integer inputs are token ids within the model's smallest nn.Embedding (0 or 1
  without one); integer or bool --kwarg inputs whose name contains 'mask' are ones.
  --kwarg NAME=VALUE passes a Python value instead of a tensor: int:3, float:0.5,
  bool:true, str:TEXT, none (0.5, 1e-3, true, false also bare; a bare 4 is a SPEC).
  Without --input: the factory's example inputs; 1x128:int64 for hf:, 1x3x224x224
  for tv:, the model's usual input for example: (1x3x224x224 for resnet50), the
  program's own input shapes for a .pt2.

Numbers accept K/M/G/T/P/E suffixes (10^3..10^18) and scientific notation: 25M,
5G, 1.5T, 2P, 3e9.

Exit codes: 0 ok; 1 a budget certainly exceeded (check); 2 usage error / bad
ENTRY / bad SPEC / model construction or forward failure (one line on stderr;
--debug for the traceback); 3 incomplete: check could not decide a FLOPs/MACs
budget because the count may be short (an op without a handler, a placeholder on
meta, work a tracer could not see; --allow-incomplete lets the count decide), or
--strict and an op without a handler ran.
"""

_MAIN_EPILOG = """\
examples:
  flopcount count example:resnet50 --depth 2
  flopcount count hf:gpt2 --config n_layer=2 --format json --output gpt2.json
  flopcount bench example:resnet18 --input 8x3x224x224 --iters 20
  flopcount check example:resnet50 --max-flops 10G --max-params 30M
  flopcount diff base.json my_model.py:build --format markdown
  flopcount check my_model.py:build --baseline base.json --max-growth flops=2%,params=0
  flopcount check example:resnet50 --max-latency 2ms --on h100 --bound any
  flopcount roofs --remeasure
  flopcount serve hf:llama --on h100,l4 --prompt 2048 --new 256 --batch 1,8,64

'flopcount COMMAND --help' describes each command.
"""

_COUNT_EPILOG = """\
examples:
  flopcount count example:resnet50 --depth 2
  flopcount count example:mobilenet_v2 --format tree --depth 1
  flopcount count hf:bert --config num_hidden_layers=2 --input 2x64:int64 --format json
  flopcount count hf:llama --device meta --input 1x4096:int64 --depth 1
  flopcount count my_model.py:build --input 4x16 --kwarg mask=4x16:bool --format csv -o costs.csv
  flopcount count example:resnet18 --backward --depth 1
  flopcount count example:resnet50 --plot flops.png
  flopcount count example:resnet50 --input 32x3x224x224 --memory --optimizer adamw --depth 1

""" + _ENTRY_TEXT

_BENCH_EPILOG = """\
examples:
  flopcount bench example:resnet18 --input 8x3x224x224
  flopcount bench example:resnet50 --warmup 5 --iters 50 --format json
  flopcount bench hf:gpt2 --config n_layer=4 --input 1x256:int64 --device cuda --dtype bfloat16
  flopcount bench example:vit_tiny --input 16x3x32x32 --plot latency.png

Times model(*inputs) under torch.inference_mode() after --warmup untimed calls
(default 10): exactly --iters calls, or calls until --duration seconds passed and
at least 10 ran (default 1 s), so a 2 s model takes about 20 calls = 40 s. After
the first warm-up call stderr says how long the whole run will take, and shows
progress through the warm-up and the timed calls; stdout holds only the report.
Throughput = batch / median; the batch is the first input's leading dimension
unless --batch-size says otherwise (the report names the dimension it took).

""" + _ENTRY_TEXT

_CHECK_EPILOG = """\
examples:
  flopcount check example:resnet50 --max-params 30M --max-flops 10G
  flopcount check example:resnet50 --max-size-mb 100 --max-latency-ms 200
  flopcount check example:resnet50 --input 64x3x224x224 --max-memory 16GB --optimizer adam
  flopcount check example:resnet50          # budgets from pyproject.toml
  flopcount count my_model.py:build --format json --output base.json     # the baseline, committed
  flopcount check my_model.py:build --baseline base.json --max-growth flops=2%,params=0,memory=5%
  flopcount check                           # ENTRY, input, baseline and budgets from pyproject.toml

Budgets come from the flags and from [tool.flopcount] in ./pyproject.toml (or
--config-file); a flag wins over the file:

  [tool.flopcount]
  max-params = "30M"
  max-flops = "10G"
  max-macs = 5e9
  max-size-mb = 100        # parameters + buffers, serialised, 1 MB = 10^6 bytes
  max-latency-s = 0.05     # median latency in seconds; runs the benchmark
  max-memory = "16GiB"     # estimated peak memory of one step (--backward,
                           # --optimizer adam: of a training step)

A budget passes when actual <= limit. Prints budget vs actual with PASS, FAIL or
INCOMPLETE and the verdict. FAIL (exit 1) only when certain: an exact value, or a
count that can only be short and is already over. A FLOPs/MACs budget on an
incomplete count is INCOMPLETE (exit 3) unless --allow-incomplete; a certain FAIL
wins over INCOMPLETE. Params, size and latency never depend on the count.

--baseline REPORT.json compares with a saved report (count --format json; with
--memory for a memory allowance): exit 1 when a metric grew past --max-growth
(N% of the baseline or an absolute amount, for params, flops, macs, bytes,
memory; default params=0,flops=0,macs=0), naming the modules that grew most;
exit 3 when either count is INCOMPLETE and nothing certainly failed. In
[tool.flopcount]: baseline = "base.json", max-growth = "flops=2%,params=0" (or a
table), entry = "my_model.py:build" and input = ["8x16"] for a bare
'flopcount check' (a pre-commit hook: docs/ci.md).

""" + _ENTRY_TEXT

_PROFILE_EPILOG = """\
examples:
  flopcount profile example:resnet18 --input 8x3x224x224
  flopcount profile example:resnet50 --by module --depth 2
  flopcount profile hf:bert --config num_hidden_layers=2 --input 2x64:int64 --format csv -o ops.csv
  flopcount profile example:resnet18 --backward --trace trace.json --plot roofline.png

Runs --steps real steps under torch.profiler (after --warmup untimed ones) and
joins every profiled op call with flopcount's cost of that same call: per op,
module and phase, FLOPs, bytes, time per step, achieved FLOP/s, intensity, the
roofline bound, the attainable time and the efficiency (attainable / time).
Ops with no FLOPs (gathers, copies, embedding) are listed as "data movement"
with their bandwidth, and drawn in their own panel of --plot. Marks: "!" roof
below achieved (a compute-bound op faster than its compute roof: the roof is
too low for it); "~" time apportioned from a fused kernel (no efficiency).
Roofs: measured once on this machine (cached in $XDG_CACHE_HOME/flopcount) or
--roofs PEAK_FLOPS,BANDWIDTH (e.g. 2T,100G). --trace writes the Chrome trace
with flops/bytes/efficiency in each op's args (Perfetto, TensorBoard).

""" + _ENTRY_TEXT

PROFILE_FORMATS = ("table", "json", "csv", "markdown", "html")
DIFF_FORMATS = ("table", "markdown", "json", "csv")

_DIFF_EPILOG = """\
examples:
  flopcount diff base.json head.json --format markdown >> "$GITHUB_STEP_SUMMARY"
  flopcount diff old_model.py:build new_model.py:build --input 8x3x224x224 --depth 2
  flopcount diff hf:llama hf:llama --device meta --input 1x4096:int64 \\
      --a-config num_hidden_layers=32 --b-config num_hidden_layers=40
  flopcount diff base.json my_model.py:build --top 5     # a saved report against the code

A and B: an ENTRY (every form count accepts, see below) or a saved report: a file
ending in .json that count --format json wrote (bench --format json adds the
latency, count --memory the peak memory). --input, --kwarg, --config, --device,
--seed, --tracer, --backward and --memory apply to each ENTRY side; --a-config,
--a-input, --a-kwarg (and --b-...) to one side only, over the shared ones. Rows:
B - A and (B - A) / A; 'new' marks a cost A did not have. Modules are matched by
path and type, so a renamed or retyped module is one removed and one added row.
The exit code is 0 whatever changed (use check --baseline to gate).

""" + _ENTRY_TEXT


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) instead of usage + message, and help texts
    (descriptions, epilogs) printed as written."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _DeprecatedFlag(argparse.Action):
    """A 0.2 flag kept for one release, hidden from ``--help``: stores into the new flag's
    ``dest`` and says the new spelling on stderr (docs/migration.md)."""

    def __init__(self, option_strings: Any, dest: str, new: str = "", **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        print(f"flopcount: warning: {renamed(option_string, self.new)}", file=sys.stderr, flush=True)
        setattr(namespace, self.dest, values)


def _type(parse: Any) -> Any:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _lazy_spec(name: str) -> Any:
    """A SPEC parser from flopcount.cli.specs, imported (with torch) only when a value is parsed."""

    def parse(text: str) -> Any:
        from flopcount.cli import specs

        return getattr(specs, name)(text)

    parse.__name__ = name
    return _type(parse)


#: check --baseline's allowances when none is given (flopcount.diffs.gate.DEFAULT_GROWTH)
DEFAULT_GROWTH_TEXT = "params=0,flops=0,macs=0"


def _growth(text: str) -> Any:
    from flopcount.diffs.gate import parse_growth

    return parse_growth(text, "allowance")


#: a budget's number (argparse names the flag before the message)
_QUANTITY = _type(lambda text: parse_quantity(text, "budget"))
_SIZE_MB = _type(lambda text: parse_quantity(text, "budget", examples=QUANTITY_EXAMPLES["max-size-mb"]))


def _latency_ms(text: str) -> Any:
    """``--max-latency-ms X``: a bare number of milliseconds, > 0 as ``--max-latency``'s (no run
    meets 0), refused in its words (``-5`` too, not as a negative count)."""
    value = parse_quantity(text.strip().lstrip("-"), "budget", examples=QUANTITY_EXAMPLES["max-latency-ms"])
    if value == 0 or text.strip().startswith("-"):
        raise UsageError(f"{text!r}: a latency budget must be > 0")
    return value


def _bytes(what: str) -> Any:
    """A size checked here, so argparse names the flag, and kept as written: ``check`` reads it
    (:func:`~flopcount.budget.check.parse_memory_budget`), where its warnings are said."""

    def parse(text: str) -> str:
        parse_bytes(text, what)
        return text

    return _type(parse)


#: torch reads counts and seeds as int64
_INT64_MAX = 2**63 - 1


def _int_at_least(low: int, what: str) -> Any:
    def parse(text: str) -> int:
        value: Any = None
        with contextlib.suppress(UsageError):  # int() is exact: parse_quantity goes through a float (2**63 - 1 would round up)
            value = int(text) if re.fullmatch(r"\s*\+?\d+\s*", text) else parse_quantity(text, what)
        if not isinstance(value, int) or value < low:
            raise UsageError(f"must be an integer >= {low}, got {text!r}")
        if value > _INT64_MAX:
            raise UsageError(f"must be at most {_INT64_MAX} (int64), got {text!r}")
        return value

    return _type(parse)


def _positive_float() -> Any:
    """A finite number > 0; argparse's error names the flag (``argument --duration: must be > 0 ...``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"must be a number, got {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise UsageError(f"must be > 0, got {text!r}")
        return value

    return _type(parse)


_DURATION_UNITS = {"s": 1e3, "ms": 1.0, "us": 1e-3, "µs": 1e-3, "ns": 1e-6}


def pairs_once(pairs: Iterable[Tuple[str, Any]], flag: str) -> Dict[str, Any]:
    """``{key: value}`` of repeatable ``KEY=VALUE`` options (``--config``, ``--kwarg``): a key
    given twice is a usage error naming ``flag``."""
    found: Dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise UsageError(f"{flag} {key} is given twice")
        found[key] = value
    return found


def parse_duration_ms(text: str) -> float:
    """``"10ms" -> 10.0``, ``"2s" -> 2000.0``, ``"500us" -> 0.5``. The unit is required: a
    bare number is refused (``--max-latency-ms`` takes a bare number of milliseconds)."""
    raw = str(text).strip().lower()
    unit = next((u for u in sorted(_DURATION_UNITS, key=len, reverse=True) if raw.endswith(u)), None)
    try:
        value = float(raw[: -len(unit)] if unit else raw) * (_DURATION_UNITS[unit] if unit else 1.0)
    except ValueError:
        raise UsageError(f"{text!r} is not a duration (examples: 10ms, 2.5s, 800us)") from None
    if unit is None:
        raise UsageError(
            f"{text!r} has no unit: write it with one (s, ms, us, ns), e.g. {raw}ms, or give milliseconds to --max-latency-ms"
        )
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{text!r}: a latency budget must be > 0")
    return value


#: what a user who knows the Python API types, and the command that does it
_COMMAND_OF = {
    "predict": "flopcount.predict()'s bounds are `flopcount count ENTRY --on PART` (a gate: `check ENTRY --max-latency T --on PART`)",
    "benchmark": "flopcount.benchmark() is `flopcount bench ENTRY`",
    "latency": "a measured latency is `flopcount bench ENTRY`, a bound on a part `flopcount count ENTRY --on PART`",
    "estimate_memory": "flopcount.estimate_memory() is `flopcount count ENTRY --memory` (a training step: --optimizer adam)",
    "memory": "peak memory is `flopcount count ENTRY --memory` (a training step: --optimizer adam)",
    "count_generation": "flopcount.count_generation() is `flopcount count ENTRY --generate N --input BxP:int64`",
    "generate": "generate()'s cost is `flopcount count ENTRY --generate N --input BxP:int64`",
}


def parse_command_line(parser: argparse.ArgumentParser, argv: List[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that arguments no option takes are refused by the
    command's own parser (``flopcount bench: error: unrecognized arguments: --runs 5; did you
    mean --iters? (see flopcount bench --help)``): argparse's top level named neither. A
    command that is an API function's name says which command does its work
    (:data:`_COMMAND_OF`)."""
    commands = _command_parsers(parser)
    first = next((token for token in argv if not token.startswith("-")), None)
    if first is not None and first not in commands and first in _COMMAND_OF:
        parser.error(f"no command {first!r}: {_COMMAND_OF[first]} (commands: {', '.join(commands)})")
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    command = _command_parsers(parser).get(getattr(args, "command", None) or "", parser)
    flags = [flag for action in command._actions for flag in action.option_strings if flag.startswith("--")]
    unknown = next((token.split("=")[0] for token in extra if token.startswith("--")), "")
    hint = did_you_mean(unknown, flags) if unknown else ""
    command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def _command_parsers(parser: argparse.ArgumentParser) -> Dict[str, argparse.ArgumentParser]:
    """The subcommands' parsers by name (count, bench, ...)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def join_negative_values(parser: argparse.ArgumentParser, argv: List[str]) -> List[str]:
    """``--max-latency -5ms`` -> ``--max-latency=-5ms``: argparse reads a value that starts
    with ``-`` (and is not a plain negative number) as an option and answers "expected one
    argument"; joined, the value reaches its own check and is refused by name."""
    takes_value: Set[str] = set()
    actions: List[argparse.Action] = list(parser._actions)
    while actions:
        action = actions.pop()
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                actions.extend(sub._actions)
        elif action.option_strings and action.nargs is None:
            takes_value.update(action.option_strings)
    joined: List[str] = []
    index = 0
    while index < len(argv):
        token, following = argv[index], argv[index + 1: index + 2]
        if token == "--":
            return joined + argv[index:]
        if token in takes_value and following and re.match(r"-[\d.]", following[0]):
            token, index = f"{token}={following[0]}", index + 1
        joined.append(token)
        index += 1
    return joined


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=80)


def build_parser() -> argparse.ArgumentParser:
    """The ``flopcount`` argument parser (count, bench, check, diff, profile, plan, serve, roofs)."""
    from flopcount import __version__

    parser = _Parser(
        prog="flopcount",
        description="FLOPs, MACs, parameters and latency of PyTorch models, per operator and per module.",
        epilog=_MAIN_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"flopcount {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    count = commands.add_parser(
        "count",
        help="count FLOPs, MACs and parameters per module and operator",
        description=_wrap("Count FLOPs, MACs and parameters of one forward (and optionally backward) pass, per module "
        "and per operator. Convention: 1 MAC = 2 FLOPs; MACs count contraction ops only."),
        epilog=_COUNT_EPILOG,
    )
    _add_common(count)
    count.add_argument("--backward", action="store_true", help="also count the backward pass of sum(outputs) (dispatch tracer)")
    _add_eval(count)
    count.add_argument("--operators", action="store_true", help="also print the per-operator table (table and markdown formats)")
    count.add_argument("--strict", action="store_true", help="exit 3 when an op without a handler ran (the report is still printed)")
    count.add_argument("--on", metavar="PART", default=None,
                       help="also give the roofline latency lower bound on the modeled PART (h100, h200, a100, l4, t4, "
                       "'this machine'; no hardware needed)")
    count.add_argument("--predict", dest="on", action=_DeprecatedFlag, new="--on", metavar="PART")
    _add_math_modes(count)
    count.add_argument("--generate", type=_int_at_least(1, "--generate"), default=None, metavar="N",
                       help="count greedy generate() of N new tokens instead: prefill over the --input prompt, then N-1 "
                       "decode steps through the KV cache (transformers models; docs/llm.md)")
    count.add_argument("--dtype", type=_float_dtype, choices=BENCH_DTYPES, default=None,
                       help="cast the model's floating parameters and buffers and the floating inputs to this dtype first: "
                       "the weights MB, --memory and the KV cache of --generate follow it (default: the model's own)")
    count.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                       help="count a training step: forward, backward and one step of this optimizer (phase 'optimizer'; "
                       "implies --backward); with --memory its state is in the peak too")
    count.add_argument("--tensorboard", metavar="DIR", default=None,
                       help="also write the totals and per-module FLOPs (to --depth, default 1) as TensorBoard scalars and "
                       "the tables as text into DIR; needs flopcount[tensorboard]")
    memory = count.add_argument_group("peak memory (estimated on fake tensors: no data allocated)")
    memory.add_argument("--memory", action="store_true",
                        help="also estimate the peak memory of the step (inference, or forward + backward with --backward, "
                        "plus the optimizer step with --optimizer)")

    bench = commands.add_parser(
        "bench",
        help="measure latency and throughput (plus FLOPs and achieved FLOP/s)",
        description=_wrap("Measure the latency of the model's forward: median, mean, p90, p99, min, max, std and "
        "throughput, with FLOPs and achieved FLOP/s."),
        epilog=_BENCH_EPILOG,
    )
    _add_common(bench)
    _add_timing(bench)

    check = commands.add_parser(
        "check",
        help="check budgets (params, FLOPs, MACs, size, latency, memory) or growth against a --baseline report; exit 1 when one is exceeded, 3 when incomplete",
        description=_wrap("Compare the model with budgets from flags or [tool.flopcount] in pyproject.toml; print "
        "budget vs actual with PASS/FAIL/INCOMPLETE; exit 1 when a budget is exceeded, 3 when an incomplete count cannot "
        "decide. Made for CI gates."),
        epilog=_CHECK_EPILOG,
    )
    _add_common(check, optional_entry=True)
    limits = check.add_argument_group("budgets (K/M/G/T/P/E suffixes and 1e9 notation accepted)")
    limits.add_argument("--max-params", type=_QUANTITY, metavar="N", help="most parameters, e.g. 25M")
    limits.add_argument("--max-flops", type=_QUANTITY, metavar="N", help="most FLOPs of one forward, e.g. 5G")
    limits.add_argument("--max-macs", type=_QUANTITY, metavar="N", help="most MACs of one forward, e.g. 2.5G")
    limits.add_argument("--max-size-mb", type=_SIZE_MB, metavar="X", help="most MB (1 MB = 10^6 bytes) of parameters + buffers, as the count's 'weights' line")
    limits.add_argument("--max-latency-ms", type=_type(_latency_ms), metavar="X", help="highest median latency in ms (runs the benchmark)")
    limits.add_argument("--max-latency", type=_type(parse_duration_ms), metavar="TIME", dest="max_latency",
                        help="highest latency with its unit (s, ms, us, ns), e.g. 10ms or 2.5s; a bare number is refused: measured "
                        "(median), or with --on PART its roofline lower bound")
    limits.add_argument("--on", metavar="PART", default=None,
                        help="check the latency budget against the lower bound on PART (h100, 'H100 NVL', t4, "
                        "'this machine', ...; no hardware needed): above the budget is a certain FAIL, below it is not "
                        "decided without measuring (exit 3)")
    limits.add_argument("--bound", choices=("eager", "any"), default=None,
                        help="with --on: which lower bound decides: 'eager' (the per-op sum: this eager program) or "
                        "'any' (max of total FLOPs / peak and unavoidable bytes / bandwidth: any engine, fused or "
                        "not). Default: any on a datasheet part, eager on 'this machine'")
    _add_math_modes(limits)
    limits.add_argument("--max-memory", type=_bytes("budget"), metavar="BYTES",
                        help="highest estimated peak memory of one step, e.g. 16GB (10^9) or 16GiB (2^30)")
    limits.add_argument("--backward", action="store_true",
                        help="the memory budget covers a training step (forward + backward), not inference")
    limits.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                        help="for --max-memory: add this optimizer's step and state (implies --backward)")
    _add_eval(limits)
    limits.add_argument("--config-file", metavar="PATH", help="read [tool.flopcount] from this TOML file instead of ./pyproject.toml")
    gate = check.add_argument_group("baseline gate (a saved report: count --format json --output base.json)")
    gate.add_argument("--baseline", metavar="REPORT.json", default=None,
                      help="compare with this saved report: exit 1 when a metric grew past its --max-growth allowance")
    gate.add_argument("--max-growth", metavar="SPEC", default=None, type=_type(_growth),
                      help="allowed growth over the baseline, e.g. flops=2%%,params=0,memory=5%% (metrics: params, flops, macs, "
                      f"bytes, memory; N%% or an absolute amount; default {DEFAULT_GROWTH_TEXT}, or max-growth in [tool.flopcount])")
    verdict = check.add_argument_group("incomplete counts")
    verdict.add_argument("--allow-incomplete", action="store_true",
                         help="let an incomplete count decide FLOPs/MACs budgets (PASS/FAIL) instead of exiting 3")
    verdict.add_argument("--strict", action="store_true", help="exit 3 when an op without a handler ran, even with --allow-incomplete")
    sharded = check.add_argument_group("sharded training (with --max-memory: the per-rank peak, as flopcount plan)")
    _add_ranks(sharded)
    _add_timing(check)

    differ = commands.add_parser(
        "diff",
        help="compare two models or saved reports: params, MACs, FLOPs, bytes per module and operator",
        description=_wrap("Compare A with B: two ENTRYs, two saved reports (count --format json), or one of each. "
        "Modules are matched by path and type (added, removed, changed), operators by name; each row gives B - A "
        "and (B - A) / A of params, MACs, FLOPs and bytes, the totals also peak memory and latency when both reports "
        "hold them. --format markdown is a pull-request comment."),
        epilog=_DIFF_EPILOG,
    )
    differ.add_argument("a", metavar="A", help="the before side: an ENTRY (as count takes) or a saved report REPORT.json")
    differ.add_argument("b", metavar="B", help="the after side: an ENTRY or a saved report")
    both = differ.add_argument_group("inputs of both sides (ENTRY sides only)")
    both.add_argument("-i", "--input", dest="inputs", action="append", default=[], type=_lazy_spec("parse_spec"), metavar="SPEC",
                      help="a positional input tensor of both models, e.g. 1x128:int64 (repeat for several)")
    both.add_argument("--kwarg", dest="kwargs", action="append", default=[], type=_lazy_spec("parse_kwarg"), metavar="NAME=SPEC",
                      help="a keyword input tensor of both models (repeatable)")
    both.add_argument("--config", dest="config", action="append", default=[], type=_lazy_spec("parse_config_value"), metavar="KEY=VALUE",
                      help="hf: config override or factory keyword for both sides (repeatable)")
    both.add_argument("--device", default="cpu", metavar="D", help="cpu (default), cuda, cuda:N, or meta (shapes only)")
    both.add_argument("--seed", type=_int_at_least(0, "--seed"), default=0, metavar="N", help="seed of the random example inputs (default 0)")
    both.add_argument("--tracer", choices=TRACERS, default="auto", help="auto (default), jit or dispatch")
    both.add_argument("--backward", action="store_true", help="count forward + backward on both sides")
    both.add_argument("--memory", action="store_true", help="also estimate each side's peak memory and diff it")
    _add_eval(both)
    for side, name in (("a", "A"), ("b", "B")):
        own = differ.add_argument_group(f"{name} only (wins over the options of both sides)")
        own.add_argument(f"--{side}-input", dest=f"{side}_inputs", action="append", default=[], type=_lazy_spec("parse_spec"),
                         metavar="SPEC", help=f"{name}'s positional inputs instead of --input")
        own.add_argument(f"--{side}-kwarg", dest=f"{side}_kwargs", action="append", default=[], type=_lazy_spec("parse_kwarg"),
                         metavar="NAME=SPEC", help=f"a keyword input of {name} (over --kwarg of the same name)")
        own.add_argument(f"--{side}-config", dest=f"{side}_config", action="append", default=[], type=_lazy_spec("parse_config_value"),
                         metavar="KEY=VALUE", help=f"a config override of {name} (over --config of the same key)")
    shown = differ.add_argument_group("output")
    shown.add_argument("--depth", type=_int_at_least(0, "--depth"), default=None, metavar="N",
                       help="module rows down to depth N (0 = whole model; default: all)")
    shown.add_argument("--top", type=_int_at_least(1, "--top"), default=None, metavar="N",
                       help="only the N largest module changes (table; markdown shows 10 unless given, the rest folded)")
    _add_format(shown, DIFF_FORMATS, "table (default), markdown, json or csv")
    _add_quiet(shown)

    prof = commands.add_parser(
        "profile",
        help="time every op for real and join it with its cost: per-op roofline and efficiency",
        description=_wrap("Profile real steps under torch.profiler and join every op call with its counted FLOPs "
        "and bytes: time, achieved FLOP/s, intensity, roofline bound and efficiency per op, operator or module."),
        epilog=_PROFILE_EPILOG,
    )
    _add_common(prof, formats=PROFILE_FORMATS)
    shape = prof.add_argument_group("profiling")
    shape.add_argument("--backward", action="store_true", help="profile a training step: forward + backward of sum(outputs)")
    _add_eval(shape)
    shape.add_argument("--steps", type=_int_at_least(1, "--steps"), default=5, metavar="N", help="profiled steps (default 5)")
    shape.add_argument("--warmup", type=_int_at_least(0, "--warmup"), default=2, metavar="N", help="untimed steps first (default 2)")
    shape.add_argument("--by", choices=("operator", "module", "op"), default="operator",
                       help="rows per operator (default), per module (children included) or per op in its module and phase")
    shape.add_argument("--top", type=_int_at_least(1, "--top"), default=25, metavar="N", help="rows in the table (default 25)")
    shape.add_argument("--trace", metavar="PATH.json", help="also write the Chrome trace with each op's flops, bytes and efficiency")
    shape.add_argument("--tensorboard", metavar="DIR", default=None,
                       help="also write the step time, FLOP/s and the top operators' time and efficiency as TensorBoard "
                       "scalars, the table as text, and the trace where the PyTorch Profiler plugin finds it; "
                       "needs flopcount[tensorboard]")
    shape.add_argument("--roofs", metavar="FLOPS,BW", default=None,
                       help="roofs as peak FLOP/s and bandwidth in bytes/s, e.g. 2T,100G (default: measured here, cached)")
    planner = commands.add_parser(
        "plan",
        help="per-rank FLOPs, memory and communication of FSDP / tensor-parallel training",
        description=_wrap("Plan one training step sharded over --fsdp x --tp ranks on torch's own FSDP2 and "
        "tensor parallelism, in a fake world of that many ranks in this process (nothing allocated, nothing sent): "
        "rank 0's FLOPs by phase, peak memory, collectives and step-time bounds. See docs/parallel.md."),
        epilog="examples:\n  flopcount plan hf:llama --fsdp 8 --tp 2 --input 1x4096:int64 --on h100 --link nvlink4\n"
        "  flopcount plan hf:llama --config num_hidden_layers=4 --fsdp 64 --tp 8 --link dp=infiniband-ndr,tp=nvlink4",
    )
    _add_model_args(planner, "one rank's micro-batch", example="1x4096:int64")
    setup = planner.add_argument_group("the cluster")
    _add_ranks(setup)
    setup.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw", help="the optimizer step counted (default adamw)")
    setup.add_argument("--dtype", type=_float_dtype, choices=("float32", "bfloat16", "float16"), default=None, help="cast the model to this dtype (default: as built)")
    setup.add_argument("--mixed-precision", type=_float_dtype, choices=("bfloat16", "float16"), default=None,
                       help="FSDP2 computes in this dtype, reduces grads in float32; params and optimizer state keep theirs")
    setup.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                       help="process-group backend whose collective buffers the peak holds: nccl (in place; default) "
                       "or gloo (its reduce-scatter holds a copy of its input)")
    setup.add_argument("--on", default="h100", metavar="PART", help="the modeled GPU of the step-time roofline (default h100)")
    setup.add_argument("--device", dest="on", action=_DeprecatedFlag, new="--on", metavar="PART")
    setup.add_argument("--link", default=None, metavar="LINK",
                       help="nvlink4, nvlink3, pcie5, pcie4, infiniband-ndr, infiniband-hdr..., bytes/s, or dp=LINK,tp=LINK")
    out = planner.add_argument_group("output")
    _add_format(out, ("table", "json", "markdown"), "table (default), json or markdown")
    _add_quiet(out)

    server = commands.add_parser(
        "serve",
        help="LLM serving bounds on a part: time to first token, tokens/s ceilings, KV capacity",
        description=_wrap("Count what generate() runs for a --prompt-token prompt and --new tokens (the model's own "
        "forwards and cache, on the meta device: nothing allocated) and price it on each --on part at each --batch size: "
        "the time-to-first-token and inter-token latency lower bounds, decode tokens/s ceilings per sequence and in "
        "total, the batch at which decode turns compute-bound, weights, KV cache per sequence and the largest batch "
        "that fits the part's memory less --reserve. Bounds hold for any implementation; they leave out scheduling, "
        "paging, the batching policy, kernel launch and host overheads and speculative decoding. See docs/llm.md."),
        epilog="examples:\n  flopcount serve hf:llama --on h100 --prompt 2048 --new 256 --batch 1,8,64\n"
        "  flopcount serve hf:mixtral --dtype bfloat16 --on h100,l4 --weight-dtype int8 --tp 2 --plot serve.png",
    )
    server.add_argument("entry", metavar="ENTRY", help="the model: hf:MODEL_TYPE, hf:./folder, module:attr, file.py:attr "
                        "(a causal LM or encoder-decoder transformers model; built on the meta device)")
    server.add_argument("--config", dest="config", action="append", default=[], type=_lazy_spec("parse_config_value"),
                        metavar="KEY=VALUE", help="hf: config override, or keyword argument of a factory (repeatable)")
    shape_of = server.add_argument_group("the workload and the part")
    shape_of.add_argument("--on", default="h100", metavar="PARTS",
                          help="part(s), comma-separated: h100, h200, 'a100 40gb', l4, t4, 'this machine'... (default h100)")
    shape_of.add_argument("--prompt", type=_int_at_least(1, "--prompt"), default=None, metavar="P",
                          help="prompt tokens per sequence (default 2048; with --prompt-lengths, the longest)")
    shape_of.add_argument("--prompt-lengths", default=None, metavar="L[,L...]",
                          help="a padded batch: each prompt's real tokens, left-padded to --prompt; each sequence is "
                          "priced at its own tokens, as a varlen/paged engine runs it, and any --batch as sequences "
                          "of their mean (default --batch: one per length)")
    shape_of.add_argument("--new", type=_int_at_least(1, "--new"), default=256, metavar="N",
                          help="new tokens per sequence (default 256)")
    shape_of.add_argument("--batch", default=None, metavar="B[,B...]",
                          help="batch sizes to price, e.g. 1,8,64 (default 1, or the --prompt-lengths given)")
    shape_of.add_argument("--dtype", type=_float_dtype, choices=("float32", "bfloat16", "float16"), default=None,
                          help="cast the model to this compute dtype first (default: as built)")
    shape_of.add_argument("--weight-dtype", default=None, metavar="DTYPE",
                          help="weights stored as int8, int4 or fp8 weight-only quantization stores them (scales "
                          "included), or a float dtype (default: the compute dtype)")
    shape_of.add_argument("--tp", type=_int_at_least(1, "--tp"), default=1, metavar="N",
                          help="tensor-parallel ranks: per-rank work plus two all-reduces per layer over the part's link")
    shape_of.add_argument("--reserve", type=float, default=0.10, metavar="FRACTION",
                          help="share of the part's memory kept back (default 0.10, vLLM's gpu_memory_utilization=0.9)")
    _add_math_modes(shape_of)
    out = server.add_argument_group("output")
    _add_format(out, ("table", "json", "markdown"), "table (default), json or markdown")
    out.add_argument("--plot", metavar="FILE.png", help="draw the tokens/s ceiling against batch with each part's memory "
                     "wall; needs flopcount[plot]")
    _add_quiet(out)

    roofs = commands.add_parser(
        "roofs",
        help="the roofs a bound uses: this machine's (measured, cached) or a datasheet part's",
        description=_wrap("Show the roofs predict, profile, plan and check --on use: this machine's compute roof per "
        "dtype (the best of a GEMM, a oneDNN convolution and a linear) under its ISA peak, and bandwidth per memory "
        "level (streams sized to each cache), with when and how they were measured; or a datasheet part's dense "
        "peaks, memory levels and math modes. Roofs measured while the load average exceeds the cores, or that fail "
        "the sanity checks, are shown but never cached. Set FLOPCOUNT_NO_ROOFS_CACHE=1 to neither read nor write "
        "the cache (~/.cache/flopcount/roofs.json). See docs/devices.md."),
        epilog="examples:\n  flopcount roofs\n  flopcount roofs --remeasure\n  flopcount roofs 'H100 NVL' --format json",
    )
    roofs.add_argument("part", nargs="?", default="this machine", metavar="PART",
                       help="'this machine' (default) or a part: h100, 'H100 NVL', 'A100 40GB PCIe', t4, ...")
    roofs.add_argument("--remeasure", action="store_true",
                       help="measure this machine's roofs again now (the cache keeps the best sane figures)")
    _add_math_modes(roofs)
    _add_format(roofs, ("table", "json"), "table (default) or json")
    _add_quiet(roofs)
    return parser


def _add_model_args(p: argparse.ArgumentParser, title: str, *, example: str, see_below: bool = False, optional_entry: bool = False) -> Any:
    """ENTRY, then ``--input``/``--kwarg``/``--config`` in a group named ``title`` (returned,
    so a command can add more inputs to it): the one spelling every command reads a model with."""
    help_text = ("the model: module:attr, file.py:attr, hf:MODEL_TYPE, hf:./folder, tv:NAME, example:NAME, "
                 "model.pt2 or a TorchScript file" + (" (see below)" if see_below else ""))
    optional: Dict[str, Any] = {"nargs": "?", "default": None} if optional_entry else {}
    p.add_argument("entry", metavar="ENTRY", **optional, help=help_text + (
        "; default: entry = \"...\" in [tool.flopcount] (with its input = [SPEC, ...])" if optional_entry else ""))
    inputs = p.add_argument_group(title)
    inputs.add_argument("-i", "--input", dest="inputs", action="append", default=[], type=_lazy_spec("parse_spec"), metavar="SPEC",
                        help=f"a positional input tensor, e.g. {example} (repeat for several)")
    inputs.add_argument("--kwarg", dest="kwargs", action="append", default=[], type=_lazy_spec("parse_kwarg"), metavar="NAME=SPEC",
                        help="a keyword input: a tensor SPEC, e.g. attention_mask=1x128:int64, or a Python value: int:3, float:0.5, "
                        "bool:true, str:TEXT, none (bare 0.5, true, false also; a bare integer is a 1-D SPEC) (repeatable)")
    inputs.add_argument("--config", dest="config", action="append", default=[], type=_lazy_spec("parse_config_value"), metavar="KEY=VALUE",
                        help="hf: config override, or keyword argument of a factory (int/float/bool/str; repeatable)")
    return inputs


def _add_format(group: Any, formats: Any, help_text: str) -> None:
    default = DefaultFormat("table")
    default.formats = tuple(formats)
    group.add_argument("-f", "--format", choices=formats, default=default, help=help_text)
    group.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout; without "
                       "--format its suffix picks the format (.json, .csv, .md, .html), else table")


def _add_math_modes(group: Any) -> None:
    """``--matmul-tf32`` and ``--no-conv-tf32``: the modeled part's float32 math modes, one
    meaning for ``roofs PART`` and the bounds of ``count``, ``check`` and ``serve --on``."""
    group.add_argument("--matmul-tf32", action="store_true",
                       help="the part runs float32 matmuls in TF32 (TensorRT's default, torch with allow_tf32; "
                       "default: FP32, torch's default); float32 attention takes the faster of this and 3xTF32")
    group.add_argument("--no-conv-tf32", action="store_true",
                       help="the part runs float32 convolutions and RNN layers in FP32 (cuDNN's flag; default: "
                       "TF32, cuDNN's default in torch)")


def _add_quiet(group: Any, help_text: str = "no progress or warnings on stderr") -> None:
    """``-q``, ``--debug`` and ``--timeout``: every command's last three options."""
    group.add_argument("-q", "--quiet", action="store_true", help=help_text)
    group.add_argument("--debug", action="store_true", help="show tracebacks and all warnings")
    group.add_argument("--timeout", type=_positive_float(), default=None, metavar="SECONDS",
                       help="stop after SECONDS (exit 2), naming what was still running: the ENTRY's import or factory, "
                       "the forward, the benchmark... (POSIX, SIGALRM in the main thread; default: no limit)")


def _add_eval(group: Any) -> None:
    group.add_argument("--eval", action="store_true", dest="eval_mode",
                       help="run the training step (--backward, --optimizer) with the model in eval() mode (BatchNorm "
                       "on running statistics, dropout off); default: train() mode, as a training step runs")


def _add_ranks(group: Any) -> None:
    group.add_argument("--fsdp", type=_int_at_least(1, "--fsdp"), default=None, metavar="N", help="FSDP2 ranks (default 1)")
    group.add_argument("--tp", type=_int_at_least(1, "--tp"), default=None, metavar="N", help="tensor-parallel ranks (default 1)")


def _add_common(p: argparse.ArgumentParser, formats: Any = FORMATS, optional_entry: bool = False) -> None:
    inputs = _add_model_args(p, "inputs", example="1x3x224x224 or 1x128:int64", see_below=True, optional_entry=optional_entry)
    inputs.add_argument("--device", default="cpu", metavar="D",
                        help="cpu (default), cuda, cuda:N, or meta (shapes only: no memory, dispatch tracer)")
    inputs.add_argument("--seed", type=_int_at_least(0, "--seed"), default=0, metavar="N", help="seed of the random example inputs (default 0)")

    run = p.add_argument_group("counting and output")
    run.add_argument("--tracer", choices=TRACERS, default="auto", help="auto (default: dispatch on fake copies, one real run if a value is needed), jit or dispatch")
    run.add_argument("--depth", type=_int_at_least(0, "--depth"), default=None, metavar="N",
                     help="module rows down to depth N (0 = whole model; default: all)")
    _add_format(run, formats, "table (default), tree, json, csv, markdown or html (one self-contained page: tables, tree, plot)")
    run.add_argument("--plot", metavar="FILE.png", help="also draw FLOPs by module (and latency, for bench) into an image; needs flopcount[plot]")
    run.add_argument("--plot-kind", choices=("bars", "sunburst"), default=None,  # None: not given (bars)
                     help="bars (default: the top modules) or sunburst (rings by depth, --depth rings, default 3)")
    run.add_argument("--plot-top", type=_int_at_least(1, "--plot-top"), default=None, metavar="N",
                     help="modules in the plot (default 15); profile: operators labelled on the roofline (default 6)")
    _add_quiet(run, "no progress or warnings on stderr (INCOMPLETE reasons are still printed)")


def _add_timing(p: argparse.ArgumentParser) -> None:
    timing = p.add_argument_group("timing")
    timing.add_argument("--warmup", type=_int_at_least(0, "--warmup"), default=10, metavar="N", help="untimed calls first (default 10)")
    timing.add_argument("--iters", type=_int_at_least(1, "--iters"), default=None, metavar="N",
                        help="time exactly N calls (default: adaptive, see --duration; not with --duration)")
    timing.add_argument("--duration", type=_positive_float(), default=None, metavar="S",
                        help="time calls until S seconds passed and at least 10 ran (default 1; not with --iters)")
    timing.add_argument("--batch-size", type=_int_at_least(1, "--batch-size"), default=None, metavar="N",
                        help="samples per call for throughput (default: the first input's leading dimension)")
    timing.add_argument("--dtype", type=_float_dtype, choices=BENCH_DTYPES, default=None, help="run under torch.autocast with this dtype (default: the model's own)")
