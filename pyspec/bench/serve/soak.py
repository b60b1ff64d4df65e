"""A soak under load (`pyspec bench soak`): does a long-running `pyspec serve`
keep its resources bounded?

One real server process; ``clients`` threads each send one request after
another, drawn from a seeded mix (:func:`.soak_load.draw_request`): completions
and chats, short and long prompts and answers, streamed or whole, ``n`` of 1-3,
greedy and sampled, stop strings and logprobs, a dozen users (more than the
server keeps memories for), and cancellations: streams dropped after a few
chunks and requests with a tiny total timeout. In-flight requests are dropped
when the time is up, so the end is a cancellation wave too.

Order of a run: a warm-up of the same mix (it pages in the weights and fills
lazily grown pools), then idle, where the **baseline** is taken; the soak,
sampled every ``interval`` seconds (the server's RSS, open file descriptors and
threads from ``/proc/PID``; KV cells, busy slots and queue from ``/health``;
generated tokens from ``/metrics``); then idle again, the **final** sample.

The verdict (:func:`.soak_report.verdict`) holds the run to stated bounds
(:class:`.soak_report.Bounds`): the server never died and answered no 5xx
(seen by a client, or counted in its own ``/metrics``: an error inside a
started stream has a 200 header); no request failed otherwise (every request
of the mix is valid); RSS grew by at most max(64 MiB, 10 %) from the median of
the soak's second quarter to that of its last (the first quarter may still be
warming caches); at idle after the run, fds and threads are back within +4 of
the baseline, no KV cell is held by a running sequence, no slot is busy; and
SIGTERM stops it with exit status 0.

Here: the sampling and the run; ``soak_load.py``: the mix and its clients;
``soak_report.py``: the bounds, the verdict, the table and the plot.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from .soak_load import Mix, Tally, fill_requests, run_clients, run_requests
from .soak_report import MIB, Bounds, header, row

# ------------------------------------------------------------------ sampling


def proc_figures(pid: int) -> Dict[str, int]:
    """RSS (KiB), threads and open file descriptors of process ``pid`` (/proc: Linux)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "VmRSS":
                out["rss_kib"] = int(value.split()[0])
            elif key == "Threads":
                out["threads"] = int(value)
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> List[tuple]:
    """(name, {label: value}, value) of each sample in Prometheus' text format."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and not line.startswith("#"):
            out.append((m[1], dict(_LABEL.findall(m[2] or "")), float(m[3])))
    return out


def _get(port: int, path: str, timeout: float) -> tuple:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", errors="replace")
    finally:
        conn.close()


def server_figures(port: int, timeout: float = 30) -> Dict[str, Any]:
    """/health's slots, queue and KV cells, and /metrics' generated tokens and
    answers with a 5xx status (pyspec:requests_finished)."""
    status, text = _get(port, "/health", timeout)
    h = json.loads(text)
    out: Dict[str, Any] = {"health": h.get("status") if status == 200 else f"HTTP {status}",
                           "kv_running": h.get("kv_cells_running"), "kv_cached": h.get("kv_cells_cached"),
                           "slots_busy": h.get("slots_busy"), "queue": h.get("queue_depth")}
    _, text = _get(port, "/metrics", timeout)
    tokens = server_5xx = 0.0
    for name, labels, value in parse_metrics(text):
        if name == "pyspec:generation_tokens_total":
            tokens = value
        elif name == "pyspec:requests_finished_total" and labels.get("status", "").startswith("5"):
            server_5xx += value
    out["tokens"], out["server_5xx"] = int(tokens), int(server_5xx)
    return out


def sample(pid: int, port: int) -> Dict[str, Any]:
    """One sample: /proc first (the sampler's own connection is not yet open)."""
    s: Dict[str, Any] = dict(proc_figures(pid))
    try:
        s.update(server_figures(port))
    except (OSError, ValueError, http.client.HTTPException) as e:
        s["health"] = f"unreachable: {type(e).__name__}: {e}"
    return s


def wait_idle(pid: int, port: int, baseline: Optional[Dict[str, Any]], bounds: Bounds, *,
              timeout: float = 60.0) -> Dict[str, Any]:
    """Poll until no slot is busy, nothing waits, no running sequence holds a
    KV cell and fds and threads have settled (the same in two polls: the
    server closes dropped connections when it next touches them), and, given
    a baseline, are within the bounds: returns the last sample, with
    ``idle_after_s`` (``timeout``: the last sample as it is)."""
    t0 = time.monotonic()
    last: Dict[str, Any] = {}
    while True:
        s = sample(pid, port)
        idle = (s.get("slots_busy") == 0 and s.get("queue") == 0 and s.get("kv_running") == 0
                and (s["fds"], s["threads"]) == (last.get("fds"), last.get("threads")))
        if idle and baseline is not None:
            idle = (s["fds"] <= baseline["fds"] + bounds.fd_slack
                    and s["threads"] <= baseline["threads"] + bounds.thread_slack)
        waited = time.monotonic() - t0
        if idle or waited > timeout:
            s["idle_after_s"] = round(waited, 2)
            return s
        last = s
        time.sleep(0.5)


# ------------------------------------------------------------------ the run


@dataclass
class SoakResult:
    baseline: Dict[str, Any] = field(default_factory=dict)
    samples: List[Dict[str, Any]] = field(default_factory=list)
    final: Dict[str, Any] = field(default_factory=dict)
    warmup: Dict[str, int] = field(default_factory=dict)
    requests: Dict[str, int] = field(default_factory=dict)
    failures: List[str] = field(default_factory=list)
    died: Optional[str] = None
    fill: Dict[str, Any] = field(default_factory=dict)


def run_soak(server, *, clients: int, seconds: float, warmup_s: float, interval: float, seed: int, mix: Mix,
             bounds: Bounds, progress: Callable[[str], None], fill: bool = True,
             idle_timeout: float = 60.0) -> SoakResult:
    """The warm-up (with ``fill``, first the whole KV cache written once:
    pages the process touches for the first time are growth the verdict must
    not see), the idle baseline, the soak sampled every ``interval`` s, the
    idle final sample, waited for up to ``idle_timeout`` s (``server``: a
    running :class:`~.process.ServerProcess`)."""
    pid, port = server.proc.pid, server.port
    out = SoakResult()
    warm = Tally()

    def alive() -> bool:
        if server.proc.poll() is not None and out.died is None:
            out.died = f"the server exited with status {server.proc.returncode}"
        return out.died is None

    if fill:
        _, text = _get(port, "/v1/models", 30)
        n_vocab = json.loads(text)["data"][0]["meta"]["n_vocab"]
        reqs = fill_requests(mix, n_vocab, seed)
        before, t = proc_figures(pid)["rss_kib"], time.monotonic()
        progress(f"fill: {len(reqs)} prompts of {len(reqs[0].body['prompt'])} token ids at once "
                 f"(every KV cell written once)")
        run_requests(port, reqs, warm)
        if alive():
            after = proc_figures(pid)["rss_kib"]
            out.fill = {"seconds": round(time.monotonic() - t, 2), "rss_before_kib": before, "rss_after_kib": after}
            progress(f"fill: {out.fill['seconds']:.1f} s, RSS {before / MIB:.1f} -> {after / MIB:.1f} MiB")
    if warmup_s > 0 and alive():
        progress(f"warm-up: {clients} clients for {warmup_s:g} s")
        run_clients(port, clients=clients, seconds=warmup_s, seed=seed + 1, mix=mix, tally=warm, tick=alive)
    out.warmup, out.failures = warm.snapshot(), list(warm.failures)
    if not alive():
        return out
    out.baseline = wait_idle(pid, port, None, bounds, timeout=idle_timeout)
    b = out.baseline
    progress(f"baseline at idle: RSS {b['rss_kib'] / MIB:.1f} MiB, {b['fds']} fds, {b['threads']} threads, "
             f"KV cells {b.get('kv_running')} running / {b.get('kv_cached')} cached")
    progress(header())
    tally = Tally()
    t0 = time.monotonic()
    last = {"t": 0.0, "tokens": b.get("tokens", 0)}

    def tick() -> bool:
        if not alive():
            return False
        try:
            s = sample(pid, port)
        except OSError as e:  # /proc vanished: the process is gone
            alive()
            out.died = out.died or f"the server process vanished ({e})"
            return False
        now = time.monotonic() - t0
        counts = tally.snapshot()
        s.update(t=round(now, 2), done=counts.get("done", 0), failed=counts.get("failed", 0),
                 cancelled=counts.get("cancelled", 0))
        if "tokens" in s:
            s["tok_s"] = round((s["tokens"] - last["tokens"]) / max(now - last["t"], 1e-9), 2)
            last.update(t=now, tokens=s["tokens"])
        out.samples.append(s)
        progress(row(s))
        return alive()

    run_clients(port, clients=clients, seconds=seconds, seed=seed, mix=mix, tally=tally, tick=tick,
                interval=interval)
    out.requests = tally.snapshot()
    out.failures += tally.failures
    if alive():
        progress("clients stopped; waiting for the server to go idle")
        out.final = wait_idle(pid, port, b, bounds, timeout=idle_timeout)
        alive()
    return out

