"""A forward that cannot run is not counted: an index beyond its table (branch cantrun).

GPT-2's learned position table has ``n_positions`` rows; a real forward of more tokens raises
``IndexError: index out of range in self`` in ``transformer.wpe``. Meta and fake tensors carry no
index values, so the default (fake) count, a model built on meta, ``count_generation``,
``predict``, ``estimate_memory`` and ``plan`` ran to the end and gave numbers for a forward that
cannot run (``flopcount count hf:gpt2 --input 1x2048:int64``: 661.564 GFLOPs). Where the index's
value is known (the caller's token ids, position ids made by ``arange``), the real kernel's range
check is now applied (flopcount/tracers/fake/indices.py).

Oracles: the real forward on CPU (raises past the table, runs at its edge), ``model.generate``
for generation, the real CPU kernel of each indexing op for its range, and ``FlopCounterMode``
for the MACs of the inputs that run."""

from __future__ import annotations

from typing import Any, Callable, Optional

import pytest
import torch
from torch import nn

import flopcount
from flopcount import count_flops
from flopcount.errors import TraceError
from tests.conftest import run_cli, torch_contraction_flops

transformers = pytest.importorskip("transformers")

ROWS, VOCAB = 16, 50


def _gpt2(device: str = "cpu") -> nn.Module:
    config = transformers.GPT2Config(n_positions=ROWS, n_embd=32, n_layer=2, n_head=2, vocab_size=VOCAB)
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.GPT2LMHeadModel(config).eval()


def _ids(tokens: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, tokens), generator=torch.Generator().manual_seed(tokens))


def _real_error(model: nn.Module, *args: Any, **kwargs: Any) -> Optional[BaseException]:
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    except Exception as exc:
        return exc
    return None


def _refused(run: Callable[[], Any], module: str) -> str:
    """The message of the TraceError ``run`` raises, which names ``module``, the op, the index and the table."""
    with pytest.raises(TraceError) as caught:
        run()
    text = str(caught.value)
    assert f"'{module}'" in text and "aten::embedding" in text, text
    assert f"index {ROWS}" in text and f"{ROWS} rows" in text, text
    return text


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize("batch", [1, 2])
def test_gpt2_past_its_position_table_is_refused_as_the_real_forward_raises(tracer: str, batch: int) -> None:
    model, ids = _gpt2(), _ids(ROWS + 1, batch)
    assert isinstance(_real_error(model, ids), IndexError)  # the oracle: the real forward cannot run
    before = {k: v.clone() for k, v in model.state_dict().items()}
    text = _refused(lambda: count_flops(model, ids, tracer=tracer), "transformer.wpe")
    assert f"({tracer} tracer)" in text and "IndexError" in text
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # left as found


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_gpt2_at_its_position_table_counts_what_torch_counts(tracer: str) -> None:
    model, ids = _gpt2(), _ids(ROWS, 2)
    assert _real_error(model, ids) is None
    result = count_flops(model, ids, tracer=tracer)
    assert 2 * result.macs == torch_contraction_flops(model, (ids,))


def test_a_model_built_on_meta_is_refused_with_cpu_or_meta_token_ids() -> None:
    """Position ids made by ``arange`` are known on meta and on fakes: the table's check needs no real data."""
    model = _gpt2("meta")
    _refused(lambda: count_flops(model, _ids(ROWS + 1)), "transformer.wpe")
    _refused(lambda: count_flops(model, torch.zeros(1, ROWS + 1, dtype=torch.long, device="meta")), "transformer.wpe")
    at_edge = count_flops(model, torch.zeros(1, ROWS, dtype=torch.long, device="meta"))
    assert 2 * at_edge.macs == torch_contraction_flops(_gpt2(), (_ids(ROWS),))


def test_token_ids_beyond_the_vocabulary_are_refused_in_the_token_table() -> None:
    model = _gpt2()
    for bad, shown in ((VOCAB, VOCAB), (-1, -1)):
        ids = torch.tensor([[1, bad, 2]])
        assert isinstance(_real_error(model, ids), IndexError)
        with pytest.raises(TraceError, match=rf"'transformer.wte'.*reads index {shown}, but its table has {VOCAB} rows"):
            count_flops(model, ids)
    assert _real_error(model, torch.tensor([[0, VOCAB - 1]])) is None
    count_flops(model, torch.tensor([[0, VOCAB - 1]]))  # the last row is a row


def test_generation_past_the_table_is_refused_and_up_to_it_counted() -> None:
    """``generate`` feeds positions up to prompt + new tokens - 2 (the last token is not fed):
    a 10-token prompt may take 7 new tokens with 16 positions, not 8 (GPT-2: 1,000 + 24, not + 128)."""
    model, prompt = _gpt2(), _ids(10)
    with torch.no_grad():
        made = model.generate(prompt, max_new_tokens=7, min_new_tokens=7, do_sample=False)
    assert made.shape[1] == 17
    with pytest.raises(IndexError), torch.no_grad():
        model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    flopcount.count_generation(model, prompt, 7)  # runs: counted
    _refused(lambda: flopcount.count_generation(model, prompt, 8), "transformer.wpe")


def test_predict_estimate_memory_and_plan_refuse_it_too() -> None:
    model, ids = _gpt2(), _ids(ROWS + 1)
    _refused(lambda: flopcount.predict(model, ids, on="h100"), "transformer.wpe")
    _refused(lambda: flopcount.estimate_memory(model, ids), "transformer.wpe")
    _refused(lambda: flopcount.estimate_memory(model, ids, backward=True, optimizer="adamw"), "transformer.wpe")
    # plan's line names the module as count's does (before: "the planned training step failed on rank 0: IndexError: ...")
    text = _refused(lambda: flopcount.plan(_gpt2, ids), "transformer.wpe")
    assert text.startswith("forward failed in module 'transformer.wpe' (plan, rank 0) with inputs"), text
    flopcount.plan(_gpt2, _ids(ROWS))  # at the edge: planned


def test_cli_refuses_with_one_line_at_exit_2(capsys: Any) -> None:
    small = ("--config", "n_layer=1", "--config", "n_embd=32", "--config", "n_head=2", "--config", f"n_positions={ROWS}")
    code, out, err = run_cli(capsys, "count", "hf:gpt2", *small, "--input", f"1x{ROWS + 1}:int64")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "'transformer.wpe'" in err and f"index {ROWS}, but its table has {ROWS} rows" in err
    code, out, err = run_cli(capsys, "count", "hf:gpt2", *small, "--input", "1x10:int64", "--generate", "8")
    assert code == 2 and "'transformer.wpe'" in err, err
    code, out, err = run_cli(capsys, "count", "hf:gpt2", *small, "--input", "1x10:int64", "--generate", "7")
    assert code == 0, err


# -- good inputs are not refused ------------------------------------------------------------


def _tiny(kind: str, **extra: Any) -> nn.Module:
    config = transformers.AutoConfig.for_model(
        kind, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=ROWS, **extra,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_rope_models_past_max_position_embeddings_count(kind: str) -> None:
    model, ids = _tiny(kind), _ids(3 * ROWS)
    assert _real_error(model, ids) is None
    assert 2 * count_flops(model, ids).macs == torch_contraction_flops(model, (ids,))
    flopcount.count_generation(model, _ids(2 * ROWS), ROWS)


def test_bert_past_its_table_fails_as_the_real_forward_and_at_it_counts() -> None:
    """BERT slices its position-id buffer to the table, so past it the real forward fails on a
    shape (an expand), not an index: the count gives that same error."""
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=ROWS,
        vocab_size=VOCAB,
    )
    model = transformers.BertModel(config).eval()
    real = _real_error(model, _ids(ROWS + 1))
    assert isinstance(real, RuntimeError)
    with pytest.raises(TraceError) as caught:
        count_flops(model, _ids(ROWS + 1))
    assert str(real).splitlines()[0] in str(caught.value)
    assert 2 * count_flops(model, _ids(ROWS)).macs == torch_contraction_flops(model, (_ids(ROWS),))


def test_t5_relative_buckets_at_long_lengths_count() -> None:
    config = transformers.T5Config(
        d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=VOCAB, relative_attention_num_buckets=8,
        relative_attention_max_distance=ROWS,
    )
    model = transformers.T5Model(config).eval()
    kwargs = dict(input_ids=_ids(20 * ROWS), decoder_input_ids=_ids(10 * ROWS))
    assert _real_error(model, **kwargs) is None
    result = count_flops(model, (), kwargs)
    real = count_flops(model, (), kwargs, tracer="dispatch")  # the real forward, counted as it runs
    assert (result.macs, result.flops) == (real.macs, real.flops)


# -- each op's range, as its real CPU kernel checks it ------------------------------------------


def _ops(index: torch.Tensor) -> dict:
    """Each indexing op on a size-5 dimension (or a 5-row table) with ``index``."""
    table, flat = torch.zeros(5, 3), torch.zeros(5)
    return {
        "embedding": lambda: torch.nn.functional.embedding(index, table),
        "embedding_bag": lambda: torch.nn.functional.embedding_bag(index, table, torch.tensor([0])),
        "index_select": lambda: table.index_select(0, index),
        "gather": lambda: table.gather(0, index.view(1, 1).expand(1, 3)),
        "index": lambda: table[index],
        "index_2nd_dim": lambda: torch.zeros(3, 5)[:, index],
        "take": lambda: flat.take(index),
        "scatter": lambda: flat.scatter(0, index, torch.ones(1)),
        "scatter_add_": lambda: flat.clone().scatter_add_(0, index, torch.ones(1)),
        "scatter_reduce": lambda: flat.scatter_reduce(0, index, torch.ones(1), "sum"),
        "index_put_": lambda: flat.clone().index_put_((index,), torch.ones(1)),
        "index_add": lambda: flat.index_add(0, index, torch.ones(1)),
        "index_copy": lambda: flat.index_copy(0, index, torch.ones(1)),
        "index_fill": lambda: flat.index_fill(0, index, 1.0),
    }


@pytest.mark.parametrize("value", [-6, -5, -1, 0, 4, 5])
def test_each_op_refuses_on_meta_exactly_where_its_cpu_kernel_does(value: int) -> None:
    """The index is made on meta by ``arange`` (its value followed): each op's meta run raises
    where the CPU kernel raises, with its exception type, and runs where it runs."""
    from flopcount.tracers._modules import ModuleStack
    from flopcount.tracers._recorder import Recorder

    for name, real_op in _ops(torch.tensor([value])).items():
        try:
            real_op()
            real: Optional[BaseException] = None
        except (IndexError, RuntimeError) as exc:
            real = exc
        recorder = Recorder(ModuleStack({}))
        with recorder:
            with torch.device("meta"):
                ops = _ops(torch.arange(value, value + 1))
                if real is None:
                    ops[name]()
                    continue
                with pytest.raises(type(real)) as caught:
                    ops[name]()
        assert f"reads index {value}" in str(caught.value), (name, caught.value)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)


class _TwoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = _Block(), _Block()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.first(a) + self.second(b)


@pytest.mark.usefixtures("reuse_always")  # a 2-block stack: keyed (the default policy would trace it)
def test_structural_reuse_books_no_block_whose_known_index_differs() -> None:
    """Two blocks of one key (same structure, arguments of one shape): the second is booked from
    the first only when its known index values are the first's (the key holds metadata only)."""
    model, ok, bad = _TwoBlocks(), torch.tensor([[0, 1, 7]]), torch.tensor([[0, 1, 8]])
    assert _real_error(model, ok, bad) is not None
    with pytest.raises(TraceError, match="'second.table'.*reads index 8, but its table has 8 rows"):
        count_flops(model, (ok, bad))
    same = count_flops(model, (ok, ok.clone()))
    assert same.reused_calls == 1  # equal values: booked from the first, as before
    other = count_flops(model, (ok, torch.tensor([[7, 6, 5]])))
    assert other.reused_calls == 0  # other values: traced (and checked)
    assert other.flops == same.flops == 1 * 3 * 4  # the add of two (1, 3, 4) lookups (a lookup: no FLOPs)


class _Shifts(nn.Module):
    """Shifts its token ids in place before the lookup: the count must not read the ids as given."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids += 1
        return self.table(ids)


def test_token_ids_written_in_place_are_not_checked_as_given() -> None:
    """The caller's ids start at -1, outside the table; the forward shifts them to row 0 first,
    and the real forward runs. The count must not check the ids as given (a stale value): the
    written fake's value is no longer known, and the count runs as the real forward does."""
    model, ids = _Shifts(), torch.tensor([[-1, 6]])
    assert _real_error(model, ids.clone()) is None
    assert isinstance(_real_error(model, torch.tensor([[0, 7]])), IndexError)
    before = ids.clone()
    for tracer in ("auto", "dispatch"):
        result = count_flops(model, ids, tracer=tracer)
        assert torch.equal(ids, before)  # the caller's ids left as found (the twin's run shifted its own)
        assert result.by_operator("count").get("aten::embedding") == 1  # the lookup ran, on the shifted ids


def test_in_inference_mode_the_checks_run_and_counts_stand() -> None:
    """Inference tensors keep no version counter (reading one raises): the checks and structural
    reuse's key do without it. GPT-2's position ids (followed values) are still checked; the ids of
    a model without transformers modules are read until an in-place op writes their storage
    (tests/tracers/test_index_checks_plain.py)."""
    model = _gpt2()
    with torch.inference_mode():
        _refused(lambda: count_flops(model, _ids(ROWS + 1)), "transformer.wpe")
        assert 2 * count_flops(model, _ids(ROWS)).macs == torch_contraction_flops(model, (_ids(ROWS),))
        blocks, ok = _TwoBlocks(), torch.tensor([[0, 1, 7]])
        assert count_flops(blocks, (ok, ok.clone())).flops == 1 * 3 * 4
