"""Helpers for the conformance suite: flopcount against the peers' own test cases.

Every case re-creates one case of PyTorch's ``test/test_flop_counter.py`` or fvcore's
``tests/test_flop_count.py`` / ``tests/test_jit_model_analysis.py`` (same modules, same
shapes; written here, not copied) and asserts the peer's number, computed live where the
peer runs here, or the number of flopcount's documented convention where it differs on
purpose. Those cases carry ``@pytest.mark.convention("why")``; the table in
docs/conventions.md ("flopcount vs torch vs fvcore") lists them.

Shared helpers of the suite live here (no conftest.py: the name would shadow tests/conftest.py,
which other test files import by name).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import pytest
from conftest import Fn as Fn  # re-exported: the conformance files import it from here
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import FlopResult, count_flops

TRACERS = ("jit", "dispatch", "auto")
#: tracers that can count a backward pass (jit cannot; auto then uses dispatch)
BACKWARD_TRACERS = ("dispatch", "auto")




def count(model: nn.Module, inputs: Any, tracer: str, **kwargs: Any) -> FlopResult:
    return count_flops(model, inputs, tracer=tracer, **kwargs)


def torch_flops(fn: Callable[[], Any]) -> Tuple[int, Dict[str, Dict[Any, int]]]:
    """Total FLOPs ``torch.utils.flop_counter.FlopCounterMode`` counts while ``fn`` runs
    (it runs ``fn`` itself, backward included when ``fn`` calls it), and its per-module table."""
    with FlopCounterMode(display=False) as mode:
        fn()
    return mode.get_total_flops(), mode.get_flop_counts()


def fvcore_analysis(model: nn.Module, inputs: Tuple[Any, ...]) -> Any:
    """fvcore's FlopCountAnalysis (MACs, which fvcore calls flops), warnings off."""
    fvcore = pytest.importorskip("fvcore.nn")
    analysis = fvcore.FlopCountAnalysis(model, inputs)
    analysis.unsupported_ops_warnings(False)
    analysis.uncalled_modules_warnings(False)
    analysis.tracer_warnings("none")
    analysis.total()  # fvcore computes on first request
    return analysis


def family_macs(result: FlopResult, module: str = "") -> Dict[str, int]:
    """MACs of one module by op family (``conv``, ``linear``, ``matmul``...), so a jit
    ``aten::_convolution`` and a dispatch ``aten::convolution`` compare as one."""
    families: Dict[str, int] = {}
    for op, macs in result.by_module_and_operator("macs").get(module, {}).items():
        if not macs:
            continue
        name = op.split("::")[-1]
        family = "conv" if "conv" in name else "linear" if name in ("linear", "addmm") else name
        families[family] = families.get(family, 0) + macs
    return families

