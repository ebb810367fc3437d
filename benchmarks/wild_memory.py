"""estimate_memory against torch's MemTracker on the real CPU step, on patterns real training
code writes (branch wildmem): checkpointing, in-place ops, views, foreach and for-loop
optimizers, frozen and tied parameters, BatchNorm, autocast, several outputs, no_grad inside
forward, an early ``del``, a custom autograd.Function, attention, recurrent layers.

The real step (on a copy): its optimizer state made by one earlier step (warm-up on zero
gradients of the parameters that get one), then forward, the default loss (flopcount's rule,
here the sum of the outputs), the outputs released, backward, the loss released, the
optimizer step; with ``amp`` the forward and loss under ``torch.autocast(bfloat16)``.

    PYTHONPATH=. .venv/bin/python benchmarks/wild_memory.py [case ...]
"""

from __future__ import annotations

import copy
import sys
import warnings
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.utils.checkpoint as ckpt
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from flopcount.memory.estimate import estimate_memory
from flopcount.step.loss import default_loss

Case = Tuple[nn.Module, Tuple[torch.Tensor, ...], Optional[str], Optional[torch.dtype]]

OPTIMIZERS: Dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw": lambda ps: torch.optim.AdamW(ps),
    "adamw-loop": lambda ps: torch.optim.AdamW(ps, foreach=False),
    "adamw-foreach": lambda ps: torch.optim.AdamW(ps, foreach=True),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd-momentum-foreach": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True),
}


class _NoHook:
    def remove(self) -> None:
        pass


def real_peak(model: nn.Module, args: Tuple[torch.Tensor, ...], opt_name: Optional[str], amp: Optional[torch.dtype]) -> int:
    """MemTracker's peak of the real steady-state step on a copy (module docstring)."""
    model, args = copy.deepcopy(model), copy.deepcopy(args)
    opt = None
    if opt_name is not None:
        opt = OPTIMIZERS[opt_name]([p for p in model.parameters() if p.requires_grad])
        with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
            warm = default_loss(model(*copy.deepcopy(args)))
        warm.backward()
        for p in model.parameters():
            if p.grad is not None:
                p.grad = torch.zeros_like(p.grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model, *([opt] if opt is not None else []), *args)
    for p in model.parameters():  # MemTracker hooks every parameter, which raises on frozen ones
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
    with tracker:
        with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
            out = model(*args)
            loss = default_loss(out)
            del out
        loss.backward()
        del loss
        if opt is not None:
            opt.step()
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return int(peak["Total"])


class Block(nn.Module):
    def __init__(self, d: int = 64, inplace: bool = False) -> None:
        super().__init__()
        self.a, self.r, self.b = nn.Linear(d, 4 * d), nn.ReLU(inplace=inplace), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(self.r(self.a(x)))


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool, n: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = ckpt.checkpoint(block, x, use_reentrant=self.reentrant)
        return x


class CheckpointSequential(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(*[Block() for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ckpt.checkpoint_sequential(self.seq, 2, x, use_reentrant=False)


class InPlaceChain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        y.add_(1).mul_(2).relu_()
        return y * y


class Views(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x).view(32, 2, 64).transpose(0, 1).contiguous().reshape(64, 64)
        return y.t().contiguous()[:, :10]


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.block, self.head = nn.Embedding(500, 64), Block(), nn.Linear(64, 500, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.emb(x)))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.Conv2d(16, 8, 3))


class MultiOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 32), nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> Any:
        return self.a(x), self.b(x), {"c": self.a(x).mean()}


class NoGradInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.student, self.teacher = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = self.teacher(x).softmax(-1)
        return (self.student(x) - target) ** 2


class DelEarly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 1024), nn.Linear(1024, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = self.a(x).exp()
        scale = big.sum(-1, keepdim=True)
        del big
        return self.b(torch.ones(32, 1024) * scale)


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x @ w
        ctx.save_for_backward(x, w, y)
        return y * y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        x, w, y = ctx.saved_tensors
        gy = 2 * grad * y
        return gy @ w.t(), x.t() @ gy


class Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Square.apply(x, self.w)


class Attention(nn.Module):
    def __init__(self, need_weights: bool) -> None:
        super().__init__()
        self.mha, self.need_weights = nn.MultiheadAttention(64, 4, batch_first=True), need_weights

    def forward(self, x: torch.Tensor) -> Any:
        out, weights = self.mha(x, x, x, need_weights=self.need_weights)
        return out if weights is None else (out, weights)


class Recurrent(nn.Module):
    """The output sequence of ``kind`` (nn.LSTM, nn.GRU, nn.RNN) as the model's output."""

    def __init__(self, kind: type, *args: Any, **options: Any) -> None:
        super().__init__()
        self.rnn = kind(*args, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


class CellLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(32, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = torch.zeros(x.shape[1], 48)
        outs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
            outs.append(h)
        return torch.stack(outs)


def frozen(weights_only: bool) -> nn.Module:
    model = nn.Sequential(Block(), Block(), nn.Linear(64, 10))
    for name, p in model.named_parameters():
        if name.endswith("weight") if weights_only else name.startswith("0."):
            p.requires_grad_(False)
    return model


def mlp() -> nn.Module:
    return nn.Sequential(Block(), Block())


def rows(n: int = 32) -> torch.Tensor:
    return torch.randn(n, 64)


BF16 = torch.bfloat16
CASES: Dict[str, Callable[[], Case]] = {
    "checkpoint, non-reentrant": lambda: (Checkpointed(False), (rows(),), "adamw", None),
    "checkpoint, reentrant": lambda: (Checkpointed(True), (rows().requires_grad_(),), "adamw", None),
    "checkpoint_sequential": lambda: (CheckpointSequential(), (rows(),), "adamw", None),
    "checkpoint, autocast": lambda: (Checkpointed(False), (rows(),), "adamw", BF16),
    "checkpoint, autocast, no optimizer": lambda: (Checkpointed(False), (rows(),), None, BF16),
    "checkpoint, reentrant, autocast": lambda: (Checkpointed(True, 1), (rows().requires_grad_(),), None, BF16),
    "checkpoint_sequential, autocast": lambda: (CheckpointSequential(), (rows(),), None, BF16),
    "ReLU(inplace=True)": lambda: (nn.Sequential(Block(inplace=True), Block(inplace=True)), (rows(),), "sgd-momentum", None),
    "add_/mul_/relu_ chain": lambda: (InPlaceChain(), (rows(),), "adamw", None),
    "views and .contiguous()": lambda: (Views(), (rows(),), "adamw", None),
    "AdamW foreach": lambda: (mlp(), (rows(),), "adamw-foreach", None),
    "AdamW for-loop": lambda: (mlp(), (rows(),), "adamw-loop", None),
    "SGD momentum foreach": lambda: (mlp(), (rows(),), "sgd-momentum-foreach", None),
    "frozen first block": lambda: (frozen(False), (rows(),), "adamw", None),
    "frozen weights, biases trained": lambda: (frozen(True), (rows(),), "adamw", None),
    "tied embedding": lambda: (Tied(), (torch.randint(0, 500, (4, 16)),), "adamw", None),
    "BatchNorm (train)": lambda: (cnn(), (torch.randn(4, 3, 32, 32),), "sgd-momentum", None),
    "BatchNorm, autocast": lambda: (cnn(), (torch.randn(4, 3, 32, 32),), "adamw", BF16),
    "MLP, autocast": lambda: (mlp(), (rows(),), "adamw", BF16),
    "several outputs summed": lambda: (MultiOutput(), (rows(),), "adamw", None),
    "no_grad inside forward": lambda: (NoGradInside(), (rows(),), "adamw", None),
    "large intermediate del'd": lambda: (DelEarly(), (rows(),), "adamw", None),
    "custom autograd.Function": lambda: (Custom(), (rows(),), "adamw", None),
    "MultiheadAttention need_weights": lambda: (Attention(True), (torch.randn(4, 16, 64),), "adamw", None),
    "MultiheadAttention no weights": lambda: (Attention(False), (torch.randn(4, 16, 64),), "adamw", None),
    "TransformerEncoder (train)": lambda: (
        nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2), (torch.randn(4, 16, 64),), "adamw", None),
    "Dropout + GELU": lambda: (
        nn.Sequential(nn.Linear(64, 256), nn.Dropout(0.1), nn.GELU(), nn.Linear(256, 64)), (rows(),), "adamw", None),
    "LSTM 2 layers": lambda: (Recurrent(nn.LSTM, 32, 64, num_layers=2, batch_first=True), (torch.randn(4, 10, 32),), "adamw", None),
    "LSTM bidirectional 3 layers": lambda: (
        Recurrent(nn.LSTM, 32, 48, num_layers=3, bidirectional=True), (torch.randn(7, 3, 32),), "adamw", None),
    "LSTM eval mode": lambda: (Recurrent(nn.LSTM, 32, 48, num_layers=2).eval(), (torch.randn(7, 3, 32),), "adamw", None),
    "LSTM, autocast": lambda: (Recurrent(nn.LSTM, 32, 48, num_layers=2), (torch.randn(7, 3, 32),), "adamw", BF16),
    "LSTM proj_size": lambda: (Recurrent(nn.LSTM, 32, 48, num_layers=2, proj_size=16), (torch.randn(7, 3, 32),), "adamw", None),
    "LSTM 2x512, 64 steps x 16": lambda: (Recurrent(nn.LSTM, 256, 512, num_layers=2), (torch.randn(64, 16, 256),), "adamw", None),
    "LSTMCell loop": lambda: (CellLoop(), (torch.randn(7, 3, 32),), "adamw", None),
    "GRU bidirectional": lambda: (Recurrent(nn.GRU, 32, 64, batch_first=True, bidirectional=True), (torch.randn(4, 10, 32),), "adamw", None),
    "RNN tanh": lambda: (Recurrent(nn.RNN, 32, 48, num_layers=2), (torch.randn(7, 3, 32),), "adamw", None),
}


def main(names: Any) -> None:
    print("| pattern | estimate B | MemTracker B | difference |\n|---|---|---|---|")
    for name in names or CASES:
        torch.manual_seed(0)
        model, args, opt_name, amp = CASES[name]()
        truth = real_peak(model, args, opt_name, amp)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimizer = OPTIMIZERS[opt_name] if opt_name is not None else None
            estimate = estimate_memory(model, args, backward=True, optimizer=optimizer, autocast=amp).peak_bytes
        print(f"| {name} | {estimate:,} | {truth:,} | {estimate - truth:+,} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
