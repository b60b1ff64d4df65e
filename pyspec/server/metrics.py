"""/metrics in Prometheus' text format, under the names that vLLM's and
llama.cpp's servers use where they have a counterpart (``pyspec:`` for their
``vllm:`` / ``llamacpp:``; docs/server.md tabulates them): requests by outcome,
prompt and generated tokens, speculative decoding (drafts, draft and accepted
tokens, accepted tokens per draft position), queue depth, slots, the target's
cache, and histograms of time to first token, inter-token latency, request
latency and queue time. The ``pyspec_*`` names of earlier releases remain as
deprecated copies.

Nothing here runs on the scheduler's thread: the counts it keeps are read when
scraped, the histograms are fed by the request handlers (the event loop's
thread, which also serves /metrics), at most once per delta a choice receives.
"""

from __future__ import annotations

import bisect
import collections
import math
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

NS = "pyspec:"
_now = time.monotonic  # the clock of the latencies (the scheduler stamps Job.admitted with it too)

# vLLM's buckets (vllm/v1/metrics/loggers.py), with finer ones below its lowest
# where pyspec's times go lower (a small model's tokens, an idle queue).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075,  # pyspec's own
               0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
E2E_BUCKETS = (0.05, 0.1, 0.2) + REQUEST_LATENCY_BUCKETS
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1) + REQUEST_LATENCY_BUCKETS

# The scheduler's counters: (pyspec: name, its key in Scheduler.counters, help, deprecated pyspec_* name).
_COUNTERS = (
    ("prompt_tokens", "prompt_tokens", "Prompt tokens of admitted sequences (one count per choice)",
     "pyspec_prompt_tokens"),
    ("generation_tokens", "generated_tokens", "Tokens generated", "pyspec_generated_tokens"),
    ("spec_decode_num_drafts", "drafts", "Drafts: rounds of a sequence that verified at least one draft token",
     None),
    ("spec_decode_num_draft_tokens", "draft_tokens", "Draft tokens verified by the target", "pyspec_draft_tokens"),
    ("spec_decode_num_accepted_tokens", "draft_accepted", "Draft tokens the target accepted",
     "pyspec_draft_accepted_tokens"),
    ("rounds", "rounds", "Rounds (one target decode each)", "pyspec_rounds"),
    ("batch_rows", "batch_rows", "Verification rows over all rounds (rows per round: / rounds)",
     "pyspec_batch_rows"),
    ("requests_rejected", "rejected", "Requests refused with 503 (queue full)", "pyspec_requests_rejected"),
    ("prompt_tokens_cached", "prompt_tokens_cached",
     "Prompt tokens found in the prompt cache instead of prefilled (slots, shared prefixes, host memory)", None),
    ("prompt_cache_evictions", "cache_evictions",
     "Finished conversations' caches the context gave up (for room, or a slot reused)", None),
    ("requests_abandoned", "requests_abandoned",
     "Requests cancelled because their client left or sent a newer one (server/newest.py)", None),
    ("requests_superseded", "requests_superseded",
     "Of those, editor requests cancelled by a newer request of the same client", None),
    ("abandoned_seconds", "abandoned_seconds",
     "Seconds abandoned requests held the batch, from admission to their end", None),
    ("abandoned_tokens", "abandoned_tokens",
     "Tokens abandoned requests cost: their prompt tokens not found cached, and the tokens they generated", None),
)
# The prompt cache's host-memory tier (--cache-ram): (name, its key in HostCache.stats, help).
_CACHE_RAM_COUNTERS = (
    ("prompt_cache_ram_saved", "saved", "Conversations' caches stored in host memory"),
    ("prompt_cache_ram_restored", "restored", "Conversations' caches put back from host memory into a slot"),
    ("prompt_cache_ram_restored_tokens", "restored_tokens", "Prompt tokens those restores spared the target"),
    ("prompt_cache_ram_evicted", "evicted", "Caches dropped from host memory to stay within --cache-ram"),
)
_CACHE_RAM_GAUGES = (
    ("prompt_cache_ram_bytes", "bytes", "Host memory the prompt cache holds"),
    ("prompt_cache_ram_capacity_bytes", "capacity", "Its bound (pyspec serve --cache-ram)"),
    ("prompt_cache_ram_entries", "entries", "Conversations it holds"),
)


class Histogram:
    """Bucket counts and a sum, fed and read on one thread (the event loop's);
    ``observe(value, n)`` counts ``n`` observations of ``value`` at once."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n  # a bucket counts values <= its bound
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> List[Tuple[str, float]]:
        out, total = [], 0
        for bound, c in zip(self.bounds + (math.inf,), self.counts):
            total += c
            out.append((floatToGoString(bound), total))
        return out


class RequestClock:
    """One request's times, from its arrival at the handler: time to its first
    token, each choice's inter-token latencies, its whole latency and its wait
    in the queue. A delta of k tokens that a choice receives dt after its
    previous one counts k inter-token latencies of dt / k (a speculative round
    delivers several tokens at once) and those that come with a choice's first
    count 0, so each choice counts one fewer than its tokens and their sum is
    the time from its first token to its last."""

    __slots__ = ("metrics", "arrival", "first", "last")

    def __init__(self, metrics: "Metrics") -> None:
        self.metrics = metrics
        self.arrival = _now()
        self.first = False
        self.last: List[Optional[float]] = []

    def choices(self, n: int) -> None:
        self.last = [None] * n

    def tokens(self, index: int, k: int) -> None:
        """Choice ``index`` received ``k`` tokens now."""
        if k <= 0:
            return
        now = _now()
        m = self.metrics
        last = self.last[index]
        if last is None:  # the choice's first tokens
            if not self.first:
                self.first = True
                m.ttft.observe(now - self.arrival)
            if k > 1:
                m.itl.observe(0.0, k - 1)
        else:
            m.itl.observe((now - last) / k, k)
        self.last[index] = now

    def finished(self, admitted: float) -> None:
        """Every choice is done (``admitted``: when the job left the queue, monotonic)."""
        now = _now()
        m = self.metrics
        m.e2e.observe(now - self.arrival)
        if admitted:
            m.queue.observe(max(0.0, admitted - self.arrival))


class Metrics:
    """The server's registry: request counts and latency histograms kept here,
    the scheduler's counts read when scraped."""

    def __init__(self, scheduler: Callable[[], Optional[object]], *, model_name: str = "", n_ctx: int = 0) -> None:
        self.registry = CollectorRegistry()
        self._scheduler = scheduler
        self.model_name = model_name
        self.n_ctx = n_ctx
        self.started: Dict[str, int] = {}
        self.done: Dict[str, int] = {}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue = Histogram(QUEUE_BUCKETS)
        self.registry.register(self)

    def clock(self) -> RequestClock:
        """A request arrived: its clock starts now."""
        return RequestClock(self)

    def request_started(self, kind: str) -> None:
        self.started[kind] = self.started.get(kind, 0) + 1

    def request_done(self, status: int) -> None:
        key = str(status)
        self.done[key] = self.done.get(key, 0) + 1

    def render(self) -> Tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    # ------------------------------------------------------------ the collector
    def collect(self):
        model = [self.model_name]
        for name, doc, label, values in (
            ("requests_started", "Generation requests accepted, by endpoint", "endpoint", self.started),
            ("requests_finished", "Requests answered, by HTTP status (499: client left)", "status", self.done),
        ):
            fam = CounterMetricFamily(NS + name, doc, labels=["model_name", label])
            old = CounterMetricFamily(f"pyspec_{name}", f"{doc} (deprecated: {NS}{name})", labels=[label])
            for key, v in sorted(values.items()):
                fam.add_metric(model + [key], v)
                old.add_metric([key], v)
            yield fam
            yield old
        for name, doc, h in (
            ("time_to_first_token_seconds", "Time from a request's arrival to its first token", self.ttft),
            ("inter_token_latency_seconds", "Time between successive tokens of a choice (a delta of k tokens "
                                            "after dt: k of dt / k)", self.itl),
            ("e2e_request_latency_seconds", "Time from a request's arrival to its last token", self.e2e),
            ("request_queue_time_seconds", "Time from a request's arrival to its admission to the batch", self.queue),
        ):
            fam = HistogramMetricFamily(NS + name, doc, labels=["model_name"])
            fam.add_metric(model, h.cumulative(), h.sum)
            yield fam

        s = self._scheduler()
        if s is None:
            return
        c = s.counters
        for name, key, doc, old in _COUNTERS:
            fam = CounterMetricFamily(NS + name, doc, labels=["model_name"])
            fam.add_metric(model, c[key])
            yield fam
            if old is not None:
                yield CounterMetricFamily(old, f"{doc} (deprecated: {NS}{name})", value=c[key])
        ram = s.host_cache.stats if s.host_cache is not None else collections.Counter()
        for name, key, doc in _CACHE_RAM_COUNTERS:
            fam = CounterMetricFamily(NS + name, doc, labels=["model_name"])
            fam.add_metric(model, ram[key])
            yield fam
        for name, key, doc in _CACHE_RAM_GAUGES:
            fam = GaugeMetricFamily(NS + name, doc, labels=["model_name"])
            fam.add_metric(model, ram[key])
            yield fam
        drafted, accepted = list(s.positions.drafted), list(s.positions.accepted)
        n_pos = next((i + 1 for i in range(len(drafted) - 1, -1, -1) if drafted[i]), 0)
        for name, doc, values in (
            ("spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens per draft position (0: the first)",
             accepted),
            ("spec_decode_num_draft_tokens_per_pos", "Draft tokens verified per draft position (0: the first)",
             drafted),
        ):
            fam = CounterMetricFamily(NS + name, doc, labels=["model_name", "position"])
            for i in range(n_pos):
                fam.add_metric(model + [str(i)], values[i])
            yield fam

        running, cached = s.kv_cells
        queued, busy = s.queue_depth, s.busy_slots
        for name, value, doc, old in (
            ("num_requests_running", busy, "Sequences (one per choice) holding a slot", "pyspec_slots_busy"),
            ("num_requests_waiting", queued, "Requests waiting for a slot", "pyspec_queue_depth"),
            ("slots_total", s.parallel, "Sequence slots (pyspec serve --parallel)", "pyspec_slots_total"),
            ("kv_cells_running", running, "Target cache cells of running sequences", "pyspec_kv_cells_running"),
            ("kv_cells_cached", cached, "Target cache cells held, prefix cache included", "pyspec_kv_cells_cached"),
            ("kv_cache_usage_perc", running / self.n_ctx if self.n_ctx else 0.0,
             "Share of the target's cache cells (--n-ctx) that running sequences use (1: all)", None),
        ):
            fam = GaugeMetricFamily(NS + name, doc, labels=["model_name"])
            fam.add_metric(model, value)
            yield fam
            if old is not None:
                yield GaugeMetricFamily(old, f"{doc} (deprecated: {NS}{name})", value=value)
