"""The 0.2 names that keep working for one release (issue #27 item 6): each use warns with a
``DeprecationWarning`` naming the new spelling; docs/migration.md lists them all."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Tuple

from flopcount.errors import UsageError

#: the release that removes the 0.2 names
REMOVED_IN = "0.4"


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """One DeprecationWarning: ``old`` is now ``new``; ``stacklevel`` points at the caller's line."""
    warnings.warn(f"{old} is deprecated and will be removed in flopcount {REMOVED_IN}; use {new}",
                  DeprecationWarning, stacklevel=stacklevel)


def modeled_part(on: Any, device: Any, where: str, default: Any = None, old: str = "device") -> Any:
    """The modeled hardware of ``where``: ``on=``, or its 0.2 spelling ``old=`` (``device=``;
    warns); both given is a usage error; neither: ``default``."""
    if device is None:
        return default if on is None else on
    if on is not None:
        raise UsageError(f"{where}: give the modeled hardware once, as on= ({old}= is its deprecated 0.2 name)")
    warn_renamed(f"{where}({old}=...)", f"{where}(on=...): device= means where the model runs", stacklevel=4)
    return device


def module_getattr(module: str, aliases: Mapping[str, Tuple[str, Callable[[], Any]]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) answering each deprecated name of ``aliases``
    (``{old: (new, loader)}``) with a warning, on every access (never cached)."""

    def __getattr__(name: str) -> Any:
        found = aliases.get(name)
        if found is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new, load = found
        warn_renamed(f"{module}.{name}", new)
        return load()

    return __getattr__


def ms_property(seconds_field: str, old: str) -> property:
    """A read-only property ``old`` (milliseconds, the 0.2 name) over the field
    ``seconds_field`` (seconds): warns, returns the value x 1e3 (None stays None)."""

    def get(self: Any) -> Any:
        warn_renamed(f"{type(self).__name__}.{old}", f"{type(self).__name__}.{seconds_field} (seconds)")
        value = getattr(self, seconds_field)
        if value is None:
            return None
        if isinstance(value, tuple):
            return tuple(v * 1e3 for v in value)
        return value * 1e3

    get.__name__ = old
    get.__doc__ = f"Deprecated (0.2): ``{seconds_field}`` in milliseconds."
    return property(get)
