"""What a count's rows feed, to compare two trees (issue #27 item 6, branch onerow: the count's
``operator_totals()`` / ``module_totals(name)`` rows became ``CostRow`` s; every rendering that
reads them must stay as it was).

    PYTHONPATH=. python benchmarks/count_rows_digest.py > after.txt
    git archive BASE | tar -x -C /tmp/base && cp benchmarks/count_rows_digest.py /tmp/base/benchmarks/
    (cd /tmp/base && PYTHONPATH=. python benchmarks/count_rows_digest.py) > before.txt
    diff before.txt after.txt

Per model (a Linear shared under two names, a CNN, a transformer encoder layer) and per phase
set (forward; forward + backward): a hash (SHA-256, first 16 hex digits) of to_json, to_csv, the
module and operator tables, the tree, markdown, the same after a JSON round trip, a diff against
another count, tensorboard's operator table and the plot's leaves. ``--time``: the CPU time of
to_dict, table, every module_totals and operator_totals on a 1,601-module stack instead.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from typing import Any, Callable, Dict, Tuple

import torch
from torch import nn

import flopcount
from flopcount.integrations.tensorboard import _operator_markdown
from flopcount.report.plot import _leaves


class SharedProj(nn.Module):
    """``proj`` is also ``a.0``; ``b`` is called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.a = nn.Sequential(self.proj, nn.ReLU())
        self.b = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) + self.b(torch.relu(self.proj(x)))


def _cases() -> Dict[str, Tuple[nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    encoder = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    return {
        "shared": (SharedProj().eval(), torch.randn(3, 8)),
        "conv": (conv.eval(), torch.randn(2, 3, 8, 8)),
        "encoder": (encoder.eval(), torch.randn(2, 5, 16)),
    }


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def digests() -> None:
    for name, (model, x) in _cases().items():
        for backward in (False, True):
            result = flopcount.count_flops(model, x, backward=backward)
            back = flopcount.FlopResult.from_dict(json.loads(result.to_json()))
            changed = flopcount.diff(result, flopcount.count_flops(model, x, backward=not backward))
            outputs = {
                "json": result.to_json(), "csv": result.to_csv(), "table": result.table(),
                "operator_table": result.operator_table(), "tree": result.tree(), "markdown": result.to_markdown(),
                "read_back_json": back.to_json(), "read_back_table": back.table(),
                "read_back_operator_table": back.operator_table(),
                "diff_table": changed.table(), "diff_json": json.dumps(changed.to_dict(), default=str),
                "tensorboard": _operator_markdown(result), "plot_leaves": repr(_leaves(result, None)) + repr(_leaves(result, 1)),
            }
            for key, text in outputs.items():
                print(name, "backward" if backward else "forward", key, _digest(text))


def _cpu_ms(call: Callable[[], Any], repeats: int = 10, rounds: int = 5) -> float:
    """The best of ``rounds`` mean CPU times of ``call``, in ms."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(repeats):
            call()
        best = min(best, (time.process_time() - start) / repeats)
    return best * 1e3


def timings() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU()) for _ in range(400)]).eval()
    result = flopcount.count_flops(model, torch.randn(4, 32))
    print(f"modules {len(result.modules)}, operators {len(result.operator_totals())}")
    calls: Dict[str, Callable[[], Any]] = {
        "to_dict": result.to_dict,
        "table": result.table,
        "module_totals of every module": lambda: [result.module_totals(m.name) for m in result.modules],
        "operator_totals": result.operator_totals,
    }
    for name, call in calls.items():
        print(f"{name}: {_cpu_ms(call):.2f} ms CPU")


if __name__ == "__main__":
    timings() if "--time" in sys.argv[1:] else digests()
