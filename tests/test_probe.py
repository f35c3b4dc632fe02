"""The probe's rows against numpy's statistics of the same values: zeros, non-finite values, empty and
low-precision tensors."""

import numpy as np
import pytest
import torch

from gradcomp.training.probe import Probe, ProbeConfig


def _values(case: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3000, generator=generator) * torch.exp(3 * torch.randn(3000, generator=generator))
    if case == "zeros":
        x[::3] = 0
    elif case == "nonfinite":
        x[::3] = 0
        x[1], x[2], x[4] = float("nan"), float("inf"), -float("inf")
    elif case == "all_nan":
        x.fill_(float("nan"))
    elif case == "all_zero":
        x.zero_()
    elif case == "empty":
        x = x[:0]
    elif case == "one":
        x = x[:1]
    elif case == "half":
        x = x.half()
    return x


CASES = ["plain", "zeros", "nonfinite", "all_nan", "all_zero", "empty", "one", "half"]


@pytest.mark.parametrize("case", CASES)
def test_a_row_holds_numpys_statistics_of_the_values(case):
    x = _values(case)
    config = ProbeConfig(every=1, reservoir=100)
    probe = Probe(config, [], seed=0)
    probe.record("layer", "gradient", x)
    row = probe.rows[0]
    values = x.double().numpy()
    finite = values[np.isfinite(values)]
    kept = finite[finite != 0]
    log2 = np.log2(np.abs(kept))
    assert (row["count"], row["zeros"], row["nonfinite"]) == (
        values.size,
        int((finite == 0).sum()),
        int((~np.isfinite(values)).sum()),
    )
    assert row["underflow"] == int((log2 < config.edges[0]).sum())
    assert row["overflow"] == int((log2 > config.edges[-1]).sum())
    assert row["hist"].sum() == kept.size - row["underflow"] - row["overflow"]
    expected = {
        "log2_mean": log2.mean() if kept.size else np.nan,
        "log2_std": log2.std(ddof=1) if kept.size > 1 else np.nan,
        "mean": finite.mean() if finite.size else np.nan,
        "std": finite.std(ddof=1) if finite.size > 1 else np.nan,
        "absmax": np.abs(finite).max() if finite.size else np.nan,
    }
    for key, value in expected.items():
        np.testing.assert_allclose(row[key], value, rtol=1e-12, err_msg=key)
    samples = row["samples"][~np.isnan(row["samples"])]
    assert samples.size == min(100, kept.size)
    assert np.isin(samples, kept.astype(np.float32)).all()
