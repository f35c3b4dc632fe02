"""Low-bit floating-point formats: one descriptor that theory, torch ops and Triton kernels all agree on.

`FPFormat(E, M, bias, subnormals, overflow, reserved, signed, zero)` is a sign bit (unless signed=False), E
exponent bits and M mantissa bits: exponent field f and mantissa field m code 2^(f - bias) * (1 + m / 2^M).

* ``reserved``, the codes that are not numbers: ``"none"`` (every code is a number, the all-ones exponent
  field a normal binade: float4_e2m1fn, float6_e3m2fn, float6_e2m3fn), ``"ieee"`` (the all-ones exponent field
  holds Inf and NaN, as IEEE 754: float8_e5m2, float8_e4m3), ``"all_ones"`` (only the all-ones code is NaN:
  float8_e4m3fn, whose top binade keeps 256..448) or ``"neg_zero"`` (the negative-zero code is NaN, so there
  is no -0: float8_e4m3fnuz, float8_e5m2fnuz). By default it follows ``overflow``: "none" for "saturate",
  "ieee" for "inf", "all_ones" for "nan".
* ``overflow``, what a finite value beyond the range becomes: ``"saturate"`` +-max_value (the OCP
  "satfinite" conversions), ``"inf"`` +-Inf (needs reserved="ieee"), ``"nan"`` NaN (needs a NaN code; what
  the ml_dtypes / torch casts to float8_e4m3fn, the fnuz formats and float8_e8m0fnu do). Beyond the range
  means what IEEE 754 calls overflow: nearest rounding with an unbounded exponent range (ties to the even
  code) gives a magnitude above max_value. That is from max_value + half an ulp on, the tie itself included
  only when max_value's code is odd (IEEE formats with M >= 1: 61440 in float8_e5m2 is Inf; not in e4m3fn,
  where 464 rounds to 448, nor for M = 0 with an even top exponent field).
* ``subnormals=True``: the all-zero exponent field holds 2^(1-bias) * m / 2^M. ``subnormals=False``: it holds
  only +-0 and magnitudes below the smallest normal round (by the active rounding mode) to 0 or to it.
* ``zero=False``: the all-zero exponent field is a normal binade 2^-bias * (1 + m / 2^M), so there is no zero
  (float8_e8m0fnu, the MX scale format: 2^-127..2^127); magnitudes below its smallest value round up to it.
* ``signed=False``: no sign bit (float8_e8m0fnu, float8_e5m3fnu); negative numbers have no code.

Formats are limited to grids that float32 represents exactly (every value is a float32), because the ops
compute in float32. The descriptor itself needs no torch (only its grid enumerations do), so that configs
naming formats are validated without importing it. `parse_format` reads the names `FPFormat.name` writes
and the ml_dtypes / torch dtype names (`DTYPE_FORMATS`, also without the ``floatN_`` prefix where that is
unambiguous: ``e4m3fn``, ``e2m1fn``, ``e8m0fnu``, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Overflow = Literal["saturate", "inf", "nan"]
Reserved = Literal["none", "ieee", "all_ones", "neg_zero"]
OVERFLOWS: tuple[Overflow, ...] = ("saturate", "inf", "nan")
RESERVED: tuple[Reserved, ...] = ("none", "ieee", "all_ones", "neg_zero")
_DEFAULT_RESERVED: dict[str, Reserved] = {"saturate": "none", "inf": "ieee", "nan": "all_ones"}
# name options: the FPFormat field each sets, and its value
_OPTIONS: dict[str, tuple[str, object]] = {
    "inf": ("overflow", "inf"),
    "nan": ("overflow", "nan"),
    "ieee": ("reserved", "ieee"),
    "allones": ("reserved", "all_ones"),
    "negzero": ("reserved", "neg_zero"),
    "nosub": ("subnormals", False),
    "nozero": ("zero", False),
    "unsigned": ("signed", False),
}
_RESERVED_OPTION = {value: option for option, (key, value) in _OPTIONS.items() if key == "reserved"}
_NAME = re.compile(r"e(\d+)m(\d+)((?:-(?:b-\d+|[a-z0-9]+))*)")
_OPTION = re.compile(r"-(b-\d+|[a-z0-9]+)")


def _require_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")


def _require_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


@dataclass(frozen=True)
class FPFormat:
    exp_bits: int
    man_bits: int
    bias: int | None = field(default=None)
    subnormals: bool = True
    overflow: Overflow = "saturate"
    reserved: Reserved | None = None
    signed: bool = True
    zero: bool = True

    def __post_init__(self) -> None:
        _require_int("exp_bits", self.exp_bits)
        _require_int("man_bits", self.man_bits)
        if self.bias is not None:
            _require_int("bias", self.bias)
        for name in ("subnormals", "signed", "zero"):
            _require_bool(name, getattr(self, name))
        if not isinstance(self.overflow, str) or self.overflow not in OVERFLOWS:
            raise ValueError(f"overflow must be one of {OVERFLOWS}, got {self.overflow!r}")
        if self.reserved is None:
            object.__setattr__(self, "reserved", _DEFAULT_RESERVED[self.overflow])
        if not isinstance(self.reserved, str) or self.reserved not in RESERVED:
            raise ValueError(f"reserved must be one of {RESERVED}, got {self.reserved!r}")
        if self.overflow == "inf" and self.reserved != "ieee":
            raise ValueError(
                f"overflow='inf' needs Inf codes, i.e. reserved='ieee'; got reserved={self.reserved!r}"
            )
        if self.overflow == "nan" and self.reserved == "none":
            raise ValueError("overflow='nan' needs NaN codes: reserved='ieee', 'all_ones' or 'neg_zero'")
        if self.reserved == "neg_zero" and not self.signed:
            raise ValueError("reserved='neg_zero' needs a sign bit (signed=True)")
        if not self.zero and self.subnormals:
            raise ValueError(
                "zero=False makes the all-zero exponent field a normal binade: pass subnormals=False"
            )
        if not 0 <= self.man_bits <= 23:
            raise ValueError(f"man_bits must be in [0, 23], got {self.man_bits}")
        # an IEEE top field, or an all-ones code that is the whole top field (M = 0), takes a binade
        min_exp_bits = 2 if self._top_field_reserved else 1
        if not min_exp_bits <= self.exp_bits <= 8:
            raise ValueError(
                f"exp_bits must be in [{min_exp_bits}, 8] for reserved={self.reserved!r} and "
                f"man_bits={self.man_bits}, got {self.exp_bits}"
            )
        if self.bias is None:
            object.__setattr__(self, "bias", self.default_bias)
        if self.emax > 127 or self.emin - self.man_bits < -149 or self.emin > 104:
            raise ValueError(
                f"{self.name}: grid 2^[{self.emin - self.man_bits}, {self.emax}] does not fit the float32 "
                "arithmetic of the ops; choose a bias that keeps it within 2^[-149, 127] (smallest normal "
                "at most 2^104)"
            )

    # --- exponent range -------------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return int(self.signed) + self.exp_bits + self.man_bits

    @property
    def default_bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def _top_field_reserved(self) -> bool:
        return self.reserved == "ieee" or (self.reserved == "all_ones" and self.man_bits == 0)

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal binade."""
        return (1 if self.zero else 0) - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest binade with a finite value."""
        return 2**self.exp_bits - (2 if self._top_field_reserved else 1) - self.bias

    @property
    def max_value(self) -> float:
        # with reserved="all_ones" and M >= 1 the top binade loses its last code
        lost = 2 if self.reserved == "all_ones" and self.man_bits > 0 else 1
        return 2.0**self.emax * (2.0 - lost * 2.0**-self.man_bits)

    @property
    def min_normal(self) -> float:
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (the smallest normal when subnormals are off)."""
        return 2.0 ** (self.emin - self.man_bits) if self.subnormals else self.min_normal

    # --- naming ---------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """Canonical name, parsed back by `parse_format`: e.g. ``e4m3``, ``e5m2-inf``, ``e4m1-nosub-b9``,
        ``e3m2-b-1``; the dtype name for the dtype formats that need the newer options (``e4m3fn``)."""
        alias = _ALIASES.get(self)
        if alias is not None:
            return alias
        name = f"e{self.exp_bits}m{self.man_bits}"
        if self.overflow != "saturate":
            name += f"-{self.overflow}"
        if self.reserved != _DEFAULT_RESERVED[self.overflow]:
            name += f"-{_RESERVED_OPTION[self.reserved]}"
        if not self.subnormals:
            name += "-nosub"
        if not self.zero:
            name += "-nozero"
        if not self.signed:
            name += "-unsigned"
        if self.bias != self.default_bias:
            name += f"-b{self.bias}"
        return name

    def __str__(self) -> str:
        return self.name

    # --- the grid -------------------------------------------------------------------------------------------
    def values(self) -> torch.Tensor:
        """All distinct finite values (negative, zero, positive), sorted, float64; formats up to 16 bits."""
        if self.bits > 16:
            raise ValueError(f"values() enumerates formats of at most 16 bits; {self.name} has {self.bits}")
        import torch

        positive = self.positive_values()
        parts = [-positive.flip(0)] if self.signed else []
        if self.zero:
            parts.append(positive.new_zeros(1))
        return torch.cat([*parts, positive])

    def positive_values(self) -> torch.Tensor:
        """The positive finite values, sorted, as float64 (the grid the MSE theory integrates over)."""
        import torch

        levels = torch.arange(2**self.man_bits, dtype=torch.float64) / 2**self.man_bits
        parts = []
        if self.subnormals:
            parts.append(levels[1:] * 2.0**self.emin)
        for exponent in range(self.emin, self.emax + 1):
            parts.append((1.0 + levels) * 2.0**exponent)
        grid = torch.cat(parts)
        return grid[grid <= self.max_value]


def parse_format(name: str | FPFormat) -> FPFormat:
    """Parse ``e{E}m{M}[-inf|-nan][-ieee|-allones|-negzero][-nosub][-nozero][-unsigned][-b{bias}]`` (options
    in any order, each at most once; case-insensitive), e.g. ``e4m1`` or ``E5M2-inf``, or a dtype name of
    `DTYPE_FORMATS` (``float8_e4m3fn`` or ``e4m3fn``)."""
    if isinstance(name, FPFormat):
        return name
    if not isinstance(name, str):
        raise TypeError(f"a format is an FPFormat or a name such as 'e4m3', got {type(name).__name__}")
    key = name.strip().lower()
    if key in DTYPE_FORMATS:
        return DTYPE_FORMATS[key]
    if key in _SHORT_NAMES:
        return _SHORT_NAMES[key]
    match = _NAME.fullmatch(key)
    if match is None:
        raise ValueError(
            f"cannot parse format {name!r}; expected e.g. 'e4m3', 'e5m2-inf', 'e4m1-nosub-b9' or a dtype "
            f"name ({', '.join(DTYPE_FORMATS)})"
        )
    options: dict[str, object] = {}
    for option in _OPTION.findall(match[3]):
        if option[0] == "b" and option[1:].lstrip("-").isdigit():
            key_value = ("bias", int(option[1:]))
        elif option in _OPTIONS:
            key_value = _OPTIONS[option]
        else:
            raise ValueError(
                f"cannot parse format {name!r}: unknown option {option!r}; options are "
                f"{', '.join(_OPTIONS)} and b<bias>"
            )
        if key_value[0] in options:
            raise ValueError(f"cannot parse format {name!r}: {key_value[0]} is given twice")
        options[key_value[0]] = key_value[1]
    return FPFormat(int(match[1]), int(match[2]), **options)  # type: ignore[arg-type]


# IEEE-like 8-bit presets (E5M2 has the same grid, rounding and Inf behaviour as torch.float8_e5m2).
E5M2 = FPFormat(5, 2, overflow="inf")
E4M3 = FPFormat(4, 3, overflow="inf")
# The OCP 8-bit and MX formats, as the ml_dtypes / torch dtypes of these names (their casts give NaN on
# overflow; reserved and bias as the dtype, overflow="saturate" gives the "satfinite" conversions instead).
E4M3FN = FPFormat(4, 3, overflow="nan")
E4M3FNUZ = FPFormat(4, 3, bias=8, overflow="nan", reserved="neg_zero")
E5M2FNUZ = FPFormat(5, 2, bias=16, overflow="nan", reserved="neg_zero")
E3M2FN = FPFormat(3, 2)
E2M3FN = FPFormat(2, 3)
E2M1FN = FPFormat(2, 1)
E8M0FNU = FPFormat(8, 0, subnormals=False, overflow="nan", signed=False, zero=False)
DTYPE_FORMATS: dict[str, FPFormat] = {
    "float8_e5m2": E5M2,
    "float8_e4m3": E4M3,
    "float8_e3m4": FPFormat(3, 4, overflow="inf"),
    "float8_e4m3fn": E4M3FN,
    "float8_e4m3fnuz": E4M3FNUZ,
    "float8_e5m2fnuz": E5M2FNUZ,
    "float8_e4m3b11fnuz": FPFormat(4, 3, bias=11, overflow="nan", reserved="neg_zero"),
    "float8_e5m3fnu": FPFormat(5, 3, overflow="nan", signed=False),
    "float8_e8m0fnu": E8M0FNU,
    "float6_e3m2fn": E3M2FN,
    "float6_e2m3fn": E2M3FN,
    "float4_e2m1fn": E2M1FN,
}
# "e4m3fn" for "float8_e4m3fn"; not "e5m2", which names the saturating FPFormat(5, 2)
_SHORT_NAMES = {
    dtype.split("_", 1)[1]: fmt
    for dtype, fmt in DTYPE_FORMATS.items()
    if _NAME.fullmatch(dtype.split("_", 1)[1]) is None
}
# short names that read like a dtype's but parse to another format (``e5m2`` is the saturating FPFormat(5, 2),
# whose all-ones exponent field is a normal binade, not float8_e5m2): the dtype's full name for each
DTYPE_LOOKALIKES = {
    dtype.split("_", 1)[1]: dtype
    for dtype, fmt in DTYPE_FORMATS.items()
    if _NAME.fullmatch(dtype.split("_", 1)[1]) is not None and parse_format(dtype.split("_", 1)[1]) != fmt
}
# the canonical name of a dtype format that the e{E}m{M} options describe only with the newer ones
_ALIASES = {
    fmt: short
    for short, fmt in _SHORT_NAMES.items()
    if fmt.overflow == "nan"
    or fmt.reserved != _DEFAULT_RESERVED[fmt.overflow]
    or not (fmt.signed and fmt.zero)
}
# The formats of the paper's FP training experiments, all saturating with subnormals.
PAPER_FORMATS: dict[str, FPFormat] = {
    "fp8_e5m2": FPFormat(5, 2),
    "fp8_e4m3": FPFormat(4, 3),
    "fp7_e4m2": FPFormat(4, 2),
    "fp6_e4m1": FPFormat(4, 1),
    "fp6_e3m2": FPFormat(3, 2),
    "fp5_e3m1": FPFormat(3, 1),
    "fp4_e3m0": FPFormat(3, 0),
}
