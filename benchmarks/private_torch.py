"""Issue #27 item 4: how many private torch symbols flopcount uses, counted from its source by AST.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/private_torch.py [PACKAGE_DIR] [--list]``
(PACKAGE_DIR defaults to this checkout's ``flopcount/``; point it at another checkout's package to
count that one). Prints the number of distinct private symbols, and with ``--list`` each symbol with
the files that use it.

What counts as one private symbol:

* a dotted torch path with a component that starts with ``_`` (dunders excepted), reached through
  an import, an attribute chain (``torch._C._jit_pass_inline``), ``getattr``/``hasattr`` with a
  literal name (links of a chain too: ``getattr(getattr(torch.utils, "_pytree"), "TreeSpec")``
  is ``torch.utils._pytree.TreeSpec``), or a string literal naming a torch module
  (``"torch._dynamo"``, a logger name).
  The path is cut after its last private component, or, when that component is a module, after the
  first non-module below it: ``torch._C.TensorType.create_from_tensor`` is ``torch._C.TensorType``,
  ``torch._subclasses.fake_tensor.FakeTensor`` is itself, ``torch.utils._pytree.tree_map`` is
  itself;
* a private attribute name read off an object that is not a torch path (``dtensor._local_tensor``,
  ``module._forward_hooks``, ``tracker._peak_mem``), when flopcount does not define that name
  itself as an attribute (a method, a class-body name, an attribute assigned or ``setattr`` on
  ``self``/``cls``; a module-level function, a local of that name, or the name assigned on another
  object, which replaces that object's attribute, does not count) and torch's own sources do (or, on ``self`` in a class derived from a torch class, when
  that class does not define it). Private names of other libraries (``sys._getframe``,
  transformers) are listed apart and not counted;
* a name ``getattr``/``hasattr``/``setattr``/``delattr`` is handed by a loop over string
  constants (``for name in ("_fw_pre_hook", "_fw_post_hook"): setattr(tracker, name, ...)``),
  each of them as if spelled literally; ``setattr`` on an object other than ``self``/``cls``
  replaces that object's attribute, as an assignment does;
* a private method flopcount defines in a class derived from a torch class that defines it
  (``_should_skip_dynamo`` on a TorchDispatchMode, ``_register_global_optimizer_hook`` on
  MemTracker): torch calls it by that name. A base known only at run time (``class
  Peak(base)``) is checked against every torch class flopcount names; a base of flopcount's own
  is followed to its bases. When the same name is also a counted torch path
  (``MemTracker._update_peak_stats``), it is that one symbol.

An aten operator read by attribute (``aten._local_scalar_dense.default``) is a key of the
dispatcher, as the names in a handler table are: listed apart as a private operator, not counted.

The same rules decide tests/test_private_torch.py::test_every_private_symbol_is_in_the_canary.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import re
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
TORCH_PATH = re.compile(r"^torch(\.\w+)+$")
PRIVATE_NAME = re.compile(r"^_[A-Za-z]\w*$")
#: private names of Python itself that torch's sources also spell (namedtuple's API, argparse)
NOT_TORCH = frozenset({"_fields", "_asdict", "_replace", "_make", "_field_defaults", "_actions"})


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _resolve(path: str) -> Tuple[List[object], bool]:
    """The objects along ``path`` (importing submodules as needed); False when a part is missing."""
    parts = path.split(".")
    try:
        obj: object = importlib.import_module(parts[0])
    except ImportError:
        return [], False
    objs = [obj]
    for i, part in enumerate(parts[1:], start=1):
        if not hasattr(obj, part) and isinstance(obj, types.ModuleType):
            try:
                importlib.import_module(".".join(parts[: i + 1]))
            except Exception:
                pass
        try:
            obj = getattr(obj, part)
        except Exception:
            return objs, False
        objs.append(obj)
    return objs, True


def symbol_of(path: str) -> Optional[str]:
    """The private symbol a torch path uses (None when every part is public)."""
    parts = path.split(".")
    private = [i for i, p in enumerate(parts) if _private(p)]
    if not private:
        return None
    last = private[-1]
    objs, _ = _resolve(path)
    end = last
    while end < len(objs) and isinstance(objs[end], types.ModuleType) and end + 1 < len(parts):
        end += 1
    return ".".join(parts[: end + 1])


def _torch_identifiers() -> Set[str]:
    """Every private identifier spelled in torch's Python sources and stubs."""
    import torch

    names: Set[str] = set()
    pattern = re.compile(r"\b(_[A-Za-z]\w*)")
    for suffix in ("*.py", "*.pyi"):
        for file in Path(torch.__file__).parent.rglob(suffix):
            try:
                names.update(pattern.findall(file.read_text(errors="ignore")))
            except OSError:
                continue
    return {n for n in names if not n.endswith("__")}


@functools.cache
def _probes() -> Tuple[object, ...]:
    import torch
    from torch import nn

    return (nn.Linear(1, 1), torch.zeros(1), nn.Parameter(torch.zeros(1)), nn.modules.module, nn.functional)


def _probe_attribute(name: str) -> bool:
    """A private name in a string literal counts when torch's modules, tensors or
    ``torch.nn.modules.module`` have that attribute (the per-module hook dicts, the global hook
    dicts...); operator names (``"_to_copy"`` in a handler table) and our own strings do not."""
    import torch

    if hasattr(torch.ops.aten, name):
        return False  # an operator's name: a key of the dispatcher, not a Python symbol
    return any(hasattr(probe, name) for probe in _probes())


class _Defined(ast.NodeVisitor):
    """Private names flopcount defines: functions, classes, attributes it assigns, fields, args."""

    def __init__(self) -> None:
        self.names: Set[str] = set()
        # the names an object of flopcount's can have as attributes: methods and class-body names,
        # assigned attributes, setattr's; not a module-level function, a local or an argument (a
        # module function ``_parameters`` does not make ``module._parameters`` flopcount's)
        self.attributes: Set[str] = set()
        self._in_class_body = False

    def _add(self, name: Optional[str], attribute: bool = False) -> None:
        if name and _private(name):
            self.names.add(name)
            if attribute:
                self.attributes.add(name)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._add(node.name, self._in_class_body)
        for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
            self._add(arg.arg)
        outer, self._in_class_body = self._in_class_body, False
        self.generic_visit(node)
        self._in_class_body = outer

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._add(node.name, self._in_class_body)
        outer, self._in_class_body = self._in_class_body, True
        self.generic_visit(node)
        self._in_class_body = outer

    def _target(self, target: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self._add(target.id, self._in_class_body)
        elif isinstance(target, ast.Attribute):
            # ``self._x = ...`` defines ``_x``; ``tracker._x = ...`` on another object replaces that
            # object's attribute (a torch object's private method wrapped in place is still torch's)
            if isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"):
                self._add(target.attr, True)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._target(elt)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._target(target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._target(node.target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node.target)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        # setattr(obj, "_name", ...) and object.__setattr__(obj, "_name", ...) define a name too
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in ("setattr", "__setattr__"):
            target = node.args[0] if node.args else None
            if isinstance(target, ast.Name) and target.id in ("self", "cls"):
                for arg in node.args[:2]:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        self._add(arg.value, True)
        self.generic_visit(node)


def _files(package: Path) -> List[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def _walked(tree: ast.AST) -> List[ast.AST]:
    """Every node of a file's tree in :func:`ast.walk`'s order, walked once for the passes below
    (each walked the tree again before, ~8 walks a file)."""
    return list(ast.walk(tree))


def _aliases(nodes: List[ast.AST]) -> Dict[str, str]:
    """Local name -> dotted path, for every torch import anywhere in the file (``nodes``: its
    nodes, :func:`_walked`)."""
    names: Dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or alias.name.startswith("torch."):
                    if alias.asname:
                        names[alias.asname] = alias.name
                    else:
                        names["torch"] = "torch"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "torch" or node.module.startswith("torch."):
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _literal_getattr(node: ast.AST) -> Optional[Tuple[ast.AST, str]]:
    """(object, name) of ``getattr(object, "name"[, default])``, else None."""
    if (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
        and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
    ):
        return node.args[0], node.args[1].value
    return None


def _chain(node: ast.AST, aliases: Dict[str, str]) -> Optional[str]:
    """The dotted torch path of an attribute chain, ``getattr(x, "name")`` links included
    (``getattr(getattr(torch.utils, "_pytree", None), "TreeSpec", None)``); None off torch."""
    parts: List[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
            continue
        link = _literal_getattr(node)
        if link is None:
            break
        node, name = link
        parts.append(name)
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id]] + parts[::-1])
    return None


class Use:
    def __init__(self) -> None:
        self.torch: Dict[str, Set[str]] = defaultdict(set)  # symbol -> files
        self.attrs: Dict[str, Set[str]] = defaultdict(set)  # ".name" -> files
        self.foreign: Dict[str, Set[str]] = defaultdict(set)
        self.ops: Dict[str, Set[str]] = defaultdict(set)  # private operators: dispatcher keys, not counted


def _class_facts(nodes: List[ast.AST], aliases: Dict[str, str]) -> Dict[ast.ClassDef, Tuple[bool, Set[str]]]:
    """Per class: whether a base is a torch path, and the private names its body defines."""
    facts = {}
    for node in nodes:
        if isinstance(node, ast.ClassDef):
            torch_base = any(_chain(b, aliases) or (isinstance(b, ast.Name) and b.id in aliases) for b in node.bases)
            defined = _Defined()
            defined.visit(node)
            facts[node] = (torch_base, defined.names)
    return facts


def _loop_constants(nodes: List[ast.AST]) -> Dict[str, Set[str]]:
    """Loop variable -> the string constants it takes (``for name in ("_a", "_b"):``, a
    comprehension's too): a ``getattr(obj, name)`` in the loop reads each of them."""
    found: Dict[str, Set[str]] = defaultdict(set)
    for node in nodes:
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            items = node.iter.elts if isinstance(node.iter, (ast.Tuple, ast.List, ast.Set)) else []
            if items and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in items):
                found[node.target.id].update(e.value for e in items)  # type: ignore[attr-defined]
    return found


def _overrides(walked: Dict[Path, List[ast.AST]], aliases_of: Dict[Path, Dict[str, str]], package: Path, use: Use) -> None:
    """A private method flopcount defines in a class derived from a torch class that has a
    method of that name (``_update_peak_stats`` on MemTracker, ``_should_skip_dynamo`` on
    TorchDispatchMode): torch calls it by that name, a dependency as much as a read. A base
    known only at run time (``class PeakTracker(base)``) is checked against every torch class
    flopcount names. A name counted as a torch path already (``MemTracker._update_peak_stats``)
    is that symbol. ``walked`` and ``aliases_of``: each file's nodes and :func:`_aliases`, as
    :func:`scan` found them."""
    named: List[type] = []
    for symbol in use.torch:
        objs, ok = _resolve(symbol)
        if ok and isinstance(objs[-1], type):
            named.append(objs[-1])
    ours: Dict[str, Tuple[ast.ClassDef, Dict[str, str]]] = {}  # flopcount's classes by name
    for file, nodes in walked.items():
        aliases = aliases_of[file]
        for path in aliases.values():
            objs, ok = _resolve(path)
            if ok and isinstance(objs[-1], type) and objs[-1] not in named:
                named.append(objs[-1])
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                ours.setdefault(node.name, (node, aliases))

    def bases(cls: ast.ClassDef, aliases: Dict[str, str], seen: Set[str]) -> Tuple[List[type], bool]:
        """The torch classes among ``cls``'s bases (through flopcount's own), and whether a
        base is known only at run time (a function's argument)."""
        found: List[type] = []
        dynamic = False
        for base in cls.bases:
            path = _chain(base, aliases) or (aliases.get(base.id) if isinstance(base, ast.Name) else None)
            if path is not None:
                objs, ok = _resolve(path)
                if ok and isinstance(objs[-1], type):
                    found.append(objs[-1])
            elif isinstance(base, ast.Name) and base.id in ours:
                if base.id not in seen:
                    node, its_aliases = ours[base.id]
                    more, more_dynamic = bases(node, its_aliases, seen | {base.id})
                    found.extend(more)
                    dynamic = dynamic or more_dynamic
            elif isinstance(base, ast.Name):
                dynamic = True
        return found, dynamic

    paths = {symbol.rsplit(".", 1)[-1]: symbol for symbol in use.torch}
    for file, nodes in walked.items():
        rel = str(file.relative_to(package.parent))
        aliases = aliases_of[file]
        for cls in (node for node in nodes if isinstance(node, ast.ClassDef)):
            torch_bases, dynamic = bases(cls, aliases, {cls.name})
            candidates = [c for klass in torch_bases + (named if dynamic else []) for c in klass.__mro__ if c is not object]
            for item in cls.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                    if any(item.name in vars(c) for c in candidates):
                        if item.name in paths:
                            use.torch[paths[item.name]].add(rel)
                        else:
                            use.attrs["." + item.name].add(rel)


def _merge_paths(use: Use) -> None:
    """An attribute name also counted as a torch path ending in it (``._call_impl`` read by a
    name in a string, ``torch.nn.Module._call_impl`` by ``getattr``) is one symbol: the path."""
    for symbol in list(use.torch):
        name = "." + symbol.rsplit(".", 1)[-1]
        if name in use.attrs:
            use.torch[symbol] |= use.attrs.pop(name)


def scan(package: Path) -> Use:
    trees = {}
    for file in _files(package):
        trees[file] = ast.parse(file.read_text(), str(file))
    ours = _Defined()
    for tree in trees.values():
        ours.visit(tree)
    torch_names = _torch_identifiers()
    use = Use()
    walked = {file: _walked(tree) for file, tree in trees.items()}
    aliases_of = {file: _aliases(nodes) for file, nodes in walked.items()}
    for file, nodes in walked.items():
        rel = str(file.relative_to(package.parent))
        aliases = aliases_of[file]
        classes = _class_facts(nodes, aliases)
        loops = _loop_constants(nodes)
        imported = _imported_modules(nodes)
        parent: Dict[ast.AST, ast.AST] = {}
        for node in nodes:
            for child in ast.iter_child_nodes(node):
                parent[child] = node

        def enclosing_class(node: ast.AST) -> Optional[ast.ClassDef]:
            while node in parent:
                node = parent[node]
                if isinstance(node, ast.ClassDef):
                    return node
            return None

        def torch_path(path: str) -> None:
            symbol = symbol_of(path)
            if symbol:
                use.torch[symbol].add(rel)

        def attribute(base: ast.AST, name: str, where: ast.AST) -> None:
            path = _chain(base, aliases) if isinstance(base, (ast.Name, ast.Attribute, ast.Call)) else None
            if path is not None:
                torch_path(f"{path}.{name}")  # a public name below a private module is that module's
                return
            if not _private(name):
                return
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                cls = enclosing_class(where)
                if cls is not None:
                    torch_base, defined = classes[cls]
                    if name in defined:
                        return  # the class's own (an override of a torch name is found by its def)
                    if torch_base or (name not in ours.attributes and name in torch_names):
                        use.attrs["." + name].add(rel)  # inherited from torch (a base given at run time too)
                    return
            if isinstance(base, ast.Name) and base.id not in aliases and base.id in imported:
                use.foreign[f"{base.id}.{name}"].add(rel)
                return
            if name in ours.attributes or name in NOT_TORCH:
                return
            if _operator_overload(name, parent.get(where)):
                use.ops["aten::" + name].add(rel)  # ``aten._local_scalar_dense.default``: an operator, as in a handler table
                return
            (use.attrs if name in torch_names else use.foreign)["." + name].add(rel)

        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "torch" or node.module.startswith("torch."):
                    for alias in node.names:
                        torch_path(f"{node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("torch."):
                        torch_path(alias.name)
            elif isinstance(node, ast.Attribute):
                if isinstance(parent.get(node), ast.Attribute):
                    continue  # only the longest chain
                chain = _chain(node, aliases)
                if chain is not None:
                    torch_path(chain)
                else:
                    inner: ast.AST = node
                    # a chain on a non-torch base: each private link (``x._a.b._c``)
                    while isinstance(inner, ast.Attribute):
                        attribute(inner.value, inner.attr, inner)
                        inner = inner.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2:
                    name = node.args[1]
                    target = node.args[0]
                    if node.func.id == "setattr" and isinstance(target, ast.Name) and target.id in ("self", "cls"):
                        continue  # setting a name on our own object defines it
                    if isinstance(name, ast.Constant) and isinstance(name.value, str):
                        attribute(target, name.value, node)
                    elif isinstance(name, ast.Name) and name.id in loops:
                        for each in sorted(loops[name.id]):  # a name the loop gives (``for name in ("_a", "_b")``)
                            attribute(target, each, node)
            elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
            ):
                # ("torch.module", "attribute"): a symbol looked up by name
                module, attr = (e.value for e in node.elts)  # type: ignore[attr-defined]
                # (two module paths, e.g. a tuple of prefixes, are two constants, seen below)
                if (TORCH_PATH.match(module) or module == "torch") and "." not in attr:
                    torch_path(f"{module}.{attr}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value.strip()
                if TORCH_PATH.match(text) and any(_private(p) for p in text.split(".")):
                    torch_path(text)
                elif (
                    PRIVATE_NAME.match(text) and text not in ours.names and text not in NOT_TORCH
                    and not isinstance(parent.get(node), ast.Call) and _probe_attribute(text)
                ):
                    use.attrs["." + text].add(rel)  # a private attribute name read by getattr(obj, name)
    _fold_modules(use.torch)
    _overrides(walked, aliases_of, package, use)
    _merge_paths(use)
    return use


def _operator_overload(name: str, outer: Optional[ast.AST]) -> bool:
    """Whether ``x.name`` is read as an aten operator: ``name`` is one and the read goes on to
    one of its overloads (``_aten._local_scalar_dense.default``). A private operator is a
    key of the dispatcher, not a Python symbol (the rule for a handler table's names)."""
    import torch

    if not isinstance(outer, ast.Attribute) or not hasattr(torch.ops.aten, name):
        return False
    packet = getattr(torch.ops.aten, name)
    return outer.attr == "default" or outer.attr in packet.overloads()


def _imported_modules(nodes: List[ast.AST]) -> Set[str]:
    """The names ``import`` statements bind anywhere in the file (``import a.b`` binds ``a``),
    found once per file where each attribute read walked the file again."""
    names: Set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.add(alias.asname or alias.name.split(".")[0])
    return names


def symbols(package: Path) -> Dict[str, Set[str]]:
    """Every private torch symbol of ``package`` -> the files using it (the figure is its length)."""
    use = scan(package)
    found: Dict[str, Set[str]] = dict(use.torch)
    found.update(use.attrs)
    return found


def _fold_modules(table: Dict[str, Set[str]]) -> None:
    """A private module named only as the way to its members (``torch._C`` of
    ``torch._C._jit_pass_inline``, ``ft`` of ``ft.FakeTensor``) is not a symbol of its own."""
    for name in list(table):
        if any(other.startswith(name + ".") for other in table):
            objs, ok = _resolve(name)
            if ok and objs and isinstance(objs[-1], types.ModuleType):
                del table[name]


def main(argv: Iterable[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("package", nargs="?", default=str(ROOT / "flopcount"))
    parser.add_argument("--list", action="store_true", help="each symbol with the files using it")
    args = parser.parse_args(list(argv))
    package = Path(args.package).resolve()
    use = scan(package)
    if args.list:
        tables = (("torch paths", use.torch), ("attribute names", use.attrs), ("private operators (not counted)", use.ops),
                  ("not torch (not counted)", use.foreign))
        for title, table in tables:
            print(f"## {title}: {len(table)}")
            for name in sorted(table):
                print(f"  {name:70s} {', '.join(sorted(table[name]))}")
    print(f"{package}: {len(use.torch) + len(use.attrs)} distinct private torch symbols "
          f"({len(use.torch)} torch paths, {len(use.attrs)} attribute names)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
