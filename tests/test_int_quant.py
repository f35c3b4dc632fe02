import itertools
import math

import pytest
import torch
from helpers import kernel_can_hold, same_bits

from gradcomp import quantize_int
from gradcomp.ops.int_quant import RANGE_EPS, AffineMap, BlockHouseholder

SCHEMES = ["ptq", "psq", "bhq"]


def row_scaled(n_rows, n_cols, sigma, seed=0, dtype=torch.float32):
    """Rows with lognormally distributed scales, as neural gradients across samples (section 2.8)."""
    generator = torch.Generator().manual_seed(seed)
    scales = torch.exp(sigma * torch.randn(n_rows, 1, generator=generator))
    return (scales * torch.randn(n_rows, n_cols, generator=generator)).to(dtype)


def quantization_variance(x, bits, scheme, draws=40):
    outs = torch.stack([quantize_int(x, bits, scheme, seed=s) for s in range(draws)]).double()
    return outs.var(0).sum().item()


def dense_block_householder(ranges: torch.Tensor) -> torch.Tensor:
    """The N x N matrix T of section 2.6, built step by step with loops (an independent oracle)."""
    ranges = ranges.double()
    lam = ranges + (RANGE_EPS * ranges.max() + torch.finfo(torch.float32).tiny)
    order = sorted(range(len(lam)), key=lambda i: -float(lam[i]))  # stable, descending
    v = [float(lam[i]) for i in order]
    n_rows = len(v)
    total, k = sum(v), 0
    while True:
        k += 1
        total -= v[n_rows - k]
        if k == n_rows - 1 or k * v[n_rows - k - 1] / total > 1:
            break
    n_large = n_rows - k
    large_sum = sum(v[:n_large])
    ends = [math.floor(sum(v[: i + 1]) * k / large_sum + 0.5) for i in range(n_large)]
    transform = torch.zeros(n_rows, n_rows, dtype=torch.float64)
    for i in range(n_large):
        start = ends[i - 1] if i else 0
        members = [i] + [n_large + j for j in range(start, ends[i])]
        n = len(members)
        u = torch.full((n,), 1 / math.sqrt(n), dtype=torch.float64)
        u[0] -= 1
        u /= u.norm()
        householder = torch.eye(n, dtype=torch.float64) - 2 * torch.outer(u, u)
        w1 = v[i] / math.sqrt(n)
        w2 = v[n_large + start] * householder.abs().max().item()
        s1, s2 = w1 ** (-1 / 3), (w2 / (n - 1)) ** (-1 / 3)
        norm = math.sqrt(1 / s1**2 + 1 / s2**2)
        block = householder @ torch.diag(torch.tensor([s1] + [s2] * (n - 1), dtype=torch.float64) * norm)
        rows = [order[p] for p in members]
        transform[torch.tensor(rows)[:, None], torch.tensor(rows)[None, :]] = block
    return transform


@pytest.mark.parametrize("n_rows", [2, 3, 7, 64])
@pytest.mark.parametrize("sigma", [0.0, 1.0, 3.0])
def test_structured_transform_equals_the_dense_section_2_6_matrix(n_rows, sigma):
    x = row_scaled(n_rows, 32, sigma, seed=n_rows).double()
    low, high = torch.aminmax(x, dim=1)
    transform = BlockHouseholder.from_ranges(high - low)
    structured = transform.reflect(x * transform.scale[:, None])
    torch.testing.assert_close(structured, dense_block_householder(high - low) @ x, rtol=1e-9, atol=1e-12)
    inverse = transform.reflect(structured) / transform.scale[:, None]
    torch.testing.assert_close(inverse, x, rtol=1e-9, atol=1e-12)


def test_blocks_pair_every_large_row_with_small_rows():
    x = row_scaled(128, 16, 2.0)
    low, high = torch.aminmax(x, dim=1)
    transform = BlockHouseholder.from_ranges(high - low)
    sizes = torch.bincount(transform.block, minlength=128)
    assert sizes[sizes > 0].min() >= 2 and sizes.sum() == 128
    # group sizes grow with the large row's range (n_i ~ 1 + k lambda_i / S)
    used = sizes > 0
    large_ranges = torch.zeros(128).scatter_reduce(0, transform.block, high - low, "amax")[used]
    assert torch.corrcoef(torch.stack([large_ranges, sizes[used].float()]))[0, 1] > 0.9


def _rounding_spread(x: torch.Tensor, bits: int, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per element: the exact standard deviation of the quantizer's output and its largest possible jump,
    from the fractions f of the codes (variance f(1-f) bin^2, mapped back through T^-1 for BHQ)."""
    levels = 2**bits - 1
    x = x.double()
    transform_inverse = torch.eye(x.shape[0], dtype=torch.float64)
    if scheme == "bhq":
        low, high = torch.aminmax(x, dim=1)
        transform = dense_block_householder(high - low)
        transform_inverse = torch.linalg.inv(transform)
        x = transform @ x
    rows = x.reshape(1, -1) if scheme == "ptq" else x
    low, high = torch.aminmax(rows, dim=1)
    step = ((high - low) / levels)[:, None]
    codes = (rows - low[:, None]) / step
    fraction = codes - codes.floor()
    variance = (fraction * (1 - fraction) * step**2).reshape(x.shape)
    jump = step.expand_as(rows).reshape(x.shape)
    return (transform_inverse**2 @ variance).sqrt(), transform_inverse.abs() @ jump


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("bits", [2, 5])
def test_quantizers_are_unbiased(scheme, bits):
    x = row_scaled(16, 24, 1.5, seed=1)
    draws = 3000
    outs = torch.stack([quantize_int(x, bits, scheme, seed=s) for s in range(draws)]).double()
    spread, jump = _rounding_spread(x, bits, scheme)
    # 5 sigma, plus a Poisson allowance for elements that rarely move (tiny fractions)
    bound = 5 * spread / math.sqrt(draws) + 10 * jump / draws + 1e-6 * x.abs().max()
    assert torch.all((outs.mean(0) - x.double()).abs() <= bound)
    frequent = spread > 0.2 * jump  # fractions away from 0 and 1: the sample spread is reliable there
    torch.testing.assert_close(outs.std(0)[frequent], spread[frequent], rtol=0.15, atol=0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_outputs_are_on_the_quantization_grid(scheme):
    x = row_scaled(8, 20, 1.0)
    out = quantize_int(x, 3, scheme, seed=0)
    if scheme == "bhq":
        return  # BHQ's grid lives in the transformed domain
    rows = x.reshape(1, -1) if scheme == "ptq" else x
    low, high = torch.aminmax(rows, dim=1)
    codes = (out.reshape(rows.shape) - low[:, None]) / ((high - low)[:, None] / 7)
    assert torch.allclose(codes, codes.round(), atol=1e-3)
    assert codes.min() >= -1e-3 and codes.max() <= 7 + 1e-3


def test_variance_ordering_with_a_dominant_row():
    """Section 2.8: row 0 ~ N(0,1), the rest ~1e-6: PTQ/PSQ and PSQ/BHQ are both of order N = 64."""
    generator = torch.Generator().manual_seed(0)
    x = 1e-6 * torch.randn(64, 64, generator=generator)
    x[0] = torch.randn(64, generator=generator)
    ptq, psq, bhq = (quantization_variance(x, 4, s, draws=60) for s in SCHEMES)
    assert ptq > psq > bhq
    assert 64 / 4 < ptq / psq < 64 * 4
    assert 64 / 4 < psq / bhq < 64 * 4


def test_variance_vs_lognormal_row_spread():
    """Section 2.8 (N=128, D=256, 5 bits, row scales exp(sigma z)): BHQ/PSQ is ~1 for equal rows and falls
    as the row scales spread (0.52, 0.06, 0.03 at sigma 1, 2, 3 in the digest's draw); PTQ is far worse."""
    ratios = {}
    for sigma in (0.0, 1.0, 2.0, 3.0):
        x = row_scaled(128, 256, sigma, seed=7)  # the same z for every sigma
        ptq, psq, bhq = (quantization_variance(x, 5, s, draws=24) for s in SCHEMES)
        ratios[sigma] = (ptq / psq, bhq / psq)
    assert 0.85 < ratios[0.0][1] < 1.2 and ratios[0.0][0] > 1.2
    bhq_gain = [ratios[sigma][1] for sigma in (0.0, 1.0, 2.0, 3.0)]
    assert all(a > b for a, b in itertools.pairwise(bhq_gain)), ratios
    assert bhq_gain[2] < 0.3 and bhq_gain[3] < 0.1, ratios
    assert all(ratios[sigma][0] > 10 for sigma in (1.0, 2.0, 3.0)), ratios


@pytest.mark.parametrize("scheme", SCHEMES)
def test_variance_falls_about_fourfold_per_bit(scheme):
    x = row_scaled(32, 64, 1.0, seed=3)
    variances = [quantization_variance(x, bits, scheme, draws=40) for bits in (4, 5, 6, 7, 8)]
    ratios = [a / b for a, b in itertools.pairwise(variances)]
    assert all(2.5 < r < 6.5 for r in ratios), ratios


@pytest.mark.parametrize("scheme", SCHEMES)
def test_constant_rows_and_zeros_are_exact(scheme):
    x = torch.zeros(6, 10)
    x[2] = 3.5
    if scheme != "bhq":  # BHQ mixes rows, so only a tensor of zeros stays exact
        assert torch.equal(quantize_int(x, 4, scheme, seed=0), x)
    assert torch.equal(quantize_int(torch.zeros(5, 7), 4, scheme, seed=0), torch.zeros(5, 7))


def test_non_finite_values_poison_their_scale_group():
    x = row_scaled(6, 10, 1.0)
    x[2, 3] = math.nan
    x[4, 0] = math.inf
    psq = quantize_int(x, 4, "psq", seed=0)
    assert torch.isnan(psq[[2, 4]]).all() and torch.isfinite(psq[[0, 1, 3, 5]]).all()
    assert torch.isnan(quantize_int(x, 4, "ptq", seed=0)).all()
    assert torch.isnan(quantize_int(x, 4, "bhq", seed=0)).all()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (1, 5), (2, 5), (3, 4, 5)])
def test_shapes(scheme, shape):
    x = torch.randn(shape)
    out = quantize_int(x, 6, scheme, seed=1)
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert quantize_int(torch.empty(0, 3), 6, scheme).shape == (0, 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes_and_non_contiguous(dtype):
    x = row_scaled(20, 12, 1.0, dtype=dtype)
    out = quantize_int(x.t(), 5, "bhq", seed=2)
    assert out.dtype == dtype
    assert same_bits(out, quantize_int(x.t().contiguous(), 5, "bhq", seed=2))


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_kernels_are_bit_exact(kernel_device, scheme, dtype):
    x = row_scaled(24, 50, 2.0, seed=5, dtype=dtype)
    expected = quantize_int(x, 4, scheme, seed=9, backend="torch")
    got = quantize_int(x.to(kernel_device), 4, scheme, seed=9, backend="triton")
    assert same_bits(got.cpu(), expected)


@pytest.mark.parametrize("columns", [False, True])
def test_triton_affine_kernel_tile_independent(kernel_device, columns):
    from gradcomp.kernels.int_quant import quantize_groups_triton

    rows = row_scaled(10, 300, 1.0).to(kernel_device)
    params = torch.stack(AffineMap.of_rows(rows, 15, dim=0 if columns else 1))
    a = quantize_groups_triton(rows, 15, 4, columns, params, tile=(1, 128))
    b = quantize_groups_triton(rows, 15, 4, columns, params, tile=(16, 512))
    assert same_bits(a, b)
    assert same_bits(a, quantize_groups_triton(rows, 15, 4, columns))  # the kernels' own AffineMap


def _extreme_groups(dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, int]]:
    """Groups whose range or levels/range leave the compute dtype's range, as (one row, bits)."""
    info = torch.finfo(dtype)
    tiny = info.tiny / 64  # a subnormal
    generator = torch.Generator().manual_seed(0)
    return {
        "subnormal": (torch.tensor([[tiny, -tiny, 0.0, 3 * tiny]], dtype=torch.float64), 4),
        "small": (torch.randn(1, 64, generator=generator, dtype=torch.float64) * (8 * info.tiny), 8),
        "huge": (torch.tensor([[0.9 * info.max, -0.9 * info.max, 1.0, 2.0]], dtype=torch.float64), 4),
    }


@pytest.mark.parametrize("scheme", ["ptq", "psq"])
@pytest.mark.parametrize("case", ["subnormal", "small", "huge"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_extreme_group_ranges_give_finite_unbiased_outputs_within_the_range(scheme, case, dtype):
    row, bits = _extreme_groups(dtype)[case]
    row = row.to(dtype)
    draws = 4000
    out = quantize_int(row.repeat(draws, 1), bits, scheme, seed=3)  # every row the same group
    assert out.dtype == dtype and torch.isfinite(out).all()
    low, high = row.min(), row.max()
    assert ((out >= low) & (out <= high)).all()
    magnitude = row.double().abs().max()  # in units of it, so that float64 sums do not overflow
    row64, out64 = row.double() / magnitude, out.double() / magnitude
    step = (row64.max() - row64.min()) / (2**bits - 1)
    rounding = torch.finfo(dtype).eps * (1 + torch.finfo(dtype).tiny / magnitude)  # the output's rounding
    bound = 5 * step / (2 * math.sqrt(draws)) + rounding
    assert ((out64.mean(0) - row64[0]).abs() <= bound).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_extreme_groups_under_bhq_stay_finite(dtype):
    info = torch.finfo(dtype)
    for x in (
        torch.tensor([[0.9, -0.9, 1e-6, 2e-6], [1e-3, 2e-3, 3e-3, 4e-3]], dtype=torch.float64) * info.max,
        torch.tensor([[1.0, -1.0, 0.0, 3.0], [1.0, 2.0, 3.0, 4.0]], dtype=torch.float64) * (info.tiny / 64),
    ):
        out = quantize_int(x.to(dtype), 4, "bhq", seed=1)
        assert out.dtype == dtype and torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_is_bit_exact_on_extreme_groups(kernel_device, dtype):
    groups = _extreme_groups(dtype)
    rows = torch.cat([row[:, :4] for row, _ in groups.values()]).to(dtype)
    rows = rows[kernel_can_hold(rows).all(1)]
    for scheme in SCHEMES:
        expected = quantize_int(rows, 4, scheme, seed=6, backend="torch")
        got = quantize_int(rows.to(kernel_device), 4, scheme, seed=6, backend="triton")
        assert same_bits(got.cpu(), expected), scheme


def test_issue_examples_are_finite():
    torch.manual_seed(0)
    for x, bits in (
        (torch.randn(4, 64) * 1e-37, 8),
        (torch.tensor([[1e-40, -1e-40, 0.0]]), 4),
        (torch.tensor([[3e38, -3e38, 1.0, 2.0]]), 4),
    ):
        for dtype in (torch.float32, torch.bfloat16):
            for scheme in SCHEMES:
                assert torch.isfinite(quantize_int(x.to(dtype), bits, scheme, seed=0)).all()


@pytest.mark.parametrize("scheme", ["ptq", "psq"])
def test_zeros_stay_exact_where_they_are_their_groups_minimum(scheme):
    """The documented rule: a group's min maps to code 0 and back exactly, so zeros survive in groups of
    values >= 0 (here rows after a ReLU, and an all-zero row); with negative values present a zero moves to
    a neighbouring code, unbiased (mean 0)."""
    generator = torch.Generator().manual_seed(2)
    relu = torch.randn(6, 40, generator=generator).clamp_min(0)
    relu[3] = 0
    for seed in range(20):
        assert torch.all(quantize_int(relu, 3, scheme, seed=seed)[relu == 0] == 0)
    signed = torch.randn(6, 40, generator=generator)
    signed[:, ::4] = 0
    draws = 400
    outs = torch.stack([quantize_int(signed, 3, scheme, seed=seed) for seed in range(draws)])[:, signed == 0]
    assert (outs != 0).float().mean() > 0.5  # zeros do move
    rows = signed.reshape(1, -1) if scheme == "ptq" else signed
    step = ((rows.amax(1) - rows.amin(1)) / 7).max()
    assert outs.double().mean(0).abs().max() < 5 * step / (2 * math.sqrt(draws))


def test_inputs_that_require_grad_are_detached():
    x = row_scaled(6, 10, 1.0).requires_grad_()
    for scheme in SCHEMES:
        out = quantize_int(x, 4, scheme, seed=0)
        assert not out.requires_grad
        assert same_bits(out, quantize_int(x.detach(), 4, scheme, seed=0))
