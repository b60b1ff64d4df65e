"""The load of a soak (`pyspec bench soak`): the seeded request mix and the
client threads that send it (pyspec/bench/serve/soak.py states the method)."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..suite import PROMPTS

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

