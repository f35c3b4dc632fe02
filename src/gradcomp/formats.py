"""Low-bit floating-point formats: one descriptor that theory, torch ops and Triton kernels all agree on.

`FPFormat(E, M, bias, subnormals, overflow)` is sign + E exponent bits + M mantissa bits.

* ``overflow="saturate"``: every code is a finite number; the all-ones exponent field is a normal binade and
  finite magnitudes beyond ``max_value`` clamp to it.
* ``overflow="inf"``: IEEE-like; the all-ones exponent field is reserved for Inf/NaN and a rounded result
  above ``max_value`` becomes Inf (round-to-nearest: from ``max_value`` + half an ulp on, as in IEEE 754).
* ``subnormals=True``: the all-zero exponent field holds 2^(1-bias) * m / 2^M. ``subnormals=False``: it holds
  only +-0 and magnitudes below the smallest normal round (by the active rounding mode) to 0 or to it.

Formats are limited to grids that float32 represents exactly (every value is a float32), because the ops
compute in float32. The descriptor itself needs no torch (only its grid enumerations do), so that configs
naming formats are validated without importing it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Overflow = Literal["saturate", "inf"]
_NAME = re.compile(r"^e(\d+)m(\d+)((?:-(?:inf|nosub|b-?\d+))*)$")


@dataclass(frozen=True)
class FPFormat:
    exp_bits: int
    man_bits: int
    bias: int | None = field(default=None)
    subnormals: bool = True
    overflow: Overflow = "saturate"

    def __post_init__(self) -> None:
        if not isinstance(self.exp_bits, int) or not isinstance(self.man_bits, int):
            raise TypeError("exp_bits and man_bits must be integers")
        if self.overflow not in ("saturate", "inf"):
            raise ValueError(f"overflow must be 'saturate' or 'inf', got {self.overflow!r}")
        min_exp_bits = 2 if self.overflow == "inf" else 1
        if not min_exp_bits <= self.exp_bits <= 8:
            raise ValueError(
                f"exp_bits must be in [{min_exp_bits}, 8] for overflow={self.overflow!r}, got {self.exp_bits}"
            )
        if not 0 <= self.man_bits <= 23:
            raise ValueError(f"man_bits must be in [0, 23], got {self.man_bits}")
        if self.bias is None:
            object.__setattr__(self, "bias", 2 ** (self.exp_bits - 1) - 1)
        if self.emax > 127 or self.emin - self.man_bits < -149 or self.emin > 104:
            raise ValueError(
                f"{self.name}: grid 2^[{self.emin - self.man_bits}, {self.emax}] does not fit the float32 "
                "arithmetic of the ops; choose a bias that keeps it within 2^[-149, 127] (smallest normal "
                "at most 2^104)"
            )

    # --- exponent range -------------------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal binade."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite binade."""
        top_field = 2**self.exp_bits - (2 if self.overflow == "inf" else 1)
        return top_field - self.bias

    @property
    def max_value(self) -> float:
        return 2.0**self.emax * (2.0 - 2.0**-self.man_bits)

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
        """Canonical name, parsed back by `parse_format`: e.g. ``e4m3``, ``e5m2-inf``, ``e4m1-nosub-b9``."""
        name = f"e{self.exp_bits}m{self.man_bits}"
        if self.overflow == "inf":
            name += "-inf"
        if not self.subnormals:
            name += "-nosub"
        if self.bias != 2 ** (self.exp_bits - 1) - 1:
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
        return torch.cat([-positive.flip(0), positive.new_zeros(1), positive])

    def positive_values(self) -> torch.Tensor:
        """The positive finite values, sorted, as float64 (the grid the MSE theory integrates over)."""
        import torch

        levels = torch.arange(2**self.man_bits, dtype=torch.float64) / 2**self.man_bits
        parts = []
        if self.subnormals:
            parts.append(levels[1:] * 2.0**self.emin)
        for exponent in range(self.emin, self.emax + 1):
            parts.append((1.0 + levels) * 2.0**exponent)
        return torch.cat(parts)


def parse_format(name: str | FPFormat) -> FPFormat:
    """Parse ``e{E}m{M}[-inf][-nosub][-b{bias}]`` (case-insensitive), e.g. ``e4m1`` or ``E5M2-inf``."""
    if isinstance(name, FPFormat):
        return name
    match = _NAME.match(name.strip().lower())
    if match is None:
        raise ValueError(f"cannot parse format {name!r}; expected e.g. 'e4m3', 'e5m2-inf', 'e4m1-nosub-b9'")
    exp_bits, man_bits, suffix = int(match[1]), int(match[2]), match[3]
    options = suffix.split("-")[1:]
    bias = next((int(opt[1:]) for opt in options if opt.startswith("b")), None)
    return FPFormat(
        exp_bits,
        man_bits,
        bias=bias,
        subnormals="nosub" not in options,
        overflow="inf" if "inf" in options else "saturate",
    )


# IEEE-like 8-bit presets (E5M2 has the same grid, rounding and Inf behaviour as torch.float8_e5m2).
E5M2 = FPFormat(5, 2, overflow="inf")
E4M3 = FPFormat(4, 3, overflow="inf")
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
