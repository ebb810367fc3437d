"""The torchvision part of the coverage zoo: every model ``torchvision.models.list_models``
lists for classification, detection, segmentation, video and optical flow, built with
``weights=None``, run on a small-but-valid input (batch 2 where cheap), and compared with
the published ``_ops`` (GMACs) / ``num_params`` of its default weights.

The published ``_ops`` are stated for one image at the weights' evaluation size
(``weights.transforms().crop_size``; segmentation 520 × 520; video 16 frames), so that
comparison is counted on the meta device at that size, where nothing is computed.
Detection and optical-flow ``_ops`` depend on the evaluation images and are shown only.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch
from zoo_nn import Case, Inputs

FAMILIES = ("classification", "detection", "segmentation", "video", "optical_flow")
# models run at batch 1 on their CPU input because one image already costs > 30 GMACs
HEAVY = {"vit_h_14", "vit_l_16", "vit_l_32", "regnet_y_128gf", "mvit_v1_b", "mvit_v2_s", "swin3d_b", "swin3d_s"}
FIXED_224 = ("vit_", "maxvit_t")  # position embeddings / partitions fixed at 224


def _module(family: str) -> Any:
    from torchvision import models  # type: ignore[import-not-found]

    return models if family == "classification" else getattr(models, family)


def _weights(name: str) -> Optional[Any]:
    from torchvision.models import get_model_weights  # type: ignore[import-not-found]

    try:
        return get_model_weights(name).DEFAULT
    except Exception:
        return None


def _crop(weights: Any, default: int) -> int:
    try:
        size = weights.transforms().crop_size
        return int(size[0] if isinstance(size, (list, tuple)) else size)
    except Exception:
        return default


def _images(batch: int, *shape: int) -> Callable[[], Inputs]:
    return lambda: ((torch.randn(batch, *shape),), {})


def _case(family: str, name: str) -> Case:
    from torchvision.models import get_model  # type: ignore[import-not-found]

    weights = _weights(name)
    meta = weights.meta if weights is not None else {}
    published = meta.get("_ops")
    params = meta.get("num_params")
    min_h = int(meta.get("min_size", (1, 1))[0])
    batch = 1 if name in HEAVY else 2
    ref_inputs: Optional[Callable[[], Inputs]] = None
    build: Callable[[], Any] = lambda: get_model(name, weights=None)  # noqa: E731
    ref_build: Optional[Callable[[], Any]] = None
    note = ""

    if family == "classification":
        size = 224 if name.startswith(FIXED_224) else max(32, min_h)
        inputs = _images(batch, 3, size, size)
        crop = _crop(weights, 224)
        ref_inputs = _images(1, 3, crop, crop)
        note = f"published at 1×3×{crop}²"
        if name.startswith("vit_") and crop != 224:  # the published ViT is built for its own image size
            ref_build = lambda: get_model(name, weights=None, image_size=crop)  # noqa: E731
    elif family == "segmentation":
        def build() -> Any:  # no download; the aux head that the published weights (and _ops) include
            extra = {} if name.startswith("lraspp") else {"aux_loss": True}
            return get_model(name, weights=None, weights_backbone=None, **extra)

        inputs = _images(batch, 3, 48, 48)
        ref_inputs = _images(1, 3, 520, 520)
        note = "published at 1×3×520²"
    elif family == "video":
        frames = max(4, int(meta.get("min_temporal_size", 1)))
        size = max(32, min_h)
        inputs = _images(batch, 3, frames, size, size)
        crop = _crop(weights, 112)
        ref_inputs = _images(1, 3, 16, crop, crop)
        note = f"published at 1×3×16×{crop}²"
    elif family == "detection":
        def build() -> Any:  # a small transform size keeps the CPU run cheap; the heads are unchanged
            extra = {} if name.startswith("ssd") else {"min_size": 128, "max_size": 160}
            return get_model(name, weights=None, weights_backbone=None, **extra)

        inputs = lambda: (([torch.rand(3, 120, 160), torch.rand(3, 128, 128)],), {})  # noqa: E731
        note = "published _ops at COCO eval sizes: shown, not compared"
    else:  # optical flow: two frames, height and width divisible by 8
        inputs = lambda: ((torch.randn(2, 3, 128, 128), torch.randn(2, 3, 128, 128)), {})  # noqa: E731
        note = "published _ops at the eval frame size: shown, not compared"

    compare = ref_inputs is not None and published is not None
    return Case(
        "torchvision", name, build, inputs, train=False,
        ref_macs=round(float(published or 0) * 1e9) if compare else None,
        ref_source=f"published {published} G" if published is not None else "",
        ref_inputs=ref_inputs if compare else None,
        ref_params=params,
        note=f"{family}; {note}",
        ref_build=ref_build,
    )


def cases() -> List[Case]:
    from torchvision import models  # type: ignore[import-not-found]

    out: List[Case] = []
    for family in FAMILIES:
        for name in models.list_models(module=_module(family)):
            out.append(_case(family, name))
    return out


def published_tolerance(ref_macs: int) -> int:
    """``_ops`` is rounded to 3 decimals of GMACs."""
    return 500_000 if ref_macs else 0


def family_counts() -> List[Tuple[str, int]]:
    from torchvision import models  # type: ignore[import-not-found]

    return [(f, len(models.list_models(module=_module(f)))) for f in FAMILIES]
