"""Real architectures built from code (no downloads), shipped with flopcount so the quick
start and ``flopcount count example:NAME`` work from anywhere after ``pip install``.

Importing this package imports no torch: :data:`CATALOG` is plain data, the models live in
``flopcount.examples.resnet``, ``.mobilenet``, ``.vit`` and ``.hf`` (the last needs the
optional ``transformers`` package, imported only when a model is built)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple


@dataclass(frozen=True)
class Example:
    """One ``example:NAME`` entry: where its factory lives and the input it is made for.

    ``input_spec`` is CLI SPEC text (``1x3x224x224``, ``1x128:int64``)."""

    name: str
    module: str
    attr: str
    input_spec: str
    description: str
    needs: Tuple[str, ...] = ()


_EXAMPLES = (
    Example("resnet18", "resnet", "resnet18", "1x3x224x224", "ResNet-18 (He et al., 2015), torchvision's shapes"),
    Example("resnet50", "resnet", "resnet50", "1x3x224x224", "ResNet-50 (He et al., 2015), torchvision's shapes"),
    Example("mobilenet_v2", "mobilenet", "mobilenet_v2", "1x3x224x224", "MobileNetV2 (Sandler et al., 2018)"),
    Example("vit_b_16", "vit", "vit_b_16", "1x3x224x224", "ViT-B/16 (Dosovitskiy et al., 2020)"),
    Example("vit_tiny", "vit", "vit_tiny", "2x3x32x32", "a 2-layer ViT on 32x32 images (fast, for tests)"),
    Example("gpt2", "hf", "gpt2", "1x128:int64", "GPT-2 small from GPT2Config", ("transformers",)),
    Example("bert", "hf", "bert", "1x128:int64", "BERT-base from BertConfig", ("transformers",)),
    Example("llama", "hf", "llama", "1x128:int64", "a 2-layer LLaMA-style decoder (GQA, RoPE, SwiGLU)", ("transformers",)),
)

#: ``example:NAME`` -> :class:`Example`
CATALOG: Dict[str, Example] = {e.name: e for e in _EXAMPLES}

__all__ = ["CATALOG", "Example"]
