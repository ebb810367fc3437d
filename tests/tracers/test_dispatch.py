"""The dispatch tracer: same numbers as the jit tracer on the zoo, meta/fake tensors
counted like real ones, auto's fallback, SDPA seen as one unit, and the tracer's
events (schema-named arguments, module stacks) checked against hand-written shapes."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from conftest import ROOT, assert_same_state, snapshot, torch_contraction_flops
from torch import nn

from examples.mobilenet import mobilenet_v2
from examples.resnet import resnet18
from examples.vit import vit_tiny
from flopcount import TraceError, count_flops
from flopcount.core.inputs import flatten_tensors
from flopcount.tracers import dispatch

hf = pytest.importorskip("examples.hf")
pytest.importorskip("transformers")

VOCAB = 1000


class DictNet(nn.Module):
    """Dict in, dict out, with a matmul and a norm between two Linears."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(12, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 3)

    def forward(self, batch):
        h = self.norm(self.embed(batch["x"]) * batch["scale"])
        scores = torch.softmax(h @ h.transpose(-1, -2), dim=-1)
        return {"logits": self.head(scores @ h), "hidden": h}


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, groups=4), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


def _tokens(seq: int = 12):
    return hf.token_ids(1, seq, VOCAB)


ZOO = {
    "cnn_bn": (BNNet, lambda: (torch.randn(2, 3, 16, 16),)),
    "resnet18": (resnet18, lambda: (torch.randn(1, 3, 32, 32),)),
    "mobilenet_v2": (mobilenet_v2, lambda: (torch.randn(1, 3, 32, 32),)),
    "vit_tiny": (vit_tiny, lambda: (torch.randn(1, 3, 32, 32),)),
    "bert": (lambda: hf.bert(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB), lambda: (_tokens(),)),
    "gpt2": (lambda: hf.gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64), lambda: (_tokens(),)),
    "llama_gqa_rope": (lambda: hf.llama(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, vocab_size=VOCAB), lambda: (_tokens(),)),
    "dict_io": (DictNet, lambda: ({"x": torch.randn(2, 5, 12), "scale": torch.randn(2, 5, 16)},)),
}


def _build(name):
    torch.manual_seed(0)
    build, inputs = ZOO[name]
    return build().eval(), inputs()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_dispatch_agrees_with_jit(name):
    model, inputs = _build(name)
    by_jit = count_flops(model, inputs, tracer="jit")
    by_dispatch = count_flops(model, inputs, tracer="dispatch")
    assert by_dispatch.tracer == "dispatch" and by_jit.tracer == "jit"
    assert 2 * by_jit.macs == torch_contraction_flops(*_build(name))  # live peer on a fresh copy
    assert (by_dispatch.flops, by_dispatch.macs) == (by_jit.flops, by_jit.macs)
    assert by_dispatch.by_module() == by_jit.by_module()
    assert by_dispatch.by_module("macs") == by_jit.by_module("macs")


@pytest.mark.parametrize("name", sorted(ZOO))
def test_registry_knows_every_spelling_either_tracer_emits(name):
    """The invariant behind agreement: jit's composite spellings (aten::linear) and
    dispatch's leaf spellings (aten::addmm, aten::native_layer_norm) all have a handler
    or are known zero, so neither tracer silently drops an op the other counts."""
    model, inputs = _build(name)
    for tracer in ("jit", "dispatch"):
        assert count_flops(model, inputs, tracer=tracer).unsupported_ops() == {}, tracer


def test_zoo_leaves_model_as_found():
    model, inputs = _build("cnn_bn")
    model.train()
    before = snapshot(model)
    count_flops(model, inputs, tracer="dispatch")
    assert_same_state(model, before)


# --------------------------------------------------------------------------- meta / fake


def _meta_twin(name):
    build, _ = ZOO[name]
    with torch.device("meta"):
        return build().eval()


@pytest.mark.parametrize("name", ["cnn_bn", "resnet18", "bert", "gpt2", "llama_gqa_rope", "dict_io"])
def test_meta_model_counts_like_cpu(name):
    model, inputs = _build(name)
    on_cpu = count_flops(model, inputs, tracer="dispatch")
    meta_model = _meta_twin(name)
    flat, rebuild = flatten_tensors(inputs)
    meta_inputs = rebuild([t.to("meta") for t in flat])
    on_meta = count_flops(meta_model, meta_inputs, tracer="dispatch")
    assert (on_meta.flops, on_meta.macs, on_meta.params) == (on_cpu.flops, on_cpu.macs, on_cpu.params)
    assert on_meta.by_module() == on_cpu.by_module()
    auto = count_flops(meta_model, meta_inputs)
    # since #32.1 a meta model takes the default fast path (fake copies), with no warning
    assert auto.tracer == "dispatch" and not any("as given" in w for w in auto.warnings)
    assert auto.flops == on_cpu.flops and auto.by_module() == on_cpu.by_module()


def test_meta_multihead_attention_macs_match_cpu():
    """nn.MultiheadAttention calls SDPA from inside another overridable function, where
    the tracer sees the kernel the device picks: fused on CPU, the math decomposition
    on meta. MACs agree; FLOPs may differ by the softmax/scale elementwise work."""
    model, inputs = _build("vit_tiny")
    with torch.device("meta"):
        meta_model = vit_tiny().eval()
    on_cpu = count_flops(model, inputs, tracer="dispatch")
    on_meta = count_flops(meta_model, (inputs[0].to("meta"),), tracer="dispatch")
    assert on_meta.macs == on_cpu.macs


def test_fake_tensors_count_like_meta():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.device("meta"):
        meta_model = hf.llama(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, vocab_size=VOCAB)
    with FakeTensorMode():
        fake_model = hf.llama(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, vocab_size=VOCAB)
        fake_ids = torch.zeros(1, 12, dtype=torch.long)
    on_meta = count_flops(meta_model, torch.zeros(1, 12, dtype=torch.long, device="meta"), tracer="dispatch")
    on_fake = count_flops(fake_model, fake_ids)
    assert on_fake.tracer == "dispatch"
    assert (on_fake.flops, on_fake.macs) == (on_meta.flops, on_meta.macs)


def test_meta_model_allocates_no_weight_memory(fresh_python_with_transformers):
    """A 2-layer slice of the LLaMA-2-7B config holds 0.67 G parameters (2.7 GB in
    float32); counting it on meta must not come near that. In a process of its own (forked from one
    that imported torch and transformers' LLaMA, not flopcount): the peak RSS of this one has seen
    larger models."""
    script = textwrap.dedent(
        """
        import resource, sys, torch
        sys.path.insert(0, %r)
        from examples import hf
        from transformers import LlamaForCausalLM
        from flopcount import count_flops
        config = hf.llama2_7b_config()
        config.num_hidden_layers = 2
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = count_flops(model, torch.zeros(1, 256, dtype=torch.long, device="meta"))
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(r.params, r.macs, (after - before) * 1024)
        """
        % str(ROOT)
    )
    out = fresh_python_with_transformers.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    params, macs, grown = (int(v) for v in out.stdout.split())
    T, L, h, ff, V = 256, 2, 4096, 11008, 32000
    # embedding and LM head (V h each), per layer q/k/v/o (4 h^2), gate/up/down (3 h ff), two RMSNorms; final norm
    assert params == 2 * V * h + L * (4 * h * h + 3 * h * ff + 2 * h) + h
    assert macs == T * (L * (4 * h * h + 3 * h * ff) + h * V) + L * 2 * T * T * h
    assert grown < 300 * 2**20, f"peak RSS grew by {grown / 2**20:.0f} MiB"


class ItemOnMask(nn.Module):
    """Mask checks like transformers' older mask code: .item() / bool() on the mask."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.extra = nn.Linear(8, 8)

    def forward(self, x, mask):
        if mask.all():                 # True placeholder: every position valid
            x = self.fc(x)
        if (mask == 0).any():          # False placeholder: no padding
            x = self.extra(x)
        return x * mask[..., None]


def test_data_reads_on_meta_get_placeholders_and_a_warning():
    with torch.device("meta"):
        model = ItemOnMask()
    x, mask = torch.randn(2, 3, 8, device="meta"), torch.ones(2, 3, device="meta")
    r = count_flops(model, (x, mask), tracer="dispatch")
    assert r.by_module("macs") == {"": 2 * 3 * 8 * 8, "fc": 2 * 3 * 8 * 8, "extra": 0}
    assert any("placeholder" in w and "_local_scalar_dense" in w for w in r.warnings)


# --------------------------------------------------------------------------- auto fallback


class Router(nn.Module):
    """Mixture-of-experts routing with data-dependent control flow: each token goes to
    its arg-max expert through a Python loop over ``.tolist()``. jit drops the gate
    (its result only steered Python), so its count is wrong; auto must notice."""

    def __init__(self, dim: int = 8, experts: int = 3):
        super().__init__()
        self.gate = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(experts))

    def forward(self, x):
        choice = self.gate(x).argmax(-1).tolist()
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows = [i for i, c in enumerate(choice) if c == e]
            if rows:
                out[rows] = expert(x[rows])
        return out


class Halving(nn.Module):
    """A while loop on a tensor's norm: the norms only steer Python."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        while h.norm() > 0.5:
            h = h / 2
        return h


def test_auto_falls_back_to_dispatch_on_data_dependent_control_flow():
    torch.manual_seed(0)
    model, x = Router(), torch.randn(10, 8)
    # jit counts the gate whose result only steers Python (#9.1), for the branch this input takes
    assert count_flops(model, x, tracer="jit").by_module("macs")["gate"] == 10 * 8 * 3
    r = count_flops(model, x)
    assert r.tracer == "dispatch"
    assert any("counted one real run" in w and "needs a tensor's value" in w for w in r.warnings)
    routed = torch.bincount(model.gate(x).argmax(-1), minlength=3).tolist()
    assert r.by_module("macs")["gate"] == 10 * 8 * 3
    for e, n in enumerate(routed):
        assert r.by_module("macs")[f"experts.{e}"] == n * 8 * 8
    assert r.macs == 10 * 8 * 3 + 10 * 8 * 8

    model, x = Halving(), torch.randn(3, 4) * 10
    with torch.no_grad():
        h, halvings = model.fc(x), 0
        while h.norm() > 0.5:
            h, halvings = h / 2, halvings + 1
    r = count_flops(model, x)
    assert r.tracer == "dispatch"
    counts = r.by_operator("count")
    assert counts["aten::linalg_vector_norm"] == halvings + 1 and counts["aten::div"] == halvings
    by_jit = count_flops(model, x, tracer="jit")  # jit keeps the norms too (#9.1)
    assert by_jit.by_operator("count")["aten::linalg_vector_norm"] == halvings + 1 and by_jit.flops == r.flops


def test_auto_does_not_need_jit():
    class NoTracing(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if torch.jit.is_tracing():
                raise RuntimeError("this model cannot be traced")
            return self.fc(x)

    r = count_flops(NoTracing(), torch.randn(3, 4))
    assert r.tracer == "dispatch" and r.macs == 3 * 4 * 2
    assert r.warnings == () and r.complete


def test_auto_counts_on_fake_copies_without_a_warning():
    model, inputs = _build("cnn_bn")
    r = count_flops(model, inputs)
    assert r.tracer == "dispatch" and r.warnings == ()


# --------------------------------------------------------------------------- the events


def test_sdpa_is_one_event_and_hides_its_kernel():
    class Attn(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    q, kv = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8)
    for device in ("cpu", "meta"):
        tr = dispatch.trace(Attn(), (q.to(device), kv.to(device), kv.to(device)))
        ops = [e.call.op for e in tr.events]
        assert ops == ["aten::scaled_dot_product_attention"], (device, ops)
        call = tr.events[0].call
        assert call.tensor("query").shape == (1, 4, 6, 8) and call.tensor("key").shape == (1, 2, 6, 8)
        assert call.arg("is_causal") is True and call.arg("enable_gqa") is True and call.arg("attn_mask") is None
        assert call.out().shape == (1, 4, 6, 8)


class _AddMM(nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(n_in, n_out)), nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.b, x, self.w)


class _MM(nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n_in, n_out))

    def forward(self, x):
        return torch.mm(x, self.w)


def test_events_bind_schema_names_and_module_stacks():
    model = nn.Sequential(_AddMM(4, 6), nn.Sequential(_MM(6, 2)), nn.Linear(2, 3))
    tr = dispatch.trace(model, torch.randn(3, 4))
    assert tr.tracer == "dispatch" and tr.module_calls == {"": 1, "0": 1, "1": 1, "1.0": 1, "2": 1}
    addmm = next(e for e in tr.events if e.call.op == "aten::addmm")
    assert addmm.module_stack == ("0",)
    assert list(addmm.call.args) == ["self", "mat1", "mat2", "beta", "alpha"]
    assert addmm.call.tensor("mat1").shape == (3, 4) and addmm.call.tensor("mat1").dtype == "float32"
    assert addmm.call.arg("beta") == 1 and addmm.call.out().shape == (3, 6)
    mm = next(e for e in tr.events if e.call.op == "aten::mm")
    assert mm.module_stack == ("1", "1.0") and mm.phase == "forward"
    # nn.Linear is recorded as the composite jit records, with aten::linear's argument names
    (linear,) = [e for e in tr.events if e.module == "2"]
    assert linear.call.op == "aten::linear" and list(linear.call.args) == ["input", "weight", "bias"]
    assert linear.call.tensor("weight").shape == (3, 2) and linear.call.out().shape == (3, 3)


def test_list_outputs_and_tuple_outputs():
    class Split(nn.Module):
        def forward(self, x):
            a, b = x.split(2, dim=1)
            values, indices = x.max(dim=1)
            return a + b, values

    tr = dispatch.trace(Split(), torch.randn(3, 4))
    split = next(e for e in tr.events if e.call.op == "aten::split")
    assert split.call.outputs == (None,) and split.call.arg("split_size") == 2
    maxed = next(e for e in tr.events if e.call.op == "aten::max")
    assert [o.shape for o in maxed.call.outputs] == [(3,), (3,)]


def test_forward_failure_names_module():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return self.inner(x[:, :3])

    model = Bad()
    before = snapshot(model)
    with pytest.raises(TraceError, match="dispatch tracer") as info:
        count_flops(model, torch.randn(2, 4), tracer="dispatch")
    assert info.value.__cause__ is not None and info.value.module_path == "inner"
    assert_same_state(model, before)
