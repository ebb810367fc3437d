"""The 0.2 names that keep working for one release (issue #27 item 6): each use warns with a
``DeprecationWarning`` naming the new spelling; docs/migration.md lists them all."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, TypeVar

from flopcount.errors import UsageError

#: the release that removes the 0.2 names
REMOVED_IN = "0.4"

_C = TypeVar("_C", bound=type)


#: the middle of every 0.2 name's sentence (:func:`renamed`), by which the CLI knows one
_DEPRECATED = f" is deprecated and will be removed in flopcount {REMOVED_IN}; use "


def renamed(old: str, new: str) -> str:
    """The sentence a 0.2 name says: ``old`` is now ``new`` (a DeprecationWarning's text, the CLI's
    warning line for a 0.2 flag)."""
    return f"{old}{_DEPRECATED}{new}"


def is_renamed(message: str) -> bool:
    """``message`` is a 0.2 name's sentence (:func:`renamed`): the CLI shows these warnings (a
    0.2 key of the budget file), as it shows flopcount's own warning class."""
    return _DEPRECATED in message


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """One DeprecationWarning: ``old`` is now ``new``; ``stacklevel`` points at the caller's line."""
    warnings.warn(renamed(old, new), DeprecationWarning, stacklevel=stacklevel)


def modeled_part(on: Any, device: Any, where: str, default: Any = None, old: str = "device", unset: Any = None) -> Any:
    """The modeled hardware of ``where``: ``on=``, or its 0.2 spelling ``old=`` (``device=``;
    warns); both given is a usage error; neither: ``default``. ``unset``: what a parameter
    not given holds (None; ``plan`` passes a marker of its own, None meaning "no step times" there)."""
    if device is unset:
        return default if on is unset else on
    if on is not unset:
        raise UsageError(f"{where}: give the modeled hardware once, as on= ({old}= is its deprecated 0.2 name)")
    warn_renamed(f"{where}({old}=...)", f"{where}(on=...): device= means where the model runs", stacklevel=4)
    return device


def module_getattr(
    module: str, aliases: Mapping[str, Tuple[str, Callable[[], Any]]], stacklevel: int = 3
) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) answering each deprecated name of ``aliases``
    (``{old: (new, loader)}``) with a warning, on every access (never cached). ``stacklevel``:
    the warning's frame, the caller's line when the module's ``__getattr__`` is the one returned
    (3); one more for each function between (``flopcount.__getattr__`` calls it: 4). Pointed
    elsewhere, Python's default filters hide it (a DeprecationWarning shows only where
    ``__main__`` triggers it) and a caller's ``-W error::DeprecationWarning:mymodule`` misses it."""

    def __getattr__(name: str) -> Any:
        found = aliases.get(name)
        if found is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new, load = found
        warn_renamed(f"{module}.{name}", new, stacklevel=stacklevel)
        return load()

    return __getattr__


def seconds_or_ms(seconds: Any, milliseconds: Any, where: str, new: str, old: str) -> Any:
    """A time given as ``new`` (seconds) or as its 0.2 spelling ``old`` (milliseconds: warns at
    the line that called the function calling this one, and returns
    ``milliseconds / 1000``); both given is a usage error naming both; neither: None. ``where``
    (a function, a class or a file) begins the sentences."""
    if milliseconds is None:
        return seconds
    if seconds is not None:
        raise UsageError(f"{where}: give {new} (seconds) or its deprecated 0.2 spelling {old} (milliseconds), not both")
    warn_renamed(f"{where}: {old}", f"{new} in seconds", stacklevel=4)
    return milliseconds / 1000


def in_ms(value: Any) -> Any:
    """0.2's milliseconds of a time in seconds (or of a list of them), for the ``_ms`` names and
    keys kept one release: ``value * 1e3``; None stays None."""
    if value is None:
        return None
    return [v * 1e3 for v in value] if isinstance(value, (tuple, list)) else value * 1e3


def ms_aliases(*stems: str) -> Callable[[_C], _C]:
    """Class decorator, the one way a result keeps its 0.2 millisecond names: for each
    ``stem``, a read-only property ``{stem}_ms`` over the field or property ``{stem}_s``
    (seconds) that warns and returns the value x 1e3 (None stays None); the stems are kept
    on the class (``MS_ALIASES``) for :func:`ms_keys`."""

    def decorate(cls: _C) -> _C:
        for stem in stems:
            setattr(cls, f"{stem}_ms", _ms_property(stem))
        cls.MS_ALIASES = getattr(cls, "MS_ALIASES", ()) + stems  # type: ignore[attr-defined]
        return cls

    return decorate


def ms_keys(result: Any, stems: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The 0.2 ``{stem}_ms`` keys (milliseconds) of ``result``'s :func:`ms_aliases` (or of
    ``stems``), that ``to_dict`` writes beside the ``_s`` keys for one release."""
    return {f"{stem}_ms": in_ms(getattr(result, f"{stem}_s")) for stem in (result.MS_ALIASES if stems is None else stems)}


def _ms_property(stem: str) -> property:
    old, new = f"{stem}_ms", f"{stem}_s"

    def get(self: Any) -> Any:
        warn_renamed(f"{type(self).__name__}.{old}", f"{type(self).__name__}.{new} (seconds)")
        value = in_ms(getattr(self, new))
        return tuple(value) if isinstance(value, list) else value

    get.__name__ = old
    get.__doc__ = f"Deprecated (0.2): ``{new}`` in milliseconds."
    return property(get)
