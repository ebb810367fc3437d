"""Leaving the model and the process exactly as found, whatever the forward does."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from torch import nn

from flopcount.core.hooks import hook_dicts
from flopcount.core.inputs import is_dataless, is_uninitialized
from flopcount.core.state import PrivateRandom
from flopcount.errors import FlopcountWarning


class StateWatch:
    """What the tracer and :func:`preserved_model_state` tell each other about one run: whether
    it drew random numbers, whether another thread ran the model meanwhile, and the copies of
    the buffers the run uses."""

    def __init__(self) -> None:
        #: set by the tracer from its trace (``flopcount.core.state.drawing_events``). Used only
        #: without ``own_buffers`` (a benchmark's run): False when the run drew no random
        #: number, so the process-wide RNG is not set back; None (unknown) or True: it is
        #: restored. A tracer's real run (``own_buffers``) draws on private generators
        #: (:class:`flopcount.core.state.PrivateRandom`) and sets the RNG back only when an op
        #: it could not redirect drew.
        self.drew_random: Optional[bool] = None
        #: set by the tracer: True when another thread ran the model during the run (issue
        #: #29 item 20). Then nothing is written back: the state now is that thread's too
        #: (its BatchNorm statistics, gradients, flags), and writing under its autograd graph
        #: would corrupt or crash it; a warning says so.
        self.concurrent: Callable[[], bool] = lambda: False
        self.twins: Dict[int, torch.Tensor] = {}

    def twin(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor the run uses for ``tensor`` (a buffer's copy under ``own_buffers``)."""
        return self.twins.get(id(tensor), tensor)


_MISSING = object()


@contextlib.contextmanager
def preserved_model_state(
    model: nn.Module, *, restore_attributes: bool = True, own_buffers: bool = False, private_random: Optional[bool] = None,
    restore_rng: bool = True,
) -> Iterator[StateWatch]:
    """Leave ``model`` as found whatever the forward does: training flags, buffers
    (BatchNorm running stats) bit for bit, ``requires_grad``, ``.grad``, the hook
    dictionaries, attributes the forward set or replaced on a module, grad mode and
    the RNG state (dropout draws from it; not set back when the tracer found that the run
    drew nothing: :attr:`StateWatch.drew_random`; under ``own_buffers`` the run draws on private
    generators instead and the process's are left alone, issue #29 item 18; not with
    ``private_random=False``). ``restore_attributes=False`` keeps what the
    forward set on its modules (a benchmark runs the user's own forward as the user
    would: a call counter the model keeps is the model's business). ``restore_rng=False`` leaves
    the RNG to the caller (a benchmark's ``core.state.preserved_rng``): it is neither saved nor
    set back here.

    ``own_buffers=True`` (the tracers' real runs): the forward runs on copies of the buffers,
    put in the modules' buffer dicts for the run, and the model gets its own buffer tensors
    back afterwards, never written: a train-mode BatchNorm's running-statistics update
    lands on the copy, so no tensor another thread's autograd graph saved (BatchNorm saves
    its running statistics) is modified in place, and nothing needs copying back
    (:meth:`StateWatch.twin` maps a buffer to the copy in use)."""
    modules = list(model.modules())
    originals: List[Any] = []  # (module, name, the model's own buffer) put back on exit
    twins: Dict[int, torch.Tensor] = {}
    if own_buffers:
        for m in modules:
            for name, buf in list(m._buffers.items()):
                if buf is None or is_dataless(buf) or is_uninitialized(buf):
                    continue
                twin = twins.get(id(buf))
                if twin is None:
                    twin = twins[id(buf)] = buf.detach().clone().requires_grad_(buf.requires_grad)
                originals.append((m, name, buf))
                m._buffers[name] = twin
    swapped = {id(twin) for twin in twins.values()}  # put back by `originals`, never written
    # A shallow copy of each module's attributes, and of its buffer dict (buffers can be
    # reassigned through it): the forward's own ``self.x = ...`` are undone on exit.
    attributes = [dict(vars(m), _buffers=dict(m._buffers)) for m in modules]
    # a torch.jit.freeze-d module has no `training` attribute (freezing drops it): none to keep
    flags = [(m, m.training) for m in modules if hasattr(m, "training")]
    buffers = []
    for m in modules:
        for name, buf in m._buffers.items():
            if buf is not None and id(buf) not in swapped:
                buffers.append((m, name, buf, None if is_dataless(buf) or is_uninitialized(buf) else buf.detach().clone()))
    versions = {id(buf): buf._version for _, _, buf, _ in buffers}
    params = [p for p in model.parameters() if not is_uninitialized(p)]
    # A tracer's real run (own_buffers) never reads .grad: the parameters are the caller's
    # objects, and another thread's backward may be replacing their gradients without the GIL;
    # a Python reference held to one (or a wrapper made for it by reading it) has crashed that
    # thread at its next zero_grad (SIGABRT, issue #29 item 20)
    param_state = [(p, p.requires_grad, None if own_buffers else p.grad, p._version) for p in params]
    # The one in-place parameter write torch's own layers do in forward: Embedding(max_norm=)
    # renormalises the rows it looks up. Those weights are saved so they can be put back.
    renormed = [
        (m.weight, m.weight.detach().clone())
        for m in modules
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.max_norm is not None and not is_dataless(m.weight)
    ]
    # every hook dictionary of every module (flopcount.core.hooks finds them): one the forward
    # registered into or removed from is put back as found
    hooks = [(m, attr, dict(found)) for m in modules for attr, found in hook_dicts(m).items()]
    grad_enabled = torch.is_grad_enabled()
    rng = torch.get_rng_state() if restore_rng else None
    cuda_rng = torch.cuda.get_rng_state_all() if restore_rng and torch.cuda.is_available() and torch.cuda.is_initialized() else None
    watch = StateWatch()
    watch.twins = twins
    # a tracer's real run draws on generators of its own: the process's are never set back
    # (that would rewind other threads' draws) unless an op it cannot redirect drew
    # (``private_random=False``: the jit tracer, for which a dispatch mode active for the whole run
    # changes what torch.jit records; it enters one only around calls that draw, tracers/jit/random.py)
    random = PrivateRandom() if (own_buffers if private_random is None else private_random) else None
    try:
        with random if random is not None else contextlib.nullcontext():
            yield watch
    finally:
        for m, name, buf in originals:  # dict entries only: no tensor is written
            m._buffers[name] = buf
        if watch.concurrent():
            torch.set_grad_enabled(grad_enabled)  # this thread's own
            warnings.warn(
                "the model ran in another thread while flopcount ran it for real: its state (buffers such as "
                "BatchNorm statistics, gradients, flags, attributes, the RNG) was left as that thread has it, not "
                "restored; to count a model another thread is using, count a copy (copy.deepcopy) or use "
                "tracer='auto', whose fake copies never touch it",
                FlopcountWarning,
                stacklevel=3,
            )
        else:
            for m, before in zip(modules, attributes if restore_attributes else ()):
                now = vars(m)
                for key in [k for k in now if k not in before]:
                    del now[key]
                for key, value in before.items():
                    if key != "_buffers" and now.get(key, _MISSING) is not value:
                        now[key] = value
            torch.set_grad_enabled(grad_enabled)
            if rng is not None and (random.fell_back if random is not None else watch.drew_random is not False):
                torch.set_rng_state(rng)
                if cuda_rng is not None:
                    torch.cuda.set_rng_state_all(cuda_rng)
            for m, mode in flags:
                if m.training != mode:
                    m.training = mode
            with torch.no_grad():
                for m, name, buf, saved in buffers:
                    if m._buffers.get(name) is not buf:
                        m._buffers[name] = buf
                    if saved is not None and buf.layout != torch.strided:  # sparse: no torch.equal
                        if buf._version != versions[id(buf)]:
                            buf.copy_(saved)
                    elif saved is not None and (buf.shape != saved.shape or not torch.equal(buf, saved)):
                        buf.copy_(saved) if buf.shape == saved.shape else buf.set_(saved)  # type: ignore[call-overload]  # set_(Tensor) exists; the stubs omit it
                restored = set()
                for weight, saved_weight in renormed:
                    if not torch.equal(weight, saved_weight):
                        weight.copy_(saved_weight)
                    restored.add(id(weight))
            changed = []
            for p, requires_grad, grad, version in param_state:
                if p.requires_grad != requires_grad:
                    p.requires_grad_(requires_grad)
                # a tracer's run never writes .grad (forward under no_grad, backward by
                # autograd.grad; the reentrant-checkpoint backward puts its own back): a
                # .grad that moved is another thread's backward, not ours to undo
                if not own_buffers and p.grad is not grad:
                    p.grad = grad
                if p._version != version and id(p) not in restored:
                    changed.append(p)
            for m, attr, saved_hooks in hooks:
                current = vars(m).get(attr)  # not a dict: the forward deleted the dictionary itself, none to refill
                if isinstance(current, dict) and current.keys() != saved_hooks.keys():
                    current.clear()
                    current.update(saved_hooks)
            if changed:
                warnings.warn(
                    f"the model's forward changed {len(changed)} parameter(s) in place; flopcount cannot undo that",
                    FlopcountWarning,
                    stacklevel=3,
                )
