"""The torch.jit tracer (tracer.py) and its jit-only helpers: graph plumbing, sizes, and the
sentence for a custom autograd.Function jit fails inside."""

from flopcount.tracers.jit.tracer import trace

__all__ = ["trace"]
