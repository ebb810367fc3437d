"""estimate_memory against the CUDA caching allocator's own count of a real training step.

For each model and mode (inference, forward + backward, + Adam), in this order: the estimate
(fake tensors, nothing allocated), then the real step on the GPU, measured as
``max_memory_allocated() - memory_allocated()`` taken just before the model and its inputs were
built (so nothing another part of the process holds is charged), three ways:

* the first real step (what it allocates once for the process, e.g. cuBLAS's workspace the
  first time a handle is used, is in its peak if nothing earlier allocated it);
* the second step (Adam's state now exists: the steady state);
* the second step with cuDNN disabled (no convolution workspaces);

and torch's MemTracker on the real step (tensors only: the independent tensor-level oracle).

    PYTHONPATH=. python benchmarks/gpu_memory.py
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

import flopcount

MODES = [(False, None), (True, None), (True, "adam")]


def cnn() -> Tuple[nn.Module, Tuple[Any, ...]]:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return model, (torch.randn(32, 3, 64, 64),)


def mlp() -> Tuple[nn.Module, Tuple[Any, ...]]:
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)), (torch.randn(64, 1024),)


def encoder() -> Tuple[nn.Module, Tuple[Any, ...]]:
    return (nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True),
            (torch.randn(16, 128, 256),))


def resnet18() -> Tuple[nn.Module, Tuple[Any, ...]]:
    from flopcount.examples import resnet

    return resnet.resnet18(), (torch.randn(16, 3, 224, 224),)


def _step(model: nn.Module, args: Tuple[Any, ...], backward: bool, opt: Optional[torch.optim.Optimizer]) -> None:
    with torch.set_grad_enabled(backward):
        out = model(*args)
        if backward:
            loss = out.sum()
            del out
            loss.backward()
            del loss
    if opt is not None:
        opt.step()


def _real(build: Callable[[], Tuple[nn.Module, Tuple[Any, ...]]], backward: bool, optimizer: Optional[str],
          steps: int) -> List[int]:
    """Peak above the baseline of each of ``steps`` real steps (grads set to None between)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model, args = build()
    model, args = model.cuda(), tuple(a.cuda() for a in args)
    opt = torch.optim.Adam(model.parameters()) if optimizer else None
    peaks = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        _step(model, args, backward, opt)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
    del model, args, opt
    return peaks


def _tracked(build: Callable[[], Tuple[nn.Module, Tuple[Any, ...]]], backward: bool, optimizer: Optional[str]) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model, args = build()
    model, args = model.cuda(), tuple(a.cuda() for a in args)
    opt = torch.optim.Adam(model.parameters()) if optimizer else None
    tracker = MemTracker()
    tracker.track_external(model, *( [opt] if opt else []))
    with tracker:
        _step(model, args, backward, opt)
    peak = 0
    snap = tracker.get_tracker_snapshot("peak")
    for dev, kinds in snap.items():
        if isinstance(dev, torch.device) and dev.type == "cuda":
            peak = int(kinds["Total"])
    del model, args, opt
    return peak


def main() -> None:
    warnings.simplefilter("ignore")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "cuDNN", torch.backends.cudnn.version(), flush=True)
    print(f"{'model':9s} {'mode':13s} {'estimate':>12s} {'1st step':>12s} {'2nd step':>12s} {'no cuDNN':>12s} "
          f"{'MemTracker':>12s}  est/2nd  est/MemTracker", flush=True)
    builds: Dict[str, Callable[[], Tuple[nn.Module, Tuple[Any, ...]]]] = {
        "cnn": cnn, "mlp": mlp, "encoder": encoder, "resnet18": resnet18}
    for name, build in builds.items():
        for backward, optimizer in MODES:
            mode = "inference" if not backward else ("fwd+bwd+adam" if optimizer else "fwd+bwd")
            torch.manual_seed(0)
            model, args = build()
            model, args = model.cuda(), tuple(a.cuda() for a in args)
            est = flopcount.estimate_memory(model, *args, backward=backward, optimizer=optimizer).peak_bytes
            del model, args
            first, second = _real(build, backward, optimizer, 2)
            with torch.backends.cudnn.flags(enabled=False):
                nocudnn = _real(build, backward, optimizer, 2)[1]
            tracked = _tracked(build, backward, optimizer)
            print(f"{name:9s} {mode:13s} {est:12,d} {first:12,d} {second:12,d} {nocudnn:12,d} {tracked:12,d}  "
                  f"{est / second:6.3f}  {est / tracked if tracked else float('nan'):6.3f}", flush=True)


if __name__ == "__main__":
    main()
