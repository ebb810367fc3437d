"""Stand-in kernels for ops whose meta kernel refuses shapes-only tensors that matter for
counting: mixture-of-experts grouped matmuls, the CTC loss, and TransformerEncoder's
padding-mask check.

torch's meta kernel for ``aten::_grouped_mm`` accepts bfloat16 only (``_scaled_grouped_mm``
fp8 only), so a float32 mixture-of-experts model (transformers 5 runs its experts through
``_grouped_mm`` by default) cannot run on meta or fake tensors. When the real kernel refuses
and an operand has no data, :func:`fallback` returns an empty output of the shape torch's own
meta kernel computes. The number of rows is the model's, not ours: transformers sends
tokens x k rows (each token to exactly k experts), so the MACs are exact whatever the
routing; only the split between experts (``offs``) is unknown.

``aten::_ctc_loss`` has no meta kernel. Its outputs are the loss per sequence ``(B,)`` and
the alpha lattice ``(B, T, 2 S + 1)`` kept for backward; its cost (and its backward's) is a
function of the input shapes and int-list lengths only (handlers/loss.py), so empty outputs
of those shapes give the CPU count exactly. S is the longest target: known for int-list
lengths, else the padded target length (2-D targets) or all targets (1-D), an upper bound
that only sizes the lattice tensor.

``aten::_nested_tensor_from_mask_left_aligned`` (no meta kernel) answers whether a padding
mask is left-aligned, which only decides whether ``nn.TransformerEncoder`` in eval may take
its nested-tensor fast path. The dispatch tracer never takes that path (its
TorchFunctionMode makes torch choose the padded one), so the answer cannot change the count:
the stand-in answers True and says so in the warnings.

Called by the dispatch tracer only after the real kernel raised, so it costs nothing on the
hot path. A fake step that runs without the dispatch tracer (``estimate_memory``'s, under
MemTracker) takes the same stand-ins through :class:`KernelStandIns`.

Two meta kernels accept their operands but give outputs whose storages differ from the real
kernel's: torch's ``aten::mkldnn_rnn_layer`` (``nn.LSTM`` on the CPU) returns an empty
workspace, where the oneDNN kernel makes one (kept for the backward) whose size only oneDNN
knows, and ``aten::mkldnn_rnn_layer_backward`` returns one bias gradient for both biases,
where the real kernel returns two. :class:`KernelStandIns` gives the fake step a workspace of
the real kernel's size (:func:`rnn_workspace_bytes`) and two bias gradients.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from flopcount.core.diagnostics import first_line
from flopcount.core.inputs import is_dataless
from flopcount.errors import FlopcountWarning

__all__ = [
    "CTC_NOTE", "LEFT_ALIGNED_NOTE", "ROUTING_NOTE", "CHECKED", "RealKernelError", "KernelStandIns", "check_like_cpu", "fallback",
    "refused_by_real_kernel",
]

_aten = torch.ops.aten


def _overloads(**dtypes: Optional[torch.dtype]) -> Dict[Any, Optional[torch.dtype]]:
    """op overload -> its output dtype when out_dtype is not given (None: the input's); ops
    this torch lacks (private ones may go) are left out."""
    found: Dict[Any, Optional[torch.dtype]] = {}
    for name, dtype in dtypes.items():
        packet = getattr(_aten, name, None)
        if packet is not None and hasattr(packet, "default"):
            found[packet.default] = dtype
    return found


_GROUPED = _overloads(_grouped_mm=None, _scaled_grouped_mm=torch.bfloat16)
_NONZERO = {_aten.nonzero.default}
_LEFT_ALIGNED = _overloads(_nested_tensor_from_mask_left_aligned=None)


def _all_overloads(name: str) -> Set[Any]:
    packet = getattr(_aten, name, None)
    return {getattr(packet, o) for o in ("default", "Tensor") if packet is not None and hasattr(packet, o)}


_CTC = _all_overloads("_ctc_loss")
_CTC_BACKWARD = _all_overloads("_ctc_loss_backward")

ROUTING_NOTE = (
    "mixture of experts on meta/fake tensors: routing is unknown, so aten::_grouped_mm ran as a shapes-only "
    "stand-in; its rows are the model's tokens x k (each token goes to exactly k experts), so the MACs are exact "
    "whatever the balance between experts"
)

LEFT_ALIGNED_NOTE = (
    "padding mask on meta/fake tensors: aten::_nested_tensor_from_mask_left_aligned has no meta kernel and was "
    "answered True (left-aligned); it only decides whether nn.TransformerEncoder may take its nested-tensor fast "
    "path, which this tracer does not take (the padded path is counted), so the count does not depend on it"
)

CTC_NOTE = (
    "CTC loss on meta/fake tensors: aten::_ctc_loss has no meta kernel, so a shapes-only stand-in made its outputs; "
    "its cost depends on the input shapes and lengths only, as on real tensors"
)


def _bound(func: Any, args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict:
    names = [a.name for a in func._schema.arguments]
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


def _grouped_mm_shape(a: torch.Tensor, b: torch.Tensor, offs: Any) -> Tuple[int, ...]:
    """The output shape torch's meta kernel gives (torch/_meta_registrations.py)."""
    if a.dim() == 2 and b.dim() == 2:
        groups = offs.size(0) if isinstance(offs, torch.Tensor) else 1
        return (groups, a.size(0), b.size(1))
    if a.dim() == 2:
        return (a.size(0), b.size(-1))
    if b.dim() == 2:
        return (a.size(1), b.size(1))
    return (a.size(0), a.size(1), b.size(-1))


def _ctc_outputs(bound: Mapping[str, Any], notes: Set[str], exc: BaseException) -> Tuple[torch.Tensor, torch.Tensor]:
    log_probs, targets, lengths = bound["log_probs"], bound["targets"], bound.get("target_lengths")
    if not isinstance(log_probs, torch.Tensor) or not isinstance(targets, torch.Tensor) or log_probs.dim() not in (2, 3):
        raise exc
    batch = log_probs.size(1) if log_probs.dim() == 3 else 1
    if isinstance(lengths, (list, tuple)) and lengths:
        longest = max(int(n) for n in lengths)
    else:
        longest = targets.size(-1) if targets.dim() == 2 else targets.numel()
    notes.add(CTC_NOTE)
    dtype, device = log_probs.dtype, log_probs.device
    lattice = (batch, log_probs.size(0), 2 * longest + 1)
    return torch.empty((batch,), dtype=dtype, device=device), torch.empty(lattice, dtype=dtype, device=device)


def fallback(
    func: Any, args: Tuple[Any, ...], kwargs: Mapping[str, Any], exc: BaseException, notes: Set[str], where: str = ""
) -> Any:
    """The output ``func`` would have produced on data-less operands, when torch's kernel
    refused them; re-raises ``exc`` for every other op or when the operands have data.
    ``where`` is the module running the op (it picks the hint of an error)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or not any(is_dataless(t) for t in tensors):
        raise exc
    if func in _GROUPED:
        bound = _bound(func, args, kwargs)
        a, b = bound["self"], bound["mat2"]
        if a.dim() not in (2, 3) or b.dim() not in (2, 3) or a.size(-1) != b.size(-2):
            raise exc
        dtype = bound.get("out_dtype") or _GROUPED[func] or a.dtype
        notes.add(ROUTING_NOTE)
        return torch.empty(_grouped_mm_shape(a, b, bound.get("offs")), dtype=dtype, device=a.device)
    if func in _CTC:
        return _ctc_outputs(_bound(func, args, kwargs), notes, exc)
    if func in _CTC_BACKWARD:  # the gradient of log_probs
        log_probs = _bound(func, args, kwargs)["log_probs"]
        notes.add(CTC_NOTE)
        return torch.empty(log_probs.shape, dtype=log_probs.dtype, device=log_probs.device)
    if func in _LEFT_ALIGNED:
        notes.add(LEFT_ALIGNED_NOTE)
        return True
    if func in _NONZERO:
        hint = "count with real weights and inputs (e.g. on the CPU)"
        if "expert" in where.lower():
            hint += (
                "; a transformers mixture-of-experts model can instead be built with "
                "experts_implementation='grouped_mm' (the default) or 'batched_mm', whose costs do not depend on the routing"
            )
        raise NeedsValues(
            f"nonzero() on a meta/fake tensor: its output size depends on the tensor's values, which meta tensors "
            f"do not have, so {hint}"
        ) from exc
    if isinstance(exc, NotImplementedError):  # no meta kernel, or a copy of the data out (.cpu(), .tolist())
        raise NeedsValues(f"{func._schema.name} on a meta/fake tensor ({type(exc).__name__}: {first_line(exc)})") from exc
    raise exc


class NeedsValues(NotImplementedError):
    """An op that cannot run on operands without data (meta or fake): it reads their values
    (``nonzero``; ``_to_copy`` to the CPU, which ``.cpu()``, ``.to("cpu")`` and ``.tolist()`` of
    a meta tensor run) or has no meta kernel. Raised by :func:`fallback`; the message says which
    op. The dispatch tracer's run on such tensors turns it into a
    :class:`~flopcount.errors.NeedsDataError` naming the module."""


class KernelStandIns(TorchDispatchMode):
    """:func:`fallback` for a fake step run without the dispatch tracer (``estimate_memory``'s
    step under MemTracker): an op whose meta kernel refuses its fake operands (a float32
    mixture-of-experts ``_grouped_mm``) is answered by its stand-in, an empty output of the
    shape and dtype the real kernel gives, which the modes below (MemTracker) see allocated as
    they would the real output. Entered last (innermost), so that it sees the refusal first.
    ``where()``: the module running (the hint of an error); the notes of the stand-ins taken
    are added to ``notes``. ``checks`` (a ``fake/indices.py`` ``IndexChecks``, or None): shown
    each op before and after it runs, it raises the real kernel's error for an index out of range;
    and so for operands of two dtypes the real CPU kernel refuses (:func:`check_like_cpu`)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as PrivateRandom: no dynamo-disabling shim around each op

    def __init__(self, notes: Set[str], where: Callable[[], str], checks: Any = None) -> None:
        super().__init__()
        self.notes = notes
        self.where = where
        self.checks = checks

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        checks = self.checks
        if checks is not None and id(func) in checks.indexed:  # an op that reads through an index
            checks.before(func, args, kwargs)
        if func in CHECKED:  # operands of two dtypes the meta kernel accepts (a float16 input, a float32 Linear)
            check_like_cpu(func, args, kwargs)
        try:
            out = func(*args, **(kwargs or {}))
        except Exception as exc:
            return fallback(func, args, kwargs or {}, exc, self.notes, self.where())
        if checks is not None:
            checks.after(func, args, kwargs, out)
        if func is _RNN_LAYER:  # None where this torch lacks the op: never an op that runs
            return _with_real_workspace(args, kwargs or {}, out, self.notes)
        if func is _RNN_LAYER_BACKWARD:
            return _own_bias_gradients(out)
        return out


def _default_overload(name: str) -> Any:
    """``aten::<name>.default``, or None where this torch has no such op (a build without oneDNN)."""
    return getattr(getattr(_aten, name, None), "default", None)


_RNN_LAYER = _default_overload("mkldnn_rnn_layer")
_RNN_LAYER_BACKWARD = _default_overload("mkldnn_rnn_layer_backward")


def _own_bias_gradients(out: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """``mkldnn_rnn_layer_backward``'s fake outputs with the two bias gradients (the fourth and
    fifth) apart: torch's meta kernel returns one tensor twice, where the CPU kernel returns two
    (their values are equal, their storages not), so the fake step held one bias gradient fewer
    until the second bias's gradient was accumulated (a copy there)."""
    first, second = out[3], out[4]
    if not (isinstance(second, torch.Tensor) and first is second and is_dataless(second)):
        return out
    return (*out[:4], second.new_empty(second.shape), *out[5:])


def _with_real_workspace(
    args: Tuple[Any, ...], kwargs: Mapping[str, Any], out: Tuple[Any, ...], notes: Set[str],
) -> Tuple[Any, ...]:
    """``mkldnn_rnn_layer``'s fake outputs with its workspace (the fourth, kept for the backward)
    as large as the CPU kernel makes it: torch's meta kernel returns an empty one, so an LSTM's
    training step was short by one workspace per layer and direction (180,224 B for 10 steps x
    batch 4 x 64 hidden units). A probe of :data:`PROBE_NOTED_FLOPS` or more is said in ``notes`` (the estimate's warnings)."""
    output, hy, cy, workspace = out
    if not (isinstance(workspace, torch.Tensor) and workspace.numel() == 0 and is_dataless(workspace)
            and _on_fake_cpu(list(args[:7]))):
        return out
    bound = _bound(_RNN_LAYER, args, kwargs)
    tensors = tuple((tuple(bound[name].shape), bound[name].dtype) for name in _RNN_TENSORS)
    scalars = tuple(tuple(v) if isinstance(v, list) else v for v in (bound[name] for name in _RNN_SCALARS))
    grad = torch.is_grad_enabled()
    words = rnn_probe_words(tensors) if grad else None
    if words is not None:
        notes.add(f"sizing oneDNN's LSTM workspace ran {words} once for real on the CPU ({_PROBE_WHY})")
    size = rnn_workspace_bytes(tensors, scalars, grad)
    if size == 0:
        return out
    return output, hy, cy, workspace.new_empty((size,))


_RNN_TENSORS = ("input", "weight0", "weight1", "weight2", "weight3", "hx_", "cx_")
_RNN_SCALARS = ("reverse", "batch_sizes", "mode", "hidden_size", "num_layers", "has_biases", "bidirectional",
                "batch_first", "train")
#: the work of a workspace probe (one real CPU layer) from which it is said (a warning before it
#: runs, a note on the estimate): 10^11 FLOPs, seconds to minutes on a few CPU cores
PROBE_NOTED_FLOPS = 10**11


def rnn_probe_cost(tensors: Tuple[Tuple[Tuple[int, ...], torch.dtype], ...]) -> Tuple[int, int]:
    """(FLOPs, bytes) of :func:`rnn_workspace_bytes`' real run of ``mkldnn_rnn_layer`` on operands
    of these (shape, dtype)s (:data:`_RNN_TENSORS`' order): the gates' products, 2 x (steps x
    rows) x (the input weight's + the hidden weight's elements); the zero operands it makes and
    the output sequence (steps x rows x hidden)."""
    (input_shape, dtype), (w_ih, _), (w_hh, _) = tensors[0], tensors[1], tensors[2]
    rows = _product(input_shape[:-1])  # steps x batch
    flops = 2 * rows * (_product(w_ih) + _product(w_hh))
    hidden = w_hh[-1] if w_hh else 0
    size = torch.empty((), dtype=dtype).element_size()
    return flops, size * (sum(_product(shape) for shape, _ in tensors) + rows * hidden)


def rnn_probe_words(tensors: Tuple[Tuple[Tuple[int, ...], torch.dtype], ...]) -> Optional[str]:
    """The layer a probe of at least :data:`PROBE_NOTED_FLOPS` runs, in words (None: a smaller one)."""
    flops, size = rnn_probe_cost(tensors)
    if flops < PROBE_NOTED_FLOPS:
        return None
    (input_shape, _), (w_hh, _) = tensors[0], tensors[2]
    return (f"a layer (input {list(input_shape)}, hidden {w_hh[-1]}: {flops / 1e9:,.0f} GFLOP, "
            f"{size / 2**30:,.2f} GiB of zero tensors)")


#: why the probe runs, said after each of its announcements
_PROBE_WHY = "once per layer shape in the process; torch's meta kernel gives no workspace size"


def _product(shape: Tuple[int, ...]) -> int:
    total = 1
    for extent in shape:
        total *= extent
    return total


@functools.lru_cache(maxsize=256)
def rnn_workspace_bytes(tensors: Tuple[Tuple[Tuple[int, ...], torch.dtype], ...], scalars: Tuple[Any, ...], grad: bool) -> int:
    """Bytes of the workspace the CPU kernel of ``mkldnn_rnn_layer`` makes for operands of these
    (shape, dtype)s and these scalar arguments, in grad mode ``grad`` (it makes none without):
    oneDNN sizes it (``workspace_desc().get_size()``), so the real kernel runs once on zero
    tensors of those shapes, with every dispatch mode off (as :func:`check_like_cpu` probes).
    0 when the real kernel refuses them. A large probe (:func:`rnn_probe_words`) is announced by
    a :class:`~flopcount.errors.FlopcountWarning` before it runs (it may take minutes)."""
    words = rnn_probe_words(tensors) if grad else None
    if words is not None:
        warnings.warn(f"estimate_memory: sizing oneDNN's LSTM workspace runs {words} once for real on the CPU now: "
                      f"this may take a while ({_PROBE_WHY})", FlopcountWarning, stacklevel=2)
    with torch._C._DisableTorchDispatch():
        operands = [torch.zeros(shape, dtype=dtype) for shape, dtype in tensors]
        try:
            with torch.set_grad_enabled(grad):
                made = _RNN_LAYER(*operands, *(list(v) if isinstance(v, tuple) else v for v in scalars))
        except Exception:
            return 0
    workspace = made[3]
    return int(workspace.untyped_storage().nbytes()) if isinstance(workspace, torch.Tensor) else 0


# -- the real kernels' dtype checks, on fake CPU tensors -----------------------------------

#: op -> the arguments its CPU kernel requires to share one dtype, where torch's meta kernel
#: (what a FakeTensor runs) does not check it: on fake tensors a Linear with int64 inputs
#: or half weights and float inputs would be counted although the real call raises.
_SAME_DTYPE_ARGS: Dict[str, Tuple[str, ...]] = {
    "mm": ("self", "mat2"),
    "addmm": ("self", "mat1", "mat2"),
    "bmm": ("self", "mat2"),
    "baddbmm": ("self", "batch1", "batch2"),
    "addbmm": ("self", "batch1", "batch2"),
    "mv": ("self", "vec"),
    "addmv": ("self", "mat", "vec"),
    "dot": ("self", "tensor"),
    "vdot": ("self", "other"),
    "convolution": ("input", "weight", "bias"),
    "_convolution": ("input", "weight", "bias"),
    "conv_tbc": ("self", "weight", "bias"),
    "native_layer_norm": ("input", "weight", "bias"),
    "native_group_norm": ("input", "weight", "bias"),
    "native_batch_norm": ("input", "weight", "bias", "running_mean", "running_var"),
    "_native_batch_norm_legit": ("input", "weight", "bias", "running_mean", "running_var"),
    "_native_batch_norm_legit_no_training": ("input", "weight", "bias", "running_mean", "running_var"),
    "_native_batch_norm_legit_functional": ("input", "weight", "bias", "running_mean", "running_var"),
    "_batch_norm_with_update": ("input", "weight", "bias", "running_mean", "running_var"),
    "_scaled_dot_product_flash_attention_for_cpu": ("query", "key", "value"),
    "_prelu_kernel": ("self", "weight"),
    "rnn_tanh_cell": ("input", "hx", "w_ih", "w_hh", "b_ih", "b_hh"),
    "rnn_relu_cell": ("input", "hx", "w_ih", "w_hh", "b_ih", "b_hh"),
    "gru_cell": ("input", "hx", "w_ih", "w_hh", "b_ih", "b_hh"),
    "lstm_cell": ("input", "hx", "w_ih", "w_hh", "b_ih", "b_hh"),
    "lstm": ("input", "hx", "params"),
    "gru": ("input", "hx", "params"),
}


def _checked_overloads() -> Dict[Any, Tuple[int, ...]]:
    """overload -> positions of its same-dtype arguments (ops this torch lacks are left out)."""
    found: Dict[Any, Tuple[int, ...]] = {}
    for name, wanted in _SAME_DTYPE_ARGS.items():
        packet = getattr(_aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            names = [a.name for a in op._schema.arguments]
            positions = tuple(names.index(arg) for arg in wanted if arg in names)
            if positions:
                found[op] = positions
    return found


CHECKED = _checked_overloads()
#: (op, operand dtypes and ranks) -> None when the real CPU kernel accepted them; the real
#: kernel's dtype checks depend on the dtypes, not on the sizes, so one probe per key.
_ACCEPTED: Dict[Tuple[Any, ...], None] = {}
_PROBE_ELEMENTS = 1 << 12  # larger operands are probed as stride-0 views of one element


def _operand_dtypes(value: Any, dtypes: List[torch.dtype]) -> None:
    if isinstance(value, torch.Tensor):
        dtypes.append(value.dtype)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _operand_dtypes(item, dtypes)


def _probe(value: Any, written: bool = False) -> Any:
    """A real CPU tensor of ``value``'s shape and dtype: zeros, as a stride-0 view of one
    element when large, unless the kernel writes to it (BatchNorm's running statistics)."""
    if isinstance(value, torch.Tensor):
        if written or value.numel() <= _PROBE_ELEMENTS:
            return torch.zeros(value.shape, dtype=value.dtype)
        return torch.zeros((), dtype=value.dtype).expand(value.shape)
    if isinstance(value, (list, tuple)):
        return type(value)(_probe(item, written) for item in value)
    return value


def _written(func: Any) -> Set[str]:
    return {a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write}


def _on_fake_cpu(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        fake_cpu = getattr(value, "fake_device", value.device).type == "cpu"
        return is_dataless(value) and fake_cpu and value.layout == torch.strided
    if isinstance(value, (list, tuple)):
        return all(_on_fake_cpu(item) for item in value)
    return True


def check_like_cpu(func: Any, args: Tuple[Any, ...], kwargs: Optional[Mapping[str, Any]]) -> None:
    """Raise what the real CPU kernel of ``func`` raises for these operands' dtypes, where its
    meta kernel would accept them (``_SAME_DTYPE_ARGS``); a no-op for every other op, for
    operands of one dtype, and off the CPU (another device's kernel has other rules).

    Only when the dtypes differ, the real kernel runs once per (op, dtypes, ranks) on zero
    tensors of the operands' shapes (stride-0 views of one element when large), with every
    dispatch mode off: if it raises, so would the real call, with this message."""
    positions = CHECKED.get(func)
    if positions is None:
        return
    dtypes: List[torch.dtype] = []
    for index in positions:
        if index < len(args):
            _operand_dtypes(args[index], dtypes)
    if len(set(dtypes)) < 2:
        return
    key = (func, tuple(dtypes), tuple(a.dim() if isinstance(a, torch.Tensor) else type(a) for a in args))
    if key in _ACCEPTED or not all(_on_fake_cpu(a) for a in args) or (kwargs and not all(_on_fake_cpu(v) for v in kwargs.values())):
        return
    with torch._C._DisableTorchDispatch():
        written = _written(func)
        names = [a.name for a in func._schema.arguments]
        real_args = [_probe(a, i < len(names) and names[i] in written) for i, a in enumerate(args)]
        real_kwargs = {name: _probe(v, name in written) for name, v in (kwargs or {}).items()}
        try:
            with torch.no_grad():
                func(*real_args, **real_kwargs)
        except Exception as exc:
            raise RealKernelError(exc) from exc
    _ACCEPTED[key] = None


class RealKernelError(RuntimeError):
    """The real kernel refused operands its meta kernel accepted; ``error`` is its exception
    (its type and message are the real call's)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def refused_by_real_kernel(exc: BaseException) -> Optional[BaseException]:
    """The real kernel's own exception when a fake run failed on its checks (the dtype checks of
    :func:`check_like_cpu`, the index ranges of ``fake/indices.py``), somewhere in the exception's
    chain; None otherwise."""
    seen: Set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RealKernelError):
            return current.error
        current = current.__cause__ or current.__context__
    return None
