"""Line-by-line Python ports of torchvision's CPU kernels (torchvision/csrc/ops/cpu/*_kernel.cpp,
0.29) that count their floating-point operations as they run: an oracle for the handlers in
flopcount/handlers/vision_ops.py that does not reuse their formulas.

Every arithmetic operation, comparison, min/max, abs, floor/ceil/round on a kernel scalar of
type T counts 1 (:class:`F`); integer index arithmetic and casts count 0, as in the handlers'
convention. With torchvision installed the tests also check that each port computes what the
real op computes, so the counted loops are the kernel's loops."""

from __future__ import annotations

import math
from typing import Callable, List, Sequence, Tuple, Union

Num = Union["F", float, int]


class Counter:
    ops = 0


def _v(x: Num) -> float:
    return x.v if isinstance(x, F) else float(x)


class F:
    """A kernel scalar of type T: each operation on it counts one FLOP. ``iy + .5f`` in the
    kernels is a float add, so the ports write it ``F(iy) + 0.5``."""

    __slots__ = ("v",)

    def __init__(self, v: Num) -> None:
        self.v = _v(v)

    def _op(self, other: Num, fn: Callable[[float, float], float]) -> F:
        Counter.ops += 1
        return F(fn(self.v, _v(other)))

    def _cmp(self, other: Num, fn: Callable[[float, float], bool]) -> bool:
        Counter.ops += 1
        return fn(self.v, _v(other))

    def __add__(self, o: Num) -> F:
        return self._op(o, lambda a, b: a + b)

    __radd__ = __add__

    def __sub__(self, o: Num) -> F:
        return self._op(o, lambda a, b: a - b)

    def __rsub__(self, o: Num) -> F:
        return self._op(o, lambda a, b: b - a)

    def __mul__(self, o: Num) -> F:
        return self._op(o, lambda a, b: a * b)

    __rmul__ = __mul__

    def __truediv__(self, o: Num) -> F:
        return self._op(o, lambda a, b: a / b)

    def __neg__(self) -> F:
        Counter.ops += 1
        return F(-self.v)

    def __lt__(self, o: Num) -> bool:
        return self._cmp(o, lambda a, b: a < b)

    def __le__(self, o: Num) -> bool:
        return self._cmp(o, lambda a, b: a <= b)

    def __gt__(self, o: Num) -> bool:
        return self._cmp(o, lambda a, b: a > b)

    def __ge__(self, o: Num) -> bool:
        return self._cmp(o, lambda a, b: a >= b)

    def __int__(self) -> int:  # C++ (int) cast: truncation, not counted
        return int(self.v)


def fmax(a: Num, b: Num) -> F:
    Counter.ops += 1
    return F(max(_v(a), _v(b)))


def fmin(a: Num, b: Num) -> F:
    Counter.ops += 1
    return F(min(_v(a), _v(b)))


def fabs(a: Num) -> F:
    Counter.ops += 1
    return F(abs(_v(a)))


def ffloor(a: Num) -> int:
    Counter.ops += 1
    return math.floor(_v(a))


def fceil(a: Num) -> int:
    Counter.ops += 1
    return math.ceil(_v(a))


def fround(a: Num) -> int:
    Counter.ops += 1
    v = _v(a)
    return int(math.floor(abs(v) + 0.5) * (1 if v >= 0 else -1))  # C round(): halves away from zero


def counted(fn: Callable, *args, **kwargs) -> Tuple[object, int]:
    """(result, FLOPs counted) of one port call."""
    Counter.ops = 0
    result = fn(*args, **kwargs)
    return result, Counter.ops


# -- nms_kernel.cpp ------------------------------------------------------------------------------


def nms(dets: Sequence[Sequence[float]], scores: Sequence[float], iou_threshold: float) -> List[int]:
    n = len(dets)
    x1 = [F(d[0]) for d in dets]
    y1 = [F(d[1]) for d in dets]
    x2 = [F(d[2]) for d in dets]
    y2 = [F(d[3]) for d in dets]
    areas = [(x2[i] - x1[i]) * (y2[i] - y1[i]) for i in range(n)]
    order = sorted(range(n), key=lambda i: -scores[i])  # the sort: counted as aten::sort is, below
    Counter.ops += n * math.ceil(math.log2(n)) if n > 1 else 0
    suppressed = [False] * n
    keep = []
    for _i in range(n):
        i = order[_i]
        if suppressed[i]:
            continue
        keep.append(i)
        for _j in range(_i + 1, n):
            j = order[_j]
            if suppressed[j]:
                continue
            xx1, yy1 = fmax(x1[i], x1[j]), fmax(y1[i], y1[j])
            xx2, yy2 = fmin(x2[i], x2[j]), fmin(y2[i], y2[j])
            w = fmax(0.0, xx2 - xx1)
            h = fmax(0.0, yy2 - yy1)
            inter = w * h
            ovr = inter / (areas[i] + areas[j] - inter)
            if ovr > iou_threshold:
                suppressed[j] = True
    return keep


# -- roi_align_kernel.cpp and roi_align_common.h --------------------------------------------------


def _roi_box(roi: Sequence[float], scale: float, offset: float, clamp: bool):
    start_w = F(roi[1]) * scale - offset
    start_h = F(roi[2]) * scale - offset
    end_w = F(roi[3]) * scale - offset
    end_h = F(roi[4]) * scale - offset
    width, height = end_w - start_w, end_h - start_h
    if clamp:
        width, height = fmax(width, 1.0), fmax(height, 1.0)
    return start_h, start_w, height, width


def _grid(sampling_ratio: int, roi_size: F, pooled: int) -> int:
    return sampling_ratio if sampling_ratio > 0 else fceil(roi_size / pooled)


def _weights(y: F, x: F, height: int, width: int):
    """roi_align's bilinear weights for a sample, or None outside the map (the kernel's branch)."""
    if not (y >= -1.0 and y <= height and x >= -1.0 and x <= width):
        return None
    if y <= 0:
        y = F(0)
    if x <= 0:
        x = F(0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_high = y_low = height - 1
        y = F(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_high = x_low = width - 1
        x = F(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1.0 - ly, 1.0 - lx
    return (hy * hx, hy * lx, ly * hx, ly * lx), (y_low, y_high, x_low, x_high)


def roi_align(inp, rois, scale: float, ph: int, pw: int, sampling_ratio: int, aligned: bool):
    """inp: nested lists [B][C][H][W]; rois: [R][5]. Returns [R][C][ph][pw] floats."""
    channels, height, width = len(inp[0]), len(inp[0][0]), len(inp[0][0][0])
    out = []
    for roi in rois:
        b = int(roi[0])
        start_h, start_w, roi_h, roi_w = _roi_box(roi, scale, 0.5 if aligned else 0.0, not aligned)
        bin_h, bin_w = roi_h / ph, roi_w / pw
        gh, gw = _grid(sampling_ratio, roi_h, ph), _grid(sampling_ratio, roi_w, pw)
        count = max(gh * gw, 1)
        pre = []
        for p_h in range(ph):
            for p_w in range(pw):
                for iy in range(gh):
                    yy = start_h + p_h * bin_h + (F(iy) + 0.5) * bin_h / gh
                    for ix in range(gw):
                        xx = start_w + p_w * bin_w + (F(ix) + 0.5) * bin_w / gw
                        pre.append(_weights(yy, xx, height, width))
        planes = []
        for c in range(channels):
            img = inp[b][c]
            plane = [[0.0] * pw for _ in range(ph)]
            k = 0
            for p_h in range(ph):
                for p_w in range(pw):
                    val = F(0.0)
                    for _ in range(gh * gw):
                        if pre[k] is None:  # the kernel stores zero weights at position 0
                            w, (yl, yh, xl, xh) = (F(0),) * 4, (0, 0, 0, 0)
                        else:
                            w, (yl, yh, xl, xh) = pre[k]
                        val = val + (w[0] * img[yl][xl] + w[1] * img[yl][xh] + w[2] * img[yh][xl] + w[3] * img[yh][xh])
                        k += 1
                    plane[p_h][p_w] = (val / count).v
            planes.append(plane)
        out.append(planes)
    return out


def roi_align_backward(grad, rois, scale: float, ph: int, pw: int, shape, sampling_ratio: int, aligned: bool):
    """grad: [R][C][ph][pw]; shape: (B, C, H, W). Returns grad_input as nested lists."""
    batch, channels, height, width = shape
    grad_input = [[[[0.0] * width for _ in range(height)] for _ in range(channels)] for _ in range(batch)]
    for n, roi in enumerate(rois):
        for c in range(channels):
            for p_h in range(ph):
                for p_w in range(pw):
                    b = int(roi[0])
                    start_h, start_w, roi_h, roi_w = _roi_box(roi, scale, 0.5 if aligned else 0.0, not aligned)
                    bin_h, bin_w = roi_h / ph, roi_w / pw
                    g = grad[n][c][p_h][p_w]
                    gh, gw = _grid(sampling_ratio, roi_h, ph), _grid(sampling_ratio, roi_w, pw)
                    count = gh * gw
                    for iy in range(gh):
                        y = start_h + p_h * bin_h + (F(iy) + 0.5) * bin_h / gh
                        for ix in range(gw):
                            x = start_w + p_w * bin_w + (F(ix) + 0.5) * bin_w / gw
                            found = _weights(y, x, height, width)
                            if found is None:
                                continue
                            w, (yl, yh, xl, xh) = found
                            parts = [F(g) * wk / count for wk in w]
                            for (yy, xx), part in zip(((yl, xl), (yl, xh), (yh, xl), (yh, xh)), parts):
                                grad_input[b][c][yy][xx] = (F(grad_input[b][c][yy][xx]) + part).v
    return grad_input


# -- roi_pool_kernel.cpp ----------------------------------------------------------------------------


def roi_pool(inp, rois, scale: float, ph: int, pw: int):
    channels, height, width = len(inp[0]), len(inp[0][0]), len(inp[0][0][0])
    out = []
    for roi in rois:
        b = int(roi[0])
        start_w, start_h = fround(F(roi[1]) * scale), fround(F(roi[2]) * scale)
        end_w, end_h = fround(F(roi[3]) * scale), fround(F(roi[4]) * scale)
        roi_w, roi_h = max(end_w - start_w + 1, 1), max(end_h - start_h + 1, 1)
        bin_h, bin_w = F(roi_h) / ph, F(roi_w) / pw
        planes = [[[0.0] * pw for _ in range(ph)] for _ in range(channels)]
        for p_h in range(ph):
            for p_w in range(pw):
                hstart, wstart = ffloor(F(p_h) * bin_h), ffloor(F(p_w) * bin_w)
                hend, wend = fceil(F(p_h + 1) * bin_h), fceil(F(p_w + 1) * bin_w)
                hstart, hend = min(max(hstart + start_h, 0), height), min(max(hend + start_h, 0), height)
                wstart, wend = min(max(wstart + start_w, 0), width), min(max(wend + start_w, 0), width)
                empty = hend <= hstart or wend <= wstart
                for c in range(channels):
                    best = F(0.0 if empty else -3.4e38)
                    for h in range(hstart, hend):
                        for w in range(wstart, wend):
                            if F(inp[b][c][h][w]) > best:
                                best = F(inp[b][c][h][w])
                    planes[c][p_h][p_w] = best.v
        out.append(planes)
    return out


# -- ps_roi_align_kernel.cpp --------------------------------------------------------------------------


def _bilinear(img, height: int, width: int, y: F, x: F) -> F:
    found = _weights(y, x, height, width)
    if found is None:
        return F(0.0)
    w, (yl, yh, xl, xh) = found
    return w[0] * img[yl][xl] + w[1] * img[yl][xh] + w[2] * img[yh][xl] + w[3] * img[yh][xh]


def ps_roi_align(inp, rois, scale: float, ph: int, pw: int, sampling_ratio: int):
    channels, height, width = len(inp[0]), len(inp[0][0]), len(inp[0][0][0])
    c_out_total = channels // (ph * pw)
    out = []
    for roi in rois:
        b = int(roi[0])
        start_h, start_w, roi_h, roi_w = _roi_box(roi, scale, 0.5, False)
        bin_h, bin_w = roi_h / ph, roi_w / pw
        planes = []
        c_in = 0
        for _ in range(c_out_total):
            plane = [[0.0] * pw for _ in range(ph)]
            for p_h in range(ph):
                for p_w in range(pw):
                    hstart = F(p_h) * bin_h + start_h
                    wstart = F(p_w) * bin_w + start_w
                    gh, gw = _grid(sampling_ratio, roi_h, ph), _grid(sampling_ratio, roi_w, pw)
                    count = gh * gw
                    total = F(0.0)
                    for iy in range(gh):
                        y = hstart + (F(iy) + 0.5) * bin_h / gh
                        for ix in range(gw):
                            x = wstart + (F(ix) + 0.5) * bin_w / gw
                            total = total + _bilinear(inp[b][c_in], height, width, y, x)
                    plane[p_h][p_w] = (total / count).v
                    c_in += 1
            planes.append(plane)
        out.append(planes)
    return out


# -- deform_conv2d_kernel.cpp: the deformable im2col (the forward's sampling) ----------------------------


def _deform_bilinear(img, height: int, width: int, h: F, w: F) -> F:
    if h <= -1 or height <= h or w <= -1 or width <= w:
        return F(0.0)
    h_low, w_low = ffloor(h), ffloor(w)
    h_high, w_high = h_low + 1, w_low + 1
    lh, lw = h - h_low, w - w_low
    hh, hw = 1 - lh, 1 - lw
    v1 = img[h_low][w_low] if h_low >= 0 and w_low >= 0 else 0.0
    v2 = img[h_low][w_high] if h_low >= 0 and w_high <= width - 1 else 0.0
    v3 = img[h_high][w_low] if h_high <= height - 1 and w_low >= 0 else 0.0
    v4 = img[h_high][w_high] if h_high <= height - 1 and w_high <= width - 1 else 0.0
    w1, w2, w3, w4 = hh * hw, hh * lw, lh * hw, lh * lw
    return w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4


def deform_im2col(inp, offset, mask, kernel: Tuple[int, int], stride, pad, dilation, offset_groups: int, use_mask: bool):
    """columns[b][c][i][j][oy][ox] as the kernel fills them (before the per-group matmul)."""
    batch, channels, height, width = len(inp), len(inp[0]), len(inp[0][0]), len(inp[0][0][0])
    kh, kw = kernel
    out_h, out_w = len(offset[0][0]), len(offset[0][0][0])
    per_group = channels // offset_groups
    cols = {}
    for b in range(batch):
        for c in range(channels):
            grp = c // per_group
            for oy in range(out_h):
                for ox in range(out_w):
                    for i in range(kh):
                        for j in range(kw):
                            k = i * kw + j
                            m = F(mask[b][grp * kh * kw + k][oy][ox]) if use_mask else F(1.0)
                            off_h = offset[b][grp * 2 * kh * kw + 2 * k][oy][ox]
                            off_w = offset[b][grp * 2 * kh * kw + 2 * k + 1][oy][ox]
                            y = F(off_h) + ((oy * stride[0] - pad[0]) + i * dilation[0])
                            x = F(off_w) + ((ox * stride[1] - pad[1]) + j * dilation[1])
                            cols[(b, c, i, j, oy, ox)] = (m * _deform_bilinear(inp[b][c], height, width, y, x)).v
    return cols


# -- deform_conv2d_kernel.cpp backward: col2im (grad_input) and col2im_coord (grad_offset, grad_mask) --


def deform_col2im(cols, offset, mask, shape, kernel, stride, pad, dilation, offset_groups: int, use_mask: bool):
    """grad_input from the columns Wᵀ·grad (cols[(b, c, i, j, oy, ox)])."""
    batch, channels, height, width = shape
    kh, kw = kernel
    out_h, out_w = len(offset[0][0]), len(offset[0][0][0])
    per_group = channels // offset_groups
    grad = [[[[0.0] * width for _ in range(height)] for _ in range(channels)] for _ in range(batch)]
    for c in range(channels):
        for i in range(kh):
            for j in range(kw):
                for b in range(batch):
                    for oy in range(out_h):
                        for ox in range(out_w):
                            grp, k = c // per_group, i * kw + j
                            off_h = offset[b][grp * 2 * kh * kw + 2 * k][oy][ox]
                            off_w = offset[b][grp * 2 * kh * kw + 2 * k + 1][oy][ox]
                            m = F(mask[b][grp * kh * kw + k][oy][ox]) if use_mask else F(1.0)
                            y = F(off_h) + ((oy * stride[0] - pad[0]) + i * dilation[0])
                            x = F(off_w) + ((ox * stride[1] - pad[1]) + j * dilation[1])
                            col = cols[(b, c, i, j, oy, ox)]
                            for dy in (-1, 0, 1):
                                for dx in (-1, 0, 1):
                                    yp, xp = int(y) + dy, int(x) + dx
                                    if (0 <= yp < height and 0 <= xp < width and fabs(y - yp) < 1
                                            and fabs(x - xp) < 1):
                                        weight = (1 - fabs(y - yp)) * (1 - fabs(x - xp))
                                        grad[b][c][yp][xp] = (F(grad[b][c][yp][xp]) + m * weight * col).v
    return grad


def deform_col2im_coord(cols, inp, offset, mask, kernel, stride, pad, dilation, offset_groups: int, use_mask: bool):
    """(grad_offset, grad_mask) from the columns and the input."""
    batch, channels, height, width = len(inp), len(inp[0]), len(inp[0][0]), len(inp[0][0][0])
    kh, kw = kernel
    out_h, out_w = len(offset[0][0]), len(offset[0][0][0])
    per_group = channels // offset_groups
    grad_offset = [[[[0.0] * out_w for _ in range(out_h)] for _ in range(len(offset[0]))] for _ in range(batch)]
    grad_mask = [[[[0.0] * out_w for _ in range(out_h)] for _ in range(len(mask[0]))] for _ in range(batch)]
    for b in range(batch):
        for oc in range(len(offset[0])):  # offset channel: group, kernel tap, direction
            grp, rest = divmod(oc, 2 * kh * kw)
            k, direction = divmod(rest, 2)
            i, j = divmod(k, kw)
            for oy in range(out_h):
                for ox in range(out_w):
                    g_off, g_mask = F(0.0), F(0.0)
                    for c in range(grp * per_group, (grp + 1) * per_group):
                        off_h = offset[b][grp * 2 * kh * kw + 2 * k][oy][ox]
                        off_w = offset[b][grp * 2 * kh * kw + 2 * k + 1][oy][ox]
                        m = F(mask[b][grp * kh * kw + k][oy][ox]) if use_mask else F(1.0)
                        y = F(off_h) + ((oy * stride[0] - pad[0]) + i * dilation[0])
                        x = F(off_w) + ((ox * stride[1] - pad[1]) + j * dilation[1])
                        img, col = inp[b][c], cols[(b, c, i, j, oy, ox)]
                        y_l, x_l = ffloor(y), ffloor(x)

                        def at(yy: int, xx: int) -> float:
                            return img[yy][xx] if 0 <= yy < height and 0 <= xx < width else 0.0

                        if direction == 0:  # the y offset: derivative along y
                            dx = x - x_l
                            weight = dx * (F(at(y_l + 1, x_l + 1)) - at(y_l, x_l + 1)) + (1 - dx) * (
                                F(at(y_l + 1, x_l)) - at(y_l, x_l))
                        else:
                            dy = y - y_l
                            weight = dy * (F(at(y_l + 1, x_l + 1)) - at(y_l + 1, x_l)) + (1 - dy) * (
                                F(at(y_l, x_l + 1)) - at(y_l, x_l))
                        g_off = g_off + m * weight * col
                        if use_mask and direction == 0:
                            g_mask = g_mask + F(col) * _deform_bilinear(img, height, width, y, x)
                    grad_offset[b][oc][oy][ox] = g_off.v
                    if use_mask and direction == 0:
                        grad_mask[b][grp * kh * kw + k][oy][ox] = g_mask.v
    return grad_offset, grad_mask
