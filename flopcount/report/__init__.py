"""Reports: strings made from results. Nothing here traces, counts or prints.

Importing this package registers every renderer with :mod:`flopcount.core.rendering`, which is how
a reading's ``table()`` / ``to_dict()`` / ``__str__`` reach them without importing them."""

from flopcount.report import (
    bench,
    budget,
    devices,
    diff,
    export,
    generation,
    memory,
    plan,
    profile,
    roofline_plot,
    serving,
    table,
    tree,
)

__all__ = [
    "bench", "budget", "devices", "diff", "export", "generation", "memory", "plan", "profile",
    "roofline_plot", "serving", "table", "tree",
]
