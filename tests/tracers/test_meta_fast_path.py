"""Models on the meta device, or made of FakeTensors, take the default fast path (fake
copies + shape cache) and count exactly what the same model with real weights counts
(issue #32.1). Oracles: the real model's own rows (a different tensor kind, the same
events expected) and ``FlopCounterMode`` run live for the contraction totals."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import torch_contraction_flops

from flopcount import count_flops
from flopcount.core.inputs import prepare_call
from flopcount.examples.resnet import resnet50
from flopcount.tracers import trace

hf = pytest.importorskip("examples.hf")
pytest.importorskip("transformers")

VOCAB = 300
CONTRACTIONS = ("aten::convolution", "aten::linear", "aten::addmm", "aten::mm", "aten::bmm", "aten::matmul",
                "aten::scaled_dot_product_attention", "aten::baddbmm")


def _zoo(name: str):
    torch.manual_seed(0)
    if name == "resnet50":
        return resnet50(), (torch.randn(2, 3, 64, 64),)
    if name == "bert":
        model = hf.bert(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB)
    elif name == "gpt2":
        model = hf.gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64)
    else:  # LLaMA-like: RMSNorm, RoPE, grouped-query attention (8 heads, 2 KV heads), SwiGLU
        model = hf.llama(num_hidden_layers=2, hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                         intermediate_size=96, vocab_size=VOCAB)
    return model, (hf.token_ids(2, 12, VOCAB),)


def _rows(result):
    return {
        metric: (result.by_operator(metric), result.by_module(metric), result.by_module_and_operator(metric))
        for metric in ("macs", "flops")
    }


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", ["resnet50", "bert", "gpt2", "llama"])
def test_a_meta_copy_counts_every_row_like_the_real_model(name, train):
    model, inputs = _zoo(name)
    model.train(train)
    meta_model = copy.deepcopy(model).to("meta")
    meta_inputs = tuple(t.to("meta") for t in inputs)
    real = count_flops(model, inputs)
    meta = count_flops(meta_model, meta_inputs)
    assert _rows(meta) == _rows(real)
    # the live peer on the real model: contractions only, 2 FLOPs per MAC
    peer = torch_contraction_flops(copy.deepcopy(model).eval() if train else copy.deepcopy(model), inputs)
    contraction_macs = sum(v for op, v in meta.by_operator("macs").items() if op in CONTRACTIONS)
    if not train or name != "resnet50":  # FlopCounterMode is run in eval (dropout/BN do no contractions anyway)
        assert 2 * contraction_macs == peer


@pytest.mark.parametrize("name", ["resnet50", "gpt2"])
def test_a_meta_model_runs_on_the_shape_cache_not_as_given(name):
    # Before #32.1 a meta model was dispatched as given: no shape cache, and a warning saying so.
    model, inputs = _zoo(name)
    meta_model = copy.deepcopy(model).to("meta")
    meta_inputs = tuple(t.to("meta") for t in inputs)
    run = trace(meta_model, prepare_call(meta_inputs))
    assert run.shape_cache["hits"] > 0  # the cache answered repeated ops (the fast path ran)
    assert not any("as given" in w for w in run.warnings)
    assert count_flops(meta_model, meta_inputs).warnings == ()


def test_a_model_built_under_fake_tensor_mode_counts_like_the_real_one():
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    real_model, inputs = _zoo("gpt2")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        torch.manual_seed(0)
        fake_model = hf.gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64)
        fake_inputs = (torch.zeros(2, 12, dtype=torch.long),)
    assert _rows(count_flops(fake_model, fake_inputs)) == _rows(count_flops(real_model, inputs))


def test_a_meta_model_whose_forward_needs_a_value_is_still_counted_as_given():
    class NeedsValue(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            if x.sum() > 0:  # a value: fakes cannot answer, meta as given answers with a placeholder
                return self.fc(x)
            return self.fc(self.fc(x))

    model = NeedsValue().to("meta")
    before = {k: (v.shape, v.device) for k, v in model.state_dict().items()}
    result = count_flops(model, (torch.empty(3, 4, device="meta"),))
    assert any("as given" in w for w in result.warnings)
    # placeholder bool -> False: two linears, each 3 x 4 x 4 MACs (hand count)
    assert result.macs == 2 * 3 * 4 * 4
    assert {k: (v.shape, v.device) for k, v in model.state_dict().items()} == before
