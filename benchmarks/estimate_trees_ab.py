"""``estimate_memory`` of another commit and of this checkout, paired in ONE process (branch gaps4),
as ``count_trees_ab.py`` pairs the count: the other commit's ``flopcount/`` imported as
``flopcount_base``, each round estimating ``--per`` times with one side and then the other, in an
order that alternates; CPU time of the estimating thread; the median of the per-round ratios, with
their quartiles; both sides must give the same peak. Models without transformers modules (the
fake step's index checks run for those): a 2-block MLP (inference), a hand-written GPT with a
learned position table (training step, AdamW), torchvision's ResNet-18 (inference, if installed).

    PYTHONPATH=. .venv/bin/python benchmarks/estimate_trees_ab.py --commit main [--rounds 15] [--per 3]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from _interleave import paired_cpu  # noqa: E402
from count_trees_ab import _load, _quartiles, renamed_package  # noqa: E402
from torch import nn  # noqa: E402

from flopcount import estimate_memory  # noqa: E402

warnings.simplefilter("ignore")


class HandGPT(nn.Module):
    """Token and learned position tables (the positions made by ``arange``), two MLP blocks, a head."""

    def __init__(self, vocab: int = 1000, rows: int = 256, width: int = 128) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(rows, width)
        self.blocks = nn.Sequential(*[nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                                    nn.Linear(4 * width, width)) for _ in range(2)])
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.blocks(x))


def _cases(names: List[str]) -> Dict[str, Tuple[nn.Module, Any, Dict[str, Any]]]:
    torch.manual_seed(0)
    made: Dict[str, Tuple[nn.Module, Any, Dict[str, Any]]] = {}
    if "mlp" in names:
        mlp = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256), nn.ReLU(), nn.Linear(256, 10))
        made["MLP 256-1024-256-10, batch 64, inference"] = mlp, torch.randn(64, 256), {}
    if "gpt" in names:
        ids = torch.randint(0, 1000, (4, 256))
        made["hand GPT 2 blocks, 4x256 ids, AdamW step"] = HandGPT(), ids, {"backward": True, "optimizer": "adamw"}
    if "resnet18" in names:
        try:
            from torchvision.models import resnet18
        except ImportError:
            print("torchvision not installed: resnet18 left out")
        else:
            made["ResNet-18 1x3x224x224, inference"] = resnet18().eval(), torch.randn(1, 3, 224, 224), {}
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="main", help="the other commit (its flopcount/)")
    parser.add_argument("--models", default="mlp,gpt,resnet18")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per", type=int, default=3, help="estimates per side and round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        sys.path.insert(0, str(renamed_package(args.commit, Path(folder))))
        import flopcount_base  # type: ignore[import-not-found]

        sides: Dict[str, Callable[..., Any]] = {"base": flopcount_base.estimate_memory, "this": estimate_memory}
        print(f"base {args.commit} (as flopcount_base), this {ROOT}; torch {torch.__version__}, 1 thread; "
              f"{args.rounds} rounds x {args.per} estimates per side; load {_load()} at start, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        print("| model | base median ms (min) | this median ms (min) | per-round ratio: median (quartiles) | same peak |")
        print("|---|---|---|---|---|")
        for label, (net, inputs, options) in _cases(args.models.split(",")).items():
            peaks = {side: estimate(net, inputs, **options).peak_bytes for side, estimate in sides.items()}
            spent, ratios = paired_cpu({side: functools.partial(sides[side], net, inputs, **options) for side in sides},
                                       args.rounds, args.per)
            low, middle, high = _quartiles(ratios)
            base, this = spent["base"], spent["this"]
            print(f"| {label} | {statistics.median(base) * 1e3:.2f} ({min(base) * 1e3:.2f}) | "
                  f"{statistics.median(this) * 1e3:.2f} ({min(this) * 1e3:.2f}) | {middle:.3f} ({low:.3f}-{high:.3f}) | "
                  f"{peaks['base'] == peaks['this']} ({peaks['this']:,} B) |", flush=True)
    print(f"load at the end {_load()}")


if __name__ == "__main__":
    main()
