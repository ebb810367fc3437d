"""count_generation and serve trace a meta model's generate() forwards on fake copies (shape
cache, structural reuse of the decoder layers given the KV cache), issue #32's count_generation
target. Three findings, each a regression test:

* the decoding loop feeds each forward the cache the previous fake run returned; the fake copy
  of that cache deep-copied its fake tensors, and a FakeTensor's deep copy deep-copies its
  FakeTensorMode (converter, weak-keyed memo tables, dispatch-mode key): the copies corrupted
  the heap and Python crashed at garbage collection from the second decode step on. The copy
  now fakes each tensor of the cache into its own mode;
* on meta, the fast path's counts equal the live peer (FlopCounterMode over a real greedy
  generate() of the same configuration on CPU) forward by forward, on five model families,
  in a subprocess (a crash must not kill pytest);
* a continued decode step prices each distinct varying call once, not once per layer.
"""

from __future__ import annotations

import functools
import sys
import textwrap
from pathlib import Path
from typing import Any, List

import pytest
import torch

from flopcount.core.inputs import fake_tensor_type
from flopcount.tracers.fake.copies import fake_copies

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


class _Cache:
    """A cache object the copier deep-copies (not a container it rebuilds)."""

    def __init__(self, keys: List[torch.Tensor]):
        self.keys = keys


def test_a_cache_of_another_fake_mode_is_faked_into_the_copy_s_mode() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    earlier = FakeTensorMode(allow_non_fake_inputs=True)
    with earlier:
        held = [torch.empty(2, 3, 5), torch.empty(2, 3, 5)]
    real = torch.randn(2, 4)
    model = torch.nn.Linear(4, 4)
    call = ((), {"cache": _Cache(held), "past": _Cache([real])})
    copied = fake_copies(model, [], lambda tensors: call)
    _, kwargs = copied.call
    fake = fake_tensor_type()
    for key in ("cache", "past"):
        for tensor in kwargs[key].keys:
            # before: the deep copy made a FakeTensorMode per tensor (a copy of ``earlier``), or a
            # real copy of the real tensor's data
            assert isinstance(tensor, fake) and tensor.fake_mode is copied.mode
    assert [tuple(t.shape) for t in kwargs["cache"].keys] == [(2, 3, 5), (2, 3, 5)]
    assert tuple(kwargs["past"].keys[0].shape) == (2, 4) and not isinstance(real, fake)
    assert kwargs["cache"] is not call[1]["cache"] and call[1]["cache"].keys[0] is held[0]  # the caller's kept


_SCRIPT = textwrap.dedent('''
    import gc, sys
    sys.path.insert(0, {tests!r})
    import torch, transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    from _live_oracles import generate_truth
    import flopcount.decoding.counted as counted
    from flopcount import count_generation

    fake_runs, slow_runs = [0], [0]
    run = counted.Counter._run
    def counting(self, prepared, *named):  # named: the forward's name and decode step, for a failure's line
        fake_runs[0] += self.fast
        slow_runs[0] += not self.fast
        return run(self, prepared, *named)
    counted.Counter._run = counting

    def config(kind):
        common = dict(vocab_size=64)
        if kind == "llama":
            return transformers.AutoConfig.for_model("llama", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **common)
        if kind == "mistral":
            return transformers.AutoConfig.for_model("mistral", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, sliding_window=None, **common)
        if kind == "gpt2":
            return transformers.AutoConfig.for_model("gpt2", n_embd=32, n_layer=3, n_head=4, n_positions=128, **common)
        if kind == "mamba":
            return transformers.AutoConfig.for_model("mamba", hidden_size=32, state_size=4, num_hidden_layers=3,
                expand=2, conv_kernel=4, **common)
        return transformers.AutoConfig.for_model("t5", d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2,
            num_decoder_layers=2, decoder_start_token_id=0, pad_token_id=0, **common)

    B, P, N = 2, 5, 7
    for kind in ("llama", "gpt2", "mistral", "mamba", "t5"):
        cfg = config(kind)
        auto = transformers.AutoModelForSeq2SeqLM if kind == "t5" else transformers.AutoModelForCausalLM
        with torch.device("meta"):
            meta = auto.from_config(cfg).eval()
        meta.generation_config.eos_token_id = None
        ids = torch.zeros(B, P, dtype=torch.int64, device="meta")
        before, slow = list(fake_runs), slow_runs[0]
        every = count_generation(meta, ids, new_tokens=N, trace_every_step=True)
        # the prefill and the N - 1 decode steps, each on fake copies; none by the dispatch tracer
        assert (fake_runs[0] - before[0], slow_runs[0] - slow) == (N, 0), kind
        default = count_generation(meta, ids, new_tokens=N)
        assert slow_runs[0] == slow, kind
        gc.collect()
        torch.manual_seed(0)
        real = auto.from_config(cfg).eval()
        real.generation_config.eos_token_id = None
        prompt = torch.randint(1, 64, (B, P))
        with sdpa_kernel(SDPBackend.MATH):  # attention as the bmm FlopCounterMode counts
            if kind == "t5":  # generate() runs the encoder outside the forwards: its whole run
                with FlopCounterMode(display=False) as counter, torch.no_grad():
                    out = real.generate(prompt, max_new_tokens=N, min_new_tokens=N, do_sample=False)
                assert out.shape == (B, 1 + N)
                truth, counts = [counter.get_total_flops()], [2 * every.macs]
            else:  # forward by forward
                truth, _ = generate_truth(real, prompt, N)
                counts = [2 * every.prefill.macs] + [2 * s.macs for s in every.steps]
        assert counts == truth, (kind, counts, truth)
        assert [s.macs for s in default.steps] == [s.macs for s in every.steps], kind
        assert default.kv_cache_bytes == every.kv_cache_bytes, kind
        print(kind, "ok", flush=True)
    gc.collect()
    print("done", flush=True)
''')


def test_meta_generation_on_fakes_matches_a_real_generate_in_a_subprocess(fresh_python_with_transformers: Any) -> None:
    # a process of its own (a crash must not kill pytest), forked from conftest's server that has
    # imported torch and transformers' LLaMA: a new interpreter spent ~2.5 s of CPU importing torch
    # again, and a child of the torch-only server ~2.5 s importing transformers
    script = _SCRIPT.format(tests=str(ROOT / "tests"))
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    done = fresh_python_with_transformers.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
    assert done.stdout.split() == ["llama", "ok", "gpt2", "ok", "mistral", "ok", "mamba", "ok", "t5", "ok", "done"]


def test_a_continued_step_prices_each_distinct_varying_call_once(monkeypatch: Any) -> None:
    from flopcount.decoding import runs
    from flopcount.generation.count import count_generation

    layers = 4
    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=50, max_position_embeddings=128,
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    priced: List[int] = []
    cost_events = runs.cost_events

    def counting(events: Any, registry: Any) -> Any:
        priced.append(len({id(e.call) for e in events if e.call.op == "aten::scaled_dot_product_attention"}))
        return cost_events(events, registry)

    monkeypatch.setattr(runs, "cost_events", counting)
    result = count_generation(model, torch.zeros(2, 6, dtype=torch.int64, device="meta"), new_tokens=12)
    # 11 decode steps: 0, 1, 2 and 10 traced, 3..9 continued; each continued step's attention (the one
    # call whose key length grows, the same in the 4 layers) is continued and priced once, not 4 times
    assert priced == [1] * 7
    # by hand: attention over c = 6 + s + 1 positions, 4 heads x (QK^T + AV) 2 x 8 x c MACs per layer and sequence
    dense = layers * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64) + 32 * 50
    assert [s.macs for s in result.steps] == [2 * (dense + layers * 4 * 2 * 8 * (6 + s + 1)) for s in range(11)]


@pytest.mark.parametrize("kind", ["llama", "mistral-window"])
def test_the_fake_path_agrees_with_the_dispatch_path_on_meta(kind: str, monkeypatch: Any) -> None:
    """An invariant between two tracers: FLOPs and MACs per module of every forward, the cache's
    bytes and the notes are the same on fake copies and on meta as given (the prefill's bytes
    are not: meta's own layouts make copies a CPU run does not, docs/llm.md)."""
    from flopcount.decoding import counted
    from flopcount.generation.count import count_generation

    extra = {"sliding_window": 9} if kind == "mistral-window" else {}
    cfg = transformers.AutoConfig.for_model(
        "mistral" if extra else "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=50, max_position_embeddings=128, **extra,
    )
    results = []
    for fast in (True, False):
        monkeypatch.setattr(counted, "on_fakes", lambda model, fast=fast: fast)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        results.append(count_generation(model, torch.zeros(3, 6, dtype=torch.int64, device="meta"), new_tokens=10))
    on_fakes, as_given = results
    for a, b in zip((on_fakes.prefill, *on_fakes.steps), (as_given.prefill, *as_given.steps)):
        assert (a.flops, a.macs) == (b.flops, b.macs)
        assert a.by_module("flops") == b.by_module("flops") and a.by_module("macs") == b.by_module("macs")
        assert a.warnings == b.warnings
    # a one-token step makes no layout copy on meta: its bytes agree too
    assert [(s.bytes_read, s.bytes_written) for s in on_fakes.steps] == [(s.bytes_read, s.bytes_written) for s in as_given.steps]
    assert (on_fakes.kv_cache_bytes, on_fakes.kv_cache_position_bytes) == (as_given.kv_cache_bytes, as_given.kv_cache_position_bytes)
    assert on_fakes.warnings == as_given.warnings


def test_a_forward_fakes_cannot_run_is_counted_as_given(monkeypatch: Any) -> None:
    """A meta model whose forward reads a value (here the prompt's first id) cannot run on fakes:
    the whole loop is counted again by the dispatch tracer on the model as given, which answers
    the read with a placeholder and says so, as before the fake path."""
    from flopcount.decoding import counted
    from flopcount.generation.count import count_generation

    base = transformers.LlamaForCausalLM

    class Reads(base):  # type: ignore[misc, valid-type]
        @functools.wraps(base.forward)  # its signature: the decoding loop reads the cache argument's name
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None:
                int(ids[0, 0])  # a data-dependent read
            return super().forward(*args, **kwargs)

    layers = 2
    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=50, max_position_embeddings=128,
    )
    with torch.device("meta"):
        model = Reads(cfg).eval()
    tried: List[bool] = []
    run = counted.Counter._run

    def watching(self: Any, prepared: Any, *named: Any) -> Any:
        tried.append(self.fast)
        return run(self, prepared, *named)

    monkeypatch.setattr(counted.Counter, "_run", watching)
    result = count_generation(model, torch.zeros(2, 6, dtype=torch.int64, device="meta"), new_tokens=4)
    # the prefill was tried on fakes and refused; then the prefill and the 3 steps as given
    assert tried == [True, False, False, False, False]
    assert any("placeholders" in w for w in result.warnings)
    dense = layers * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64) + 32 * 50
    assert [s.macs for s in result.steps] == [2 * (dense + layers * 4 * 2 * 8 * (6 + s + 1)) for s in range(3)]
