"""The jit tracer's random draws on generators of its own (issue #29 item 18).

:class:`flopcount.core.state.PrivateRandomCalls` routes each torch call that may draw to
private generators; this module enters it for one trace and takes it off the stack while an
eval-mode ``nn.MultiheadAttention`` or Transformer encoder layer runs: those check
``has_torch_function`` to choose their fused path, which jit records, and an active
TorchFunctionMode would turn it off (a different graph). In eval mode they draw nothing.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, List, Optional

from torch import nn

from flopcount.core.state import PrivateRandomCalls

__all__ = ["private_random_calls"]

# the modules whose forward picks a fused path when has_torch_function is false (torch 2.x)
_FAST_PATH = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


@contextlib.contextmanager
def private_random_calls() -> Iterator[Optional[PrivateRandomCalls]]:
    """While active, this thread's random draws go to private generators (None, and nothing
    entered, when this torch lacks the private name the pause needs). Process-wide module
    hooks, answering only this thread, removed on exit."""
    if not PrivateRandomCalls.available():
        yield None
        return
    from torch.nn.modules import module as module_impl

    calls = PrivateRandomCalls()
    owner = threading.get_ident()
    paused: List[bool] = []  # one entry per fast-path module running: whether its pre-hook paused the mode

    def pre(module: nn.Module, args: Any) -> None:
        if isinstance(module, _FAST_PATH) and threading.get_ident() == owner:
            paused.append(not module.training and calls.pause())

    def post(module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(module, _FAST_PATH) and paused and threading.get_ident() == owner:
            if paused.pop():
                calls.resume()

    handles = [module_impl.register_module_forward_pre_hook(pre)]
    try:
        handles.append(module_impl.register_module_forward_hook(post, always_call=True))
    except TypeError:  # torch < 2.1: no always_call; the exit below still leaves the mode
        handles.append(module_impl.register_module_forward_hook(post))
    calls.__enter__()
    try:
        yield calls
    finally:
        calls.__exit__(None, None, None)
        for handle in handles:
            handle.remove()
