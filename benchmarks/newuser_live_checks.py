"""A new user's first counts, checked live (branch newuser's audit, docs/performance.md): torchvision
models the docs do not use, at batch 1, a non-contiguous batch of 3 (channels-last memory read as
NCHW) and batch 2 in bfloat16, against ``torch.utils.flop_counter.FlopCounterMode`` run on the real
forward (2 x MACs, since FlopCounterMode counts contractions only), and ``estimate_memory`` against
torch's ``MemTracker`` on a real step (inference and forward + backward).

MemTracker is entered after the input exists, so it does not see the input's bytes; the estimate
holds them: the expected difference is exactly the input's size.

Run in the zoo's venv (torchvision): ``PYTHONPATH=. .venv-zoo/bin/python benchmarks/newuser_live_checks.py``.
"""

from __future__ import annotations

import torch
import torchvision
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops
from flopcount.memory import estimate_memory

MODELS = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "swin_t", "vit_b_16")


def inputs() -> list[tuple[str, torch.Tensor]]:
    channels_last = torch.randn(3, 224, 224, 3).permute(0, 3, 1, 2)  # NCHW view, not contiguous
    return [
        ("batch 1", torch.randn(1, 3, 224, 224)),
        ("batch 3, not contiguous", channels_last),
        ("batch 2, bfloat16", torch.randn(2, 3, 224, 224, dtype=torch.bfloat16)),
    ]


def live_flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    return counter.get_total_flops()


def live_peak(model: torch.nn.Module, x: torch.Tensor, backward: bool) -> int:
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        if backward:
            model(x).sum().backward()
        else:
            with torch.no_grad():
                model(x)
    model.zero_grad(set_to_none=True)
    peaks = tracker.get_tracker_snapshot("peak")
    return sum(by_kind.get("Total", 0) for by_kind in peaks.values())


def main() -> None:
    print("model | input | 2 x MACs | FlopCounterMode | equal")
    for name in MODELS:
        model = torchvision.models.get_model(name, weights=None).eval()
        for label, x in inputs():
            model = model.to(x.dtype)
            counted = 2 * count_flops(model, x).macs
            live = live_flops(model, x)
            print(f"{name} | {label} | {counted} | {live} | {counted == live}")
    print()
    print("model | step | estimate_memory peak | MemTracker peak | difference | input bytes")
    for name in ("resnet18", "mobilenet_v3_small", "vit_b_16"):
        for backward in (False, True):
            model = torchvision.models.get_model(name, weights=None).train(backward)
            x = torch.randn(2, 3, 224, 224)
            estimate = estimate_memory(model, x, backward=backward).peak_bytes
            live = live_peak(model, x, backward)
            step = "forward + backward" if backward else "inference"
            print(f"{name} | {step} | {estimate} | {live} | {estimate - live} | {x.numel() * x.element_size()}")


if __name__ == "__main__":
    main()
