"""Saved artifacts as ENTRY (issue #30 item 1): a torch.export program (.pt2) counted on its own
input shapes, a TorchScript file, a local Hugging Face folder or config.json, and the files that
are refused (not a model, truncated, a pickle that would run code). Every count is checked
against a hand-derived formula or torch's own FlopCounterMode run live on the eager model."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount.cli import main


def cli(capsys: Any, *args: str) -> Tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def count_json(capsys: Any, *args: str) -> Dict[str, Any]:
    code, out, err = cli(capsys, "count", *args, "--format", "json")
    assert code == 0, err
    data: Dict[str, Any] = json.loads(out)
    return data


def torch_macs(model: nn.Module, *args: Any, **kwargs: Any) -> int:
    """torch's own count, live: FlopCounterMode reports 2 FLOPs per multiply-accumulate of
    conv/mm/addmm/bmm, so its total / 2 is the contraction MACs."""
    with FlopCounterMode(display=False) as counter:
        model(*args, **kwargs)
    total: int = counter.get_total_flops()
    assert total % 2 == 0
    return total // 2


def own_params(model: nn.Module) -> Dict[str, int]:
    """Each module's parameters (itself and below), straight from named_modules."""
    return {name: sum(p.numel() for p in module.parameters()) for name, module in model.named_modules() if name}


# --------------------------------------------------------------------------- a tiny LLaMA, by hand
L, D, HEADS, KV_HEADS, INTER, VOCAB = 2, 64, 4, 2, 128, 100
HEAD_DIM = D // HEADS


def llama_macs(batch: int, seq: int, layers: int = L, lm_head: bool = True) -> int:
    """Per token: q and o are D x D, k and v D x (KV_HEADS * HEAD_DIM), the SwiGLU MLP
    3 x D x INTER, the LM head D x VOCAB; attention per layer and sequence: QK^T and AV,
    each seq^2 x D (every head, no causal halving), as REFERENCES.md states."""
    per_layer = 2 * D * D + 2 * D * KV_HEADS * HEAD_DIM + 3 * D * INTER
    dense = batch * seq * (layers * per_layer + (D * VOCAB if lm_head else 0))
    attention = batch * layers * 2 * seq * seq * D
    return dense + attention


def llama_params(layers: int = L, lm_head: bool = True) -> int:
    """Embedding, per layer the projections and two RMSNorm weights, the final norm, the head."""
    per_layer = 2 * D * D + 2 * D * KV_HEADS * HEAD_DIM + 3 * D * INTER + 2 * D
    return VOCAB * D + layers * per_layer + D + (D * VOCAB if lm_head else 0)


def tiny_llama(**overrides: Any) -> Any:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        num_hidden_layers=L, hidden_size=D, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        intermediate_size=INTER, vocab_size=VOCAB, max_position_embeddings=512, use_cache=False, **overrides,
    )
    return config, transformers.LlamaForCausalLM(config).eval()


# --------------------------------------------------------------------------- files, made once


@pytest.fixture(scope="module")
def files(tmp_path_factory: Any) -> Dict[str, Any]:
    from flopcount.examples.resnet import resnet18

    folder = tmp_path_factory.mktemp("artifacts")
    torch.manual_seed(0)
    resnet = resnet18().eval()
    image = torch.randn(2, 3, 32, 32)
    torch.export.save(torch.export.export(resnet, (image,)), folder / "resnet18.pt2")
    _, llama = tiny_llama()
    ids = torch.randint(0, VOCAB, (2, 16))
    torch.export.save(torch.export.export(llama, (ids,)), folder / "llama.pt2")
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=256)
    dynamic = torch.export.export(llama, (), {"input_ids": ids}, dynamic_shapes={"input_ids": {0: batch, 1: seq}})
    torch.export.save(dynamic, folder / "llama_dynamic.pt2")
    shared = {(folder / name).read_bytes(): None for name in ("resnet18.pt2", "llama.pt2", "llama_dynamic.pt2")}
    return {"dir": folder, "resnet": resnet, "image": image, "llama": llama, "ids": ids, "read": shared}


@pytest.fixture(autouse=True)
def _each_program_read_once(request: Any, monkeypatch: Any) -> None:
    """torch.export.load deserialises these three programs once in this module: the CLI reads
    each again on every call (~0.2 s of CPU each, ~25 calls here); from the second read on it
    gets a deep copy of what torch read the first time (~0.015 s), so no count sees what another
    did to its program. Only these files' bytes are served so: every other file (the refused
    ones: a pickle that runs code, a truncated zip) goes to torch.export.load as it is."""
    if "files" not in request.fixturenames:
        return
    read: Dict[bytes, Any] = request.getfixturevalue("files")["read"]
    load = torch.export.load

    def read_once(f: Any, *args: Any, **kwargs: Any) -> Any:
        data = f.getvalue() if isinstance(f, io.BytesIO) and not args and not kwargs else None
        if data is None or data not in read:
            return load(f, *args, **kwargs)
        if read[data] is None:
            program = load(f)
            read[data] = copy.deepcopy(program)
            return program
        return copy.deepcopy(read[data])

    monkeypatch.setattr(torch.export, "load", read_once)


# --------------------------------------------------------------------------- torch.export programs


@pytest.fixture(scope="module")
def resnet_program(files: Dict[str, Any]) -> Any:
    """The .pt2 read once through the CLI's entry loader (reading a ResNet's program takes a second)."""
    from flopcount.cli.entry import load_entry

    return load_entry(str(files["dir"] / "resnet18.pt2"))


def test_resnet18_pt2_counts_like_the_eager_model_without_input(files, capsys):
    resnet, image = files["resnet"], files["image"]
    data = count_json(capsys, str(files["dir"] / "resnet18.pt2"))
    assert data["inputs"].startswith("(Tensor[2, 3, 32, 32] float32")  # the program's own example shape, batch 2
    assert data["macs"] == torch_macs(resnet, image)  # torch's FlopCounterMode on the eager model, live
    assert data["params"] == sum(p.numel() for p in resnet.parameters())
    from flopcount import count_flops

    eager = count_flops(resnet, image)  # the same counter on the code it was exported from
    assert (data["macs"], data["flops"], data["params"]) == (eager.macs, eager.flops, eager.params)
    _check_module_rows(data, resnet, image)


@pytest.mark.parametrize("tracer", ["dispatch", "jit"])
def test_resnet18_pt2_equals_the_eager_count_for_the_other_tracers(files, resnet_program, tracer):
    from flopcount import count_flops

    resnet, image = files["resnet"], files["image"]
    assert [str(s) for s in resnet_program.default_specs] == ["2x3x32x32"]
    program = count_flops(resnet_program.model, torch.randn(2, 3, 32, 32), tracer=tracer)
    eager = count_flops(resnet, image, tracer=tracer)
    assert (program.macs, program.flops, program.params) == (eager.macs, eager.flops, eager.params)
    assert program.macs == torch_macs(resnet, image)


def _check_module_rows(data: Dict[str, Any], resnet: nn.Module, image: torch.Tensor) -> None:
    """The program's rows keep the original module paths, each with its exact params and,
    for each conv, the MACs by hand."""
    rows = data["by_module"]
    expected = own_params(resnet)
    for name, params in expected.items():
        assert rows[name]["params"] == params, name
    # each conv's MACs, by hand: out elements x in_channels/groups x kernel area
    shapes: Dict[str, Tuple[int, ...]] = {}
    hooks = [m.register_forward_hook(lambda mod, i, o, n=n: shapes.__setitem__(n, tuple(o.shape)))
             for n, m in resnet.named_modules() if isinstance(m, nn.Conv2d)]
    try:
        resnet(image)
    finally:
        for hook in hooks:
            hook.remove()
    for name, out in shapes.items():
        conv = resnet.get_submodule(name)
        by_hand = out[0] * out[1] * out[2] * out[3] * conv.in_channels // conv.groups * conv.kernel_size[0] * conv.kernel_size[1]
        assert rows[name]["macs"] == by_hand, name


def test_llama_pt2_counts_by_hand_without_input(files, capsys):
    data = count_json(capsys, str(files["dir"] / "llama.pt2"))
    assert data["macs"] == llama_macs(2, 16)  # batch 2 x 16 tokens, as exported
    assert data["params"] == llama_params()
    assert "model.layers.1.mlp.down_proj" in data["by_module"]
    assert data["by_module"]["lm_head"]["macs"] == 2 * 16 * D * VOCAB


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_llama_pt2_equals_the_eager_count_for_every_tracer(files, capsys, tracer):
    from flopcount import count_flops

    data = count_json(capsys, str(files["dir"] / "llama.pt2"), "--tracer", tracer)
    eager = count_flops(files["llama"], files["ids"], tracer=tracer)
    # a real run of the eager model (dispatch) checks its all-ones mask with aten::all (2 FLOPs) and
    # skips building it; export traced that check away, so the program has no such op
    checked = eager.operator_totals().get("aten::all")
    mask_check = checked.flops if checked is not None else 0
    assert (data["macs"], data["flops"], data["params"]) == (eager.macs, eager.flops - mask_check, eager.params)
    assert "aten::all" not in data["by_operator"]


def test_dynamic_pt2_takes_its_hint_and_input_overrides_it(files, capsys):
    path = str(files["dir"] / "llama_dynamic.pt2")
    code, out, err = cli(capsys, "count", path, "--format", "json")
    assert code == 0 and json.loads(out)["macs"] == llama_macs(2, 16)
    # counted on fake copies: the unflattened program's placeholders (symbolic sizes) are shared, not copied
    assert "real run" not in err
    data = count_json(capsys, path, "--input", "3x20:int64")  # placed on the program's input_ids keyword
    assert data["macs"] == llama_macs(3, 20)
    assert data["inputs"] == "() with kwargs {input_ids=Tensor[3, 20] int64}"
    assert count_json(capsys, path, "--kwarg", "input_ids=4x8:int64")["macs"] == llama_macs(4, 8)


def test_pt2_on_meta_counts_the_same(files, capsys):
    data = count_json(capsys, str(files["dir"] / "llama_dynamic.pt2"), "--device", "meta", "--input", "3x20:int64")
    assert data["macs"] == llama_macs(3, 20) and data["params"] == llama_params()
    data = count_json(capsys, str(files["dir"] / "llama.pt2"), "--device", "meta")
    assert data["macs"] == llama_macs(2, 16) and data["inputs"] == "(Tensor[2, 16] int64 meta,)"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (["--input", "3x16:int64"], "dimension 0 is static (2) in the program, --input 3x16:int64 gives 3"),
        (["--input", "2x16"], "has dtype float32, the program takes int64"),
        (["--input", "2x16x1:int64"], "has 3 dimension(s), the program takes 2"),
        (["--input", "2x16:int64", "--input", "2x16:int64"], "2 --input given, but the program takes 1 tensor input(s) (input_ids)"),
        (["--kwarg", "mask=2x16:int64"], "--kwarg mask: the program has no input 'mask'"),
    ],
)
def test_input_that_does_not_fit_a_static_program_is_one_line(files, capsys, spec, says):
    code, out, err = cli(capsys, "count", str(files["dir"] / "llama.pt2"), *spec)
    assert code == 2 and out == ""
    assert says in err and "input 'input_ids' (exported as 2x16:int64)" in err or says in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_dynamic_dimension_out_of_its_range_is_refused(files, capsys):
    code, _, err = cli(capsys, "count", str(files["dir"] / "llama_dynamic.pt2"), "--input", "2x300:int64")
    assert code == 2
    assert "dimension 1 (s" in err and "must be in [2, 256]" in err and "gives 300" in err


def test_dynamic_dimension_without_a_recorded_size_names_the_input(files, monkeypatch):
    import transformers.modeling_outputs  # noqa: F401  (registers the program's output type)

    from flopcount.cli import artifacts

    program = torch.export.load(files["dir"] / "llama_dynamic.pt2")
    program.example_inputs = None
    monkeypatch.setattr(artifacts, "_symbol_hint", lambda dim: None)
    made = artifacts.artifact_from_program("llama_dynamic.pt2", program, "cpu")
    assert made.default_specs == () and made.default_kwargs == {}
    assert made.needs_inputs is not None
    assert re.fullmatch(r"llama_dynamic.pt2: dimension 0 of the program's input 'input_ids' is dynamic \(s\w+\) and the program "
                        r"records no size for it; give the input's shape with --input \(e\.g\. --input NxN:int64\)", made.needs_inputs)
    # with --input it counts
    assert made.fit_specs is not None
    specs, kwargs = made.fit_specs([], {"input_ids": artifacts.InputSpec((2, 8), torch.int64)})
    assert specs == [] and kwargs["input_ids"].shape == (2, 8)


def test_other_commands_take_a_pt2(files, capsys):
    path = str(files["dir"] / "llama.pt2")
    code, _, err = cli(capsys, "check", path, "--max-params", str(llama_params() - 1))
    assert code == 1, err
    code, out, err = cli(capsys, "check", path, "--max-params", str(llama_params()), "--max-macs", str(llama_macs(2, 16)))
    assert code == 0, err
    code, out, err = cli(capsys, "bench", path, "--warmup", "1", "--iters", "2", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["macs"] == llama_macs(2, 16)
    code, out, err = cli(capsys, "plan", path, "--fsdp", "2", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["entry"] == path


def test_pt2_training_step_counts_by_hand(tmp_path, capsys):
    """Forward + backward of an exported MLP 16 -> 32 -> 8 on a batch of 4. Forward: 4*16*32 + 4*32*8
    MACs. Backward of sum(outputs): each weight's gradient (the same MACs as its forward) and the
    input gradient of fc2 only (the input needs no gradient): 4*16*32 + 4*32*8 + 4*8*32."""
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    torch.export.save(torch.export.export(mlp, (torch.randn(4, 16),)), tmp_path / "mlp.pt2")
    data = count_json(capsys, str(tmp_path / "mlp.pt2"), "--backward")
    assert data["by_phase"]["forward"]["macs"] == 4 * 16 * 32 + 4 * 32 * 8
    assert data["by_phase"]["backward"]["macs"] == 4 * 16 * 32 + 4 * 32 * 8 + 4 * 8 * 32
    assert data["params"] == 16 * 32 + 32 + 32 * 8 + 8


def test_output_never_overwrites_the_artifact(files, capsys):
    path = files["dir"] / "llama.pt2"
    before = path.read_bytes()
    code, _, err = cli(capsys, "count", str(path), "--format", "json", "--output", str(path))
    assert code == 2 and "refusing to overwrite" in err
    assert path.read_bytes() == before


# --------------------------------------------------------------------------- TorchScript


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: Any) -> Tuple[Path, nn.Module]:
    folder = tmp_path_factory.mktemp("torchscript")
    net = Net().eval()
    torch.jit.save(torch.jit.script(net), folder / "net.pt")
    return folder / "net.pt", net


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_torchscript_counts_with_input(scripted, capsys, tracer):
    path, net = scripted
    data = count_json(capsys, str(path), "--input", "4x3x16x16", "--tracer", tracer)
    x = torch.randn(4, 3, 16, 16)
    # by hand: conv 4 x 8 x 16 x 16 outputs x 3 x 3 x 3, linear 4 x 2048 x 10
    assert data["macs"] == 4 * 8 * 16 * 16 * 27 + 4 * 2048 * 10 == torch_macs(net, x)
    assert data["params"] == sum(p.numel() for p in net.parameters())


def test_torchscript_on_meta(scripted, capsys):
    path, net = scripted
    data = count_json(capsys, str(path), "--input", "2x3x16x16", "--device", "meta")
    assert data["macs"] == torch_macs(net, torch.randn(2, 3, 16, 16))


def test_torchscript_needs_input_and_not_the_jit_tracer(scripted, capsys):
    path, _ = scripted
    code, out, err = cli(capsys, "count", str(path))
    assert code == 2 and out == "" and "TorchScript file, which records no input shapes: give them with --input" in err
    code, _, err = cli(capsys, "count", str(path), "--input", "1x3x16x16", "--tracer", "jit")
    assert code == 2 and "use --tracer auto or dispatch" in err


# --------------------------------------------------------------------------- local Hugging Face configs


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: Any) -> Path:
    config, _ = tiny_llama()
    folder = tmp_path_factory.mktemp("hf") / "checkpoint"
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(folder)  # config.json only: the weights are random anyway
    return folder


def test_hf_folder_and_config_file(hf_folder, capsys, monkeypatch):
    monkeypatch.chdir(hf_folder.parent)
    for entry in ("hf:./checkpoint", f"hf:{hf_folder / 'config.json'}"):
        data = count_json(capsys, entry, "--input", "2x16:int64")
        assert data["macs"] == llama_macs(2, 16), entry
        assert data["params"] == llama_params(), entry
    data = count_json(capsys, "hf:./checkpoint", "--input", "3x8:int64", "--config", "num_hidden_layers=3")
    assert data["macs"] == llama_macs(3, 8, layers=3)


def test_hf_folder_on_meta_and_its_architecture(hf_folder, capsys, tmp_path):
    data = count_json(capsys, f"hf:{hf_folder}", "--input", "2x16:int64", "--device", "meta")
    assert data["macs"] == llama_macs(2, 16) and data["params"] == llama_params()
    raw = json.loads((hf_folder / "config.json").read_text())
    raw["architectures"] = ["LlamaModel"]  # what shipped: the bare decoder, no LM head
    (tmp_path / "config.json").write_text(json.dumps(raw))
    data = count_json(capsys, f"hf:{tmp_path}/config.json", "--input", "2x16:int64")
    assert data["macs"] == llama_macs(2, 16, lm_head=False) and data["params"] == llama_params(lm_head=False)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ({"model_type": "llama", "auto_map": {"AutoModel": "modeling_x.X"}}, "needs the checkpoint's own Python code"),
        ({"hidden_size": 8}, "has no \"model_type\""),
        ("{not json", "is not a JSON config"),
    ],
)
def test_bad_hf_configs(tmp_path, capsys, content, says):
    (tmp_path / "config.json").write_text(content if isinstance(content, str) else json.dumps(content))
    code, out, err = cli(capsys, "count", f"hf:{tmp_path}")
    assert code == 2 and out == "" and says in err and len(err.strip().splitlines()) == 1


def test_missing_hf_folder(tmp_path, capsys):
    code, _, err = cli(capsys, "count", f"hf:{tmp_path}/nothing")
    assert code == 2 and "no such folder or file" in err
    (tmp_path / "empty").mkdir()
    code, _, err = cli(capsys, "count", f"hf:{tmp_path}/empty")
    assert code == 2 and "has no config.json" in err


# --------------------------------------------------------------------------- refused files


class _Touch:
    """Unpickling this creates ``path``: the proof that code from a file ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (Path.touch, (self.path,))


def _replace_member(source: Path, target: Path, suffix: str, blob: bytes) -> None:
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            new.writestr(info, blob if info.filename.endswith(suffix) else old.read(info))


def test_pt2_with_a_code_running_pickle_is_refused_before_anything_runs(tmp_path, capsys):
    program = torch.export.export(nn.Linear(4, 2), (torch.randn(3, 4),))
    good = tmp_path / "good.pt2"
    torch.export.save(program, good)
    sentinel = tmp_path / "code-ran"
    payload = io.BytesIO()
    torch.save(_Touch(sentinel), payload)
    bad = tmp_path / "bad.pt2"
    _replace_member(good, bad, "sample_inputs/model.pt", payload.getvalue())
    # torch.export.load itself runs it (its example inputs fall back to weights_only=False; torch
    # then fails to format its own log line, which pytest's log capture turns into an error)
    with contextlib.suppress(Exception):
        torch.export.load(bad)
    assert sentinel.exists()
    sentinel.unlink()
    code, out, err = cli(capsys, "count", str(bad))
    assert code == 2 and out == ""
    assert "holds a pickled object" in err and "weights_only=True" in err and "does not unpickle it" in err
    assert not sentinel.exists()
    # the good one counts: 3 x 4 x 2 MACs, 4 x 2 + 2 params
    data = count_json(capsys, str(good))
    assert (data["macs"], data["params"]) == (3 * 4 * 2, 10)


def test_pt2_with_compiled_code_is_refused(tmp_path, capsys):
    program = torch.export.export(nn.Linear(4, 2), (torch.randn(3, 4),))
    good = tmp_path / "good.pt2"
    torch.export.save(program, good)
    with zipfile.ZipFile(good) as old, zipfile.ZipFile(tmp_path / "aoti.pt2", "w") as new:
        prefix = old.namelist()[0].split("/")[0]
        for info in old.infolist():
            new.writestr(info, old.read(info))
        new.writestr(f"{prefix}/data/aotinductor/model/model.so", b"\x7fELF not really")
    code, out, err = cli(capsys, "count", str(tmp_path / "aoti.pt2"))
    assert code == 2 and out == ""
    assert "holds compiled AOTInductor code" in err and "loads no native code" in err


def test_pickled_module_and_state_dict_are_refused(tmp_path, capsys):
    sentinel = tmp_path / "code-ran"
    torch.save(_Touch(sentinel), tmp_path / "model.pt")
    code, out, err = cli(capsys, "count", str(tmp_path / "model.pt"))
    assert code == 2 and out == "" and not sentinel.exists()
    assert "torch.save pickle of Python objects" in err and "weights_only=False" in err and "torch.export.save" in err
    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "weights.pth")
    code, _, err = cli(capsys, "count", str(tmp_path / "weights.pth"))
    assert code == 2 and "holding a state_dict (weights without the architecture)" in err
    torch.save(nn.Linear(2, 2), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    code, _, err = cli(capsys, "count", str(tmp_path / "legacy.pt"))
    assert code == 2 and "plain pickle" in err
    (tmp_path / "raw.pt").write_bytes(pickle.dumps(_Touch(sentinel)))
    code, _, err = cli(capsys, "count", str(tmp_path / "raw.pt"))
    assert code == 2 and "plain pickle" in err and not sentinel.exists()


def test_not_a_model_truncated_and_missing_files(tmp_path, capsys):
    program = torch.export.export(nn.Linear(4, 2), (torch.randn(3, 4),))
    torch.export.save(program, tmp_path / "good.pt2")
    data = (tmp_path / "good.pt2").read_bytes()
    (tmp_path / "cut.pt2").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.pt2").write_text("not a model\n")
    (tmp_path / "empty.pt").write_bytes(b"")
    with zipfile.ZipFile(tmp_path / "other.pt2", "w") as archive:
        archive.writestr("readme.txt", "hello")
    cases = {
        "cut.pt2": "is a truncated or corrupt zip archive",
        "text.pt2": "is not a model file (not a zip archive)",
        "empty.pt": "is not a model file (empty)",
        "other.pt2": "neither a torch.export program (.pt2) nor a TorchScript file",
        "missing.pt2": "file not found",
    }
    for name, says in cases.items():
        code, out, err = cli(capsys, "count", str(tmp_path / name))
        assert code == 2 and out == "", name
        assert says in err, (name, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, name


def test_failed_load_leaves_torch_logging_as_found(tmp_path, capsys):
    logger = logging.getLogger("torch.export")
    before = list(logger.filters)
    (tmp_path / "bad.pt2").write_bytes(b"PK\x03\x04garbage")
    code, _, _ = cli(capsys, "count", str(tmp_path / "bad.pt2"))
    assert code == 2 and logger.filters == before


def test_config_is_refused_for_a_file(files, capsys):
    code, _, err = cli(capsys, "count", str(files["dir"] / "llama.pt2"), "--config", "depth=3")
    assert code == 2 and "--config needs a factory or an hf: config" in err
