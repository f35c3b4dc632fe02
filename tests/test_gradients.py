import math

import pytest
import torch
from torch import nn

from gradcomp.analysis.gradients import (
    bin_codes,
    fqt_weight_gradients,
    layer_weights,
    output_gradients,
    quantization_variance,
    relative_error_of_mean,
    row_ranges,
    sample_variance,
    weight_gradients,
)
from gradcomp.analysis.runs import load_groups
from gradcomp.analysis.statquant import unbiasedness, variance_vs_bits
from gradcomp.experiments import Unbiasedness, VarianceVsBits
from gradcomp.ops.int_quant import AffineMap, BlockHouseholder, quantize_int
from gradcomp.training.config import resolve_config
from gradcomp.training.qat import quantize_activation, quantize_forward
from gradcomp.training.train import train


def _heterogeneous_rows(n=32, d=64, seed=0):
    """Rows with lognormal scales, row 0 a thousand times larger than the rest."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=generator) * torch.exp(torch.randn(n, 1, generator=generator))
    x[0] *= 1000
    return x


def _tiny_model(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(4 * 36, 5),
    )
    quantize_forward(model, 8)
    return model.eval()


def _batch(seed=0, n=8):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 6, 6, generator=generator), torch.randint(0, 5, (n,), generator=generator)


@pytest.mark.parametrize("scheme", ["ptq", "psq", "bhq"])
def test_bin_codes_are_in_range_and_count_every_element(scheme):
    x = _heterogeneous_rows()
    codes = bin_codes(x, 4, scheme, seed=3)
    assert codes.shape == x.shape and codes.dtype == torch.int64
    assert codes.min() >= 0 and codes.max() <= 15
    assert torch.bincount(codes.flatten(), minlength=16).sum() == x.numel()
    assert codes.max() == 15 and codes.min() == 0  # min-max maps reach both ends of the code book


@pytest.mark.parametrize("scheme", ["ptq", "psq", "bhq"])
def test_bin_codes_are_the_codes_quantize_int_uses(scheme):
    """quantize_int's output, mapped back to the coded domain, sits on exactly these codes."""
    x = _heterogeneous_rows()

    def coded_domain(rows):
        if scheme == "bhq":
            return transform.reflect(rows * transform.scale[:, None])
        return rows.reshape(1, -1) if scheme == "ptq" else rows

    transform = BlockHouseholder.from_ranges(row_ranges(x))
    affine = AffineMap.of_rows(coded_domain(x), 15)
    pre, zero, scale = (value[:, None] for value in (affine.pre, affine.zero, affine.scale))
    output = coded_domain(quantize_int(x.double(), 4, scheme, seed=7))
    codes = bin_codes(x.double(), 4, scheme, seed=7).reshape(output.shape)
    assert torch.allclose((output * pre - zero) * scale, codes.double(), atol=1e-3)


def test_per_tensor_codes_use_fewer_bins_than_per_sample_codes_with_one_dominant_row():
    x = _heterogeneous_rows()
    distinct = {s: bin_codes(x, 8, s).unique().numel() for s in ("ptq", "psq")}
    assert distinct["ptq"] < distinct["psq"] / 4
    assert row_ranges(x)[0] > 100 * row_ranges(x)[1:].max()


def test_output_gradients_are_the_loss_gradients_of_every_layer_output():
    model = _tiny_model()
    images, labels = _batch()
    captured = output_gradients(model, images, labels)
    assert set(captured) == {"0", "4"}
    assert captured["0"].shape == (8, 4 * 36) and captured["4"].shape == (8, 5)
    logits = model(images)
    expected = (torch.softmax(logits, 1) - nn.functional.one_hot(labels, 5)) / 8  # d mean CE / d logits
    assert torch.allclose(captured["4"], expected, atol=1e-6)
    assert all(p.grad is None for p in model.parameters())  # nothing left behind


def test_weight_gradients_cover_every_conv_and_linear_weight():
    model = _tiny_model()
    weights = layer_weights(model)
    assert list(weights) == ["0", "4"]
    assert all(w.requires_grad and w.is_leaf for w in weights.values())  # the QAT originals
    grads = weight_gradients(model, *_batch())
    assert grads.shape == (sum(w.numel() for w in weights.values()),)
    assert grads.abs().sum() > 0


def test_sample_variance_is_zero_for_identical_batches_and_positive_otherwise():
    model = _tiny_model()
    same = torch.stack([weight_gradients(model, *_batch(0)) for _ in range(3)])
    assert sample_variance(same) == pytest.approx(0.0, abs=1e-12)
    different = torch.stack([weight_gradients(model, *_batch(seed)) for seed in range(3)])
    assert sample_variance(different) > 0


def test_quantization_variance_falls_with_bits_and_draws_differ():
    model = _tiny_model()
    images, labels = _batch()
    exact = weight_gradients(model, images, labels)[None]
    variance = {}
    for bits in (2, 4, 6):
        policy = f"int:bits={bits},scheme=psq,weight_bits={bits}"
        draws = fqt_weight_gradients(model, images, labels, policy, draws=4, seed=1)
        assert not torch.equal(draws[0], draws[1])
        variance[bits] = quantization_variance(exact, draws[None])
    assert variance[2] > 4 * variance[4] > 16 * variance[6] > 0
    assert torch.equal(weight_gradients(model, images, labels), exact[0])  # detached again


def test_relative_error_of_the_mean_of_unbiased_draws_falls_like_one_over_sqrt_k():
    generator = torch.Generator().manual_seed(0)
    exact = torch.ones(20_000)
    draws = exact + torch.randn(64, 20_000, generator=generator)
    errors = relative_error_of_mean(exact, draws, [1, 4, 16, 64])
    assert errors[0] == pytest.approx(1.0, rel=0.03)
    assert errors[-1] == pytest.approx(1 / 8, rel=0.05)
    biased = relative_error_of_mean(exact, draws + 0.5, [1, 64])
    assert biased[-1] == pytest.approx(math.sqrt(0.25 + 1 / 64), rel=0.05)


@pytest.fixture(scope="module")
def qat_runs(tmp_path_factory):
    """A resnet10t with 8-bit forward quantization, trained a few steps on synthetic images, two seeds."""
    folders = {}
    for seed in (0, 1):
        out = tmp_path_factory.mktemp("runs") / f"seed{seed}"
        config = resolve_config(
            out=str(out),
            dataset="synthetic",
            model="resnet10t",
            model_kwargs={"channels": [8, 16, 32, 64]},
            batch_size=32,
            max_steps=3,
            subset_per_class=8,
            test_subset_per_class=8,
            forward_bits=8,
            progress=False,
            threads=1,
            seed=seed,
        )
        train(config)
        folders[seed] = out
    return load_groups({"qat8": folders})


def test_variance_falls_by_about_four_per_bit(qat_runs):
    settings = VarianceVsBits(run="qat8", bits=(3, 6), batches=2, draws=1)
    result = variance_vs_bits(settings, qat_runs)
    schemes = {row["scheme"]: row for row in result.rows("schemes")}
    for scheme in ("ptq", "psq", "bhq"):
        assert 2.5 < schemes[scheme]["per_bit_factor_mean"] < 7  # 4.3 in theory
        assert schemes[scheme]["per_bit_factor_ci_low"] > 0  # a positive quantity keeps a positive interval
    assert schemes["ptq"]["mean_ln_variance_mean"] > schemes["psq"]["mean_ln_variance_mean"]
    assert {row["seeds"] for row in result.rows()} == {2}
    assert {d.claim for d in result.claims} == {"S2", "S3"}
    sampling = result.rows("sampling")
    assert {row["batches"] for row in sampling} == {settings.sampling_batches}
    assert all(0 < row["standard_error"] < row["sampling_variance"] for row in sampling)
    relations = {row["vs_sampling"] for row in result.rows() if row["bits"] is not None}
    assert relations <= {"better", "worse", "inconclusive"}
    assert f"B = {settings.sampling_batches} batches" in " ".join(result.caption.split())


def test_unbiased_quantizers_approach_the_qat_gradient(qat_runs):
    result = unbiasedness(Unbiasedness(run="qat8", bits=4, draws=4), qat_runs)
    errors = {(row["policy"], row["draws"]): row["relative_error_mean"] for row in result.rows()}
    for scheme in ("ptq", "psq", "bhq"):
        assert errors[scheme, 4] < errors[scheme, 1]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shape", [(64, 16, 14, 14), (3, 5), (1,)])
def test_qat_activation_quantizer_is_the_digest_formula_bit_for_bit(bits, shape):
    """z = min - 1e-8, s = B / (max - min + 2e-8), round((x - z) s) / s + z, and a gradient of exactly one
    (the straight-through estimator), for signed, non-negative and constant inputs."""
    torch.manual_seed(bits)
    levels = 2**bits - 1
    for x in (torch.randn(shape) * 1e-3, torch.relu(torch.randn(shape)) * 50, torch.full(shape, 0.25)):
        x.requires_grad_(True)
        out = quantize_activation(x, bits)
        with torch.no_grad():
            low = x.min() - 1e-8
            scale = levels / (x.max() - x.min() + 2e-8)
            expected = x + ((torch.round((x - low) * scale) / scale + low) - x)
        assert torch.equal(out, expected)
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.equal(grad, torch.ones_like(x))
