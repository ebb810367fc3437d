"""Counting while other threads run models or draw random numbers (issue #29 items 16, 18, 20).

The hooks flopcount installs are process-wide and torch's mode stacks and RNG are per thread or
per process: a count must answer only the thread that counts, push nothing onto another thread's
stack and never rewind another thread's random draws. Oracles: hand counts (derived below), the
neighbour's own observations (its torch-function mode stack, its exceptions, its draws)."""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List

import pytest
import torch
from torch import nn

from flopcount import count_flops

B = 3
# Linear(8, 16) -> ReLU -> Linear(16, 4) on a B x 8 input that needs no grad; backward of sum(outputs).
FWD_MACS = B * (8 * 16 + 16 * 4)
BWD_MACS = B * (4 * 16 + 4 * 16 + 16 * 8)  # fc2 grad input and grad weight, fc1 grad weight (x needs none)
FWD_FLOPS = 2 * FWD_MACS + B * 16  # the ReLU: one op per element; the biases are fused into addmm (free)
# threshold_backward one op per element; the bias gradients are sums over the batch, N FLOPs each
BWD_FLOPS = 2 * BWD_MACS + B * 16 + B * 4 + B * 16


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _function_modes() -> int:
    return int(torch._C._len_torch_function_stack())


class Neighbour(threading.Thread):
    """Runs ``work`` in a loop until stopped, keeping what it saw."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.stop = threading.Event()
        self.started_work = threading.Event()
        self.errors: List[BaseException] = []
        self.modes: List[int] = []
        self.results: List[Any] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.results.append(self.work())
            except BaseException as exc:  # the test reports what the neighbour got
                self.errors.append(exc)
            self.modes.append(_function_modes())
            self.started_work.set()

    def __enter__(self) -> Neighbour:
        self.start()
        assert self.started_work.wait(60)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.join(120)
        assert not self.is_alive()


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize("same_model", [True, False])
def test_backward_count_answers_only_the_counting_thread(tracer, same_model):
    model = _mlp()
    other = model if same_model else _mlp()
    x = torch.randn(B, 8)

    def infer() -> None:
        with torch.no_grad():
            other(torch.randn(5, 8))

    with Neighbour(infer) as neighbour:
        for _ in range(5):
            result = count_flops(model, x, backward=True, tracer=tracer)
            assert result.by_phase("macs") == {"forward": FWD_MACS, "backward": BWD_MACS}
            assert result.by_phase("flops") == {"forward": FWD_FLOPS, "backward": BWD_FLOPS}
        ran = len(neighbour.results)
    assert ran >= 1 and not neighbour.errors
    assert set(neighbour.modes) == {0}, "a torch function mode was left on the neighbour's stack"
    assert _function_modes() == 0


def test_thirty_backward_counts_beside_a_training_neighbour():
    model = _mlp()
    other = _mlp()
    x = torch.randn(B, 8)

    def train() -> None:
        other(torch.randn(5, 8)).sum().backward()

    with Neighbour(train) as neighbour:
        for _ in range(30):
            result = count_flops(model, x, backward=True, tracer="auto")
            assert result.flops == FWD_FLOPS + BWD_FLOPS and result.macs == FWD_MACS + BWD_MACS
    assert not neighbour.errors and set(neighbour.modes) == {0}
    assert _function_modes() == 0


# --------------------------------------------------------------------------- 18: the RNG


def _draw() -> int:
    # 62-bit integers: a repeat by chance is out of the question in a few thousand draws
    return int(torch.randint(0, 2**62, (1,)).item())


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
@pytest.mark.parametrize("backward", [False, True])
def test_a_neighbour_drawing_random_numbers_sees_no_repeats(tracer, backward):
    if tracer == "jit" and backward:
        pytest.skip("jit counts forwards only")
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2)).eval()  # eval: dropout draws nothing
    x = torch.randn(B, 8)
    with Neighbour(_draw) as neighbour:
        for _ in range(10):
            count_flops(model, x, tracer=tracer, backward=backward)
    draws = neighbour.results
    assert len(draws) > 1 and not neighbour.errors
    assert len(set(draws)) == len(draws), f"{len(draws) - len(set(draws))} repeated draws: the generator was rewound"


class _Noisy(nn.Module):
    """Linear(8, 8) -> Dropout(0.5) -> + randn noise -> Linear(8, 2): a forward that draws twice."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.fc1(x))
        return self.fc2(h + torch.randn(h.shape))


# the MACs of _Noisy on a B x 8 input, by hand: the two Linears (dropout and the noise add are
# elementwise: no multiply-accumulate)
NOISY_MACS = B * (8 * 8 + 8 * 2)


@pytest.mark.parametrize("tracer", ["dispatch", "jit"])
def test_a_real_run_that_draws_leaves_a_drawing_neighbour_alone(tracer):
    """Issue #29 item 18: a real run (dispatch, jit) of a model that draws (train-mode dropout,
    randn in forward) used to set the process-wide generator back afterwards, rewinding the
    neighbour's draws (repeats). Oracle: the neighbour's own draws, 62-bit integers."""
    model = _Noisy().train()
    x = torch.randn(B, 8)
    with Neighbour(_draw) as neighbour:
        for _ in range(10):
            result = count_flops(model, x, tracer=tracer)
            assert result.macs == NOISY_MACS
    draws = neighbour.results
    assert len(draws) > 1 and not neighbour.errors
    assert len(set(draws)) == len(draws), f"{len(draws) - len(set(draws))} repeated draws: the generator was rewound"


@pytest.mark.parametrize("tracer", ["dispatch", "jit"])
def test_a_real_run_draws_what_the_real_call_draws(tracer):
    """The private generators start from the caller's state: the counted run computes what the
    caller's own call would (same dropout mask, same noise), and the caller's generator is left
    where it was. Oracle: the model run by the test itself from the same generator state."""
    assert_counted_run_draws_as_the_caller(_Noisy().train(), torch.randn(B, 8), tracer)


def assert_counted_run_draws_as_the_caller(model: nn.Module, x: torch.Tensor, tracer: str) -> None:
    """The counted run's output (seen by a forward hook) equals the caller's own call from the
    same generator state, and the caller's generator is where it was."""
    state = torch.get_rng_state()
    expected = model(x).detach()
    torch.set_rng_state(state)
    seen: List[torch.Tensor] = []
    handle = model.register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
    try:
        count_flops(model, x, tracer=tracer)
    finally:
        handle.remove()
    after = torch.get_rng_state()
    torch.set_rng_state(state)
    assert torch.equal(after, state), "the caller's generator moved"
    assert len(seen) == 1 and torch.equal(seen[0], expected)


def test_estimate_memory_leaves_a_drawing_neighbour_alone():
    from flopcount import estimate_memory

    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2)).train()  # train: fake draws only
    with Neighbour(_draw) as neighbour:
        for _ in range(5):
            estimate_memory(model, torch.randn(B, 8), backward=True)
    draws = neighbour.results
    assert len(draws) > 1 and len(set(draws)) == len(draws)


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_a_real_run_that_draws_still_leaves_the_rng_as_found(tracer):
    # single thread: a train-mode dropout draws on real tensors (dispatch/jit run the model);
    # the generator is put back, as before
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).train()
    x = torch.randn(B, 8)
    state = torch.get_rng_state()
    count_flops(model, x, tracer=tracer)
    after = torch.get_rng_state()
    torch.set_rng_state(state)
    assert torch.equal(after, state)


# --------------------------------------------------------------------------- 20: a model another thread trains


def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


# Linear(8, 16) -> BatchNorm1d(16) (train mode: statistics 4N + 2G, normalise 2N + 2G, affine 2N;
# N = B * 16, G = 16) -> ReLU (N) -> Linear(16, 4), on a B x 8 input.
TRAIN_FLOPS = 2 * B * (8 * 16 + 16 * 4) + (8 * B * 16 + 4 * 16) + B * 16


@pytest.mark.parametrize("tracer", ["dispatch", "jit", "auto"])
def test_counting_a_model_another_thread_trains(tracer):
    model = _bn_net().train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(B, 8)

    def train_step() -> float:
        loss = model(torch.randn(6, 8)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return float(loss)

    with Neighbour(train_step) as trainer:
        for _ in range(10):
            result = count_flops(model, x, tracer=tracer)
            assert result.flops == TRAIN_FLOPS and result.macs == B * (8 * 16 + 16 * 4)
    assert not trainer.errors, trainer.errors[:1]
    assert len(trainer.results) >= 1 and all(loss == loss for loss in trainer.results)  # no NaN
    assert set(trainer.modes) == {0}


# --------------------------------------------------------------------------- count_generation's last output


def test_count_generation_hears_only_its_own_thread():
    """decoding/forwards.py's LastOutput keeps the model's output through a process-wide hook:
    a neighbour running the same model (another batch and length) must not hand its output to
    the count. Oracle: the hand formulas of tests/test_generation.py (prefill, each step, KV bytes)."""
    pytest.importorskip("transformers")
    from test_generation import VOCAB, B, N, P, _llama, kv_bytes, prefill_macs, step_macs

    from flopcount.generation.count import count_generation

    model = _llama("cpu")
    ids = torch.randint(0, VOCAB, (B, P))

    def infer() -> None:
        with torch.no_grad():
            model(torch.randint(0, VOCAB, (1, 3)))

    with Neighbour(infer) as neighbour:
        for _ in range(3):
            result = count_generation(model, ids, new_tokens=N)
            assert result.prefill.macs == prefill_macs()
            assert [s.macs for s in result.steps] == [step_macs(s) for s in range(N - 1)]
            assert result.kv_cache_bytes == kv_bytes(P + N - 1)
    assert len(neighbour.results) >= 1 and not neighbour.errors


_GATES: dict = {}  # key -> (counting thread, arrived, proceed): plain ints on the module, so copies share them


class _Gate(nn.Module):
    """Identity; in the counting thread's forward it stops until the trainer has run its steps."""

    def __init__(self, key: int) -> None:
        super().__init__()
        self.key = key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        owner, arrived, proceed = _GATES[self.key]
        if threading.get_ident() == owner:
            arrived.set()
            assert proceed.wait(60)
        return x


@pytest.mark.parametrize("tracer", ["dispatch", "jit", "auto"])
def test_a_real_count_leaves_the_training_thread_its_model(tracer):
    """Issue #29 item 20, made deterministic: the count's forward stops halfway (inside the
    model) while another thread runs three training steps on the same model, then finishes.
    Oracle: the same three steps run on a deep copy in one thread, with no count: the same
    losses, and the same parameters and BatchNorm statistics afterwards (a real run that
    puts copies of the buffers in the model's own modules hands the trainer those copies,
    and its updates are lost when the originals go back)."""
    import copy

    key = len(_GATES)
    _GATES[key] = (threading.get_ident(), threading.Event(), threading.Event())
    _, arrived, proceed = _GATES[key]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), _Gate(key), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)).train()
    reference = copy.deepcopy(model)
    batches = [torch.randn(6, 8) for _ in range(3)]

    def steps(net: nn.Module) -> List[float]:
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        losses = []
        for batch in batches:
            loss = net(batch).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses

    seen: List[Any] = []

    def trainer() -> None:
        try:
            assert arrived.wait(60)
            seen.append(steps(model))
        except BaseException as exc:  # reported below
            seen.append(exc)
        finally:
            proceed.set()

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    try:
        result = count_flops(model, torch.randn(B, 8), tracer=tracer)
    finally:
        proceed.set()
        thread.join(60)
    assert result.flops == TRAIN_FLOPS and result.macs == B * (8 * 16 + 16 * 4)
    expected = steps(reference)
    assert seen == [expected]
    for (name, mine), (_, theirs) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(mine, theirs), name
    assert all(m.training for m in model.modules())


def _linear_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    module.seen = getattr(module, "seen", 0) + 1  # written on the module the call is bound to
    return nn.functional.linear(x, module.weight, module.bias)


class _Rewired(nn.Module):
    """What the private twin must rebind: a forward replaced by a partial over its module
    (accelerate's hooks do this), a hook that is a bound method, submodules listed in a plain
    attribute, a tied weight, a counter the forward bumps."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.b.weight = self.a.weight
        self.order = [self.a, self.b]
        self.a.forward = functools.partial(_linear_forward, self.a)
        self.b.register_forward_pre_hook(self.note)
        self.calls = 0
        self.noted = 0

    def note(self, module: nn.Module, args: Any) -> None:
        self.noted += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        for module in self.order:
            x = module(x)
        return x


@pytest.mark.parametrize("tracer", ["dispatch", "jit"])
def test_the_real_run_twin_rebinds_what_points_at_the_model(tracer):
    # hand count: two Linear(8, 8) on B rows, B * 64 MACs each, each booked to its own module
    model = _Rewired()
    result = count_flops(model, torch.randn(B, 8), tracer=tracer)
    assert result.by_module("macs") == {"": 2 * B * 64, "a": B * 64, "b": B * 64}
    assert (model.calls, model.noted) == (0, 0) and not hasattr(model.a, "seen")
    assert model.b.weight is model.a.weight and model.order == [model.a, model.b]
    model(torch.randn(B, 8))  # the model's own call still goes through its own objects
    assert (model.calls, model.noted, model.a.seen) == (1, 1, 1)
