"""Hugging Face decoders counted on fake tensors take the branches their real forward takes
(flopcount/tracers/fake/hf_tracing.py).

transformers 5.x counts every FakeTensor as "tracing" (``is_tracing(t)`` -> ``is_fake_tensor(t)``)
and then, on flopcount's fake copies, materialised a (B, 1, T, T) causal mask where the real
forward hands SDPA ``is_causal`` (no mask and no cache: ``find_packed_sequence_indices`` did not
read the position ids; an all-ones mask: ``_ignore_causal_mask_sdpa`` did not read it), and with
that mask repeated K and V to every query head (``repeat_kv``) instead of SDPA's ``enable_gqa``;
a padded mask skipped the real run's two ``fast_all`` reads. Oracles, all from real runs:
flopcount's dispatch tracer on the real model (its rows are what a real forward runs: the model's
real tensors, no fake mode), the SDPA calls a TorchFunctionMode of this file sees in a real
forward, torch's MemTracker on the real step, and the real AdamW loop (_live_oracles.loop_peaks)
for plan. Each of them failed before the fix except the memory of a padded mask (the mask is
materialised on both sides) and the no-mask-with-cache case (transformers reads no value there)."""

from __future__ import annotations

import copy
import sys
import threading
from typing import Any, Dict, List, Tuple

import pytest
import torch
from conftest import ROOT
from torch.overrides import TorchFunctionMode

pytest.importorskip("transformers")

import flopcount
from flopcount.tracers import trace
from flopcount.tracers.fake import hf_tracing

B, T, VOCAB, LAYERS = 2, 16, 100, 5  # 5 layers: structural reuse and the memory replay both engage
HEADS, KV_HEADS, HIDDEN = 4, 2, 64


def _model(family: str, train: bool) -> torch.nn.Module:
    import transformers

    config_type, model_type = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[family]
    config = config_type(
        num_hidden_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return model_type(config).train(train)


def _call(mask: str) -> Tuple[torch.Tensor, Dict[str, Any]]:
    ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(0))
    ones = torch.ones(B, T, dtype=torch.long)
    padded = ones.clone()
    padded[0, :3] = 0  # left padding in the first sequence
    kwargs: Dict[str, Any] = {
        "none": {"use_cache": False},  # as in training: no mask, no cache
        "ones": {"attention_mask": ones},
        "padded": {"attention_mask": padded},
    }[mask]
    return ids, kwargs


def _rows(result: Any) -> Dict[str, Tuple[int, int, int, int, int]]:
    return {
        op: (t.count, t.macs, t.flops, t.bytes_read, t.bytes_written) for op, t in result.operator_totals().items()
    }


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("mask", ["none", "ones", "padded"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_count_rows_equal_the_real_run(family: str, mask: str, train: bool, backward: bool) -> None:
    model = _model(family, train)
    ids, kwargs = _call(mask)
    fake = flopcount.count_flops(model, (ids,), kwargs, backward=backward)
    real = flopcount.count_flops(model, (ids,), kwargs, backward=backward, tracer="dispatch")
    assert real.tracer == "dispatch" and not real.warnings  # the oracle: a real run, nothing stood in
    assert fake.tracer == "dispatch"  # auto: counted on fakes, not one real run
    assert not any("tracing path" in w for w in fake.warnings)
    assert _rows(fake) == _rows(real)
    assert fake.by_phase() == real.by_phase()
    assert fake.by_module() == real.by_module()


def _nonzero(rows: Dict[str, int]) -> Dict[str, int]:
    return {op: value for op, value in rows.items() if value}


class _SdpaCalls(TorchFunctionMode):
    """What each F.scaled_dot_product_attention call of a real forward is given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[Tuple[Any, ...]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            mask = kwargs.get("attn_mask")
            self.calls.append((
                None if mask is None else tuple(mask.shape), bool(kwargs.get("enable_gqa", False)),
                tuple(args[1].shape), bool(kwargs.get("is_causal", False)),
            ))
        return func(*args, **kwargs)


@pytest.mark.parametrize("mask", ["none", "ones", "padded"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_sdpa_gets_what_the_real_forward_gives_it(family: str, mask: str) -> None:
    """Independent of flopcount's counting: the real forward's SDPA arguments (seen by a function
    mode) against the fake trace's SDPA events. Real: no mask, is_causal and enable_gqa with
    KV_HEADS key heads for "none" and "ones"; the padded mask materialised, K/V repeated to HEADS."""
    model = _model(family, False)
    ids, kwargs = _call(mask)
    seen = _SdpaCalls()
    with seen, torch.no_grad():
        model(ids, **copy.copy(kwargs))
    events = [e for e in trace(model, (ids,), kwargs).events if e.call.op == "aten::scaled_dot_product_attention"]
    counted = [
        (
            None if e.call.args.get("attn_mask") is None else tuple(e.call.args["attn_mask"].shape),
            bool(e.call.args.get("enable_gqa")), tuple(e.call.args["key"].shape), bool(e.call.args.get("is_causal")),
        )
        for e in events
    ]
    assert counted == seen.calls
    expected_key = (B, KV_HEADS if mask != "padded" else HEADS, T, HIDDEN // HEADS)
    assert [c[2] for c in seen.calls] == [expected_key] * LAYERS


@pytest.mark.parametrize("mask", ["none", "ones", "padded"])
def test_jit_traces_the_branch_of_the_real_forward(mask: str) -> None:
    """The jit tracer runs the real model under torch.jit tracing, where transformers' is_tracing()
    is true for every tensor (``is_jit_tracing``): it materialised the mask (and K/V repeated) for
    "none" and "ones". Now the tracing thread is answered as a real forward: SDPA's arguments are
    the real forward's, and for the masks the FLOPs and MACs per operator equal the real dispatch
    run's (call counts and bytes differ between the two tracers on any model: jit records views
    and scalar operands its own way). With no mask they differ only by ``aten::diff``, which jit
    records as one op priced 32 FLOPs and the dispatch tracer as its decomposition: a vocabulary
    difference of the tracers, not of the branch."""
    model = _model("llama", False)
    ids, kwargs = _call(mask)
    seen = _SdpaCalls()
    with seen, torch.no_grad():
        model(ids, **copy.copy(kwargs))
    run = trace(model, (ids,), kwargs, tracer="jit")
    counted = [
        (
            None if e.call.args.get("attn_mask") is None else tuple(e.call.args["attn_mask"].shape),
            bool(e.call.args.get("enable_gqa")), tuple(e.call.args["key"].shape), bool(e.call.args.get("is_causal")),
        )
        for e in run.events if e.call.op == "aten::scaled_dot_product_attention"
    ]
    assert counted == seen.calls
    if mask != "none":
        jit = flopcount.count_flops(model, (ids,), kwargs, tracer="jit")
        real = flopcount.count_flops(model, (ids,), kwargs, tracer="dispatch")
        for metric in ("flops", "macs"):  # zero rows aside: each tracer names its free ops its own way
            assert _nonzero(jit.by_operator(metric)) == _nonzero(real.by_operator(metric))
    assert _probe() is getattr(sys.modules[hf_tracing.PROBE_MODULE], hf_tracing.PROBE_NAME)
    assert getattr(sys.modules[hf_tracing.PROBE_MODULE], hf_tracing.JIT_PROBE_NAME).__module__ == hf_tracing.PROBE_MODULE


def _encoder_model(name: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    if name == "bart":
        return transformers.BartModel(transformers.BartConfig(
            vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        )).eval()
    return transformers.DebertaV2Model(transformers.DebertaV2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
    )).eval()


@pytest.mark.parametrize("name", ["bart", "deberta-v2"])
def test_other_families_count_the_real_branch_with_every_tracer(name: str) -> None:
    """docs/coverage.md's transformers rows where jit and dispatch disagreed: BART's decoder makes
    its own float all-ones mask and checks it (``_ignore_causal_mask_sdpa``'s ``fast_all``: 32
    FLOPs of sum on 2 x 16), DeBERTa-v2 checks the token ids for padding
    (``warn_if_padding_and_no_attention_mask``: an ``any`` of 4 FLOPs); both checks were skipped
    on fakes and under jit ("tracing"). Now auto's rows equal the real dispatch run's and jit's
    FLOPs per operator too."""
    model = _encoder_model(name)
    ids = torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(0))
    real = flopcount.count_flops(model, (ids,), tracer="dispatch")
    auto = flopcount.count_flops(model, (ids,))
    jit = flopcount.count_flops(model, (ids,), tracer="jit")
    assert auto.tracer == "dispatch" and not any("tracing path" in w for w in auto.warnings)
    assert _rows(auto) == _rows(real)
    assert _nonzero(jit.by_operator()) == _nonzero(real.by_operator())


def _real_peak(model: torch.nn.Module, ids: torch.Tensor, kwargs: Dict[str, Any], backward: bool) -> int:
    """MemTracker's peak of the step estimate_memory sizes, run for real on a copy: the forward
    (under no_grad without backward), then the default loss (the logits' sum) and backward."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model = copy.deepcopy(model)
    tracker = MemTracker()
    tracker.track_external(model, ids, *[v for v in kwargs.values() if isinstance(v, torch.Tensor)])
    with tracker, torch.set_grad_enabled(backward):
        out = model(ids, **kwargs)
        if backward:
            loss = out.logits.sum()
            del out
            loss.backward()
            del loss
        else:
            del out
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return int(peak["Total"])


@pytest.mark.parametrize("train,backward", [(False, False), (True, True)], ids=["inference", "training"])
@pytest.mark.parametrize("mask", ["none", "ones", "padded"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_memory_peak_equals_memtracker_on_the_real_step(family: str, mask: str, train: bool, backward: bool) -> None:
    model = _model(family, train)
    ids, kwargs = _call(mask)
    estimate = flopcount.estimate_memory(model, (ids,), kwargs, backward=backward)
    assert not any("tracing path" in w for w in estimate.warnings)
    assert estimate.peak_bytes == _real_peak(model, ids, kwargs, backward)


def test_gpt2_with_activation_checkpointing_equals_memtracker() -> None:
    """docs/memory.md's former residual: GPT-2 (2 layers, batch 4 x 128) with gradient checkpointing
    on fakes built transformers' (batch, 1, L, L) bool mask that SDPA's is_causal makes unneeded on
    real tensors: the estimate was 4 x 128 x 128 = 65,536 bytes above MemTracker's real peak."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=256)).train()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    ids = torch.randint(0, VOCAB, (4, 128), generator=torch.Generator().manual_seed(0))
    estimate = flopcount.estimate_memory(model, (ids,), backward=True)
    assert estimate.peak_bytes == _real_peak(model, ids, {}, True)


def test_one_rank_plan_equals_the_real_loop(llama7_one_rank_plan: Any) -> None:
    """The one-rank plan of a 7-layer GQA LLaMA without cache (tests/plan/_plan_gloo.tiny_llama7):
    FLOPs per phase equal the real forward + backward of the same default loss (dispatch on real
    tensors), and the peak the real AdamW loop's steady state under MemTracker. Before the fix the
    plan's backward was 28,672 FLOPs above the real one (the backward of repeat_kv: 7 layers x 2
    (K, V) x B x HEADS x T x head_dim = 7 x 2 x 2 x 4 x 16 x 16) and its forward 2 below."""
    sys.path.insert(0, str(ROOT / "tests" / "plan"))
    import _plan_gloo as gloo
    from _live_oracles import loop_peaks

    from flopcount.step.loss import default_loss

    x = gloo.example_input("llama7")
    planned = llama7_one_rank_plan  # flopcount.plan(gloo.tiny_llama7, (x,), fsdp=1, on=None), made once (conftest)
    model = gloo.tiny_llama7().train()
    real = flopcount.count_flops(model, (x,), backward=True, tracer="dispatch", loss_fn=default_loss)
    assert {k: planned.flops[k] for k in ("forward", "backward")} == real.by_phase()
    assert not any("tracing path" in n for n in planned.notes)
    peaks, _ = loop_peaks(model, x)
    assert planned.peak_bytes == peaks[-1]


def test_a_value_the_fake_run_cannot_know_keeps_the_tracing_branch_and_says_so() -> None:
    """An attention mask on the meta device has no values: transformers is told "tracing" as before
    (the mask materialised, K/V repeated) and the count's warnings name the function that asked."""
    model = _model("llama", False)
    ids, _ = _call("ones")
    mask = torch.ones(B, T, dtype=torch.long, device="meta")
    run = trace(model, (ids,), {"attention_mask": mask})
    sdpa = [e for e in run.events if e.call.op == "aten::scaled_dot_product_attention"]
    assert [tuple(e.call.args["attn_mask"].shape) for e in sdpa] == [(B, 1, T, T)] * LAYERS
    assert [tuple(e.call.args["key"].shape)[1] for e in sdpa] == [HEADS] * LAYERS
    notes = [w for w in run.warnings if "tracing path" in w]
    assert len(notes) == 1 and "masking_utils._ignore_causal_mask_sdpa" in notes[0]


def _probe() -> Any:
    return getattr(sys.modules[hf_tracing.PROBE_MODULE], hf_tracing.PROBE_NAME)


def test_the_probe_is_transformers_own_outside_the_run_and_after_a_failure() -> None:
    original = _probe()
    model = _model("llama", False)
    ids, kwargs = _call("ones")
    inside: List[bool] = []
    handle = model.model.register_forward_pre_hook(lambda *a: inside.append(_probe() is not original))
    try:
        flopcount.count_flops(model, (ids,), kwargs)
        with pytest.raises(flopcount.TraceError):
            flopcount.count_flops(model, (ids.float(),), kwargs)  # embedding refuses float ids (fake and real)
    finally:
        handle.remove()
    assert inside and inside[0]  # installed while the fake run ran
    assert _probe() is original


def test_other_threads_get_transformers_own_answer() -> None:
    """While one thread's fake run answers "not tracing" for a fake whose value it follows,
    another thread asking about the same fake gets transformers' own answer (tracing)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers.utils.import_utils import is_tracing

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    real = torch.ones(B, T, dtype=torch.long)
    fake = mode.from_tensor(real, static_shapes=True)
    answers: Dict[str, bool] = {}
    started, asked = threading.Event(), threading.Event()

    def other() -> None:
        started.wait(10)
        answers["other"] = is_tracing(fake)
        asked.set()

    thread = threading.Thread(target=other)
    thread.start()
    with hf_tracing.RealBranches(True, [fake], [real]) as branches:
        answers["own"] = is_tracing(fake)
        started.set()
        asked.wait(10)
    thread.join(10)
    assert answers == {"own": False, "other": True}
    assert not branches.notes
    assert is_tracing(fake)  # after the run: transformers' own answer again


def test_a_model_without_transformers_modules_is_not_touched() -> None:
    original = _probe()
    branches = hf_tracing.real_branches(torch.nn.Linear(2, 2).modules())
    with branches:
        assert _probe() is original
    assert not branches.active


# --- canaries: the transformers names hf_tracing relies on (docs/internals.md) ----------------------


def test_canary_transformers_asks_is_fake_tensor_through_its_module() -> None:
    """``is_tracing(t)`` looks ``is_fake_tensor`` up in ``transformers.utils.import_utils`` at call
    time (so replacing that one name answers every caller), and the mask code calls that
    ``is_tracing``. If this fails, transformers moved its probe: the count takes the tracing path
    on fakes again (the tests above fail too)."""
    import transformers.masking_utils as masking_utils
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers.utils import import_utils

    assert callable(getattr(import_utils, "is_fake_tensor", None))
    assert callable(getattr(import_utils, "is_jit_tracing", None))
    assert masking_utils.is_tracing is import_utils.is_tracing
    fake = FakeTensorMode().from_tensor(torch.ones(2))
    assert import_utils.is_tracing(fake)  # transformers' own answer for a fake: tracing
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(import_utils, "is_fake_tensor", lambda x: False)
        assert not import_utils.is_tracing(fake)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(import_utils, "is_jit_tracing", lambda: True)
        assert import_utils.is_tracing()


def test_canary_a_fake_with_a_constant_reads_its_value() -> None:
    """FakeValues answers a read of a fake it follows by setting the fake's ``constant`` for the
    read: FakeTensorMode then computes the read on the constant (torch's constant propagation)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake = mode.from_tensor(torch.ones(3, dtype=torch.long))
    assert fake.constant is None
    seven = torch.tensor(7)  # a real tensor: made outside the mode
    with mode:
        total = fake.sum()
        total.constant = seven
        try:
            assert int(total) == 7
        finally:
            total.constant = None


def test_a_read_of_a_known_fake_beside_a_real_tensor_gets_the_true_answer() -> None:
    """``torch.equal(fake, real)``: FakeTensorMode folds a read only when every tensor is a fake with
    a constant, so FakeValues reads such a call on the CPU values itself."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    real = torch.arange(6).reshape(2, 3)
    fake = mode.from_tensor(real, static_shapes=True)
    values = hf_tracing.FakeValues()
    values.seed([fake], [real])
    other = torch.arange(6).reshape(2, 3)
    with mode, values:
        same = torch.equal(fake + 0, other)
        differs = torch.equal(fake * 2, other)
        total = int((fake > 2).sum())
    assert (same, differs, total) == (True, False, 3)  # 3 of 0..5 are above 2
