"""Issue #27 ("one engine, finished", branch onerule): a count argument (an int of at least some
bound, not a bool) is checked by one rule, ``flopcount.errors.int_at_least``, whichever reading
takes it. The same bad values go to every caller, and each refuses them with the same
UsageError sentence naming the parameter and what was given:
``"<reading>: <parameter> must be an int >= <bound>, got <value>"``. Before, plan() said "an
integer" and ServeResult.at() "batch sizes must be ints" for the same refusal."""

from __future__ import annotations

import re
from typing import Any, Callable, List, Tuple

import pytest
import torch
from torch import nn

import flopcount
from flopcount import UsageError
from flopcount.errors import int_at_least, is_int_at_least

#: what is not an int of at least 1 (True is an int equal to 1 to Python: refused all the same)
NOT_AT_LEAST_1: List[Any] = [True, False, 0, -1, 2.0, "2", None]
#: what is not an int of at least 0
NOT_AT_LEAST_0: List[Any] = [True, False, -1, 2.0, "2", None]


#: the parameters for which None is a value (benchmark's adaptive iteration count, no batch size)
OPTIONAL = {"benchmark: iters", "benchmark: batch_size"}


def _tiny() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4))


def _refusal(low: int, name: str, value: Any) -> str:
    return f"{name} must be an int >= {low}, got {value!r}"


def _cheap_callers() -> List[Tuple[str, int, Callable[[Any], Any]]]:
    """(the parameter as the error names it, its bound, a call giving it ``value``): the readings
    that check the argument before they run anything."""
    x = torch.randn(2, 4)
    ids = torch.zeros(2, 3, dtype=torch.long)
    return [
        ("fsdp", 1, lambda value: flopcount.plan(_tiny, (x,), fsdp=value)),
        ("tp", 1, lambda value: flopcount.plan(_tiny, (x,), tp=value)),
        ("profile: warmup", 0, lambda value: flopcount.profile(_tiny(), x, warmup=value)),
        ("profile: steps", 1, lambda value: flopcount.profile(_tiny(), x, steps=value)),
        ("count_generation: new_tokens", 1, lambda value: flopcount.count_generation(_tiny(), ids, new_tokens=value)),
        ("serve: tp", 1, lambda value: flopcount.serve(_tiny(), ids, 2, tp=value)),
        # the timing readings took True for 1 (their checks had no bool rule) and said "a positive int"
        ("benchmark: iters", 1, lambda value: flopcount.benchmark(_tiny(), x, iters=value)),
        ("benchmark: min_iters", 1, lambda value: flopcount.benchmark(_tiny(), x, min_iters=value)),
        ("benchmark: warmup", 0, lambda value: flopcount.benchmark(_tiny(), x, warmup=value)),
        ("benchmark: batch_size", 1, lambda value: flopcount.benchmark(_tiny(), x, iters=1, warmup=0, batch_size=value)),
        ("module_latency: iters", 1, lambda value: flopcount.module_latency(_tiny(), x, iters=value)),
        ("module_latency: warmup", 0, lambda value: flopcount.module_latency(_tiny(), x, warmup=value)),
    ]


@pytest.mark.parametrize("index", range(len(_cheap_callers())))
def test_every_reading_refuses_the_same_bad_counts_in_the_same_words(index: int) -> None:
    name, low, call = _cheap_callers()[index]
    bad = NOT_AT_LEAST_1 if low == 1 else NOT_AT_LEAST_0
    if name in OPTIONAL:
        bad = [value for value in bad if value is not None]  # None: the default (adaptive, none)
    for value in bad:
        with pytest.raises(UsageError) as caught:
            call(value)
        assert str(caught.value) == _refusal(low, name, value)


def test_the_rule_itself() -> None:
    """Ints at the bound and above pass (returned as given); bools, floats, strings, None and
    ints below the bound do not."""
    assert [is_int_at_least(v, 1) for v in (1, 7, 2**70)] == [True, True, True]
    assert [is_int_at_least(v, 1) for v in NOT_AT_LEAST_1] == [False] * len(NOT_AT_LEAST_1)
    assert [is_int_at_least(v, 0) for v in (0, 3)] == [True, True]
    assert [is_int_at_least(v, 0) for v in NOT_AT_LEAST_0] == [False] * len(NOT_AT_LEAST_0)
    assert int_at_least(5, 1, "x") == 5
    with pytest.raises(UsageError, match=re.escape("x must be an int >= 3, got 2")):
        int_at_least(2, 3, "x")


transformers = pytest.importorskip("transformers")


def _llama() -> nn.Module:
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, vocab_size=50, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None
    return model.eval()


@pytest.mark.parametrize("option", ["max_cache_len", "prefill_chunk_size"])
def test_count_generation_options_refuse_the_same_bad_counts(option: str) -> None:
    model, ids = _llama(), torch.zeros(1, 3, dtype=torch.long)
    for value in [v for v in NOT_AT_LEAST_1 if v is not None]:  # None: the option not given
        with pytest.raises(UsageError) as caught:
            flopcount.count_generation(model, ids, new_tokens=2, **{option: value})
        assert str(caught.value) == _refusal(1, f"count_generation: {option} (argument)", value)


def test_a_serve_result_refuses_a_bad_batch_before_it_looks_one_up() -> None:
    """ServeResult.at found its row by ``==`` before any check: with batch 1 and 2 priced,
    at(True) gave batch 1's bounds and at(2.0) batch 2's."""
    model, ids = _llama(), torch.zeros(1, 3, dtype=torch.long)
    result = flopcount.serve(model, ids, 2, batch=[1, 2])
    for value in (True, 2.0):
        with pytest.raises(UsageError) as caught:
            result.at(value)
        assert str(caught.value) == _refusal(1, "serve: batch", value)
    assert result.at(2) is result.batches[1]


def test_serve_batches_refuse_the_same_bad_counts() -> None:
    """serve(batch=) keeps its own sentence (it takes a list too); a ServeResult priced at a bad
    batch says what every reading says."""
    model, ids = _llama(), torch.zeros(1, 3, dtype=torch.long)
    result = flopcount.serve(model, ids, 2, batch=[3])  # none of the bad values equals 3 (True == 1, 2.0 == 2)
    for value in NOT_AT_LEAST_1:
        with pytest.raises(UsageError) as caught:
            result.at(value)
        assert str(caught.value) == _refusal(1, "serve: batch", value)
    for value in [v for v in NOT_AT_LEAST_1 if v is not None]:  # None: the prompt's batch
        with pytest.raises(UsageError) as caught:
            flopcount.serve(model, ids, 2, batch=[1, value])
        assert str(caught.value) == f"serve: batch must be an int >= 1 or a list of them, got {[1, value]!r}"
