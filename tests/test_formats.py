import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import ml_dtype
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gradcomp.formats import (
    DTYPE_FORMATS,
    E2M1FN,
    E2M3FN,
    E3M2FN,
    E4M3,
    E4M3FN,
    E4M3FNUZ,
    E5M2,
    E5M2FNUZ,
    E8M0FNU,
    OVERFLOWS,
    PAPER_FORMATS,
    RESERVED,
    FPFormat,
    parse_format,
)


@pytest.mark.parametrize(
    ("exp_bits", "man_bits", "max_value", "min_subnormal"),
    [  # the IEEE-like ranges of the paper's table 2.9.3 (top exponent field reserved)
        (5, 2, 57344.0, 2.0**-16),
        (4, 3, 240.0, 2.0**-9),
        (4, 2, 224.0, 2.0**-8),
        (4, 1, 192.0, 2.0**-7),
        (3, 2, 14.0, 2.0**-4),
        (3, 1, 12.0, 2.0**-3),
        (2, 2, 3.5, 2.0**-2),
    ],
)
def test_ieee_like_ranges_match_paper_table(exp_bits, man_bits, max_value, min_subnormal):
    fmt = FPFormat(exp_bits, man_bits, overflow="inf")
    assert fmt.max_value == max_value
    assert fmt.min_subnormal == min_subnormal
    assert fmt.min_normal == 2.0 ** (1 - fmt.bias)


def test_saturating_format_uses_top_binade():
    assert FPFormat(4, 3).max_value == 480.0  # one binade more than the IEEE-like 240
    assert FPFormat(3, 0).max_value == 16.0  # FP4 [1,3,0]
    assert FPFormat(3, 0).min_subnormal == FPFormat(3, 0).min_normal == 0.25  # M = 0 has no subnormals


def test_presets_match_torch_float8_e5m2_grid():
    finite = torch.arange(256, dtype=torch.uint8).view(torch.float8_e5m2).double()
    finite = torch.unique(finite[torch.isfinite(finite)])
    assert torch.equal(E5M2.values(), finite)
    assert E4M3.name == "e4m3-inf" and E4M3.max_value == 240.0


@pytest.mark.parametrize(
    "fmt", [FPFormat(4, 3), FPFormat(3, 2, overflow="inf"), FPFormat(4, 1, subnormals=False)]
)
def test_values_count_codes(fmt):
    values = fmt.values()
    codes = 2 ** (fmt.exp_bits + fmt.man_bits)  # per sign
    if fmt.overflow == "inf":
        codes -= 2**fmt.man_bits
    if not fmt.subnormals:
        codes -= 2**fmt.man_bits - 1
    assert values.numel() == 2 * codes - 1  # +-0 collapse
    assert torch.all(values[1:] > values[:-1])
    assert values.max() == fmt.max_value and values[values > 0].min() == fmt.min_subnormal


@pytest.mark.parametrize(
    "fmt",
    [
        FPFormat(4, 1),
        FPFormat(5, 2, overflow="inf"),
        FPFormat(4, 3, subnormals=False, bias=9),
        FPFormat(3, 0),
    ],
)
def test_name_round_trips(fmt):
    assert parse_format(fmt.name) == fmt
    assert parse_format(fmt.name.upper()) == fmt


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"exp_bits": 0, "man_bits": 3}, "exp_bits"),
        ({"exp_bits": 1, "man_bits": 3, "overflow": "inf"}, "exp_bits"),
        ({"exp_bits": 4, "man_bits": 24}, "man_bits"),
        ({"exp_bits": 4, "man_bits": 3, "overflow": "clip"}, "overflow"),
        ({"exp_bits": 8, "man_bits": 7}, "float32"),
        ({"exp_bits": 5, "man_bits": 2, "bias": -200}, "float32"),
    ],
)
def test_bad_formats_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FPFormat(**kwargs)


@pytest.mark.parametrize("name", ["e4", "fp8", "e4m3-sat", "m3e4", ""])
def test_bad_names_are_rejected(name):
    with pytest.raises(ValueError, match="cannot parse"):
        parse_format(name)


def test_values_refuses_wide_formats():
    with pytest.raises(ValueError, match="16 bits"):
        FPFormat(8, 10, overflow="inf").values()


def test_paper_formats_have_their_bit_widths():
    widths = {name: fmt.bits for name, fmt in PAPER_FORMATS.items()}
    assert widths == {name: int(name[2]) for name in PAPER_FORMATS}


# --- the dtype formats and the code conventions ------------------------------------------------------------


def _ml_grid(dtype_name: str) -> torch.Tensor:
    """The distinct finite values of every code of an ml_dtypes type, sorted (+-0 collapse)."""
    ml_type = ml_dtype(dtype_name)
    bits = ml_dtypes.finfo(ml_type).bits
    decoded = np.arange(2**bits, dtype=np.uint8).view(ml_type).astype(np.float64)
    return torch.from_numpy(np.unique(decoded[np.isfinite(decoded)]))


@pytest.mark.parametrize("dtype_name", list(DTYPE_FORMATS))
def test_dtype_formats_have_the_ml_dtypes_grid(dtype_name):
    fmt = DTYPE_FORMATS[dtype_name]
    info = ml_dtypes.finfo(ml_dtype(dtype_name))
    assert torch.equal(fmt.values(), _ml_grid(dtype_name))
    assert fmt.bits == info.bits
    assert (fmt.max_value, fmt.min_normal, fmt.min_subnormal) == (
        float(info.max),
        float(info.tiny),
        float(info.smallest_subnormal),
    )
    assert parse_format(dtype_name) == parse_format(dtype_name.upper()) == fmt


def test_dtype_presets_and_their_names():
    assert (E4M3FN.max_value, E4M3FNUZ.max_value, E5M2FNUZ.max_value) == (448.0, 240.0, 57344.0)
    assert (E4M3FNUZ.bias, E5M2FNUZ.bias) == (8, 16)
    assert (E8M0FNU.min_subnormal, E8M0FNU.max_value) == (2.0**-127, 2.0**127)
    assert FPFormat(4, 3, overflow="nan") == E4M3FN  # reserved="all_ones" is the default for "nan"
    names = {E4M3FN: "e4m3fn", E4M3FNUZ: "e4m3fnuz", E5M2FNUZ: "e5m2fnuz", E8M0FNU: "e8m0fnu"}
    names |= {E3M2FN: "e3m2", E2M3FN: "e2m3", E2M1FN: "e2m1"}  # as before: these need no new option
    for fmt, name in names.items():
        assert fmt.name == name and parse_format(name) == fmt
    for short in ("e4m3fn", "e4m3fnuz", "e5m2fnuz", "e3m2fn", "e2m3fn", "e2m1fn", "e8m0fnu", "e5m3fnu"):
        assert parse_format(short) == DTYPE_FORMATS[next(k for k in DTYPE_FORMATS if k.endswith("_" + short))]
    # the short form of the IEEE dtypes would be ambiguous: "e5m2" is the saturating FPFormat(5, 2)
    assert parse_format("e5m2") == FPFormat(5, 2) != parse_format("float8_e5m2") == E5M2


NEW_CONVENTIONS = [
    FPFormat(5, 2, reserved="ieee"),  # E5M2 with saturation ("satfinite")
    FPFormat(4, 3, reserved="all_ones"),  # e4m3fn with saturation
    FPFormat(4, 3, bias=8, reserved="neg_zero"),
    FPFormat(3, 2, overflow="nan", reserved="ieee"),
    FPFormat(3, 1, overflow="nan", reserved="neg_zero", subnormals=False),
    FPFormat(2, 0, overflow="nan"),
    FPFormat(4, 2, signed=False),
    FPFormat(3, 1, subnormals=False, zero=False, bias=-2),
    FPFormat(3, 2, bias=-1),
    FPFormat(5, 2, bias=140),
]


@pytest.mark.parametrize("fmt", NEW_CONVENTIONS, ids=str)
def test_new_conventions_round_trip_and_count_codes(fmt):
    assert parse_format(fmt.name) == fmt
    assert parse_format(fmt.name.upper()) == fmt
    codes = 2 ** (fmt.exp_bits + fmt.man_bits)  # per sign
    reserved = {"none": 0, "ieee": 2**fmt.man_bits, "all_ones": 1, "neg_zero": 0}[fmt.reserved]
    unused = 0 if fmt.subnormals or not fmt.zero else 2**fmt.man_bits - 1
    positive = codes - reserved - unused - fmt.zero  # the zero code is counted separately
    values = fmt.values()
    assert values.numel() == (2 if fmt.signed else 1) * positive + fmt.zero
    assert torch.all(values[1:] > values[:-1])
    assert values.max() == fmt.max_value and values[values > 0].min() == fmt.min_subnormal


def test_options_in_any_order_and_negative_bias():
    assert FPFormat(3, 2, bias=-1).name == "e3m2-b-1"
    assert parse_format("e4m3-b9-nosub-nan") == FPFormat(4, 3, bias=9, subnormals=False, overflow="nan")
    assert parse_format("e8m0-unsigned-nozero-nosub-nan") == E8M0FNU


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("e4m3-b7-b9", "bias is given twice"),
        ("e4m3-inf-inf", "overflow is given twice"),
        ("e4m3-inf-nan", "overflow is given twice"),
        ("e4m3-nosub-nosub", "subnormals is given twice"),
        ("e4m3-allones-negzero", "reserved is given twice"),
        ("e4m3-b", "unknown option 'b'"),
        ("e4m3-bias7", "unknown option 'bias7'"),
        ("e4m3-sub", "unknown option 'sub'"),
        ("e4m3fnx", "cannot parse"),
    ],
)
def test_names_with_repeated_or_unknown_options_are_rejected(name, message):
    with pytest.raises(ValueError, match=message):
        parse_format(name)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"exp_bits": True, "man_bits": 3}, "exp_bits must be an int"),
        ({"exp_bits": 4.0, "man_bits": 3}, "exp_bits must be an int"),
        ({"exp_bits": 4, "man_bits": False}, "man_bits must be an int"),
        ({"exp_bits": 4, "man_bits": 3, "bias": True}, "bias must be an int"),
        ({"exp_bits": 4, "man_bits": 3, "bias": 7.0}, "bias must be an int"),
        ({"exp_bits": 4, "man_bits": 3, "subnormals": "no"}, "subnormals must be True or False"),
        ({"exp_bits": 4, "man_bits": 3, "subnormals": 0}, "subnormals must be True or False"),
        ({"exp_bits": 4, "man_bits": 3, "signed": "yes"}, "signed must be True or False"),
        ({"exp_bits": 4, "man_bits": 3, "zero": None}, "zero must be True or False"),
    ],
)
def test_booleans_and_strings_are_not_numbers_or_flags(kwargs, message):
    with pytest.raises(TypeError, match=message):
        FPFormat(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overflow": 5}, "overflow must be one of"),
        ({"reserved": "top"}, "reserved must be one of"),
        ({"overflow": "inf", "reserved": "all_ones"}, "needs Inf codes"),
        ({"overflow": "nan", "reserved": "none"}, "needs NaN codes"),
        ({"reserved": "neg_zero", "signed": False}, "needs a sign bit"),
        ({"zero": False}, "pass subnormals=False"),
    ],
)
def test_inconsistent_conventions_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FPFormat(4, 3, **kwargs)


def test_all_ones_code_of_an_exponent_only_format_needs_two_exponent_bits():
    with pytest.raises(ValueError, match="exp_bits must be in \\[2, 8\\]"):
        FPFormat(1, 0, overflow="nan")
    assert FPFormat(2, 0, overflow="nan").positive_values().tolist() == [1.0, 2.0]


@pytest.mark.parametrize("bad", [5, None, 4.5, b"e4m3"])
def test_parse_format_refuses_non_names(bad):
    with pytest.raises(TypeError, match="FPFormat or a name"):
        parse_format(bad)


@settings(max_examples=300, deadline=None)
@given(
    exp_bits=st.integers(1, 8),
    man_bits=st.integers(0, 23),
    bias=st.none() | st.integers(-30, 160),
    subnormals=st.booleans(),
    overflow=st.sampled_from(OVERFLOWS),
    reserved=st.none() | st.sampled_from(RESERVED),
    signed=st.booleans(),
    zero=st.booleans(),
)
def test_property_every_format_round_trips_and_enumerates_its_range(**kwargs):
    try:
        fmt = FPFormat(**kwargs)
    except ValueError:
        assume(False)
    assert parse_format(fmt.name) == fmt
    if fmt.exp_bits + fmt.man_bits <= 12:
        grid = fmt.positive_values()
        assert torch.all(grid[1:] > grid[:-1])
        assert (grid[0].item(), grid[-1].item()) == (fmt.min_subnormal, fmt.max_value)
        assert torch.equal(grid, grid.float().double())  # every value is a float32
