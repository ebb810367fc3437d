"""Live peer runs that tests and benchmarks both take as the truth: a real greedy
``generate()`` under ``torch.utils.flop_counter.FlopCounterMode`` (FLOPs of each forward, and
the cache it returns), the bytes a real cache holds, and torch's ``MemTracker`` on a real AMP
training step. Imported by tests/ and by benchmarks/ (which put tests/ on ``sys.path``)."""

from __future__ import annotations

import contextlib
import copy
import functools
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


@contextlib.contextmanager
def forward_flops(model: nn.Module) -> Iterator[List[int]]:
    """FlopCounterMode's FLOPs of each call of ``model.forward`` while the block runs (the list
    it yields fills in call order); the model's own ``forward`` is back after."""
    flops: List[int] = []
    forward = model.forward

    @functools.wraps(forward)  # generate reads the forward's signature (logits_to_keep)
    def counted(*args: Any, **kwargs: Any) -> Any:
        with FlopCounterMode(display=False) as counter:
            out = forward(*args, **kwargs)
        flops.append(counter.get_total_flops())
        return out

    model.forward = counted
    try:
        yield flops
    finally:
        del model.forward


def generate_truth(model: nn.Module, ids: torch.Tensor, new_tokens: int,
                   options: Optional[Dict[str, Any]] = None) -> Tuple[List[int], Any]:
    """FlopCounterMode's FLOPs of each forward a real greedy generate() runs (``options``: more
    arguments of generate(), as ``encoder_outputs=``), and its cache."""
    with forward_flops(model) as flops:
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             return_dict_in_generate=True, **(options or {}))
    # an encoder-decoder's sequences start from its decoder start token, not the prompt
    start = 1 if getattr(getattr(model, "config", None), "is_encoder_decoder", False) else ids.shape[1]
    assert out.sequences.shape == (ids.shape[0], start + new_tokens)
    return flops, out.past_key_values


def generate_calls(model: nn.Module, ids: torch.Tensor, new_tokens: int, options: Optional[Dict[str, Any]] = None
                   ) -> List[Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]]:
    """Each forward a real greedy generate() runs, in order, as ``(module, args, kwargs)``: the
    model's, and an encoder-decoder's encoder (generate() runs it on its own, before the first
    decoder forward), with the arguments each received (a forward pre-hook with kwargs),
    deep-copied before it ran: the cache as it was then, so that a replay runs the same call."""
    calls: List[Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]] = []
    running: List[nn.Module] = []  # the model's forward while it runs: the encoder inside it is part of it

    def keep(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        if module is model or not running:
            calls.append((module, *copy.deepcopy((args, kwargs))))

    modules = [model]
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        modules.append(model.get_encoder())  # generate() runs the encoder on its own, before the decoder
    handles = [m.register_forward_pre_hook(keep, with_kwargs=True) for m in modules]

    def enter(*_: Any) -> None:
        running.append(model)

    def leave(*_: Any) -> None:
        running.pop()

    handles.append(model.register_forward_pre_hook(enter))
    handles.append(model.register_forward_hook(leave))
    try:
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **(options or {}))
    finally:
        for handle in handles:
            handle.remove()
    return calls


def generate_all_flops(model: nn.Module, ids: torch.Tensor, new_tokens: int,
                       options: Optional[Dict[str, Any]] = None) -> List[Dict[str, int]]:
    """flopcount's dispatch tracer on each forward a real greedy generate() runs, replayed with
    the exact arguments it received (:func:`generate_calls`): the FLOPs of every operator of each
    forward (``by_operator()``), the element-wise ones (mask building, positions, rotary, norms,
    softmax) included; an encoder-decoder's encoder run is booked with the first decoder forward,
    as count_generation's prefill books it."""
    from flopcount import count_flops

    forwards: List[Dict[str, int]] = []
    pending: Dict[str, int] = {}
    for module, args, kwargs in generate_calls(model, ids, new_tokens, options):
        rows = count_flops(module, args, kwargs, tracer="dispatch").by_operator()
        for op, flops in pending.items():
            rows[op] = rows.get(op, 0) + flops
        pending = {}
        if module is model:
            forwards.append(rows)
        else:
            pending = rows
    return forwards


def held_bytes(obj: Any) -> int:
    """Bytes of every storage reachable from a real cache, once per data pointer."""
    storages: Dict[int, int] = {}
    stack, seen = [obj], set()
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storages[item.untyped_storage().data_ptr()] = item.untyped_storage().nbytes()
        elif id(item) not in seen and item is not None and not isinstance(item, (int, float, str, bool)):
            seen.add(id(item))
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, (list, tuple)):
                stack.extend(item)
            elif hasattr(item, "__dict__"):
                stack.extend(vars(item).values())
    return sum(storages.values())


def loop_peaks(model: nn.Module, x: torch.Tensor, steps: int = 3) -> Tuple[List[int], torch.optim.Optimizer]:
    """MemTracker's peak of each step of a real AdamW training loop of ``model`` (itself, not a
    copy: ``loss = default_loss(model(x)); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)``),
    and the optimizer: the second and later steps are the steady state a plan or an estimate sizes."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from flopcount.planning.step import make_optimizer
    from flopcount.step.loss import default_loss

    opt = make_optimizer("adamw", model)
    peaks = []
    for _ in range(steps):
        tracker = MemTracker()
        tracker.track_external(model, opt, x)
        with tracker:
            default_loss(model(x)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        peaks.append(sum(int(s["Total"]) for s in tracker.get_tracker_snapshot("peak").values()))
    return peaks, opt


def warmed_step_peak(model: nn.Module, x: torch.Tensor, optimizer: type) -> int:
    """MemTracker's peak of a real training step on a copy (sum loss, backward, ``optimizer``'s
    step), its state made first by one step on zero gradients: the steady-state step."""
    from torch.distributed._tools.mem_tracker import MemTracker

    real = copy.deepcopy(model)
    opt = optimizer(real.parameters())
    for p in real.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(real, opt, x)
    with tracker:
        loss = real(x).sum()
        loss.backward()
        del loss
        opt.step()
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return int(peak["Total"])


def amp_step_peak(model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], *, backward: bool,
              adam: bool, amp: Optional[torch.dtype], everything_under_autocast: bool = False) -> int:
    """MemTracker's peak of the real step on a copy: forward + loss under autocast(amp), then
    backward and the Adam step outside it (or inside, with ``everything_under_autocast``)."""
    model = copy.deepcopy(model)
    opt = None
    if adam:
        opt = torch.optim.Adam(model.parameters())
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, opt, *[t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)])

    def rest(loss: torch.Tensor) -> None:
        loss.backward()
        if opt is not None:
            opt.step()

    with tracker, torch.set_grad_enabled(backward):
        with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
            out = model(*args, **kwargs)
            loss = out.loss if getattr(out, "loss", None) is not None else out.sum()
            del out
            if everything_under_autocast and backward:
                rest(loss)
        if backward and not everything_under_autocast:
            rest(loss)
        del loss
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return int(peak["Total"])
