"""A soak under load (`pyspec bench-soak`): does a long-running `pyspec serve`
keep its resources bounded?

One real server process; ``clients`` threads each send one request after
another, drawn from a seeded mix (:func:`draw_request`): completions and chats,
short and long prompts and answers, streamed or whole, ``n`` of 1-3, greedy and
sampled, stop strings and logprobs, a dozen users (more than the server keeps
memories for), and cancellations: streams dropped after a few chunks and
requests with a tiny total timeout. In-flight requests are dropped when the
time is up, so the end is a cancellation wave too.

Order of a run: a warm-up of the same mix (it pages in the weights and fills
lazily grown pools), then idle, where the **baseline** is taken; the soak,
sampled every ``interval`` seconds (the server's RSS, open file descriptors and
threads from ``/proc/PID``; KV cells, busy slots and queue from ``/health``;
generated tokens from ``/metrics``); then idle again, the **final** sample.

The verdict (:func:`verdict`) holds the run to stated bounds (:class:`Bounds`):
the server never died and answered no 5xx (seen by a client, or counted in its
own ``/metrics``: an error inside a started stream has a 200 header); no
request failed otherwise (every request of the mix is valid); RSS grew by at
most max(64 MiB, 10 %) from the median of the soak's second quarter to that of
its last (the first quarter may still be warming caches); at idle after the
run, fds and threads are back within +4 of the baseline, no KV cell is held by
a running sequence, no slot is busy; and SIGTERM stops it with exit status 0.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import socket
import statistics
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from .suite import PROMPTS

MIB = 1024  # KiB per MiB: /proc reports kB

# ------------------------------------------------------------------ the bounds


@dataclass(frozen=True)
class Bounds:
    """What a soak must hold to pass."""

    rss_growth_mib: float = 64.0   # RSS growth allowed: the larger of this ...
    rss_growth_pct: float = 10.0   # ... and this share of the second quarter's median
    fd_slack: int = 4              # idle fds after the run: at most baseline + this
    thread_slack: int = 4          # idle threads after the run: at most baseline + this

    def rss_allowed_kib(self, reference_kib: float) -> float:
        return max(self.rss_growth_mib * MIB, self.rss_growth_pct / 100 * reference_kib)

    def describe(self) -> str:
        return (f"RSS growth (median of the last quarter of samples over that of the second) <= "
                f"max({self.rss_growth_mib:g} MiB, {self.rss_growth_pct:g} %); at idle after the run fds <= "
                f"baseline + {self.fd_slack}, threads <= baseline + {self.thread_slack}, KV cells of running "
                f"sequences 0; no 5xx, no failed request, no server death, exit 0 on SIGTERM")


# ------------------------------------------------------------------ the workload

_SHORT = [p for c in ("qa", "math", "translation", "creative", "code") for p in PROMPTS[c]]
_LONG = [p for c in ("code_editing", "doc_correction", "summarization", "sql") for p in PROMPTS[c]]
#: Distinct ``user`` values: more than `pyspec serve`'s default --memory-users (8), so memories are evicted.
USERS = 12


@dataclass(frozen=True)
class Mix:
    """Sizes of the requests, fitted to the server's context: every slot busy
    with a long prompt and a long answer still fits in ``n_ctx``."""

    parallel: int
    n_ctx: int
    max_tokens: int = 256  # the longest answer asked for, if the context leaves room

    @property
    def per_slot(self) -> int:
        return self.n_ctx // self.parallel

    @property
    def long_max_tokens(self) -> int:
        return max(32, min(self.max_tokens, self.per_slot // 4))

    @property
    def long_prompt_chars(self) -> int:
        return 3 * (self.per_slot // 2)  # >= 3 characters a token: a conservative count

    @property
    def max_n(self) -> int:
        return min(3, self.parallel)


@dataclass
class Request:
    """One request of the mix, and how its client ends it (``cancel``:
    None, "disconnect" after ``after_chunks`` stream chunks, or "timeout"
    after ``timeout_s`` seconds in all)."""

    path: str
    body: Dict[str, Any]
    cancel: Optional[str] = None
    after_chunks: int = 0
    timeout_s: float = 600.0
    long_prompt: bool = False

    @property
    def kind(self) -> str:
        return "chat" if self.path.endswith("chat/completions") else "completion"

    @property
    def n(self) -> int:
        return self.body.get("n", 1)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def _long_prompt(rng: random.Random, budget_chars: int) -> str:
    parts: List[str] = []
    for text in rng.sample(_LONG, len(_LONG)):
        if parts and sum(map(len, parts)) + len(text) > budget_chars:
            break
        parts.append(text[:budget_chars])
    return "\n\n".join(parts)


def draw_request(rng: random.Random, mix: Mix, *, timeout_s: float = 600.0) -> Request:
    """One request of the mix. A third of the prompts start with a fresh tag
    (a miss of the prefix cache); the rest repeat the suite's text (hits)."""
    long_prompt = rng.random() < 0.3
    text = _long_prompt(rng, mix.long_prompt_chars) if long_prompt else rng.choice(_SHORT)
    if rng.random() < 0.33:
        text = f"[{rng.randrange(1 << 30):x}] {text}"
    cancel = rng.choices([None, "disconnect", "timeout"], weights=[75, 15, 10])[0]
    stream = cancel == "disconnect" or rng.random() < 0.5
    # A cancelled request asks for a long answer, so that the cancellation comes before its end.
    long_answer = cancel is not None or rng.random() < 0.4
    body: Dict[str, Any] = {
        "max_tokens": (rng.randint(max(17, mix.long_max_tokens // 4), mix.long_max_tokens) if long_answer
                       else rng.randint(1, 16)),
        "user": f"soak-{rng.randrange(USERS)}",
        "n": rng.choices([1, 2, 3], weights=[70, 15, 15])[0] if mix.max_n > 1 else 1,
    }
    body["n"] = min(body["n"], mix.max_n)
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body["temperature"] = round(rng.uniform(0.5, 1.2), 2)
        if rng.random() < 0.5:
            body["seed"] = rng.randrange(1 << 31)
    if rng.random() < 0.15:
        body["stop"] = ["\n\n"]
    chat = rng.random() < 0.5
    if rng.random() < 0.1:
        body.update({"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2})
    if stream:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = text
        path = "/v1/completions"
    req = Request(path, body, cancel=cancel, timeout_s=timeout_s, long_prompt=long_prompt)
    if cancel == "disconnect":
        req.after_chunks = rng.randint(1, 8)
    elif cancel == "timeout":
        req.timeout_s = round(rng.uniform(0.02, 0.5), 3)
    return req


# ------------------------------------------------------------------ the clients


class Tally:
    """Outcomes of the clients' requests (thread-safe). ``counts`` keys: sent,
    done, failed, cancelled, cancelled_{disconnect,timeout,end}, chat,
    completion, stream, n_multi, long_prompt, sampled, status_5xx and
    status_NNN; ``failures`` keeps the first few failures' reasons."""

    MAX_FAILURES = 20

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter = Counter()
        self.failures: List[str] = []

    def add(self, req: Request, outcome: str, status: Optional[int] = None, why: str = "",
            cancel: Optional[str] = None) -> None:
        with self._lock:
            c = self.counts
            c["sent"] += 1
            c[outcome] += 1
            c[req.kind] += 1
            c["stream"] += req.stream
            c["n_multi"] += req.n > 1
            c["long_prompt"] += req.long_prompt
            c["sampled"] += req.body.get("temperature", 1) > 0
            if outcome == "cancelled":
                c[f"cancelled_{cancel or req.cancel}"] += 1
            if status is not None:
                c[f"status_{status}"] += 1
                c["status_5xx"] += 500 <= status < 600
            if outcome == "failed" and len(self.failures) < self.MAX_FAILURES:
                self.failures.append(f"{req.kind} n={req.n} stream={req.stream}: {why}")

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self.counts)


class _Cancelled(Exception):
    """The client ends the request on purpose."""


class Client:
    """One client thread: requests one after another until ``stop`` is set;
    ``abort()`` drops the request in flight (the run's end)."""

    def __init__(self, port: int, index: int, seed: int, mix: Mix, tally: Tally, stop: threading.Event) -> None:
        self.port, self.mix, self.tally, self.stop = port, mix, tally, stop
        self.rng = random.Random(seed * 1_000_003 + index)
        self._lock = threading.Lock()
        self._conn: Optional[http.client.HTTPConnection] = None
        self.thread = threading.Thread(target=self._loop, name=f"soak-client-{index}", daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.one(draw_request(self.rng, self.mix))

    def abort(self) -> None:
        with self._lock:
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def one(self, req: Request) -> None:
        """Send ``req``, read its answer as its ``cancel`` says, tally the outcome."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=req.timeout_s)
        with self._lock:
            self._conn = conn
        deadline = time.monotonic() + req.timeout_s
        status = None
        try:
            conn.request("POST", req.path, body=json.dumps(req.body).encode(),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            status = r.status
            if status != 200:
                raise ValueError(f"HTTP {status}: {r.read()[:300]!r}")
            why = self._read_stream(r, req, deadline) if req.stream else self._read_whole(r, req)
            if why:
                raise ValueError(why)
            self.tally.add(req, "done", status)
        except _Cancelled:
            self.tally.add(req, "cancelled", status)
        except (OSError, http.client.HTTPException, ValueError) as e:
            if self.stop.is_set():  # dropped at the end of the run
                self.tally.add(req, "cancelled", status, cancel="end")
            elif req.cancel == "timeout" and isinstance(e, socket.timeout):
                self.tally.add(req, "cancelled", status)
            else:
                self.tally.add(req, "failed", status, f"{type(e).__name__}: {e}")
        finally:
            with self._lock:
                self._conn = None
            conn.close()

    @staticmethod
    def _read_whole(r: http.client.HTTPResponse, req: Request) -> str:
        """Why a whole answer is malformed ('' when it is not)."""
        answer = json.loads(r.read())
        if len(answer.get("choices", ())) != req.n:
            return f"{len(answer.get('choices', ()))} choices for n={req.n}"
        return ""

    @staticmethod
    def _read_stream(r: http.client.HTTPResponse, req: Request, deadline: float) -> str:
        """Read a stream to its [DONE] (or cancel it): why it is malformed, or ''."""
        chunks = finished = 0
        for line in r:
            if req.cancel == "timeout" and time.monotonic() > deadline:
                raise _Cancelled
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                return "" if finished == req.n else f"[DONE] after {finished} of {req.n} choices finished"
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return f"error in the stream: {chunk['error']}"
            finished += sum(c.get("finish_reason") is not None for c in chunk.get("choices", ()))
            chunks += 1
            if req.cancel == "disconnect" and chunks >= req.after_chunks:
                raise _Cancelled
        return f"the stream ended without [DONE] ({chunks} chunks)"


def fill_requests(mix: Mix, n_vocab: int, seed: int) -> List[Request]:
    """``parallel`` whole completions whose token-id prompts fill a slot's share
    of the context each (max_tokens 1): sent at once, they write every KV cell
    of the target (and draft) once."""
    rng = random.Random(seed)
    lo, hi = (1000, min(n_vocab, 30000)) if n_vocab > 2000 else (0, n_vocab)
    length = mix.per_slot - 8  # room for the one token generated
    return [Request("/v1/completions", {"prompt": [rng.randrange(lo, hi) for _ in range(length)], "max_tokens": 1,
                                        "temperature": 0, "user": f"soak-fill-{i}"}, timeout_s=1800.0)
            for i in range(mix.parallel)]


def run_requests(port: int, requests: Sequence[Request], tally: Tally) -> None:
    """``requests`` at once, each by a client of its own, to their ends."""
    stop = threading.Event()
    pool = [Client(port, i, 0, Mix(1, 512), tally, stop) for i in range(len(requests))]
    threads = [threading.Thread(target=c.one, args=(r,), daemon=True) for c, r in zip(pool, requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_clients(port: int, *, clients: int, seconds: float, seed: int, mix: Mix, tally: Tally,
                tick: Optional[Callable[[], bool]] = None, interval: float = 1.0) -> None:
    """``clients`` clients for ``seconds``; ``tick()`` is called every
    ``interval`` seconds meanwhile (False: stop early). At the end the
    requests in flight are dropped."""
    stop = threading.Event()
    pool = [Client(port, i, seed, mix, tally, stop) for i in range(clients)]
    for c in pool:
        c.thread.start()
    t_end = time.monotonic() + seconds
    try:
        while (now := time.monotonic()) < t_end:
            time.sleep(min(interval, t_end - now))
            if tick is not None and not tick():
                break
    finally:
        stop.set()
        for c in pool:
            c.abort()
        for c in pool:
            c.thread.join(30)


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


# ------------------------------------------------------------------ the verdict


def rss_growth(rss_kib: Sequence[float], bounds: Bounds) -> Dict[str, Any]:
    """RSS check over the soak's samples: median of the last quarter against
    the median of the second (ok None: fewer than 4 samples, not judged)."""
    n = len(rss_kib)
    if n < 4:
        return {"name": "rss growth", "ok": None,
                "detail": f"not judged: {n} samples (needs 4; run longer or sample more often)"}
    q = n // 4
    ref, last = statistics.median(rss_kib[q:2 * q]), statistics.median(rss_kib[n - q:])
    allowed = bounds.rss_allowed_kib(ref)
    growth = last - ref
    return {"name": "rss growth", "ok": growth <= allowed, "reference_kib": ref, "last_kib": last,
            "growth_kib": growth, "allowed_kib": allowed, "quarter": q,
            "detail": f"{growth / MIB:+.1f} MiB (median {ref / MIB:.1f} -> {last / MIB:.1f} MiB), "
                      f"allowed {allowed / MIB:.1f} MiB"}


def verdict(samples: List[Dict[str, Any]], baseline: Dict[str, Any], final: Dict[str, Any], bounds: Bounds, *,
            tally: Dict[str, int], died: Optional[str] = None, exit_status: Optional[int] = None) -> Dict[str, Any]:
    """The checks of a soak (each {name, ok, detail}) and ``ok``: all hold (a
    check with ok None was not judged). ``tally``: the clients' counts (warm-up
    included); ``died``: how the server died, if it did; ``exit_status``: its
    status after SIGTERM (None: not stopped yet)."""
    checks: List[Dict[str, Any]] = []

    def check(name: str, ok: Optional[bool], detail: str) -> None:
        checks.append({"name": name, "ok": ok, "detail": detail})

    check("server alive", died is None, died or "answered /health throughout")
    server_5xx = max([s.get("server_5xx", 0) for s in samples + [final]] or [0])
    client_5xx = tally.get("status_5xx", 0)
    check("no 5xx", client_5xx == 0 and server_5xx == 0,
          f"{client_5xx} seen by clients, {server_5xx} counted by the server's /metrics")
    failed = tally.get("failed", 0)
    check("no failed request", failed == 0, f"{failed} of {tally.get('sent', 0)}")
    checks.append(rss_growth([s["rss_kib"] for s in samples if "rss_kib" in s], bounds))
    if died is None:
        idle = final.get("slots_busy") == 0 and final.get("queue") == 0
        check("idle after the run", idle, f"slots busy {final.get('slots_busy')}, queue {final.get('queue')} "
                                          f"({'after' if idle else 'still, after'} {final.get('idle_after_s')} s)")
        for key, slack in (("fds", bounds.fd_slack), ("threads", bounds.thread_slack)):
            check(f"{key} at idle", final[key] <= baseline[key] + slack,
                  f"{final[key]} (baseline {baseline[key]}, allowed {baseline[key] + slack}; "
                  f"peak {max([s[key] for s in samples] or [final[key]])})")
        check("KV cells at idle", final.get("kv_running") == 0,
              f"{final.get('kv_running')} held by running sequences ({final.get('kv_cached')} cached)")
    if exit_status is not None:
        check("clean stop", exit_status == 0, f"exit status {exit_status} after SIGTERM")
    return {"ok": all(c["ok"] is not False for c in checks), "bounds": asdict(bounds),
            "bounds_text": bounds.describe(), "checks": checks}


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
    running :class:`~.server_process.ServerProcess`)."""
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


# ------------------------------------------------------------------ output

_COLUMNS = (("t", "t s", 7, ".0f"), ("rss_kib", "RSS MiB", 8, None), ("fds", "fds", 5, "d"),
            ("threads", "thr", 4, "d"), ("kv_running", "KV run", 7, "d"), ("kv_cached", "KV cache", 8, "d"),
            ("slots_busy", "busy", 4, "d"), ("done", "done", 6, "d"), ("cancelled", "cancel", 6, "d"),
            ("failed", "fail", 5, "d"), ("tok_s", "tok/s", 7, ".1f"))


def header() -> str:
    return " ".join(f"{title:>{w}}" for _, title, w, _ in _COLUMNS)


def row(s: Dict[str, Any]) -> str:
    cells = []
    for key, _, w, fmt in _COLUMNS:
        v = s.get(key)
        if key == "rss_kib" and v is not None:
            v, fmt = v / MIB, ".1f"
        cells.append(f"{'-' if v is None else format(v, fmt):>{w}}")
    line = " ".join(cells)
    if s.get("health") not in (None, "ok"):
        line += f"  health: {s['health']}"
    return line


def format_report(result: Dict[str, Any], max_rows: int = 40) -> str:
    """The table over time (thinned evenly to ``max_rows``: --json has every
    sample), the baseline and final idle rows, the requests and the verdict."""
    samples = result["samples"]
    step = max(1, -(-len(samples) // max_rows))
    shown = samples[::step]
    if samples and shown[-1] is not samples[-1]:
        shown.append(samples[-1])
    lines = [header()]
    if result.get("baseline"):
        lines.append(row({**result["baseline"], "t": None}) + "  <- baseline (idle, after warm-up)")
    if step > 1:
        lines.append(f"(every {step}th of {len(samples)} samples)")
    lines += [row(s) for s in shown]
    if result.get("final"):
        lines.append(row({**result["final"], "t": None}) + "  <- final (idle, after the run)")
    r = result["requests"]
    lines.append(
        f"requests: {r.get('sent', 0)} sent, {r.get('done', 0)} done, {r.get('cancelled', 0)} cancelled "
        f"({r.get('cancelled_disconnect', 0)} dropped streams, {r.get('cancelled_timeout', 0)} tiny timeouts, "
        f"{r.get('cancelled_end', 0)} at the end), {r.get('failed', 0)} failed; {r.get('chat', 0)} chat, "
        f"{r.get('stream', 0)} streamed, {r.get('n_multi', 0)} with n > 1, {r.get('sampled', 0)} sampled")
    for why in result.get("failures", [])[:5]:
        lines.append(f"  failed: {why}")
    v = result["verdict"]
    lines.append(f"bounds: {v['bounds_text']}")
    for c in v["checks"]:
        mark = {True: "ok  ", False: "FAIL", None: "--  "}[c["ok"]]
        lines.append(f"  {mark} {c['name']}: {c['detail']}")
    lines.append(f"soak: {'PASS' if v['ok'] else 'FAIL'}")
    return "\n".join(lines)


def plot(result: Dict[str, Any], path: str) -> None:
    """Four panels over time: RSS (with the growth bound over the last
    quarter), fds and threads (with baseline + slack), KV cells (running and
    cached, with n_ctx); the idle baseline and final values as markers."""
    from .plot import pyplot

    plt = pyplot()
    samples, base, final = result["samples"], result.get("baseline") or {}, result.get("final") or {}
    bounds = result["verdict"]["bounds"]
    t = [s["t"] for s in samples]
    t_end = (t[-1] if t else 0) + result["interval_s"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    panels = (("rss_kib", "RSS (MiB)", MIB), ("fds", "open file descriptors", 1), ("threads", "threads", 1),
              ("kv_running", "KV cells", 1))
    for ax, (key, label, scale) in zip(axes.flat, panels):
        ax.plot(t, [s.get(key, float("nan")) / scale if s.get(key) is not None else float("nan") for s in samples],
                marker=".", label="during the soak" if key != "kv_running" else "running sequences")
        for where, s, marker in ((0, base, "s"), (t_end, final, "D")):
            if s.get(key) is not None:
                ax.plot([where], [s[key] / scale], marker=marker, color="black", linestyle="none")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    rss = next((c for c in result["verdict"]["checks"] if c["name"] == "rss growth"), {})
    if rss.get("ok") is not None:  # the two quarters compared, their reference and the bound on the last
        q, ax, half = rss["quarter"], axes[0, 0], result["interval_s"] / 2
        ax.axvspan(t[q] - half, t[2 * q - 1] + half, color="grey", alpha=0.2, label="second quarter")
        ax.axvspan(t[len(t) - q] - half, t[-1] + half, color="orange", alpha=0.2, label="last quarter")
        ax.hlines(rss["reference_kib"] / MIB, t[q], t[-1], color="grey", linestyle=":",
                  label="median of the second quarter")
        ax.hlines((rss["reference_kib"] + rss["allowed_kib"]) / MIB, t[q], t[-1], color="red",
                  label="bound on the last quarter's median: + max(%g MiB, %g %%)"
                        % (bounds["rss_growth_mib"], bounds["rss_growth_pct"]))
    for ax, key, slack in ((axes[0, 1], "fds", bounds["fd_slack"]), (axes[1, 0], "threads", bounds["thread_slack"])):
        if base.get(key) is not None:
            ax.axhline(base[key] + slack, color="red", label=f"idle bound: baseline + {slack}")
    ax = axes[1, 1]
    ax.plot(t, [s.get("kv_cached") for s in samples], linestyle="--", label="cached (prefix cache included)")
    ax.axhline(result["n_ctx"], color="grey", linewidth=0.8, label=f"n_ctx {result['n_ctx']}")
    for ax in axes.flat:
        ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("seconds into the soak (square: idle baseline, diamond: idle after the run)")
    v = "PASS" if result["verdict"]["ok"] else "FAIL"
    fig.suptitle(f"pyspec serve soak: {result['clients']} clients, {result['minutes']:g} min — {v}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
