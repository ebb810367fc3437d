"""One resolver of the MFU's peak (issue #27: integrations._rates.resolve_peak and
bench.latency.mfu_peak (now bench.peak) each looked the datasheet peak up and checked peak_flops= in their
own words): benchmark, StepTimer and the trainer callbacks refuse a bad peak alike and read
the same datasheet figure."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount.bench import StepTimer, benchmark
from flopcount.bench.peak import mfu_peak
from flopcount.errors import UsageError
from flopcount.integrations._rates import resolve_peak

CPU = torch.device("cpu")


@pytest.mark.parametrize("bad", [0.0, -1e12, float("nan")])
def test_a_peak_not_above_zero_is_refused_in_the_same_words_everywhere(bad: float) -> None:
    messages = []
    for call in (
        lambda: benchmark(nn.Linear(4, 4), (torch.randn(2, 4),), iters=1, warmup=0, peak_flops=bad),
        lambda: StepTimer(peak_flops=bad),
        lambda: StepTimer().set_step_cost(10, peak_flops=bad),
        lambda: resolve_peak(CPU, torch.float32, bad),
    ):
        with pytest.raises(UsageError) as caught:
            call()
        messages.append(str(caught.value))
    assert len(set(messages)) == 1, messages
    assert messages[0] == f"peak_flops must be a positive FLOP/s figure, got {bad!r}"


def test_the_modeled_part_gives_one_figure_to_benchmark_and_to_the_callbacks() -> None:
    # NVIDIA H100 SXM datasheet (dense): 989.5 TFLOP/s BF16, 67 TFLOP/s FP32 (REFERENCES.md)
    for dtype, figure in ((torch.bfloat16, 989.5e12), (torch.float32, 67e12)):
        peak, source = mfu_peak(CPU, dtype, None, "h100")
        assert peak == pytest.approx(figure) and source is not None and "dense" in source
        assert resolve_peak(CPU, dtype, None, on="h100") == (pytest.approx(figure), "")
    # no part and no GPU: neither has a peak; the callbacks say why
    assert mfu_peak(CPU, torch.float32, None, None) == (None, None)
    assert resolve_peak(CPU, torch.float32, None)[0] is None
