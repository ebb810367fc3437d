"""Exact FLOPs, TFLOP/s and MFU in Hugging Face's ``Trainer``: :class:`FlopcountCallback`.

>>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[FlopcountCallback()])  # doctest: +SKIP

HF callbacks receive no inputs, so a forward pre-hook on the trainer's model (``on_train_begin``
to ``on_train_end``, or :meth:`FlopcountCallback.remove`) records each call's signature and keeps
the inputs of a new one until the step ends, when it is counted on fake copies of a hookless twin
(every other step is a lookup). HF calls no callback when ``train()`` raises, so the callback
wraps that Trainer's ``train`` (the instance attribute) to remove the hooks on every exit path.
``state.total_flos`` is corrected to the exact FLOPs of every counted step. How it sees the
batch, what is and is not counted: docs/integrations.md, "Hugging Face `Trainer`".
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import types
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn
from transformers import TrainerCallback

from flopcount.bench.peak import mfu_part
from flopcount.core.analysis import uncompiled
from flopcount.errors import FlopcountWarning
from flopcount.integrations._counting import PassCost, Signature, StepCounter, batch_signature
from flopcount.integrations._rates import (
    PREFIX,
    Window,
    model_device,
    model_dtype,
    model_flops,
    resolve_peak,
    window_metrics,
)

__all__ = ["FlopcountCallback", "hf_loss"]

Call = Tuple[Signature, Optional[Tuple[Tuple[Any, ...], Dict[str, Any]]], Tuple[int, Optional[int]]]  # signature, inputs kept, (samples, tokens)


def hf_loss(outputs: Any) -> Any:
    """The loss the Trainer backpropagates: ``outputs["loss"]`` for a dict-like output, else
    ``outputs[0]`` (as ``Trainer.compute_loss``); without a loss, the first output."""
    if isinstance(outputs, Mapping):
        return outputs["loss"] if outputs.get("loss") is not None else next(iter(outputs.values()))
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


class FlopcountCallback(TrainerCallback):
    """Logs ``flopcount/flops_per_step``, ``flopcount/tflops_per_s``, ``flopcount/mfu``, ``flopcount/hfu``,
    ``flopcount/tokens_per_s`` (and ``samples_per_s``, ``total_flops``, ``eval_flops``) through
    the trainer's own logs, and makes ``state.total_flos`` exact.

    ``device``: where the model runs, whose peak is looked up (default: the model's device).
    ``peak_flops``: FLOP/s for the MFU (default: the GPU's dense datasheet peak at the training
    dtype; on CPU no MFU is logged unless given: a measured CPU rate is not a peak). ``on``:
    the modeled part whose dense datasheet peak the MFU uses instead ("h100", ...). ``log_every``: also ask the trainer to log every N
    optimizer steps (default: at the trainer's own ``logging_steps``). Step time is the wall
    time from ``on_step_begin`` to ``on_step_end`` (forward, backward, optimizer; the
    batch fetch and logging excluded), with a CUDA synchronisation at the end on GPU.
    """

    def __init__(self, device: Optional[Any] = None, peak_flops: Optional[float] = None, log_every: Optional[int] = None,
                 *, on: Optional[str] = None):
        self.on = mfu_part("FlopcountCallback", on, peak_flops)
        if log_every is not None and log_every < 1:
            raise ValueError(f"log_every must be >= 1 (optimizer steps), got {log_every}")
        self.device = torch.device(device) if device is not None else None
        self.peak_flops = peak_flops
        self.log_every = log_every
        self.counter = StepCounter(hf_loss)
        self.total_flops = 0
        self._reset_run()

    def _reset_run(self) -> None:
        self._model: Optional[nn.Module] = None
        self._trainer: Optional[weakref.ref[Any]] = None  # the Trainer whose train() this run is
        self._handles: Tuple[Any, ...] = ()
        self._run: Optional[_Run] = None
        self._peak: Optional[float] = None
        self._cuda = False
        self._in_step = False
        self._calls: List[Call] = []
        self._eval_calls: List[Call] = []
        self._eval_flops = 0
        self._t0 = 0.0
        self._window = Window()
        self._hf_estimate: Dict[Signature, Optional[float]] = {}
        self._open = 0  # forwards the recorder saw that have not returned yet

    # -- attach / detach ------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = _calling_trainer(self)
        if trainer is not None:
            _guard_train(trainer, self)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Optional[nn.Module] = None, **kwargs: Any) -> None:
        self.remove()  # a hook left by a train() that raised (HF called no on_train_end)
        if model is None:
            return
        trainer = _calling_trainer(self)
        if trainer is not None:
            _guard_train(trainer, self)  # added after the Trainer was made: guards the later train() calls
        self._trainer = weakref.ref(trainer) if trainer is not None else None
        # every run counts afresh: another Trainer may bring another model or optimizer under
        # the same shapes, and each run's total_flos starts from HF's figures again
        self.counter = StepCounter(hf_loss)
        self.total_flops = 0
        self._model = model
        self._run = _running_loop(self)
        hook = _recorder(self)
        if getattr(args, "torch_compile", False):
            hook = torch.compiler.disable(hook)  # run eagerly in front of the compiled forward
        self._handles = (
            model.register_forward_pre_hook(hook, with_kwargs=True),
            model.register_forward_hook(_finished(self)),
            # always_call: also runs when the forward raises, which ends train() (HF calls no
            # callback then): the hooks go at once instead of staying on the model
            model.register_forward_hook(_failed(self), always_call=True),
        )
        device = self.device or model_device(model)
        self._cuda = model_device(model).type == "cuda"
        dtype = torch.bfloat16 if getattr(args, "bf16", False) else torch.float16 if getattr(args, "fp16", False) else model_dtype(model)
        self._peak, note = resolve_peak(device, dtype, self.peak_flops, self.on)
        if note:
            warnings.warn(f"FlopcountCallback: {note}", FlopcountWarning, stacklevel=2)
        _move_ahead_of_reporters(self)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.remove()

    def remove(self) -> None:
        """Removes the forward pre-hook from the model and drops the inputs it kept (done at
        the end of training, also when ``train()`` raises; call this to release them at once)."""
        for handle in self._handles:
            handle.remove()
        self._reset_run()

    def _train_returned(self, trainer: Any) -> None:
        """``trainer.train()`` returned or raised: a run of that Trainer still hooked ended
        without ``on_train_end`` (HF calls no callback when ``train()`` raises)."""
        if self._handles and self._trainer is not None and self._trainer() is trainer:
            self.remove()

    # -- training steps -------------------------------------------------------------
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._in_step = True
        self._calls = []
        self._t0 = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> Any:
        model = self._model
        if model is None or not self._in_step:
            return None
        if self._cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - self._t0
        self._in_step = False
        calls, self._calls = self._calls, []
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the real one
        costs = [self._train_cost(model, call, optimizer) for call in calls]
        opt_flops = self.counter.optimizer_flops(optimizer)
        if calls and opt_flops is not None and all(c is not None for c in costs):
            flops = sum(c.flops for c in costs if c is not None) + opt_flops
            self.total_flops += flops
            hf = [self._hf_estimate.get(sig) for sig, _, _ in calls]
            if all(h is not None for h in hf):  # HF adds its own estimate for these micro-batches
                state.total_flos += flops - sum(h for h in hf if h is not None)
            done = [c for c in costs if c is not None]
            step_model_flops = model_flops(sum(c.forward for c in done), flops, any(c.frozen for c in done))
            tokens = [tokens for _, _, (_, tokens) in calls]  # None for a call without token ids
            total_tokens = None if None in tokens else sum(t or 0 for t in tokens)
            self._window.add(flops, seconds, total_tokens, sum(samples for _, _, (samples, _) in calls), model_flops=step_model_flops)
        if self.log_every is not None and state.global_step % self.log_every == 0:
            control.should_log = True
        return control

    def _train_cost(self, model: nn.Module, call: Call, optimizer: Any) -> Optional[PassCost]:
        sig, inputs, _ = call
        known = self.counter.train.get(sig, False)
        if known is not False and (optimizer is None or id(optimizer) in self.counter.optimizer):
            return known  # type: ignore[return-value]
        if inputs is None:  # the inputs of a signature seen before, counted then
            return self.counter.train.get(sig)
        args, kw = inputs
        self._hf_estimate[sig] = _hf_estimate(model, kw)
        return self.counter.count_train(sig, model, args, kw, optimizer)

    # -- evaluation -------------------------------------------------------------------
    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = self._model
        calls, self._eval_calls = self._eval_calls, []
        if model is None:
            return
        for sig, inputs, _ in calls:
            flops = self.counter.eval.get(sig) if inputs is None else self.counter.count_eval(sig, model, *inputs)
            if flops is not None:
                self._eval_flops += flops

    # -- logging ----------------------------------------------------------------------
    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        if logs is None:
            return
        added: Dict[str, float] = {}
        if self._window.steps:
            added.update(window_metrics(self._window, self._peak))
            added[PREFIX + "total_flops"] = float(self.total_flops)
            self._window = Window()
        if self._eval_flops and any(key.startswith("eval_") for key in logs):
            added[PREFIX + "eval_flops"] = float(self._eval_flops)
            self._eval_flops = 0
        if added:
            logs.update(added)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(added)


def _recorder(callback: FlopcountCallback) -> Any:
    """The forward pre-hook: records the signature of each call; keeps the inputs of a
    signature not counted yet. A plain function (not a bound method) so that fake copies
    of the model share it instead of deep-copying the callback."""
    counter = callback.counter

    def record(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        if counter.busy:
            return  # a process-wide recorder's view of a count
        if not _inside(callback._run):  # train() raised and is gone: record nothing, go away
            callback.remove()
            return
        callback._open += 1  # closed by _finished; still open in _failed: the forward raised
        sig = batch_signature(args, kwargs)
        if callback._in_step:
            cache: Mapping[Signature, Any] = counter.train
            calls = callback._calls
        else:
            cache, calls = counter.eval, callback._eval_calls
        new = sig not in cache and not any(c[0] == sig and c[1] is not None for c in calls)
        calls.append((sig, (args, dict(kwargs)) if new else None, _sizes(module, args, kwargs)))

    return record


def _finished(callback: FlopcountCallback) -> Any:
    """A forward hook (not always called): the forward the recorder saw returned."""

    def finished(module: nn.Module, args: Tuple[Any, ...], output: Any) -> None:
        if callback._open > 0:
            callback._open -= 1

    return finished


def _failed(callback: FlopcountCallback) -> Any:
    """A forward hook called even when the forward raises (registered after :func:`_finished`,
    so on success it runs second and finds the call closed). A call still open here raised:
    the exception ends ``train()`` (or the evaluation inside it) and HF calls no callback on
    that path, so the hooks and the inputs they kept go now."""

    def failed(module: nn.Module, args: Tuple[Any, ...], output: Any) -> None:
        if callback._open > 0:
            callback.remove()

    return failed


@dataclass(frozen=True)
class _Run:
    """The training loop that called ``on_train_begin``: its thread, frame id and code."""

    thread: int
    frame: int
    code: Any


def _frames(frame: Any) -> Iterator[Any]:
    """``frame`` and its callers, innermost first."""
    while frame is not None:
        yield frame
        frame = frame.f_back


def _handler_frame(callback: FlopcountCallback) -> Any:
    """The frame on the call stack in which a CallbackHandler holding ``callback`` is calling
    it (``frame.f_locals["self"]`` is that handler), or None."""
    from transformers.trainer_callback import CallbackHandler

    return next((frame for frame in _frames(sys._getframe(1)) if isinstance(frame.f_locals.get("self"), CallbackHandler)
                 and any(c is callback for c in frame.f_locals["self"].callbacks)), None)


def _running_loop(callback: FlopcountCallback) -> Optional[_Run]:
    """The frame that called the CallbackHandler's ``on_train_begin`` (the Trainer's loop),
    found on the call stack; None when the callback was called some other way."""
    handler = _handler_frame(callback)
    owner = None if handler is None else handler.f_locals["self"]
    frame = next((f for f in _frames(handler) if f.f_locals.get("self") is not owner), None)
    return None if frame is None else _Run(threading.get_ident(), id(frame), frame.f_code)


def _inside(run: Optional[_Run]) -> bool:
    """Whether this call happens inside the training loop ``run`` (always True in another
    thread, e.g. DataParallel's replicas, and when the loop is unknown)."""
    return run is None or threading.get_ident() != run.thread or any(
        id(frame) == run.frame and frame.f_code is run.code for frame in _frames(sys._getframe(1)))


def _calling_trainer(callback: FlopcountCallback) -> Any:
    """The Trainer whose CallbackHandler is calling ``callback`` now (its ``__init__`` or its
    training loop, found on the call stack), or None."""
    from transformers import Trainer

    frame = _handler_frame(callback)
    handler = None if frame is None else frame.f_locals["self"]
    return next((f.f_locals["self"] for f in _frames(frame) if isinstance(f.f_locals.get("self"), Trainer)
                 and getattr(f.f_locals["self"], "callback_handler", None) is handler), None)


#: the attribute of a guarding wrapper that holds the callbacks it guards
_GUARDED = "_flopcount_callbacks"


def _guard_train(trainer: Any, callback: FlopcountCallback) -> None:
    """Wrap ``trainer.train`` (an instance attribute over the class's method) so that every
    exit from it, a raise included, tells the guarded callbacks, which remove their hooks if
    that run is still hooked. One wrapper per Trainer; it holds the Trainer weakly (no
    reference cycle keeps a Trainer and its model alive) and takes itself off when no
    FlopcountCallback is left in the Trainer's callbacks."""
    state = vars(trainer)
    current = state.get("train")
    guarded = getattr(current, _GUARDED, None)
    if guarded is not None:
        guarded.add(callback)
        return
    inner = current  # an instance-level train() someone set before: called, and put back when the guard goes
    method = type(trainer).train
    owner_ref = weakref.ref(trainer)
    callbacks: weakref.WeakSet[FlopcountCallback] = weakref.WeakSet([callback])

    def train(*args: Any, **kwargs: Any) -> Any:
        owner = owner_ref()
        try:
            return inner(*args, **kwargs) if inner is not None else method(owner, *args, **kwargs)
        finally:
            for guarded_callback in list(callbacks):
                guarded_callback._train_returned(owner)
            handler = getattr(owner, "callback_handler", None)
            if owner is not None and not any(isinstance(c, FlopcountCallback) for c in getattr(handler, "callbacks", ())):
                if vars(owner).get("train") is train:  # put back what was there
                    if inner is None:
                        del vars(owner)["train"]
                    else:
                        vars(owner)["train"] = inner

    functools.update_wrapper(train, method, assigned=("__module__", "__name__", "__qualname__", "__doc__"), updated=())
    setattr(train, _GUARDED, callbacks)
    state["train"] = train


def _sizes(model: nn.Module, args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tuple[int, Optional[int]]:
    """(samples, tokens) of a call: the main input's batch size, and its element count when
    it holds token ids (integers); tokens ``None`` for images, audio features..."""
    name = getattr(uncompiled(model), "main_input_name", "input_ids")
    main = kwargs[name] if name in kwargs else args[0] if args else None
    if not isinstance(main, torch.Tensor) or main.dim() == 0:
        return (0, None)
    return (int(main.shape[0]), main.numel() if not main.is_floating_point() else None)


def _hf_estimate(model: nn.Module, inputs: Mapping[str, Any]) -> Optional[float]:
    """What the Trainer adds to ``total_flos`` for these inputs (``Trainer.floating_point_ops``
    called with this model: 6 x main-input elements x non-embedding parameters here), or
    ``None`` if that cannot be learnt (then ``total_flos`` is left as HF makes it)."""
    from transformers import Trainer

    try:
        return float(Trainer.floating_point_ops(types.SimpleNamespace(model=model), dict(inputs)))  # type: ignore[arg-type]
    except Exception:
        return None


def _move_ahead_of_reporters(callback: FlopcountCallback) -> None:
    """Put the callback before the reporting callbacks (TensorBoard, W&B...) so that the
    keys it adds in ``on_log`` reach them: the Trainer places user callbacks after its
    reporters. The CallbackHandler calling ``on_train_begin`` is found on the call stack; it
    gets a reordered copy of its list, so the list it is iterating is never mutated."""
    from transformers.trainer_callback import DefaultFlowCallback

    frame = _handler_frame(callback)
    if frame is None:
        warnings.warn(
            "FlopcountCallback: could not find the Trainer's CallbackHandler; reporters listed before this "
            "callback will not receive flopcount/* (state.log_history still does)",
            FlopcountWarning,
            stacklevel=3,
        )
        return
    handler = frame.f_locals["self"]
    others = [c for c in handler.callbacks if c is not callback]
    first = next((i for i, c in enumerate(others) if not isinstance(c, DefaultFlowCallback)), len(others))
    # a new list, bound in place of the old one: the handler is iterating the old list right
    # now (this is its on_train_begin) and finishes it unchanged; the next event uses the new order
    handler.callbacks = others[:first] + [callback] + others[first:]

