"""FlopcountCallback's hooks leave the model on every exit path of a real ``Trainer.train()``
(issue #29 item 9).

HF calls no callback when ``train()`` raises. Before, only a failure inside the forward removed
the callback's hooks at once; a failure in the loss, the backward, the optimizer step or the
data left the recording hook on the model until its next forward. Oracle: the model's own hook
dictionaries read before the Trainer is made, and the callback's record of calls (a later
forward of a new shape must add nothing and keep no input)."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch
from torch import nn

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

from _training_failures import Boom, StepFails, module_hooks, raise_in_backward  # noqa: E402

from flopcount.core.inputs import is_dataless  # noqa: E402
from flopcount.integrations.hf import FlopcountCallback  # noqa: E402

PEAK = 1e11
class Tiny(nn.Module):
    """Embedding(50, 16) -> mean -> Linear(16, 3), loss in the output dict (as HF models). With
    ``fail="backward"`` the loss's backward raises at the second real step."""

    def __init__(self, fail: str = "") -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 3)
        self.fail = fail
        self.real_calls = 0
        self.register_forward_hook(lambda m, a, o: None)  # a hook of the user's own, which must stay

    def forward(self, input_ids: torch.Tensor, labels: Any = None) -> Dict[str, torch.Tensor]:
        logits = self.head(self.embed(input_ids).mean(1))
        loss = nn.functional.cross_entropy(logits, labels)
        if not is_dataless(input_ids):
            self.real_calls += 1
            if self.fail == "backward" and self.real_calls == 2:
                loss.register_hook(raise_in_backward)
        return {"loss": loss, "logits": logits}




class LossFails(transformers.Trainer):
    calls = 0

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        LossFails.calls += 1
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        if LossFails.calls == 2:
            raise Boom("loss failed")
        return loss


def _stack(items: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
    return {"input_ids": torch.stack([i["input_ids"] for i in items]), "labels": torch.tensor([i["labels"] for i in items])}


class _DataFails:
    calls = 0

    def __call__(self, items: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
        _DataFails.calls += 1
        if _DataFails.calls == 2:
            raise Boom("collate failed")
        return _stack(items)


def _args(tmp_path: Any) -> Any:
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=3, logging_steps=1, report_to=[],
        use_cpu=True, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )  # fmt: skip


def _trainer(where: str, model: nn.Module, callback: FlopcountCallback, tmp_path: Any, attach: str) -> Any:
    LossFails.calls, StepFails.real_steps, _DataFails.calls = 0, 0, 0
    data = [{"input_ids": torch.randint(0, 50, (4,)), "labels": i % 3} for i in range(8)]
    cls = LossFails if where == "loss" else transformers.Trainer
    options: Dict[str, Any] = {"train_dataset": data, "data_collator": _DataFails() if where == "data" else _stack}
    if where == "optimizer":
        options["optimizers"] = (StepFails(model.parameters(), lr=0.1), None)
    if attach == "init":
        options["callbacks"] = [callback]
    trainer = cls(model, _args(tmp_path), **options)
    if attach == "add_callback":
        trainer.add_callback(callback)
    return trainer


@pytest.mark.parametrize("where", ["loss", "backward", "optimizer", "data"])
def test_a_train_that_raises_leaves_the_model_its_own_hooks(tmp_path: Any, where: str) -> None:
    torch.manual_seed(0)
    model = Tiny("backward" if where == "backward" else "")
    before = module_hooks(model)
    callback = FlopcountCallback(peak_flops=PEAK)
    trainer = _trainer(where, model, callback, tmp_path, attach="init")
    with pytest.raises(Boom):
        trainer.train()
    assert module_hooks(model) == before  # at once: no forward needed to find out
    assert callback._calls == [] and callback._eval_calls == []  # no inputs kept
    model.eval()
    with torch.no_grad():
        for n in (5, 6, 7):  # the user's own forwards afterwards, a new shape each time
            model(torch.randint(0, 50, (2, n)), torch.zeros(2, dtype=torch.long))
    assert callback._calls == [] and callback._eval_calls == []  # recorded nothing
    assert module_hooks(model) == before


def test_a_callback_added_after_the_trainer_was_made_guards_the_later_runs(tmp_path: Any) -> None:
    # add_callback: the callback first hears of the Trainer inside train(), and guards the runs after it
    torch.manual_seed(0)
    model = Tiny()
    before = module_hooks(model)
    callback = FlopcountCallback(peak_flops=PEAK)
    trainer = _trainer("optimizer", model, callback, tmp_path, attach="add_callback")
    StepFails.real_steps = -10  # the first run's steps all pass
    trainer.train()
    assert module_hooks(model) == before
    StepFails.real_steps = 0
    with pytest.raises(Boom):
        trainer.train()
    assert module_hooks(model) == before and callback._calls == []


def test_the_guard_goes_when_the_trainer_has_no_flopcount_callback_left(tmp_path: Any) -> None:
    torch.manual_seed(0)
    model = Tiny()
    callback = FlopcountCallback(peak_flops=PEAK)
    trainer = _trainer("", model, callback, tmp_path, attach="init")
    assert "train" in vars(trainer)  # the guard, an instance attribute
    trainer.remove_callback(FlopcountCallback)
    trainer.train()
    assert "train" not in vars(trainer) and trainer.train.__func__ is transformers.Trainer.train
