"""On meta, values the shapes decide are read exactly (issue #29 item 15): transformers'
mask code asks whether the default position ids form one sequence (``.all()`` of a
cumulative sum of ``torch.arange`` differences); a meta count answered it with a
placeholder and called ``hf:llama --device meta`` INCOMPLETE although the work is
shape-determined.

Oracles: the same model with real weights on CPU (a real run, counted by the dispatch
tracer; its MACs also by ``FlopCounterMode`` live), and hand counts for the small modules."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops

B, T = 2, 16


def _llama(device: str, attn: str = "eager") -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, use_cache=False,
    )
    config._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_llama_on_meta_is_complete_and_equals_the_real_run(tracer: str, attn: str) -> None:
    ids = torch.randint(0, 100, (B, T))
    # the oracle: the same tracer on CPU with real weights. dispatch runs the model for real
    # there; auto runs fake copies on CPU too, as it now does on meta (issue #32.1)
    real = count_flops(_llama("cpu", attn), ids, tracer=tracer)
    meta = count_flops(_llama("meta", attn), ids.to("meta"), tracer=tracer)
    assert meta.complete, meta.incomplete_reasons()
    assert (meta.macs, meta.flops) == (real.macs, real.flops)
    if tracer == "auto":
        truth = count_flops(_llama("cpu", attn), ids, tracer="dispatch")  # a real run
        # transformers' mask code makes the real run's `all()` check on fakes too, the default position
        # ids' values followed (tracers/fake/hf_tracing.py; it skipped it before: 2 FLOPs short)
        assert (meta.macs, meta.flops) == (truth.macs, truth.flops)
    if attn == "eager":  # torch's own counter sees every matmul of the eager attention
        with torch.no_grad(), FlopCounterMode(display=False) as peer:
            _llama("cpu", attn)(ids)
        assert 2 * meta.macs == peer.get_total_flops()


class CountsPositions(nn.Module):
    """Reads a count the shapes decide: how many of the T positions are below 3 (3 of them)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = int((torch.arange(x.shape[1], device=x.device) < 3).sum())
        return self.lin(x[:, :k])


def test_a_count_the_shapes_decide_is_read_exactly_on_meta() -> None:
    x = torch.randn(B, 10, 8)
    meta = count_flops(CountsPositions().to("meta"), x.to("meta"))
    assert meta.complete and meta.macs == B * 3 * 8 * 4  # by hand: 3 positions through Linear(8, 4)


class ReadsItsInput(nn.Module):
    """Values that come from the input, or from a known tensor overwritten by the input."""

    def __init__(self, overwrite: bool) -> None:
        super().__init__()
        self.overwrite = overwrite
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        lengths = torch.full((x.shape[0],), 3, dtype=torch.long, device=x.device)
        if self.overwrite:
            lengths[:1] = ids[:1]  # no longer decided by the shapes
            k = int(lengths.max())
        else:
            k = int(ids.max())
        return self.lin(x[:, :k])


@pytest.mark.parametrize("overwrite", [False, True], ids=["input", "known-then-overwritten"])
def test_values_from_the_inputs_stay_placeholders(overwrite: bool) -> None:
    x, ids = torch.randn(B, 10, 8).to("meta"), torch.tensor([5, 7]).to("meta")
    result = count_flops(ReadsItsInput(overwrite).to("meta"), (x, ids))
    assert not result.complete
    assert any("placeholders" in reason for reason in result.incomplete_reasons())


def test_cli_hf_llama_on_meta_is_complete(capsys) -> None:
    pytest.importorskip("transformers")
    from flopcount.cli import main

    config = ["--config", "hidden_size=64", "--config", "intermediate_size=128", "--config", "num_hidden_layers=2",
              "--config", "num_attention_heads=4", "--config", "num_key_value_heads=2", "--config", "vocab_size=100"]
    results = {}
    for device in ("cpu", "meta"):
        code = main(["count", "hf:llama", *config, "--device", device, "--tracer", "dispatch", "-f", "json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        results[device] = json.loads(out)
    assert results["meta"]["complete"] is True
    assert (results["meta"]["flops"], results["meta"]["macs"]) == (results["cpu"]["flops"], results["cpu"]["macs"])


def test_uninitialised_memory_has_no_known_value() -> None:
    """``empty`` gives memory no real run decides: its CPU twin's garbage is not a value (main
    kept it, and an index check or a read could have taken it as the real run's); ``arange`` is."""
    from flopcount.tracers._modules import ModuleStack
    from flopcount.tracers._recorder import Recorder

    recorder = Recorder(ModuleStack({}))
    with recorder, torch.device("meta"):
        made = [torch.empty(4, dtype=torch.long), torch.empty_strided((2, 2), (2, 1), dtype=torch.int32)]
        made.append(made[0].new_empty(3))
        decided = torch.arange(4)
    assert [recorder.known.value(t) for t in made] == [None, None, None]
    assert torch.equal(recorder.known.value(decided), torch.arange(4))
