"""What every public op does with awkward and bad inputs: one matrix (op x input case x dtype), each cell a
documented result or a clear error (docs/ops.md's table says the same), and one of refused arguments (op x
bad argument: the error's type and the words that name the argument), which every op of gradcomp.ops must
join. Elementwise ops run on both backends (the Triton kernel under the interpreter, float32 only, to stay
fast)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from gradcomp import ops
from gradcomp.formats.block import BlockFormat
from gradcomp.lognormal import Calibration
from gradcomp.ops.block import block_errors, quantize_block_pair

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


# Every public op that takes a tensor, its other arguments fixed: what a non-float input raises. A non-tensor
# is a TypeError everywhere; a non-float tensor too, but for the moments, whose dtype and shape are one check.
TENSOR_OPS: dict[str, tuple[Callable[[object], object], type[Exception]]] = {
    "quantize_fp": (lambda x: ops.quantize_fp(x, "e4m3"), TypeError),
    "quantize_int": (lambda x: ops.quantize_int(x, 4), TypeError),
    "quantize_luq": (lambda x: ops.quantize_luq(x), TypeError),
    "quantize_block": (lambda x: ops.quantize_block(x, "mxfp4"), TypeError),
    "quantize_block_pair": (lambda x: quantize_block_pair((X, x), ("mxfp4", "mxfp4")), TypeError),
    "block_errors": (lambda x: block_errors(x, BlockFormat("e2m1fn")), TypeError),
    "hadamard": (lambda x: ops.hadamard(x, 2), TypeError),
    "hadamard_inverse": (lambda x: ops.hadamard_inverse(x, 2), TypeError),
    "nm_prune": (lambda x: ops.nm_prune(x), TypeError),
    "stochastic_prune": (lambda x: ops.stochastic_prune(x, 0.5), TypeError),
    "log_moments": (ops.log_moments, TypeError),
    "fit_statistics": (ops.fit_statistics, TypeError),
    **{name: (lambda x, f=f: f(x, 0.85), TypeError) for name, f in THRESHOLDS.items()},
    "lognormal_threshold_from_moments": (
        lambda m: ops.lognormal_threshold_from_moments(m, 4, 0.5),
        ValueError,
    ),
}
NON_FLOAT = {"int64 tensor": torch.arange(4), "bool tensor": torch.tensor([True, False]), "list": [0.5, 1.0],
             "float": 0.5}  # fmt: skip
X = torch.randn(4, 8)


@pytest.mark.parametrize("bad", NON_FLOAT)
@pytest.mark.parametrize("name", TENSOR_OPS)
def test_non_float_inputs_are_refused(name: str, bad: str) -> None:
    op, tensor_error = TENSOR_OPS[name]
    x = NON_FLOAT[bad]
    error = tensor_error if isinstance(x, torch.Tensor) else TypeError
    with pytest.raises(error, match=r"floating-point tensor|expected a torch\.Tensor|must be float64"):
        op(x)


def _refusals() -> list:
    """The matrix of refused arguments: (call, error, a few words of its message), each id naming the op
    first."""
    moments = torch.zeros(3, 4, dtype=torch.float64)
    x32 = torch.ones(4, 32)
    counter = torch.zeros((), dtype=torch.int64)
    calibration = Calibration(
        torch.zeros((), dtype=torch.float64), counter, counter.clone(), 0, torch.ones(())
    )
    float32_correction = Calibration(torch.zeros(()), counter, counter.clone(), 0, torch.ones(()))
    transforms = (
        (BlockFormat("e2m1fn", hadamard=32, signs=False), "an unsigned transform"),
        (BlockFormat("e2m1fn"), "no transform"),
    )
    return [
        # quantize_fp
        pytest.param(lambda: ops.quantize_fp(X, "e4m3", scale=0.0), ValueError, "scale must be positive",
                     id="quantize_fp zero scale"),
        pytest.param(lambda: ops.quantize_fp(X, "e4m3", scale=-1.0), ValueError, "scale must be positive",
                     id="quantize_fp negative scale"),
        pytest.param(lambda: ops.quantize_fp(X, "e4m3", scale=math.inf), ValueError, "scale must be positive",
                     id="quantize_fp infinite scale"),
        pytest.param(lambda: ops.quantize_fp(X, "e4m3", scale=math.nan), ValueError, "scale must be positive",
                     id="quantize_fp NaN scale"),
        *[
            pytest.param(lambda scale=scale, dtype=dtype: ops.quantize_fp(torch.ones(3, dtype=dtype), "e4m3",
                                                                          scale=scale),
                         ValueError, r"1/scale finite in torch\.float32",
                         id=f"quantize_fp scale {label} beyond float32 for {dtype}")
            for scale, label in ((1e39, "1e39"), (1e-39, "1e-39"), (2.0**-128, "2^-128"), (1e-50, "1e-50"))
            for dtype in (torch.float32, torch.float16)
        ],
        pytest.param(lambda: ops.quantize_fp(X, "e4m3", scale=torch.ones(2)), ValueError,
                     "one-element tensor", id="quantize_fp scale of two elements"),
        *[
            pytest.param(lambda scale=scale: ops.quantize_fp(X, "e4m3", scale=scale), TypeError,
                         "scale must be a float", id=f"quantize_fp scale {scale!r}")
            for scale in (True, "2", None)
        ],
        pytest.param(lambda: ops.quantize_fp(X, "e4m3", rounding="down"), ValueError,
                     "rounding must be one of", id="quantize_fp unknown rounding"),
        pytest.param(lambda: ops.quantize_fp(X, "e9m9"), ValueError, r"exp_bits must be in \[1, 8\]",
                     id="quantize_fp format of 9 exponent bits"),
        pytest.param(lambda: ops.quantize_fp(X, 5), TypeError, "FPFormat or a name",
                     id="quantize_fp format not a name"),
        pytest.param(lambda: ops.quantize_fp(X, "e4m3", rounding="stochastic", seed="run"), TypeError,
                     "seed must be an integer", id="quantize_fp seed not an integer"),
        pytest.param(lambda: ops.quantize_fp(X, "e4m3", backend="gpu"), ValueError, "backend must be",
                     id="quantize_fp unknown backend"),
        pytest.param(lambda: ops.quantize_fp(X, "e4m3", count_zeros_into=torch.zeros(1)), TypeError,
                     "count_zeros_into must be an int64", id="quantize_fp float zero counter"),
        # quantize_int
        *[
            pytest.param(lambda bits=bits: ops.quantize_int(X, bits), ValueError,
                         r"bits must be an integer in \[1, 16\]", id=f"quantize_int bits {bits!r}")
            for bits in (0, 17, True, 4.0)
        ],
        pytest.param(lambda: ops.quantize_int(X, 4, "pts"), ValueError, "scheme must be one of",
                     id="quantize_int unknown scheme"),
        pytest.param(lambda: ops.quantize_int(X, 4, seed=1.5), TypeError, "seed must be an integer",
                     id="quantize_int seed not an integer"),
        pytest.param(lambda: ops.quantize_int(X, 4, backend="gpu"), ValueError, "backend must be",
                     id="quantize_int unknown backend"),
        # quantize_luq
        *[
            pytest.param(lambda bits=bits: ops.quantize_luq(X, bits), ValueError,
                         r"bits must be an int in \[2, 8\]", id=f"quantize_luq bits {bits!r}")
            for bits in (1, 9, 4.0)
        ],
        pytest.param(lambda: ops.quantize_luq(X, samples=0), ValueError, "samples must be a positive int",
                     id="quantize_luq no samples"),
        pytest.param(lambda: ops.quantize_luq(X, seed="run"), TypeError, "seed must be an integer",
                     id="quantize_luq seed not an integer"),
        pytest.param(lambda: ops.quantize_luq(X, backend="gpu"), ValueError, "backend must be",
                     id="quantize_luq unknown backend"),
        # nm_prune
        pytest.param(lambda: ops.nm_prune(X, 4, 4), ValueError, "1 <= n < m", id="nm_prune n equal to m"),
        pytest.param(lambda: ops.nm_prune(X, 2.0, 4), ValueError, "n must be an int", id="nm_prune float n"),
        pytest.param(lambda: ops.nm_prune(X, 2, 4, axis=2), ValueError, "axis 2 is not an axis",
                     id="nm_prune axis beyond the tensor"),
        pytest.param(lambda: ops.nm_prune(X, axis=1.0, seed=0), TypeError, "axis must be an int",
                     id="nm_prune float axis"),
        pytest.param(lambda: ops.nm_prune(X, seed="run"), TypeError, "seed must be an integer",
                     id="nm_prune seed not an integer"),
        pytest.param(lambda: ops.nm_prune(X, backend="gpu"), ValueError, "backend must be",
                     id="nm_prune unknown backend"),
        # stochastic_prune
        *[
            pytest.param(lambda alpha=alpha: ops.stochastic_prune(X, alpha), ValueError,
                         "alpha must be finite and >= 0", id=f"stochastic_prune alpha {alpha}")
            for alpha in (-1.0, math.nan, math.inf)
        ],
        pytest.param(lambda: ops.stochastic_prune(X, torch.ones(2)), ValueError, "one-element tensor",
                     id="stochastic_prune alpha of two elements"),
        *[
            pytest.param(lambda alpha=alpha: ops.stochastic_prune(X, alpha), TypeError,
                         "alpha must be a real number", id=f"stochastic_prune alpha {alpha!r}")
            for alpha in ("0.5", True, None)
        ],
        *[
            pytest.param(lambda alpha=alpha, dtype=dtype: ops.stochastic_prune(torch.ones(4, dtype=dtype),
                                                                               alpha),
                         ValueError, match, id=f"stochastic_prune alpha {label} for {dtype}")
            for alpha, label, dtype, match in ((1e5, "1e5", torch.float16, r"largest torch\.float16"),
                                               (1e39, "1e39", torch.float32, r"largest torch\.float32"),
                                               (3.4e38, "3.4e38", torch.bfloat16, r"largest torch\.bfloat16"),
                                               (10**400, "10**400", torch.float64, "finite"),
                                               (1e-33, "1e-33", torch.float32, r"below 2\^24"),
                                               (1e-33, "1e-33", torch.bfloat16, r"below 2\^24"),
                                               (1e-302, "1e-302", torch.float64, r"below 2\^24"))
        ],
        pytest.param(lambda: ops.stochastic_prune(X, 0.5, backend="gpu"), ValueError, "backend must be",
                     id="stochastic_prune unknown backend"),
        # quantize_block, quantize_block_pair and block_errors
        pytest.param(lambda: ops.quantize_block(X, "e4m3fn"), ValueError, "preset's name",
                     id="quantize_block unknown preset"),  # a string names a preset, not an element
        pytest.param(lambda: ops.quantize_block(X.double(), "mxfp4"), TypeError, "computes in float32",
                     id="quantize_block float64 input"),
        pytest.param(lambda: ops.quantize_block(X, "mxfp4", axis=2), ValueError, "axis 2 is not an axis",
                     id="quantize_block axis beyond the tensor"),
        pytest.param(lambda: ops.quantize_block(X, "mxfp4", axis=1.0), TypeError, "axis must be an int",
                     id="quantize_block float axis"),
        pytest.param(lambda: ops.quantize_block(X, BlockFormat("e2m1fn", hadamard=32), sign_seed="run"),
                     TypeError, "seed must be an integer", id="quantize_block sign_seed not an integer"),
        *[
            pytest.param(lambda fmt=fmt: ops.quantize_block(X, fmt, sign_seed=9), ValueError,
                         "the format has none", id=f"quantize_block sign_seed with {label}")
            for fmt, label in transforms
        ],
        pytest.param(lambda: ops.quantize_block(X, "mxfp4", backend="gpu"), ValueError, "backend must be",
                     id="quantize_block unknown backend"),
        pytest.param(lambda: quantize_block_pair((X, X), ("mxfp4", "mxfp4"), axes=(-1,)), ValueError,
                     "shorter", id="quantize_block_pair axes not a pair"),
        pytest.param(lambda: block_errors(torch.zeros(0, 32), BlockFormat("e2m1fn", 16, "e4m3fn", outer=128)),
                     ValueError, "x is empty", id="block_errors empty tensor"),
        # hadamard and hadamard_inverse
        pytest.param(lambda: ops.hadamard(torch.ones(3, 20), 16), ValueError, "not a multiple of 16",
                     id="hadamard length not a multiple of the block"),
        pytest.param(lambda: ops.hadamard(torch.tensor(1.0)), ValueError, "not a multiple of 32",
                     id="hadamard 0-d tensor"),
        pytest.param(lambda: ops.hadamard(x32, 24), ValueError, "must be a power of two",
                     id="hadamard block size not a power of two"),
        pytest.param(lambda: ops.hadamard(x32, axis=1.0), TypeError, "axis must be an int",
                     id="hadamard float axis"),
        pytest.param(lambda: ops.hadamard(x32, backend="gpu"), ValueError, "backend must be",
                     id="hadamard unknown backend"),
        pytest.param(lambda: ops.hadamard(x32, seed="a"), TypeError, "seed must be an integer",
                     id="hadamard string seed"),
        pytest.param(lambda: block_errors(x32.double(), BlockFormat("e2m1fn")), TypeError,
                     "computes in float32", id="block_errors float64"),
        pytest.param(lambda: ops.hadamard_inverse(x32, 1), ValueError, "must be a power of two",
                     id="hadamard_inverse block size 1"),
        pytest.param(lambda: ops.hadamard_inverse(x32, axis=2), ValueError, "axis 2 is not an axis",
                     id="hadamard_inverse axis beyond the tensor"),
        # log_moments and fit_statistics
        pytest.param(lambda: ops.log_moments(X, mask=torch.ones(3)), ValueError,
                     "mask must be a tensor of x's", id="log_moments mask of another shape"),
        pytest.param(lambda: ops.log_moments(X, backend="gpu"), ValueError, "backend must be",
                     id="log_moments unknown backend"),
        pytest.param(lambda: ops.fit_statistics(X, sparsity=1.0), ValueError, r"sparsity must be in \[0, 1\)",
                     id="fit_statistics sparsity 1"),
        pytest.param(lambda: ops.fit_statistics(X, rule="median"), ValueError, "rule must be 'mixture'",
                     id="fit_statistics unknown rule"),
        pytest.param(lambda: ops.fit_statistics(X, calibration=calibration), ValueError, "needs a sparsity",
                     id="fit_statistics calibration without a sparsity"),
        pytest.param(lambda: ops.fit_statistics(X, sparsity=0.5, calibration=float32_correction), ValueError,
                     r"calibration\.correction", id="fit_statistics float32 calibration correction"),
        pytest.param(lambda: ops.fit_statistics(X, scale_points=torch.ones(2, 3), max_value=-1.0), ValueError,
                     "max_value .* must be positive", id="fit_statistics negative max_value"),
        # the thresholds
        *[
            pytest.param(lambda f=f, sparsity=sparsity: f(X, sparsity), ValueError,
                         r"sparsity must be in \[0, 1\)", id=f"{name} sparsity {sparsity}")
            for name, f in THRESHOLDS.items()
            for sparsity in (1.0, 1.5, -0.1, math.nan)
        ],
        pytest.param(lambda: ops.lognormal_threshold(X, 0.5, rule="median"), ValueError,
                     "rule must be 'mixture'", id="lognormal_threshold unknown rule"),
        pytest.param(lambda: ops.lognormal_threshold(X, 0.5, mask=torch.ones(2)), ValueError,
                     "mask must be a tensor of x's", id="lognormal_threshold mask of another shape"),
        pytest.param(lambda: ops.lognormal_threshold_from_moments(moments.float(), 4, 0.5), ValueError,
                     r"moments must be float64 \[\.\.\., 4\]",
                     id="lognormal_threshold_from_moments float32 moments"),
        pytest.param(lambda: ops.lognormal_threshold_from_moments(moments[:, :3], 4, 0.5), ValueError,
                     r"moments must be float64 \[\.\.\., 4\]",
                     id="lognormal_threshold_from_moments three moments"),
        pytest.param(lambda: ops.lognormal_threshold_from_moments(moments, 4, 1.0), ValueError,
                     r"sparsity must be in \[0, 1\)", id="lognormal_threshold_from_moments sparsity 1"),
        pytest.param(lambda: ops.lognormal_threshold_from_moments(moments, 4, 0.5, backend="gpu"), ValueError,
                     "backend must be", id="lognormal_threshold_from_moments unknown backend"),
    ]  # fmt: skip


REFUSALS = _refusals()


@pytest.mark.parametrize(("call", "error", "match"), REFUSALS)
def test_bad_arguments_are_refused_clearly(
    call: Callable[[], object], error: type[Exception], match: str
) -> None:
    """The error's type and a few words of its message: it names the argument and what it must be."""
    with pytest.raises(error, match=match):
        call()


def test_every_public_op_is_in_both_matrices() -> None:
    """A new op in gradcomp.ops cannot skip the matrices: each one (every op takes a tensor) has its
    non-float input and its bad arguments refused above."""
    public = set(ops.__all__)
    assert public <= set(TENSOR_OPS) and public <= {case.id.split()[0] for case in REFUSALS}


def test_an_empty_tensor_with_a_mask_fits_nothing():
    """The torch path divided by the tensor's size for the masked share (ZeroDivisionError)."""
    from gradcomp.ops.stats import fit_statistics

    empty = torch.zeros(0)
    _, fit, alpha = fit_statistics(empty, mask=empty, sparsity=0.5, backend="torch")
    assert math.isnan(fit[2]) and fit[3] == 0 and alpha == 0
