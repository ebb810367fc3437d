"""plan() leaves the process as found: torch's init_process_group wraps sys.excepthook with a
"[rank0]: " prefix and destroy_process_group does not unwrap it (issue #29 item 19)."""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from torch import nn

import flopcount


def _build() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


def _broken() -> nn.Module:
    raise RuntimeError("the factory fails")


def test_excepthook_is_the_original_after_plans(monkeypatch):
    def own_hook(*args):  # the process's hook, as an application would install it
        raise AssertionError("not called")

    monkeypatch.setattr(sys, "excepthook", own_hook)
    thread_hook = threading.excepthook
    for _ in range(3):
        flopcount.plan(_build, (torch.randn(2, 8),), fsdp=2, on=None)
        assert sys.excepthook is own_hook
    with pytest.raises(flopcount.FlopcountError):
        flopcount.plan(_broken, (torch.randn(2, 8),), on=None)
    assert sys.excepthook is own_hook and threading.excepthook is thread_hook
