"""What every public op does with awkward and bad inputs: one matrix (op x input case x dtype), each cell a
documented result or a clear error (docs/ops.md's table says the same). Elementwise ops run on both
backends (the Triton kernel under the interpreter, float32 only, to stay fast)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from gradcomp import ops

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
KERNEL_DTYPES = (torch.float32,)


def _cases(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    finfo = torch.finfo(dtype)
    generator = torch.Generator().manual_seed(0)
    signs = torch.tensor([[1.0, -0.5, 0.25, 0.75]], dtype=torch.float64)
    return {
        "empty": torch.empty(0, 4, dtype=dtype),
        "0-d": torch.tensor(0.3, dtype=dtype),
        "one element": torch.tensor([0.3], dtype=dtype),
        "non-contiguous": torch.randn(8, 6, generator=generator).to(dtype).t(),
        "NaN": torch.tensor([[0.5, math.nan, -1.0, 2.0]], dtype=dtype),
        "+-Inf": torch.tensor([[0.5, math.inf, -math.inf, 2.0]], dtype=dtype),
        "subnormal": (signs * finfo.tiny / 8).to(dtype),
        "tiny range": (signs * finfo.tiny * 4).to(dtype),
        "huge range": torch.tensor([[finfo.max / 2, -finfo.max / 2, 1.0, 2.0]], dtype=dtype),
        "all zero": torch.zeros(3, 4, dtype=dtype),
        "requires_grad": torch.randn(4, 4, generator=generator).to(dtype).requires_grad_(),
    }


CASES = tuple(_cases(torch.float32))

# Elementwise ops: same shape and dtype, never requiring grad. `passes` says what non-finite inputs do:
# "through" (NaN stays NaN, +-Inf stays +-Inf, the rest is finite) or "group" (the scale group holding one
# comes out all NaN: quantize_int's PTQ and BHQ groups are the whole tensor here).
ELEMENTWISE: dict[str, tuple[Callable[..., torch.Tensor], str]] = {
    "quantize_fp": (lambda x, backend: ops.quantize_fp(x, "e4m3", backend=backend), "through"),
    "quantize_fp stochastic": (
        lambda x, backend: ops.quantize_fp(x, "e4m3", rounding="stochastic", seed=0, backend=backend),
        "through",
    ),
    "quantize_int ptq": (lambda x, backend: ops.quantize_int(x, 4, "ptq", seed=0, backend=backend), "group"),
    "quantize_int psq": (lambda x, backend: ops.quantize_int(x, 4, "psq", seed=0, backend=backend), "group"),
    "quantize_int bhq": (lambda x, backend: ops.quantize_int(x, 4, "bhq", seed=0, backend=backend), "group"),
    "stochastic_prune": (lambda x, backend: ops.stochastic_prune(x, 0.5, seed=0, backend=backend), "through"),
}

# Reductions: a 0-d result (thresholds) or the four log moments, from the finite values only.
THRESHOLDS = {
    "lognormal_threshold": ops.lognormal_threshold,
    "gaussian_threshold": ops.gaussian_threshold,
    "laplace_threshold": ops.laplace_threshold,
    "topk_threshold": ops.topk_threshold,
}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(as_int), b.view(as_int))


def _backends(dtype: torch.dtype) -> list[str]:
    return ["torch", "triton"] if dtype in KERNEL_DTYPES else ["torch"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_ops(name: str, case: str, dtype: torch.dtype, request: pytest.FixtureRequest) -> None:
    op, passes = ELEMENTWISE[name]
    x = _cases(dtype)[case]
    for backend in _backends(dtype):
        if backend == "triton":
            request.getfixturevalue("kernel_device")  # skips where no kernel can run
        out = op(x, backend)
        assert out.shape == x.shape and out.dtype == x.dtype and not out.requires_grad
        assert _same_bits(out, op(x.detach(), backend))  # requires_grad changes nothing but the flag
        values, result = x.detach().double(), out.double()
        finite = torch.isfinite(values)
        if finite.all():
            assert torch.isfinite(result).all(), (name, case, backend)
        elif passes == "through":
            assert torch.isfinite(result[finite]).all()
            assert torch.equal(torch.isnan(result), torch.isnan(values))
            infinite = torch.isinf(values)
            assert torch.equal(result[infinite], values[infinite])
        else:
            assert torch.isnan(result).all()
        if case == "all zero":
            assert torch.equal(result, values)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", THRESHOLDS)
def test_thresholds(name: str, case: str, dtype: torch.dtype) -> None:
    x = _cases(dtype)[case]
    alpha = THRESHOLDS[name](x, 0.85)
    assert alpha.dim() == 0 and not alpha.requires_grad
    assert math.isfinite(float(alpha)) and float(alpha) >= 0
    finite = x.detach()[torch.isfinite(x.detach())]
    if not finite.count_nonzero():  # nothing to prune: no threshold
        assert float(alpha) == 0
    if case in ("NaN", "+-Inf"):
        # 0.85 of the 4 elements is beyond the 3 finite ones: every finite value is pruned (alpha above them)
        assert float(alpha) >= float(finite.abs().max())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_log_moments(case: str, dtype: torch.dtype) -> None:
    x = _cases(dtype)[case]
    moments = ops.log_moments(x)
    assert moments.shape == (4,) and moments.dtype == torch.float64 and not moments.requires_grad
    values = x.detach().double().flatten()
    kept = values[torch.isfinite(values) & (values != 0)]
    assert int(moments[0]) == kept.numel() and int(moments[3]) == int((values == 0).sum())
    assert torch.allclose(moments[1], kept.abs().log().sum(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bad", [torch.arange(4), torch.tensor([True, False]), [0.5, 1.0], 0.5], ids=repr)
@pytest.mark.parametrize(
    "op",
    [
        lambda x: ops.quantize_fp(x, "e4m3"),
        lambda x: ops.quantize_int(x, 4),
        lambda x: ops.stochastic_prune(x, 0.5),
        ops.log_moments,
        *[lambda x, f=f: f(x, 0.85) for f in THRESHOLDS.values()],
    ],
)
def test_non_float_inputs_are_refused(op: Callable, bad: object) -> None:
    with pytest.raises(TypeError, match=r"floating-point tensor|torch\.Tensor"):
        op(bad)


X = torch.randn(4, 8)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: ops.quantize_fp(X, "e4m3", scale=0.0), ValueError),
        (lambda: ops.quantize_fp(X, "e4m3", scale=-1.0), ValueError),
        (lambda: ops.quantize_fp(X, "e4m3", scale=math.inf), ValueError),
        (lambda: ops.quantize_fp(X, "e4m3", scale=torch.ones(2)), ValueError),
        (lambda: ops.quantize_fp(X, "e4m3", rounding="down"), ValueError),
        (lambda: ops.quantize_fp(X, "e9m9"), ValueError),
        (lambda: ops.quantize_fp(X, 5), TypeError),
        (lambda: ops.quantize_int(X, 0), ValueError),
        (lambda: ops.quantize_int(X, 17), ValueError),
        (lambda: ops.quantize_int(X, True), ValueError),
        (lambda: ops.quantize_int(X, 4.0), ValueError),
        (lambda: ops.quantize_int(X, 4, "pts"), ValueError),
        (lambda: ops.stochastic_prune(X, -1.0), ValueError),
        (lambda: ops.stochastic_prune(X, math.nan), ValueError),
        (lambda: ops.stochastic_prune(X, math.inf), ValueError),
        (lambda: ops.stochastic_prune(X, torch.ones(2)), ValueError),
        (lambda: ops.stochastic_prune(X, 0.5, backend="gpu"), ValueError),
        *[(lambda f=f: f(X, 1.0), ValueError) for f in THRESHOLDS.values()],
        *[(lambda f=f: f(X, -0.1), ValueError) for f in THRESHOLDS.values()],
        *[(lambda f=f: f(X, math.nan), ValueError) for f in THRESHOLDS.values()],
    ],
)
def test_out_of_range_parameters_are_refused(call: Callable, error: type[Exception]) -> None:
    with pytest.raises(error):
        call()


def test_an_empty_tensor_with_a_mask_fits_nothing():
    """The torch path divided by the tensor's size for the masked share (ZeroDivisionError)."""
    from gradcomp.ops.stats import fit_statistics

    empty = torch.zeros(0)
    _, fit, alpha = fit_statistics(empty, mask=empty, sparsity=0.5, backend="torch")
    assert math.isnan(fit[2]) and fit[3] == 0 and alpha == 0
