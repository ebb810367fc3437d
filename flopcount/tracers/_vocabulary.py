"""One operator vocabulary for every tracer (docs/conventions.md, "Operator names").

jit records the op Python called (``aten::linear``, ``aten::_convolution``); the
dispatch tracer sees what reaches the dispatcher below autograd (``aten::addmm``,
``aten::convolution``, a CPU kernel). Two tools make both name the same operation the
same way, so ``FlopResult.by_operator()`` does not depend on ``tracer=``:

* :func:`canonical` renames a spelling to its canonical name (``aten::_convolution`` and
  ``aten::conv2d`` -> ``aten::convolution``, ``aten::native_layer_norm`` ->
  ``aten::layer_norm``, ``aten::_softmax`` -> ``aten::softmax``...), adding the constant
  arguments a renamed kernel implies (``_batch_norm_with_update`` -> ``training=True``).
  Both tracers apply it to every event; it is computed once per op name.
* :class:`CompositeInterceptor`, a pass-through TorchFunctionMode for the dispatch
  tracer, records the composite functions jit records as one op (``F.linear``,
  ``torch.matmul``, ``torch.einsum``, ``F.bilinear``, the RNN ops, dropout, SDPA,
  ``F.multi_head_attention_forward``...) as one event with the composite's arguments and
  mutes the aten ops underneath (their decomposition depends on strides and devices: a
  non-contiguous 3-D ``F.linear`` becomes ``mm`` plus a bias ``add``).

Limit: a TorchFunctionMode sees only the outermost overridable call; a composite called
from inside another overridable Python function is seen as the leaf ops it becomes
(``F.multi_head_attention_forward`` is therefore intercepted as a whole and costed as the
operations it performs, see ``handlers/attention.py``).
"""

from __future__ import annotations

import inspect
import itertools
from collections import Counter
from contextlib import contextmanager
from functools import cache
from types import FunctionType
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.autograd import forward_ad
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from flopcount.core.rebound import called_function, torch_own
from flopcount.types import TensorMeta, dtype_name

__all__ = ["CANONICAL", "CompositeInterceptor", "MHA_OP", "canonical"]

#: The composite op the dispatch tracer records for ``F.multi_head_attention_forward``
#: (no aten op exists for it; its handler books the cost under the ops it performs).
MHA_OP = "flopcount::multi_head_attention_forward"

_NO_EXTRA: Mapping[str, Any] = {}


def _same(names: Tuple[str, ...], target: str) -> Dict[str, Tuple[str, Mapping[str, Any]]]:
    return {f"aten::{name}": (f"aten::{target}", _NO_EXTRA) for name in names}


#: spelling -> (canonical name, constant arguments the spelling implies). Only spellings
#: whose handler gives the same cost under the canonical name belong here.
CANONICAL: Dict[str, Tuple[str, Mapping[str, Any]]] = {
    **_same(("_convolution", "_convolution_mode", "conv1d", "conv2d", "conv3d"), "convolution"),
    **{f"aten::conv_transpose{n}d": ("aten::convolution", {"transposed": True}) for n in (1, 2, 3)},
    **{f"aten::max_pool{n}d_with_indices": (f"aten::max_pool{n}d", _NO_EXTRA) for n in (1, 2, 3)},
    **_same(("_adaptive_avg_pool2d",), "adaptive_avg_pool2d"),
    **_same(("_adaptive_avg_pool3d",), "adaptive_avg_pool3d"),
    **_same(("native_layer_norm",), "layer_norm"),
    **_same(("native_group_norm",), "group_norm"),
    **_same(("_fused_rms_norm",), "rms_norm"),
    **_same(("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional"), "batch_norm"),
    "aten::_native_batch_norm_legit_no_training": ("aten::batch_norm", {"training": False}),
    "aten::_batch_norm_with_update": ("aten::batch_norm", {"training": True}),
    "aten::_batch_norm_with_update_functional": ("aten::batch_norm", {"training": True}),
    **_same(("_softmax", "_safe_softmax"), "softmax"),
    **_same(("_log_softmax",), "log_softmax"),
    **_same(("native_dropout",), "dropout"),
    **_same(("_embedding_bag", "_embedding_bag_forward_only"), "embedding_bag"),
    **_same(("log_sigmoid_forward",), "log_sigmoid"),
    **_same(("_prelu_kernel",), "prelu"),
    **_same(("_cdist_forward",), "cdist"),
    **_same(("_weight_norm_interface",), "_weight_norm"),
    **_same(("nll_loss_forward", "nll_loss_nd"), "nll_loss"),
    **_same(("nll_loss2d_forward",), "nll_loss2d"),
    **_same(
        (
            "_scaled_dot_product_attention_math",
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_fused_attention_overrideable",
        ),
        "scaled_dot_product_attention",
    ),
}


def canonical(op: str) -> Tuple[str, Mapping[str, Any]]:
    """The canonical name of ``op`` and the constant arguments its spelling implies."""
    return CANONICAL.get(op, (op, _NO_EXTRA))


# -- the dispatch tracer's composite interceptor ------------------------------------------

Binder = Callable[[Tuple[Any, ...], Mapping[str, Any]], Optional[Tuple[str, Dict[str, Any]]]]


def _schema_binder(overload: Any, op: Optional[str] = None) -> Binder:
    """Bind a builtin's arguments (which follow its aten schema) by schema name."""
    schema = overload._schema
    names = tuple(a.name for a in schema.arguments)
    defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    name = op or f"aten::{schema.name.split('::')[1]}"

    def bind(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tuple[str, Dict[str, Any]]:
        bound: Dict[str, Any] = {}
        for index, arg_name in enumerate(names):
            if index < len(args):
                bound[arg_name] = args[index]
            elif arg_name in kwargs:
                bound[arg_name] = kwargs[arg_name]
            elif arg_name in defaults:
                bound[arg_name] = defaults[arg_name]
        return name, bound

    return bind


def _rnn_binder(op: str) -> Binder:
    """``_VF.lstm/gru/rnn_*``: the ``input`` overload has ``has_biases`` (a bool) fourth,
    the packed ``data`` overload has ``params`` (a list) there."""
    packet = getattr(torch.ops.aten, op)
    by_input, by_data = _schema_binder(packet.input, f"aten::{op}"), _schema_binder(packet.data, f"aten::{op}")

    def bind(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
        if len(args) < 4:
            return None
        return (by_data if isinstance(args[3], (list, tuple)) else by_input)(args, kwargs)

    return bind


def _python_binder(
    func: Callable[..., Any], op: str, rename: Mapping[str, str] = _NO_EXTRA, refuse: Tuple[str, ...] = ()
) -> Binder:
    """Bind a Python-level torch function by its own signature, renaming arguments to the
    aten schema's names; ``refuse`` lists arguments that, when given, leave the call to
    the leaf ops (legacy spellings the composite cannot express)."""
    signature = inspect.signature(func)
    fast = _plain_parameters(signature)

    def bind(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
        values = _bound_plainly(fast, args, kwargs) if fast is not None else None
        if values is None:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return None
            bound.apply_defaults()
            values = dict(bound.arguments)
        if any(values.get(name) is not None for name in refuse):
            return None
        return op, {rename.get(k, k): v for k, v in values.items()}

    return bind


_EMPTY = inspect.Parameter.empty
_PLAIN_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _plain_parameters(signature: inspect.Signature) -> Optional[Tuple[Tuple[Tuple[str, Any], ...], int]]:
    """A signature's ((name, default), ...) and how many of them a call may pass by position,
    when every parameter is positional-or-keyword or keyword-only (no ``*args``/``**kwargs``,
    no positional-only): what :func:`_bound_plainly` binds without ``Signature.bind``; else None."""
    parameters = tuple(signature.parameters.values())
    if any(p.kind not in _PLAIN_KINDS for p in parameters):
        return None
    positional = sum(1 for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters[positional:]):
        return None  # keyword-only before positional ones: not a signature Python makes
    return tuple((p.name, p.default) for p in parameters), positional


def _bound_plainly(
    plain: Tuple[Tuple[Tuple[str, Any], ...], int], args: Tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Optional[Dict[str, Any]]:
    """``Signature.bind(*args, **kwargs)`` with defaults applied, as a dict in signature order, for
    a call that binds without an error (the per-call path of dropout, pooling, norms: ~10x cheaper);
    None for any other call (too many arguments, an unknown or repeated keyword, a missing one),
    which the caller binds with ``Signature.bind`` to get its answer."""
    parameters, positional = plain
    given = len(args)
    if given > positional:
        return None
    values: Dict[str, Any] = {}
    used = 0
    for index, (name, default) in enumerate(parameters):
        if index < given:
            if name in kwargs:
                return None  # given twice: Signature.bind raises
            values[name] = args[index]
        elif name in kwargs:
            values[name] = kwargs[name]
            used += 1
        elif default is _EMPTY:
            return None  # missing: Signature.bind raises
        else:
            values[name] = default
    return values if used == len(kwargs) else None  # an unknown keyword: Signature.bind raises


def _dropout_binder(func: Callable[..., Any], op: str) -> Binder:
    python = _python_binder(func, op, {"training": "train"})

    def bind(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
        found = python(args, kwargs)
        if found is None:
            return None
        name, values = found
        return (name + "_" if values.pop("inplace", False) else name), values

    return bind


def _feature_dropout_binder(func: Callable[..., Any], unbatched: Optional[int]) -> Binder:
    """``F.dropout1d``/``F.dropout3d`` add a batch dimension to an ``unbatched``-D input
    before calling ``aten::feature_dropout`` (whose mask has one element per sample and
    channel); record the input as the aten op sees it, as jit does."""
    python = _dropout_binder(func, "aten::feature_dropout")

    def bind(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
        found = python(args, kwargs)
        if found is None:
            return None
        x = found[1].get("input")
        if isinstance(x, torch.Tensor) and x.dim() == unbatched:
            found[1]["input"] = TensorMeta((1, *x.shape), dtype_name(x.dtype))
        return found

    return bind


def _selu_binder(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
    """``F.selu(input, inplace)``: aten runs it as ``elu`` with a scale; jit records ``selu``."""
    found = _python_binder(F.selu, "aten::selu", {"input": "self"})(args, kwargs)
    if found is None:
        return None
    name, values = found
    return (name + "_" if values.pop("inplace", False) else name), values


_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _loss_binder(func: Callable[..., Any], op: str, refuse: Tuple[str, ...] = ()) -> Binder:
    """A loss taking ``reduction="none"|"mean"|"sum"``, passed to aten as 0/1/2; the legacy
    ``size_average``/``reduce`` (and other ``refuse``d arguments) leave it to the leaf ops."""
    python = _python_binder(func, op, {"input": "self"}, refuse=("size_average", "reduce") + refuse)
    return _translated(python, "reduction", _REDUCTIONS)


_CDIST_MODES = {"use_mm_for_euclid_dist_if_necessary": None, "use_mm_for_euclid_dist": 1, "donot_use_mm_for_euclid_dist": 2}


def _cdist_binder() -> Binder:
    return _translated(_python_binder(torch.cdist, "aten::cdist"), "compute_mode", _CDIST_MODES)


def _translated(python: Binder, name: str, values: Mapping[str, Optional[int]]) -> Binder:
    """``python``'s binding with the string argument ``name`` passed to aten as ``values`` says
    (a value not listed: left to the leaf ops)."""

    def bind(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
        found = python(args, kwargs)
        if found is None or found[1].get(name) not in values:
            return None
        found[1][name] = values[found[1][name]]
        return found

    return bind


def _einsum_binder(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
    """``torch.einsum(equation, *operands)`` (or a list of operands), with the contraction
    path torch itself would pass to the kernel (opt_einsum's, when enabled and installed)."""
    if kwargs or not args or not isinstance(args[0], str):
        return None
    equation = args[0]
    # torch hands its torch-function modes ``(equation, *operands)``; with the old interface,
    # ``einsum(equation, (a, b))``, that is ``(equation, (a, b))``: the operands are args[1] itself
    operands = list(args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:])
    path = None
    opt = torch.backends.opt_einsum
    if len(operands) > 2 and opt.enabled and opt.is_available():
        contract = opt.get_opt_einsum().contract_path(equation, *operands, optimize=opt.strategy)[0]
        path = [index for pair in contract for index in pair]
    return "aten::einsum", {"equation": equation, "tensors": operands, "path": path}


def _tensordot_binder(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
    """``torch.tensordot(a, b, dims)``: an int ``dims`` contracts a's last and b's first dims."""
    if len(args) < 2 or kwargs.get("out") is not None:
        return None
    a, b = args[0], args[1]
    dims = args[2] if len(args) > 2 else kwargs.get("dims", 2)
    if isinstance(dims, torch.Tensor):
        dims = dims.tolist() if dims.ndim else int(dims)
    if isinstance(dims, int):
        dims_a, dims_b = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        dims_a, dims_b = list(dims[0]), list(dims[1])
        if dims_a and isinstance(dims_a[0], (list, tuple)):
            return None
    return "aten::tensordot", {"self": a, "other": b, "dims_self": dims_a, "dims_other": dims_b}


def _values_only(binder: Binder, uses_values: Callable[[Dict[str, Any]], bool] = lambda values: True) -> Binder:
    """``binder``'s binding of a call whose work is ``svdvals``/``eigvalsh``/``eigvals`` (when
    ``uses_values`` says so of its arguments), kept only when the user's own run computes values
    only: no gradient can be asked of the matrix, the first tensor argument
    (``_may_require_fw_or_bw_grad``: grad mode on and it requires grad; tangents and vmap are
    left to the leaf ops before any binder, see ``_any_batched``). Under a dispatch mode torch
    cannot rule a gradient out and always runs the full decomposition, vectors too: the call is
    recorded whole (its handler prices the values); otherwise it is left to the leaf ops, which
    run what the user's run runs."""

    def bind(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
        found = binder(args, kwargs)
        if found is None or not uses_values(found[1]):
            return None
        matrix = next(iter(found[1].values()), None)
        if not isinstance(matrix, torch.Tensor) or (matrix.requires_grad and torch.is_grad_enabled()):
            return None
        return found

    return bind


_SVD_ORDS = (2, -2, "nuc")


def _svd_matrix_norm(values: Dict[str, Any]) -> bool:
    return values.get("ord") in _SVD_ORDS


def _svd_linalg_norm(values: Dict[str, Any]) -> bool:
    """``linalg.norm`` with an SVD ``ord`` over two dims (named, or a 2-D input's): its matrix norm."""
    x, dim = values.get("self"), values.get("dim")
    two_dims = isinstance(dim, (tuple, list)) and len(dim) == 2
    return (two_dims or (dim is None and isinstance(x, torch.Tensor) and x.dim() == 2)) and _svd_matrix_norm(values)


def _nuclear_norm_binder(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
    """``torch.norm(input, p="nuc", dim=None, ...)`` (and ``Tensor.norm``): ``linalg.matrix_norm``
    over ``dim`` (every dim when None); any other ``p`` is a vector norm, left to the leaf ops."""
    names = ("input", "p", "dim", "keepdim", "out", "dtype")
    values = {name: args[i] if i < len(args) else kwargs.get(name) for i, name in enumerate(names)}
    x = values["input"]
    if values["p"] != "nuc" or values["out"] is not None or not isinstance(x, torch.Tensor):
        return None
    dim = values["dim"]
    return "aten::linalg_matrix_norm", {"self": x, "ord": "nuc", "dim": list(range(x.dim())) if dim is None else dim}


def _matrix_rank_binder(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
    """``linalg.matrix_rank(A, tol=None, hermitian=False, *, atol=None, rtol=None)``: the matrix
    and ``hermitian`` are all its cost depends on (tolerances are compared, not computed)."""
    matrix = args[0] if args else kwargs.get("A", kwargs.get("input"))
    hermitian = args[2] if len(args) > 2 else kwargs.get("hermitian", False)
    if not isinstance(matrix, torch.Tensor) or kwargs.get("out") is not None:
        return None
    return "aten::linalg_matrix_rank", {"self": matrix, "hermitian": bool(hermitian)}


def _values_only_binder(overload: Any, op: str) -> Binder:
    """``svdvals``/``eigvalsh``/``eigvals`` (docs/conventions.md, "Values only")."""
    return _values_only(_schema_binder(overload, op))


def _mha_binder() -> Binder:
    python = _python_binder(F.multi_head_attention_forward, MHA_OP)

    def bind(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[str, Dict[str, Any]]]:
        found = python(args, kwargs)
        if found is None:
            return None
        values = found[1]
        # which in-projection runs (one packed linear, two, or three) depends on identity
        values["query_is_key"] = values["query"] is values["key"]
        values["key_is_value"] = values["key"] is values["value"]
        return found

    return bind


def _entries() -> List[Callable[[], Tuple[Any, Binder]]]:
    """Each composite as (torch function, binder), built lazily: a name this torch lacks
    is skipped (that composite is then recorded as its aten ops)."""
    aten = torch.ops.aten
    entries: List[Callable[[], Tuple[Any, Binder]]] = [
        lambda: (F.linear, _schema_binder(aten.linear.default)),
        lambda: (torch.bilinear, _schema_binder(aten.bilinear.default)),
        lambda: (torch.matmul, _schema_binder(aten.matmul.default)),
        lambda: (torch.Tensor.matmul, _schema_binder(aten.matmul.default)),  # also `@`
        lambda: (torch.outer, _schema_binder(aten.outer.default)),
        lambda: (torch.ger, _schema_binder(aten.ger.default)),
        lambda: (torch.Tensor.outer, _schema_binder(aten.outer.default)),
        lambda: (torch.Tensor.ger, _schema_binder(aten.ger.default)),
        lambda: (torch.inner, _schema_binder(aten.inner.default)),
        lambda: (torch.Tensor.inner, _schema_binder(aten.inner.default)),
        lambda: (torch.einsum, _einsum_binder),
        lambda: (torch.tensordot, _tensordot_binder),
        lambda: (F.scaled_dot_product_attention, _schema_binder(aten.scaled_dot_product_attention.default)),
        lambda: (F.multi_head_attention_forward, _mha_binder()),
        lambda: (F.instance_norm, _python_binder(F.instance_norm, "aten::instance_norm")),
        lambda: (F.rms_norm, _python_binder(F.rms_norm, "aten::rms_norm")),
        lambda: (F.dropout, _dropout_binder(F.dropout, "aten::dropout")),
        lambda: (F.alpha_dropout, _dropout_binder(F.alpha_dropout, "aten::alpha_dropout")),
        lambda: (F.dropout1d, _feature_dropout_binder(F.dropout1d, 2)),
        # dropout2d takes a 3-D input as (N, C, L), adding no batch dimension
        lambda: (F.dropout2d, _feature_dropout_binder(F.dropout2d, None)),
        lambda: (F.dropout3d, _feature_dropout_binder(F.dropout3d, 4)),
        lambda: (F.selu, _selu_binder),
        lambda: (torch.selu, _schema_binder(aten.selu.default)),
        lambda: (torch.selu_, _schema_binder(aten.selu_.default)),
        lambda: (F.feature_alpha_dropout, _dropout_binder(F.feature_alpha_dropout, "aten::feature_alpha_dropout")),
        lambda: (F.cross_entropy, _loss_binder(F.cross_entropy, "aten::cross_entropy_loss")),
        lambda: (F.l1_loss, _loss_binder(F.l1_loss, "aten::l1_loss", refuse=("weight",))),
        # kl_div(reduction="batchmean") runs kl_div(sum) and a divide: left to the leaf ops
        lambda: (F.kl_div, _loss_binder(F.kl_div, "aten::kl_div")),
        lambda: (torch.cosine_similarity, _schema_binder(aten.cosine_similarity.default)),
        lambda: (torch.cdist, _cdist_binder()),
        # pooling spelled differently below the dispatcher (a 1-D pool runs as a 2-D one,
        # a global average pool as a mean)
        lambda: (torch.avg_pool1d, _schema_binder(aten.avg_pool1d.default)),
        lambda: (torch.adaptive_avg_pool1d, _schema_binder(aten.adaptive_avg_pool1d.default)),
        lambda: (F.adaptive_avg_pool2d, _python_binder(F.adaptive_avg_pool2d, "aten::adaptive_avg_pool2d", {"input": "self"})),
        lambda: (F.adaptive_avg_pool3d, _python_binder(F.adaptive_avg_pool3d, "aten::adaptive_avg_pool3d", {"input": "self"})),
        # boolean-dispatch wrappers: the torch function seen is the wrapper, bound by the
        # signature of the function it dispatches to
        lambda: (F.max_pool1d, _python_binder(F.max_pool1d_with_indices, "aten::max_pool1d", {"input": "self"})),
        lambda: (
            F.adaptive_max_pool1d,
            _python_binder(F.adaptive_max_pool1d_with_indices, "aten::adaptive_max_pool1d", {"input": "self"}),
        ),
    ]
    for op in ("svdvals", "eigvalsh", "eigvals"):
        entries.append(lambda op=op: (getattr(torch.linalg, op), _values_only_binder(getattr(aten, f"linalg_{op}").default, f"aten::linalg_{op}")))  # type: ignore[misc]
    # the C++ matrix functions that call svdvals / eigvalsh below the torch-function level
    entries += [
        lambda: (torch.linalg.matrix_norm, _values_only(_schema_binder(aten.linalg_matrix_norm.default), _svd_matrix_norm)),
        lambda: (
            torch.linalg.norm,
            _values_only(_schema_binder(aten.linalg_norm.default, "aten::linalg_norm"), _svd_linalg_norm),
        ),
        lambda: (torch.linalg.cond, _values_only(_schema_binder(aten.linalg_cond.default), lambda v: v.get("p") in (None, 2, -2, "nuc"))),
        lambda: (torch.norm, _values_only(_nuclear_norm_binder)),
        lambda: (torch.Tensor.norm, _values_only(_nuclear_norm_binder)),
        lambda: (torch.linalg.matrix_rank, _values_only(_matrix_rank_binder)),
    ]
    for op in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
        entries.append(lambda op=op: (getattr(torch, op), _rnn_binder(op)))  # type: ignore[misc]
    for op in ("lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"):
        # jit records a cell as the ops it decomposes into; its handler books the same split
        entries.append(lambda op=op: (getattr(torch, op), _schema_binder(getattr(aten, op).default)))  # type: ignore[misc]
    return entries


#: The composites above as aten ops: a graph that calls ops directly (``torch.export``'s
#: ``.module()``: ``torch.ops.aten.linear.default(...)``) reaches the mode with those.
_OVERLOAD_COMPOSITES = (
    "linear", "bilinear", "matmul", "outer", "ger", "inner", "einsum", "tensordot",
    "scaled_dot_product_attention", "instance_norm", "rms_norm", "cosine_similarity", "cdist",
    "dropout", "dropout_", "alpha_dropout", "alpha_dropout_", "feature_dropout", "feature_dropout_",
    "feature_alpha_dropout", "feature_alpha_dropout_", "selu", "selu_",
    "cross_entropy_loss", "l1_loss", "kl_div", "avg_pool1d", "adaptive_avg_pool1d",
    "lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
)  # fmt: skip


@cache
def _composites() -> Dict[Any, Binder]:
    """torch function -> binder, built once (the lookup runs on every torch function call)."""
    table: Dict[Any, Binder] = {}
    for entry in _entries():
        try:
            func, binder = entry()
        except (AttributeError, RuntimeError, ValueError):  # not in this torch build
            continue
        table[func] = binder
    for name in ("linalg_svdvals", "linalg_eigvalsh", "linalg_eigvals"):
        packet = getattr(torch.ops.aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            table[getattr(packet, overload)] = _values_only_binder(getattr(packet, overload), f"aten::{name}")
    for name in _OVERLOAD_COMPOSITES:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            table[op] = _schema_binder(op, f"aten::{name}")
    return table


def _autocast_on() -> bool:
    """True inside any ``torch.autocast``: a composite's result dtype then depends on more
    than its arguments (autocast casts them below the torch-function level)."""
    enabled = torch.is_autocast_enabled
    for device in _AUTOCAST_DEVICES or _autocast_devices():
        if enabled(device):
            return True
    return False


_AUTOCAST_DEVICES: Tuple[str, ...] = ()


def _autocast_devices() -> Tuple[str, ...]:
    """The device types autocast can be entered for in this torch (public API, torch >= 2.4)."""
    global _AUTOCAST_DEVICES
    found = []
    for device in ("cpu", "cuda", "xpu", "mps", "hpu"):
        try:
            if torch.amp.is_autocast_available(device):
                torch.is_autocast_enabled(device)
                found.append(device)
        except (RuntimeError, ValueError, TypeError):
            continue
    _AUTOCAST_DEVICES = tuple(found)
    return _AUTOCAST_DEVICES


@cache
def _fresh_composites() -> frozenset:
    """Composites whose result is always a new tensor (never an input or a view of one):
    on fake tensors without autograd, their result may come from the shape cache."""
    found = []
    for name in ("linear", "scaled_dot_product_attention", "rms_norm"):
        if hasattr(F, name):
            found.append(getattr(F, name))
    found += [torch.matmul, torch.Tensor.matmul, torch.bilinear]
    return frozenset(found)


#: marks, in an interceptor's table, a torch function whose ops the recorder may replay by key
#: (``Recorder.run_function``) on fake copies without autograd
_REPLAY: Any = object()


@cache
def _replayable() -> frozenset:
    """Torch functions (not composites of the vocabulary: their aten ops are recorded) whose ops
    and result depend only on their arguments' metadata, each called once per layer of most
    models: batch norm, layer norm, convolution. On a fake copy without autograd the recorder
    keeps what one call recorded and books the next call of the same arguments from it."""
    found = [F.batch_norm, torch.batch_norm, F.layer_norm, torch.layer_norm, torch.conv1d, torch.conv2d, torch.conv3d]
    # torch's own only: a wrapper the caller bound under one of these names before this first ran
    # is run as written (its call is handed on as the function it wraps, core/rebound.py)
    return frozenset(f for f in found if torch_own(f))


def _is_batched() -> Callable[[Any], bool]:
    """A test for a tensor batched by ``torch.vmap`` at any level, also under another
    transform's wrapper (``vmap(grad(f))``: a grad wrapper around a batched tensor), or wrapped by
    two transforms or more (``hessian``, ``jacfwd(jacrev(f))``: jvp's wrapper, whose tangent the
    composite's ops compute too, under jacrev's, where ``forward_ad`` reads no tangent: the
    composite was booked at the primal's shape, 120 of a hessian's 210 MACs, branch wild7), from
    functorch's private predicates; if this torch lacks them, nothing is batched."""
    functorch = getattr(torch._C, "_functorch", None)
    batched = getattr(functorch, "is_batchedtensor", None)
    wrapped = getattr(functorch, "is_functorch_wrapped_tensor", None)
    unwrap = getattr(functorch, "get_unwrapped", None)
    if batched is None or wrapped is None or unwrap is None:
        return lambda tensor: False

    def test(tensor: Any) -> bool:
        depth = 0
        while wrapped(tensor):
            depth += 1
            if batched(tensor) or depth > 1:
                return True
            tensor = unwrap(tensor)
        return False

    return test


_IS_BATCHED = _is_batched()


def _has_tangent(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` carries a forward-mode tangent (``torch.func.jvp``, ``jacfwd``,
    ``hessian``, ``torch.autograd.forward_ad.make_dual``): its ops then also compute the
    tangent's products, inside the op. Outside a dual level this reads no tensor."""
    return forward_ad.unpack_dual(tensor).tangent is not None


def _transformed(tensor: torch.Tensor) -> bool:
    return _IS_BATCHED(tensor) or _has_tangent(tensor)


def _any_batched(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether a tensor argument is batched by ``torch.vmap`` (at any level) or carries a
    forward-mode tangent: a composite sees its per-sample (logical) shape there, and its
    formula prices the primal only, so it is left to its aten ops, which the dispatch tracer
    sees at their physical, batched shapes, tangent products included (docs/conventions.md,
    vmap)."""
    for value in itertools.chain(args, kwargs.values()):
        if isinstance(value, torch.Tensor):
            if _transformed(value):
                return True
        elif isinstance(value, (list, tuple)):
            if any(isinstance(v, torch.Tensor) and _transformed(v) for v in value):
                return True
    return False


class _IssuedOps(TorchDispatchMode):
    """A pass-through dispatch mode pushed on top of the stack around one composite call:
    lists every aten op the composite issues, before any mode below it (selective activation
    checkpointing's cache) decides whether the op runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: List[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        self.ops.append(func)
        return func(*args, **kwargs) if kwargs else func(*args)


@contextmanager
def _withheld(recorder: Any) -> Iterator[Tuple[_IssuedOps, List[Any]]]:
    """Around a composite run muted in the backward phase (a checkpoint's recompute): the ops it
    issued (seen above every dispatch mode) and the events of those that reached the recorder
    (below the modes pushed since the count began: SAC's cache serves the ops its policy saved
    without running them)."""
    held: List[Any] = []
    recorder.held, recorder.held_level, recorder.reached = held, recorder.muted, []
    try:
        with _IssuedOps() as issued:
            yield issued, held
    finally:
        recorder.held = None


def _all_reached(issued: List[Any], reached: List[Any]) -> bool:
    """Whether every op a composite issued reached the recorder (none served from a cache)."""
    if reached == issued:  # no mode between the two (a plain recompute): the same ops, in order
        return True
    return len(reached) >= len(issued) and not Counter(issued) - Counter(reached)


class CompositeInterceptor(TorchFunctionMode):
    """Records each composite call of the forward as one event and mutes the aten ops it
    runs; every other call passes straight through.

    ``recorder`` provides ``phase``, ``muted`` (a counter) and ``record(op, args, outputs)``;
    ``value`` turns an argument into what handlers see (TensorMeta, tuple, scalar) and
    ``outputs`` a result into the outputs tuple.
    """

    def __init__(
        self,
        recorder: Any,
        value: Callable[[Any], Any],
        outputs: Callable[[Any], Tuple[Any, ...]],
        cached: Optional[Callable[[Any, Tuple[Any, ...], Dict[str, Any]], Any]] = None,
    ):
        super().__init__()
        self._recorder = recorder
        self._value = value
        self._outputs = outputs
        self._table: Dict[Any, Any] = _composites()
        if cached is not None and hasattr(recorder, "run_function"):
            self._table = {**dict.fromkeys(_replayable(), _REPLAY), **self._table}
        # on fake copies: the shape cache's runner for a whole composite (no autograd only)
        self._cached = cached
        self._fresh = _fresh_composites()
        self._called: Dict[Any, Any] = {}  # core/rebound.py: a Python function handed -> what it calls

    def __torch_function__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if type(func) is FunctionType:  # F.relu, F.batch_norm...: or a wrapper the caller bound under its name
            func = self._called.get(func) or called_function(func, self._called)
        binder = self._table.get(func)
        recorder = self._recorder
        if binder is None or recorder.muted:  # most calls (.shape, .dim(), ops): straight through
            return func(*args, **kwargs) if kwargs else func(*args)
        if binder is _REPLAY:  # a vmap-batched argument is not keyed: run as usual
            if torch.is_grad_enabled() or _autocast_on():
                return func(*args, **kwargs) if kwargs else func(*args)
            return recorder.run_function(func, args, kwargs or {})
        kwargs = kwargs or {}
        recorder.muted += 1  # inside a dual level, reading a tangent runs a view op
        try:
            transformed = _any_batched(args, kwargs)
        finally:
            recorder.muted -= 1
        if transformed:
            return func(*args, **kwargs)
        bound = binder(args, kwargs)
        if bound is None:
            return func(*args, **kwargs)
        if recorder.phase == "backward" and hasattr(recorder, "held"):
            return self._recomputed(func, args, kwargs, bound)
        recorder.muted += 1
        marker = getattr(recorder, "marker", None)
        try:
            if marker is not None:
                with marker(len(recorder.events)):
                    out = func(*args, **kwargs)
            elif self._cached is not None and func in self._fresh and not torch.is_grad_enabled() and not _autocast_on():
                out = self._cached(func, args, kwargs)
            else:
                out = func(*args, **kwargs)
        finally:
            recorder.muted -= 1
        self._record(bound, out)
        return out

    def _record(self, bound: Tuple[str, Dict[str, Any]], out: Any) -> None:
        op, values = bound
        value = self._value
        self._recorder.record(op, {name: value(v) for name, v in values.items()}, self._outputs(out))

    def _recomputed(self, func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], bound: Tuple[str, Dict[str, Any]]) -> Any:
        """A composite called in the backward phase (a checkpointed region's recompute, a custom
        backward): booked whole from its shapes only if all of its work ran. Under selective
        activation checkpointing the ops its policy saved are served from SAC's cache, by a
        dispatch mode above the recorder: then the ops that did reach the recorder are booked
        instead (nothing, or the views and the bias add), as they ran (docs/conventions.md,
        "Activation checkpointing")."""
        recorder = self._recorder
        marker = getattr(recorder, "marker", None)
        recorder.muted += 1
        try:
            with _withheld(recorder) as (issued, held):
                if marker is not None:
                    with marker(len(recorder.events)):
                        out = func(*args, **kwargs)
                else:
                    out = func(*args, **kwargs)
        finally:
            recorder.muted -= 1
        if _all_reached(issued.ops, recorder.reached):
            self._record(bound, out)
        else:
            recorder.events.extend(held)
            recorder.unkeyed += 1
        return out
