"""Turning the CLI's ENTRY into a model (and maybe example inputs).

ENTRY forms:

* ``package.module:attr`` or ``path/to/file.py:attr`` — ``attr`` (dotted names allowed)
  is an ``nn.Module``, or a callable (a factory or a Module class) returning an
  ``nn.Module``, a ``(module, example_inputs)`` pair or a ``(module, inputs, kwargs)``
  triple; ``config`` entries are passed to the callable as keyword arguments.
* ``hf:MODEL_TYPE`` — a transformers model built from its default config
  (``AutoConfig.for_model``) with ``config`` overrides; random weights, no download.
* ``tv:NAME`` (or ``torchvision:NAME``) — ``torchvision.models.get_model(NAME, weights=None)``.
* ``example:NAME`` — an architecture shipped in :mod:`flopcount.examples` (``resnet50``,
  ``mobilenet_v2``, ``vit_b_16``, ...), with its usual input when none is given.
* a saved artifact (:mod:`flopcount.cli.artifacts`): ``model.pt2`` (``torch.export``, on its
  own example input shapes), a TorchScript file (needs ``--input``), ``hf:./folder`` or
  ``hf:path/config.json`` (a local Hugging Face config, random weights).

Every failure is a :class:`~flopcount.errors.UsageError` naming the ENTRY and what is
wrong, chained to the cause.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn

from flopcount.cli.artifacts import hub_hint, is_local_hf, load_artifact, local_hf_config, looks_like_artifact
from flopcount.cli.deadline import CommandTimeout
from flopcount.cli.output import describe, slash_hint
from flopcount.cli.parser import pairs_once
from flopcount.cli.specs import InputSpec, LoadedEntry, config_with, parse_spec
from flopcount.core.dtypes import parse_dtype
from flopcount.core.inputs import flatten_tensors
from flopcount.errors import UsageError, close_names, did_you_mean
from flopcount.examples import CATALOG

ENTRY_HELP = (
    "ENTRY is package.module:attr, path/to/file.py:attr, hf:MODEL_TYPE, hf:./folder, tv:NAME, example:NAME, "
    "model.pt2 (torch.export) or a TorchScript file"
)
HF_PREFIXES = ("hf:", "transformers:")
TV_PREFIXES = ("tv:", "torchvision:")
EXAMPLE_PREFIXES = ("example:",)


def meta_builder(
    args: Any, dtype: Optional[str], graph_device: Optional[str] = None, *, generating: bool = False
) -> Callable[[], nn.Module]:
    """Builds the model ``args.entry`` names (with ``--config``) on the meta device, cast to ``dtype``
    when given: ``plan`` (once per rank) and ``serve`` (``generating``: an ``hf:`` name builds the class
    generate() runs). Bad ``--config`` or ``--dtype``: said at once."""
    config = pairs_once(args.config, "--config")
    cast = parse_dtype(dtype, "--dtype") if dtype else None

    def build() -> nn.Module:
        model = load_entry(args.entry, device="meta", config=config, graph_device=graph_device, generating=generating).model
        return model.to(cast) if cast is not None else model

    return build


def load_entry(
    entry: str,
    *,
    device: str = "cpu",
    config: Optional[Mapping[str, Any]] = None,
    graph_device: Optional[str] = None,
    generating: bool = False,
) -> LoadedEntry:
    """Import or build the model ENTRY names, in eval mode, on ``device``.

    ``device="meta"`` builds factories under ``torch.device("meta")`` (no memory, no
    data: shapes only); ``"cuda"`` builds on the CPU and moves the model. ``graph_device``:
    where an exported program's graph runs, when not ``device`` (``plan``: cpu). ``generating``
    (``serve``, ``count --generate``): an ``hf:`` name builds the class generate() runs, with its
    language-model head (:func:`_hf_generator`), where count's class for the type has none."""
    text = entry.strip()
    overrides = dict(config or {})
    if not text:
        raise UsageError(f"empty ENTRY; {ENTRY_HELP}")
    load_hf: Callable[[str, str, Dict[str, Any], str], LoadedEntry] = functools.partial(_load_hf, generating=generating)
    zoos = ((HF_PREFIXES, load_hf), (TV_PREFIXES, _load_torchvision), (EXAMPLE_PREFIXES, _load_example))
    zoo = next(((prefix, load) for prefixes, load in zoos for prefix in prefixes if text.lower().startswith(prefix)), None)
    if zoo is not None:
        loaded = zoo[1](entry, text[len(zoo[0]):].strip(), overrides, device)
    elif looks_like_artifact(text):
        if overrides:
            raise UsageError(f"--config needs a factory or an hf: config, but {entry} is a saved model file")
        loaded = load_artifact(text, device, graph_device)
    else:
        loaded = _from_object(entry, _import_target(text), overrides, device)
    if device != "meta" and device != "cpu":
        loaded.model = loaded.model.to(device)
    loaded.inputs, loaded.kwargs = _inputs_to(loaded.inputs, loaded.kwargs, device)
    loaded.model.eval()
    return loaded


# --------------------------------------------------------------------------- module:attr


def _import_target(text: str) -> Any:
    module_part, sep, attr = text.rpartition(":")
    drive = len(module_part) == 1 and module_part.isalpha() and attr[:1] in ("\\", "/")  # C:\models\m.py, no attr
    if not sep or not module_part or drive:
        hint = f" (did you mean {text}:ATTR?)" if text.endswith(".py") or "/" in text or "\\" in text else ""
        raise UsageError(f"bad ENTRY {text!r}: no ':attr' part{hint}; {ENTRY_HELP}")
    if not attr or not all(part.isidentifier() for part in attr.split(".")):
        raise UsageError(f"bad ENTRY {text!r}: {attr!r} is not an attribute name; {ENTRY_HELP}")
    is_path = module_part.endswith(".py") or "/" in module_part or os.sep in module_part
    module = _import_file(module_part) if is_path else _import_module(module_part)
    obj: Any = module
    walked: List[str] = []
    for part in attr.split("."):
        if not hasattr(obj, part):
            where = f"{module_part}:{'.'.join(walked)}" if walked else module_part
            hint = did_you_mean(part, [n for n in dir(obj) if not n.startswith("_")])
            raise UsageError(f"bad ENTRY {text!r}: {where} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
        walked.append(part)
    return obj


def _import_file(path_text: str) -> Any:
    path = Path(path_text).expanduser()
    if not path.exists():
        raise UsageError(f"bad ENTRY: file not found: {path_text}{slash_hint(path_text)}")
    if not path.is_file():
        raise UsageError(f"bad ENTRY: {path_text} is not a file")
    if path.suffix != ".py":
        raise UsageError(f"bad ENTRY: {path_text} is not a .py file")
    path = path.resolve()
    name = "_flopcount_entry_" + "".join(c if c.isalnum() else "_" for c in path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"bad ENTRY: cannot import {path_text}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    # the file's own folder first, so it can import its siblings
    with _on_sys_path(str(path.parent)), _as_usage_error(f"bad ENTRY: importing {path_text} failed", lambda: sys.modules.pop(name, None)):
        # compiled from the source itself, not through the import system's bytecode cache: a file
        # edited within the same second at the same size read the stale __pycache__ entry (and
        # the user's folder gets no __pycache__ of ours)
        code = compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        exec(code, module.__dict__)
    return module


def _import_module(name: str) -> Any:
    # `python -m` puts the working directory on sys.path; the console script does not
    with _on_sys_path(os.getcwd()):
        try:
            with _as_usage_error(f"bad ENTRY: importing {name!r} failed"):
                return importlib.import_module(name)
        except UsageError as exc:  # the module itself missing: said plainly
            missing = exc.__cause__.name if isinstance(exc.__cause__, ModuleNotFoundError) else None
            if missing and (name == missing or name.startswith(missing + ".")):
                raise UsageError(f"bad ENTRY: no module named {missing!r} (looked on sys.path and in {os.getcwd()})") from exc.__cause__
            raise


@contextlib.contextmanager
def _as_usage_error(what: str, undo: Callable[[], Any] = lambda: None) -> Iterator[None]:
    """Any failure inside (an import, a factory: the user's code) as ``UsageError("what: ...")``
    after ``undo()``; an interrupt or ``--timeout`` passes through."""
    try:
        yield
    except BaseException as exc:
        undo()
        if isinstance(exc, (KeyboardInterrupt, CommandTimeout)):
            raise
        raise UsageError(f"{what}: {describe(exc)}") from exc


@contextlib.contextmanager
def _on_sys_path(folder: str) -> Iterator[None]:
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


def _from_object(entry: str, obj: Any, overrides: Dict[str, Any], device: str) -> LoadedEntry:
    if isinstance(obj, nn.Module):
        if overrides:
            raise UsageError(f"--config needs a factory, but {entry} is an nn.Module instance")
        return LoadedEntry(entry, obj.to("meta") if device == "meta" else obj)
    if not callable(obj):
        raise UsageError(
            f"bad ENTRY {entry!r}: it is an object of type {type(obj).__name__}, not an nn.Module or a callable returning one"
        )
    _check_callable(entry, obj, overrides)
    with _build_device(device), _as_usage_error(f"model construction failed: {entry} raised"):
        made = obj(**overrides)
    return _unpack(entry, made)


def _check_callable(entry: str, obj: Any, overrides: Dict[str, Any]) -> None:
    """Fail before running anything when the factory cannot take the call."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(**overrides)
    except TypeError as exc:
        raise UsageError(f"model construction failed: cannot call {entry}{signature} with {overrides or 'no arguments'}: {exc}") from exc


def _unpack(entry: str, made: Any) -> LoadedEntry:
    if isinstance(made, nn.Module):
        return LoadedEntry(entry, made)
    if isinstance(made, (tuple, list)) and len(made) in (2, 3) and isinstance(made[0], nn.Module):
        kwargs = made[2] if len(made) == 3 else None
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise UsageError(f"bad ENTRY {entry!r}: the third item it returned must be a dict of kwargs, got {type(kwargs).__name__}")
        return LoadedEntry(entry, made[0], inputs=made[1], kwargs=dict(kwargs) if kwargs is not None else None)
    raise UsageError(
        f"bad ENTRY {entry!r}: it returned an object of type {type(made).__name__}; expected an nn.Module, "
        "(module, example_inputs) or (module, example_inputs, kwargs)"
    )


def _build_device(device: str) -> ContextManager[Any]:
    """Where a factory builds the model: under ``torch.device("meta")`` for ``--device meta``."""
    return torch.device("meta") if device == "meta" else contextlib.nullcontext()


def _inputs_to(inputs: Any, kwargs: Optional[Dict[str, Any]], device: str) -> Tuple[Any, Optional[Dict[str, Any]]]:
    if inputs is None and kwargs is None:
        return inputs, kwargs
    tensors, rebuild = flatten_tensors((inputs, kwargs))
    if all(t.device.type == torch.device(device).type for t in tensors):
        return inputs, kwargs
    return rebuild([torch.empty_like(t, device="meta") if device == "meta" else t.to(device) for t in tensors])


# --------------------------------------------------------------------------- model zoos


def _load_hf(entry: str, model_type: str, overrides: Dict[str, Any], device: str, *, generating: bool = False) -> LoadedEntry:
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"{entry} needs the transformers package: pip install transformers") from exc
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if is_local_hf(model_type):
        config, architecture = local_hf_config(entry, model_type, overrides)
        return _hf_model(entry, config, str(config.model_type), overrides, device, architecture, generating)
    if model_type not in CONFIG_MAPPING_NAMES:
        # model types only (transformers 5.24's table also holds a class name, EvollaModel, which
        # "did you mean" offered for any word ending in "model")
        types = [name for name in CONFIG_MAPPING_NAMES if name == name.lower()]
        hub = hub_hint(model_type, types)  # it names the local-folder remedy itself
        hint = hub or f"{did_you_mean(model_type, types)} (a local folder or config.json is hf:./PATH)"
        raise UsageError(f"bad ENTRY {entry!r}: {model_type!r} is not a transformers model_type{hint}")
    with _as_usage_error(f"model construction failed: the default config of {entry}"):
        config = AutoConfig.for_model(model_type)
    config = config_with(config, overrides, lambda **values: AutoConfig.for_model(model_type, **values))
    return _hf_model(entry, config, model_type, overrides, device, None, generating)


def _hf_model(
    entry: str, config: Any, model_type: str, overrides: Dict[str, Any], device: str, architecture: Optional[str], generating: bool
) -> LoadedEntry:
    """The model for ``config`` with random weights: the class its ``architectures`` names
    (a local checkpoint's config says what shipped), else one chosen by model type; ``generating``:
    one generate() can run where those have no language-model head (:func:`_hf_generator`)."""
    import transformers
    from transformers.models.auto import modeling_auto as names

    if "use_cache" not in overrides and hasattr(config, "use_cache"):
        config.use_cache = False  # one forward; a KV cache is only extra outputs
    # encoder-decoders are built whole (their causal-LM class is the decoder alone); decoders
    # get their LM head; encoders (also listed as masked LMs) the bare model
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    causal = model_type in names.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in names.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    named = getattr(transformers, architecture, None) if architecture else None
    if generating and isinstance(named, type) and not _can_generate(named):
        named = None  # a config.json naming a base model (Qwen2VLModel): generate() runs the class with the head
    generator = _hf_generator(model_type) if generating and not seq2seq and not causal else None
    if isinstance(named, type) and issubclass(named, nn.Module):
        build: Callable[[Any], Any] = named
    elif generator is not None:
        build = generator.from_config
    elif seq2seq and model_type in names.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES:
        build = transformers.AutoModelForSpeechSeq2Seq.from_config
    elif seq2seq and model_type in names.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        build = transformers.AutoModelForSeq2SeqLM.from_config
    else:
        build = (transformers.AutoModelForCausalLM if causal and not seq2seq else transformers.AutoModel).from_config
    with _build_device(device), _as_usage_error(f"model construction failed: {entry}"):
        model = build(config)
    default_kwargs: Dict[str, InputSpec] = {}
    if seq2seq:
        # the decoder's tokens; generate() would start from one, a forward counts a whole target
        limit = getattr(config, "max_target_positions", None) or getattr(config, "max_position_embeddings", None)
        default_kwargs["decoder_input_ids"] = InputSpec((1, _text_length(limit)), torch.int64)
    # a text-and-image dual encoder (CLIP, SigLIP, OWL-ViT) compares images with texts: it needs both
    # (a vision-language decoder such as LLaVA runs on text alone; images need their tokens in the text)
    dual = model_type in names.MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES or model_type in names.MODEL_FOR_ZERO_SHOT_OBJECT_DETECTION_MAPPING_NAMES
    if dual and getattr(model, "main_input_name", "input_ids") == "input_ids" and _takes(model, "pixel_values"):
        default_kwargs["pixel_values"] = _image_spec(getattr(config, "vision_config", config))
    return LoadedEntry(entry, model, default_specs=_hf_default_specs(model, config), default_kwargs=default_kwargs)


def _hf_generator(model_type: str) -> Optional[Any]:
    """The auto class whose mapping gives ``model_type`` a class generate() runs on a text prompt,
    where it is no causal LM (a vision-language decoder: Qwen2-VL, LLaVA, PaliGemma -> their
    ...ForConditionalGeneration; an audio-text one: Qwen2-Audio), or None. Looked up by name:
    older transformers lack some of these tables."""
    import transformers
    from transformers.models.auto import modeling_auto as names

    for table, auto in (("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "AutoModelForImageTextToText"),
                        ("MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES", "AutoModelForMultimodalLM"),
                        ("MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES", "AutoModelForVision2Seq")):
        if model_type in getattr(names, table, {}) and hasattr(transformers, auto):
            return getattr(transformers, auto)
    return None


def _can_generate(cls: type) -> bool:
    """Whether transformers says generate() runs on ``cls`` (its ``can_generate()``)."""
    check = getattr(cls, "can_generate", None)
    try:
        return bool(check()) if callable(check) else False
    except Exception:  # a class's own check failing: not one to generate with
        return False


def _text_length(limit: Any) -> int:
    """128 tokens, or fewer when the positions table is smaller."""
    return min(128, limit) if isinstance(limit, int) and limit > 0 else 128


def _takes(model: nn.Module, name: str) -> bool:
    """Whether ``model.forward`` has a parameter ``name``."""
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _image_spec(config: Any) -> InputSpec:
    """One image of ``config``'s size and channels (224 x 224 x 3 where it names none)."""
    size = getattr(config, "image_size", 224)
    size = size if isinstance(size, int) else 224
    return InputSpec((1, getattr(config, "num_channels", 3), size, size))


def _hf_default_specs(model: nn.Module, config: Any) -> Tuple[InputSpec, ...]:
    main_input = getattr(model, "main_input_name", "input_ids")
    if main_input == "input_ids":
        text = getattr(config, "text_config", None)  # a text-and-image model's positions are its text model's
        limit = getattr(config, "max_position_embeddings", None) or getattr(text, "max_position_embeddings", None)
        if getattr(config, "is_encoder_decoder", False):
            limit = getattr(config, "max_source_positions", None) or limit
        return (InputSpec((1, _text_length(limit)), torch.int64),)
    if main_input == "input_features":
        # speech encoders (Whisper): mel bins x frames; the encoder expects 2 x its positions
        bins = getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", None) or 80
        positions = getattr(config, "max_source_positions", None) or 1500
        return (InputSpec((1, int(bins), 2 * int(positions))),)
    if main_input == "pixel_values":
        return (_image_spec(config),)
    return ()


def _load_torchvision(entry: str, name: str, overrides: Dict[str, Any], device: str) -> LoadedEntry:
    try:
        import torchvision.models as tvm
    except ImportError as exc:
        raise UsageError(f"{entry} needs the torchvision package: pip install torchvision") from exc
    known = tvm.list_models()
    if name not in known:
        hint = did_you_mean(name, known)
        raise UsageError(f"bad ENTRY {entry!r}: torchvision has no model {name!r}{hint}")
    with _build_device(device), _as_usage_error(f"model construction failed: {entry}"):
        model = tvm.get_model(name, weights=None, **overrides)
    return LoadedEntry(entry, model, default_specs=(InputSpec((1, 3, 224, 224)),))


def _load_example(entry: str, name: str, overrides: Dict[str, Any], device: str) -> LoadedEntry:
    if name not in CATALOG:
        with _on_sys_path(os.getcwd()):
            own_module = importlib.util.find_spec("example") is not None
        if own_module:  # the user's own example.py wins for names the catalog lacks
            return _from_object(entry, _import_target(entry.strip()), overrides, device)
        close = close_names(name, CATALOG)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise UsageError(f"bad ENTRY {entry!r}: no example {name!r}; {hint}(examples: {', '.join(CATALOG)})")
    example = CATALOG[name]
    for package in example.needs:
        if importlib.util.find_spec(package) is None:
            raise UsageError(f"{entry} needs the {package} package: pip install {package}")
    factory = getattr(importlib.import_module(f"flopcount.examples.{example.module}"), example.attr)
    loaded = _from_object(entry, factory, overrides, device)
    loaded.default_specs = (parse_spec(example.input_spec),)
    return loaded
