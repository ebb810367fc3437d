"""``core.tied``: a tie the model's config declares (on its text part, for a multimodal config)
restored on a copy; ``text_config`` as the readers of a transformers config share it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from flopcount.core.tied import restore_ties, text_config


class _Composite:
    """A multimodal config: ``tie_word_embeddings`` only on its text part."""

    def get_text_config(self) -> Any:
        return SimpleNamespace(tie_word_embeddings=True)


class _Broken:
    """A config whose ``get_text_config`` raises (no text part)."""

    tie_word_embeddings = True

    def get_text_config(self) -> Any:
        raise ValueError("no text part")


class _LM(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(16, 4)
        self.head = nn.Linear(4, 16, bias=False)  # its own (16, 4) weight: the tie is lost

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.head


def test_text_config_reads_the_text_part_else_the_config() -> None:
    composite, broken, plain = _Composite(), _Broken(), SimpleNamespace(tie_word_embeddings=False)
    assert text_config(composite).tie_word_embeddings is True
    assert text_config(broken) is broken  # its getter raised: the config itself
    assert text_config(plain) is plain and text_config(None) is None


def test_a_tie_declared_on_the_text_part_is_restored() -> None:
    for config in (_Composite(), _Broken()):
        model = _LM(config)
        assert model.head.weight is not model.embed.weight
        notes = restore_ties(model)
        assert model.head.weight is model.embed.weight
        assert len(notes) == 1 and "head.weight = embed.weight" in notes[0]
        assert restore_ties(model) == []  # tied now: nothing to restore
    untied = _LM(SimpleNamespace(tie_word_embeddings=False))
    assert restore_ties(untied) == [] and untied.head.weight is not untied.embed.weight
    assert isinstance(untied.head.weight, torch.nn.Parameter)
