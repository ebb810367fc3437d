"""FlopcountCallback in a real Hugging Face Trainer (CPU, a few steps).

Oracles: the exact micro-batches the model received (recorded by the test's own hook),
each counted with ``count_flops(..., backward=True)``, plus the optimizer phase of
``count_flops(..., optimizer=<the trainer's optimizer>)``; the forward MACs checked live
against ``torch.utils.flop_counter.FlopCounterMode`` on the same batch; HF's own
``total_flos`` rewritten to the sum."""

from __future__ import annotations

import warnings
from typing import Any, Dict, List

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

from flopcount import count_flops  # noqa: E402
from flopcount.core.inputs import is_dataless  # noqa: E402
from flopcount.integrations._counting import batch_signature  # noqa: E402
from flopcount.integrations.hf import FlopcountCallback, hf_loss  # noqa: E402

PEAK = 1e11


class Reporter(transformers.TrainerCallback):
    """Stands for TensorBoard/W&B: a reporter listed before the flopcount callback."""

    def __init__(self) -> None:
        self.logs: List[Dict[str, Any]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


def _recording(model: nn.Module) -> Any:
    """The real calls the trainer made (the fake copies' calls are left out)."""
    calls: List[Dict[str, Any]] = []

    def hook(module, args, kwargs):
        if not any(is_dataless(v) for v in kwargs.values() if isinstance(v, torch.Tensor)):
            calls.append({"training": module.training, "kwargs": dict(kwargs)})

    return calls, model.register_forward_pre_hook(hook, with_kwargs=True)


def _args(tmp_path, **extra: Any) -> Any:
    options = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=2, per_device_eval_batch_size=2, gradient_accumulation_steps=2,
        logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    options.update(extra)
    return transformers.TrainingArguments(**options)


def _pad(items: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """Padding to the longest sequence of the batch: the shape changes from batch to batch."""
    n = max(len(i["input_ids"]) for i in items)
    ids = torch.zeros(len(items), n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, item in enumerate(items):
        ids[row, : len(item["input_ids"])] = item["input_ids"]
        mask[row, : len(item["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _train_calls(calls, n_steps, ga=2):
    train = [c["kwargs"] for c in calls if c["training"]]
    assert len(train) == n_steps * ga
    return [train[i * ga : (i + 1) * ga] for i in range(n_steps)]


def _expected_step(model, micro, optimizer) -> int:
    model.train()  # as the trainer ran it (dropout on); an evaluation at the end leaves it in eval mode
    total = sum(count_flops(model, (), kwargs=kw, backward=True, loss_fn=hf_loss).flops for kw in micro)
    step = count_flops(model, (), kwargs=micro[0], backward=True, loss_fn=hf_loss, optimizer=optimizer)
    return total + step.by_phase()["optimizer"]


def _live_forward_flops(model, kwargs) -> int:
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as peer:
            model(**kwargs)
    finally:
        model.train(was)
    return peer.get_total_flops()


def test_gpt2_trainer_logs_the_exact_step_flops(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"  # matmuls FlopCounterMode sees (SDPA on CPU is a silent zero there)
    model = transformers.GPT2LMHeadModel(config)
    lengths = [5, 9, 7, 7, 12, 4, 6, 6]
    data = [{"input_ids": torch.randint(0, 100, (n,))} for n in lengths]
    reporter, callback = Reporter(), FlopcountCallback(peak_flops=PEAK)
    calls, handle = _recording(model)
    trainer = transformers.Trainer(
        model, _args(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=2),
        train_dataset=data, eval_dataset=data[:3], data_collator=_pad, callbacks=[reporter, callback],
    )
    trainer.train()
    handle.remove()

    steps = _train_calls(calls, 2)
    assert [tuple(m[0]["input_ids"].shape) for m in steps] != [tuple(m[1]["input_ids"].shape) for m in steps]  # shapes change
    optimizer = trainer.optimizer.optimizer
    expected = [_expected_step(model, micro, optimizer) for micro in steps]
    logged = [log["flopcount/flops_per_step"] for log in reporter.logs if "flopcount/flops_per_step" in log]
    assert logged == expected  # a reporter listed before the callback received the keys
    assert trainer.state.total_flos == trainer.state.log_history[-1]["total_flos"] == sum(expected)  # the final metrics
    assert [h.get("flopcount/flops_per_step") for h in trainer.state.log_history if "loss" in h] == expected

    train_logs = [log for log in reporter.logs if "flopcount/flops_per_step" in log]
    for log, micro in zip(train_logs, steps):
        tokens = sum(kw["input_ids"].numel() for kw in micro)
        seconds = log["flopcount/flops_per_step"] / (log["flopcount/tflops_per_s"] * 1e12)
        assert log["flopcount/hfu"] == pytest.approx(log["flopcount/tflops_per_s"] * 1e12 / PEAK)
        # MFU: 3 x the micro-batches' forward FLOPs (PaLM's convention) over the same seconds
        forward = sum(count_flops(model, (), kwargs=kw, backward=True, loss_fn=hf_loss).by_phase()["forward"] for kw in micro)
        assert log["flopcount/mfu"] == pytest.approx(3 * forward / seconds / PEAK)
        assert log["flopcount/tokens_per_s"] == pytest.approx(tokens / seconds)

    for micro in steps:  # the forward the callback counted, against torch's counter run live
        for kw in micro:
            assert 2 * callback.counter.train[batch_signature((), kw)].forward_macs == _live_forward_flops(model, kw)

    evals = [c["kwargs"] for c in calls if not c["training"]]
    assert len(evals) == 2  # 3 samples, batches of 2
    model.eval()
    expected_eval = sum(count_flops(model, (), kwargs=kw).flops for kw in evals)
    model.train()
    assert [log["flopcount/eval_flops"] for log in reporter.logs if "eval_loss" in log] == [expected_eval]
    assert not any("flopcount/eval_flops" in log for log in reporter.logs if "loss" in log)  # kept apart

    assert not model._forward_pre_hooks and not model._forward_pre_hooks_with_kwargs  # hook removed at train end


class TinyClassifier(nn.Module):
    """A model the Trainer accepts without transformers' base class (returns a dict with the loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids).mean(1))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def test_vit_trainer_with_a_short_last_batch(tmp_path):
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=64, num_labels=3)
    config._attn_implementation = "eager"
    model = transformers.ViTForImageClassification(config)
    data = [{"pixel_values": torch.randn(3, 16, 16), "labels": i % 3} for i in range(6)]
    reporter, callback = Reporter(), FlopcountCallback(peak_flops=PEAK)
    calls, handle = _recording(model)
    trainer = transformers.Trainer(
        model, _args(tmp_path, max_steps=2, per_device_train_batch_size=2), train_dataset=data[:5], callbacks=[reporter, callback]
    )
    trainer.train()
    handle.remove()
    steps = [[c["kwargs"] for c in calls if c["training"]][:2], [c["kwargs"] for c in calls if c["training"]][2:]]
    assert [kw["pixel_values"].shape[0] for kw in steps[1]] == [1]  # 5 samples: the second step has one batch of 1
    optimizer = trainer.optimizer.optimizer
    expected = [_expected_step(model, micro, optimizer) for micro in steps]
    logs = [log for log in reporter.logs if "flopcount/flops_per_step" in log]
    assert [log["flopcount/flops_per_step"] for log in logs] == expected
    assert trainer.state.total_flos == sum(expected)
    assert all("flopcount/tokens_per_s" not in log and log["flopcount/samples_per_s"] > 0 for log in logs)  # images: no tokens
    kw = steps[0][0]
    assert 2 * callback.counter.train[batch_signature((), kw)].forward_macs == _live_forward_flops(model, kw)


def test_compiled_model_and_log_every(tmp_path):
    torch.manual_seed(0)
    model = TinyClassifier()
    data = [{"input_ids": torch.randint(0, 50, (n,)), "labels": n % 3} for n in (4, 4, 6, 6, 5, 5)]
    reporter, callback = Reporter(), FlopcountCallback(peak_flops=PEAK, log_every=1)
    calls, handle = _recording(model)
    args = _args(tmp_path, max_steps=3, logging_steps=100, gradient_accumulation_steps=1, torch_compile=True,
                 torch_compile_backend="eager", per_device_train_batch_size=2)
    trainer = transformers.Trainer(model, args, train_dataset=data, data_collator=_stack, callbacks=[reporter, callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    handle.remove()
    assert type(trainer.model_wrapped).__name__ == "OptimizedModule"  # the steps ran compiled
    steps = _train_calls(calls, 3, ga=1)
    optimizer = trainer.optimizer.optimizer
    expected = [_expected_step(model, micro, optimizer) for micro in steps]
    assert [log["flopcount/flops_per_step"] for log in reporter.logs if "flopcount/flops_per_step" in log] == expected  # every step
    assert trainer.state.total_flos == sum(expected)  # HF's estimate for a model without num_parameters is 0
    assert not model._forward_pre_hooks_with_kwargs


def _stack(items):
    n = max(len(i["input_ids"]) for i in items)
    ids = torch.stack([nn.functional.pad(i["input_ids"], (0, n - len(i["input_ids"]))) for i in items])
    return {"input_ids": ids, "labels": torch.tensor([i["labels"] for i in items])}


def test_the_real_tensorboard_reporter_receives_the_keys(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    torch.manual_seed(0)
    model = TinyClassifier()
    data = [{"input_ids": torch.randint(0, 50, (n,)), "labels": n % 3} for n in (4, 6, 5, 5)]
    callback = FlopcountCallback(peak_flops=PEAK)
    calls, handle = _recording(model)
    args = _args(tmp_path / "out", max_steps=2, gradient_accumulation_steps=1, report_to=["tensorboard"])
    args.logging_dir = str(tmp_path / "tb")  # where the Trainer's TensorBoardCallback writes
    trainer = transformers.Trainer(model, args, train_dataset=data, data_collator=_stack, callbacks=[callback])
    trainer.train()
    handle.remove()
    order = [type(c).__name__ for c in trainer.callback_handler.callbacks]
    assert order.index("FlopcountCallback") < order.index("TensorBoardCallback")  # moved ahead of the reporter
    expected = [_expected_step(model, micro, trainer.optimizer.optimizer) for micro in _train_calls(calls, 2, ga=1)]
    (run,) = {p.parent for p in tmp_path.rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    logged = [e.value for e in events.Scalars("train/flopcount/flops_per_step")]
    assert logged == pytest.approx(expected, rel=1e-6)  # TensorBoard stores float32
    assert "train/flopcount/mfu" in events.Tags()["scalars"]


class FailsOnSecondCall(TinyClassifier):
    def __init__(self) -> None:
        super().__init__()
        self.real_calls = 0

    def forward(self, input_ids, labels=None):
        if not is_dataless(input_ids):
            self.real_calls += 1
            if self.real_calls == 2:
                raise RuntimeError("data error in batch 2")
        return super().forward(input_ids, labels)


def test_remove_after_a_failed_train_leaves_the_model_as_found(tmp_path):
    torch.manual_seed(0)
    model = FailsOnSecondCall()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attributes = set(vars(model))
    callback = FlopcountCallback(peak_flops=PEAK)
    data = [{"input_ids": torch.randint(0, 50, (4,)), "labels": 0} for _ in range(4)]
    trainer = transformers.Trainer(model, _args(tmp_path, max_steps=2, gradient_accumulation_steps=1, learning_rate=0.0),
                                   train_dataset=data, data_collator=_stack, callbacks=[callback])
    with pytest.raises(RuntimeError, match="data error"):
        trainer.train()
    # issue #29 item 9: the forward raised, so the hooks went with the exception (HF calls no callback)
    assert not model._forward_pre_hooks and not model._forward_pre_hooks_with_kwargs
    assert not model._forward_hooks and not model._forward_hooks_always_called
    assert callback._calls == [] and callback._eval_calls == []  # no inputs kept
    callback.remove()  # still fine to call
    assert set(vars(model)) - {"_is_accelerate_prepared"} == attributes  # (that one is accelerate's mark)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # lr 0: nothing learnt either


def _logged(reporter: Reporter) -> List[float]:
    return [log["flopcount/flops_per_step"] for log in reporter.logs if "flopcount/flops_per_step" in log]


def test_a_callback_reused_by_a_second_trainer_and_a_second_train_logs_again(tmp_path):
    """Issue #29 item 8: the same callback, two Trainers and a second train(), the same batch
    shapes each time. Oracle: each run's micro-batches counted with count_flops against that
    run's own optimizer; total_flos must be that sum in every run (HF's 6N figure replaced)."""
    torch.manual_seed(0)
    data = [{"input_ids": torch.randint(0, 50, (4,)), "labels": i % 3} for i in range(4)]
    callback = FlopcountCallback(peak_flops=PEAK)
    runs = []
    first, second = TinyClassifier(), TinyClassifier()
    for index, model in enumerate([first, second, second]):
        if index < 2:
            reporter = Reporter()
            trainer = transformers.Trainer(model, _args(tmp_path / str(index), max_steps=2, gradient_accumulation_steps=1),
                                           train_dataset=data, data_collator=_stack, callbacks=[reporter, callback])
        reporter.logs.clear()
        calls, handle = _recording(model)
        trainer.train()
        handle.remove()
        expected = [_expected_step(model, micro, trainer.optimizer.optimizer) for micro in _train_calls(calls, 2, ga=1)]
        runs.append((_logged(reporter), expected, trainer.state.total_flos))
    for logged, expected, total in runs:
        assert logged == expected
        assert total == sum(expected)


def test_a_failed_train_leaves_no_recording_hook_behind(tmp_path):
    """Issue #29 item 9: train() raises mid-run (HF calls no callback); the user's later
    forwards must neither be recorded nor keep inputs, and the hook must go."""
    torch.manual_seed(0)
    model = FailsOnSecondCall()
    callback = FlopcountCallback(peak_flops=PEAK)
    data = [{"input_ids": torch.randint(0, 50, (4,)), "labels": 0} for _ in range(4)]
    trainer = transformers.Trainer(model, _args(tmp_path, max_steps=3, gradient_accumulation_steps=1),
                                   train_dataset=data, data_collator=_stack, callbacks=[callback])
    with pytest.raises(RuntimeError, match="data error"):
        trainer.train()
    model.eval()
    with torch.no_grad():
        for n in range(5, 9):  # the user's own inference afterwards, a new shape each time
            model(torch.randint(0, 50, (2, n)), torch.zeros(2, dtype=torch.long))
    assert callback._calls == [] and callback._eval_calls == []  # nothing recorded, no inputs kept
    assert not model._forward_pre_hooks and not model._forward_pre_hooks_with_kwargs


class Observed(TinyClassifier):
    """A user's model carrying its own forward hooks, which count what they see."""

    def __init__(self, real_run: bool = False) -> None:
        super().__init__()
        self.real_run = real_run
        self.seen: List[str] = []
        self.head.register_forward_hook(lambda m, a, o: self.seen.append("fake" if is_dataless(o) else "real"))
        self.register_forward_pre_hook(lambda m, a: self.seen.append("pre"))

    def forward(self, input_ids, labels=None):
        if self.real_run and is_dataless(input_ids):
            raise RuntimeError("needs data")  # stands for a data-dependent forward: auto falls back to one real run
        return super().forward(input_ids, labels)


@pytest.mark.parametrize("real_run", [False, True], ids=["fake", "real-fallback"])
def test_counting_does_not_replay_the_users_hooks(tmp_path, real_run):
    """Issue #29 item 10. Oracle: the trainer's own forwards, two steps of one micro-batch
    each: the user's head hook sees exactly 2 real outputs, the pre-hook 2 calls."""
    torch.manual_seed(0)
    model = Observed(real_run)
    data = [{"input_ids": torch.randint(0, 50, (4,)), "labels": 0} for _ in range(4)]
    reporter, callback = Reporter(), FlopcountCallback(peak_flops=PEAK)
    trainer = transformers.Trainer(model, _args(tmp_path, max_steps=2, gradient_accumulation_steps=1),
                                   train_dataset=data, data_collator=_stack, callbacks=[reporter, callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert model.seen == ["pre", "real"] * 2
    assert len(_logged(reporter)) == 2  # and the steps were counted


def test_no_mfu_on_cpu_unless_a_peak_is_given(tmp_path):
    """Issue #29 item 11: the docstring's promise (no MFU on CPU without peak_flops=) kept."""
    from flopcount.errors import FlopcountWarning

    torch.manual_seed(0)
    model = TinyClassifier()
    data = [{"input_ids": torch.randint(0, 50, (4,)), "labels": 0} for _ in range(2)]
    reporter, callback = Reporter(), FlopcountCallback()
    trainer = transformers.Trainer(model, _args(tmp_path, max_steps=1, gradient_accumulation_steps=1),
                                   train_dataset=data, data_collator=_stack, callbacks=[reporter, callback])
    with pytest.warns(FlopcountWarning, match="no MFU on CPU unless peak_flops="):
        trainer.train()
    logs = [log for log in reporter.logs if "flopcount/flops_per_step" in log]
    assert logs and all("flopcount/mfu" not in log and "flopcount/tflops_per_s" in log for log in logs)


def test_a_second_train_after_a_failed_one_logs_the_exact_flops(tmp_path):
    """Issue #29 item 9: right after train() raised in a step's forward the model carries no
    flopcount hook; the same callback in a second train() then logs each step exactly.
    Oracle: the second run's micro-batches counted with count_flops (as in the tests above)."""
    torch.manual_seed(0)
    model = FailsOnSecondCall()
    callback = FlopcountCallback(peak_flops=PEAK)
    reporter = Reporter()
    data = [{"input_ids": torch.randint(0, 50, (4,)), "labels": i % 3} for i in range(4)]
    trainer = transformers.Trainer(model, _args(tmp_path, max_steps=2, gradient_accumulation_steps=1),
                                   train_dataset=data, data_collator=_stack, callbacks=[reporter, callback])
    with pytest.raises(RuntimeError, match="data error"):
        trainer.train()
    assert not model._forward_pre_hooks_with_kwargs and not model._forward_hooks
    reporter.logs.clear()
    calls, handle = _recording(model)
    trainer.train()  # real_calls is past 2 now: no more failures
    handle.remove()
    expected = [_expected_step(model, micro, trainer.optimizer.optimizer) for micro in _train_calls(calls, 2, ga=1)]
    assert _logged(reporter) == expected
    assert not model._forward_pre_hooks_with_kwargs and not model._forward_hooks


class _NoMutationWhileIterating(list):
    """A callback list that fails the test when it is changed while being iterated."""

    iterating = 0

    def __iter__(self):
        self.iterating += 1
        try:
            yield from super().__iter__()
        finally:
            self.iterating -= 1

    def _guard(self, name):
        if self.iterating:
            raise AssertionError(f"the callback list was mutated ({name}) while the handler iterated it")

    def remove(self, item):
        self._guard("remove")
        super().remove(item)

    def insert(self, index, item):
        self._guard("insert")
        super().insert(index, item)

    def append(self, item):
        self._guard("append")
        super().append(item)


class _Counts(transformers.TrainerCallback):
    def __init__(self) -> None:
        self.begins = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.begins += 1


def test_the_callback_list_is_not_mutated_while_the_trainer_iterates_it(tmp_path):
    """Issue #27 item 5: moving ahead of the reporters must not change the list the
    CallbackHandler is iterating (on_train_begin); the reporter listed before the callback
    still receives the keys, and every callback gets on_train_begin exactly once."""
    torch.manual_seed(0)
    model = TinyClassifier()
    reporter, before, after = Reporter(), _Counts(), _Counts()
    data = [{"input_ids": torch.randint(0, 50, (4,)), "labels": i % 3} for i in range(4)]
    callback = FlopcountCallback(peak_flops=PEAK)
    trainer = transformers.Trainer(model, _args(tmp_path, max_steps=2, gradient_accumulation_steps=1),
                                   train_dataset=data, data_collator=_stack, callbacks=[reporter, before, callback, after])
    handler = trainer.callback_handler
    handler.callbacks = _NoMutationWhileIterating(handler.callbacks)
    calls, handle = _recording(model)
    trainer.train()
    handle.remove()
    assert before.begins == 1 and after.begins == 1
    order = handler.callbacks
    assert order.index(callback) < order.index(reporter)  # ahead of the reporter from the second event on
    expected = [_expected_step(model, micro, trainer.optimizer.optimizer) for micro in _train_calls(calls, 2, ga=1)]
    assert _logged(reporter) == expected
