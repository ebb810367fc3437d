"""Where transformers 5's Trainer writes TensorBoard event files (docs/integrations.md says it):
checked with a real Trainer run, not read from transformers' source."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

pytest.importorskip("accelerate")
pytest.importorskip("tensorboard")
transformers = pytest.importorskip("transformers")

from flopcount.integrations.hf import FlopcountCallback  # noqa: E402


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids).mean(1))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def _collate(items):
    return {"input_ids": torch.stack([i["input_ids"] for i in items]), "labels": torch.tensor([i["labels"] for i in items])}


def _train(output_dir) -> None:
    torch.manual_seed(0)
    data = [{"input_ids": torch.randint(0, 50, (4,)), "labels": n % 3} for n in range(4)]
    args = transformers.TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=2, max_steps=1, logging_steps=1, report_to=["tensorboard"],
        use_cpu=True, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(_Tiny(), args, train_dataset=data, data_collator=_collate,
                                   callbacks=[FlopcountCallback(peak_flops=1e11)])
    trainer.train()


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="transformers 5's layout")
def test_event_files_go_under_output_dir_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    _train(tmp_path / "out")
    found = sorted(tmp_path.rglob("events.out.tfevents.*"))
    assert found
    for event in found:
        relative = event.relative_to(tmp_path / "out")
        assert relative.parts[0] == "runs" and len(relative.parts) == 3
        # <Mon><DD>_<HH>-<MM>-<SS>_<hostname>, as torch's SummaryWriter names its default folder
        assert re.fullmatch(r"[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_.+", relative.parts[1])


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="transformers 5's layout")
def test_tensorboard_logging_dir_environment_variable_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    _train(tmp_path / "out")
    found = sorted(tmp_path.rglob("events.out.tfevents.*"))
    assert found and all(event.parent == tmp_path / "tb" for event in found)
