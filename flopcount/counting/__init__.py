"""The count reading: :func:`count_flops`."""

from flopcount.counting.count import count_flops

__all__ = ["count_flops"]
