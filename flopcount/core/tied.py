"""Tied weights a model's config declares but its modules no longer share.

``model.to("meta")`` (and ``copy.deepcopy(...).to("meta")``) replaces each parameter on its
own, so a Hugging Face model whose output embedding is tied to its input embedding comes
back with two separate matrices: a memory estimate of it counts the vocabulary matrix twice
(+33 % on GPT-2). Building the model under ``with torch.device("meta"):`` keeps the tie.

:func:`restore_ties` finds such pairs from the model's own declarations (transformers'
``_tied_weights_keys`` mapping, or ``config.tie_word_embeddings`` with
``get_input_embeddings()`` / ``get_output_embeddings()``) and shares them again on a copy.
Nothing here imports transformers.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from torch import nn

__all__ = ["restore_ties", "text_config"]


def restore_ties(model: nn.Module) -> List[str]:
    """Restore on ``model`` (a copy) the ties it declares but lost: each tied parameter that
    is a different tensor of the same shape than the one it should share is made that very
    parameter again. Returns the note saying so, if any."""
    if not getattr(text_config(getattr(model, "config", None)), "tie_word_embeddings", False):
        return []
    pairs = []
    for target, source in _declared_pairs(model):
        a, b = _parameter(model, target), _parameter(model, source)
        if a is not None and b is not None and a is not b and a.shape == b.shape:
            pairs.append((target, source))
    if not pairs:
        return []
    for target, source in pairs:
        owner_name, _, attr = target.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        setattr(owner, attr, _parameter(model, source))
    listing = ", ".join(f"{target} = {source}" for target, source in pairs)
    return [
        f"the model declares tied weights its modules no longer share ({listing}), as model.to('meta') leaves them; "
        "estimated with the tie restored. Build the model under `with torch.device('meta'):` to keep it"
    ]


def text_config(config: Any) -> Any:
    """A transformers config's text part (``config.get_text_config()``: a multimodal model's
    language model), else ``config`` itself (None stays None)."""
    getter = getattr(config, "get_text_config", None)
    if callable(getter):
        try:
            return getter()
        except Exception:  # a config without a text part
            pass
    return config


def _declared_pairs(model: nn.Module) -> List[Tuple[str, str]]:
    """transformers >= 5: ``_tied_weights_keys = {target: source}`` on each class that ties;
    otherwise the output embedding's weight tied to the input embedding's."""
    pairs: List[Tuple[str, str]] = []
    for prefix, module in model.named_modules():
        keys = getattr(module, "_tied_weights_keys", None)
        if isinstance(keys, dict):
            dot = f"{prefix}." if prefix else ""
            pairs.extend((f"{dot}{target}", f"{dot}{source}") for target, source in keys.items())
    if pairs:
        return pairs
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    out_w, in_w = _embedding_weight(model, "get_output_embeddings"), _embedding_weight(model, "get_input_embeddings")
    if out_w is not None and in_w is not None and id(out_w) in names and id(in_w) in names:
        pairs.append((names[id(out_w)], names[id(in_w)]))
    return pairs


def _embedding_weight(model: nn.Module, getter: str) -> Optional[Any]:
    get = getattr(model, getter, None)
    try:
        module = get() if callable(get) else None
    except Exception:
        return None
    return getattr(module, "weight", None)


def _parameter(model: nn.Module, name: str) -> Optional[nn.Parameter]:
    owner_name, _, attr = name.rpartition(".")
    try:
        owner = model.get_submodule(owner_name) if owner_name else model
    except AttributeError:
        return None
    value = owner._parameters.get(attr) if isinstance(owner, nn.Module) else None
    return value if isinstance(value, nn.Parameter) else None

