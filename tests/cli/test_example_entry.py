"""``example:NAME``: the architectures shipped in flopcount.examples, usable from any directory."""

from __future__ import annotations

import json

from flopcount.cli import main
from flopcount.examples import CATALOG

RESNET18_PARAMS = 11_689_512  # torchvision's published num_params


def _vit_tiny_macs(batch: int) -> int:
    # 32x32 image, 8x8 patches -> 16 patches + class token; dim 64, 4 heads, MLP 128, 2 blocks, 10 classes
    tokens, dim, mlp, blocks = 17, 64, 128, 2
    patch_embed = 16 * dim * (3 * 8 * 8)
    block = tokens * dim * 3 * dim + 2 * tokens * tokens * dim + tokens * dim * dim + 2 * tokens * dim * mlp
    head = dim * 10  # the class token only
    return batch * (patch_embed + blocks * block + head)


def _count_json(capsys, *args: str):
    code = main(["count", *args, "--format", "json", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_example_entry_uses_the_usual_input_from_anywhere(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = _count_json(capsys, "example:vit_tiny")
    assert data["inputs"] == "(Tensor[2, 3, 32, 32] float32,)"
    assert data["macs"] == _vit_tiny_macs(2)
    assert data["entry"] == "example:vit_tiny"


def test_example_entry_takes_input_and_device(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = _count_json(capsys, "example:vit_tiny", "--input", "3x3x32x32", "--tracer", "dispatch")
    assert data["macs"] == _vit_tiny_macs(3)
    data = _count_json(capsys, "example:resnet18", "--device", "meta")
    assert data["params"] == RESNET18_PARAMS


def test_unknown_example_lists_the_catalog(capsys):
    code = main(["count", "example:resnet5"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1
    assert "did you mean resnet50, resnet18" in err
    for name in CATALOG:
        assert name in err


def test_checkout_examples_folder_still_re_exports():
    from examples.resnet import resnet18 as old
    from flopcount.examples.resnet import resnet18 as new

    assert old is new


def test_catalog_entries_exist_and_help_names_the_form(capsys):
    import importlib

    for example in CATALOG.values():
        if not example.needs:
            assert callable(getattr(importlib.import_module(f"flopcount.examples.{example.module}"), example.attr))
    assert main(["count", "--help"]) == 0
    assert "example:NAME" in capsys.readouterr().out


def test_a_users_own_example_module_still_imports(tmp_path, monkeypatch, capsys):
    (tmp_path / "example.py").write_text("from torch import nn\n\ndef tiny():\n    return nn.Linear(4, 3)\n")
    monkeypatch.chdir(tmp_path)
    data = _count_json(capsys, "example:tiny", "--input", "2x4")
    assert data["macs"] == 2 * 4 * 3
