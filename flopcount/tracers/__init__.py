"""Tracers: run a model once and return a :class:`flopcount.types.Trace` of op events.

Tracers know nothing about costs. ``jit`` uses torch.jit tracing; ``dispatch`` uses
a TorchDispatchMode. Both share input handling and state preservation in ``modules``.
"""
