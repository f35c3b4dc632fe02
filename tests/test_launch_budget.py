"""The GPU path's budget: on a CUDA tensor each op is its kernel(s), with no torch operation around them and
no host sync, and the attachment adds a few launches per compressed layer and step. Checked where the
kernels run (on CPU tensors under the Triton interpreter, or on CUDA): `count_work` counts every Triton
launch and every torch operation (each a kernel launch on a GPU) and the operations that would read a
device value on the host."""

import pytest
import torch
from helpers import lognormal_gradient
from torch import nn

from gradcomp import (
    fit_statistics,
    log_moments,
    lognormal_threshold,
    quantize_fp,
    quantize_int,
    stochastic_prune,
)
from gradcomp.ops.int_quant import quantize_columns
from gradcomp.profiling import count_work
from gradcomp.training.attachment import attach
from gradcomp.training.config import CompressionConfig

SPARSITY = 0.85
POINTS = torch.tensor([[0.0, 1.0], [-3.0, -3.0]], dtype=torch.float64)


def _ops(x: torch.Tensor, mask: torch.Tensor, counter: torch.Tensor):
    """(name, call, most launches) of every public op on the device path (its Triton kernels)."""
    alpha = torch.tensor(0.01, device=x.device)
    alpha64 = alpha.double()
    scale = torch.tensor(4.0, device=x.device)
    rows = x.reshape(64, -1)
    points = POINTS.to(x.device)
    kernels = {"backend": "triton"}
    zeros = {"count_zeros_into": counter}
    rule = {"rule": "reference"}
    return [
        ("quantize_fp, number scale", lambda: quantize_fp(x, "e4m3", 4.0, **kernels), 1),
        ("quantize_fp, stochastic", lambda: quantize_fp(x, "e4m3", 4.0, "stochastic", 1, **kernels), 1),
        ("quantize_fp, tensor scale", lambda: quantize_fp(x, "e3m2", scale, **kernels, **zeros), 1),
        ("stochastic_prune, number alpha", lambda: stochastic_prune(x, 0.01, 1, **kernels), 1),
        ("stochastic_prune, tensor alpha", lambda: stochastic_prune(x, alpha, 1, "triton", counter), 1),
        ("stochastic_prune, float64 alpha", lambda: stochastic_prune(x, alpha64, 1, **kernels), 1),
        ("log_moments", lambda: log_moments(x, **kernels), 2),
        ("log_moments, masked", lambda: log_moments(x, mask=mask, **kernels), 2),
        ("lognormal_threshold", lambda: lognormal_threshold(x, SPARSITY, **kernels), 2),
        ("lognormal_threshold, mixture", lambda: lognormal_threshold(x, SPARSITY, mask=mask, **kernels), 2),
        ("lognormal_threshold, rule", lambda: lognormal_threshold(x, 0.85, mask=mask, **rule, **kernels), 2),
        ("fit_statistics, FP scale", lambda: fit_statistics(x, scale_points=points, **kernels), 2),
        ("quantize_int ptq", lambda: quantize_int(rows, 5, "ptq", 1, **kernels), 3),
        ("quantize_int psq", lambda: quantize_int(rows, 5, "psq", 1, **kernels, **zeros), 3),
        ("quantize_columns", lambda: quantize_columns(rows, 8, 1, **kernels), 3),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_op_is_its_kernels(kernel_device, dtype):
    x = lognormal_gradient(64 * 96, sigma=2.0, specials=False).to(kernel_device, dtype)
    mask = (torch.arange(x.numel(), device=kernel_device) % 3 != 0).to(dtype)
    counter = torch.zeros((), dtype=torch.int64, device=kernel_device)
    for name, call, budget in _ops(x, mask, counter):
        call()  # what is made once (tables, compiled kernels) is made here
        with count_work() as work:
            call()
        assert sum(work.launches.values()) <= budget, f"{name}: {work}"
        assert not work.torch_ops and not work.syncs, f"{name}: {work}"


def test_bhq_reads_nothing_on_the_host(kernel_device):
    rows = lognormal_gradient((64, 96), sigma=2.0, specials=False).to(kernel_device)
    quantize_int(rows, 5, "bhq", seed=1, backend="triton")
    with count_work() as work:
        quantize_int(rows, 5, "bhq", seed=1, backend="triton")
    assert not work.syncs, str(work)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 64, 10),
    )  # fmt: skip


def _step_work(model: nn.Module, images: torch.Tensor):
    loss = nn.functional.cross_entropy(model(images), torch.arange(len(images), device=images.device) % 10)
    with count_work() as work:
        loss.backward()
    return work


@pytest.mark.parametrize(
    "policy",
    ["prune:sparsity=0.85", "prune:sparsity=0.85,fit=reference", "fp:format=e4m1",
     "fp:format=e4m1,rounding=stochastic", "fp:format=e4m1,scaling=per_layer_optimal",
     "fp:format=e4m1,scaling=global,global_scale=4096"],
)  # fmt: skip
def test_the_attachment_adds_a_few_launches_per_layer_and_no_sync(kernel_device, policy):
    """A compressed backward pass against the same one uncompressed, statistics refreshed every step: the
    difference is the compression's work (the BatchNorm-output masks and the zero counts included)."""
    images = torch.randn(16, 3, 8, 8, device=kernel_device)
    model = _model().to(kernel_device)
    model(images).sum().backward()  # warm-up of the plain model
    plain = _step_work(model, images)
    handle = attach(model, CompressionConfig(policy, refresh="step"), backend="triton")
    for _ in range(2):  # warm-up: tables, compiled kernels, the zero counters
        _step_work(model, images)
    work = _step_work(model, images)
    layers = len(handle.layers)
    assert layers == 3
    extra_ops = work.torch_ops - plain.torch_ops
    assert not extra_ops and not work.syncs, str(work)
    assert sum(work.launches.values()) <= 3 * layers, str(work)
    assert 0 < handle.sparsity() < 1


@pytest.mark.parametrize(
    "policy", ["prune:sparsity=0.85", "fp:format=e4m1", "int:bits=4", "mxfp4", "luq", "nm:n=2,m=4"]
)
def test_the_noise_ratio_and_guard_add_nothing_between_their_steps(kernel_device, policy):
    """With noise_every=4 and a guard, a step that is not a noise step does the work of the same step
    without them (forward and backward), with no sync; the noise steps themselves sync once (each layer's
    prediction reads its fit on the host) and are not counted here."""
    images = torch.randn(16, 3, 8, 8, device=kernel_device)
    labels = torch.arange(16, device=kernel_device) % 10

    def step_work(model):
        with count_work() as work:
            nn.functional.cross_entropy(model(images), labels).backward()
        return work

    works = []
    for noise in ({}, {"noise_every": 4, "guard": 1.7}):
        model = _model().to(kernel_device)
        attach(model, CompressionConfig(policy, **noise), backend="triton")
        for _ in range(2):  # steps 0 (a noise step) and 1: warm-up
            step_work(model)
        works.append(step_work(model))  # step 2
    plain, guarded = works
    assert guarded.torch_ops == plain.torch_ops and guarded.launches == plain.launches, str(guarded)
    assert not guarded.syncs, str(guarded)
