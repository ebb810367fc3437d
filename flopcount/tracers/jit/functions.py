"""What to tell the user when torch.jit fails inside a custom ``autograd.Function``.

torch.jit records a Function call as one ``prim::PythonOp`` node. When the Function's
forward calls a module (``torch.utils.checkpoint(use_reentrant=True)`` does: its
Function runs the checkpointed module), torch's tracer fails inside ``Function.apply``
with a bare ``RuntimeError: unordered_map::at``, also under a plain ``torch.jit.trace``.
The dispatch tracer sees inside the Function, so the sentence points there. Up to torch 2.13
the innermost Python frame is ``Function.apply``; from torch 2.14 ``apply`` runs in C++ and
the innermost frame is the caller's line ``SomeFunction.apply(...)``, read from its source.
"""

from __future__ import annotations

import linecache
import os
import re
import traceback
from typing import Any, List, Optional, Tuple

import torch

from flopcount.core.diagnostics import first_line, module_place

__all__ = ["function_failure", "higher_order_failure", "linearize_failure", "transform_failure"]

_APPLY_FILE = os.path.join("autograd", "function.py")
_APPLY_CALL = re.compile(r"([A-Za-z_][\w.]*)\.apply\(")


def frames(exc: BaseException) -> List[Tuple[str, str]]:
    """(file, function) of each frame the failure passed through, outermost first."""
    return [(frame.f_code.co_filename, frame.f_code.co_name) for frame, _ in traceback.walk_tb(exc.__traceback__)]


def _failing_function(exc: BaseException) -> Optional[type]:
    """The Function class whose ``apply`` raised ``exc`` from torch's C++ side (the
    innermost Python frame is ``Function.apply`` itself, not code the Function runs)."""
    walked = list(traceback.walk_tb(exc.__traceback__))
    if not walked:
        return None
    frame, lineno = walked[-1]  # the innermost
    if frame.f_code.co_name == "apply" and frame.f_code.co_filename.endswith(_APPLY_FILE):  # torch <= 2.13
        cls: Any = frame.f_locals.get("cls")
        return cls if isinstance(cls, type) else None
    return _called_function(frame, lineno)


def _called_function(frame: Any, lineno: int) -> Optional[type]:
    """The Function whose ``X.apply(`` the failing line calls (torch >= 2.14), looked up by
    its dotted name in the frame's locals, then globals."""
    found = _APPLY_CALL.search(linecache.getline(frame.f_code.co_filename, lineno))
    if found is None:
        return None
    first, *rest = found.group(1).split(".")
    obj = frame.f_locals.get(first, frame.f_globals.get(first))
    for name in rest:
        obj = getattr(obj, name, None)
    return obj if isinstance(obj, type) and issubclass(obj, torch.autograd.Function) else None


def function_failure(exc: BaseException, where: str) -> Optional[str]:
    """One sentence naming the custom Function torch.jit failed in, or None if the
    failure did not come from inside ``Function.apply``."""
    function = _failing_function(exc)
    if function is None:
        return None
    if function.__module__ == "torch.utils.checkpoint":
        cause = (
            f"torch.utils.checkpoint(use_reentrant=True) in {module_place(where)} runs the checkpointed code inside the "
            f"custom autograd.Function '{function.__name__}', and torch.jit fails there ({first_line(exc)})"
        )
    else:
        cause = (
            f"torch.jit failed inside the custom autograd.Function '{function.__name__}' in {module_place(where)} ({first_line(exc)}), "
            "as it does when a Function's forward calls a module"
        )
    return f"the jit tracer cannot trace this model: {cause}; use tracer='dispatch' (or 'auto'), which sees inside the Function"


_FUNCTORCH_DIR = os.path.join("torch", "_functorch") + os.sep


def linearize_failure(exc: BaseException, where: str) -> Optional[str]:
    """One sentence when torch.jit failed inside ``torch.func.linearize`` (forward-mode AD, whose
    jvp it traces with ``make_fx``: torch.jit's tracer fails on make_fx's proxies); None if no
    frame of the failure is ``linearize`` in ``torch/_functorch``."""
    if not any(_FUNCTORCH_DIR in file and name == "linearize" for file, name in frames(exc)):
        return None
    return (
        f"the jit tracer cannot count this model: its forward uses forward-mode AD (torch.func.linearize in "
        f"{module_place(where)}), whose jvp torch.jit cannot trace ({first_line(exc)}); use tracer='dispatch' "
        "(or 'auto'), which counts it"
    )


#: where torch keeps the eager code of its higher-order ops and of the attention functions built on them
_HIGHER_ORDER_DIRS = (os.path.join("torch", "_higher_order_ops") + os.sep, os.path.join("torch", "nn", "attention") + os.sep)


#: the higher-order ops the dispatch tracer counts (tracers/_recorder.py): their jit failure is said as before
_COUNTED_HIGHER_ORDER = frozenset({"cond"})


def higher_order_failure(exc: BaseException, where: str) -> Optional[str]:
    """One sentence when torch.jit failed inside a higher-order op's eager code (``flex_attention``
    runs its score function under ``vmap``; before, the sentence blamed a torch.func transform of the
    user's and sent them to tracer='dispatch', which refuses the op too); None if no frame of the
    failure is in ``torch/_higher_order_ops`` or ``torch/nn/attention``."""
    found = [name for file, name in frames(exc) if any(folder in file for folder in _HIGHER_ORDER_DIRS)]
    if not found or found[0] in _COUNTED_HIGHER_ORDER:
        return None
    op = found[0]  # the outermost: the function the forward called
    return (
        f"the jit tracer cannot trace this model: torch.jit fails inside the higher-order op {op} in "
        f"{module_place(where)} ({first_line(exc)}); no tracer counts it yet (tracer='dispatch' and 'auto' "
        "refuse it by name, and torch's FlopCounterMode cannot run it either)"
    )


def transform_failure(exc: BaseException, where: str) -> Optional[str]:
    """One sentence when torch.jit failed inside a ``torch.func`` transform (nested ``vmap``,
    ``grad``, ``jacrev``, ``vmap`` of ``grad``...): torch's tracer records one level of
    ``vmap`` but not the others, failing with messages such as "Unsupported value kind:
    Tensor". None if no frame of the failure is in ``torch/_functorch``."""
    if not any(_FUNCTORCH_DIR in file for file, _ in frames(exc)):
        return None
    return (
        f"the jit tracer cannot trace this model: torch.jit fails inside a torch.func transform in {module_place(where)} ({first_line(exc)}); "
        "torch.jit records at most one torch.vmap (not nested transforms, grad/jacrev/jacfwd or functional_call); "
        "use tracer='dispatch' "
        "(or 'auto'), which counts them at their physical shapes"
    )


def tangent_refusal(graph: Any) -> Optional[str]:
    """One sentence when the traced forward reads a forward-mode tangent
    (``torch.autograd.forward_ad.unpack_dual``: an ``aten::_unpack_dual`` node): the tangent
    products ran inside the ops, which torch.jit records as the primal's only (a dual
    Linear as one ``aten::linear``, a third of its work). None otherwise. ``torch.func.jvp``
    is recorded at its aten ops and passes."""
    if not any(node.kind() == "aten::_unpack_dual" for node in graph.nodes()):
        return None
    return (
        "the jit tracer cannot count this model: its forward uses forward-mode AD (torch.autograd.forward_ad), "
        "whose tangent products torch.jit records as the primal's ops only; use tracer='dispatch' (or 'auto'), "
        "which counts them"
    )
