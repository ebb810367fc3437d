"""A forward that cannot run on the meta device (or on fake tensors) is refused with one
:class:`~flopcount.errors.NeedsDataError` (a UsageError) naming the module and the call, never a
bare torch error: ``.cpu()``, ``.to("cpu")`` and ``.numpy()`` of an intermediate (transformers
5.17's Aria experts call ``tokens_per_expert.cpu()``), ``nonzero``. On real weights the same
forward is counted, and its contractions equal FlopCounterMode's, run live."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops
from flopcount.cli import main
from flopcount.errors import NeedsDataError, TraceError, UsageError

EXPERTS, WIDTH, TOKENS = 3, 8, 6


def _host_sizes(counts: torch.Tensor, how: str) -> list:
    """The tokens per expert as Python ints, read on the host the way ``how`` says."""
    if how == "cpu":
        return counts.cpu().tolist()
    if how == "to_cpu":
        return counts.to("cpu").tolist()
    return [int(n) for n in counts.numpy()]


class Experts(nn.Module):
    """Routes each token to one expert, reads the tokens per expert on the host (as Aria's
    grouped GEMM does) and runs each expert on its slice of the sorted tokens."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.router = nn.Linear(WIDTH, EXPERTS)
        self.experts = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.router(x).argmax(-1)
        order = torch.argsort(choice)
        counts = torch.stack([(choice == e).sum() for e in range(EXPERTS)])
        start, outs = 0, []
        for expert, size in zip(self.experts, _host_sizes(counts, self.how)):
            outs.append(expert(x[order[start:start + size]]))
            start += size
        return torch.cat(outs)


class Model(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.moe = Experts(how)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(self.embed(x))


HOW = ["cpu", "to_cpu", "numpy"]


def _meta_model(how: str) -> nn.Module:
    with torch.device("meta"):
        return Model(how)


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize("how", HOW)
def test_host_read_on_meta_is_refused_naming_the_module(how: str, tracer: str) -> None:
    model = _meta_model(how)
    x = torch.randn(TOKENS, WIDTH, device="meta")
    with pytest.raises(NeedsDataError) as caught:
        count_flops(model, (x,), tracer=tracer)
    refusal = caught.value
    assert isinstance(refusal, UsageError) and isinstance(refusal, TraceError)
    assert refusal.module_path == "moe"
    text = str(refusal)
    assert "module 'moe'" in text and "meta device" in text
    assert "real weights" in text and "tracer='dispatch' on real tensors" in text
    # the call that needed the values is named: the copy to the host, or the numpy conversion
    assert ("numpy" if how == "numpy" else "aten::_to_copy") in text
    # the model is left as found: still on meta, its mode unchanged
    assert all(p.device.type == "meta" for p in model.parameters()) and model.training


@pytest.mark.parametrize("how", HOW)
def test_host_read_on_real_weights_counts_as_flop_counter_mode(how: str) -> None:
    torch.manual_seed(0)
    model = Model(how)
    x = torch.randn(TOKENS, WIDTH)
    result = count_flops(model, (x,))
    with FlopCounterMode(display=False) as counter:
        model(x)
    truth = counter.get_total_flops()
    # router and embedding for every token, then each token through exactly one expert
    assert truth == 2 * TOKENS * WIDTH * (WIDTH + EXPERTS + WIDTH)
    assert 2 * result.macs == truth


def test_nonzero_on_meta_is_the_same_refusal() -> None:
    with torch.device("meta"):
        model = nn.AdaptiveLogSoftmaxWithLoss(6, 10, cutoffs=[4])
    x, target = torch.randn(8, 6, device="meta"), torch.arange(8, device="meta")
    with pytest.raises(NeedsDataError, match=r"nonzero\(\) on a meta/fake tensor") as caught:
        count_flops(model, (x, target))
    assert caught.value.module_path == ""  # the root module calls nonzero itself


def test_a_shape_error_on_meta_stays_a_trace_error() -> None:
    """A failure real tensors share (here a shape mismatch) is not a data refusal."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 5), nn.Linear(6, 2))
    with pytest.raises(TraceError) as caught:
        count_flops(model, (torch.randn(3, 4, device="meta"),))
    assert not isinstance(caught.value, NeedsDataError)


MODELS_PY = """
from test_needs_data import Model


def host_copy():
    return Model("cpu")
"""


def test_cli_on_meta_exits_2_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "models.py").write_text(MODELS_PY)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # models.py imports this file's Model
    monkeypatch.chdir(tmp_path)
    code = main(["count", "models.py:host_copy", "-i", f"{TOKENS}x{WIDTH}", "--device", "meta"])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "module 'moe'" in lines[0] and "real weights" in lines[0] and "internal error" not in lines[0]
