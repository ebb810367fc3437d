"""FLOPs of timm's TF-ported models through the auto and jit tracers (issue #29.5).

timm computes TF "SAME" padding in Python from ``x.size()``; under jit that arithmetic was
recorded as 0-d tensor ops and counted (+100 FLOPs on tf_efficientnet_b0, +180 on
maxvit_tiny_tf_224). Prints each model's totals per tracer and their difference. Needs timm
(optional; installed into the zoo venv with ``pip install --no-deps timm``):

    PYTHONPATH=. /work/main/.venv-zoo/bin/python benchmarks/timm_tracers.py
"""

from __future__ import annotations

import warnings


def main() -> None:
    import timm
    import torch

    from flopcount import count_flops

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    for name in ("tf_efficientnet_b0", "maxvit_tiny_tf_224"):
        model = timm.create_model(name, pretrained=False).eval()
        x = torch.randn(1, 3, 224, 224)
        counts = {tracer: count_flops(model, x, tracer=tracer) for tracer in ("auto", "jit")}
        auto, jit = counts["auto"], counts["jit"]
        print(
            f"{name}: auto {auto.flops:,} FLOPs ({auto.macs:,} MACs); jit {jit.flops:,} FLOPs ({jit.macs:,} MACs); "
            f"jit - auto = {jit.flops - auto.flops:+,} FLOPs"
        )


if __name__ == "__main__":
    main()
