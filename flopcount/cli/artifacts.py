"""Saved artifacts as ENTRY: what ships, counted as it ships.

* ``model.pt2`` — a ``torch.export`` program (``torch.export.load``), run as a module
  (``torch.export.unflatten``: the original module paths, so per-module rows; else
  ``ExportedProgram.module()``: one flat module). Its example inputs are made from the
  program's own user-input placeholders (shape and dtype), a dynamic dimension from the
  example inputs the program recorded or the symbol's hint; ``--input`` overrides them and
  is checked against the program's static dimensions and dynamic ranges first.
* ``model.pt`` made by ``torch.jit.save`` — TorchScript (``torch.jit.load``); needs ``--input``.
* ``hf:./dir`` or ``hf:path/config.json`` — a local Hugging Face config, built with random
  weights (no download, no code from the checkpoint): see :func:`load_hf_local`.

Nothing untrusted is unpickled. ``torch.export.load`` unpickles some archive members with
``weights_only=False`` (tensors saved with pickle, tensor constants, the example inputs as a
fallback), ``pickle.loads`` opaque objects and loads an AOTInductor package's shared library,
so a ``.pt2`` with native code is refused and every pickled member is first loaded with
``torch.load(weights_only=True)`` from the same bytes the program is then read from; a member
that it refuses makes the whole file refused. A ``.pt``/``.pth`` that is a
``torch.save`` pickle (a whole ``nn.Module``, or a ``state_dict``) is refused with what to do
instead: unpickling a module needs ``weights_only=False``, which runs code from the file.
"""

from __future__ import annotations

import importlib
import io
import logging
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from flopcount.cli.output import describe, slash_hint
from flopcount.cli.specs import InputSpec, LoadedEntry, config_with, make_tensor
from flopcount.errors import UsageError
from flopcount.types import dtype_name

# suffixes that make an ENTRY without ':attr' a file to read (any other existing file too)
ARTIFACT_SUFFIXES = (".pt2", ".pt", ".pth", ".ptl", ".ts", ".jit", ".ep", ".zip")
_ZIP_MAGIC = b"PK\x03\x04"
_SAVE_INSTEAD = (
    "save it with torch.export.save (a .pt2) or torch.jit.save (TorchScript), "
    "or give the code that builds it as module:attr or path.py:attr"
)


def looks_like_artifact(text: str) -> bool:
    """An ENTRY naming a model file rather than ``module:attr``: a known suffix, or any
    existing file that is not Python source."""
    if ":" in text.replace("\\", "/").split("/")[-1]:
        return False  # path.py:attr, package.module:attr
    path = Path(text).expanduser()
    return path.suffix.lower() in ARTIFACT_SUFFIXES or (path.is_file() and path.suffix != ".py")


def artifact_file(entry: str) -> Optional[Path]:
    """The file an artifact ENTRY reads (a ``.pt2``, a TorchScript file, an ``hf:`` config), or None."""
    text = entry.strip()
    lowered = text.lower()
    for prefix in ("hf:", "transformers:"):
        if lowered.startswith(prefix):
            rest = text[len(prefix):].strip()
            if not is_local_hf(rest):
                return None
            path = Path(rest).expanduser()
            return path / "config.json" if path.is_dir() else path
    return Path(text).expanduser() if looks_like_artifact(text) else None


# --------------------------------------------------------------------------- reading the file


def _read(entry: str, path: Path) -> bytes:
    if not path.exists():
        raise UsageError(f"bad ENTRY: file not found: {entry}{slash_hint(entry)}")
    if path.is_dir():
        hint = f"; for a Hugging Face checkpoint folder use hf:{entry}" if (path / "config.json").is_file() else ""
        raise UsageError(f"bad ENTRY: {entry} is a folder, not a model file{hint}")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"bad ENTRY: cannot read {entry}: {exc.strerror or exc}") from exc


def _members(entry: str, data: bytes) -> Dict[str, bytes]:
    """Every member of the zip archive ``data`` (a truncated or corrupt archive: UsageError)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return {info.filename: archive.read(info) for info in archive.infolist() if not info.is_dir()}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, NotImplementedError) as exc:
        raise UsageError(
            f"bad ENTRY: {entry} is a truncated or corrupt zip archive ({describe(exc)}); "
            "torch.export.save and torch.jit.save write zip archives: save the model again"
        ) from exc


def _kind(names: Sequence[str]) -> str:
    """What a zip archive holds, from its member names: "export", "torchscript", "pickle" or ""."""
    tails = {name.split("/", 1)[1] if "/" in name else name for name in names}
    if "archive_format" in tails or "serialized_exported_program.json" in tails or any(t.startswith("models/") and t.endswith(".json") for t in tails):
        return "export"
    if "constants.pkl" in tails and any(t.startswith("code/") for t in tails):
        return "torchscript"
    return "pickle" if "data.pkl" in tails else ""


def _is_pickled(blob: bytes) -> bool:
    """A torch.save archive (zip) or a bare pickle (protocol 2-5 header, STOP at the end)."""
    return blob.startswith(_ZIP_MAGIC) or (len(blob) >= 3 and blob[0] == 0x80 and 2 <= blob[1] <= 5 and blob.endswith(b"."))


def _weights_only_load(blob: bytes) -> Any:
    """``torch.load(weights_only=True)``: tensors and plain containers only, no code from the file."""
    return torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")


_NATIVE_SUFFIXES = (".so", ".dll", ".dylib", ".pyd")


def _check_pickles(entry: str, members: Dict[str, bytes]) -> None:
    """Refuse a ``.pt2`` holding native code (``torch.export.load`` loads an AOTInductor
    package's shared library) or a pickled member that ``weights_only`` loading refuses."""
    for name in members:
        if "aotinductor/" in name or name.lower().endswith(_NATIVE_SUFFIXES):
            raise UsageError(
                f"bad ENTRY: {entry} holds compiled AOTInductor code ({name}); flopcount loads no native code "
                "from a file (torch.export.load would): count the program saved before compiling (torch.export.save)"
            )
    for name, blob in members.items():
        if name.endswith(".json") or not _is_pickled(blob):
            continue
        try:
            _weights_only_load(blob)
        except Exception as exc:
            raise UsageError(
                f"bad ENTRY: {entry} holds a pickled object ({name}) that torch.load(weights_only=True) refuses "
                f"({describe(exc)[:200]}); flopcount does not unpickle it, because loading it would run code "
                "from the file. Export the model again without custom objects (tensors only), or count its code as module:attr"
            ) from exc


# --------------------------------------------------------------------------- the loaders


def load_artifact(entry: str, device: str, graph_device: Optional[str] = None) -> LoadedEntry:
    """Read the model file ENTRY names (see the module docstring) into a model and how to make
    its inputs; UsageError when it is not one. ``graph_device``: see :func:`artifact_from_program`."""
    path = Path(entry.strip()).expanduser()
    data = _read(entry, path)
    if not data.startswith(_ZIP_MAGIC):
        if _is_pickled(data) or data[:1] == b"\x80":
            raise UsageError(
                f"bad ENTRY: {entry} is a plain pickle (torch.save's legacy format), not a model file flopcount reads: "
                f"unpickling it needs weights_only=False, which runs code from the file; {_SAVE_INSTEAD}"
            )
        what = "empty" if not data else "not a zip archive"
        raise UsageError(
            f"bad ENTRY: {entry} is not a model file ({what}); flopcount reads torch.export programs (.pt2, "
            "torch.export.save) and TorchScript files (torch.jit.save)"
        )
    members = _members(entry, data)
    kind = _kind(list(members))
    # read on the CPU even inside a caller's torch.device("meta") (plan builds there): the
    # file's storages are CPU storages; --device moves the program afterwards
    with torch.device("cpu"):
        if kind == "export":
            _check_pickles(entry, members)
            return _load_export(entry, data, device, graph_device)
        if kind == "torchscript":
            return _load_torchscript(entry, data, device)
    if kind == "pickle":
        raise UsageError(_pickle_refusal(entry, data))
    raise UsageError(
        f"bad ENTRY: {entry} is a zip archive but neither a torch.export program (.pt2) nor a TorchScript file "
        f"(members: {', '.join(sorted(members)[:4])}{', ...' if len(members) > 4 else ''})"
    )


def _pickle_refusal(entry: str, data: bytes) -> str:
    """Why a torch.save archive is refused: a state_dict has no architecture; a pickled
    module needs weights_only=False (code from the file) to be read at all."""
    try:
        content = _weights_only_load(data)
    except Exception:
        return (
            f"bad ENTRY: {entry} is a torch.save pickle of Python objects (an nn.Module?); flopcount refuses it: "
            f"reading it needs torch.load(weights_only=False), which runs code from the file; {_SAVE_INSTEAD}"
        )
    what = "a state_dict (weights without the architecture)" if isinstance(content, dict) else f"a {type(content).__name__}"
    return f"bad ENTRY: {entry} is a torch.save file holding {what}, not a model; {_SAVE_INSTEAD}"


def _load_torchscript(entry: str, data: bytes, device: str) -> LoadedEntry:
    try:
        model = torch.jit.load(io.BytesIO(data), map_location="meta" if device == "meta" else "cpu")
    except Exception as exc:
        raise UsageError(f"bad ENTRY: torch.jit.load could not read {entry}: {describe(exc)[:300]}") from exc
    return LoadedEntry(
        entry,
        model,
        needs_inputs=(
            f"{entry} is a TorchScript file, which records no input shapes: give them with --input SPEC "
            "(and --kwarg NAME=SPEC)"
        ),
        no_jit=f"{entry} is TorchScript, which torch.jit cannot trace again: use --tracer auto or dispatch",
    )


_UNREGISTERED = re.compile(r"Deserializing (\S+) in pytree is not registered")
#: a node of the program whose operator torch.export.load could not resolve (a custom op)
_NODE_TARGET = re.compile(r"Failed deserializing node Node\(target='torch\.ops\.(\w+)\.(\w+)(?:\.(\w+))?'")
# packages whose output types flopcount may import to read a program (installed code, named
# by the file: only these, never an arbitrary module)
_KNOWN_PACKAGES = ("transformers.",)


def _load_export(entry: str, data: bytes, device: str, graph_device: Optional[str]) -> LoadedEntry:
    imported: List[str] = []
    errors: List[BaseException] = []

    def log(record: logging.LogRecord) -> bool:
        """``torch.export.load`` logs a traceback when the archive's first reading fails; the
        failure is ours to report, in one line: its exceptions are kept, the lines dropped."""
        if record.exc_info and record.exc_info[1] is not None:
            errors.append(record.exc_info[1])
        return False

    logger = logging.getLogger("torch.export")
    while True:
        errors.clear()
        logger.addFilter(log)
        try:
            program = torch.export.load(io.BytesIO(data))
            break
        except Exception as exc:
            causes = [describe(e) for e in errors] + [describe(exc)]
            missing = next((m.group(1) for c in causes for m in [_UNREGISTERED.search(c)] if m), None)
            if missing is not None and missing not in imported and missing.startswith(_KNOWN_PACKAGES):
                imported.append(missing)
                if _import_owner(missing):
                    continue  # its module registers the type with torch's pytree: read again
            if missing is not None:
                raise UsageError(
                    f"bad ENTRY: {entry}: the program's inputs or outputs use the type {missing}, which is not "
                    "registered with torch's pytree here (flopcount imports transformers' types itself; for others, "
                    "count the model's code as module:attr)"
                ) from exc
            unknown = _unregistered_op(causes)
            if unknown is not None:
                raise UsageError(
                    f"bad ENTRY: {entry} calls the operator {unknown}, which is not registered in this process (a custom "
                    "op: torch.export.load needs the library that defines it imported first, and flopcount imports none "
                    "named by a file); count the code that builds the model as module:attr or path.py:attr, whose "
                    "import registers it"
                ) from exc
            raise UsageError(f"bad ENTRY: torch.export.load could not read {entry}: {causes[0][:300]}") from exc
        finally:
            logger.removeFilter(log)
    return artifact_from_program(entry, program, device, graph_device)


def _unregistered_op(causes: List[str]) -> Optional[str]:
    """``ns::name`` of a program node's operator that this process does not have (torch's own
    message of it is a page long, cut short mid-node), else None."""
    for cause in causes:
        found = _NODE_TARGET.search(cause)
        if found is None:
            continue
        namespace, name = found.group(1), found.group(2)
        try:
            getattr(getattr(torch.ops, namespace), name)
        except (AttributeError, RuntimeError):
            return f"{namespace}::{name}"
    return None


def _import_owner(type_name: str) -> bool:
    """Import the module defining ``type_name`` (``package.module.Class``); False when it cannot."""
    try:
        importlib.import_module(type_name.rpartition(".")[0])
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------- an ExportedProgram's inputs


@dataclass(frozen=True)
class _Slot:
    """One user input of an exported program: its placeholder name, dtype, dims (an int,
    or a dynamic dimension's symbol name) and the size recorded for each."""

    name: str
    dtype: torch.dtype
    dims: Tuple[Any, ...]
    sizes: Tuple[Optional[int], ...]


def artifact_from_program(entry: str, program: Any, device: str, graph_device: Optional[str] = None) -> LoadedEntry:
    """A module to count for ``program`` (a ``torch.export.ExportedProgram``) and its inputs.

    ``graph_device``: where the program's graph is moved (default ``device``); ``plan``
    builds on meta but runs its step on fake CPU tensors, so it keeps the graph on the CPU."""
    from torch.export.graph_signature import ConstantArgument, InputKind, TensorArgument

    target = graph_device or device
    if target != "cpu":
        # the graph names the devices it was exported on (a rotary cache's .to(device)):
        # torch's own pass moves them, with the weights, where moving the module could not
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, target)
    model = _as_module(program)
    if device == "meta" and target != "meta":
        model = model.to("meta")
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    recorded = _recorded_inputs(program)
    leaves: List[Any] = []
    for position, spec in enumerate(s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT):
        arg = spec.arg
        if isinstance(arg, TensorArgument):
            value = placeholders[arg.name].meta.get("val")
            if not isinstance(value, torch.Tensor):
                raise UsageError(f"bad ENTRY: {entry}: the program's input {arg.name!r} has no recorded shape; give it with --input")
            example = recorded[position] if recorded is not None and position < len(recorded) else None
            leaves.append(_slot(arg.name, value, example))
        elif isinstance(arg, ConstantArgument):
            leaves.append(arg.value)
        else:
            raise UsageError(
                f"bad ENTRY: {entry}: the program's input {getattr(arg, 'name', position)!r} is a {type(arg).__name__} "
                "(not a tensor); flopcount makes only tensor inputs for an exported program"
            )
    in_spec = program.call_spec.in_spec  # a TreeSpec: (args, kwargs) from their leaves, by its public unflatten
    args, kwargs = in_spec.unflatten(leaves)
    ranges = {str(symbol): (_bound(r.lower), _bound(r.upper)) for symbol, r in program.range_constraints.items()}
    flat = isinstance(args, tuple) and all(isinstance(a, _Slot) for a in args) and isinstance(kwargs, dict) and all(
        isinstance(v, _Slot) for v in kwargs.values()
    )
    fit = _fitter(entry, ranges, list(args) if flat else None, dict(kwargs) if flat else None)
    if flat:
        try:
            specs = tuple(_spec(entry, s) for s in args)
            kw_specs = {k: _spec(entry, s) for k, s in kwargs.items()}
        except UsageError as exc:  # a dynamic size nobody recorded: --input must give it
            return LoadedEntry(entry, model, fit_specs=fit, needs_inputs=str(exc))
        return LoadedEntry(entry, model, default_specs=specs, default_kwargs=kw_specs, fit_specs=fit)
    generator = torch.Generator().manual_seed(0)
    made_args, made_kwargs = in_spec.unflatten(  # the leaves in order, each slot made: tree_map's result
        [make_tensor(_spec(entry, leaf), device=device, generator=generator) if isinstance(leaf, _Slot) else leaf for leaf in leaves]
    )
    # nested inputs: --input cannot say where each tensor goes, so none is taken
    return LoadedEntry(entry, model, inputs=made_args, kwargs=dict(made_kwargs) or None, fit_specs=fit)


def _as_module(program: Any) -> nn.Module:
    """``torch.export.unflatten``: submodules under their original paths, so the count has
    per-module rows; where it cannot rebuild them, ``program.module()`` (one flat module)."""
    try:
        return torch.export.unflatten(program)
    except Exception:
        module: nn.Module = program.module()
        return module


def _recorded_inputs(program: Any) -> Optional[List[Any]]:
    """The example inputs saved with the program, flattened (None when none were): one value
    per leaf of the program's input spec (its public ``TreeSpec.flatten_up_to``), the order
    of its user inputs."""
    example = getattr(program, "example_inputs", None)
    return None if example is None else list(program.call_spec.in_spec.flatten_up_to(example))


def _symbol_hint(dim: Any) -> Optional[int]:
    """The size a dynamic dimension had when it was exported (its shape env's hint)."""
    hint = getattr(getattr(dim, "node", None), "hint", None)
    return int(hint) if isinstance(hint, int) else None


def _slot(name: str, value: torch.Tensor, example: Any) -> _Slot:
    """A dynamic dimension's size: the recorded example input's, else the symbol's hint."""
    recorded = isinstance(example, torch.Tensor) and example.dim() == value.dim()
    sizes = [dim if isinstance(dim, int) else int(example.shape[i]) if recorded else _symbol_hint(dim) for i, dim in enumerate(value.shape)]
    return _Slot(name, value.dtype, tuple(dim if isinstance(dim, int) else str(dim) for dim in value.shape), tuple(sizes))


def _bound(value: Any) -> Optional[int]:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None  # int_oo, -int_oo
    return number if abs(number) < 2**62 else None


def _spec(entry: str, slot: _Slot) -> InputSpec:
    missing = [i for i, size in enumerate(slot.sizes) if size is None]
    if missing:
        i = missing[0]
        raise UsageError(
            f"{entry}: dimension {i} of the program's input {slot.name!r} is dynamic ({slot.dims[i]}) and the program "
            f"records no size for it; give the input's shape with --input (e.g. --input "
            f"{'x'.join(str(d) if isinstance(d, int) else 'N' for d in slot.dims)}:{dtype_name(slot.dtype)})"
        )
    return InputSpec(tuple(int(s) for s in slot.sizes if s is not None), slot.dtype)


def _fitter(
    entry: str,
    ranges: Dict[str, Tuple[Optional[int], Optional[int]]],
    args: Optional[List[_Slot]],
    kwargs: Optional[Dict[str, _Slot]],
) -> Callable[[Sequence[InputSpec], Dict[str, InputSpec]], Tuple[List[InputSpec], Dict[str, InputSpec]]]:
    """Check the command line's SPECs against the program and place them: the Nth ``--input``
    is the program's Nth tensor input (positional ones first, then keywords in order), a
    ``--kwarg NAME=`` is the input of that name; an input not given keeps its recorded
    shape, with dynamic dimensions shared with a given input (the same symbol) following it."""

    def fit(specs: Sequence[InputSpec], kw_specs: Dict[str, InputSpec]) -> Tuple[List[InputSpec], Dict[str, InputSpec]]:
        if args is None or kwargs is None:
            raise UsageError(
                f"{entry}: the program's inputs are nested (not one tensor per argument), so --input/--kwarg cannot "
                "say where each goes; its recorded inputs are used when you give none"
            )
        order = list(args) + list(kwargs.values())
        if len(specs) > len(order):
            raise UsageError(
                f"{entry}: {len(specs)} --input given, but the program takes {len(order)} tensor input(s) "
                f"({', '.join(s.name for s in order)})"
            )
        given: Dict[str, InputSpec] = {slot.name: spec for slot, spec in zip(order, specs)}
        by_name = {s.name: s for s in order}
        by_name.update(kwargs)
        for name, spec in kw_specs.items():
            if name not in by_name:
                raise UsageError(f"{entry}: --kwarg {name}: the program has no input {name!r} (inputs: {', '.join(by_name)})")
            slot_name = by_name[name].name
            if slot_name in given:
                raise UsageError(f"{entry}: input {name!r} is given twice (--input and --kwarg)")
            given[slot_name] = spec
        symbols: Dict[str, int] = {}
        for slot in order:
            if slot.name in given:
                _check_fit(entry, slot, given[slot.name], ranges, symbols)
        placed = [given.get(s.name) or _follow(entry, s, symbols) for s in order]
        return placed[: len(args)], dict(zip(kwargs, placed[len(args):]))

    return fit


def _check_fit(
    entry: str, slot: _Slot, spec: InputSpec, ranges: Dict[str, Tuple[Optional[int], Optional[int]]], symbols: Dict[str, int]
) -> None:
    shown = "x".join(str(d) for d in slot.dims)
    where = f"{entry}: input {slot.name!r} (exported as {shown}:{dtype_name(slot.dtype)})"
    if len(spec.shape) != len(slot.dims):
        raise UsageError(f"{where}: --input {spec} has {len(spec.shape)} dimension(s), the program takes {len(slot.dims)}")
    if spec.dtype != slot.dtype:
        raise UsageError(f"{where}: --input {spec} has dtype {dtype_name(spec.dtype)}, the program takes {dtype_name(slot.dtype)}")
    for i, (dim, size) in enumerate(zip(slot.dims, spec.shape)):
        if isinstance(dim, int):
            if size != dim:
                raise UsageError(
                    f"{where}: dimension {i} is static ({dim}) in the program, --input {spec} gives {size}; "
                    "export it with dynamic_shapes to count other sizes"
                )
            continue
        low, high = ranges.get(dim, (None, None))
        if (low is not None and size < low) or (high is not None and size > high):
            raise UsageError(
                f"{where}: dimension {i} ({dim}) must be in [{low}, {high if high is not None else 'inf'}], --input {spec} gives {size}"
            )
        if symbols.setdefault(dim, size) != size:
            raise UsageError(f"{where}: dimension {i} is {dim}, already {symbols[dim]} in another input; --input {spec} gives {size}")


def _follow(entry: str, slot: _Slot, symbols: Dict[str, int]) -> InputSpec:
    """A recorded input whose dynamic dimensions take the sizes the given inputs set."""
    sizes = tuple(symbols.get(d, s) if isinstance(d, str) else s for d, s in zip(slot.dims, slot.sizes))
    return _spec(entry, _Slot(slot.name, slot.dtype, slot.dims, sizes))


# --------------------------------------------------------------------------- a local Hugging Face config


def is_local_hf(text: str) -> bool:
    """``hf:`` followed by a path (a separator, ``.``/``~`` first, or ``.json`` last), not a model_type."""
    return "/" in text or "\\" in text or text.startswith((".", "~")) or text.lower().endswith(".json")


#: a Hugging Face Hub id as its model pages spell it: ``org/name``
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def hub_hint(name: str, model_types: Sequence[str]) -> str:
    """What to do with a Hugging Face Hub id given to ``hf:`` (``meta-llama/Llama-2-7b-hf``,
    ``bert-base-uncased``): ``"; ..."`` saying that nothing is downloaded, with ``hf:TYPE`` where
    the id's name begins with a model type (the longest, followed by a separator: ``llama`` in
    ``Llama-2-7b-hf``) and the local-folder remedy; "" where ``name`` is neither an ``org/name`` id
    nor begins with a model type."""
    repo = name.rsplit("/", 1)[-1].lower()
    family = max((t for t in model_types if len(repo) > len(t) and repo.startswith(t) and not repo[len(t)].isalnum()),
                 key=len, default="")
    if not family and not _HUB_ID.fullmatch(name):
        return ""
    default = (f"hf:{family} counts transformers' default {family} config (its sizes, which may not be this "
               "checkpoint's); for the checkpoint's own, ") if family else ""
    return (f"; it looks like a Hugging Face Hub name, and flopcount downloads nothing: {default}download its "
            f"config.json (hf download {name} config.json --local-dir DIR) and give hf:./DIR")


def local_hf_config(entry: str, text: str, overrides: Dict[str, Any]) -> Tuple[Any, Optional[str]]:
    """The config of a local Hugging Face folder or ``config.json`` (with ``--config``
    overrides), and the model class its ``architectures`` names, when transformers has it.
    No network (``local_files_only``); a config that needs the checkpoint's own code
    (``auto_map``) is refused."""
    import json

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    path = Path(text).expanduser()
    if not path.exists():
        raise UsageError(f"bad ENTRY {entry!r}: no such folder or file: {text}{hub_hint(text, list(CONFIG_MAPPING_NAMES))}")
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise UsageError(f"bad ENTRY {entry!r}: {text} has no config.json")
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"bad ENTRY {entry!r}: {file} is not a JSON config: {describe(exc)}") from exc
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise UsageError(f"bad ENTRY {entry!r}: {file} has no \"model_type\"; is it a Hugging Face config.json?")
    if raw.get("auto_map"):
        raise UsageError(
            f"bad ENTRY {entry!r}: {file} needs the checkpoint's own Python code (auto_map, trust_remote_code); "
            "flopcount runs no code from a checkpoint: count that code as module:attr instead"
        )
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(file), local_files_only=True)
    except Exception as exc:
        raise UsageError(f"bad ENTRY {entry!r}: transformers cannot read {file}: {describe(exc)[:300]}") from exc
    config = config_with(config, overrides, lambda **values: AutoConfig.from_pretrained(str(file), local_files_only=True, **values))
    architectures = raw.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures and isinstance(architectures[0], str) else None
    return config, name

