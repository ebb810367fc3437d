"""Model code the built-in LLaMA-family tensor-parallel split cannot run, refused in words
(branch leftfix).

StableLM views q/k/v with its full head count (``view(b, s, num_heads, head_dim)``), and
DiffLlama unpacks each rank's key/value heads in two halves (one head per rank at tp=2): their
parameters are all ones the split takes, so the up-front check (``_check_llama_split``) passes
them, and the planned step fails inside the attention, as a real TP run of the same code does.
Before, that surfaced as a ``TraceError`` wrapping torch's error; now, where the error is raised
under a block's code, not by flopcount's own code, and the same step runs with tp=1, it is a
``UsageError`` naming the block's module, the error, and what to do. A ``tp_plan`` of the user's,
a failure tp=1 shares, and a failure raised by flopcount's code are left as they were.
The oracles: the shapes each error names, derived from the configuration below.
"""

from __future__ import annotations

import textwrap
import warnings
from typing import Any, Callable

import pytest
import torch
from conftest import run_cli as cli
from torch import nn

import flopcount
from flopcount.errors import TensorParallelPlanError, TraceError, UsageError, int_at_least
from flopcount.planning.world import LLAMA_SPLIT, split_refusal, tp_styles

transformers = pytest.importorskip("transformers")

L, H, HEADS, KV, I, V = 2, 64, 4, 2, 128, 128
B, S = 2, 8
HEAD_DIM = H // HEADS
SIZES = dict(num_hidden_layers=L, hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=KV,
             intermediate_size=I, vocab_size=V, max_position_embeddings=64, use_cache=False)
SPLIT = (r"the model's code does not run under the built-in LLaMA-family tensor-parallel split "
         r"\(each of tp=2 ranks holding 1/2 of the heads and of q/k/v's columns\): ")
ADVICE = r" \(the same step with tp=1 runs\): pass tp_plan=\{module path: ParallelStyle\}, or plan with tp=1$"


def _ids() -> torch.Tensor:
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(0))


def _plan(build: Callable[[], nn.Module], **options: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopcount.plan(build, (_ids(),), on=None, **options)


def stablelm() -> nn.Module:
    return transformers.StableLmForCausalLM(transformers.StableLmConfig(**SIZES))


def diffllama() -> nn.Module:
    return transformers.DiffLlamaForCausalLM(transformers.DiffLlamaConfig(**SIZES))


def test_stablelm_viewing_the_full_head_count_is_refused() -> None:
    # a rank's q holds HEADS/2 heads: B*S*(H/2) elements, viewed as [B, S, HEADS, HEAD_DIM]
    underlying = (rf"RuntimeError: shape '\[{B}, {S}, {HEADS}, {HEAD_DIM}\]' is invalid for input of size "
                  rf"{B * S * H // 2}")
    said = SPLIT + r"model\.layers\.0\.self_attn \(StableLmAttention\) raised " + underlying + ADVICE
    with pytest.raises(TensorParallelPlanError, match=said) as caught:
        _plan(stablelm, fsdp=2, tp=2)
    assert isinstance(caught.value, UsageError)
    assert isinstance(caught.value.__cause__, TraceError)  # torch's error, chained
    assert _plan(stablelm, fsdp=2, tp=1).tp == 1  # what the message says runs


def test_diffllama_splitting_a_ranks_one_key_value_head_in_two_is_refused() -> None:
    # KV/2 = 1 key/value head per rank: torch.chunk(v, 2, dim=1) gives one piece, unpacked into two
    underlying = r"ValueError: not enough values to unpack \(expected 2, got 1\)"
    said = SPLIT + r"model\.layers\.0\.self_attn \(DiffLlamaAttention\) raised " + underlying + ADVICE
    with pytest.raises(TensorParallelPlanError, match=said):
        _plan(diffllama, fsdp=1, tp=2)


def test_a_tp_plan_of_the_users_fails_as_before() -> None:
    # the same split passed by hand: the user chose it, the error is torch's, wrapped as before
    by_hand = tp_styles("model.layers.*", LLAMA_SPLIT)
    with pytest.raises(TraceError, match=r"the planned training step failed on rank 0: RuntimeError: shape"):
        _plan(stablelm, fsdp=1, tp=2, tp_plan=by_hand)


class _Attention(nn.Module):
    """The split's names; its forward views q in thirds, which 64 columns (or 32) never take."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(H, H) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(x).view(x.shape[0], x.shape[1], 3, -1)
        return self.o_proj(q.flatten(2) + self.k_proj(x) + self.v_proj(x))


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(H, I), nn.Linear(H, I), nn.Linear(I, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_proj(x) * self.up_proj(x))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn, self.mlp = _Attention(), _Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x + self.self_attn(x))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block() for _ in range(L))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_failure_tp1_shares_is_not_blamed_on_the_split() -> None:
    with pytest.raises(TraceError, match=r"failed on rank 0: RuntimeError: shape '\[2, 8, 3, -1\]' is invalid"):
        flopcount.plan(_Net, (torch.randn(B, S, H),), tp=2, on=None)


class _RaisesInFlopcount(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        int_at_least(-1, 1, "n")  # flopcount's own code raises under the block's forward
        return x


def test_a_failure_raised_by_flopcount_code_is_not_blamed_on_the_split() -> None:
    model = nn.Sequential(nn.ModuleList([_RaisesInFlopcount()]))
    block = model[0][0]
    with pytest.raises(UsageError) as caught:
        block(torch.ones(1))
    asked = []

    def runs_unsplit() -> bool:
        asked.append(True)
        return True

    assert split_refusal(caught.value, model, "0", 2, runs_unsplit) is None
    assert not asked  # refused before a step with tp=1 is run


MODELS = textwrap.dedent(
    """
    import torch
    import transformers
    from torch import nn

    def mlp():
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))

    def stablelm():
        config = transformers.StableLmConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=128, vocab_size=128,
                                             max_position_embeddings=64, use_cache=False)
        return transformers.StableLmForCausalLM(config)
    """
)
CLI_ADVICE = ("run with --tp 1 (FSDP alone), or plan your own split from Python: "
              "flopcount.plan(build, inputs, tp=N, tp_plan={module path: ParallelStyle})")


@pytest.fixture
def workdir(tmp_path: Any, monkeypatch: Any) -> Any:
    (tmp_path / "leftfix_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", ["plan", "check"])
def test_the_cli_says_what_the_cli_can_do_for_a_model_without_blocks(workdir: Any, capsys: Any, command: str) -> None:
    budget = ("--max-memory", "1GB") if command == "check" else ()
    code, out, err = cli(capsys, command, "leftfix_models.py:mlp", "--input", "2x64", "--tp", "2", "-q", *budget)
    assert code == 2 and out == ""
    said = "flopcount: error: no built-in tensor-parallel plan for Sequential: no ModuleList of repeated blocks found: "
    assert [line for line in err.splitlines() if line.strip()] == [said + CLI_ADVICE]


def test_the_cli_refuses_stablelm_in_one_line(workdir: Any, capsys: Any) -> None:
    code, out, err = cli(capsys, "plan", "leftfix_models.py:stablelm", "--input", f"{B}x{S}:int64", "--tp", "2", "-q")
    assert code == 2 and out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1
    assert "model.layers.0.self_attn (StableLmAttention) raised RuntimeError: shape" in lines[0]
    assert lines[0].endswith(f"(the same step with tp=1 runs): {CLI_ADVICE}")
