"""Models from timm's registry, with stems for small images."""

from __future__ import annotations

import inspect
from typing import Any

import timm
import torch
from torch import nn

from gradcomp.training.config import STEMS, ConfigError, check_model_name

# stem name -> (kernel, stride) of the replacement first convolution ("model" keeps the model's own)
_STEM_CONV = {"3x3": (3, 1), "3x3s2": (3, 2)}
_STEM_PARTS = ("conv1", "bn1", "maxpool", "layer1")  # what a small stem replaces or reads
_FROM_THE_DATA = ("num_classes", "in_chans")  # create_model sets these from the dataset


def check_model(name: str, stem: str = "model", model_kwargs: dict[str, Any] | None = None) -> None:
    """Refuse, before any data is loaded, a model timm does not know, a `model_kwargs` key its class does not
    take (timm passes them on to the class) and a small stem on a model without a ResNet stem. The class is
    found by building the model with its defaults on the meta device (milliseconds, no memory)."""
    check_model_name(name)
    model_kwargs = model_kwargs or {}
    for key in _FROM_THE_DATA:
        if key in model_kwargs:
            raise ConfigError(f"model_kwargs key {key!r} is set from the dataset; remove it")
    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
    except Exception:  # a model that cannot be built on the meta device: building it for real checks it
        return
    if stem in _STEM_CONV:
        _check_resnet_stem(model, name)
    parameters = inspect.signature(type(model).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return  # the class takes any keyword
    known = sorted(set(parameters) - {"self", *_FROM_THE_DATA})
    for key in model_kwargs:
        if key not in known:
            raise ConfigError(
                f"model_kwargs key {key!r} is not a parameter of {name} (known: {', '.join(known)})"
            )


def create_model(
    name: str,
    num_classes: int,
    in_chans: int = 3,
    image_size: int | None = None,
    stem: str = "model",
    **kwargs: Any,
) -> nn.Module:
    """timm.create_model(name, pretrained=False, ...) as a plain nn.Module.

    stem: for ResNets, "3x3" is a 3x3 stride-1 first convolution and no max-pool (the usual CIFAR ResNet),
    "3x3s2" the same at stride 2 (28x28 inputs: stages at 14, 7, 4 and 2 pixels instead of 7, 4, 2 and 1);
    either is as wide as the first stage's output, as in a ResNet whose `channels` are all scaled (timm
    keeps its stem at 64 channels whatever `channels` says). "model" keeps the model's own stem.
    image_size: passed to models that need it (ViT/DeiT: img_size); other kwargs go to timm unchanged,
    e.g. patch_size=4 for a ViT on 32x32 images.
    """
    check_model_name(name)
    if stem not in STEMS:
        raise ConfigError(f"stem must be one of {', '.join(STEMS)}, got {stem!r}")
    if image_size is not None and any(key in name for key in ("vit", "deit")):
        kwargs.setdefault("img_size", image_size)
    model = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_chans, **kwargs)
    if stem in _STEM_CONV:
        _small_stem(model, name, in_chans, *_STEM_CONV[stem])
    return model


def _check_resnet_stem(model: nn.Module, name: str) -> None:
    if not all(hasattr(model, part) for part in _STEM_PARTS) or not isinstance(model.conv1, nn.Conv2d):
        raise ConfigError(
            f"stem applies to ResNet-style models with {', '.join(_STEM_PARTS)}, not {name!r} "
            "(stem: model keeps its own)"
        )


def _small_stem(model: nn.Module, name: str, in_chans: int, kernel: int, stride: int) -> None:
    """Replace a timm ResNet's 7x7/2 convolution and max-pool by one kernel x kernel convolution at
    `stride`, as wide as the first stage's output; its first block then reads that width directly, so that
    block needs no projection shortcut (as in a standard ResNet, whose stem matches its first stage)."""
    _check_resnet_stem(model, name)
    block = model.layer1[0]
    width = (block.bn3 if hasattr(block, "bn3") else block.bn2).num_features  # the block's output
    model.conv1 = nn.Conv2d(in_chans, width, kernel, stride, kernel // 2, bias=False)
    model.bn1 = type(model.bn1)(width)
    model.maxpool = nn.Identity()
    block.conv1 = _with_in_channels(block.conv1, width)
    block.downsample = None  # stride 1 and as wide as the block's output: an identity shortcut


def _with_in_channels(conv: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """A fresh convolution like `conv` reading `in_channels` channels."""
    return nn.Conv2d(
        in_channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
        bias=conv.bias is not None,
    )


def layer_shapes(model: nn.Module, in_chans: int, image_size: int, types: tuple[type, ...]) -> dict:
    """Output shape (C, H, W or features) of every module of `types`, for one image of that size (what the
    compressed gradients' shapes are; e.g. to check that no stage runs at 1x1)."""
    shapes: dict[str, tuple[int, ...]] = {}

    def record(name: str):
        def hook(module: nn.Module, inputs, output: torch.Tensor) -> None:
            shapes.setdefault(name, tuple(output.shape[1:]))

        return hook

    handles = [
        module.register_forward_hook(record(name))
        for name, module in model.named_modules()
        if isinstance(module, types)
    ]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, in_chans, image_size, image_size))
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return shapes
