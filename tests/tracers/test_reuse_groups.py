"""A call booked from an earlier one is ONE record (issue #32: the count's memory flat in depth).

Findings, each a regression test that fails before the change:

* structural reuse appended one ``OpEvent`` per op of the first call for every call booked
  from it (54 per LLaMA layer), each then paired with its cost: the trace grew by a block's
  events per repeated block. Now the trace grows by one :class:`~flopcount.types.ReplayedCall` per
  repeated block (``test_the_trace_grows_by_one_record_per_repeated_block``);
* the result held a copy of each repeated block's tables (per operator, per module x
  operator): now equal tables are one object (``test_equal_module_tables_are_one_object``).

And what the change could break, each against an oracle of its own: the count with reuse off
(``FLOPCOUNT_REUSE=0``: every call traced, one event per op, booked event by event), table by
table and key order included; the ledger's per-(stack, op, phase) booking of the expanded
events (``rows=True``); MACs derived by hand. Cases: a shared submodule called under two names
inside a repeated block (aliases), a repeated block inside a repeated block, an op without a
handler and an estimated op inside a repeated block, batch > 1, train and eval, backward=True
(phases), the three tracers, ``predict``'s rows and ``count_generation``.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import pytest
import torch
from torch import nn

import flopcount
from flopcount.core.analysis import cost_events, cost_records
from flopcount.core.inputs import prepare_call
from flopcount.core.ledger import Ledger, _alone
from flopcount.core.model_facts import model_facts
from flopcount.handlers import default_registry
from flopcount.tracers import trace
from flopcount.types import Cost, OpEvent, ReplayedCall

# the reuse key on stacks of 2 or 3 small blocks: every twin group keyed (the default policy would trace
# them: tests/conftest.py, ``reuse_always``)
pytestmark = pytest.mark.usefixtures("reuse_always")

B, D, H = 3, 8, 16


class Shared(nn.Module):
    """A Linear(D, H) under two names (``up``, ``again``), called through both, and a Linear(H, D)
    called twice: MACs per row D*H (up) + H*D (down) + D*H (again) + H*D (down) = 4 * D * H."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, H)
        self.again = self.up
        self.down = nn.Linear(H, D)
        self.norm = nn.LayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.down(torch.relu(self.up(x)))
        return self.norm(x + y + self.down(self.again(y)))


class Outer(nn.Module):
    """Two ``Shared`` blocks of one structure: the second is booked from the first inside the
    first ``Outer`` call, and the later ``Outer`` calls are booked from the first whole
    (a repeated block inside a repeated block)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.ModuleList([Shared(), Shared()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.inner:
            x = block(x)
        return x


class Looped(nn.Module):
    """One block called three times and one ``Outer`` called three times, each under one name
    (ALBERT's way): the replays of a call share its module stacks with each other and with the
    traced call, so the ledger adds their tables up instead of grafting them alone."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Shared()
        self.outer = Outer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = self.block(x)
        for _ in range(3):
            x = self.outer(x)
        return x


class Stack(nn.Module):
    def __init__(self, n: int, block: type = Shared) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([block() for _ in range(n)])
        self.head = nn.Linear(D, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _block_macs(rows: int) -> int:
    return rows * 4 * D * H  # Shared's docstring


def _tables(result: flopcount.FlopResult) -> Tuple[Any, ...]:
    """Every table of a result, key order included."""
    return (
        list(result._operators.items()), list(result._modules.items()), list(result._phases.items()),
        [(name, list(ops.items())) for name, ops in result._module_ops.items()],
        result.unsupported_details(), result.warnings, [(m.name, m.calls) for m in result.modules],
        (result.flops, result.macs, result.bytes_read, result.bytes_written),
    )


def _count(monkeypatch: Any, reuse: str, model: nn.Module, *args: Any, **kwargs: Any) -> flopcount.FlopResult:
    monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
    return flopcount.count_flops(model, *args, **kwargs)


def _records(model: nn.Module, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
    return trace(model, prepare_call(inputs), facts=model_facts(model)).records


def test_the_trace_grows_by_one_record_per_repeated_block(monkeypatch: Any) -> None:
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")
    torch.manual_seed(0)
    x = torch.randn(B, D)
    small, large = _records(Stack(4).eval(), (x,)), _records(Stack(8).eval(), (x,))
    # four more blocks, each booked from the first: four more records (before: four blocks' events)
    assert len(large) - len(small) == 4
    replays = [r for r in large if isinstance(r, ReplayedCall)]
    assert len(replays) == 7 and all(r.ops is replays[0].ops for r in replays)  # one ops tuple, shared
    assert all(not isinstance(r, ReplayedCall) for r in _records(Stack(8).eval(), (x,))[: len(replays[0].ops)])


def test_the_expanded_events_are_those_of_a_count_without_reuse(monkeypatch: Any) -> None:
    torch.manual_seed(0)
    model, x = Stack(5, Outer).eval(), torch.randn(B, D)
    facts = model_facts(model)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")
    on = trace(model, prepare_call((x,)), facts=facts)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = trace(model, prepare_call((x,)), facts=facts)
    assert not any(isinstance(r, ReplayedCall) for r in off.records) and off.events is off.records
    # a repeated block inside a repeated block: the inner block of the first Outer is a replay,
    # and the later Outers are booked from the first whole (its inner replay's ops flattened in)
    assert sum(isinstance(r, ReplayedCall) for r in on.records) == 1 + 4
    key = [(e.call.op, e.module_stack, e.phase) for e in on.events]
    assert key == [(e.call.op, e.module_stack, e.phase) for e in off.events]
    assert on.module_calls == off.module_calls


@pytest.mark.parametrize("block", [Shared, Outer, Looped], ids=["aliased", "nested", "looped"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_a_count_with_reuse_equals_it_without(monkeypatch: Any, block: type, train: bool, tracer: str) -> None:
    torch.manual_seed(0)
    model, x = Stack(6, block).train(train), torch.randn(B, D)
    on = _count(monkeypatch, "always", model, (x,), tracer=tracer)
    off = _count(monkeypatch, "0", model, (x,), tracer=tracer)
    assert _tables(on) == _tables(off)
    per = {Shared: 1, Outer: 2, Looped: 3 + 3 * 2}[block]  # Shared calls per block
    assert on.macs == 6 * per * _block_macs(B) + B * D * 4  # + the head
    assert on.module_totals("blocks.3").macs == _block_macs(B) * per
    # the shared Linear under its canonical name, called through both names (2 * D * H per row) per call of its block
    shared = {Shared: "blocks.2.up", Outer: "blocks.2.inner.1.up", Looped: "blocks.2.block.up"}[block]
    assert on.module_totals(shared).macs == B * 2 * D * H * (3 if block is Looped else 1)
    if tracer == "auto":
        assert on.reused_calls > 0 and off.reused_calls == 0


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_backward_phases_equal_with_and_without_reuse(monkeypatch: Any, train: bool) -> None:
    torch.manual_seed(0)
    model, x = Stack(4, Outer).train(train), torch.randn(B, D)
    on = _count(monkeypatch, "always", model, (x,), backward=True)
    off = _count(monkeypatch, "0", model, (x,), backward=True)
    assert _tables(on) == _tables(off)
    assert list(on.by_phase()) == ["forward", "backward"]
    assert on.by_phase("macs")["forward"] == 8 * _block_macs(B) + B * D * 4


def _unsupported_norm(call: Any) -> None:
    return None  # a handler's None: this call is not supported (listed, never zero)


#: relu priced with a note (an estimate), the layer norm unsupported: both inside every block
_HANDLERS = {
    "aten::relu": lambda call: Cost.from_flops(call.out().numel).with_note("made up for the test"),
    "aten::layer_norm": _unsupported_norm,
    "aten::native_layer_norm": _unsupported_norm,
}


def test_an_unsupported_op_and_an_estimate_in_a_repeated_block(monkeypatch: Any) -> None:
    """Tallied per replay in event order: the ops without a handler with each module they ran
    in, and the estimate notes with their calls, as event by event."""
    torch.manual_seed(0)
    model, x = Stack(5).eval(), torch.randn(B, D)
    on = _count(monkeypatch, "always", model, (x,), handlers=_HANDLERS)
    off = _count(monkeypatch, "0", model, (x,), handlers=_HANDLERS)
    assert on.reused_calls == 4
    assert _tables(on) == _tables(off)
    assert [(u.count, u.modules) for u in on.unsupported_details()] == [(5, tuple(f"blocks.{i}.norm" for i in range(5)))]
    assert ("aten::relu", "made up for the test", 5) in on._estimates  # one relu per block, 5 blocks


class Bare(nn.Module):
    """A block whose one op (relu) has no handler in the test: a replay with no costed op."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


def test_a_repeated_block_with_no_costed_op(monkeypatch: Any) -> None:
    torch.manual_seed(0)
    model, x = Stack(4, Bare).eval(), torch.randn(B, D)
    handlers = {"aten::relu": _unsupported_norm}
    on = _count(monkeypatch, "always", model, (x,), handlers=handlers)
    off = _count(monkeypatch, "0", model, (x,), handlers=handlers)
    assert on.reused_calls == 3 and _tables(on) == _tables(off)
    assert [(u.op, u.count, u.modules) for u in on.unsupported_details()] == [
        ("aten::relu", 4, tuple(f"blocks.{i}.act" for i in range(4)))
    ]
    assert on.macs == B * D * 4 and on.module_totals("blocks.2").count == 0  # the head only


def _ledger_tables(ledger: Ledger) -> Tuple[Any, ...]:
    return (
        list(ledger.operators.items()), list(ledger.phases.items()), list(ledger.modules.items()),
        [(owner, list(ops.items())) for owner, ops in ledger.module_ops.items()],
        list(ledger.notes.items()), [(op, n, list(m)) for op, (n, m) in ledger.unsupported.items()],
    )


@pytest.mark.parametrize("block", [Shared, Outer, Looped], ids=["aliased", "nested", "looped"])
def test_the_ledger_books_a_replay_as_its_events(monkeypatch: Any, block: type) -> None:
    """Oracle: the ledger's per-(stack, op, phase) booking of the expanded events (``rows=True``)
    and the tree booking of the same events one by one; a replay's tables are made once."""
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")
    torch.manual_seed(0)
    model, x = Stack(6, block).eval(), torch.randn(B, D)
    facts = model_facts(model)
    run = trace(model, prepare_call((x,)), facts=facts)
    registry = default_registry().with_overrides(_HANDLERS)
    grouped = cost_records(run.records, registry)
    groups = [c for r, c in grouped if isinstance(r, ReplayedCall)]
    assert groups and all(c is groups[-1] for c in groups[-4:])  # one costs tuple per distinct ops
    events = cost_events(run.events, registry)
    one_by_one = _ledger_tables(Ledger(facts.aliases).book_all(events))
    tree = Ledger(facts.aliases).book_all(grouped)
    assert _ledger_tables(tree) == one_by_one
    # the blocks called once are grafted: equal subtrees, one table
    assert tree.module_ops["blocks.3"] is tree.module_ops["blocks.4"]
    replays = [r for r, _ in grouped if isinstance(r, ReplayedCall)]
    alone = _alone(grouped)
    assert alone and (len(alone) < len(replays)) == (block is Looped)  # the looped calls' replays: added up
    # a ledger whose owners share lists gives each its own before booking more: blocks.3 alone changes
    tree.rebook_group([OpEvent(events[-1][0].call, ("blocks.3",))], Cost(0, 0), Cost(1, 2))
    assert tree.modules["blocks.3"][1] == tree.modules["blocks.4"][1] + 1
    assert _ledger_tables(Ledger(facts.aliases, rows=True).book_all(events)) == one_by_one
    assert _ledger_tables(Ledger(facts.aliases, rows=True).book_all(grouped)) == one_by_one


def test_equal_module_tables_are_one_object(monkeypatch: Any) -> None:
    torch.manual_seed(0)
    result = _count(monkeypatch, "always", Stack(6).eval(), (torch.randn(B, D),))
    tables = [result._module_ops[f"blocks.{i}"] for i in range(6)]
    assert all(t is tables[0] for t in tables)
    assert result._modules["blocks.1"] is result._modules["blocks.4"]
    assert result.by_module_and_operator("macs")["blocks.5"]["aten::linear"] == _block_macs(B)


def test_predict_rows_of_a_repeated_model_equal_reuse_off(monkeypatch: Any) -> None:
    torch.manual_seed(0)
    model, x = Stack(5, Outer).eval(), torch.randn(B, D)
    made: List[Any] = []
    for reuse in ("always", "0"):
        monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
        made.append(flopcount.predict(model, (x,), on="h100"))
    on, off = made
    assert on.rows == off.rows
    assert on.by_module() == off.by_module()
    assert on.by_operator() == off.by_operator()


def test_count_generation_equal_with_and_without_reuse(monkeypatch: Any) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=50, max_position_embeddings=128,
    )
    made = []
    for reuse in ("always", "0"):
        monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        made.append(flopcount.count_generation(model, torch.zeros(2, 6, dtype=torch.int64, device="meta"), new_tokens=5))
    on, off = made
    for a, b in zip((on.prefill, *on.steps), (off.prefill, *off.steps)):
        assert _tables(a) == _tables(b)
    # by hand, the prefill: 2 x 6 tokens through 4 layers of q, k, v, o (32x32, 32x16, 32x16, 32x32) and a
    # gated MLP (3 x 32x64), attention 4 heads x (QK^T + AV) 2 x 8 x 6 per token; the LM head on the last position
    dense = 4 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64)
    assert on.prefill.macs == 2 * 6 * (dense + 4 * 4 * 2 * 8 * 6) + 2 * 32 * 50


def test_a_replay_s_events_name_its_own_modules() -> None:
    call = object()
    replay = ReplayedCall(((call, 0, "forward"), (call, 1, "forward")), (("a",), ("a", "a.b")))  # type: ignore[arg-type]
    assert list(replay.events()) == [OpEvent(call, ("a",)), OpEvent(call, ("a", "a.b"))]  # type: ignore[arg-type]


class Embedder(nn.Module):
    """A timestep embedder (diffusers' ``CombinedTimestepLabelEmbeddings``): a sinusoidal part
    without MACs, then Linear(4, D) and Linear(D, D): 4·D + D·D MACs per row."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.SiLU())
        self.mlp = nn.Sequential(nn.Linear(4, D), nn.SiLU(), nn.Linear(D, D))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.proj(t))


class AdaNorm(nn.Module):
    """An embedder's modulation of a LayerNorm (affine or not: 2·D parameters or none)."""

    def __init__(self, affine: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D, elementwise_affine=affine)
        self.emb = Embedder()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * self.emb(t)


class AdaBlock(nn.Module):
    """A norm holding an embedder, then a Linear(D, D); the first block's norm is affine, the
    others' not (so block 1's norm is traced, and its embedder call booked on its own)."""

    def __init__(self, affine: bool) -> None:
        super().__init__()
        self.norm1 = AdaNorm(affine)
        self.out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm1(x, t))


class DiTLike(nn.Module):
    """diffusers' DiT: after the blocks, the forward calls the first block's embedder again
    (``self.transformer_blocks[0].norm1.emb(timestep, ...)``) for the output's modulation. The
    embedder call of block 1 (three modules deep) and that last call (one deep, from the model's
    forward) are booked from block 0's embedder call; block 2 is booked from block 1."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([AdaBlock(affine=i == 0) for i in range(3)])

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, t)
        return x * self.blocks[0].norm1.emb(t)


def test_a_module_replayed_at_two_depths_books_its_own_modules(monkeypatch: Any) -> None:
    """Found by benchmarks/zoo_reuse_wild.py on diffusers' DiTTransformer2DModel: with reuse on,
    the module rows of the embedder's last call were shifted (its ``proj``, which has no MACs,
    booked the ``mlp``'s) and the modules above it lost that call. The ledger made the nodes of
    a replay's subtree once per group, as stack lengths of the first replay asked for (three
    modules deep); the last call, one deep, read its nodes at those lengths. Oracle: the count
    with reuse off, table by table, and the MACs by hand."""
    model, x, t = DiTLike(), torch.randn(B, D), torch.randn(B, 4)
    on = _count(monkeypatch, "always", model, (x, t))
    off = _count(monkeypatch, "0", model, (x, t))
    assert _tables(on) == _tables(off)
    per_call = B * (4 * D + D * D)  # Embedder's docstring
    macs = on.by_module("macs")
    assert macs["blocks.0.norm1.emb"] == 2 * per_call  # called in block 0 and from the model's forward
    assert macs["blocks.0.norm1.emb.proj"] == 0
    assert macs["blocks.0.norm1.emb.mlp"] == 2 * per_call
    assert macs["blocks.0.norm1.emb.mlp.2"] == 2 * B * D * D
    assert macs["blocks.1.norm1.emb.mlp.0"] == B * 4 * D
    assert on.macs == 4 * per_call + 3 * B * D * D
