"""Resampling with computed weights: ``grid_sample`` and antialiased interpolation.

grid_sampler: per output location, the grid coordinates are unnormalised and clipped
(3 FLOPs per coordinate) and the interpolation weights computed; per output element
(location x channel) the taps are weighted and summed.
Antialiased resize (``_upsample_{bilinear,bicubic}2d_aa``): torch resamples one
dimension at a time (the last first, then the other; a dimension whose size does not
change is skipped); each output of a pass sums its filter window, 2 FLOPs per tap
(multiply by the weight, accumulate), with torch's exact window sizes.
"""

from __future__ import annotations

from math import prod
from typing import Optional, Sequence, Tuple

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import first_output, grads_present, maybe_tensor
from flopcount.types import Cost, OpCall, TensorMeta

__all__ = ["GRID_SAMPLER", "aa_window_total", "register"]

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
COORDINATE = 3  # unnormalise (multiply, add) and clip/reflect (1), per spatial coordinate
#: (per output element, per output location beyond the coordinates) for (spatial dims, mode)
GRID_SAMPLER = {
    (2, BILINEAR): (7, 8),  # 4 taps: 4 mul + 3 add; weights: 2 fractions, 2 complements, 4 products
    (2, NEAREST): (0, 2),  # a copy; 2 roundings
    (2, BICUBIC): (35, 48),  # 4 four-tap rows (7 each) + one four-tap column; 8 cubic weights of 6
    (3, BILINEAR): (15, 22),  # 8 taps: 8 mul + 7 add; 3 fractions, 3 complements, 8 triple products (2 each)
    (3, NEAREST): (0, 3),
}


def _grid_sampler(call: OpCall) -> Cost:
    """input (N, C, *in), grid (N, *out, d): locations L = N x prod(out); FLOPs =
    L x (d x 3 + per-location weights) + L x C x per-element taps."""
    x = maybe_tensor(call, "input") or call.tensor("self")
    _, per_element, locations, per_location = _grid(call)
    return Cost.from_flops(locations * per_location + locations * x.shape[1] * per_element)


def _grid(call: OpCall) -> Tuple[int, int, int, int]:
    """The grid's coordinates d, the per-element taps t of its mode, the locations L and the
    per-location coordinate and weight work (d x 3 + its weights)."""
    grid = call.tensor("grid")
    dims = grid.shape[-1]
    mode = int(call.arg("interpolation_mode", BILINEAR))
    per_element, per_location = GRID_SAMPLER.get((dims, mode), GRID_SAMPLER[(dims, BILINEAR)])
    return dims, per_element, prod(grid.shape[:-1]), dims * COORDINATE + per_location


def _grid_sampler_backward(call: OpCall) -> Cost:
    """grad_input: each output gradient scattered through the forward taps (t per element);
    grad_grid: the weights' derivative along each of the d coordinates (d x t per element)
    plus the per-location coordinate and weight work, for the gradients requested."""
    dims, per_element, locations, per_location = _grid(call)
    elements = locations * call.tensor("input").shape[1]
    want_input, want_grid = grads_present(call, 2)
    return Cost.from_flops(locations * per_location + elements * per_element * (want_input + dims * want_grid))


def _affine_grid(call: OpCall) -> Cost:
    """``affine_grid_generator(theta (N, d, d + 1), size [N, C, *spatial])``: the CPU kernel
    makes the base grid (N, prod(spatial), d + 1) and multiplies it by theta^T with one ``bmm``:
    N x prod(spatial) x (d + 1) x d MACs; without ``align_corners`` each axis' linspace is
    rescaled by (s - 1) / s (a multiply and a divide per point of an axis longer than 1)."""
    theta = call.tensor("theta")
    out = first_output(call)  # (N, *spatial, d); jit may trace ``size`` from x.size(), values unknown
    spatial = list(out.shape[1:-1]) if out is not None else [int(s) for s in call.arg("size")[2:]]
    dims = theta.shape[-2]
    macs = theta.shape[0] * prod(spatial) * (dims + 1) * dims
    rescale = 0 if call.arg("align_corners") else 2 * sum(s for s in spatial if s > 1)
    return Cost(macs=macs, flops=2 * macs + rescale)


def _aa_scale(size_in: int, size_out: int, align_corners: bool, scale: Optional[float]) -> float:
    if align_corners:
        return (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else size_in / size_out


def aa_window_total(
    size_in: int, size_out: int, interp_size: int, align_corners: bool = False, scale: Optional[float] = None
) -> int:
    """Sum over outputs of torch's antialias filter window lengths along one dimension:
    support = interp_size / 2 x max(scale, 1); output i covers
    [max(int(c - support + 0.5), 0), min(int(c + support + 0.5), size_in)), c = scale (i + 0.5)."""
    ratio = _aa_scale(size_in, size_out, align_corners, scale)
    support = interp_size * 0.5 * ratio if ratio >= 1.0 else interp_size * 0.5
    total = 0
    for i in range(size_out):
        center = ratio * (i + 0.5)
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), size_in)
        total += max(high - low, 0)
    return total


def _aa(interp_size: int):  # type: ignore[no-untyped-def]
    def handler(call: OpCall) -> Cost:
        grad = maybe_tensor(call, "grad_output")
        sizes: Sequence[int]
        if grad is not None:  # backward: the same taps, scattered from grad_output to the input size
            x = TensorMeta(tuple(call.arg("input_size")))
            sizes = grad.shape[2:]
        else:
            x = maybe_tensor(call, "self") or call.tensor("input")
            out = first_output(call)
            sizes = out.shape[2:] if out is not None else tuple(call.arg("output_size"))
        align = bool(call.arg("align_corners"))
        factors = call.arg("scale_factors")
        scales = list(factors) if factors else [call.arg("scales_h"), call.arg("scales_w")]
        shape = list(x.shape)
        flops = 0
        for axis in (len(shape) - 1, len(shape) - 2):  # horizontal pass first, then vertical
            k = axis - 2
            if shape[axis] == sizes[k]:
                continue
            taps = aa_window_total(shape[axis], sizes[k], interp_size, align, scales[k])
            flops += 2 * taps * prod(shape) // shape[axis]
            shape[axis] = sizes[k]
        return Cost.from_flops(flops)

    handler.__doc__ = (
        f"antialiased resize, interp_size {interp_size}: 2 FLOPs per filter tap, one pass per resized dim."
    )
    return handler


def register(registry: HandlerRegistry) -> None:
    registry.register(
        ["aten::grid_sampler", "aten::grid_sampler_2d", "aten::grid_sampler_3d", "aten::cudnn_grid_sampler"],
        _grid_sampler,
    )
    registry.register(["aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward"], _grid_sampler_backward)
    registry.register("aten::affine_grid_generator", _affine_grid)
    registry.register(["aten::_upsample_bilinear2d_aa", "aten::_upsample_bilinear2d_aa_backward"], _aa(2))
    registry.register(["aten::_upsample_bicubic2d_aa", "aten::_upsample_bicubic2d_aa_backward"], _aa(4))
