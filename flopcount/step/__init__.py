"""One training step: the optimizer factory, the autocast helpers (and the step runner the
readings share)."""
