"""Silent wrong numbers on real code, eighth pass (branch wild8): the readings beyond the forward
count, each against an oracle run live.

* ``count_flops(..., backward=True)`` against FlopCounterMode around a real forward + backward
  (custom autograd Functions, checkpointing, frozen parts, tied weights, micro-batches, losses,
  autocast, ``torch.func``, a forward that differentiates itself);
* ``optimizer=`` against the op stream of the real steady-state step, priced by
  docs/conventions.md ("Optimizer step": FlopCounterMode counts no pointwise op);
* ``count_generation`` against FlopCounterMode around a real ``model.generate`` (eager attention:
  FlopCounterMode does not count CPU SDPA; generate() runs an encoder outside the forward, so the
  whole call is counted and the difference booked to the prefill);
* ``estimate_memory`` against MemTracker on the real step (timm, diffusers and torch_geometric:
  ``silent_errors_wild8_zoo.py``);
* ``profile`` and ``predict`` rows against ``count_flops`` rows on the same call (issue #27: calls,
  FLOPs, MACs, bytes read and written per operator).

Run: ``cd benchmarks && PYTHONPATH=.. /work/main/.venv/bin/python silent_errors_wild8.py``
(about 2 min of CPU). Each line ends "ok" or "DIFF" (an error counts as DIFF unless the line is a
refusal expected by name, "said"); the last line counts them. Lines marked "(fixed)" DIFF or raise
on main; docs/performance.md (branch wild8) has the before/after table.
"""

import collections
import contextlib
import copy
import io
import os
import sys
import warnings

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as ckpt
from _silent_errors import StepOps, check
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import flopcount
from flopcount.devices.roofline import Roofs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from _live_oracles import forward_flops, warmed_step_peak

warnings.simplefilter("ignore")
torch.manual_seed(0)
TALLY = collections.Counter()
ROOFS = Roofs({"float32": 1e11, "bfloat16": 1e11, "float64": 1e11}, 1e10, "sweep roofs", "given")


def line(text, ok):
    TALLY["ok" if ok else "DIFF"] += 1
    print(f"{text} {'ok' if ok else 'DIFF'}", flush=True)


def checked(name, model, args, **kwargs):
    """``check``'s line (FlopCounterMode live against each tracer), counted."""
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        check(name, model, args, **kwargs)
    print(said.getvalue(), end="", flush=True)
    TALLY["DIFF" if "DIFF" in said.getvalue().splitlines()[0] else "ok"] += 1


def said(text, call, expect):
    """A refusal expected to name ``expect``."""
    try:
        call()
        line(f"{text} | raised nothing |", False)
    except Exception as e:
        first = str(e).splitlines()[0]
        line(f"{text} | {type(e).__name__}: ...{first[max(0, first.find(expect) - 40):][:160]} |", expect in first)


class MLP(nn.Module):
    def __init__(s, d=16):
        super().__init__()
        s.a, s.b = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(s, x):
        return s.b(torch.relu(s.a(x)))


# ---- A. backward=True against FlopCounterMode around a real forward + backward
class FrozenBackbone(nn.Module):
    def __init__(s):
        super().__init__()
        s.backbone, s.head = nn.Sequential(MLP(), MLP()), nn.Linear(16, 4)
        s.backbone.requires_grad_(False)

    def forward(s, x):
        return s.head(s.backbone(x))


class FrozenMiddle(nn.Module):
    def __init__(s):
        super().__init__()
        s.first, s.mid, s.head = nn.Linear(16, 16), MLP(), nn.Linear(16, 4)
        s.mid.requires_grad_(False)

    def forward(s, x):
        return s.head(s.mid(s.first(x)))


class BitFit(nn.Module):
    def __init__(s):
        super().__init__()
        s.a, s.b = nn.Linear(16, 32), nn.Linear(32, 4)
        s.a.weight.requires_grad_(False)

    def forward(s, x):
        return s.b(s.a(x))


class LoRA(nn.Module):
    def __init__(s):
        super().__init__()
        s.base, s.A, s.B = nn.Linear(16, 16), nn.Linear(16, 2, bias=False), nn.Linear(2, 16, bias=False)
        s.base.requires_grad_(False)

    def forward(s, x):
        return s.base(x) + s.B(s.A(x)) * 2.0


class Tied(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb, s.mlp, s.head = nn.Embedding(50, 16), MLP(), nn.Linear(16, 50, bias=False)
        s.head.weight = s.emb.weight

    def forward(s, x):
        return s.head(s.mlp(s.emb(x)))


class CtxLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.x, ctx.w = x, w
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        return g @ ctx.w, g.t() @ ctx.x


class OnceLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w if ctx.needs_input_grad[0] else None, g.t() @ x if ctx.needs_input_grad[1] else None


class SetupLinear(torch.autograd.Function):
    @staticmethod
    def forward(x, w):
        return x @ w.t()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x


class UsesFunction(nn.Module):
    def __init__(s, function):
        super().__init__()
        s.w, s.h, s.function = nn.Parameter(torch.randn(32, 16)), nn.Linear(32, 4), function

    def forward(s, x):
        return s.h(s.function.apply(x, s.w))


class Checkpointed(nn.Module):
    def __init__(s, reentrant, frozen=False):
        super().__init__()
        s.inp, s.blocks, s.reentrant = nn.Linear(16, 16), nn.ModuleList(MLP() for _ in range(2)), reentrant
        s.blocks.requires_grad_(not frozen)

    def forward(s, x):
        x = s.inp(x)
        for block in s.blocks:
            x = ckpt.checkpoint(block, x, use_reentrant=s.reentrant)
        return x


class CheckpointSequential(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp, s.seq = nn.Linear(16, 16), nn.Sequential(*[MLP() for _ in range(4)])

    def forward(s, x):
        return ckpt.checkpoint_sequential(s.seq, 2, s.inp(x), use_reentrant=False)


class MicroBatches(nn.Module):
    def __init__(s):
        super().__init__()
        s.m = MLP()

    def forward(s, x):
        return sum(s.m(c).sum() for c in x.chunk(4))


class Detached(nn.Module):
    def __init__(s):
        super().__init__()
        s.a, s.b = MLP(), MLP()

    def forward(s, x):
        return s.b(s.a(x).detach())


class FunctionalDelta(nn.Module):
    def __init__(s):
        super().__init__()
        s.m, s.delta = MLP(), nn.Parameter(torch.zeros(32, 16))

    def forward(s, x):
        params = dict(s.m.named_parameters())
        params["a.weight"] = params["a.weight"] + s.delta
        return torch.func.functional_call(s.m, params, (x,))


class FuncGrad(nn.Module):
    def __init__(s):
        super().__init__()
        s.net = MLP()

    def forward(s, x):
        g = torch.func.grad(lambda p: torch.func.functional_call(s.net, p, (x,)).sum())(dict(s.net.named_parameters()))
        return sum(v.sum() for v in g.values()) + s.net(x).sum()


class InnerStep(nn.Module):
    """A MAML step: one inner gradient step (create_graph), the forward with the adapted weights."""

    def __init__(s, enable):
        super().__init__()
        s.net, s.enable = MLP(), enable

    def forward(s, x):
        with torch.enable_grad() if s.enable else contextlib.nullcontext():
            params = dict(s.net.named_parameters())
            inner = torch.func.functional_call(s.net, params, (x,)).pow(2).mean()
            grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
            fast = {k: p - 0.1 * g for (k, p), g in zip(params.items(), grads)}
            return torch.func.functional_call(s.net, fast, (x,))


class TBPTT(nn.Module):
    def __init__(s):
        super().__init__()
        s.c = nn.RNNCell(16, 16)

    def forward(s, x):
        h, outs = torch.zeros(x.shape[1], 16), []
        for t in range(x.shape[0]):
            h = s.c(x[t], h.detach() if t == 3 else h)
            outs.append(h)
        return torch.stack(outs)


x16 = torch.randn(8, 16)
print("## A. backward=True against FlopCounterMode live (2 x MACs)")
for name, model, args in [
    ("frozen backbone", FrozenBackbone(), (x16,)),
    ("frozen backbone, input needs grad", FrozenBackbone(), (torch.randn(8, 16, requires_grad=True),)),
    ("frozen middle", FrozenMiddle(), (x16,)),
    ("frozen weight, bias trains (BitFit)", BitFit(), (x16,)),
    ("LoRA on a frozen base", LoRA(), (x16,)),
    ("frozen first conv", nn.Sequential(nn.Conv2d(3, 8, 3).requires_grad_(False), nn.Conv2d(8, 8, 3), nn.Flatten(), nn.Linear(288, 2)),
     (torch.randn(2, 3, 10, 10),)),
    ("tied embedding / head", Tied(), (torch.randint(0, 50, (2, 6)),)),
    ("autograd.Function, ctx attributes", UsesFunction(CtxLinear), (x16,)),
    ("autograd.Function, once_differentiable + needs_input_grad", UsesFunction(OnceLinear), (x16,)),
    ("autograd.Function, setup_context", UsesFunction(SetupLinear), (x16,)),
    ("checkpoint reentrant", Checkpointed(True), (x16,)),
    ("checkpoint non-reentrant", Checkpointed(False), (x16,)),
    ("checkpoint of frozen blocks", Checkpointed(False, frozen=True), (x16,)),
    ("checkpoint_sequential", CheckpointSequential(), (x16,)),
    ("micro-batches summed in forward", MicroBatches(), (x16,)),
    ("detach between blocks", Detached(), (x16,)),
    ("torch.func.functional_call with a delta", FunctionalDelta(), (x16,)),
    ("torch.func.grad in forward", FuncGrad(), (x16,)),
    ("truncated BPTT (detach at step 3)", TBPTT(), (torch.randn(6, 2, 16),)),
    ("MAML inner step (dispatch fixed: 'not used in the graph')", InnerStep(True), (x16,)),
    ("channels_last convnet", nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3)).to(memory_format=torch.channels_last),
     (torch.randn(2, 3, 12, 12).to(memory_format=torch.channels_last),)),
]:
    checked(name, model, args, backward=True, tracers=("auto", "dispatch"))
target = torch.randint(0, 10, (8,))
target[:3] = -100
for name, loss in [("cross_entropy ignore_index", lambda o: F.cross_entropy(o, target, ignore_index=-100)),
                   ("cross_entropy label_smoothing", lambda o: F.cross_entropy(o, target.clamp(min=0), label_smoothing=0.1)),
                   ("loss / accumulation steps", lambda o: o.pow(2).mean() / 4)]:
    checked(name, nn.Linear(16, 10), (x16,), backward=True, tracers=("auto", "dispatch"), loss=loss)
with torch.autocast("cpu", dtype=torch.bfloat16):
    checked("autocast bf16 MLP", MLP(), (x16,), backward=True, tracers=("auto", "dispatch"))
scaler = torch.amp.GradScaler("cpu")
checked("GradScaler-scaled loss", MLP(), (x16,), backward=True, tracers=("auto", "dispatch"), loss=lambda o: scaler.scale(o.sum()))
checked("MAML inner step, forward only, grad enabled inside", InnerStep(True), (x16,), tracers=("auto", "dispatch"))
said("MAML inner step, forward only, grad mode left to the count (fixed: torch's 'does not require grad')",
     lambda: flopcount.count_flops(InnerStep(False), (x16,)), "differentiates inside itself")

# ---- B. optimizer= against the real step's op stream, priced by docs/conventions.md


def real_step_flops(model, x, make):
    model = copy.deepcopy(model)
    opt = make(model.parameters())
    for first in (True, False):
        opt.zero_grad()
        model(x).sum().backward()
        if first:
            opt.step()
    with StepOps() as ops:
        opt.step()
    return ops.flops, ops.unpriced


print("\n## B. optimizer= against the real steady-state step's ops (conventions' prices)")
net, xb = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), torch.randn(4, 16)
for name, make in {
    "Adam lr=tensor (fixed: refused)": lambda ps: torch.optim.Adam(ps, lr=torch.tensor(1e-3)),
    "AdamW lr, betas tensors (fixed: refused)": lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(1e-3), betas=(torch.tensor(0.9), torch.tensor(0.999))),
    "SGD lr=tensor, momentum (fixed: refused)": lambda ps: torch.optim.SGD(ps, lr=torch.tensor(0.1), momentum=0.9),
    "Adam maximize, weight_decay": lambda ps: torch.optim.Adam(ps, maximize=True, weight_decay=0.1),
    "Adam amsgrad": lambda ps: torch.optim.Adam(ps, amsgrad=True),
    "RMSprop centered, momentum": lambda ps: torch.optim.RMSprop(ps, centered=True, momentum=0.9),
    "NAdam": torch.optim.NAdam, "RAdam": torch.optim.RAdam, "Adamax": torch.optim.Adamax,
    "Adadelta": torch.optim.Adadelta, "Adagrad": torch.optim.Adagrad,
    "SGD groups: nesterov / plain": lambda ps: torch.optim.SGD([{"params": list(ps)[:2], "momentum": 0.9, "nesterov": True}], lr=0.1),
}.items():
    real, unpriced = real_step_flops(net, xb, make)
    try:
        ours = flopcount.count_flops(net, (xb,), backward=True, optimizer=make(net.parameters())).by_phase()["optimizer"]
    except Exception as e:
        ours = f"ERR {type(e).__name__}: {str(e).splitlines()[0][-120:]}"
    line(f"{name} | real step={real}{' unpriced ' + str(sorted(unpriced)) if unpriced else ''} | count={ours}", ours == real and not unpriced)
m1 = MLP()
n_w = m1.a.weight.numel() + m1.b.weight.numel()
n_b = m1.a.bias.numel() + m1.b.bias.numel()
groups = torch.optim.Adam([{"params": [m1.a.weight, m1.b.weight], "weight_decay": 0.1}, {"params": [m1.a.bias, m1.b.bias], "weight_decay": 0.0}])
ours = flopcount.count_flops(m1, (x16,), backward=True, optimizer=groups).by_phase()["optimizer"]
line(f"Adam groups with / without weight decay | hand=12 x {n_w} + 11 x {n_b} + 4 = {12 * n_w + 11 * n_b + 4} | count={ours}", ours == 12 * n_w + 11 * n_b + 4)
frozen = MLP()
frozen.a.requires_grad_(False)
ours = flopcount.count_flops(frozen, (x16,), backward=True, optimizer=torch.optim.AdamW(frozen.parameters())).by_phase()["optimizer"]
n = frozen.b.weight.numel() + frozen.b.bias.numel()
line(f"AdamW over every parameter, first layer frozen | hand=12 x {n} + 2 = {12 * n + 2} | count={ours}", ours == 12 * n + 2)
tied = Tied()
ours = flopcount.count_flops(tied, (torch.randint(0, 50, (2, 6)),), backward=True, optimizer="adamw").by_phase()["optimizer"]
n, t = sum(p.numel() for p in tied.parameters()), len(list(tied.parameters()))  # parameters() yields the tie once
line(f"AdamW, tied embedding / head (the tie once) | hand=12 x {n} + {t} = {12 * n + t} | count={ours}", ours == 12 * n + t)


class SparseLookup(nn.Module):
    def __init__(s):
        super().__init__()
        s.table, s.head = nn.Embedding(100, 16, sparse=True), nn.Linear(16, 4)

    def forward(s, i):
        return s.head(s.table(i))


sparse = SparseLookup()
said("SGD over Embedding(sparse=True) (fixed: 1,600 priced dense; the real add_ is 24 rows x 16 = 384)",
     lambda: flopcount.count_flops(sparse, (torch.randint(0, 100, (4, 6)),), backward=True, optimizer=torch.optim.SGD([sparse.table.weight], lr=0.1)),
     "makes a sparse gradient")
said("SparseAdam over Embedding(sparse=True) (fixed: torch's 'does not support dense gradients')",
     lambda: flopcount.count_flops(sparse, (torch.randint(0, 100, (4, 6)),), backward=True, optimizer=torch.optim.SparseAdam([sparse.table.weight])),
     "makes a sparse gradient")

# ---- C. count_generation against FlopCounterMode around a real generate()
print("\n## C. count_generation against FlopCounterMode around generate() (eager attention)")
import transformers as T  # noqa: E402


def tiny(kind):
    if kind == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=64))
    if kind == "llama (logits_to_keep)":
        return T.LlamaForCausalLM(T.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                                num_key_value_heads=2, vocab_size=100, max_position_embeddings=64))
    if kind == "t5":
        return T.T5ForConditionalGeneration(T.T5Config(num_layers=2, num_decoder_layers=2, d_model=32, d_ff=64, num_heads=4, d_kv=8,
                                                       vocab_size=100, decoder_start_token_id=0))
    if kind == "bart":
        return T.BartForConditionalGeneration(T.BartConfig(encoder_layers=2, decoder_layers=2, d_model=32, encoder_ffn_dim=64,
                                                           decoder_ffn_dim=64, encoder_attention_heads=4, decoder_attention_heads=4,
                                                           vocab_size=100, max_position_embeddings=64))
    return T.WhisperForConditionalGeneration(T.WhisperConfig(
        encoder_layers=1, decoder_layers=1, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=4,
        decoder_attention_heads=4, vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        num_mel_bins=8, max_source_positions=16, max_target_positions=32))


def generation(kind, options=None, ours_options=None, batch=2, new=4):
    torch.manual_seed(0)
    model = tiny(kind).eval()
    model.set_attn_implementation("eager")
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, None
    ids = torch.randn(batch, 8, 32) if kind == "whisper" else torch.randint(1, 100, (batch, 5))
    with FlopCounterMode(display=False) as whole, forward_flops(model) as each, torch.no_grad():
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, **{"do_sample": False, **(options or {})})
    each[0] += whole.get_total_flops() - sum(each)  # an encoder generate() runs outside the forward
    try:
        r = flopcount.count_generation(model, ids, new, **(ours_options or {}))
        ours = [2 * r.prefill.macs] + [2 * s.macs for s in r.steps]
        notes = [w for w in r.warnings if "beams" in w]
    except Exception as e:
        ours, notes = f"ERR {type(e).__name__}: {e}"[:150], []
    return each, ours, notes


for kind, options, ours_options in [
    ("gpt2", None, None), ("llama (logits_to_keep)", None, None), ("t5", None, None), ("bart", None, None), ("whisper", None, None),
    ("llama (logits_to_keep)", {"cache_implementation": "static"}, {"cache_implementation": "static"}),
    ("gpt2", {"do_sample": True, "top_k": 5}, None),
]:
    truth, ours, _ = generation(kind, options, ours_options)
    line(f"{kind} {options or 'greedy'} | fcm={truth} | count_generation={ours}", truth == ours)
for kind, options in [("llama (logits_to_keep)", {"num_beams": 2}), ("t5", {"num_beams": 2}),
                      ("llama (logits_to_keep)", {"do_sample": True, "num_return_sequences": 2})]:
    truth, ours, _ = generation(kind, options)
    # count_generation counts greedy search (its docstring); set in generation_config, beams are said in warnings
    line(f"{kind} generate({options}) (greedy by design; beams x2) | fcm={truth} | count_generation x2={[2 * v for v in ours]}",
         [2 * v for v in ours][1:] == truth[1:])

# ---- D. estimate_memory against MemTracker on the real step (torch only; the zoo: silent_errors_wild8_zoo.py)
print("\n## D. estimate_memory against MemTracker (a real warmed-up step)")
for name, model, x, make in [
    ("MLP, AdamW lr and betas tensors (fixed: refused)", MLP(), torch.randn(64, 16),
     lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(1e-3), betas=(torch.tensor(0.9), torch.tensor(0.999)))),
    ("MLP, SGD lr=tensor (fixed: refused)", MLP(), torch.randn(64, 16), lambda ps: torch.optim.SGD(ps, lr=torch.tensor(0.1), momentum=0.9)),
    ("MLP, Adam", MLP(), torch.randn(64, 16), torch.optim.Adam),
]:
    try:
        truth = warmed_step_peak(model, x, make)
    except Exception as e:
        truth = f"ERR {e}"
    try:
        est = flopcount.estimate_memory(model, (x,), backward=True, optimizer=make(model.parameters())).peak_bytes
    except Exception as e:
        est = f"ERR {type(e).__name__}: {str(e).splitlines()[0][-120:]}"
    line(f"{name} | MemTracker={truth} | estimate={est}", est == truth)

# ---- E. profile / predict rows against count_flops rows (issue #27)
print("\n## E. profile / predict rows against count_flops rows (calls, flops, macs, bytes read, bytes written)")
FIELDS = ("calls", "flops", "macs", "bytes_read", "bytes_written")


def rows_of(table):
    return {op: tuple(getattr(row, f) for f in FIELDS) for op, row in table.items()}


def same_rows(name, model, args, backward=False, loss=None, readings=("predict", "profile")):
    try:
        counted = rows_of(flopcount.count_flops(model, args, backward=backward, loss_fn=loss).operator_totals())
    except Exception as e:
        line(f"{name} | count_flops ERR {type(e).__name__}: {str(e)[:100]} |", False)
        return
    runs = {"predict": lambda: flopcount.predict(model, args, backward=backward, loss_fn=loss, on="h100"),
            "profile": lambda: flopcount.profile(model, args, backward=backward, loss_fn=loss, warmup=0, steps=1, roofs=ROOFS)}
    for reading in readings:
        try:
            other = rows_of(runs[reading]().by_operator())
        except Exception as e:
            line(f"{name}{' +bwd' if backward else ''} | {reading} ERR {type(e).__name__}: {str(e).splitlines()[0][:140]} |", False)
            continue
        differ = {op: (counted.get(op), other.get(op)) for op in set(counted) | set(other) if counted.get(op) != other.get(op)}
        line(f"{name}{' +bwd' if backward else ''} | {reading} vs count_flops, {len(counted)} operators{' differ: ' + str(differ)[:300] if differ else ''} |",
             not differ)


gpt2 = tiny("gpt2").eval()
same_rows("GPT-2 (2 layers)", gpt2, (torch.randint(0, 100, (2, 8)),))
same_rows("GPT-2 (2 layers)", gpt2, (torch.randint(0, 100, (2, 8)),), backward=True)
same_rows("LSTM 2 layers (fixed: profile's backward read the kernel's workspace)", nn.LSTM(16, 32, num_layers=2, batch_first=True),
          (torch.randn(2, 5, 16),), backward=True)
same_rows("checkpoint reentrant (fixed: profile raised)", Checkpointed(True), (x16,), backward=True)
same_rows("LSTM inside a reentrant checkpoint (fixed)", nn.Sequential(nn.Linear(16, 16), nn.LSTM(16, 32, num_layers=2, batch_first=True)),
          (torch.randn(2, 5, 16),), backward=True, readings=("predict",))
for name, model, args in [
    ("MultiheadAttention", nn.MultiheadAttention(32, 4, batch_first=True), (torch.randn(2, 5, 32),) * 3),
    ("TransformerEncoderLayer", nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), (torch.randn(2, 3, 8),)),
    ("conv + BatchNorm train", nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).train(), (torch.randn(2, 3, 16, 16),)),
    ("EmbeddingBag max", nn.EmbeddingBag(50, 8, mode="max"), (torch.randint(0, 50, (12,)), torch.tensor([0, 4, 8]))),
    ("GRU 2 layers", nn.GRU(8, 16, num_layers=2), (torch.randn(5, 2, 8),)),
    ("LSTM bidirectional, proj_size", nn.LSTM(8, 16, bidirectional=True, proj_size=4, batch_first=True), (torch.randn(2, 5, 8),)),
    ("frozen backbone", FrozenBackbone(), (x16,)), ("tied", Tied(), (torch.randint(0, 50, (2, 6)),)),
    ("autograd.Function", UsesFunction(OnceLinear), (x16,)), ("checkpoint non-reentrant", Checkpointed(False), (x16,)),
    ("functional_call", FunctionalDelta(), (x16,)), ("micro-batches", MicroBatches(), (x16,)),
]:
    same_rows(name, model, args, backward=True, readings=("profile",))
same_rows("cross_entropy label_smoothing", nn.Linear(16, 10), (x16,), backward=True,
          loss=lambda o: F.cross_entropy(o, target.clamp(min=0), label_smoothing=0.1))
with torch.autocast("cpu", dtype=torch.bfloat16):
    same_rows("autocast bf16 MLP", MLP(), (x16,), backward=True)

print(f"\n{TALLY['ok'] + TALLY['DIFF']} lines: {TALLY['ok']} ok, {TALLY['DIFF']} DIFF")
