"""`pyspec bench soak`: the verdict on synthetic samples (a leak is caught, a flat
run passes, every idle bound bites), the request mix, and one short real run
of the command on the small test model."""

from __future__ import annotations

import json
import random

import pytest

from cli_helpers import pyspec_cmd
from pyspec.bench.serve.soak import parse_metrics
from pyspec.bench.serve.soak_load import USERS, Mix, draw_request
from pyspec.bench.serve.soak_report import MIB, Bounds, rss_growth, verdict

BASE = {"rss_kib": 500 * MIB, "fds": 9, "threads": 5, "kv_running": 0, "kv_cached": 100, "slots_busy": 0,
        "queue": 0, "server_5xx": 0}
TALLY = {"sent": 100, "done": 80, "cancelled": 20, "failed": 0, "status_5xx": 0}


def samples(rss_mib, **extra):
    """Soak samples with these RSS values (MiB), busy otherwise."""
    return [{**BASE, "t": 10.0 * i, "rss_kib": r * MIB, "fds": 17, "threads": 5, "kv_running": 300,
             "slots_busy": 8, **extra} for i, r in enumerate(rss_mib)]


def failed_checks(v):
    return sorted(c["name"] for c in v["checks"] if c["ok"] is False)


def judge(rss_mib, final=None, tally=None, **kw):
    return verdict(samples(rss_mib), BASE, {**BASE, "idle_after_s": 1.0, **(final or {})}, Bounds(),
                   tally={**TALLY, **(tally or {})}, exit_status=kw.pop("exit_status", 0), **kw)


def test_a_flat_run_passes():
    noise = random.Random(0)
    v = judge([600 + noise.uniform(-20, 20) for _ in range(180)])
    assert v["ok"] and not failed_checks(v), v
    assert {c["name"] for c in v["checks"]} == {"server alive", "no 5xx", "no failed request", "rss growth",
                                                 "idle after the run", "fds at idle", "threads at idle",
                                                 "KV cells at idle", "clean stop"}


def test_rss_growth_is_caught_and_the_bound_is_the_larger_of_two():
    # Negative control: a leak of 1 MiB a sample over 180 samples (30 min at 10 s): ~90 MiB between the quarters.
    v = judge([500 + i for i in range(180)])
    assert not v["ok"] and failed_checks(v) == ["rss growth"]
    rss = next(c for c in v["checks"] if c["name"] == "rss growth")
    assert rss["growth_kib"] == 90 * MIB and rss["allowed_kib"] == 64 * MIB  # 10 % of ~567 MiB is less
    # At 2 GiB, 10 % (~205 MiB) is the bound: the same leak passes, a larger one does not.
    assert rss_growth([2048 * MIB + i * MIB for i in range(180)], Bounds())["ok"]
    assert not rss_growth([2048 * MIB + 3 * i * MIB for i in range(180)], Bounds())["ok"]
    # Just under and just over 64 MiB at a small RSS (a step between the quarters).
    step = lambda d: [500 * MIB] * 50 + [(500 + d) * MIB] * 50  # noqa: E731
    assert rss_growth(step(63.9), Bounds())["ok"] and not rss_growth(step(64.1), Bounds())["ok"]
    assert not rss_growth(step(10), Bounds(rss_growth_mib=8, rss_growth_pct=1))["ok"], "the bound is an option"


def test_warm_up_growth_in_the_first_quarter_does_not_count():
    rss = [300 + 10 * i for i in range(25)] + [550] * 75  # grows by 240 MiB, then flat
    assert judge(rss)["ok"]


def test_too_few_samples_are_not_judged():
    v = judge([500, 900, 900])
    rss = next(c for c in v["checks"] if c["name"] == "rss growth")
    assert rss["ok"] is None and "not judged" in rss["detail"] and v["ok"]


@pytest.mark.parametrize("final, tally, kw, failing", [
    ({"fds": 14}, None, {}, "fds at idle"),
    ({"threads": 10}, None, {}, "threads at idle"),
    ({"kv_running": 12}, None, {}, "KV cells at idle"),
    ({"slots_busy": 1}, None, {}, "idle after the run"),
    ({"server_5xx": 1}, None, {}, "no 5xx"),                 # an error inside a stream: a 200 header
    (None, {"status_5xx": 1, "failed": 1}, {}, "no 5xx"),
    (None, {"failed": 1}, {}, "no failed request"),
    (None, None, {"exit_status": -11}, "clean stop"),
])
def test_every_bound_bites(final, tally, kw, failing):
    v = judge([600] * 40, final, tally, **kw)
    assert not v["ok"] and failing in failed_checks(v), v
    at_bound = judge([600] * 40, {"fds": BASE["fds"] + 4, "threads": BASE["threads"] + 4})
    assert at_bound["ok"], "baseline + slack is allowed"


def test_a_dead_server_fails_without_idle_checks():
    v = verdict(samples([600] * 10), BASE, {}, Bounds(), tally=TALLY, died="the server exited with status -9")
    assert not v["ok"] and failed_checks(v) == ["server alive"]


def test_the_mix_covers_every_kind_and_fits_the_context():
    """2,000 draws: every feature the soak promises occurs, sizes fit a slot's
    share of the context, and a seed gives the same requests."""
    mix = Mix(parallel=8, n_ctx=8192)
    rng = random.Random(7)
    reqs = [draw_request(rng, mix) for _ in range(2000)]
    seen = {
        "chat": sum(r.kind == "chat" for r in reqs), "completion": sum(r.kind == "completion" for r in reqs),
        "stream": sum(r.stream for r in reqs), "whole": sum(not r.stream for r in reqs),
        "n>1": sum(r.n > 1 for r in reqs), "greedy": sum(r.body["temperature"] == 0 for r in reqs),
        "sampled": sum(r.body["temperature"] > 0 for r in reqs), "long prompt": sum(r.long_prompt for r in reqs),
        "short answer": sum(r.body["max_tokens"] <= 16 for r in reqs),
        "long answer": sum(r.body["max_tokens"] > 16 for r in reqs),
        "disconnect": sum(r.cancel == "disconnect" for r in reqs), "timeout": sum(r.cancel == "timeout" for r in reqs),
        "stop": sum("stop" in r.body for r in reqs), "logprobs": sum("logprobs" in r.body for r in reqs),
    }
    assert min(seen.values()) >= 100, seen
    assert len({r.body["user"] for r in reqs}) == USERS
    for r in reqs:
        assert 1 <= r.n <= mix.max_n and 1 <= r.body["max_tokens"] <= mix.long_max_tokens
        text = r.body.get("prompt") or r.body["messages"][0]["content"]
        assert len(text) <= mix.long_prompt_chars + 16  # the tag
        assert r.cancel != "disconnect" or (r.stream and r.after_chunks >= 1)
        assert r.cancel != "timeout" or r.timeout_s <= 0.5
        assert r.cancel is None or r.body["max_tokens"] > 16, "a cancellation comes before the answer's end"
    again = random.Random(7)
    assert [draw_request(again, mix).body for _ in range(50)] == [r.body for r in reqs[:50]]
    assert all(draw_request(rng, Mix(parallel=1, n_ctx=512)).n == 1 for _ in range(200))


def test_parse_metrics():
    text = ('# HELP pyspec:requests_finished_total x\n# TYPE pyspec:requests_finished_total counter\n'
            'pyspec:requests_finished_total{model_name="m",status="200"} 7.0\n'
            'pyspec:requests_finished_total{model_name="m",status="503"} 2.0\n'
            'pyspec:generation_tokens_total{model_name="m"} 1234.0\n')
    assert parse_metrics(text) == [
        ("pyspec:requests_finished_total", {"model_name": "m", "status": "200"}, 7.0),
        ("pyspec:requests_finished_total", {"model_name": "m", "status": "503"}, 2.0),
        ("pyspec:generation_tokens_total", {"model_name": "m"}, 1234.0)]


def test_bench_soak_runs_on_the_test_model(gemma_path, tmp_path):
    """12 s of 4 clients against a real server (one thread: the machine may be
    shared), after the fill and 3 s of warm-up: exit 0, the JSON's shape, and
    the mix really cancelled requests and asked for n > 1."""
    out, png = tmp_path / "soak.json", tmp_path / "soak.png"
    run = pyspec_cmd("bench", "soak", "--model", gemma_path, "--minutes", "0.2", "--warmup", "3",
                     "--clients", "4", "--interval", "2", "--threads", "1", "--parallel", "4", "--n-ctx", "1024",
                     "--max-tokens", "32", "--json", str(out), "--plot", str(png), timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "soak: PASS" in run.stdout and "max(64 MiB, 10 %)" in run.stdout
    assert run.stderr.count("\n") >= len(json.loads(out.read_text())["samples"]) + 4, "a line per sample"
    r = json.loads(out.read_text())
    assert r["verdict"]["ok"] and len(r["verdict"]["checks"]) == 9
    assert len(r["samples"]) >= 5 and r["fill"]["rss_after_kib"] > 0
    for s in [r["baseline"], r["final"], *r["samples"]]:
        assert {"rss_kib", "fds", "threads", "kv_running", "kv_cached", "slots_busy", "tokens"} <= set(s), s
    assert r["final"]["kv_running"] == 0 and r["samples"][-1]["t"] >= 11
    counts = {k: r["requests"].get(k, 0) + r["warmup_requests"].get(k, 0) for k in r["requests"]}
    assert counts["done"] > 0 and counts["n_multi"] > 0 and counts["stream"] > 0
    assert counts.get("cancelled_disconnect", 0) + counts.get("cancelled_timeout", 0) > 0, counts
    assert r["samples"][-1]["tokens"] > r["baseline"]["tokens"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
