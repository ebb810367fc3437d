"""Profiling: measured time per op joined with counted cost, under a device's roofs
(:func:`profile`), and roofline lower bounds without running (:func:`predict`)."""

from __future__ import annotations

from .predict import PredictResult, PredictRow, predict
from .result import Overview, ProfileResult, ProfileRow, Unmatched
from .run import profile

__all__ = ["Overview", "PredictResult", "PredictRow", "ProfileResult", "ProfileRow", "Unmatched", "predict", "profile"]
