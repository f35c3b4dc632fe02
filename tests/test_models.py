import pytest
import torch
from torch import nn

from gradcomp.attach import attach
from gradcomp.config import CompressionConfig
from gradcomp.models import create_model

MODELS = [
    ("resnet18", {"in_chans": 1}),
    ("resnet18", {"cifar_stem": True}),
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
    with pytest.raises(ValueError, match="cifar_stem"):
        create_model("vgg16_bn", num_classes=10, cifar_stem=True)
