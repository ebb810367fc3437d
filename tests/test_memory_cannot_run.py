"""estimate_memory of a forward that cannot run: operands of two dtypes that the real CPU kernel
refuses and the meta kernel accepts (a float16 input into a float32 ``Linear``) gave a peak for a
step that raises (noticed by branch apiwalk). The fake step now applies the real kernels' dtype
checks, as the count's recorder does. Oracle: the real forward, run live, and its own error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import estimate_memory
from flopcount.errors import TraceError


class _Bmm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 8, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, self.weight)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("model, x", [
    (nn.Linear(16, 32), torch.randn(4, 16).half()),
    (nn.Sequential(nn.Linear(16, 16), nn.ReLU()), torch.randn(2, 3, 16, dtype=torch.bfloat16)),
    (_Bmm(), torch.randn(3, 4, 8, dtype=torch.float64)),
], ids=["linear-fp16-input", "sequential-bf16-batched", "bmm-fp64-input"])
def test_a_step_whose_real_kernel_refuses_its_dtypes_is_refused_with_the_real_error(model, x, backward):
    with pytest.raises(RuntimeError) as real:
        model(x)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TraceError) as raised:
        estimate_memory(model, x, backward=backward)
    message = str(raised.value)
    assert str(real.value).splitlines()[0] in message
    assert "RuntimeError" in message and "RealKernelError" not in message
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_operands_the_real_kernel_accepts_still_get_their_peak():
    """A float32 input into a float32 model: the same estimate as before, equal to the bytes by
    hand (weights 16 x 32 + 32, input 4 x 16, output 4 x 32, all float32)."""
    estimate = estimate_memory(nn.Linear(16, 32), torch.randn(4, 16))
    assert estimate.peak_bytes == 4 * (16 * 32 + 32 + 4 * 16 + 4 * 32)
