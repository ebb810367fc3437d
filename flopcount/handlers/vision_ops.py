"""torchvision's custom ops: NMS, the RoI poolers, deformable convolution (and their backward).

Keyed on op names only: flopcount never imports torchvision. Each formula follows the
arithmetic of torchvision's CPU kernel (``torchvision/csrc/ops/cpu/*_kernel.cpp``); the
constants are named below and derived in docs/conventions.md. Notation: R RoIs, C input
channels, H x W feature map, P = pooled_height x pooled_width bins, g = samples per bin.

Where the work depends on tensor values the handler cannot see, the count is a stated
bound and the cost carries a note (listed in ``FlopResult.warnings``):

* ``nms`` evaluates the IoU of every pair of boxes (no box suppressed): an upper bound;
* ``roi_pool``/``ps_roi_pool`` bins and an adaptive ``sampling_ratio <= 0`` grid scale with
  each RoI's size: every RoI is taken to span the whole feature map (an upper bound for
  RoIs inside the map);
* samples that fall outside the map (skipped by the kernels) are counted as inside.
"""

from __future__ import annotations

from math import ceil, log2
from typing import Tuple

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers.pool import adaptive_window_total
from flopcount.types import Cost, OpCall

__all__ = ["register"]

#: nms per pair of boxes: intersection corners (2 max, 2 min), width and height (2 subtracts,
#: 2 clamps at 0), intersection area (1 multiply), union (add, subtract), IoU divide, threshold compare
NMS_PAIR = 13
NMS_AREA = 3  # per box: (x2 - x1) * (y2 - y1)
#: per RoI of roi_align / ps_roi_align: 4 coordinates x spatial_scale, 4 minus the alignment
#: offset, width and height (2 subtracts), bin sizes (2 divides)
ROI_SETUP = 12
ROI_CLAMP = 2  # roi_align with aligned=False: width and height clamped to >= 1
ADAPTIVE_GRID = 4  # sampling_ratio <= 0: ceil(RoI size / pooled size) per axis, 2 divides + 2 ceils
COORD = 6  # a roi_align sample coordinate: start + p x bin + (i + 0.5) x bin / grid
PS_COORD = 4  # ps_roi_align hoists start + p x bin per output element (2 per axis), then 4 per sample
#: a sample point's bilinear set-up: the in-map test (4 compares), clamps at 0 (2 compares),
#: 2 fractions, 2 complements, 4 weight products
SAMPLE_POINT = 4 + 2 + 8
TAPS = 7  # the four weighted taps: 4 multiplies, 3 adds
#: backward per sample: the 4 tap gradients (grad x weight / count: 4 multiplies, 4 divides)
#: and their 4 adds into grad_input
TAP_GRADIENTS = 12
#: per RoI of roi_pool / ps_roi_pool: 4 coordinates x spatial_scale and rounded, 2 bin sizes
POOL_SETUP = 10
POOL_BIN = 8  # per bin: start and end products (4) and their floor/ceil (4)
#: deform_conv2d's bilinear value: in-map test (4 compares), 2 floors, 2 fractions, 2 complements,
#: 4 weight products, 4 taps (4 multiplies, 3 adds)
DEFORM_BILINEAR = 4 + 2 + 4 + 4 + 7
#: im2col per sample: 2 coordinate adds (integer grid + offset), the bilinear value, x mask
#: (the kernel multiplies by the mask, 1 without one, in either case)
DEFORM_SAMPLE = 2 + DEFORM_BILINEAR + 1
#: col2im per sample (grad_input): coordinates (2); 9 neighbour candidates each tested with
#: |y - yp| < 1 and |x - xp| < 1 (subtract, abs, compare per axis: 6); up to 4 taps, each weighted
#: (1 - |y - yp|)(1 - |x - xp|) (7), times mask and column (2), accumulated (1)
DEFORM_COL2IM = 2 + 9 * 6 + 4 * 10
#: grad_offset per sample and direction: coordinates (2), 2 floors and the coordinate weight
#: dx (v11 - v01) + (1 - dx)(v10 - v00) (7), mask x weight x column accumulated (3)
DEFORM_COORD_GRAD = 2 + 2 + 7 + 3
#: grad_mask per sample (with a mask): the bilinear value times the column, accumulated
DEFORM_MASK_GRAD = DEFORM_BILINEAR + 2

BOUND_NMS = "every pair of boxes is compared (no box suppressed), an upper bound since suppression depends on the scores"
ESTIMATE_ROI = (
    "each RoI is taken to span the whole feature map since the RoI sizes are tensor data "
    "(an upper bound for RoIs inside the map)"
)


def _nms(call: OpCall) -> Cost:
    """Boxes N: areas 3N, score sort N ceil(log2 N), N(N - 1)/2 IoU tests of 13 FLOPs (upper bound)."""
    n = call.tensor("dets").shape[0]
    if n == 0:
        return Cost()
    sort = n * ceil(log2(n)) if n > 1 else 0
    cost = Cost.from_flops(NMS_AREA * n + sort + NMS_PAIR * (n * (n - 1) // 2))
    return cost.with_note(BOUND_NMS) if n > 1 else cost


def _grid(call: OpCall, pooled: Tuple[int, int], size: Tuple[int, int]) -> Tuple[int, int, bool]:
    """Samples per bin along (h, w) and whether they are estimated (``sampling_ratio <= 0``
    makes the grid ceil(RoI size / pooled size); the RoI is taken as the whole map)."""
    ratio = int(call.arg("sampling_ratio", -1))
    if ratio > 0:
        return ratio, ratio, False
    return max(1, ceil(size[0] / pooled[0])), max(1, ceil(size[1] / pooled[1])), True


def _roi_setup(call: OpCall, adaptive: bool) -> int:
    return ROI_SETUP + (0 if call.arg("aligned") else ROI_CLAMP) + (ADAPTIVE_GRID if adaptive else 0)


def _pooled(call: OpCall) -> Tuple[int, int]:
    return int(call.arg("pooled_height")), int(call.arg("pooled_width"))


def _roi_align(call: OpCall) -> Cost:
    """R RoIs over input (B, C, H, W): R (setup + P (6 gh + 20 g)) for the sample points and
    their bilinear weights (shared by the channels) + R C P (8 g + 1) for the taps, their
    accumulation and the average; g = gh x gw samples per bin."""
    x, rois = call.tensor("input"), call.tensor("rois")
    (ph, pw), (channels, height, width) = _pooled(call), x.shape[1:4]
    gh, gw, estimated = _grid(call, (ph, pw), (height, width))
    r, p, g = rois.shape[0], ph * pw, gh * gw
    points = r * (_roi_setup(call, estimated) + p * (COORD * gh + (COORD + SAMPLE_POINT) * g))
    cost = Cost.from_flops(points + r * channels * p * ((TAPS + 1) * g + 1))
    return cost.with_note(ESTIMATE_ROI) if estimated and r else cost


def _roi_align_backward(call: OpCall) -> Cost:
    """grad (R, C, ph, pw): the kernel redoes the RoI setup and sample weights per gradient
    element, then scatters 4 weighted taps per sample: R C P (setup + 6 gh + 32 g)."""
    grad = call.tensor("grad")
    (ph, pw), size = _pooled(call), (int(call.arg("height")), int(call.arg("width")))
    gh, gw, estimated = _grid(call, (ph, pw), size)
    per = _roi_setup(call, estimated) + COORD * gh + (COORD + SAMPLE_POINT + TAP_GRADIENTS) * gh * gw
    cost = Cost.from_flops(grad.numel * per)
    return cost.with_note(ESTIMATE_ROI) if estimated and grad.numel else cost


def _windows(pooled: Tuple[int, int], size: Tuple[int, int]) -> int:
    """Feature-map elements summed over all P bins of one RoI spanning the whole map."""
    return adaptive_window_total(size[0], pooled[0]) * adaptive_window_total(size[1], pooled[1])


def _roi_pool(call: OpCall) -> Cost:
    """Max over each bin: 10 R + 8 R P for the bin bounds + R C x window elements compares."""
    x, rois = call.tensor("input"), call.tensor("rois")
    (ph, pw), (channels, height, width) = _pooled(call), x.shape[1:4]
    r = rois.shape[0]
    cost = Cost.from_flops(POOL_SETUP * r + POOL_BIN * r * ph * pw + r * channels * _windows((ph, pw), (height, width)))
    return cost.with_note(ESTIMATE_ROI) if r else cost


def _roi_pool_backward(call: OpCall) -> Cost:
    """One add of each gradient element into its argmax."""
    return Cost.from_flops(call.tensor("grad").numel)


def _ps_channels(call: OpCall) -> Tuple[Tuple[int, int], int, int, int]:
    """(pooled size, bins P, RoIs, output channels C / P) of a position-sensitive op, from its
    output or gradient."""
    pooled = _pooled(call)
    p = pooled[0] * pooled[1]
    if call.arg("grad") is not None:
        return pooled, p, call.tensor("grad").shape[0], call.tensor("grad").shape[1]
    return pooled, p, call.tensor("rois").shape[0], call.tensor("input").shape[1] // p


def _ps_roi_pool(call: OpCall) -> Cost:
    """Average over each bin: 10 R + R C_out (8 P + window elements + P)."""
    x = call.tensor("input")
    pooled, p, r, c_out = _ps_channels(call)
    cost = Cost.from_flops(POOL_SETUP * r + r * c_out * (POOL_BIN * p + _windows(pooled, (x.shape[2], x.shape[3])) + p))
    return cost.with_note(ESTIMATE_ROI) if r else cost


def _ps_roi_pool_backward(call: OpCall) -> Cost:
    """10 R + 8 R P for the bin bounds + R C_out (P divides + window elements adds)."""
    pooled, p, r, c_out = _ps_channels(call)
    size = (int(call.arg("height")), int(call.arg("width")))
    cost = Cost.from_flops(POOL_SETUP * r + POOL_BIN * r * p + r * c_out * (p + _windows(pooled, size)))
    return cost.with_note(ESTIMATE_ROI) if r else cost


def _ps_roi_align(call: OpCall) -> Cost:
    """12 R + R C_out P (5 + 4 gh + 26 g): per output element the bin start (4) and a divide;
    per sample the coordinate (4), the bilinear value (in-map test and weights 14, taps 7) and
    its accumulation (1)."""
    x = call.tensor("input")
    pooled, p, r, c_out = _ps_channels(call)
    gh, gw, estimated = _grid(call, pooled, (x.shape[2], x.shape[3]))
    per = 2 * 2 + 1 + (ADAPTIVE_GRID if estimated else 0) + PS_COORD * gh
    per += (PS_COORD + SAMPLE_POINT + TAPS + 1) * gh * gw
    cost = Cost.from_flops(ROI_SETUP * r + r * c_out * p * per)
    return cost.with_note(ESTIMATE_ROI) if estimated and r else cost


def _ps_roi_align_backward(call: OpCall) -> Cost:
    """Per gradient element: RoI setup (12), bin start (4), then per sample the coordinate (4),
    the in-map test and weights (14) and 4 tap gradients scattered (12): 16 + 4 gh + 30 g."""
    grad = call.tensor("grad")
    pooled = _pooled(call)
    gh, gw, estimated = _grid(call, pooled, (int(call.arg("height")), int(call.arg("width"))))
    per = ROI_SETUP + 2 * 2 + (ADAPTIVE_GRID if estimated else 0) + PS_COORD * gh
    per += (PS_COORD + SAMPLE_POINT + TAP_GRADIENTS) * gh * gw
    cost = Cost.from_flops(grad.numel * per)
    return cost.with_note(ESTIMATE_ROI) if estimated and grad.numel else cost


def _deform_shapes(call: OpCall) -> Tuple[int, int, int]:
    """(conv MACs, sampled points B x C_in x oh x ow x kh x kw, output elements)."""
    x, weight, offset = call.tensor("input"), call.tensor("weight"), call.tensor("offset")
    batch, channels = x.shape[0], x.shape[1]
    kernel = weight.shape[2] * weight.shape[3]
    out_hw = offset.shape[2] * offset.shape[3]  # offset is (B, 2 x offset_groups x kh x kw, oh, ow)
    outputs = batch * weight.shape[0] * out_hw
    return outputs * weight.shape[1] * kernel, batch * channels * out_hw * kernel, outputs


def _deform_conv2d(call: OpCall) -> Cost:
    """A convolution's MACs (output elements x C_in/groups x kh x kw) + the bilinear sampling of
    every input channel at every kernel tap and output position: 24 FLOPs per sample. The bias
    add is not counted (as for convolutions)."""
    macs, samples, _ = _deform_shapes(call)
    return Cost.from_macs(macs) + Cost.from_flops(samples * DEFORM_SAMPLE)


def _deform_conv2d_backward(call: OpCall) -> Cost:
    """All five gradients (the kernel always computes them): columns = Wᵀ·grad and
    grad_weight = grad·columnsᵀ (one forward's MACs each); per sample the offset gradient
    (2 directions x 14), the mask gradient (23, with a mask), grad_input's col2im (96) and the
    im2col redone for grad_weight (24); grad_bias = the sum of grad (+ C_out ones products)."""
    macs, samples, outputs = _deform_shapes(call)
    mask = DEFORM_MASK_GRAD if call.arg("use_mask") else 0
    per = 2 * DEFORM_COORD_GRAD + mask + DEFORM_COL2IM + DEFORM_SAMPLE
    bias = outputs + call.tensor("weight").shape[0]
    return Cost.from_macs(2 * macs) + Cost.from_flops(samples * per + bias)


def register(registry: HandlerRegistry) -> None:
    registry.register(["torchvision::nms", "torchvision::qnms"], _nms)
    registry.register(["torchvision::roi_align", "torchvision::qroi_align"], _roi_align)
    registry.register("torchvision::_roi_align_backward", _roi_align_backward)
    registry.register("torchvision::roi_pool", _roi_pool)
    registry.register("torchvision::_roi_pool_backward", _roi_pool_backward)
    registry.register("torchvision::ps_roi_align", _ps_roi_align)
    registry.register("torchvision::_ps_roi_align_backward", _ps_roi_align_backward)
    registry.register("torchvision::ps_roi_pool", _ps_roi_pool)
    registry.register("torchvision::_ps_roi_pool_backward", _ps_roi_pool_backward)
    registry.register("torchvision::deform_conv2d", _deform_conv2d)
    registry.register("torchvision::_deform_conv2d_backward", _deform_conv2d_backward)
    registry.register_zero(["torchvision::_cuda_version"])
