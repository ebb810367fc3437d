"""Does a float32 GEMM on this GPU run above the datasheet's float32 (non-tensor-core) peak?

``measure_roofs("cuda")`` measured float32 ``mm`` at 75.8-91.9 TFLOP/s on an H100 SXM whose
datasheet float32 peak is 67 TFLOP/s (docs/performance.md, "On a GPU"), while torch's TF32 flags
were off. This prints torch's math-mode flags, then for n = 4096 and 8192 the best of 10
CUDA-event-timed ``mm`` and ``linear`` (with bias) in float32 under TF32 off and on, and each
product's relative error against float64 (about 1e-7 for true float32 arithmetic, about 1e-3
for TF32's 10-bit mantissa): a rate above the float32 peak with float32-sized error would mean
a faster float32 path (emulation on tensor cores), a rate above it with TF32-sized error that
TF32 was in effect.

Run: ``PYTHONPATH=. python benchmarks/gpu_fp32_gemm.py``
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flopcount.devices import find_part, part_roofs


def _best_ms(fn, runs: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def main() -> None:
    name = torch.cuda.get_device_name()
    part = find_part(name)
    peak = part_roofs(part).peak("float32", "matmul") if part is not None else None
    print(f"{name}; torch {torch.__version__}; datasheet float32 matmul peak {peak / 1e12 if peak else float('nan'):.1f} TFLOP/s")
    print(f"allow_tf32 matmul={torch.backends.cuda.matmul.allow_tf32} cudnn={torch.backends.cudnn.allow_tf32} "
          f"float32_matmul_precision={torch.get_float32_matmul_precision()} "
          f"fp32_precision={getattr(torch.backends.cuda.matmul, 'fp32_precision', 'n/a')}")
    generator = torch.Generator(device="cuda").manual_seed(0)
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda", generator=generator)
        b = torch.randn(n, n, device="cuda", generator=generator)
        bias = torch.randn(n, device="cuda", generator=generator)
        exact = (a.double() @ b.double())
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            try:
                for label, fn in (("mm", lambda: a @ b), ("linear", lambda: F.linear(a, b, bias))):
                    ms = _best_ms(fn)
                    rate = 2.0 * n**3 / (ms / 1e3)
                    err = float(((a @ b).double() - exact).norm() / exact.norm())
                    share = f"{rate / peak:.2f}x datasheet" if peak else ""
                    print(f"n={n:5d} tf32={int(tf32)} {label:6s} {ms:8.3f} ms  {rate / 1e12:7.1f} TFLOP/s  {share}  "
                          f"rel.err {err:.1e}", flush=True)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            a @ b
            torch.cuda.synchronize()
        kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        print(f"n={n} tf32=0 mm kernel(s): {kernels}", flush=True)
    from flopcount.devices.measured import measure_roofs

    roofs = measure_roofs("cuda", budget_s=1.0)
    print(f"measure_roofs('cuda'): float32 {roofs.peak_flops.get('float32', 0) / 1e12:.1f} TFLOP/s; {roofs.describe()}")
    print(f"details: {roofs.details}")


if __name__ == "__main__":
    main()
