"""torchvision's custom ops (issue #9: every detection model ran nms/roi_align without a handler).

The handler tests run without torchvision: each builds the OpCall a tracer would record and
checks the figure against the kernel's arithmetic written out by hand (torchvision's CPU
kernels, torchvision/csrc/ops/cpu/*_kernel.cpp; the per-step constants are derived in
docs/conventions.md "torchvision ops"). The tests at the end need torchvision (skipped without
it): the real ops under every tracer, their backward, and a detection model."""

from __future__ import annotations

import warnings

import _tv_kernels as kernels
import pytest
import torch
from conftest import Fn, assert_same_state, snapshot
from torch import nn

from flopcount import Cost, count_flops
from flopcount.handlers import build_default_registry
from flopcount.types import OpCall, TensorMeta

REG = build_default_registry()


def T(*shape: int) -> TensorMeta:
    return TensorMeta(tuple(shape), "torch.float32")


def cost(op: str, **args) -> Cost:
    handler = REG.resolve(op)
    assert callable(handler), op
    return handler(OpCall(op, args, ()))


# -- per-step constants, read off the CPU kernels (each listed once here, independently of the handler module)
IOU = 4 + 2 + 2 + 1 + 2 + 1 + 1  # max/min corners 4, w/h 2, clamp 2, inter 1, union 2, divide 1, compare 1
ROI_SETUP = 4 + 4 + 2 + 2  # x scale 4, - offset 4, width/height 2, bin sizes 2
COORD = 6  # start + p*bin + (i + .5)*bin/grid: mul, add, add, mul, div, add
WEIGHTS = 4 + 2 + 2 + 2 + 4  # in-map test 4 compares, clamps at 0 2, ly lx, hy hx, w1..w4
TAPS = 4 + 3 + 1  # 4 products, 3 adds, accumulate
GRAD_TAPS = 4 + 4 + 4  # grad*w (4), /count (4), scatter adds (4)


def test_nms_counts_every_pair_as_an_upper_bound():
    # 5 boxes: areas 3 each; sort 5 x ceil(log2 5) = 15 comparisons; 10 pairs
    found = cost("torchvision::nms", dets=T(5, 4), scores=T(5), iou_threshold=0.5)
    assert found.macs == 0
    assert found.flops == 5 * 3 + 5 * 3 + 10 * IOU == 160
    assert "upper bound" in found.note
    assert cost("torchvision::nms", dets=T(1, 4), scores=T(1), iou_threshold=0.5) == Cost.from_flops(3)
    assert cost("torchvision::nms", dets=T(0, 4), scores=T(0), iou_threshold=0.5) == Cost()
    # the quantized variant runs the same loop
    assert cost("torchvision::qnms", dets=T(5, 4), scores=T(5), iou_threshold=0.5).flops == 160


def test_roi_align_fixed_sampling_is_exact():
    # 3 RoIs over (2, 8, 7, 12), 2 x 2 bins, 2 x 2 samples per bin, not aligned
    args = dict(input=T(2, 8, 7, 12), rois=T(3, 5), spatial_scale=0.5, pooled_height=2, pooled_width=2, sampling_ratio=2)
    per_roi = ROI_SETUP + 2 + 4 * (2 * COORD + 4 * (COORD + WEIGHTS))  # + 2 clamps to >= 1 when not aligned
    per_output = 4 * TAPS + 1  # 4 samples of 4 taps, one divide
    found = cost("torchvision::roi_align", aligned=False, **args)
    assert found.flops == 3 * per_roi + 3 * 8 * 4 * per_output == 1146 + 3168
    assert found.macs == 0 and found.note == ""
    assert cost("torchvision::roi_align", aligned=True, **args).flops == 3 * (per_roi - 2) + 3168
    assert cost("torchvision::qroi_align", aligned=False, input_scale=0.1, input_zero_point=0, rois_scale=0.1,
                rois_zero_point=0, **args).flops == 4314


def test_roi_align_adaptive_sampling_assumes_the_whole_map():
    # sampling_ratio=-1: grid ceil(RoI / bins) per axis; the RoI taken as the whole 7 x 12 map
    found = cost("torchvision::roi_align", input=T(2, 8, 7, 12), rois=T(3, 5), spatial_scale=0.5,
                 pooled_height=2, pooled_width=2, sampling_ratio=-1, aligned=True)
    gh, gw = 4, 6  # ceil(7 / 2), ceil(12 / 2)
    per_roi = ROI_SETUP + 4 + 4 * (gh * COORD + gh * gw * (COORD + WEIGHTS))  # + 2 divides, 2 ceils for the grid
    assert found.flops == 3 * per_roi + 3 * 8 * 4 * (gh * gw * TAPS + 1)
    assert "whole feature map" in found.note
    empty = cost("torchvision::roi_align", input=T(2, 8, 7, 12), rois=T(0, 5), spatial_scale=0.5,
                 pooled_height=2, pooled_width=2, sampling_ratio=-1, aligned=True)
    assert empty == Cost()


def test_roi_align_backward_redoes_the_weights_per_gradient_element():
    found = cost("torchvision::_roi_align_backward", grad=T(3, 8, 2, 2), rois=T(3, 5), spatial_scale=0.5,
                 pooled_height=2, pooled_width=2, batch_size=2, channels=8, height=7, width=12, sampling_ratio=2,
                 aligned=False)
    per_element = ROI_SETUP + 2 + 2 * COORD + 4 * (COORD + WEIGHTS + GRAD_TAPS)
    assert found.flops == 96 * per_element == 96 * 154


def test_roi_pool_compares_every_element_of_its_bins():
    # bins of a 7-row map in 2: rows [0, 4) and [3, 7) -> 8 rows; 12 columns in 2: 12 -> 96 elements
    found = cost("torchvision::roi_pool", input=T(2, 8, 7, 12), rois=T(3, 5), spatial_scale=0.5,
                 pooled_height=2, pooled_width=2)
    setup = 4 + 4 + 2  # scale, round, bin sizes
    bins = 4 + 4  # start/end products, floor/ceil
    assert found.flops == 3 * setup + 3 * 4 * bins + 3 * 8 * 96 == 30 + 96 + 2304
    assert "whole feature map" in found.note
    backward = cost("torchvision::_roi_pool_backward", grad=T(3, 8, 2, 2), rois=T(3, 5), argmax=T(3, 8, 2, 2),
                    spatial_scale=0.5, pooled_height=2, pooled_width=2, batch_size=2, channels=8, height=7, width=12)
    assert backward.flops == 96  # one add per gradient element


def test_position_sensitive_ops():
    # 8 channels in 2 x 2 bins -> 2 output channels, each bin reads one input channel
    common = dict(rois=T(3, 5), spatial_scale=0.5, pooled_height=2, pooled_width=2)
    pool = cost("torchvision::ps_roi_pool", input=T(2, 8, 7, 12), **common)
    assert pool.flops == 30 + 3 * 2 * (8 * 4 + 96 + 4)  # setup, bin bounds, window adds, divides
    pool_back = cost("torchvision::_ps_roi_pool_backward", grad=T(3, 2, 2, 2), channel_mapping=T(3, 2, 2, 2),
                     batch_size=2, channels=8, height=7, width=12, **common)
    assert pool_back.flops == 30 + 3 * 4 * 8 + 3 * 2 * (4 + 96)  # setup, bin bounds, divides, scatter adds
    align = cost("torchvision::ps_roi_align", input=T(2, 8, 7, 12), sampling_ratio=2, **common)
    ps_coord = 4  # hstart + (i + .5)*bin/grid; the bin start (2 per axis) is hoisted per output
    per_output = 2 * 2 + 1 + 2 * ps_coord + 4 * (ps_coord + WEIGHTS + 7 + 1)
    assert align.flops == 3 * ROI_SETUP + 3 * 2 * 4 * per_output == 36 + 2808
    align_back = cost("torchvision::_ps_roi_align_backward", grad=T(3, 2, 2, 2), channel_mapping=T(3, 2, 2, 2),
                      sampling_ratio=2, batch_size=2, channels=8, height=7, width=12, **common)
    assert align_back.flops == 24 * (ROI_SETUP + 4 + 2 * ps_coord + 4 * (ps_coord + WEIGHTS + GRAD_TAPS))


def deform_args(use_mask: bool) -> dict:
    # input (2, 4, 8, 8), weight (6, 2, 3, 3) in 2 groups, no padding -> 6 x 6 outputs
    return dict(input=T(2, 4, 8, 8), weight=T(6, 2, 3, 3), offset=T(2, 18, 6, 6), mask=T(2, 9, 6, 6), bias=T(6),
                stride_h=1, stride_w=1, pad_h=0, pad_w=0, dilation_h=1, dilation_w=1, groups=2, offset_groups=1,
                use_mask=use_mask)


def test_deform_conv2d_is_a_conv_plus_bilinear_sampling():
    macs = 2 * 6 * 36 * 2 * 9  # output elements x C_in/groups x kernel (the grouped conv's MACs)
    samples = 2 * 4 * 36 * 9  # every input channel at every kernel tap and output position
    # coordinates 2; in-map test 4, 2 floors, 2 fractions, 2 complements, 4 weights, 4 taps (4 mul + 3 add);
    # times the mask (the kernel multiplies by 1 without one)
    sample = 2 + (4 + 2 + 2 + 2 + 4 + 7) + 1
    found = cost("torchvision::deform_conv2d", **deform_args(True))
    assert (found.macs, found.flops) == (macs, 2 * macs + samples * sample)
    plain = cost("torchvision::deform_conv2d", **deform_args(False))
    assert (plain.macs, plain.flops) == (macs, 2 * macs + samples * sample)
    assert macs == 7776


def test_deform_conv2d_backward_counts_all_five_gradients():
    macs = 7776
    samples = 2592
    bilinear = 4 + 2 + 2 + 2 + 4 + 7  # deform_conv2d's bilinear value (as in the forward test)
    offset_grad = 2 * (2 + 2 + 7 + 3)  # both directions: coordinates, floors, coordinate weight, accumulate
    mask_grad = bilinear + 2  # bilinear value, times the column, accumulate
    col2im = 2 + 9 * 6 + 4 * (7 + 3)  # coordinates, 9 neighbour tests, 4 taps weighted and scattered
    im2col = 2 + bilinear + 1  # the sampling redone for grad_weight
    bias = 2 * 6 * 36 + 6  # sum of grad over (N, H, W), times ones
    found = cost("torchvision::_deform_conv2d_backward", grad=T(2, 6, 6, 6), **deform_args(True))
    assert found.macs == 2 * macs  # columns = W^T grad, grad_weight = grad columns^T
    assert found.flops == 4 * macs + samples * (offset_grad + mask_grad + col2im + im2col) + bias


def test_estimate_notes_reach_the_result_warnings_and_keep_it_complete():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    note = "data-dependent, counted as its worst case"
    result = count_flops(model, torch.randn(3, 4), tracer="dispatch",
                         handlers={"aten::relu": lambda call: Cost.from_flops(call.out().numel).with_note(note)})
    assert result.complete
    assert f"aten::relu (1 call) is an estimate: {note}" in result.warnings
    assert result.by_operator()["aten::relu"] == 12
    assert note in result.table() and note in result.to_markdown()  # printed under every text report


def test_notes_combine_without_repeats():
    a = Cost.from_flops(1).with_note("x")
    assert (a + a).note == "x" and (a + Cost.from_macs(2).with_note("y")).note == "x; y"
    assert Cost.split(("aten::a", a), ("aten::b", Cost.from_flops(2))).note == "x"


# -- the handlers against line-by-line ports of the CPU kernels that count as they run --------------

FMAP = torch.randn(2, 4, 7, 12, dtype=torch.float64)  # (B, C, H, W)
INSIDE = [[0, 1.0, 1.0, 6.0, 5.0], [1, 0.0, 0.0, 11.0, 6.0], [0, 2.5, 2.0, 4.0, 4.5]]  # every sample in the map
WHOLE = [[0, 0.0, 0.0, 12.0, 7.0], [1, 0.0, 0.0, 12.0, 7.0]]  # the whole 7 x 12 map (aligned, scale 1)


def test_nms_port_equals_the_bound_when_nothing_is_suppressed():
    boxes = torch.rand(9, 4, dtype=torch.float64) * 10
    boxes[:, 2:] += boxes[:, :2] + 1
    scores = torch.rand(9, dtype=torch.float64).tolist()
    bound = cost("torchvision::nms", dets=T(9, 4), scores=T(9), iou_threshold=1.0).flops
    _, ops = kernels.counted(kernels.nms, boxes.tolist(), scores, 1.0)  # IoU <= 1: no box suppressed
    assert ops == bound
    boxes[1:] = boxes[0]  # identical boxes: the first suppresses all others
    keep, ops = kernels.counted(kernels.nms, boxes.tolist(), scores, 0.5)
    assert len(keep) == 1 and ops < bound


@pytest.mark.parametrize("aligned", [False, True])
def test_roi_align_port(aligned):
    args = dict(input=T(2, 4, 7, 12), rois=T(3, 5), spatial_scale=1.0, pooled_height=2, pooled_width=3)
    found = cost("torchvision::roi_align", sampling_ratio=2, aligned=aligned, **args)
    _, ops = kernels.counted(kernels.roi_align, FMAP.tolist(), INSIDE, 1.0, 2, 3, 2, aligned)
    assert ops == found.flops
    grad = torch.randn(3, 4, 2, 3, dtype=torch.float64).tolist()
    back = cost("torchvision::_roi_align_backward", grad=T(3, 4, 2, 3), rois=T(3, 5), spatial_scale=1.0,
                pooled_height=2, pooled_width=3, batch_size=2, channels=4, height=7, width=12, sampling_ratio=2,
                aligned=aligned)
    _, ops = kernels.counted(kernels.roi_align_backward, grad, INSIDE, 1.0, 2, 3, (2, 4, 7, 12), 2, aligned)
    assert ops == back.flops


def test_roi_align_adaptive_port_on_whole_map_rois():
    found = cost("torchvision::roi_align", input=T(2, 4, 7, 12), rois=T(2, 5), spatial_scale=1.0,
                 pooled_height=2, pooled_width=3, sampling_ratio=0, aligned=True)
    _, ops = kernels.counted(kernels.roi_align, FMAP.tolist(), WHOLE, 1.0, 2, 3, 0, True)
    assert ops == found.flops
    _, smaller = kernels.counted(kernels.roi_align, FMAP.tolist(), INSIDE, 1.0, 2, 3, 0, True)
    assert smaller < cost("torchvision::roi_align", input=T(2, 4, 7, 12), rois=T(3, 5), spatial_scale=1.0,
                          pooled_height=2, pooled_width=3, sampling_ratio=0, aligned=True).flops


def test_roi_pool_port():
    whole = [[0, 0.0, 0.0, 11.0, 6.0], [1, 0.0, 0.0, 11.0, 6.0]]  # start 0, end + 1 = the map size
    found = cost("torchvision::roi_pool", input=T(2, 4, 7, 12), rois=T(2, 5), spatial_scale=1.0,
                 pooled_height=2, pooled_width=3)
    _, ops = kernels.counted(kernels.roi_pool, FMAP.tolist(), whole, 1.0, 2, 3)
    assert ops == found.flops
    _, smaller = kernels.counted(kernels.roi_pool, FMAP.tolist(), INSIDE[:2], 1.0, 2, 3)
    assert smaller < found.flops


def test_ps_roi_align_port():
    x = torch.randn(2, 12, 7, 12, dtype=torch.float64)  # 12 channels in 2 x 3 bins: 2 output channels
    found = cost("torchvision::ps_roi_align", input=T(2, 12, 7, 12), rois=T(3, 5), spatial_scale=1.0,
                 pooled_height=2, pooled_width=3, sampling_ratio=2)
    _, ops = kernels.counted(kernels.ps_roi_align, x.tolist(), INSIDE, 1.0, 2, 3, 2)
    assert ops == found.flops


def deform_data():
    x = torch.randn(2, 4, 6, 7, dtype=torch.float64)
    offset = (torch.rand(2, 2 * 2 * 9, 4, 5, dtype=torch.float64) - 0.5) * 0.8  # every sample stays in the map
    mask = torch.rand(2, 2 * 9, 4, 5, dtype=torch.float64)
    return x, offset, mask


@pytest.mark.parametrize("use_mask", [False, True])
def test_deform_conv2d_port(use_mask):
    x, offset, mask = deform_data()
    found = cost("torchvision::deform_conv2d", input=T(2, 4, 6, 7), weight=T(6, 2, 3, 3), offset=T(2, 36, 4, 5),
                 mask=T(2, 18, 4, 5), bias=T(6), stride_h=1, stride_w=1, pad_h=0, pad_w=0, dilation_h=1,
                 dilation_w=1, groups=2, offset_groups=2, use_mask=use_mask)
    _, ops = kernels.counted(kernels.deform_im2col, x.tolist(), offset.tolist(), mask.tolist(), (3, 3), (1, 1),
                             (0, 0), (1, 1), 2, use_mask)
    assert found.macs == 2 * 6 * 20 * 2 * 9
    assert found.flops - 2 * found.macs == ops


def deform_columns(weight, grad_out):
    """Wᵀ·grad per weight group, as the backward kernel forms them: {(b, c, i, j, oy, ox): value}."""
    groups, c_out, c_in_g = 2, weight.shape[0], weight.shape[1]
    cols = {}
    for g in range(groups):
        w = weight[g * (c_out // groups):(g + 1) * (c_out // groups)].flatten(1)  # (C_out/g, C_in/g x 9)
        for b in range(grad_out.shape[0]):
            block = w.t() @ grad_out[b, g * (c_out // groups):(g + 1) * (c_out // groups)].flatten(1)
            for row in range(block.shape[0]):
                c, k = divmod(row, 9)
                for pos in range(block.shape[1]):
                    oy, ox = divmod(pos, grad_out.shape[3])
                    cols[(b, g * c_in_g + c, k // 3, k % 3, oy, ox)] = block[row, pos].item()
    return cols


@pytest.mark.parametrize("use_mask", [False, True])
def test_deform_conv2d_backward_port(use_mask):
    x, offset, mask = deform_data()
    weight, grad_out = torch.randn(6, 2, 3, 3, dtype=torch.float64), torch.randn(2, 6, 4, 5, dtype=torch.float64)
    cols = deform_columns(weight, grad_out)
    geometry = ((3, 3), (1, 1), (0, 0), (1, 1), 2, use_mask)
    _, coord = kernels.counted(kernels.deform_col2im_coord, cols, x.tolist(), offset.tolist(), mask.tolist(), *geometry)
    _, col2im = kernels.counted(kernels.deform_col2im, cols, offset.tolist(), mask.tolist(), (2, 4, 6, 7), *geometry)
    _, im2col = kernels.counted(kernels.deform_im2col, x.tolist(), offset.tolist(), mask.tolist(), *geometry)
    samples = 2 * 4 * 20 * 9
    assert coord == samples * (2 * 14 + (23 if use_mask else 0))  # every sample in the map: exact
    assert im2col == samples * 24
    assert col2im <= samples * 96  # the bound: every one of the 9 neighbours fully tested
    found = cost("torchvision::_deform_conv2d_backward", grad=T(2, 6, 4, 5), input=T(2, 4, 6, 7),
                 weight=T(6, 2, 3, 3), offset=T(2, 36, 4, 5), mask=T(2, 18, 4, 5), bias=T(6), stride_h=1,
                 stride_w=1, pad_h=0, pad_w=0, dilation_h=1, dilation_w=1, groups=2, offset_groups=2,
                 use_mask=use_mask)
    bias = 2 * 6 * 20 + 6
    assert found.macs == 2 * 2 * 6 * 20 * 2 * 9
    assert found.flops == 2 * found.macs + coord + samples * 96 + im2col + bias


# -- with torchvision ---------------------------------------------------------------------------

TRACERS = ("jit", "dispatch", "auto")




def run_all(module, args, **kwargs):
    found = {}
    for tracer in TRACERS:
        before = snapshot(module)
        copies = [a.clone() for a in args]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found[tracer] = count_flops(module, tuple(args), tracer=tracer, **kwargs)
        assert_same_state(module, before)
        assert all(torch.equal(a, c) and a.stride() == c.stride() for a, c in zip(args, copies))
        assert found[tracer].unsupported_ops() == {}, (tracer, found[tracer].unsupported_ops())
    assert len({(r.macs, r.flops) for r in found.values()}) == 1, {t: (r.macs, r.flops) for t, r in found.items()}
    return found["dispatch"]


@pytest.fixture(scope="module")
def tv():
    return pytest.importorskip("torchvision")


def feature_map():
    return torch.randn(2, 8, 12, 7).transpose(2, 3)  # (2, 8, 7, 12), non-contiguous


ROIS = torch.tensor([[0, 1.0, 1.0, 6.0, 5.0], [1, 0.0, 0.0, 11.0, 6.0], [0, 2.0, 2.0, 4.0, 4.0]])


def test_real_ops_under_every_tracer(tv):
    ops = tv.ops
    x = feature_map()
    assert not x.is_contiguous()
    cases = {
        "torchvision::roi_align": (lambda f, r: ops.roi_align(f, r, (2, 2), 0.5, 2), 1146 + 3168),
        "torchvision::roi_pool": (lambda f, r: ops.roi_pool(f, r, (2, 2), 0.5), 30 + 96 + 2304),
        "torchvision::ps_roi_align": (lambda f, r: ops.ps_roi_align(f, r, (2, 2), 0.5, 2), 36 + 2808),
        "torchvision::ps_roi_pool": (lambda f, r: ops.ps_roi_pool(f, r, (2, 2), 0.5), 30 + 3 * 2 * (32 + 96 + 4)),
    }
    for op, (fn, expected) in cases.items():
        result = run_all(Fn(fn), (x, ROIS))
        assert result.by_operator() == {op: expected}, op
        on_meta = count_flops(Fn(fn), (x.to("meta"), ROIS.to("meta")))  # torchvision's meta kernels: same shapes
        assert on_meta.by_operator() == {op: expected}, op
    boxes = torch.rand(6, 4) * 10
    boxes[:, 2:] += boxes[:, :2]
    result = run_all(Fn(lambda b, s: ops.nms(b, s, 0.5)), (boxes, torch.rand(6)))
    assert result.by_operator() == {"torchvision::nms": 6 * 3 + 6 * 3 + 15 * IOU}  # ceil(log2 6) = 3
    assert any("torchvision::nms (1 call) is an estimate" in w for w in result.warnings)


def test_deform_conv2d_module_in_train_and_eval(tv):
    layer = tv.ops.DeformConv2d(8, 6, 3, padding=1, groups=2)
    x = feature_map()
    offset, mask = torch.randn(2, 18, 7, 12), torch.rand(2, 9, 7, 12)
    macs = 2 * 6 * 7 * 12 * 4 * 9
    for mode in (True, False):
        layer.train(mode)
        result = run_all(layer, (x, offset, mask))
        assert result.macs == macs
        assert result.by_operator()["torchvision::deform_conv2d"] == 2 * macs + 2 * 8 * 84 * 9 * 24


def test_backward_ops_are_counted(tv):
    ops = tv.ops
    x = feature_map().requires_grad_()
    for op, fn, expected in [
        ("torchvision::_roi_align_backward", lambda f, r: ops.roi_align(f, r, (2, 2), 0.5, 2), 96 * 154),
        ("torchvision::_roi_pool_backward", lambda f, r: ops.roi_pool(f, r, (2, 2), 0.5), 96),
    ]:
        result = count_flops(Fn(fn), (x, ROIS), tracer="dispatch", backward=True)
        assert result.unsupported_ops() == {}
        assert result.by_operator()[op] == expected
    layer = tv.ops.DeformConv2d(4, 6, 3, groups=2)
    result = count_flops(layer, (torch.randn(2, 4, 8, 8), torch.randn(2, 18, 6, 6), torch.rand(2, 9, 6, 6)),
                         tracer="dispatch", backward=True)
    assert result.unsupported_ops() == {}
    assert result.by_operator("macs")["torchvision::_deform_conv2d_backward"] == 2 * 7776


def test_detection_model_has_no_unsupported_op(tv):
    """Faster R-CNN: nms and roi_align counted under dispatch and auto; jit's MACs equal
    (jit cannot see nms: torchvision's batched_nms is a scripted function with control flow,
    left as an opaque prim::CallFunction that makes auto use the dispatch tracer)."""
    model = tv.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None).eval()
    images = [torch.rand(3, 96, 128), torch.rand(3, 112, 96)]
    before = snapshot(model)
    results = {}
    for tracer in TRACERS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results[tracer] = count_flops(model, (images,), tracer=tracer)
        assert_same_state(model, before)
    for tracer in ("dispatch", "auto"):
        assert results[tracer].unsupported_ops() == {}, tracer
        assert results[tracer].complete
        assert results[tracer].by_operator("count")["torchvision::nms"] >= 2  # one per image in the RPN
    assert set(results["jit"].unsupported_ops()) <= {"prim::CallFunction"}
    assert len({r.macs for r in results.values()}) == 1
    roi = {t: r.by_operator().get("torchvision::roi_align") for t, r in results.items()}
    assert len(set(roi.values())) == 1 and roi["dispatch"] > 0


def test_the_kernel_ports_compute_what_torchvision_computes(tv):
    """The ports the counts are checked against run the kernels' loops: same results as the ops."""
    ops = tv.ops
    x, rois = FMAP, torch.tensor(INSIDE, dtype=torch.float64)
    for aligned, ratio in [(False, 2), (True, 2), (True, 0)]:
        port = torch.tensor(kernels.roi_align(x.tolist(), INSIDE, 1.0, 2, 3, ratio, aligned), dtype=torch.float64)
        assert torch.allclose(port, ops.roi_align(x, rois, (2, 3), 1.0, ratio, aligned))
        leaf = x.clone().requires_grad_()
        grad = torch.randn(3, 4, 2, 3, dtype=torch.float64)
        ops.roi_align(leaf, rois, (2, 3), 1.0, ratio, aligned).backward(grad)
        port = kernels.roi_align_backward(grad.tolist(), INSIDE, 1.0, 2, 3, (2, 4, 7, 12), ratio, aligned)
        assert torch.allclose(torch.tensor(port, dtype=torch.float64), leaf.grad)
    port = torch.tensor(kernels.roi_pool(x.tolist(), INSIDE, 1.0, 2, 3), dtype=torch.float64)
    assert torch.allclose(port, ops.roi_pool(x, rois, (2, 3), 1.0))
    wide = torch.randn(2, 12, 7, 12, dtype=torch.float64)
    port = torch.tensor(kernels.ps_roi_align(wide.tolist(), INSIDE, 1.0, 2, 3, 2), dtype=torch.float64)
    assert torch.allclose(port, ops.ps_roi_align(wide, rois, (2, 3), 1.0, 2))
    boxes = torch.rand(12, 4, dtype=torch.float64) * 10
    boxes[:, 2:] += boxes[:, :2] + 1
    scores = torch.rand(12, dtype=torch.float64)
    assert kernels.nms(boxes.tolist(), scores.tolist(), 0.3) == ops.nms(boxes, scores, 0.3).tolist()
    inp, offset, mask = deform_data()
    weight = torch.randn(6, 2, 3, 3, dtype=torch.float64)
    cols = kernels.deform_im2col(inp.tolist(), offset.tolist(), mask.tolist(), (3, 3), (1, 1), (0, 0), (1, 1), 2, True)
    columns = torch.tensor([[[cols[(b, c, i, j, oy, ox)] for oy in range(4) for ox in range(5)]
                             for c in range(4) for i in range(3) for j in range(3)] for b in range(2)],
                           dtype=torch.float64)  # (B, C_in x kh x kw, oh x ow)
    out = torch.cat([weight[g * 3:(g + 1) * 3].flatten(1) @ columns[:, g * 18:(g + 1) * 18] for g in range(2)], dim=1)
    expected = ops.deform_conv2d(inp, offset, weight, mask=mask)
    assert torch.allclose(out.reshape(2, 6, 4, 5), expected)

    leaf, off_leaf, mask_leaf = (t.clone().requires_grad_() for t in (inp, offset, mask))
    grad_out = torch.randn(2, 6, 4, 5, dtype=torch.float64)
    ops.deform_conv2d(leaf, off_leaf, weight, mask=mask_leaf).backward(grad_out)
    cols = deform_columns(weight, grad_out)
    geometry = ((3, 3), (1, 1), (0, 0), (1, 1), 2, True)
    grad_input = kernels.deform_col2im(cols, offset.tolist(), mask.tolist(), (2, 4, 6, 7), *geometry)
    grad_offset, grad_mask = kernels.deform_col2im_coord(cols, inp.tolist(), offset.tolist(), mask.tolist(), *geometry)
    for port, real in ((grad_input, leaf.grad), (grad_offset, off_leaf.grad), (grad_mask, mask_leaf.grad)):
        assert torch.allclose(torch.tensor(port, dtype=torch.float64), real)
