"""Branch audit2: findings of a user's audit of predict, check --on and the bounds' readings,
each with its regression. Oracles: the datasheet figures in flopcount/devices/parts.py (cited
there) and hand arithmetic on them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopcount
from flopcount.devices import is_this_machine, measured, named_roofs


@pytest.mark.parametrize("name", ["this cpu", "This CPU", "this-cpu"])
def test_this_cpu_names_this_machine(name, monkeypatch):
    """'this gpu' named the GPU but 'this cpu' was an unknown device: the CPU's own name."""
    sentinel = named_roofs("t4")
    monkeypatch.setattr(measured, "machine_roofs", lambda device: sentinel)
    assert is_this_machine(name)
    assert named_roofs(name) is sentinel


def test_the_any_bound_line_shows_the_division_it_made():
    """The any-implementation line read 'unavoidable 8.40 MB / DRAM bandwidth 13.7 us' on a T4,
    where 8.40 MB / 320 GB/s is 26.2 us: the 4 MB the L2 holds was taken off unsaid."""
    model = nn.Linear(2048, 2048)
    b = flopcount.predict(model, torch.randn(1, 2048), on="t4", dtype="bfloat16")
    # bfloat16: weight 2048 x 2048 x 2 B + bias 2048 x 2 B + input 2048 x 2 B
    unavoidable = 2048 * 2048 * 2 + 2048 * 2 + 2048 * 2
    assert unavoidable == 8_396_800
    l2 = 4e6  # T4 datasheet: 4 MB L2
    memory_s = (unavoidable - l2) / 320e9  # T4 datasheet: 320 GB/s
    assert b.any_bound.unavoidable_bytes == unavoidable
    assert b.any_bound.faster_bytes == l2
    assert b.any_bound.memory_s == pytest.approx(memory_s)
    line = next(text for text in b.table().splitlines() if text.startswith("Any implementation"))
    assert "unavoidable 8.40 MB less the 4.00 MB the faster levels hold / DRAM bandwidth 13.7 us" in line


def test_the_any_bound_line_says_when_the_l2_sets_no_memory_term():
    """On an H100 the same 8.40 MB fit its 50 MB L2, whose bandwidth NVIDIA does not publish:
    the line printed 'L2 bandwidth 0.0 us', a division by a figure that does not exist."""
    b = flopcount.predict(nn.Linear(2048, 2048), torch.randn(1, 2048), on="h100", dtype="bfloat16")
    assert b.any_bound.memory_s == 0.0 and b.any_bound.level_bandwidth is None
    line = next(text for text in b.table().splitlines() if text.startswith("Any implementation"))
    assert "unavoidable 8.40 MB held in the L2, whose bandwidth is unpublished: no memory term" in line


class _Vision(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x)


def test_generating_with_a_model_that_takes_no_prompt_is_refused_by_name():
    """count_generation (CLI: --generate, serve) on a vision model failed inside its forward:
    'ResNet.forward() got an unexpected keyword argument 'input_ids''."""
    model = _Vision()
    with pytest.raises(flopcount.UsageError) as caught:
        flopcount.count_generation(model, torch.randint(0, 10, (1, 8)), new_tokens=2)
    assert str(caught.value) == ("count_generation counts generate() of a language model, whose forward takes the prompt "
                                 "as input_ids; _Vision.forward(x) takes no input_ids")


@pytest.mark.parametrize("threads", [1, 2])
def test_a_cpu_latency_says_how_many_threads_ran_it(threads):
    """CPU latency depends on torch's thread count; the result recorded it, but the text
    ('latency on cpu (perf_counter, eager, ...)') and the CLI's heading did not say it."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        result = flopcount.benchmark(nn.Linear(8, 8), torch.randn(2, 8), iters=3, warmup=0)
    finally:
        torch.set_num_threads(before)
    assert result.threads == threads
    word = "thread" if threads == 1 else "threads"
    assert str(result).startswith(f"latency on cpu, {threads} {word} (perf_counter, eager")


def _title_inside_its_figure(figure) -> bool:
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    page = figure.bbox
    for ax in figure.axes:
        box = ax.title.get_window_extent(renderer)
        if box.x0 < page.x0 or box.x1 > page.x1 or box.y1 > page.y1:
            return False
    return True


@pytest.mark.parametrize("with_lookup", [False, True])
def test_the_roofline_title_stays_inside_the_figure(with_lookup):
    """The roofline's title holds the roofs' source, a sentence when they were measured
    ('measured (cached; measured 2026-11-28T05:05:32Z, best of GEMM/conv/linear per dtype;
    streams per memory level)'): it ran off both sides of the saved PNG."""
    pytest.importorskip("matplotlib")
    from dataclasses import replace

    from flopcount.report.roofline_plot import draw_roofline

    source = ("measured (cached; measured 2026-11-28T05:05:32Z, best of GEMM/conv/linear per dtype; streams per "
              "memory level)")
    roofs = replace(named_roofs("t4"), device="AMD EPYC (2 threads)", source=source)
    model = nn.Sequential(nn.Embedding(100, 64), nn.Linear(64, 64)) if with_lookup else nn.Linear(64, 64)
    inputs = torch.randint(0, 100, (4, 8)) if with_lookup else torch.randn(4, 64)
    result = flopcount.profile(model, inputs, roofs=roofs, warmup=1, steps=1)
    figure = draw_roofline(result)
    assert len(figure.axes) == (2 if with_lookup else 1)
    assert source.replace(" ", "") in figure.axes[0].get_title().replace("\n", "").replace(" ", "")
    assert _title_inside_its_figure(figure)


def test_the_whole_model_has_one_name_in_every_per_module_table():
    """count, memory and diff tables name the whole model '(model)'; profile's module table
    wrote '<model>', its op table '<root>', module_latency '(root)'."""
    model = _Doubled()
    x = torch.randn(2, 8)
    count_rows = flopcount.count_flops(model, x).table().splitlines()
    profiled = flopcount.profile(model, x, roofs=named_roofs("t4"), warmup=1, steps=1)
    timed = flopcount.module_latency(model, x, iters=3, warmup=1)
    first_cells = {
        "count": count_rows[2].split()[0],
        "profile by module": profiled.table(by="module").splitlines()[2].split()[0],
        "module_latency": str(timed).splitlines()[2].split()[0],
    }
    assert first_cells == dict.fromkeys(first_cells, "(model)")
    # the op table: the multiply runs in the root module itself
    mul = next(line.split() for line in profiled.table(by="op").splitlines() if line.startswith("aten::mul"))
    assert mul[:3] == ["aten::mul", "(model)", "forward"]


class _Doubled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) * 2


def test_the_tables_eager_line_gives_the_eager_bound_not_only_the_per_op_sum():
    """predict's table said 'Eager lower bound (per-op sum) on T4: 517.8 ns' where the eager
    bound (bound_s("eager"), what check --bound eager holds a budget to) is 13.8 us: eight 1 MB
    weights each fit the T4's 4 MB L2, so per op no memory term, but together they must be read."""
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(8)])
    b = flopcount.predict(model, torch.randn(1, 512), on="t4")
    per_op_s = 8 * 2 * 512 * 512 / 8.1e12  # T4 datasheet: 8.1 TFLOP/s FP32
    any_s = ((8 * (512 * 512 + 512) + 512) * 4 - 4e6) / 320e9  # less the 4 MB L2, over 320 GB/s
    assert b.latency_s == pytest.approx(per_op_s, rel=1e-3)  # the ReLU-free stack: the linears' FLOPs
    assert b.bound_s("eager") == pytest.approx(any_s)
    line = next(text for text in b.table().splitlines() if text.startswith("Eager"))
    assert line.startswith("Eager lower bound on T4: 13.8 us: the per-op sum 517.8 ns")
    assert line.endswith(", or the any-implementation bound below where larger")
