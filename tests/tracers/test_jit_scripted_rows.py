"""Branch jitrows: a TorchScript module (scripted, traced, loaded from a ``.pt``) booked per layer.

TorchScript runs submodules without Python's module hooks; before this branch every layer's row
read 0 and all the work sat on the scripted root. Oracle: the eager model's rows counted by the
fake tracer (tracer="auto" on the plain module), and FLOPs by hand from the layer shapes
(a Linear: 2 * rows * in * out FLOPs, rows * in * out MACs; biases not counted, docs/conventions.md)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import flopcount
from flopcount.tracers.jit.scripted import module_path, scripted_graph, scripted_scopes

N = 4


class MLP(nn.Module):
    def __init__(self, d: int = 16, h: int = 32):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    """A Linear, then an MLP (a module with children): a parent row = its own + its children's."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(16, 16)
        self.mlp = MLP()

    def forward(self, x):
        return self.mlp(self.l1(x))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.bn(self.conv(x)))), 1))


def _rows(result):
    return {info.name: (result._module_sums(info.name).flops, result._module_sums(info.name).macs)
            for info in result.modules}


def _ops(result):
    """FLOPs and MACs by operator, the ops that cost any (zero-cost views are spelled per tracer:
    jit's ``flatten``, the fake tracer's ``view`` and batch norm's ``empty``)."""
    return {op: (t.flops, t.macs) for op, t in result.operator_totals().items() if t.flops or t.macs}


def _count(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit's deprecation warnings
        return flopcount.count_flops(model, x)


def _program(model, x, how, tmp_path=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.jit.script(model) if how == "script" else torch.jit.trace(model, x)
        if tmp_path is not None:
            torch.jit.save(program, str(tmp_path / f"{how}.pt"))
            program = torch.jit.load(str(tmp_path / f"{how}.pt"))
    return program


def _net_by_hand():
    l1, fc1, act, fc2 = 2 * N * 16 * 16, 2 * N * 16 * 32, N * 32, 2 * N * 32 * 16
    return {
        "": (l1 + fc1 + act + fc2, (l1 + fc1 + fc2) // 2),
        "l1": (l1, l1 // 2),
        "mlp": (fc1 + act + fc2, (fc1 + fc2) // 2),
        "mlp.fc1": (fc1, fc1 // 2),
        "mlp.act": (act, 0),
        "mlp.fc2": (fc2, fc2 // 2),
    }


@pytest.mark.parametrize("loaded", [False, True], ids=["in-process", "loaded"])
@pytest.mark.parametrize("how", ["script", "trace"])
def test_a_torchscript_mlp_books_each_layer(how, loaded, tmp_path):
    """Before: every row but the root's read (0, 0)."""
    model, x = Net().eval(), torch.randn(N, 16)
    program = _program(model, x, how, tmp_path if loaded else None)
    eager, jitted = _count(model, x), _count(program, x)
    assert _rows(jitted) == _rows(eager) == _net_by_hand()
    assert _ops(jitted) == _ops(eager)
    assert not any("TorchScript runs the submodules" in w for w in jitted.warnings)


@pytest.mark.parametrize("tracer", ["auto", "jit"])
def test_a_traced_conv_net_books_each_layer_as_the_fake_tracer(tracer, tmp_path):
    """Conv, batch norm, pool, Linear head: the rows and per-op FLOPs/MACs of the fake tracer on the
    eager model; the conv's MACs by hand (8 x 8 outputs, 8 channels, 3 * 3 * 3 taps, batch 2). Before:
    "auto" booked everything on the root; "jit" refused a TorchScript module."""
    model, x = ConvNet().eval(), torch.randn(2, 3, 8, 8)
    program = _program(model, x, "trace", tmp_path)
    eager = _count(model, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jitted = flopcount.count_flops(program, x, tracer=tracer)
    assert _rows(jitted) == _rows(eager)
    assert _rows(jitted)["conv"][1] == 2 * 8 * 8 * 8 * 3 * 3 * 3
    assert _rows(jitted)["fc"] == (2 * 2 * 8 * 4, 2 * 8 * 4)
    assert _ops(jitted) == _ops(eager)


def test_the_program_and_its_tensors_are_left_as_found(tmp_path):
    model, x = Net().eval(), torch.randn(N, 16)
    program = _program(model, x, "trace", tmp_path)
    state = {k: v.clone() for k, v in program.state_dict().items()}
    graph, training, given = str(program.graph), program.training, x.clone()
    _count(program, x)
    assert str(program.graph) == graph and program.training == training
    assert all(torch.equal(state[k], v) for k, v in program.state_dict().items())
    assert torch.equal(x, given)


def test_a_path_that_names_no_known_module_is_kept_on_its_parent_and_said():
    """The fallback: a hierarchy naming a module the model facts do not list (here ``mlp.fc1``,
    left out of the names given) is booked on the nearest known module and reported."""
    model, x = Net().eval(), torch.randn(N, 16)
    program = _program(model, x, "trace")
    graph = scripted_graph(program, [x])
    assert graph is not None
    names = {module: name for name, module in program.named_modules() if name != "mlp.fc1"}
    scopes, calls, unread = scripted_scopes(graph, names)
    assert unread == ["mlp(MLP).fc1(Linear)"]
    assert sorted(set(scopes.values())) == ["l1", "mlp", "mlp/mlp.act", "mlp/mlp.fc2"]
    assert calls == {"": 1, "l1": 1, "mlp": 1, "mlp.act": 1, "mlp.fc2": 1}


def test_module_hierarchies_read_as_paths():
    assert module_path("") == ""
    assert module_path("mlp(MLP).fc1(Linear)") == "mlp.fc1"
    assert module_path("mlp(MLP).act(ReLU).UNKNOWN_INSTANCE(UNKNOWN_TYPE)") == "mlp.act"
    assert module_path("blocks(ModuleList).0(Block(x))") == "blocks.0"
    assert module_path("broken(") is None


def test_a_scripted_module_with_control_flow_is_still_run():
    """A scripted batch norm holds ``if self.training``: its graph is not one fixed op sequence,
    so the program is run as before (the dispatch tracer, its work on the scripted module)."""
    model, x = ConvNet().eval(), torch.randn(2, 3, 8, 8)
    program = _program(model, x, "script")
    assert scripted_graph(program, [x]) is None
    result = _count(program, x)
    assert result.flops == _count(model, x).flops
    assert any("TorchScript runs the submodules" in w for w in result.warnings)


@pytest.mark.parametrize("how", ["script", "trace"])
def test_a_torchscript_program_shows_its_original_classes(how, tmp_path):
    """Before: every row of a loaded program read ``RecursiveScriptModule`` (in process, a traced
    one ``TopLevelTracedModule``/``TracedModule``); now the classes of the eager model, row by row."""
    model, x = Net().eval(), torch.randn(N, 16)
    expected = {name: type(module).__name__ for name, module in model.named_modules()}
    for program in (_program(model, x, how), _program(model, x, how, tmp_path)):
        assert {info.name: info.type_name for info in _count(program, x).modules} == expected


def test_a_program_run_unseen_keeps_its_torchscript_class():
    """The fallback (a scripted batch norm's control flow): the submodules ran without Python's
    hooks, and their rows keep ``RecursiveScriptModule``, which the diff reads as unknown costs."""
    model, x = ConvNet().eval(), torch.randn(2, 3, 8, 8)
    types = {info.name: info.type_name for info in _count(_program(model, x, "script"), x).modules}
    assert set(types.values()) == {"RecursiveScriptModule"}


def test_a_traced_resnet18_books_every_row_as_the_fake_tracer():
    """68 modules (examples/resnet.py, 1x3x64x64): every row's FLOPs and MACs, every class name and
    every costing op equal the fake tracer's on the eager model; the stem conv by hand (7 x 7 x 3
    taps, 64 channels, 32 x 32 outputs). Before: 67 rows read 0."""
    from flopcount.examples.resnet import resnet18

    model, x = resnet18().eval(), torch.randn(1, 3, 64, 64)
    eager, jitted = _count(model, x), _count(_program(model, x, "trace"), x)
    assert jitted.tracer == "jit" and len(jitted.modules) == 68
    assert _rows(jitted) == _rows(eager)
    assert _rows(jitted)["conv1"][1] == 7 * 7 * 3 * 64 * 32 * 32
    assert [info.type_name for info in jitted.modules] == [info.type_name for info in eager.modules]
    assert _ops(jitted) == _ops(eager)


def test_under_autocast_a_scripted_program_is_run_not_read_from_its_fp32_graph():
    """Under ``torch.autocast`` TorchScript casts as it runs (its graph then holds
    ``aten::_autocast_to_reduced_precision`` nodes): the graph read booked float32 bytes and left
    those casts unsupported (an incomplete count); the program is run as before. Oracles: a
    FlopCounterMode run live, the ReLU by the conventions, the bytes of the real run (tracer="dispatch")."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)).eval()
    scripted = torch.jit.script(model)
    x = torch.randn(8, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        result = flopcount.count_flops(scripted, (x,))
        with FlopCounterMode(display=False) as oracle:
            scripted(x)
    assert not result.unsupported_ops()
    # the two products (FlopCounterMode's) and the ReLU, one FLOP an element (docs/conventions.md)
    assert oracle.get_total_flops() == 2 * 8 * (64 * 32 + 32 * 16)
    assert result.flops == oracle.get_total_flops() + 8 * 32
    assert "aten::_to_copy" in result.by_operator()  # the casts autocast ran, booked
    with torch.autocast("cpu", dtype=torch.bfloat16):
        real = flopcount.count_flops(scripted, (x,), tracer="dispatch")
    assert (result.bytes_read, result.bytes_written) == (real.bytes_read, real.bytes_written)
