"""The shape cache's fallback is scoped to one trace and reported (#19: it used to switch an
op off for the whole process, silently, after one failure)."""

from __future__ import annotations

import torch
from torch import nn

from flopcount.tracers import dispatch
from flopcount.tracers.fake.shape_cache import ShapeCache


def _trace(model, x):
    return dispatch.trace(model, (x,), None, fake_copy=True)


def test_a_failed_cache_hit_disables_the_op_for_that_trace_only(monkeypatch):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(3, 8)
    first = _trace(model, x)
    warm = _trace(model, x)  # every cacheable op answered from the cache
    assert first.shape_cache["disabled"] == {} and warm.shape_cache["misses"] == 0
    real_make = ShapeCache._make

    def broken(self, described, tuple_out):
        raise RuntimeError("constructor changed")

    monkeypatch.setattr(ShapeCache, "_make", broken)
    failed = _trace(model, x)
    assert failed.shape_cache["disabled"], "the fallback is reported"
    assert all("constructor changed" in why for why in failed.shape_cache["disabled"].values())
    # the same ops, the same events: the fallback changes speed, never the count
    assert [e.call.op for e in failed.events] == [e.call.op for e in first.events]
    monkeypatch.setattr(ShapeCache, "_make", real_make)
    later = _trace(model, x)
    assert later.shape_cache["disabled"] == {}
    assert later.shape_cache["hits"] == warm.shape_cache["hits"] and later.shape_cache["misses"] == 0
