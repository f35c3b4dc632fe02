"""The normal distribution's functions in float64 inside Triton kernels, from plain tl ops (the lognormal
threshold is solved on the device, and libdevice is not available to the interpreter that tests run under).

Scalar code (one branch runs, the solver's single program calls them on 0-d tensors): erf(x) for
0 <= x < SPLIT from the series exp(-x^2) * 2/sqrt(pi) * sum_n (2x^2)^n x / (2n+1)!! (positive
terms, no cancellation); ln erfc(x) for x >= SPLIT from the continued fraction
erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), evaluated from the bottom, in log
form so that it never underflows. With TERMS = 40 both are within about 1e-13 of scipy's (relative; in the
log form, absolute), far below what the threshold solve needs.
"""

import triton
import triton.language as tl

SPLIT = tl.constexpr(2.0)
TERMS = tl.constexpr(40)
_TWO_OVER_SQRT_PI = tl.constexpr(1.1283791670955126)
_LN_SQRT_PI = tl.constexpr(0.5723649429247001)
_LN_SQRT_2PI = tl.constexpr(0.9189385332046728)
_SQRT_HALF = tl.constexpr(0.7071067811865476)
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _erf_series(x):
    """erf(x) for 0 <= x <= SPLIT."""
    term = x
    total = x
    twice_square = 2.0 * x * x
    for n in tl.static_range(1, TERMS):
        term = term * twice_square / (2 * n + 1)
        total += term
    return _TWO_OVER_SQRT_PI * tl.exp(-x * x) * total


@triton.jit
def _log_erfc_tail(x):
    """ln erfc(x) for x >= SPLIT."""
    t = x
    for k in tl.static_range(0, TERMS):
        t = x + ((TERMS - k) * 0.5) / t
    return -x * x - tl.log(t) - _LN_SQRT_PI


@triton.jit
def ndtr_and_log(z):
    """(Phi(z), ln Phi(z)) of the standard normal for a scalar z, accurate in both tails (float64)."""
    x = -z * _SQRT_HALF  # Phi(z) = erfc(x) / 2
    if x >= SPLIT:  # lower tail: erfc(x)/2 in log form
        log_value = _log_erfc_tail(x) - _LN2
        value = tl.exp(log_value)
    elif x > -SPLIT:  # middle: (1 - erf(x))/2, erf odd
        erf_x = _erf_series(tl.abs(x))
        value = 0.5 * (1.0 - tl.where(x < 0, -erf_x, erf_x))
        log_value = tl.log(value)
    else:  # upper tail: 1 - q, q = erfc(-x)/2 <= 0.0024, ln(1 - q) by its series
        q = 0.5 * tl.exp(_log_erfc_tail(-x))
        value = 1.0 - q
        log_value = -q * (1.0 + q * (0.5 + q * (1.0 / 3.0 + q * (0.25 + q * (0.2 + q / 6.0)))))
    return value, log_value


@triton.jit
def ndtri_approximate(p):
    """Phi^-1(p) for p in (0, 1), to about 1e-6: Newton steps on ln Phi(z) = ln p (concave, so the steps
    close in from one side) from the tail's asymptotic start; p > 1/2 by symmetry. Enough to look up the
    threshold solve's starting table, whose cells are 0.22 wide."""
    lower = tl.minimum(p, 1.0 - p)
    log_p = tl.log(lower)
    square = tl.maximum(-2.0 * log_p - tl.log(tl.maximum(-2.0 * log_p, 1.0)) - 2.0 * _LN_SQRT_2PI, 0.0)
    z = -tl.sqrt(square)
    for _ in tl.static_range(0, 6):
        _, log_value = ndtr_and_log(z)
        density_ratio = tl.exp(-0.5 * z * z - _LN_SQRT_2PI - log_value)  # phi(z) / Phi(z)
        z = tl.minimum(z - (log_value - log_p) / density_ratio, 0.0)
    return tl.where(p > 0.5, -z, z)
