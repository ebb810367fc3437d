"""The fake-tensor machinery of the dispatch tracer: fake copies of a model and its inputs
(copies.py), the shape cache, stand-in kernels with the real kernels' checks, and the values
shapes decide on meta."""
