"""flopcount.profile: measured op time joined with counted cost, exactly.

Oracles: ``count_flops(...).by_operator()`` of the same call (the join adds no error),
torch's own ``FlopCounterMode`` for the contractions, the model-state snapshot, and the
overview invariant (its parts sum to the step)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same_state, cuda, snapshot
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import flopcount
from flopcount.devices.roofline import Roofs

ROOFS = Roofs({"float32": 1e11}, 1e10, "test roofs", "given")


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class Block(nn.Module):
    """A pre-norm transformer block with SDPA (no fast path: what runs is what is counted)."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.norm2(x))


def _flops_by_operator(result: flopcount.ProfileResult) -> dict:
    return {name: int(row.flops) for name, row in result.by_operator().items()}


@pytest.mark.parametrize(
    "make, inputs",
    [
        (lambda: SmallCNN().eval(), lambda: torch.randn(4, 3, 16, 16)),
        (lambda: nn.Sequential(Block(), Block()).eval(), lambda: torch.randn(3, 10, 32)),
    ],
    ids=["cnn", "transformer"],
)
def test_join_adds_no_error(make, inputs):
    model, x = make(), inputs()
    before = snapshot(model)
    result = flopcount.profile(model, x, roofs=ROOFS, warmup=1, steps=2)
    counted = flopcount.count_flops(model, x)
    assert _flops_by_operator(result) == counted.by_operator()
    assert {name: int(row.macs) for name, row in result.by_operator().items()} == counted.by_operator("macs")
    assert {name: row.calls for name, row in result.by_operator().items()} == counted.by_operator("count")
    assert result.unmatched == ()
    assert_same_state(model, before)


def test_contractions_match_torch_flop_counter():
    model, x = SmallCNN().eval(), torch.randn(2, 3, 16, 16)
    with FlopCounterMode(display=False) as mode, torch.no_grad():
        model(x)
    result = flopcount.profile(model, x, roofs=ROOFS, warmup=0, steps=1)
    contractions = ("aten::convolution", "aten::linear")
    assert sum(2 * result.by_operator()[op].macs for op in contractions) == mode.get_total_flops()


def test_training_step_phases_and_flops():
    model, x = SmallCNN().train(), torch.randn(4, 3, 16, 16)
    before = snapshot(model)
    result = flopcount.profile(model, x, backward=True, roofs=ROOFS, warmup=1, steps=2)
    counted = flopcount.count_flops(model, x, backward=True)
    assert _flops_by_operator(result) == counted.by_operator()
    assert {p: int(r.flops) for p, r in result.by_phase().items()} == counted.by_phase()
    assert {r.phase for r in result.rows} == {"forward", "backward"}
    assert [u for u in result.unmatched if u.kind == "profiled"] == []
    assert_same_state(model, before)  # BatchNorm running stats restored after 4 train steps


def test_loss_fn_training_step():
    model, x = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)), torch.randn(8, 16)
    target = torch.randint(0, 4, (8,))
    loss = lambda out: F.cross_entropy(out, target)
    result = flopcount.profile(model, x, backward=True, loss_fn=loss, roofs=ROOFS, warmup=0, steps=1)
    counted = flopcount.count_flops(model, x, backward=True, loss_fn=loss)
    assert _flops_by_operator(result) == counted.by_operator()


def test_overview_parts_sum_to_the_step_and_modules_include_children():
    model, x = SmallCNN().eval(), torch.randn(2, 3, 16, 16)
    result = flopcount.profile(model, x, roofs=ROOFS, warmup=1, steps=3)
    o = result.overview
    assert math.isclose(o.flops_s + o.data_movement_s + o.other_s + o.host_uncovered_s, o.step_s, rel_tol=1e-9)
    modules = result.by_module()
    # a parent's row is the sum of its children's (features = its 7 layers' rows)
    children = [row for name, row in modules.items() if name.startswith("features.")]
    assert modules["features"].flops == sum(r.flops for r in children)
    assert math.isclose(modules["features"].time_s, sum(r.time_s for r in children), rel_tol=1e-9)
    assert modules[""].flops == result.flops == flopcount.count_flops(model, x).flops


def test_row_roofline_figures_from_its_own_numbers():
    model, x = nn.Linear(256, 128), torch.randn(64, 256)
    row = flopcount.profile(model, x, roofs=ROOFS, warmup=1, steps=2).rows[0]
    assert row.name == "aten::linear"
    flops = 2 * 64 * 256 * 128
    moved = (64 * 256 + 128 * 256 + 128 + 64 * 128) * 4  # x, W, b read; y written
    assert (row.flops, row.bytes) == (flops, moved)
    assert row.attainable_s == pytest.approx(max(flops / 1e11, moved / 1e10))
    assert row.bound == "compute"  # 4.19e-5 s of compute > 2.30e-5 s of memory
    assert row.efficiency == pytest.approx(row.attainable_s / row.time_s)
    assert row.achieved_flops_per_s == pytest.approx(flops / row.time_s)


def test_fused_fast_path_is_booked_to_the_counted_ops_it_replaced():
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True).eval()
    x = torch.randn(2, 5, 32)
    result = flopcount.profile(layer, x, roofs=ROOFS, warmup=1, steps=2)
    # under no_grad the real layer takes its fused fast path, which the counted run (a mode
    # is active) does not: the fused op's time goes to the counted ops of that stretch, said
    # in the warnings; FLOPs stay the count's
    assert _flops_by_operator(result) == flopcount.count_flops(layer, x).by_operator()
    assert any("aten::_transformer_encoder_layer_fwd ran where the counted run had" in w for w in result.warnings)
    assert result.unmatched == ()
    assert result.op_time_s == pytest.approx(sum(r.time_s for r in result.rows))
    assert result.by_operator()["aten::linear"].time_s > 0  # its share of the fused op's time


def test_renderers_and_export(tmp_path):
    model, x = SmallCNN().eval(), torch.randn(2, 3, 16, 16)
    result = flopcount.profile(model, x, roofs=ROOFS, warmup=1, steps=1)
    table = result.table()
    assert "aten::convolution" in table and "Step " in table and "given" in table
    csv_text = result.to_csv()
    assert csv_text.splitlines()[0].startswith("name,module,phase,calls,flops")
    assert len(csv_text.splitlines()) == 1 + len(result.rows)
    assert result.to_dict()["rows"][0]["name"] == result.rows[0].name
    path = tmp_path / "trace.json"
    result.export_chrome_trace(str(path))
    import json

    events = json.loads(path.read_text())["traceEvents"]
    convs = [e for e in events if e.get("name") == "aten::conv2d" and "flops" in e.get("args", {})]
    per_call = flopcount.count_flops(model, x).by_module()
    assert sorted(e["args"]["flops"] for e in convs) == sorted([per_call["features.0"], per_call["features.4"]])


def test_bad_arguments():
    model = nn.Linear(2, 2)
    with pytest.raises(flopcount.UsageError, match="steps"):
        flopcount.profile(model, torch.randn(1, 2), steps=0, roofs=ROOFS)
    with pytest.raises(flopcount.UsageError, match="loss_fn"):
        flopcount.profile(model, torch.randn(1, 2), loss_fn=lambda o: o.sum(), roofs=ROOFS)
    with pytest.raises(flopcount.UsageError, match="meta"):
        flopcount.profile(model.to("meta"), torch.randn(1, 2, device="meta"), roofs=ROOFS)


@pytest.mark.cuda
@cuda
def test_cuda_kernels_attributed_to_ops():
    model, x = SmallCNN().cuda().eval(), torch.randn(8, 3, 32, 32, device="cuda")
    result = flopcount.profile(model, x, warmup=2, steps=3)
    assert result.timing == "device"
    assert _flops_by_operator(result) == flopcount.count_flops(model, x).by_operator()
    conv = result.by_operator()["aten::convolution"]
    assert 0 < conv.time_s < result.total_time_s
    assert "datasheet" in result.roofs.details or result.roofs.source.startswith("measured")


def test_llm_decode_step_with_a_kv_cache():
    pytest.importorskip("transformers")
    from flopcount.examples.hf import gpt2

    model = gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64).eval()
    prompt = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        cache = model(prompt, use_cache=True).past_key_values
    length = cache.get_seq_length()
    token = torch.randint(0, 100, (2, 1))
    kwargs = {"past_key_values": cache, "use_cache": True}
    result = flopcount.profile(model, token, kwargs, roofs=ROOFS, warmup=1, steps=2)
    counted = flopcount.count_flops(model, token, kwargs)
    assert _flops_by_operator(result) == counted.by_operator()
    # a .to() that converts nothing returns its input: no op below autograd, nothing to cost
    assert [(u.name, u.reason.split(" (")[0]) for u in result.unmatched] == [("aten::to", "flopcount's trace recorded no op for it")]
    # every step decoded one token after the same 12: the caller's cache is as found
    assert cache.get_seq_length() == length == 12
    sdpa = result.by_operator()["aten::scaled_dot_product_attention"]
    assert sdpa.calls == 2  # one per layer per step


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_lazy_modules_are_profiled_on_a_copy(train):
    # regression: the join step's trace put back the lazy hooks of a module it had just
    # materialised, and the next step raised "'Linear' object has no attribute 'initialize_parameters'"
    model = nn.Sequential(nn.Linear(6, 8), nn.LazyLinear(5), nn.ReLU(), nn.LazyLinear(3)).train(train)
    x = torch.randn(4, 6)
    result = flopcount.profile(model, x, roofs=ROOFS, warmup=0, steps=1)
    linear = 2 * 4 * (6 * 8 + 8 * 5 + 5 * 3)  # 2 · rows · in · out per Linear, biases not counted
    assert result.by_operator()["aten::linear"].flops == linear
    counted = flopcount.count_flops(model, x, tracer="dispatch")
    assert _flops_by_operator(result) == {op: f for op, f in counted.by_operator().items() if op in result.by_operator()}
    assert sum(_flops_by_operator(result).values()) == counted.flops
    assert result.unmatched == ()
    assert [type(m).__name__ for m in model] == ["Linear", "LazyLinear", "ReLU", "LazyLinear"]  # still lazy
    assert nn.parameter.is_lazy(model[1].weight) and nn.parameter.is_lazy(model[3].weight)
    assert [m.training for m in model.modules()] == [train] * 5


def test_lazy_batch_norm_in_train_mode():
    # regression: a train step's state guard met uninitialised running statistics
    # ("Attempted to use an uninitialized parameter"); the copy's are materialised first
    model = nn.Sequential(nn.Linear(6, 4), nn.LazyBatchNorm1d()).train()
    x = torch.randn(5, 6)
    result = flopcount.profile(model, x, roofs=ROOFS, warmup=0, steps=1)
    counted = flopcount.count_flops(model, x, tracer="dispatch")
    assert result.by_operator()["aten::linear"].flops == 2 * 5 * 6 * 4  # 2 · rows · in · out
    assert _flops_by_operator(result) == {op: f for op, f in counted.by_operator().items() if op in result.by_operator()}
    assert sum(_flops_by_operator(result).values()) == counted.flops
    assert result.unmatched == ()
    assert type(model[1]).__name__ == "LazyBatchNorm1d" and nn.parameter.is_lazy(model[1].running_mean)
    assert model[1].num_batches_tracked.item() == 0  # shared with the profiled copy, put back
