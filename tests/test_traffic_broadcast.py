"""``index_put_`` writes the elements its index tensors select: their broadcast shape times the
dimensions no index covers (docs/conventions.md, "Bytes"). The broadcast follows numpy's rule,
which torch applies to the indices: a size-0 axis against a size-1 axis is 0 (an empty index
selects nothing). The expected counts take the shape from ``torch.broadcast_shapes`` (live
torch), the bytes from the element sizes: fp32 = 4, int64 = 8."""

from __future__ import annotations

from math import prod

import pytest
import torch
from torch import nn

from flopcount import count_flops

TRACERS = ["auto", "dispatch", "jit"]


class _Put(nn.Module):
    """A (rows, 8) fp32 buffer written in place at ``buf[rows, cols] = values``."""

    def __init__(self, rows: int):
        super().__init__()
        self.register_buffer("buf", torch.zeros(rows, 8))

    def forward(self, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        self.buf.index_put_((rows, cols), values)
        return self.buf[:1].sum()


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [0, 1, 3])  # 0: an empty row index beside a one-element column index
@pytest.mark.parametrize("train", [False, True])
def test_index_put_writes_the_broadcast_of_its_indices(tracer, batch, train):
    rows = torch.arange(batch, dtype=torch.int64)
    cols = torch.tensor([5])
    selected = prod(torch.broadcast_shapes(rows.shape, cols.shape))  # (batch,) against (1,): batch, 0 for 0
    values = torch.randn(selected)
    model = _Put(4).train(train)
    before = model.buf.clone()
    r = count_flops(model, (rows, cols, values), tracer=tracer)
    assert torch.equal(model.buf, before)  # left as found
    totals = r.operator_totals()["aten::index_put_"]
    # read: both index tensors (int64) and the values (fp32); written: the selected fp32 elements
    assert (totals.bytes_read, totals.bytes_written) == (8 * (batch + 1) + 4 * selected, 4 * selected)
