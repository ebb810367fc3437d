"""The generation reading: :func:`count_generation` over the forwards ``generate()`` runs."""

from flopcount.generation.count import GenerationResult, cache_bytes, cache_position_bytes, count_generation

__all__ = ["GenerationResult", "cache_bytes", "cache_position_bytes", "count_generation"]
