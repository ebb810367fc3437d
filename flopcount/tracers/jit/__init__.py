"""The torch.jit tracer (tracer.py) and its jit-only helpers: graph plumbing, sizes, and the
sentence for a custom autograd.Function jit fails inside; a TorchScript module read from its graph
(scripted.py)."""

from flopcount.tracers.jit.tracer import trace, trace_scripted

__all__ = ["trace", "trace_scripted"]
