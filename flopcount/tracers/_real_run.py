"""A real run of the caller's model, set up in one place (issue #27, "one engine, finished").

Every path that runs the caller's model on real tensors goes through here: ``trace()``'s
real run (tracer "dispatch", "jit", and "auto" after the fake path gave up), the two
tracers' own runs, and the decoding loop's uncounted forward (run for its output only). A
change to how a real run protects the caller's model, inputs, RNG and threads is made here:

* :func:`real_run_model`: the model the run runs, the private twin (``_twin.py``: new module
  objects sharing every tensor, so nothing the run writes lands on the caller's modules,
  which another thread may be training meanwhile, issue #29 item 20); a lazy model the twin
  cannot stand for as a shallow copy sharing its tensors (its lazy modules are materialised
  there, not in the caller's model); else the model as it is.
* :func:`inputs_kept`: the caller's input tensors given back as found
  (``core.state.preserved_inputs``); the collector running as usual, also inside a paused
  count (a real run's garbage may hold data).
* :func:`model_kept`: the model's state given back as found
  (``_state.preserved_model_state(own_buffers=True)``: the run on copies of the buffers and
  on private random generators) while the module stack follows the run; when another thread
  ran the model meanwhile, nothing is written back.
* :func:`run_for_output`: the three together around one forward recording nothing.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence, Tuple

import torch
from torch import nn

from flopcount.core.collection import resumed
from flopcount.core.inputs import PreparedCall, is_dataless
from flopcount.core.model_facts import ModelFacts
from flopcount.core.state import preserved_inputs
from flopcount.tracers._modules import ModuleStack, forward_error
from flopcount.tracers._state import StateWatch, preserved_model_state
from flopcount.tracers._twin import private_twin
from flopcount.tracers.fake.copies import shared_tensor_copy

__all__ = ["inputs_kept", "model_kept", "real_run_model", "run_for_output"]


def real_run_model(model: nn.Module, facts: ModelFacts) -> Tuple[nn.Module, Optional[ModelFacts]]:
    """The model a real run of ``model`` runs and its facts (None: to be read on it): the
    private twin; where the twin cannot stand for the model, a copy sharing its tensors when
    it has lazy modules (they stay lazy in the caller's model), else ``model`` itself."""
    twin = private_twin(model, facts)
    if twin is not None:
        return twin
    if facts.lazy:
        return shared_tensor_copy(model), None
    return model, facts


@contextlib.contextmanager
def inputs_kept(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """The caller's input ``tensors`` given back as found (values, ``requires_grad``,
    ``.grad``); automatic garbage collection on for the block (a real run's garbage may hold
    data), also inside a paused count."""
    with resumed(), preserved_inputs(list(tensors)):
        yield


@contextlib.contextmanager
def model_kept(model: nn.Module, modules: ModuleStack, *, private_random: Optional[bool] = None) -> Iterator[StateWatch]:
    """``model``'s state given back as found (``preserved_model_state(own_buffers=True)``:
    buffers copied for the run, random numbers drawn on private generators unless
    ``private_random=False``), with ``modules`` (the run's module stack) entered inside it;
    another thread's calls of the model seen by the stack leave the state as that thread has it.

    TorchScript code in the model (a scripted, traced or ``torch.jit.freeze``-d module, a scripted
    function) runs as written, without the executor's optimisations (``torch.jit.optimized_execution``,
    this thread only): a frozen module's first two calls compile it, and the compiler's constant
    pooling compares its constants with ``aten::equal``, which the run recorded as the model's ops
    (a frozen MLP counted 1,512, then 2,316, then 1,200 FLOPs on three counts, branch wild7)."""
    with preserved_model_state(model, own_buffers=True, private_random=private_random) as watch, modules, \
            torch.jit.optimized_execution(False):
        watch.concurrent = lambda: modules.foreign_calls > 0
        yield watch


def run_for_output(model: nn.Module, call: PreparedCall, facts: ModelFacts) -> bool:
    """The forward of ``call`` run for real for its output only (what the forward hands on
    through hooks: the decoding loop's cache), as ``trace(..., tracer="dispatch")`` runs it on
    real tensors (the twin, inputs and state given back, no grad, a failure the same
    TraceError naming the module), with nothing recorded. False, nothing run, where the
    traced run does more than that: a tensor without data among the inputs, parameters or
    buffers (the tracer answers its reads), lazy modules, a model the twin cannot stand for."""
    if facts.lazy:
        return False
    if any(is_dataless(t) for t in (*call.tensors, *facts.parameters, *facts.buffers)):
        return False
    run_model, run_facts = real_run_model(model, facts)
    if run_model is model or run_facts is None:  # no twin (not lazy: the model itself)
        return False
    modules = ModuleStack(run_facts.names)
    with inputs_kept(call.tensors), model_kept(run_model, modules), torch.no_grad():
        try:
            run_model(*call.args, **call.kwargs)
        except Exception as exc:
            raise forward_error(exc, modules.current, call.description, "dispatch tracer") from exc
    return True
