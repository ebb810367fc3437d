"""Trainer integrations: exact FLOPs, TFLOP/s and MFU logged where people train.

* :mod:`flopcount.integrations.hf` — ``FlopcountCallback`` for Hugging Face's ``Trainer``;
* :mod:`flopcount.integrations.lightning` — ``FlopcountMonitor`` for Lightning.

Each imports its framework when imported itself; ``import flopcount`` imports neither.
The framework-free parts (the per-shape cache, the rates) live in ``_counting`` and ``_rates``.
"""
