import pytest
import torch

from gradcomp.formats import E4M3, E5M2, PAPER_FORMATS, FPFormat, parse_format


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
