"""Text the CLI accepts, parsed into plain data: input SPECs (``1x3x224x224:float16``)
and ``key=value`` options (``--config`` applied to a Hugging Face config: :func:`config_with`);
what a loaded ENTRY says about its inputs (:class:`LoadedEntry`); plus making example tensors
from SPECs (token ids within the embedding's range). Quantities (``25M``) are parsed by :func:`flopcount.budget.check.parse_quantity`."""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from flopcount.cli.output import one_line
from flopcount.core.dtypes import parse_dtype
from flopcount.errors import UsageError, did_you_mean
from flopcount.types import dtype_name

#: torch sizes, strides, seeds and byte counts are int64
INT64_MAX = 2**63 - 1

SPEC_HELP = "SPEC is dims joined by 'x' with an optional ':dtype', e.g. 1x3x224x224 or 1x128:int64"


@dataclass(frozen=True)
class InputSpec:
    """Shape and dtype of one example tensor."""

    shape: Tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def __str__(self) -> str:
        return "x".join(map(str, self.shape)) + ("" if self.dtype == torch.float32 else f":{dtype_name(self.dtype)}")


def parse_spec(text: str) -> InputSpec:
    """``"1x3x224x224" -> InputSpec((1, 3, 224, 224), float32)``; ``"1x128:int64"``.

    Every dimension must be a positive integer; ``"x"`` separates them (``*`` and
    ``,`` are accepted too)."""
    raw = text
    text = text.strip()
    if not text:
        raise UsageError(f"bad input SPEC {raw!r}: empty; {SPEC_HELP}")
    dims_text, sep, dtype_text = text.partition(":")
    if sep and not dtype_text.strip():
        raise UsageError(f"bad input SPEC {raw!r}: nothing after ':'; {SPEC_HELP}")
    dtype = parse_dtype(dtype_text, f"bad input SPEC {raw!r}: the dtype") if sep else torch.float32
    parts = re.split(r"[xX*,]", dims_text.strip())
    shape = []
    for part in parts:
        part = part.strip()
        if not re.fullmatch(r"[+-]?\d+", part):
            shown = part if part else "(empty)"
            raise UsageError(f"bad input SPEC {raw!r}: dimension {shown!r} is not an integer; {SPEC_HELP}")
        dim = int(part)
        if dim <= 0:
            raise UsageError(f"bad input SPEC {raw!r}: dimension {dim} must be >= 1; {SPEC_HELP}")
        if dim > INT64_MAX:
            raise UsageError(f"bad input SPEC {raw!r}: dimension {dim} is beyond int64 (at most {INT64_MAX}); {SPEC_HELP}")
        shape.append(dim)
    numel = math.prod(shape)
    if numel * torch.empty((), dtype=dtype).element_size() > INT64_MAX:
        raise UsageError(f"bad input SPEC {raw!r}: {numel} elements of {dtype_name(dtype)} are beyond int64 bytes; {SPEC_HELP}")
    return InputSpec(tuple(shape), dtype)


@dataclass(frozen=True)
class ScalarArg:
    """A keyword argument that is a plain Python value (``--kwarg scale=float:0.5``)."""

    value: Union[bool, int, float, str, None]

    def __str__(self) -> str:
        if self.value is None:
            return "none"
        kind = type(self.value).__name__
        return f"{kind}:{str(self.value).lower() if isinstance(self.value, bool) else self.value}"


_SCALAR_KINDS = ("int", "float", "bool", "str")
KWARG_HELP = (
    "expected NAME=SPEC (a tensor, e.g. attention_mask=1x128:int64) or NAME=VALUE (a Python value: int:3, "
    "float:0.5, bool:true, str:TEXT, none; 0.5, true, false written bare)"
)


def _scalar(text: str, raw: str) -> Optional[ScalarArg]:
    """The Python value ``text`` spells, or None when it is not a scalar (then it is a SPEC).
    Typed ``int:3``, ``float:0.5``, ``bool:true``, ``str:TEXT``; bare ``true``/``false``/``none``
    and numbers with a point or an exponent. A bare integer stays a SPEC (``4`` is a 1-D shape)."""
    value = text.strip()
    kind, sep, rest = value.partition(":")
    if sep and kind.strip().lower() in _SCALAR_KINDS:
        kind, rest = kind.strip().lower(), rest if kind.strip().lower() == "str" else rest.strip()
        try:
            if kind == "int":
                return ScalarArg(int(rest))
            if kind == "float":
                return ScalarArg(float(rest))
            if kind == "bool":
                if rest.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(rest)
                return ScalarArg(rest.lower() in ("true", "1"))
        except ValueError:
            article = "an" if kind == "int" else "a"
            raise UsageError(f"bad --kwarg {raw!r}: {rest!r} is not {article} {kind}; {KWARG_HELP}") from None
        return ScalarArg(rest)
    if value.lower() in ("true", "false", "none", "null"):
        return ScalarArg(_typed(value))
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)", value):
        return ScalarArg(float(value))
    return None


def parse_kwarg(text: str) -> Tuple[str, Union[InputSpec, ScalarArg]]:
    """``"attention_mask=1x128:int64" -> ("attention_mask", InputSpec(...))``; scalars:
    ``"scale=float:0.5" -> ("scale", ScalarArg(0.5))`` (see :data:`KWARG_HELP`)."""
    name, sep, spec = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise UsageError(f"bad --kwarg {text!r}: {KWARG_HELP}")
    scalar = _scalar(spec, text)
    return name, scalar if scalar is not None else parse_spec(spec)


def parse_config_value(text: str) -> Tuple[str, Any]:
    """``"num_hidden_layers=2" -> ("num_hidden_layers", 2)``; values become int, float,
    bool (true/false), None (none/null) or stay str."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if sep and all(part.isidentifier() for part in key.split(".")) and "." in key:
        raise UsageError(f"bad --config {text!r}: KEY is one top-level field of the hf: config (or a keyword of the factory); "
                         f"a nested field such as {key} is set in a config.json counted as hf:./folder")
    if not sep or not key.isidentifier():
        raise UsageError(f"bad --config {text!r}: expected KEY=VALUE, e.g. num_hidden_layers=2")
    return key, _typed(value.strip())


def _typed(value: str) -> Any:
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(value)
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value


@dataclass
class LoadedEntry:
    """A model ready to run, plus what the ENTRY said about its inputs.

    ``inputs``/``kwargs``: example inputs returned by a factory (None when it gave
    none); ``default_specs``: inputs to make when neither the factory nor the command
    line gave any (token ids for transformers models, an image for torchvision, an
    exported program's own input shapes). ``fit_specs``: checks the command line's SPECs
    against what the ENTRY takes and places them (an exported program's inputs);
    ``needs_inputs``: the error when no inputs are given at all (TorchScript);
    ``no_jit``: why ``--tracer jit`` cannot run this model."""

    entry: str
    model: nn.Module
    inputs: Any = None
    kwargs: Optional[Dict[str, Any]] = None
    default_specs: Tuple[InputSpec, ...] = ()
    default_kwargs: Dict[str, InputSpec] = field(default_factory=dict)
    fit_specs: Optional[Callable[[Sequence[InputSpec], Dict[str, InputSpec]], Tuple[List[InputSpec], Dict[str, InputSpec]]]] = None
    needs_inputs: Optional[str] = None
    no_jit: Optional[str] = None


def config_with(config: Any, overrides: Dict[str, Any], rebuild: Callable[..., Any]) -> Any:
    """A Hugging Face ``config`` with the ``--config`` overrides: built again by ``rebuild(**overrides)``,
    so values derived from them (head_dim from hidden_size) follow. A key the config lacks, or a value
    it rejects (transformers 5 validates field types: StrictDataclassFieldValidationError), is a UsageError."""
    for key, value in overrides.items():
        if not hasattr(config, key):
            hint = did_you_mean(key, [k for k in config.to_dict() if not k.startswith("_")])
            raise UsageError(f"--config {key}={value}: {type(config).__name__} has no key {key!r}{hint}")
    if not overrides:
        return config
    try:
        return rebuild(**overrides)
    except Exception as exc:
        shown = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
        raise UsageError(f"--config {shown}: {type(config).__name__} rejects the value: {one_line(str(exc)) or type(exc).__name__}") from exc


# --------------------------------------------------------------------------- tensors


def make_inputs(
    specs: Sequence[Any], kw_specs: Dict[str, Any], device: str, seed: int = 0, high: Optional[int] = None
) -> Tuple[Any, Optional[Dict[str, Any]]]:
    """The call's inputs from SPECs (``--input``, ``--kwarg``: a ScalarArg is its value): random
    from ``seed`` (integers below ``high``), integer masks all ones; an input that cannot be
    allocated is a UsageError naming its flag."""
    generator = torch.Generator().manual_seed(seed)

    def make(spec: Any, label: str, ones: bool = False) -> Any:
        if isinstance(spec, ScalarArg):
            return spec.value
        try:
            return make_tensor(spec, device=device, high=high, generator=generator, ones=ones)
        except (RuntimeError, MemoryError) as exc:
            size = math.prod(spec.shape) * torch.empty((), dtype=spec.dtype).element_size()
            hint = "; --device meta counts without allocating" if device != "meta" else ""
            raise UsageError(
                f"{label}: cannot allocate the input on {device} ({size / 1e9:.3g} GB): "
                f"{type(exc).__name__}: {_clip(' '.join(str(exc).split()), 240)}{hint}"
            ) from exc

    inputs = tuple(make(spec, f"--input {spec}") for spec in specs)
    kwargs = {
        name: make(spec, f"--kwarg {name}={spec}", "mask" in name.lower() and _integral(spec))
        for name, spec in kw_specs.items()
    }
    return inputs, (kwargs or None)


def _integral(spec: Any) -> bool:
    dtype = getattr(spec, "dtype", None)
    return dtype is not None and not (dtype.is_floating_point or dtype.is_complex)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def token_range(model: nn.Module) -> Optional[int]:
    """The smallest ``num_embeddings`` of the model's embeddings (None without one): an
    upper bound that keeps integer inputs valid for every embedding table."""
    sizes = [m.num_embeddings for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    return min(sizes) if sizes else None


def make_tensor(
    spec: InputSpec,
    *,
    device: Union[str, torch.device] = "cpu",
    high: Optional[int] = None,
    ones: bool = False,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """An example tensor for ``spec``: floats from N(0, 1); integers in ``[0, high)``
    (``high`` defaults to 2); bools random; ``ones=True`` gives all ones (masks).
    On the meta device the tensor has no data. Values come from ``generator`` (CPU)."""
    device = torch.device(device)
    if device.type == "meta":
        return torch.empty(spec.shape, dtype=spec.dtype, device=device)
    if ones:
        return torch.ones(spec.shape, dtype=spec.dtype, device=device)
    if spec.dtype == torch.bool:
        values = torch.randint(0, 2, spec.shape, generator=generator).bool()
    elif spec.dtype.is_floating_point or spec.dtype.is_complex:
        values = torch.randn(spec.shape, generator=generator, dtype=torch.float32).to(spec.dtype)
    else:
        top = min(max(1, high or 2), torch.iinfo(spec.dtype).max + 1)
        values = torch.randint(0, top, spec.shape, generator=generator, dtype=torch.int64).to(spec.dtype)
    return values.to(device)
