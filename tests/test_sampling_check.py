"""pyspec.tools.check: its own p-value code against SciPy, and the suite itself."""

import math

import numpy as np
import pytest
from scipy import stats

from pyspec.tools import check


@pytest.mark.parametrize("df", [1, 2, 3, 5, 10, 33, 100, 1000])
def test_chi2_sf_matches_scipy(df):
    for x in np.concatenate([np.linspace(0.01, 3 * df + 50, 60), [df, df + 1.0, 1e-8]]):
        want = stats.chi2.sf(x, df)
        got = check.chi2_sf(float(x), df)
        if want > 1e-290:
            assert got == pytest.approx(want, rel=1e-10, abs=1e-15), (x, df)
        else:
            assert got < 1e-280
    assert check.chi2_sf(0.0, 3) == 1.0
    assert check.chi2_sf(math.inf, 3) == 0.0


def test_normal_p_matches_scipy():
    for z in (0.0, 0.5, 1.96, 3.0, 6.0, 10.0, -2.5):
        assert check.normal_two_sided_p(z) == pytest.approx(2 * stats.norm.sf(abs(z)), rel=1e-12)


def test_chi2_gof():
    probs = np.array([0.5, 0.3, 0.2, 0.0])
    stat, df, p = check.chi2_gof([50, 30, 20, 0], probs)
    assert stat == pytest.approx(0.0) and df == 2 and p == pytest.approx(1.0)
    stat, df, p = check.chi2_gof([50, 30, 19, 1], probs)  # mass where p = 0
    assert p == 0.0
    # Small cells are pooled until the pool reaches an expected count of 5.
    probs = np.array([0.97, 0.01, 0.01, 0.01])
    stat, df, p = check.chi2_gof([970, 10, 10, 10], probs)
    assert df == 3 and p == pytest.approx(1.0)
    stat, df, p = check.chi2_gof([97, 1, 1, 1], probs)  # pool 3 < 5 takes the last cell
    assert df == 0 and p == 1.0
    stat, df, p = check.chi2_gof([90, 4, 3, 3], [0.9, 0.06, 0.02, 0.02])  # 2+2 -> +6 = 10
    assert df == 1
    assert stat == pytest.approx(stats.chisquare([90, 10], [90, 10]).statistic)
    counts = np.array([900, 60, 40])
    stat, df, p = check.chi2_gof(counts, [0.9, 0.06, 0.04])
    want = stats.chisquare(counts, 1000 * np.array([0.9, 0.06, 0.04]))
    assert stat == pytest.approx(want.statistic) and p == pytest.approx(want.pvalue)


def test_expected_accepted():
    p = np.array([[0.4, 0.2, 0.4], [0.3, 0.3, 0.4], [1, 0, 0]])
    q = np.array([[0.2, 0.5, 0.3], [0.3, 0.3, 0.4]])
    assert check.expected_accepted(p, q) == pytest.approx(0.7 + 0.7 * 1.0)


def test_run_checks_fast_passes_and_catches_controls():
    rows = check.run_checks(fast=True)
    assert len(rows) >= 30
    failed = [r for r in rows if not r.passed]
    assert not failed, check.format_table(failed)
    controls = [r for r in rows if r.expected_outcome == "rejected"]
    assert {c.case.split("[")[1].split(",")[0] for c in controls} == {
        "residual_is_p", "accept_all", "sample_and_match", "discard_by_value"}
    table = check.format_table(rows)
    assert "ALL PASSED" in table and "NEGATIVE CONTROL" in table
    # Deterministic for a fixed seed.
    assert [r.p_value for r in check.run_checks(fast=True)] == [r.p_value for r in rows]


def test_format_table_reports_failures():
    rows = [check.CheckRow("a", "chi2 = 1", 0.5, "not rejected", True),
            check.CheckRow("b", "z = 9", 1e-20, "not rejected", False)]
    table = check.format_table(rows)
    assert "FAIL" in table and "1 FAILED" in table


def test_bench_verify_runs():
    res = check.bench_verify(n_vocab=20000, top_k=40, n_draft=3, seconds=0.2)
    assert res["verify_only_rounds_per_s"] > 0
    assert res["distributions_and_verify_rounds_per_s"] > 0
    assert 0 <= res["mean_accepted"] <= 3
