"""Neural and weight gradients of a trained model, and the StatQuant measurements made on them.

The statistical FQT framework (statquant digest sections 3.3-3.4) compares a fully quantized training
(FQT) gradient with the quantization-aware training (QAT) gradient of the same batch: FQT is QAT plus
unbiased gradient quantizers, so its weight gradient is an unbiased estimate of the QAT one, and its extra
variance (the quantization variance) is what the quantizer schemes and bit widths trade against the
minibatch sampling variance. These functions capture the tensors involved; the model should be in eval
mode (BatchNorm on running statistics) so that samples are independent and repeated passes agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from gradcomp.ops.int_quant import AffineMap, BlockHouseholder, Scheme, quantize_int
from gradcomp.training.attachment import attach, select_layers
from gradcomp.training.config import CompressionConfig
from gradcomp.training.policies import Policy

LAYERS = ("conv", "linear")  # where StatQuant quantizes gradients (section 2.0)


def _loss(model: nn.Module, images: Tensor, labels: Tensor) -> Tensor:
    return nn.functional.cross_entropy(model(images), labels)


def layer_weights(model: nn.Module) -> dict[str, Tensor]:
    """The trainable weight of every conv/linear layer (the original behind a QAT weight quantizer)."""
    weights = {}
    for name, module in select_layers(model, LAYERS):
        if parametrize.is_parametrized(module, "weight"):
            weights[name] = module.parametrizations.weight.original
        else:
            weights[name] = module.weight
    return weights


def output_gradients(model: nn.Module, images: Tensor, labels: Tensor) -> dict[str, Tensor]:
    """The loss gradient w.r.t. the output of every conv/linear layer (the tensor StatQuant quantizes), for
    one batch, as rows = samples [N, D]. Captured through an uncompressed attachment's observer, whose hook
    tolerates the in-place ops that follow some layers."""
    captured: dict[str, Tensor] = {}
    attachment = attach(model, CompressionConfig(layer_types=LAYERS))
    attachment.observers.append(
        lambda name, g, active: captured.__setitem__(name, g.detach().flatten(1).clone())
    )
    try:
        _loss(model, images, labels).backward()
    finally:
        attachment.detach()
        model.zero_grad(set_to_none=True)
    return captured


def captured_gradients(
    model: nn.Module, config: CompressionConfig, images: Tensor, labels: Tensor
) -> list[tuple[str, Tensor, Tensor | None, int]]:
    """(layer name, gradient, BatchNorm-output mask, feature axis) of every layer `config` selects, one
    uncompressed backward pass."""
    captured = []
    attachment = attach(model, dataclasses.replace(config, policy="none"))
    axes = {layer.name: layer.feature_axis for layer in attachment.layers}
    attachment.observers.append(
        lambda name, g, active: captured.append((name, g.detach().clone(), active, axes[name]))
    )
    try:
        _loss(model, images, labels).backward()
    finally:
        attachment.detach()
        model.zero_grad(set_to_none=True)
    return captured


def weight_gradients(model: nn.Module, images: Tensor, labels: Tensor) -> Tensor:
    """d loss / d W of every conv/linear weight for one batch, flattened and concatenated in module order;
    with a gradient policy attached to `model` this is one FQT draw, otherwise the QAT gradient."""
    grads = torch.autograd.grad(_loss(model, images, labels), list(layer_weights(model).values()))
    return torch.cat([g.reshape(-1) for g in grads])


def fqt_weight_gradients(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    policy: Policy | str | CompressionConfig,
    draws: int,
    seed: int = 0,
    first_step: int = 0,
) -> Tensor:
    """`draws` weight gradients [draws, P] of one batch with `policy` attached at its own placement (int:
    convolutions and linear layers; fp: convolutions) or where a `CompressionConfig` puts it. Each draw is
    a different attachment step, hence different random bits; give disjoint `first_step` ranges to
    different batches so that no two draws share bits."""
    attachment = attach(model, policy, seed=seed)
    try:
        draws_out = []
        for draw in range(draws):
            attachment.begin_step(first_step + draw)
            draws_out.append(weight_gradients(model, images, labels))
    finally:
        attachment.detach()
    return torch.stack(draws_out)


def sample_variance(qat: Tensor) -> float:
    """Minibatch sampling variance mean_b ||g_QAT(b) - mean_b g_QAT||^2 of per-batch gradients [B, P]."""
    return float((qat - qat.mean(0)).double().square().sum(1).mean())


def quantization_variance(qat: Tensor, fqt: Tensor) -> float:
    """mean over batches and draws of ||g_FQT(b) - g_QAT(b)||^2 (qat [B, P], fqt [B, draws, P]): the
    conditional variance E Var[g_FQT | batch] that the gradient quantizers add (unbiased, so no bias term)."""
    return float((fqt - qat[:, None]).double().square().sum(2).mean())


def quantizer_variance(x: Tensor, bits: int, scheme: Scheme, draws: int, seed: int = 0) -> float:
    """mean over draws of ||Q(x) - x||^2: the variance one quantizer adds to one neural gradient."""
    errors = [
        (quantize_int(x, bits, scheme, seed=seed + draw) - x).double().square().sum() for draw in range(draws)
    ]
    return float(torch.stack(errors).mean())


def row_ranges(x: Tensor) -> Tensor:
    """max - min of every row (sample) of x [N, ...]: what sets each sample's PSQ bin size."""
    low, high = torch.aminmax(x.flatten(1), dim=1)
    return high - low


def bin_codes(x: Tensor, bits: int, scheme: Scheme, seed: int = 0) -> Tensor:
    """The integer code (0..2^bits - 1) every element of x [N, ...] lands on before dequantization, as
    [N, D]: PTQ codes the whole tensor with one affine map, PSQ each row with its own, BHQ each row of the
    block-Householder-transformed rows (section 2.6). The rounding is quantize_int's own stochastic
    rounding with this seed (the codes are read back from its output), so they are exactly the codes
    quantize_int(x, bits, scheme, seed) uses."""
    rows = x.flatten(1)
    if scheme == "bhq":
        transform = BlockHouseholder.from_ranges(row_ranges(rows))
        rows = transform.reflect(rows * transform.scale[:, None])
    groups = rows.reshape(1, -1) if scheme == "ptq" else rows
    levels = 2**bits - 1
    affine = AffineMap.of_rows(groups, levels)
    quantized = quantize_int(groups, bits, "psq", seed=seed)
    pre, zero, scale = (value[:, None] for value in (affine.pre, affine.zero, affine.scale))
    codes = torch.round((quantized * pre - zero) * scale).clamp(0, levels)
    return codes.long().reshape(rows.shape)


def relative_error_of_mean(exact: Tensor, draws: Tensor, counts: Sequence[int]) -> list[float]:
    """||mean of the first K draws - exact|| / ||exact|| for each K in `counts` (draws [K_max, P]): for an
    unbiased estimator it falls as 1/sqrt(K), for a biased one it levels off at the bias."""
    norm = exact.double().norm()
    return [float((draws[:k].double().mean(0) - exact).norm() / norm) for k in counts]
