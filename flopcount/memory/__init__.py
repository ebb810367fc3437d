"""The memory reading: :func:`estimate_memory` of a forward or a training step on fake tensors."""

from flopcount.memory.estimate import MemoryBreakdown, MemoryEstimate, ModuleMemory, estimate_memory

__all__ = ["MemoryBreakdown", "MemoryEstimate", "ModuleMemory", "estimate_memory"]
