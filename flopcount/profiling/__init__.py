"""Profiling: measured time per op joined with counted cost, under a device's roofs
(:func:`profile`), and roofline lower bounds without running (:func:`predict`)."""

from __future__ import annotations

from flopcount.profiling.predict import PredictResult, PredictRow, predict
from flopcount.profiling.result import Overview, ProfileResult, ProfileRow, Unmatched
from flopcount.profiling.run import profile

__all__ = ["Overview", "PredictResult", "PredictRow", "ProfileResult", "ProfileRow", "Unmatched", "predict", "profile"]
