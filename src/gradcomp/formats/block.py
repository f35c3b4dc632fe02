"""Block-scaled formats (OCP MX, NVFP4): what the op, the policy and the theory agree on, without torch.

A `BlockFormat` is an element format (a signed `FPFormat` with zero, saturating: a block's values beyond its
range become +-max_value, as the MX conversions do), a block size (consecutive elements sharing a scale) and
a scale format:

* ``"e8m0fnu"`` (OCP MX): a power of two 2^k, k in [-127, 127]. ``rule="floor"``: k = floor(log2 amax) -
  emax(element), the OCP MX 1.0 definition, where a block's largest values may saturate (amax / 2^k reaches
  up to 2^(emax + 1) > max_value); ``rule="ceil"``: the least k with amax / 2^k <= max_value, so nothing
  saturates (the rounding up of amax / max_value that NVIDIA's MXFP8 recipe and torchao's RCEIL mode do,
  here without rounding that quotient first); ``rule="three_quarters"`` (Tseng et al., arXiv 2502.20586):
  floor's k, the block times 3/4 before rounding and 4/3 after, so that its values reach at most
  1.5 * 2^emax <= max_value and nothing saturates (every OCP FP element; emax >= 2 keeps 2^(k+2) a
  float32), computed as (x 2^-(k+2)) 3 and (q / 3) 2^(k+2): their 3x / 2^(k+2) and q 2^(k+2) / 3 but
  where these overflow or pass through a subnormal. An all-zero block gets k = -127.
* ``"e4m3fn"`` (NVFP4), ``"float8_e3m4"`` and ``"e5m3fnu"`` (UE5M3), the two-level scales, each the ml_dtypes
  dtype of its name (largest values S_max = 448, 15.5 and 114688; smallest normals 2^-6, 2^-2 and 2^-14): a
  float32 per-tensor scale s = amax(tensor) / (S_max * max_value) maps the largest block scale to S_max; each
  block's scale is amax(block) / max_value / s, clamped to [smallest normal, S_max] and rounded to the scale
  format; elements are divided by s times it (torchao's NVFP4 reference, with E4M3's constants those of the
  scale format). ``rule="floor"``: rounded to nearest (ties to even), where a block scale rounded down
  saturates the block's largest values; ``rule="ceil"``: rounded up, so nothing saturates (but for float32's
  rounding of the two divisions, at most 2^-22 of the block's largest value). ``rule="reciprocal"``: FP4 All
  the Way's NVFP4 variant (arXiv 2505.19115, which rounds the reciprocal 6 / amax(block) to E4M3 where others
  round amax(block) / 6), for every two-level scale: torchao's per-tensor scale s and block ratio d =
  amax(block) / max_value / s as under ``floor``, then its reciprocal r = C / d with C = S_max * smallest
  normal (7 for E4M3 and UE5M3, 3.875 for E3M4), clamped to [smallest normal, S_max] and rounded to nearest,
  and the block's scale s * (C / r) (a float32 division, then the product). The constant C is gradcomp's
  choice, as the variant's code was not at hand: a gradient's 6 / amax(block) lies far above E4M3's range, so
  a per-tensor factor is needed, and C maps d's range [smallest normal, S_max] onto itself (the largest block
  gets r = smallest normal), so that the two rules clamp the same blocks and differ only in which number the
  scale format rounds. A reciprocal rounded up saturates the block's largest values, as ``floor``'s scale
  rounded down does; stochastic rounding is allowed, as FP4 All the Way trains with it, and is biased
  there. ``rule="te"`` (E4M3 only): Transformer Engine's NVFP4 cast (`te_constants`; TE's
  transformer_engine/common/cast/nvfp4/): the encode scale s_enc = 448 * max_value / amax(tensor) clamped to
  float32's largest value FLT_MAX (1 for a tensor of zeros; core_nvfp4.cuh,
  `compute_global_encode_scaling_factor_FP4`), each block's decode scale amax(block) * (s_enc * (1 /
  max_value)) rounded to nearest E4M3 and saturating at 448 but not clamped below, so a block whose scale
  underflows E4M3 decodes to zero (`compute_decoding_scaling_factor`); elements multiplied by the factor min(1
  / (decode * (1 / s_enc)), FLT_MAX) (quantize_transpose_nvfp4.cuh), the rounded values by decode *
  amax(tensor) * (1 / (448 * max_value)) (TE's dequantization, dequantize_nvfp4.cuh `dequantize_fp4_kernel`,
  as its GEMMs' alpha amax_A amax_B / 2688^2; where amax(tensor) exceeds FLT_MAX / 448 that product overflows
  in TE, and is taken as decode * (amax(tensor) * (1 / (448 * max_value))) instead). One deviation, where TE's
  own result is silently wrong: its decode does not see its two clamps, so where s_enc was clamped
  (amax(tensor) < 2688 / FLT_MAX = 7.9e-36) or a block's factor was (decode * (1 / s_enc) at most 2^-128:
  every block below amax(tensor) = 6 * 2^-128 = 1.8e-38, blocks far below the largest from about 4e-33) TE's
  values shrink, by amax(tensor) FLT_MAX / 2688 or decode (1 / s_enc) FLT_MAX (E[out] = 0.12 x at 1e-36, under
  0.001 x at 1e-38). gradcomp decodes such a block (of non-zero scale) by the reciprocal of the factor its
  elements were multiplied by, decode * (1 / s_enc), or 2^-128 where the factor was clamped (both exact): the
  FP4 values and E4M3 scales stay TE's bit for bit, only their decode differs. Where the factor was clamped
  the elements are x * FLT_MAX on E2M1's grid, a step of 2^-129 in x, so that nearest rounding flushes values
  below 2^-130 (7e-40); below 6 * 2^-138 = 1.7e-41 even the largest block's scale underflows and the tensor
  decodes to zero. The scale is rounded to nearest, so with stochastic rounding a block's largest values may
  saturate and E[out] < x there, as in TE's recipe; elsewhere E[out] = x at every magnitude down to 1.7e-41.
  ``rule="four_over_six"`` (E2M1 elements, E4M3 scale; Four Over Six, arXiv 2512.02010, as its authors' code
  computes it: mit-han-lab/fouroversix, quantize/pytorch/reference.py and the Triton kernel,
  `nvfp4_fouroversix_block_scaled_quantization`): the encode scale e = 1536 / amax(tensor) (6 * 256, so that a
  block scale times 1.5 still fits E4M3) clamped to FLT_MAX as TE's own Four Over Six clamps it
  (quantize_4over6_nvfp4.cuh, `compute_scale_pair`; the authors' code does not: below 1536 / FLT_MAX = 4.5e-36
  their reference returns NaN and their Triton kernel multiplies the elements by 1 / (0 * s)), each block's
  two candidate scales s6 = E4M3((amax(block) / 6) * e) and s4 = E4M3(that product * 1.5) (nearest, subnormals
  kept, no clamp), elements times the factor min(1 / ((1 / e) * s), FLT_MAX) (0 where s = 0; clamped as the
  authors' CUDA kernel, csrc/include/utils.h `Fp4ArrayQuant::convert`, and TE clamp it, where an unclamped
  factor made 0 * inf = NaN below about 2e-33) rounded and saturated to 6, dequantized as ((q * s) *
  amax(tensor)) / 1536 (where that overflows float32, q * s * (amax(tensor) / 1536)), or where e or the factor
  was clamped and s > 0 as q times the factor's reciprocal, (1 / e) * s or 2^-128 (the deviation of ``te``,
  for the same reason); the block takes s4 where its sum of squared errors is strictly smaller (summed in
  pairs: neighbours first, then neighbouring pairs, the same on both backends). With stochastic rounding both
  candidates see the same random bits, as in the authors' kernels; the choice then depends on the draw, so the
  result is not unbiased. The squared errors are float32 as in the authors' code: where amax(tensor) is below
  about 1e-20 they underflow to zero, every block takes s6 (a tie), and stochastic rounding is unbiased as
  under ``te`` (down to 1.7e-41, where s6 underflows for every block).

``outer`` (two-level scales, torchao's rule): the float32 scale is taken per outer block of `outer`
consecutive elements along the blocked axis (a multiple of the block size; TetraJet-v2's 128 over NVFP4's
16) instead of per tensor, from that block's largest magnitude; the axis is padded with zeros to a multiple
of it.

Stochastic rounding is unbiased only where nothing saturates: under ``floor`` a block's largest values are
clipped to max_value and E[out] < x there (about 1.3 % of the gradient's magnitude for MXFP4). So
`default_rule` takes ``ceil`` for stochastic rounding, and `check_rule` refuses ``floor`` with it.

A format also says how values are rounded to it: ``rounding`` (nearest, ties to even, or stochastic) and
``hadamard`` (0, or the size of a random Hadamard transform applied to each group of that many elements of a
block before the scales are taken, and undone after; ``signs=False``: without its random signs, the
Walsh-Hadamard transform). `gradcomp.ops.quantize_block` takes the whole format as one value: checked once,
hashable, compared by value.

Bits per element: the element's plus the scale's 8 bits shared by the block, plus an outer block's float32
shared by its elements (NVFP4's one float32 per tensor is neglected).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from gradcomp.choices import BLOCK_SCALES, MAX_BLOCK, MAX_OUTER, ROUNDINGS, SCALE_RULES, choose, is_integer
from gradcomp.formats import DTYPE_FORMATS, DTYPE_LOOKALIKES, FPFormat, parse_format

SCALE_BITS = 8  # every scale format
NVFP4_SCALE_MAX = 448.0  # E4M3's largest value: TE's per-tensor scale puts the largest block scale there
FLOAT32_MAX = float(np.finfo(np.float32).max)  # TE's scales saturate here (1 / 0 for a zero block scale)
FLOAT32_MAX_RECIPROCAL = 2.0**-128  # 1 / FLOAT32_MAX rounded to float32 (a subnormal)
SCALE_LABELS = {"e8m0fnu": "E8M0", "e4m3fn": "E4M3", "float8_e3m4": "E3M4", "e5m3fnu": "UE5M3"}


def _power_of_two(value: object, low: int, high: int = MAX_BLOCK) -> bool:
    return is_integer(value) and low <= value <= high and value & (value - 1) == 0


@dataclass(frozen=True)
class BlockFormat:
    element: FPFormat | str
    block_size: int = 32
    scale: str = "e8m0fnu"
    rule: str | None = None  # None: the rounding's (`default_rule`)
    outer: int = 0  # the float32 scale's span along the axis (two-level scales; 0: the whole tensor)
    rounding: str = "nearest"
    hadamard: int = 0  # the random Hadamard transform's size (0: none)
    signs: bool = True  # the transform's random signs (False: all +1, the Walsh-Hadamard transform)
    _element: FPFormat = field(init=False, repr=False, compare=False)
    # constants of the element's largest value, computed once (compiled chunk functions read, not compute)
    _max_mantissa: int = field(init=False, repr=False, compare=False)
    _te: tuple[float, float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        name = self.element.strip().lower() if isinstance(self.element, str) else None
        lookalike = DTYPE_LOOKALIKES.get(name) if name else None
        if lookalike is not None:  # the recipes' elements are the dtypes: refuse the other reading
            other = parse_format(self.element)
            raise ValueError(
                f"element {self.element!r} reads like {lookalike} (largest value "
                f"{DTYPE_FORMATS[lookalike].max_value:g}) but names the saturating FPFormat"
                f"({other.exp_bits}, {other.man_bits}) (largest value {other.max_value:g}); name the dtype "
                f"({lookalike!r}; OCP MX's 8-bit elements are 'e4m3fn' and 'float8_e5m2') or pass that "
                "FPFormat"
            )
        fmt = parse_format(self.element)
        if not (fmt.signed and fmt.zero):
            raise ValueError(f"block elements need a sign and a zero; {fmt.name} lacks one")
        # by name, but for the formats whose names are refused above (kept as given)
        object.__setattr__(self, "element", fmt if fmt.name in DTYPE_LOOKALIKES else fmt.name)
        object.__setattr__(self, "_element", dataclasses.replace(fmt, overflow="saturate"))
        max_bits = struct.unpack("<I", struct.pack("<f", fmt.max_value))[0]
        object.__setattr__(self, "_max_mantissa", max_bits & 0x7FFFFF)
        object.__setattr__(self, "_te", te_constants(fmt.max_value))
        if not _power_of_two(self.block_size, 2):
            raise ValueError(
                f"block_size must be a power of two in [2, {MAX_BLOCK}], got {self.block_size!r}"
            )
        if self.scale not in BLOCK_SCALES:
            raise ValueError(f"scale must be one of {BLOCK_SCALES}, got {self.scale!r}")
        choose("rounding", self.rounding, ROUNDINGS)
        object.__setattr__(self, "rule", check_rule(self.rule, self.rounding))
        if self.rule not in SCALE_RULES:
            raise ValueError(f"rule must be one of {SCALE_RULES}, got {self.rule!r}")
        if self.rule == "reciprocal" and not self.per_tensor:
            raise ValueError(
                "rule='reciprocal' rounds a two-level format's block scale reciprocal: it takes scale "
                "'e4m3fn', 'float8_e3m4' or 'e5m3fnu'"
            )
        if self.rule == "te" and self.scale != "e4m3fn":  # TE's constants are E4M3's
            raise ValueError("rule='te' is Transformer Engine's NVFP4 cast: it takes scale='e4m3fn'")
        if self.rule == "four_over_six" and (self.scale != "e4m3fn" or fmt.max_value != 6.0):
            raise ValueError(
                "rule='four_over_six' maps an NVFP4 block's largest value to 6 or 4: it takes "
                "scale='e4m3fn' and an element of largest value 6 (e2m1fn)"
            )
        if self.outer and not (
            self.per_tensor
            and not self.from_tensor_max
            and _power_of_two(self.outer, 2 * self.block_size, MAX_OUTER)
        ):
            raise ValueError(
                f"outer must be 0 (one float32 scale per tensor) or a power of two in "
                f"[{2 * self.block_size}, {MAX_OUTER}], with a two-level scale under the floor or ceil rule; "
                f"got outer={self.outer!r} with scale={self.scale!r}, rule={self.rule!r}"
            )
        element = self._element
        if self.rule == "three_quarters" and (
            self.scale != "e8m0fnu" or element.emax < 2 or element.max_value < 1.5 * 2.0**element.emax
        ):
            raise ValueError(
                "rule='three_quarters' takes scale='e8m0fnu' and an element with emax >= 2 whose "
                "largest value is at least 1.5 * 2^emax (where 3/4 of a block's largest value lands at most)"
            )
        self._check_transform()

    def _check_transform(self) -> None:
        if not isinstance(self.signs, bool):
            raise ValueError(f"signs must be True (random) or False (all +1), got {self.signs!r}")
        if self.hadamard:
            check_transform_size(self.hadamard, self.block_size)
        elif not self.signs:
            raise ValueError("signs=False sets the Hadamard transform's signs: give hadamard too")

    @property
    def element_format(self) -> FPFormat:
        """The element format, saturating."""
        return self._element

    @property
    def max_mantissa_bits(self) -> int:
        """The 23 mantissa bits of the element's largest value in float32 (the ceil rule compares them)."""
        return self._max_mantissa

    @property
    def te_constants(self) -> tuple[float, float, float]:
        """`te_constants` of the element's largest value."""
        return self._te

    @property
    def per_tensor(self) -> bool:
        """Whether a float32 scale sits above the block scales (the two-level formats: one per tensor, or
        per outer block)."""
        return self.scale != "e8m0fnu"

    @property
    def from_tensor_max(self) -> bool:
        """Whether the scales come from the tensor's largest magnitude in the encode-scale order (TE's and
        Four Over Six's) rather than torchao's per-tensor scale; these do not prescale the transform."""
        return self.rule in ("te", "four_over_six")

    @property
    def scale_format(self) -> FPFormat:
        """The block scales' format."""
        return parse_format(self.scale)

    @property
    def scale_range(self) -> tuple[float, float]:
        """A two-level format's block scales are clamped to these: its smallest normal and largest value."""
        scale = self.scale_format
        return 2.0**scale.emin, scale.max_value

    @property
    def reciprocal_constant(self) -> float:
        """C of the ``reciprocal`` rule: the scale format's largest value times its smallest normal (exact in
        float32), which maps the block ratios' clamped range onto itself."""
        low, high = self.scale_range
        return low * high

    @property
    def tensor_scale_floor(self) -> float:
        """The per-tensor scale is at least this, so that times the smallest block scale it is a normal
        float32 (2^-120 for E4M3)."""
        return 2.0 ** (-126 - self.scale_format.emin)

    @property
    def scale_ulp_bits(self) -> int:
        """A block scale's last mantissa bit in float32's bits: ``ceil`` rounds up by clearing those below."""
        return 1 << (23 - self.scale_format.man_bits)

    def padded_length(self, length: int) -> int:
        """An axis of `length` elements as the kernel lays its blocks out: padded to a multiple of the outer
        block where there is one (each outer block whole rows), else of the block."""
        unit = self.outer or self.block_size
        return -(-length // unit) * unit

    @property
    def bits_per_element(self) -> float:
        """The element's bits, the block scale's share and an outer block's float32 scale's share."""
        outer = 32 / self.outer if self.outer else 0.0
        return self._element.bits + SCALE_BITS / self.block_size + outer

    @property
    def label(self) -> str:
        """The element and scale formats: the preset's name where they are one's (``MXFP4``, ``NVFP4``), else
        e.g. ``E3M2/64 E8M0``, and the rule where not floor (rounding and transform: the policy's label)."""
        outer = f" outer {self.outer}" if self.outer else ""
        storage = (self.element, self.block_size, self.scale)
        for name, preset in PRESETS.items():
            if (preset.element, preset.block_size, preset.scale) == storage:
                return name.upper() + RULE_LABELS[self.rule] + outer
        fmt = self._element
        scale = SCALE_LABELS[self.scale] + RULE_LABELS[self.rule]
        return f"E{fmt.exp_bits}M{fmt.man_bits}/{self.block_size} {scale}{outer}"


RULE_LABELS = {
    "floor": "",
    "ceil": " ceil",
    "te": " TE",
    "three_quarters": " 3/4",
    "four_over_six": " 4/6",
    "reciprocal": " 1/s",
}
FOUR_OVER_SIX_ENCODE = 1536.0  # 6 * 256: Four Over Six's per-tensor encode numerator


def default_rule(rounding: str) -> str:
    """The scale rule of a rounding mode: OCP MX 1.0's ``floor`` for nearest, ``ceil`` for stochastic
    rounding (the only unbiased one: nothing saturates)."""
    return "ceil" if rounding == "stochastic" else "floor"


def te_constants(max_value: float) -> tuple[float, float, float]:
    """Transformer Engine's float32 constants for an element format of largest value `max_value` (6 for
    E2M1): 448 * max_value, 1 / max_value (a float32 division) and 1 / (448 * max_value) (a double division
    rounded to float32), as its kernels compute them."""
    encode = np.float32(NVFP4_SCALE_MAX) * np.float32(max_value)
    return (
        float(encode),
        float(np.float32(1.0) / np.float32(max_value)),
        float(np.float32(1.0 / float(encode))),
    )


def check_rule(rule: str | None, rounding: str) -> str:
    """`rule`, or the rounding's default where it is None; ``floor`` with stochastic rounding is refused,
    since saturation makes it biased (see the module); ``te``, ``four_over_six`` and ``reciprocal`` take
    stochastic rounding as their sources do (biased, see the module), and ``three_quarters`` keeps it
    unbiased."""
    if rule is None:
        return default_rule(rounding)
    if rule == "floor" and rounding == "stochastic":
        raise ValueError(
            "rule='floor' saturates each block's largest values, so stochastic rounding would be "
            "biased (E[out] < x); use rule='ceil' (the default for stochastic rounding)"
        )
    return rule


def check_transform_size(size: object, block_size: int | None = None) -> int:
    """A Hadamard transform size: a power of two in [2, MAX_BLOCK] (that divides block_size where given)."""
    if not _power_of_two(size, 2):
        raise ValueError(f"the Hadamard block size must be a power of two in [2, {MAX_BLOCK}], got {size!r}")
    if block_size is not None and block_size % size:  # type: ignore[operator]
        raise ValueError(f"the Hadamard block size {size} must divide the quantization block {block_size}")
    return size  # type: ignore[return-value]


def transform_norm(size: int) -> float:
    """1/sqrt(size) rounded to float32 (exact for even powers of two): the Hadamard transform's factor
    (from a table, which compiled code reads as a constant)."""
    return _TRANSFORM_NORMS[size]


_TRANSFORM_NORMS = {
    1 << k: struct.unpack("<f", struct.pack("<f", 1.0 / math.sqrt(1 << k)))[0]
    for k in range(1, MAX_BLOCK.bit_length())
}


def prescale_shift(hadamard: int) -> int:
    """P = 2 log2(hadamard) + 2: below 2^(127 - P) and prescaled by 2^-P, the transform, the quantized
    values (up to twice the transformed ones) and the transform back stay below float32's largest value."""
    return 2 * hadamard.bit_length()


# The formats of today's low-precision training recipes. MXFP6 takes E3M2, the wider of OCP's two FP6
# elements: gradients need range more than precision (the lognormal paper's finding for FP formats).
PRESETS: dict[str, BlockFormat] = {
    "mxfp8": BlockFormat("e4m3fn"),
    "mxfp6": BlockFormat("e3m2fn"),
    "mxfp4": BlockFormat("e2m1fn"),
    "nvfp4": BlockFormat("e2m1fn", 16, "e4m3fn"),
}


def as_block_format(fmt: BlockFormat | str) -> BlockFormat:
    """`fmt`, or the preset of that name (`PRESETS`)."""
    if isinstance(fmt, BlockFormat):
        return fmt
    if isinstance(fmt, str) and fmt.strip().lower() in PRESETS:
        return PRESETS[fmt.strip().lower()]
    raise ValueError(f"a block format is a BlockFormat or a preset's name {tuple(PRESETS)}, got {fmt!r}")
