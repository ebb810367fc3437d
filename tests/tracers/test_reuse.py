"""Structural reuse (issue #32.2-4): a submodule call that matches an earlier one exactly is
booked from that call's events; anything that does not match is traced. Oracles: the same
count with reuse off (``FLOPCOUNT_REUSE=0``: every call traced, as before #32), hand-derived
MACs, and ``FlopCounterMode`` run live on the real model."""

from __future__ import annotations

import copy

import pytest
import torch
from _toy_stack import B, Block, D, H
from conftest import torch_contraction_flops
from torch import nn

from flopcount import count_flops
from flopcount.core.inputs import prepare_call
from flopcount.examples.resnet import resnet50
from flopcount.tracers import trace

# the reuse key on stacks of 2 or 3 small blocks: every twin group keyed (the default policy would trace
# them: tests/conftest.py, ``reuse_always``)
pytestmark = pytest.mark.usefixtures("reuse_always")

hf = pytest.importorskip("examples.hf")
pytest.importorskip("transformers")

VOCAB = 300


class Stack(nn.Module):
    def __init__(self, blocks) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class Shared(nn.Module):
    """One block called under two names, then a twin block of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Block()
        self.again = self.first  # an alias: the same module object
        self.other = Block()

    def forward(self, x):
        return self.other(self.again(self.first(x)))


def _zoo(name: str):
    torch.manual_seed(0)
    if name == "resnet50":
        return resnet50(), (torch.randn(2, 3, 64, 64),)
    if name == "shared":
        return Shared(), (torch.randn(B, D),)
    if name == "bert":
        model = hf.bert(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB)
    elif name == "gpt2":
        model = hf.gpt2(n_layer=3, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64)
    else:  # LLaMA-like with grouped-query attention (8 heads, 2 KV heads)
        model = hf.llama(num_hidden_layers=3, hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                         intermediate_size=96, vocab_size=VOCAB)
    return model, (hf.token_ids(2, 12, VOCAB),)


def _rows(result):
    # every row the result renders: totals, per-operator, per-module (calls, aliases), bytes
    return {
        "dict": result.to_dict(),
        **{metric: (result.by_operator(metric), result.by_module(metric), result.by_module_and_operator(metric),
                    result.by_phase(metric)) for metric in ("macs", "flops")},
    }


@pytest.fixture(autouse=True)
def _reuse_on(monkeypatch):
    # the default (FLOPCOUNT_REUSE unset) is on; set here so a run with it off still tests reuse
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")


def _reused(model, inputs) -> int:
    return int(trace(model, prepare_call(inputs)).shape_cache["reused_calls"])


def _both(monkeypatch, model, inputs):
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, inputs)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")
    on = count_flops(model, inputs)
    return off, on


@pytest.mark.parametrize("meta", [False, True], ids=["real", "meta"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", ["resnet50", "bert", "gpt2", "llama", "shared"])
def test_reuse_on_and_off_give_identical_rows(monkeypatch, name, train, meta):
    model, inputs = _zoo(name)
    model.train(train)
    if meta:
        model, inputs = copy.deepcopy(model).to("meta"), tuple(t.to("meta") for t in inputs)
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)
    assert [(m.name, m.calls) for m in on.modules] == [(m.name, m.calls) for m in off.modules]


def test_resnet50_repeated_bottlenecks_are_reused_and_match_the_published_macs(monkeypatch):
    torch.manual_seed(0)
    model, inputs = resnet50().eval(), (torch.randn(2, 3, 224, 224),)
    # 2 x ResNet-50's conv + linear MACs, 4,089,184,256 per image (REFERENCES.md)
    result = count_flops(model, inputs)
    contraction = sum(v for op, v in result.by_operator("macs").items() if op in ("aten::convolution", "aten::linear"))
    assert contraction == 2 * 4_089_184_256
    # stages of 3, 4, 6, 3 bottlenecks: the first of a stage has a downsample (its own key),
    # the second is the first of the stage's repeated key, the rest are booked from it:
    # 1 + 2 + 4 + 1 calls (leaf modules are never keyed)
    assert _reused(model, inputs) == 8
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    assert _reused(model, inputs) == 0


def _stack_macs(hiddens, rows=B):
    # each block: up D x h and down h x D MACs per row
    return sum(rows * 2 * D * h for h in hiddens)


def test_a_block_of_another_width_is_traced_not_reused(monkeypatch):
    torch.manual_seed(0)
    hiddens = [H, H, 2 * H, H]
    model, inputs = Stack([Block(h) for h in hiddens]), (torch.randn(B, D),)
    result = count_flops(model, inputs)
    assert result.macs == _stack_macs(hiddens) + 0  # hand count (the adds and ReLU are not MACs)
    assert result.by_module("macs")["blocks.2"] == B * 2 * D * 2 * H
    assert 2 * result.by_operator("macs")["aten::linear"] == torch_contraction_flops(copy.deepcopy(model), inputs)
    # blocks 1 and 3 match block 0 (blocks.3's input has block 0's shape again); block 2 does not
    assert _reused(model, inputs) == 2
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)


def test_a_block_with_a_forward_hook_is_traced_and_its_hook_runs():
    torch.manual_seed(0)
    model, inputs = Stack([Block() for _ in range(4)]), (torch.randn(B, D),)
    seen = []
    handle = model.blocks[2].register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)))
    try:
        result = count_flops(model, inputs)
        reused = _reused(model, inputs)
    finally:
        handle.remove()
    assert result.macs == _stack_macs([H] * 4)
    assert seen == [(B, D), (B, D)]  # once per count: the hooked block ran (on the fake copy)
    # blocks 1 and 3 are booked from block 0; block 2 has a hook and is traced
    assert reused == 2


class Counting(nn.Module):
    """A block whose work depends on a counter it shares with its twins: every other call
    runs its Linear twice. Reusing a call would skip the counter and miss work."""

    def __init__(self, shared) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.shared = shared

    def forward(self, x):
        self.shared["calls"] += 1
        if self.shared["calls"] % 2 == 0:
            x = self.fc(x)
        return self.fc(x)


def test_a_stateful_counter_is_traced_not_reused():
    torch.manual_seed(0)
    shared = {"calls": 0}
    model, inputs = Stack([Counting(shared) for _ in range(4)]), (torch.randn(B, D),)
    result = count_flops(model, inputs)
    # calls 1..4: one Linear, two, one, two: 6 Linears of B x D x D MACs (hand count)
    assert result.macs == 6 * B * D * D
    shared["calls"] = 0
    assert 2 * result.macs == torch_contraction_flops(copy.deepcopy(model), inputs)
    # no Counting block is reused: the first call changed the state it reads (leaf modules
    # such as the Linear are never keyed: the shape cache answers their op already)
    assert shared == {"calls": 0}  # the caller's counter: the count ran on a copy
    assert _reused(model, inputs) == 0


class Settings:
    """A plain object the blocks share, as transformers' blocks share their config."""

    def __init__(self) -> None:
        self.calls = 0


class CountingInSettings(nn.Module):
    """The counter above, held in a shared plain object (keyed by identity) instead of a dict."""

    def __init__(self, settings) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.settings = settings

    def forward(self, x):
        self.settings.calls += 1
        if self.settings.calls % 2 == 0:
            x = self.fc(x)
        return self.fc(x)


def test_a_counter_in_a_shared_object_is_traced_not_reused():
    torch.manual_seed(0)
    settings = Settings()
    model, inputs = Stack([CountingInSettings(settings) for _ in range(4)]), (torch.randn(B, D),)
    result = count_flops(model, inputs)
    # calls 1..4: one Linear, two, one, two: 6 Linears of B x D x D MACs (hand count); before,
    # blocks 1-3 were booked from block 0 (the object's identity was their key): 4 Linears
    assert result.macs == 6 * B * D * D
    assert settings.calls == 0  # the caller's object: the count ran on a copy
    assert 2 * result.macs == torch_contraction_flops(copy.deepcopy(model), inputs)
    assert _reused(model, inputs) == 0


# a module-level counter and flag, as some research code keeps a step or a mode in a global
GLOBAL_STEP = 0
GLOBAL_MODE = {"extra": False}
GLOBAL_SCALE = 2


class CountingInAGlobal(nn.Module):
    """The counter above, in a global its forward writes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        global GLOBAL_STEP
        GLOBAL_STEP += 1
        if GLOBAL_STEP % 2 == 0:
            x = self.fc(x)
        return self.fc(x)


def test_a_counter_in_a_global_is_traced_not_reused():
    global GLOBAL_STEP
    torch.manual_seed(0)
    model, inputs = Stack([CountingInAGlobal() for _ in range(4)]), (torch.randn(B, D),)
    GLOBAL_STEP = 0
    result = count_flops(model, inputs)
    # steps 1..4: one Linear, two, one, two: 6 Linears of B x D x D MACs (hand count); before,
    # blocks 1-3 were booked from block 0 (a global was in no key): 4 Linears
    assert result.macs == 6 * B * D * D
    # the forward's own global advanced once per block within the run (the 6 Linears), and left as
    # found after it (asfound; before, left at 4 as a real run leaves it)
    assert GLOBAL_STEP == 0
    assert 2 * result.macs == torch_contraction_flops(copy.deepcopy(model), inputs)
    GLOBAL_STEP = 0
    assert _reused(model, inputs) == 0


class ReadsGlobals(nn.Module):
    """Reads a global flag its caller sets per layer, and a global constant."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        x = self.fc(x) * GLOBAL_SCALE
        if GLOBAL_MODE["extra"]:
            x = self.fc(x)
        return x


class SetsAGlobalPerLayer(Stack):
    def forward(self, x):
        for i, block in enumerate(self.blocks):
            GLOBAL_MODE["extra"] = i >= 2
            x = block(x)
        return x


def _extra_wanted() -> bool:
    """A module-level helper the forward calls: the global is named here, not in the forward."""
    return GLOBAL_MODE["extra"]


class ReadsThroughHelpers(nn.Module):
    """Reads the flag through a method and a module-level helper, never in its forward's code."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)

    def _more(self, x):
        return self.fc(x) if _extra_wanted() else x

    def forward(self, x):
        return self._more(self.fc(x))


@pytest.mark.parametrize("block", [ReadsGlobals, ReadsThroughHelpers])
def test_a_global_set_between_layers_splits_the_key_where_the_forward_reads_it(block) -> None:
    torch.manual_seed(0)
    model, inputs = SetsAGlobalPerLayer([block() for _ in range(4)]), (torch.randn(B, D),)
    result = count_flops(model, inputs)
    # blocks 0, 1: one Linear; 2, 3: two (hand count): 6; before, 2 and 3 were booked from 0: 4
    # (through the helpers: until the methods and same-module functions the forward names were read)
    assert result.macs == 6 * B * D * D
    assert 2 * result.macs == torch_contraction_flops(copy.deepcopy(model), inputs)
    # block 1 is booked from block 0 and block 3 from block 2: the constant global splits nothing
    assert _reused(model, inputs) == 2


class Branching(nn.Module):
    """A data-dependent branch: runs its Linear twice when its bias sums above zero."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        if self.fc.bias.sum() > 0:
            x = self.fc(x)
        return self.fc(x)


def test_a_data_dependent_branch_is_traced_on_real_values():
    torch.manual_seed(0)
    blocks = [Branching() for _ in range(4)]
    with torch.no_grad():
        for i, block in enumerate(blocks):  # alternate the branch taken
            block.fc.bias.fill_(1.0 if i % 2 else -1.0)
    model, inputs = Stack(blocks), (torch.randn(B, D),)
    result = count_flops(model, inputs)
    assert result.macs == 6 * B * D * D  # blocks 1 and 3 run two Linears, 0 and 2 one
    assert 2 * result.macs == torch_contraction_flops(copy.deepcopy(model), inputs)


def test_the_callers_model_is_left_as_found():
    torch.manual_seed(0)
    model, inputs = Stack([Block() for _ in range(3)]), (torch.randn(B, D),)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    count_flops(model, inputs)
    assert all("forward" not in vars(m) for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class Indexed(nn.Module):
    """Block() plus a per-layer index its forward never reads (as HF layers keep
    ``layer_idx`` to index a KV cache they are not given in a plain forward)."""

    def __init__(self, index: int, hidden: int = H) -> None:
        super().__init__()
        self.layer_idx = index
        self.up = nn.Linear(D, hidden)
        self.down = nn.Linear(hidden, D)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))) + x


class Repeating(nn.Module):
    """A block whose plain attribute ``times`` (read by its forward) decides how many
    times its Linear runs: blocks that differ in it must not share a booking."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.times = times
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        for _ in range(self.times):
            x = self.fc(x)
        return x


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_blocks_differing_only_in_an_unread_attribute_are_reused(monkeypatch, train):
    torch.manual_seed(0)
    model, inputs = Stack([Indexed(i) for i in range(4)]).train(train), (torch.randn(B, D),)
    result = count_flops(model, inputs)
    assert result.macs == _stack_macs([H] * 4)  # hand count: up and down of every block
    assert 2 * result.by_operator("macs")["aten::linear"] == torch_contraction_flops(copy.deepcopy(model), inputs)
    # blocks 1..3 are booked from block 0: layer_idx is not read by the forward
    assert _reused(model, inputs) == 3
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)


def test_blocks_differing_in_a_read_attribute_are_traced(monkeypatch):
    torch.manual_seed(0)
    times = [1, 2, 1, 3]
    model, inputs = Stack([Repeating(n) for n in times]), (torch.randn(B, D),)
    result = count_flops(model, inputs)
    assert result.macs == sum(times) * B * D * D  # hand count: one B x D x D Linear per repetition
    assert 2 * result.macs == torch_contraction_flops(copy.deepcopy(model), inputs)
    assert [result.by_module("macs")[f"blocks.{i}"] for i in range(4)] == [n * B * D * D for n in times]
    # only block 2 (times=1 again, as block 0) is booked from an earlier call
    assert _reused(model, inputs) == 1
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)


def test_bert_layers_with_their_own_layer_idx_are_reused(monkeypatch):
    model, inputs = _zoo("bert")
    model.eval()
    # 3 BertLayers differing only in layer_idx (read only with a KV cache): layers 1 and 2
    # are booked from layer 0, whole (their attention, intermediate and output inside)
    assert _reused(model, inputs) == 2
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)


def test_the_copy_modules_classes_are_given_back():
    # the tracking subclass is swapped in on the fake copy only, and back after the run
    torch.manual_seed(0)
    model, inputs = Stack([Indexed(i) for i in range(3)]), (torch.randn(B, D),)
    count_flops(model, inputs)
    assert {type(m).__name__ for m in model.modules()} == {"Stack", "ModuleList", "Indexed", "Linear"}
    assert all(type(m).__getattribute__ is object.__getattribute__ for m in model.modules())


class Looped(nn.Module):
    """One block object called ``n`` times (weights shared across depth, as ALBERT's layer)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.block = Block()

    def forward(self, x):
        for _ in range(self.n):
            x = self.block(x)
        return x


def test_one_block_called_again_and_again_is_reused(monkeypatch):
    torch.manual_seed(0)
    model, inputs = Looped(5), (torch.randn(B, D),)
    result = count_flops(model, inputs)
    assert result.macs == _stack_macs([H] * 5)  # hand count: 5 calls of up and down
    assert 2 * result.macs == torch_contraction_flops(copy.deepcopy(model), inputs)
    assert [m.calls for m in result.modules if m.name == "block"] == [5]
    # the block has no twin: its first call runs unkeyed, the second is keyed and traced,
    # the last three are booked from it
    assert _reused(model, inputs) == 3
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)


class Failing(nn.Module):
    """Block() that raises on its ``fail_at``-th call (counted on the module it is given)."""

    def __init__(self, calls: dict, fail_at: int) -> None:
        super().__init__()
        self.calls = calls
        self.fail_at = fail_at
        self.fc = nn.Linear(D, D)
        self.act = nn.ReLU()

    def forward(self, x):
        self.calls["n"] += 1
        if self.calls["n"] == self.fail_at:
            raise ValueError("block failed on purpose")
        return self.act(self.fc(x))


def test_a_forward_that_raises_leaves_the_model_as_found():
    torch.manual_seed(0)
    calls = {"n": 0}
    model, inputs = Stack([Failing(calls, 3) for _ in range(4)]), (torch.randn(B, D),)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(Exception, match="block failed on purpose") as info:
        count_flops(model, inputs)
    assert "blocks.2" in str(info.value)  # the failing module is named
    assert {type(m) for m in model.modules()} == {Stack, nn.ModuleList, Failing, nn.Linear, nn.ReLU}
    assert all("forward" not in vars(m) for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_reuse_is_on_by_default_and_off_with_the_variable(monkeypatch):
    torch.manual_seed(0)
    model, inputs = Stack([Block() for _ in range(8)]), (torch.randn(B, D),)
    monkeypatch.delenv("FLOPCOUNT_REUSE")
    assert _reused(model, inputs) == 7  # blocks 1..7 booked from block 0 (8 such blocks pay: keyed by default)
    for off in ("0", "false", "off"):
        monkeypatch.setenv("FLOPCOUNT_REUSE", off)
        assert _reused(model, inputs) == 0


@pytest.mark.parametrize("blocks", [2, 5])
def test_the_result_says_how_many_calls_were_reused(monkeypatch, blocks):
    """Issue #32: "the result says how many calls were reused" (it was only in the trace's
    internal statistics). Blocks 1..n-1 are booked from block 0: n - 1 calls; with reuse off,
    none, and the same document either way."""
    torch.manual_seed(0)
    model, inputs = Stack([Block() for _ in range(blocks)]), (torch.randn(B, D),)
    on = count_flops(model, inputs)
    assert on.reused_calls == blocks - 1
    assert on.macs == blocks * B * 2 * D * H  # each block: two Linears of D x H per row
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, inputs)
    assert off.reused_calls == 0 and off.to_dict() == on.to_dict()


def _meta_llama(layers: int):
    with torch.device("meta"):
        return hf.llama(num_hidden_layers=layers, hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                        intermediate_size=96, vocab_size=VOCAB)


def test_predict_and_count_generation_say_how_many_calls_were_reused(monkeypatch):
    """predict and count_generation reuse on the same trace as count_flops; their results said
    nothing (count_generation's prefill and step results said 0). A 4-layer decoder on meta:
    layers 1-3 booked from layer 0 in each traced forward, the prefill's and each decode step's
    (the cache included); a decode step costed as a continuation is not traced: 0."""
    import flopcount

    model, ids = _meta_llama(4), hf.token_ids(1, 8, VOCAB)
    predicted = flopcount.predict(model, (ids,), on="h100")
    assert predicted.reused_calls == 3 == count_flops(model, (ids,)).reused_calls
    # 12 new tokens: the prefill and steps 0-2 traced, 3-9 continued, 10 traced (the check)
    generated = flopcount.count_generation(model, ids, new_tokens=12)
    assert generated.prefill.reused_calls == 3
    assert [step.reused_calls for step in generated.steps] == [3, 3, 3] + [0] * 7 + [3]
    assert generated.reused_calls == 3 + 4 * 3
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    assert flopcount.predict(model, (ids,), on="h100").reused_calls == 0
    off = flopcount.count_generation(model, ids, new_tokens=12)
    assert off.reused_calls == 0 and off.to_dict() == generated.to_dict()
