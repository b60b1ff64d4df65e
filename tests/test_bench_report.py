"""The benchmark's arithmetic and pictures (on hand-made samples: speed itself
is never asserted in tests)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from pyspec.bench.report import decode_rate, format_table, summarize
from pyspec.bench.runners import Sample


def _s(runner, cat, n, secs, **extra):
    return Sample(runner, f"{cat}/0", cat, 10, n, 0.1, secs, extra)


def test_ratios_pool_tokens_and_time():
    samples = [
        _s("base", "code", 11, 1.0),
        _s("base", "qa", 21, 1.0),
        _s("fast", "code", 11, 0.5, rounds=5, drafted=10, accepted=5, policy_plain=0, drafted_at=[5, 5],
           accepted_at=[3, 2]),
        _s("fast", "qa", 21, 4.0, rounds=20, drafted=0, accepted=0, policy_plain=20),
    ]
    assert decode_rate(samples[:2]) == pytest.approx(30 / 2.0)
    t = summarize(samples, "base")
    assert t["code"]["fast"]["ratio"] == pytest.approx(2.0)
    assert t["qa"]["fast"]["ratio"] == pytest.approx(0.25)
    assert t["all"]["fast"]["ratio"] == pytest.approx((30 / 4.5) / 15)
    assert t["code"]["fast"]["acceptance"] == pytest.approx(0.5)
    assert t["code"]["fast"]["mean_accepted_len"] == pytest.approx(2.0)
    assert t["code"]["fast"]["mean_draft_len"] == pytest.approx(2.0)
    assert t["code"]["base"]["acceptance"] is None
    text = format_table(t, ["base", "fast"], "base")
    assert "[code]" in text and "2.00x" in text and "0.25x" in text


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from pyspec.bench.plot import acceptance_by_position, plot

    samples = [
        _s("base", "code", 11, 1.0),
        _s("fast", "code", 11, 0.5, rounds=5, drafted=10, accepted=5, drafted_at=[5, 5], accepted_at=[3, 2]),
    ]
    assert acceptance_by_position([asdict(s) for s in samples]) == {"fast": [0.6, 0.4]}
    result = {
        "summary": summarize(samples, "base"),
        "runners": ["base", "fast"],
        "baseline": "base",
        "settings": {"temperature": 0.0},
        "threads": 2,
        "samples": [asdict(s) for s in samples],
    }
    out = tmp_path / "bench.png"
    plot(result, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
