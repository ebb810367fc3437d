"""Index range checks on models without transformers modules (branch gaps4; cantrun's checks,
tests/tracers/test_index_checks.py, were exact for transformers models and for the caller's ids).

A hand-written GPT looks its positions up in a learned table, ``self.pos(torch.arange(T))``; with
more tokens than the table has rows the real forward raises ``IndexError`` in ``pos``. The
positions' value was followed on meta, not on the fake copies the default count makes of a model
with real weights (transformers' FakeValues follows them only for transformers models), so
``count_flops`` counted a forward that cannot run; ``estimate_memory`` checked no index of such a
model (not even the caller's ids), ``plan`` checked neither its positions nor the caller's ids and
said no module when it refused a transformers model's, and under ``torch.inference_mode`` the
caller's ids were not read (inference tensors keep no version counter to see a write by).

Oracles: the real forward on CPU (raises past the table, runs at its edge), torch's
``FlopCounterMode`` for the MACs and ``MemTracker`` for the peak of what does run."""

from __future__ import annotations

from typing import Any, Callable, Optional

import pytest
import torch
from _live_oracles import warmed_step_peak
from conftest import assert_same_state, snapshot, torch_contraction_flops
from torch import nn

import flopcount
from flopcount import count_flops
from flopcount.errors import TraceError

ROWS, VOCAB, WIDTH = 16, 50, 32


class HandGPT(nn.Module):
    """Token and learned position tables, one Linear head; ``positions``: how the forward makes
    its position ids from the sequence length (the ways hand-written models write it)."""

    def __init__(self, positions: str = "arange", inplace_first: bool = False) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(ROWS, WIDTH)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.positions, self.inplace_first = positions, inplace_first

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        batch, tokens = ids.shape
        x = self.tok(ids)
        if self.inplace_first:
            x = self.act(x)  # an in-place op on a float tensor before the positions are made
        if self.positions == "arange":
            where = torch.arange(tokens, device=ids.device)
        elif self.positions == "offset":  # a cache of 2 earlier tokens: positions 2 .. tokens + 1
            where = torch.arange(tokens, device=ids.device) + 2
        else:  # "expand": (batch, tokens) position ids, as a padded batch builds them
            where = torch.arange(0, tokens, dtype=torch.long, device=ids.device).unsqueeze(0).expand(batch, tokens)
        return self.head(x + self.pos(where))


def _ids(tokens: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, tokens), generator=torch.Generator().manual_seed(tokens))


def _real_error(model: nn.Module, *args: Any) -> Optional[BaseException]:
    try:
        with torch.no_grad():
            model(*args)
    except Exception as exc:
        return exc
    return None


def _refused(run: Callable[[], Any], module: str, index: int, rows: int) -> str:
    """The TraceError ``run`` raises names ``module``, the op, the index and the table."""
    with pytest.raises(TraceError) as caught:
        run()
    text = str(caught.value)
    assert f"'{module}'" in text, text
    assert f"aten::embedding reads index {index}, but its table has {rows} rows" in text, text
    return text


# tokens past the table: the real forward's first position off the table ("offset" starts at 2)
PAST = {"arange": (ROWS + 1, ROWS), "offset": (ROWS - 1, ROWS), "expand": (ROWS + 1, ROWS)}


@pytest.mark.parametrize("positions", sorted(PAST))
@pytest.mark.parametrize("batch", [1, 2])
def test_positions_past_the_table_are_refused_on_fake_copies(positions: str, batch: int) -> None:
    """The default count (fake copies of real weights) refuses as the real forward raises; main counted it."""
    torch.manual_seed(0)
    model = HandGPT(positions).eval()
    tokens, index = PAST[positions]
    ids = _ids(tokens, batch)
    assert isinstance(_real_error(model, ids), IndexError)  # the oracle: the real forward cannot run
    before = snapshot(model)
    text = _refused(lambda: count_flops(model, ids), "pos", index, ROWS)
    assert "(auto tracer)" in text
    assert_same_state(model, before)


def test_an_in_place_float_op_before_the_positions_keeps_them_followed() -> None:
    """An in-place ReLU writes a float tensor, which cannot be an integral tensor whose value is known."""
    torch.manual_seed(0)
    model = HandGPT(inplace_first=True).eval()
    assert isinstance(_real_error(model, _ids(ROWS + 1)), IndexError)
    _refused(lambda: count_flops(model, _ids(ROWS + 1)), "pos", ROWS, ROWS)


@pytest.mark.parametrize("positions", sorted(PAST))
def test_at_the_table_the_count_is_torchs(positions: str) -> None:
    torch.manual_seed(0)
    model = HandGPT(positions).eval()
    tokens = PAST[positions][0] - 1
    ids = _ids(tokens, 2)
    assert _real_error(model, ids) is None
    for tracer in ("auto", "dispatch"):
        assert 2 * count_flops(model, ids, tracer=tracer).macs == torch_contraction_flops(model, (ids,))


def test_a_model_built_on_meta_is_refused_with_cpu_ids() -> None:
    with torch.device("meta"):
        model = HandGPT()
    _refused(lambda: count_flops(model, _ids(ROWS + 1)), "pos", ROWS, ROWS)
    torch.manual_seed(0)
    real = HandGPT()
    assert 2 * count_flops(model, _ids(ROWS)).macs == torch_contraction_flops(real, (_ids(ROWS),))


def test_estimate_memory_refuses_positions_and_ids_past_their_tables() -> None:
    """main estimated both (the real step raises); at the edge the estimate is MemTracker's peak."""
    torch.manual_seed(0)
    model = HandGPT().train()
    before = snapshot(model)
    _refused(lambda: flopcount.estimate_memory(model, _ids(ROWS + 1)), "pos", ROWS, ROWS)
    _refused(lambda: flopcount.estimate_memory(model, _ids(ROWS + 1), backward=True, optimizer="adamw"), "pos", ROWS, ROWS)
    _refused(lambda: flopcount.estimate_memory(model, torch.tensor([[1, VOCAB, 2]])), "tok", VOCAB, VOCAB)
    assert_same_state(model, before)
    ids = _ids(ROWS, 2)
    estimate = flopcount.estimate_memory(model, ids, backward=True, optimizer=torch.optim.AdamW)
    assert estimate.peak_bytes == warmed_step_peak(model, ids, torch.optim.AdamW)


def test_plan_refuses_positions_and_ids_naming_the_module() -> None:
    """plan checked neither before (it planned both steps)."""
    text = _refused(lambda: flopcount.plan(HandGPT, _ids(ROWS + 1), on=None), "pos", ROWS, ROWS)
    assert text.startswith("forward failed in module 'pos' (plan, rank 0) with inputs"), text
    _refused(lambda: flopcount.plan(HandGPT, torch.tensor([[1, VOCAB, 2]]), on=None), "tok", VOCAB, VOCAB)
    flopcount.plan(HandGPT, _ids(ROWS), on=None)  # at the edge: planned


# -- under torch.inference_mode: the caller's ids are inference tensors, with no version counter --


class Table(nn.Module):
    def __init__(self, write: str = "") -> None:
        super().__init__()
        self.table = nn.Embedding(8, 4)
        self.write = write

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.write == "in place":
            ids += 1
        elif self.write == "a view":
            ids[:, 0] = 0
        return self.table(ids)


def test_in_inference_mode_the_callers_ids_are_checked() -> None:
    """main counted ids past the table under inference_mode (their writes could not be seen, so they were not read)."""
    model, ids = Table(), torch.tensor([[0, 1, 8]])
    assert isinstance(_real_error(model, ids), IndexError)
    with torch.inference_mode():
        for tracer in ("auto", "dispatch"):
            _refused(lambda: count_flops(model, ids, tracer=tracer), "table", 8, 8)
        _refused(lambda: count_flops(HandGPT(), _ids(ROWS + 1)), "pos", ROWS, ROWS)
        _refused(lambda: flopcount.estimate_memory(model, ids), "table", 8, 8)


@pytest.mark.parametrize("write, given", [("in place", [[-1, 6]]), ("a view", [[99, 6]])])
def test_in_inference_mode_ids_written_by_the_forward_are_not_checked_as_given(write: str, given: Any) -> None:
    """The forward writes its ids (itself, or through a view) into the table's range before the
    lookup, and the real forward runs: the ids as given must not be read after the write."""
    model = Table(write)
    with torch.inference_mode():
        ids = torch.tensor(given)
        assert _real_error(model, ids.clone()) is None
        for tracer in ("auto", "dispatch"):
            before = ids.clone()
            result = count_flops(model, ids, tracer=tracer)
            assert torch.equal(ids, before)  # the caller's ids left as found
            assert result.by_operator("count").get("aten::embedding") == 1
