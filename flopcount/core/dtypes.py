"""The one reading of a dtype argument (docs/api.md#dtypes): a ``torch.dtype``, torch's name
for one ("bfloat16", "torch.bfloat16", "half") or a short name of
:data:`flopcount.types.DTYPE_ALIASES` ("bf16", "fp16", "fp32"), checked against what the
argument takes; anything else is one :class:`UsageError` naming the argument and the names
it takes. Every dtype argument of the Python API and the CLI reads through :func:`parse_dtype`."""

from __future__ import annotations

from typing import Callable, Dict, Literal, Optional, Tuple

import torch

from flopcount.errors import UsageError
from flopcount.types import DTYPE_ALIASES, DTYPE_NAMES, dtype_key, dtype_name

__all__ = ["DtypeKind", "accepted_names", "optional_dtype", "parse_dtype"]

#: what an argument takes: any dtype (an input SPEC), a floating one (a cast, autocast in a
#: training step, FSDP's compute dtype, serving's compute dtype), one torch.autocast runs a
#: timed forward in, or one a roofline prices (floating, or int8: a datasheet column)
DtypeKind = Literal["any", "floating", "autocast", "priced"]

_AUTOCAST = ("float32", "float16", "bfloat16")

#: kind -> (the test a dtype passes, what the error says the argument must be, whether other
#: torch names than those listed are taken)
_KINDS: Dict[str, Tuple[Callable[[torch.dtype], bool], str, bool]] = {
    "any": (lambda d: True, "a torch.dtype or its name", True),
    "floating": (lambda d: d.is_floating_point, "a floating torch.dtype or its name", True),
    "autocast": (lambda d: dtype_name(d) in _AUTOCAST, "torch.float32, torch.float16, torch.bfloat16 or its name", False),
    "priced": (lambda d: d.is_floating_point or d == torch.int8, "a floating torch.dtype, torch.int8 or its name", True),
}


def accepted_names(kind: DtypeKind) -> str:
    """The names a ``kind`` argument takes, each with its short names:
    ``"float32 (fp32, f32, float), float16 (fp16, f16, half), bfloat16 (bf16)"`` for autocast."""
    test, _, others = _KINDS[kind]
    listed = []
    for name in DTYPE_NAMES:
        if test(getattr(torch, name)):
            short = [alias for alias, full in DTYPE_ALIASES.items() if full == name]
            listed.append(f"{name} ({', '.join(short)})" if short else name)
    return ", ".join(listed) + (", or another of torch's names (float8_e4m3fn...)" if others else "")


def parse_dtype(value: object, what: str, kind: DtypeKind = "any") -> torch.dtype:
    """``value`` (a torch.dtype, or a name: see the module) as a torch.dtype that ``kind``
    takes; a :class:`UsageError` beginning with ``what`` (the argument: "plan: autocast")
    otherwise, naming the names it takes."""
    test, must, _ = _KINDS[kind]
    found: Optional[torch.dtype]
    if isinstance(value, torch.dtype):
        found, given = value, str(value)
    elif isinstance(value, str):
        named = getattr(torch, dtype_key(value), None)
        found, given = (named if isinstance(named, torch.dtype) else None), repr(value)
    else:
        found, given = None, f"{type(value).__name__} {value!r}"
    if found is not None and test(found):
        return found
    problem = f"unknown dtype {value!r}" if isinstance(value, str) and found is None else f"got {given}"
    raise UsageError(f"{what} must be {must}: {accepted_names(kind)} (docs/api.md#dtypes); {problem}")


def optional_dtype(value: object, what: str, kind: DtypeKind = "any") -> Optional[torch.dtype]:
    """:func:`parse_dtype` for an argument that may be left out: None stays None."""
    return None if value is None else parse_dtype(value, what, kind)
