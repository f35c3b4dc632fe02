"""Models from timm's registry, with options for small images."""

from __future__ import annotations

from typing import Any

import timm
from torch import nn


def create_model(
    name: str,
    num_classes: int,
    in_chans: int = 3,
    image_size: int | None = None,
    cifar_stem: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """timm.create_model(name, pretrained=False, ...) as a plain nn.Module.

    cifar_stem: for ResNets, a 3x3 stride-1 first convolution and no max-pool (the usual CIFAR ResNet).
    image_size: passed to models that need it (ViT/DeiT: img_size); other kwargs go to timm unchanged,
    e.g. patch_size=4 for a ViT on 32x32 images.
    """
    if not timm.is_model(name):
        raise ValueError(f"unknown timm model {name!r} (see timm.list_models())")
    if image_size is not None and any(key in name for key in ("vit", "deit")):
        kwargs.setdefault("img_size", image_size)
    model = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_chans, **kwargs)
    if cifar_stem:
        if not (hasattr(model, "conv1") and hasattr(model, "maxpool") and isinstance(model.conv1, nn.Conv2d)):
            raise ValueError(
                f"cifar_stem applies to ResNet-style models with conv1 and maxpool, not {name!r}"
            )
        model.conv1 = nn.Conv2d(in_chans, model.conv1.out_channels, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
    return model
