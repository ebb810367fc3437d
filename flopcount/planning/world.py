"""torch's distributed engine, as :func:`flopcount.plan` uses it: a fake world of N ranks in
one process, its DeviceMesh, and FSDP2 / tensor parallelism applied to a model.

Nothing here models FSDP or TP: ``fully_shard`` and ``parallelize_module`` shard the
model exactly as on a cluster; the ``"fake"`` process group answers every collective
without sending anything. It is made through public torch only: ``init_process_group`` with
``Backend.FAKE`` and no store (torch then registers the backend and makes its own no-op store).
Private torch symbols are looked up by :func:`private`, so a torch that lost one fails with an
error naming it (the rest of flopcount keeps working).

Threads: the fake world is the process's default process group while it lasts, so plans run one
at a time (a lock): a second thread's ``plan`` waits for the first, then runs as it would alone.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from flopcount.core.diagnostics import first_line
from flopcount.errors import FlopcountError, TensorParallelPlanError, UsageError
from flopcount.planning.tp_conv1d import gpt2_tp_plan, is_gpt2_block
from flopcount.planning.tp_mha import encoder_tp_plan

#: name -> (module, attribute) of each private torch symbol plan() relies on
PRIVATE: Dict[str, Tuple[str, str]] = {
    "FSDPMemTracker": ("torch.distributed._tools.fsdp2_mem_tracker", "FSDPMemTracker"),
    "MemTracker": ("torch.distributed._tools.mem_tracker", "MemTracker"),
    "active_fake_mode": ("torch._guards", "active_fake_mode"),
}


class PlanError(FlopcountError, RuntimeError):
    """plan() cannot run on this torch: a private piece of torch it builds on is missing."""


def private(name: str) -> Any:
    """The private torch symbol ``name`` (a key of :data:`PRIVATE`), or a PlanError naming it."""
    module_name, attribute = PRIVATE[name]
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise PlanError(
            f"flopcount.plan needs torch's private {module_name}.{attribute}, which torch "
            f"{torch.__version__} does not have ({type(exc).__name__}: {exc}); count_flops and "
            "estimate_memory are unaffected"
        ) from exc


def _distributed() -> Any:
    import torch.distributed as dist

    if not dist.is_available():
        raise PlanError(f"flopcount.plan needs torch.distributed, which this torch {torch.__version__} build lacks")
    return dist


#: one fake world at a time in this process: it is the default process group while it lasts
_WORLD_LOCK = threading.Lock()
_world_owner: List[int] = []  # the thread holding the fake world (empty when none)


@contextlib.contextmanager
def fake_world(fsdp: int, tp: int) -> Iterator[Any]:
    """A ``"fake"`` default process group of ``fsdp * tp`` ranks (this process is rank 0)
    and its DeviceMesh: dims ("dp", "tp") when both are > 1, else the one that is, else
    None. The group is destroyed on exit. An existing default group is left alone: this
    raises a UsageError instead of replacing it. Another thread's fake world is waited for
    (one at a time); a plan inside a plan on the same thread is a UsageError."""
    dist = _distributed()
    if _world_owner and _world_owner[0] == threading.get_ident():
        raise UsageError("plan() was called while this thread is already inside plan() (from the model's build or forward)")
    with _WORLD_LOCK:
        _world_owner.append(threading.get_ident())
        try:
            with _one_world(dist, fsdp, tp) as mesh:
                yield mesh
        finally:
            _world_owner.clear()


@contextlib.contextmanager
def _one_world(dist: Any, fsdp: int, tp: int) -> Iterator[Any]:
    if dist.is_initialized():
        raise UsageError(
            f"a default process group is already initialised (backend {dist.get_backend()}, world size "
            f"{dist.get_world_size()}); plan() makes a fake world of its own and will not replace yours: "
            "call it before init_process_group, after destroy_process_group, or in another process"
        )
    # init_process_group wraps sys.excepthook (a "[rank0]: " prefix on every traceback line) and
    # destroy_process_group leaves the wrapper: put the process's own hook back each time
    excepthook = sys.excepthook
    try:
        # public: with no store, torch imports its fake backend and makes a no-op store itself
        dist.init_process_group(dist.Backend.FAKE, rank=0, world_size=fsdp * tp)
    except (ValueError, RuntimeError, AttributeError, ImportError, AssertionError) as exc:
        sys.excepthook = excepthook
        raise PlanError(f"torch {torch.__version__} has no usable 'fake' process-group backend: {exc}") from exc
    try:
        yield device_mesh(fsdp, tp)
    finally:
        try:
            dist.destroy_process_group()
        finally:
            sys.excepthook = excepthook


def device_mesh(fsdp: int, tp: int) -> Any:
    """The CPU DeviceMesh of a world already initialised: 2-D ("dp", "tp"), 1-D, or None (1 rank)."""
    from torch.distributed.device_mesh import init_device_mesh

    dims = [(name, size) for name, size in (("dp", fsdp), ("tp", tp)) if size > 1]
    if not dims:
        return None
    return init_device_mesh("cpu", tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims))


def mesh_groups(mesh: Any) -> Dict[str, Tuple[str, int]]:
    """``{process group name: (mesh dim name, group size)}`` for each dim of ``mesh``."""
    groups = {name: mesh.get_group(name) for name in mesh.mesh_dim_names} if mesh is not None else {}
    return {group.group_name: (name, group.size()) for name, group in groups.items()}


# ----------------------------------------------------------------------- the model


def transformer_blocks(model: nn.Module) -> Tuple[str, List[nn.Module]]:
    """The repeated blocks FSDP2 wraps one by one: the items of the ModuleList holding the
    most parameters whose items all share one class (``model.layers``, ``transformer.h``,
    ``encoder.layers``). ``("", [])`` when the model has none."""
    best: Tuple[int, str, List[nn.Module]] = (0, "", [])
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        items = list(module)
        if len({type(item) for item in items}) != 1:
            continue
        size = sum(p.numel() for p in module.parameters())
        if size > best[0]:
            best = (size, name, items)
    return best[1], best[2]


#: the Linears the LLaMA-family plan splits, by the sub-block holding them
LLAMA_LINEARS: Dict[str, Tuple[str, ...]] = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


#: the Megatron split of a LLaMA-family block, as ``(path, style)`` (:func:`tp_styles`); its
#: attention takes the hidden states by keyword
LLAMA_SPLIT: Tuple[Tuple[str, str], ...] = (
    ("self_attn", "replicate hidden_states"), ("self_attn.q_proj", "colwise"), ("self_attn.k_proj", "colwise"),
    ("self_attn.v_proj", "colwise"), ("self_attn.o_proj", "rowwise"), ("mlp", "replicate"), ("mlp.gate_proj", "colwise"),
    ("mlp.up_proj", "colwise"), ("mlp.down_proj", "rowwise"),
)


def tp_styles(where: str, split: Sequence[Tuple[str, str]]) -> Dict[str, Any]:
    """``parallelize_module``'s plan of a split: ``{f"{where}.{path}": ParallelStyle}``, a style
    "colwise" (``ColwiseParallel``), "rowwise" (``RowwiseParallel``), "replicate" (the module's
    first input made a replicated DTensor once: ``PrepareModuleInput``) or "replicate NAME"
    (its keyword input NAME)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    replicate = Replicate()

    def style(kind: str) -> Any:
        if kind == "colwise":
            return ColwiseParallel()
        if kind == "rowwise":
            return RowwiseParallel()
        if kind == "replicate":
            return PrepareModuleInput(input_layouts=(replicate,), desired_input_layouts=(replicate,))
        name = kind.split()[1]
        return PrepareModuleInput(input_kwarg_layouts={name: replicate}, desired_input_kwarg_layouts={name: replicate})

    return {f"{where}.{path}": style(kind) for path, kind in split}


def builtin_tp_plan(model: nn.Module, tp: int) -> Dict[str, Any]:
    """A Megatron-style ``parallelize_module`` plan for the model's repeated blocks.

    LLaMA-family blocks (``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``: LLaMA,
    Mistral, Qwen2...): the attention and MLP inputs are made replicated DTensors once
    (so backward all-reduces their gradient once, as Megatron's fused QKV does), q/k/v,
    gate and up are column-parallel, o and down row-parallel. ``nn.TransformerEncoderLayer``:
    its packed ``nn.MultiheadAttention`` is swapped in place for separate q/k/v/out Linears by
    :func:`encoder_tp_plan` (the same computation), then q/k/v and ``linear1`` column-,
    ``out_proj`` and ``linear2`` row-parallel. GPT-2-style blocks (``attn.c_attn``/``c_proj``, ``mlp.c_fc``/``c_proj``, all
    transformers ``Conv1D``): rewritten in place as Linears by :func:`gpt2_tp_plan` (the same
    computation), then the same Megatron split. Embeddings and the output head are not
    tensor-parallel (FSDP shards them).
    """
    prefix, blocks = transformer_blocks(model)
    if not blocks:
        raise TensorParallelPlanError(
            f"no built-in tensor-parallel plan for {type(model).__name__}: no ModuleList of repeated blocks found"
        )
    block = blocks[0]
    where = f"{prefix}.*" if prefix else "*"
    if not _missing_llama_linears(block):
        _check_llama_split(prefix, blocks, tp)
        return tp_styles(where, LLAMA_SPLIT)
    if is_gpt2_block(block):
        return tp_styles(where, gpt2_tp_plan(where, blocks, tp))
    if isinstance(block, nn.TransformerEncoderLayer):
        return tp_styles(where, encoder_tp_plan(where, blocks, tp))
    raise TensorParallelPlanError(
        f"no built-in tensor-parallel plan for blocks of type {type(block).__name__} in '{prefix}' "
        "(built in: LLaMA-family q/k/v/o_proj + gate/up/down_proj blocks, GPT-2-style Conv1D "
        "attn.c_attn/c_proj + mlp.c_fc/c_proj blocks, nn.TransformerEncoderLayer)"
    )


def takes_llama_split(model: nn.Module) -> bool:
    """Whether :func:`builtin_tp_plan` gives ``model`` the LLaMA-family split (its first
    repeated block holds the Linears of :data:`LLAMA_LINEARS`)."""
    _, blocks = transformer_blocks(model)
    return bool(blocks) and not _missing_llama_linears(blocks[0])


def split_refusal(failure: BaseException, model: nn.Module, prefix: str, tp: int,
                  runs_unsplit: Callable[[], bool]) -> Optional[TensorParallelPlanError]:
    """The refusal of a model whose own code cannot run under the LLaMA-family split, read
    from ``failure``, what its step (``model`` parallelised by that split, its blocks at
    ``prefix``) raised; None where the failure may be anyone else's.

    Refused when three things hold: the error was raised under the code of a module of a
    repeated block (a frame of the traceback runs that module's method: StableLM's attention
    viewing q with the full head count, DiffLlama's unpacking a rank's one key/value head in
    two), the code that raised it (the innermost frame) is not flopcount's (the model's, or
    torch's on its behalf: not a failure of flopcount's recorder), and the same step runs with tp=1
    (``runs_unsplit``, called last: the split is what the code cannot take). The check from
    parameters (:func:`_check_llama_split`) cannot see such code: it reads sizes, not views."""
    where = _raising_block_module(failure, model, prefix)
    if not where or not runs_unsplit():
        return None
    return TensorParallelPlanError(
        "the model's code does not run under the built-in LLaMA-family tensor-parallel split "
        f"(each of tp={tp} ranks holding 1/{tp} of the heads and of q/k/v's columns): {where} raised "
        f"{type(failure).__name__}: {first_line(failure)} (the same step with tp=1 runs)"
    )


def _raising_block_module(failure: BaseException, model: nn.Module, prefix: str) -> str:
    """``"path (Type)"`` of the innermost module of a repeated block (under ``prefix``) whose
    method is a frame of ``failure``'s traceback; "" when there is none, or when the innermost
    frame, the code that raised, is flopcount's own (its example models aside): flopcount's
    dispatch modes run under every op of the block, and their failure may be ours."""
    names = {id(module): name for name, module in model.named_modules()}
    under = f"{prefix}." if prefix else ""
    found = ""
    raiser = ""
    tb = failure.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        name = names.get(id(owner), "") if isinstance(owner, nn.Module) else ""
        if name.startswith(under) and name != prefix:
            found = f"{name} ({type(owner).__name__})"
        raiser = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return "" if _flopcount_code(raiser) else found


def _flopcount_code(filename: str) -> bool:
    """Whether ``filename`` is a file of the flopcount package, its example models aside."""
    package = Path(__file__).resolve().parents[1]
    path = Path(filename).resolve() if not filename.startswith("<") else None
    return path is not None and package in path.parents and package / "examples" not in path.parents


def _missing_llama_linears(block: nn.Module) -> List[str]:
    """The paths of :data:`LLAMA_LINEARS` that are not an ``nn.Linear`` of ``block``."""
    return [
        f"{part}.{name}" for part, names in LLAMA_LINEARS.items() for name in names
        if not isinstance(getattr(getattr(block, part, None), name, None), nn.Linear)
    ]


def _check_llama_split(prefix: str, blocks: List[nn.Module], tp: int) -> None:
    """Refuse (a UsageError) a block the LLaMA-family split cannot take, before anything is traced.

    Column-parallel q/k/v give each rank ``heads / tp`` query and ``kv_heads / tp`` key/value
    heads of ``head_dim`` columns: both must divide by ``tp``, or the block's reshape fails. And
    each rank holds only its share of every size the split shards: the q, k and v columns, the
    head counts, the MLP's intermediate size. So ``self_attn`` and ``mlp`` may hold no parameter
    (directly or in a submodule) other than the split Linears that has one of those sizes as a
    dimension, save a per-head one (``numel == head_dim``: Qwen3's q_norm): a norm over all the
    heads' columns (OLMo-2's q_norm, BitNet's attn_sub_norm and ffn_sub_norm) or a projection over
    the key/value heads (Doge's dt_proj and A) is a whole tensor where the rank has a slice, and
    the step fails (a real TP run of the same plan too)."""
    for index, block in enumerate(blocks):
        where = f"{prefix}.{index}" if prefix else str(index)
        missing = _missing_llama_linears(block)
        if missing:
            raise TensorParallelPlanError(
                f"the built-in LLaMA-family tensor-parallel plan splits every block of {prefix or 'the model'} alike, "
                f"but block {where} has no nn.Linear {', '.join(missing)} (its first block has them)"
            )
        attn: Any = block.self_attn
        mlp: Any = block.mlp
        q, k = int(attn.q_proj.out_features), int(attn.k_proj.out_features)
        # size -> what it is ("the output columns of k_proj and v_proj" where two are equal)
        projections_of: Dict[int, List[str]] = {}
        for name in ("q_proj", "k_proj", "v_proj"):
            projections_of.setdefault(int(getattr(attn, name).out_features), []).append(name)
        attn_sizes = {size: f"the output columns of {' and '.join(names)}" for size, names in projections_of.items()}
        head_dim = getattr(attn, "head_dim", None)
        per_head: Optional[int] = None
        if isinstance(head_dim, int) and head_dim > 0 and not q % head_dim and not k % head_dim:
            heads, kv_heads = q // head_dim, k // head_dim
            if heads % tp or kv_heads % tp:
                raise TensorParallelPlanError(
                    f"the built-in LLaMA-family tensor-parallel plan needs the attention heads and the key/value heads "
                    f"divisible by tp={tp} ({prefix} item {index}: {heads} heads, {kv_heads} key/value heads of "
                    f"head_dim {head_dim})",
                    choice="choose a tp that divides both",
                )
            per_head = head_dim
            attn_sizes.setdefault(heads, "the attention heads")
            attn_sizes.setdefault(kv_heads, "the key/value heads")
        # else: not the transformers layout; the head counts are not known (the columns still are)
        intermediate = int(mlp.up_proj.out_features)
        mlp_sizes = {intermediate: "the intermediate size (the output columns of gate_proj and up_proj)"}
        _refuse_unsplit(where, "self_attn", attn, attn_sizes, per_head, tp)
        _refuse_unsplit(where, "mlp", mlp, mlp_sizes, None, tp)


def _refuse_unsplit(where: str, part: str, module: nn.Module, sharded: Dict[int, str], per_head: Optional[int],
                    tp: int) -> None:
    """A UsageError naming a parameter of ``module`` (block ``where``'s ``part``) outside its
    split Linears with a dimension in ``sharded`` (size -> what it is), a per-head one
    (``numel == per_head``) excepted. The sizes are tried in ``sharded``'s order, the column
    widths before the head counts: a small head count can equal a kernel size by chance."""
    split = LLAMA_LINEARS[part]
    others = [(name, parameter) for name, parameter in module.named_parameters()
              if name.split(".")[0] not in split and parameter.numel() != per_head]
    for size, what in sharded.items():
        for name, parameter in others:
            if size in parameter.shape:
                raise TensorParallelPlanError(
                    f"the built-in LLaMA-family tensor-parallel plan gives each of tp={tp} ranks 1/{tp} of {what} "
                    f"({size}) in {where}.{part}, but its parameter {name} (shape {list(parameter.shape)}) spans all "
                    f"{size}, which a rank's share cannot take"
                )


def parallelize(
    model: nn.Module,
    mesh: Any,
    fsdp: int,
    tp: int,
    tp_plan: Optional[Mapping[str, Any]] = None,
    mixed_precision: Optional[torch.dtype] = None,
) -> Tuple[str, int]:
    """Apply TP (``tp > 1``: ``tp_plan`` or :func:`builtin_tp_plan`) and then FSDP2
    (``fsdp > 1``: ``fully_shard`` on each repeated block, then on the root), in place.
    ``mixed_precision``: FSDP2's ``MixedPrecisionPolicy(param_dtype=that, reduce_dtype=float32)``.
    Returns the blocks' ModuleList path and how many blocks were wrapped."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    prefix, blocks = transformer_blocks(model)
    if tp > 1:
        plan = dict(tp_plan) if tp_plan is not None else builtin_tp_plan(model, tp)
        parallelize_module(model, mesh["tp"], plan)
    elif tp_plan is not None:
        raise UsageError("tp_plan is only used with tp > 1")
    if fsdp > 1:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dp = mesh["dp"]
        policy = MixedPrecisionPolicy(param_dtype=mixed_precision, reduce_dtype=torch.float32 if mixed_precision else None)
        for block in blocks:
            fully_shard(block, mesh=dp, mp_policy=policy)
        fully_shard(model, mesh=dp, mp_policy=policy)
        return prefix, len(blocks)
    check_mixed_precision(mixed_precision, fsdp)
    return prefix, 0


def check_mixed_precision(mixed_precision: Any, fsdp: int) -> None:
    """UsageError for a ``mixed_precision`` (given: not None) without ``fsdp > 1``: FSDP2 applies
    it, so a plan without FSDP has nothing to apply it with."""
    if mixed_precision is not None and fsdp <= 1:
        raise UsageError("mixed_precision is FSDP2's MixedPrecisionPolicy: it needs fsdp > 1 (or cast the model in build)")
