import math
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from gradcomp.training.attachment import attach
from gradcomp.training.config import CompressionConfig, resolve_config
from gradcomp.training.models import create_model, layer_shapes

DEFAULT = yaml.safe_load((Path(__file__).parents[1] / "config" / "default.yaml").read_text())

MODELS = [
    ("resnet18", {"in_chans": 1}),
    ("resnet18", {"stem": "3x3"}),
    ("resnet18", {"stem": "3x3s2", "channels": [16, 32, 64, 128]}),
    ("resnet50", {"stem": "3x3s2", "channels": [16, 32, 64, 128]}),
    ("resnet50", {}),
    ("mobilenetv2_100", {}),
    ("mobilenetv2_035", {}),
    ("vit_tiny_patch16_224", {"image_size": 32, "patch_size": 8}),
    ("deit_tiny_patch16_224", {"image_size": 32, "patch_size": 8}),
    ("densenet121", {}),
    ("vgg16_bn", {}),
]


@pytest.mark.parametrize(
    ("name", "options"), MODELS, ids=[f"{n}{'-' + '-'.join(o) if o else ''}" for n, o in MODELS]
)
def test_model_trains_one_step_with_compressed_gradients(name, options):
    torch.manual_seed(0)
    model = create_model(name, num_classes=10, **options)
    config = CompressionConfig("prune:sparsity=0.8+fp:format=e5m2", layer_types=["conv", "linear"])
    handle = attach(model, config)  # ViTs are mostly Linear
    images = torch.randn(2, options.get("in_chans", 3), 32, 32)
    nn.functional.cross_entropy(model(images), torch.tensor([1, 2])).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert len(handle.layers) >= 10 and handle.sparsity() > 0.5


def test_bad_model_options():
    with pytest.raises(ValueError, match="unknown timm model"):
        create_model("resnet19", num_classes=10)
    with pytest.raises(ValueError, match="stem applies to ResNet-style models"):
        create_model("vgg16_bn", num_classes=10, stem="3x3")
    with pytest.raises(ValueError, match="stem must be one of"):
        create_model("resnet18", num_classes=10, stem="tiny")


def test_default_model_has_no_stage_at_1x1_and_no_dominant_layer():
    """The embedded default's model on its 28x28 images: every convolution output is at least 2x2, and no
    layer holds more than an eighth of the convolution-output elements (what the pruning axes measure)."""
    config = resolve_config(**DEFAULT["train"])
    model = create_model(config.model, 10, 1, 28, config.stem, **config.model_kwargs)
    shapes = layer_shapes(model, 1, 28, (nn.Conv2d,))
    assert all(shape[1] >= 2 and shape[2] >= 2 for shape in shapes.values()), shapes
    sizes = {name: math.prod(shape) for name, shape in shapes.items()}
    assert max(sizes.values()) / sum(sizes.values()) < 1 / 8
    assert shapes["layer4.1.conv2"][1:] == (2, 2)


def test_small_stem_is_as_wide_as_the_first_stage():
    model = create_model("resnet18", 10, 1, stem="3x3s2", channels=[16, 32, 64, 128])
    assert model.conv1.out_channels == model.bn1.num_features == 16
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (2, 2)
    assert isinstance(model.maxpool, nn.Identity) and model.layer1[0].downsample is None
