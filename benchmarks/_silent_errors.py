"""Helpers shared by the silent-error sweeps (``silent_errors_wild3.py``, ``silent_errors_wild4.py``):
FlopCounterMode run live on a copy of the model, flopcount under one tracer, and one printed line
per case comparing them (and a hand count where given)."""

import copy

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import flopcount


def fcm(model, args, backward=False, loss=None):
    m = copy.deepcopy(model)
    args = copy.deepcopy(args)
    with FlopCounterMode(display=False) as c:
        out = m(*args)
        if backward:
            total = loss(out) if loss else _sum(out)
            total.backward()
    return c.get_total_flops(), {str(k): v for k, v in c.get_flop_counts()["Global"].items()}


def _sum(out):
    if isinstance(out, torch.Tensor):
        return out.sum()
    return sum(o.sum() for o in out if isinstance(o, torch.Tensor) and o.requires_grad)


def fc(model, args, tracer, backward=False, loss=None):
    try:
        r = flopcount.count_flops(model, tuple(args), tracer=tracer, backward=backward, loss_fn=loss)
        return 2 * r.macs, r
    except Exception as e:
        return "ERR " + type(e).__name__ + ": " + str(e).splitlines()[0][:150], None


def check(name, model, args, backward=False, tracers=("auto", "dispatch", "jit"), loss=None, expect=None):
    try:
        t, per = fcm(model, args, backward, loss)
    except Exception as e:
        t, per = "ERR " + str(e)[:100], {}
    row = [name + (" +bwd" if backward else ""), f"fcm={t}"]
    if expect is not None:
        row.append(f"hand={expect}")
    rs = {}
    for tr in tracers:
        if backward and tr == "jit":
            continue
        v, r = fc(model, args, tr, backward, loss)
        rs[tr] = r
        ok = "ok" if v == (expect if expect is not None else t) else "DIFF"
        row.append(f"{tr}={v} {ok}")
    print(" | ".join(row), flush=True)
    if any("DIFF" in x for x in row):
        print("   fcm per-op:", per)
        for tr, r in rs.items():
            if r is not None:
                print(f"   {tr} macs by op:", {k: v for k, v in r.by_operator("macs").items() if v})
                if r.warnings:
                    print("   warnings:", [str(w)[:200] for w in r.warnings][:3])
    return rs


def check_flops(name, model, args, expect, backward=False, tracers=("auto", "dispatch", "jit"), op=None, field="flops"):
    """One line: flopcount's ``field`` (the total, or operator ``op``'s) per tracer against the
    hand count ``expect``; "ok" when equal, else "DIFF" and the per-operator figures."""
    row = [name + (" +bwd" if backward else ""), f"hand={expect}" + (f" ({op})" if op else "")]
    rs = {}
    for tr in tracers:
        if backward and tr == "jit":
            continue
        _, r = fc(model, args, tr, backward)
        rs[tr] = r
        if r is None:
            row.append(f"{tr}=ERR DIFF")
            continue
        got = r.by_operator(field).get(op, 0) if op else getattr(r, field)
        incomplete = "" if r.complete else " INCOMPLETE"
        row.append(f"{tr}={got}{incomplete} {'ok' if got == expect and not incomplete else 'DIFF'}")
    print(" | ".join(row), flush=True)
    if any("DIFF" in x for x in row):
        for tr, r in rs.items():
            if r is not None:
                print(f"   {tr} {field} by op:", {k: v for k, v in r.by_operator(field).items() if v})
    return rs


class Ops(nn.Module):
    """A module whose forward is a plain function: an op-level case run as a model."""

    def __init__(s, f):
        super().__init__()
        s.f = f

    def forward(s, *a):
        return s.f(*a)


#: docs/conventions.md's FLOPs per element of the ops an optimizer step runs (the step oracle's prices)
STEP_PRICES = {n: 1 for n in "add add_ sub sub_ rsub mul mul_ div div_ neg sqrt sqrt_ sign sign_ abs maximum pow".split()}
STEP_PRICES.update({"addcmul": 2, "addcmul_": 2, "addcdiv_": 2, "lerp_": 3, "lerp": 3})
#: ops a step runs that cost nothing by the conventions (bookkeeping, copies, fills)
STEP_FREE = {"_local_scalar_dense", "_record_function_enter_new", "_record_function_exit", "copy_", "clone",
             "zeros_like", "zero_"}


class StepOps(TorchDispatchMode):
    """A real optimizer step's op stream priced by :data:`STEP_PRICES` (``flops``); any op neither
    priced nor free is listed in ``unpriced`` (the oracle would be incomplete)."""

    def __init__(s):
        super().__init__()
        s.flops, s.unpriced = 0, set()

    def __torch_dispatch__(s, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[1]
        if name in STEP_PRICES:
            s.flops += STEP_PRICES[name] * (out if isinstance(out, torch.Tensor) else args[0]).numel()
        elif name not in STEP_FREE:
            s.unpriced.add(name)
        return out
