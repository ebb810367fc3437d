"""The default count of a model with real weights against the same count on a meta copy (issue
#32, realgap). cProfile found the two counts making the same calls (ResNet-50, BERT-base: same
functions, same call counts); the "real weights" gap bench_reuse showed came from the benchmark:
its real-weights column always ran right after FlopCounterMode's forward (cold caches), and its
meta copy (``deepcopy(model).to("meta")``) untied GPT-2's embedding and head, a different model.

Oracles: the combinatorial definition of a balanced order; a hand count of GPT-2's parameters;
``FlopCounterMode`` run live on the real model for the contractions."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch
from conftest import torch_contraction_flops

from flopcount import count_flops

BENCH = next(p / "benchmarks" for p in Path(__file__).resolve().parents if (p / "benchmarks" / "_interleave.py").exists())
sys.path.insert(0, str(BENCH))

import _interleave  # noqa: E402

hf = pytest.importorskip("flopcount.examples.hf")
pytest.importorskip("transformers")

CONTRACTIONS = ("aten::linear", "aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::baddbmm",
                "aten::scaled_dot_product_attention")
VOCAB, D, LAYERS, POSITIONS = 300, 64, 2, 64


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_balanced_orders_put_each_tool_right_after_each_other_equally_often(n: int) -> None:
    orders = _interleave.orders(n)
    follows: Dict[Tuple[int, int], int] = {}
    for order in orders:
        assert sorted(order) == list(range(n))
        for before, after in zip(order, order[1:]):
            follows[before, after] = follows.get((before, after), 0) + 1
    # every ordered pair of distinct tools adjacent, each as often: a Williams design
    assert set(follows) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(follows.values())) == 1
    assert len(orders) == (n if n % 2 == 0 else 2 * n)


def test_balanced_rounds_give_the_first_tool_every_other_tool_as_predecessor() -> None:
    calls: List[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("real", "meta", "meta_reuse", "fcm")}
    times, failures = _interleave.rounds(fns, 8, balanced=True)
    assert not failures and all(len(t or []) == 8 for t in times.values())
    timed = calls[len(fns):]  # after the warm-up calls
    before_real = {timed[i - 1] for i in range(1, len(timed)) if timed[i] == "real"}
    # the fixed order put FlopCounterMode ("fcm") before the real-weights count in every round
    assert before_real == {"meta", "meta_reuse", "fcm"}


def _gpt2() -> Tuple[Any, Tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = hf.gpt2(n_layer=LAYERS, n_embd=D, n_head=4, vocab_size=VOCAB, n_positions=POSITIONS)
    return model, (hf.token_ids(2, 12, VOCAB),)


def _gpt2_parameters() -> int:
    """GPT-2 by hand, head tied to the token embedding: wte V*d + wpe P*d; per layer two
    LayerNorms (2d each), c_attn d*3d + 3d, attention c_proj d*d + d, c_fc d*4d + 4d, mlp c_proj
    4d*d + d = 12d^2 + 13d; ln_f 2d; lm_head 0 (the wte tensor)."""
    return VOCAB * D + POSITIONS * D + LAYERS * (12 * D * D + 13 * D) + 2 * D


def _rows(result: Any, metrics: Tuple[str, ...]) -> Dict[str, Any]:
    rows = {
        metric: ({op: v for op, v in result.by_operator(metric).items() if v}, result.by_module(metric))
        for metric in metrics
    }
    return {**rows, "params": [(m.name, m.params) for m in result.modules]}


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_the_meta_copy_of_the_benchmarks_is_the_same_model_and_counts_the_same(tracer: str, train: bool) -> None:
    bench_reuse = pytest.importorskip("bench_reuse")
    model, inputs = _gpt2()
    model.train(train)
    meta_model, meta_inputs = bench_reuse.meta_copy(model, inputs)
    assert meta_model.lm_head.weight is meta_model.transformer.wte.weight  # the tie kept
    assert meta_model.lm_head.weight.is_meta and meta_inputs[0].is_meta and meta_model.training == train
    real = count_flops(model, inputs, tracer=tracer)
    meta = count_flops(meta_model, meta_inputs, tracer=tracer)
    assert real.params == meta.params == _gpt2_parameters()
    # bytes too on the default path; a real run on the meta device ("dispatch") makes the
    # attention's scalar constant with a clone where the CPU run lifts it (aten::lift_fresh,
    # 12,288 B per layer more): a different op stream, the same MACs and FLOPs (zero rows left out)
    metrics = ("macs", "flops", "bytes") if tracer == "auto" else ("macs", "flops")
    assert _rows(meta, metrics) == _rows(real, metrics)
    # the live peer on the real model (eval, no grad): contractions only, 2 FLOPs per MAC
    peer = torch_contraction_flops(copy.deepcopy(model).eval(), inputs)
    assert 2 * sum(v for op, v in meta.by_operator("macs").items() if op in CONTRACTIONS) == peer
