"""/metrics in Prometheus' text format: requests by outcome, tokens, draft
acceptance, queue depth, slots, batch rows and the target's cache use.

Counts that the scheduler thread keeps are read when scraped (custom collector),
so the hot loop does no metric bookkeeping of its own.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self, scheduler: Callable[[], Optional[object]]) -> None:
        self.registry = CollectorRegistry()
        self._scheduler = scheduler
        self._started = Counter("pyspec_requests_started", "Generation requests accepted, by endpoint",
                                ["endpoint"], registry=self.registry)
        self._done = Counter("pyspec_requests_finished", "Requests answered, by HTTP status (499: client left)",
                             ["status"], registry=self.registry)
        self.registry.register(_SchedulerCollector(scheduler))

    def request_started(self, kind: str) -> None:
        self._started.labels(endpoint=kind).inc()

    def request_done(self, status: int) -> None:
        self._done.labels(status=str(status)).inc()

    def render(self) -> Tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _SchedulerCollector:
    def __init__(self, scheduler: Callable[[], Optional[object]]) -> None:
        self._scheduler = scheduler

    def collect(self):
        s = self._scheduler()
        if s is None:
            return
        c = s.counters
        for name, key, doc in (
            ("pyspec_prompt_tokens", "prompt_tokens", "Prompt tokens of admitted sequences"),
            ("pyspec_generated_tokens", "generated_tokens", "Tokens generated"),
            ("pyspec_draft_tokens", "draft_tokens", "Draft tokens verified by the target"),
            ("pyspec_draft_accepted_tokens", "draft_accepted", "Draft tokens the target accepted"),
            ("pyspec_rounds", "rounds", "Rounds (one target decode each)"),
            ("pyspec_batch_rows", "batch_rows", "Verification rows over all rounds (rows per round: / rounds)"),
            ("pyspec_requests_rejected", "rejected", "Requests refused with 503 (queue full)"),
        ):
            yield CounterMetricFamily(name, doc, value=c[key])
        running, cached = s.kv_cells
        for name, value, doc in (
            ("pyspec_queue_depth", s.queue_depth, "Requests waiting for a slot"),
            ("pyspec_slots_busy", s.busy_slots, "Sequence slots in use"),
            ("pyspec_slots_total", s.parallel, "Sequence slots (pyspec serve --parallel)"),
            ("pyspec_kv_cells_running", running, "Target cache cells of running sequences"),
            ("pyspec_kv_cells_cached", cached, "Target cache cells held, prefix cache included"),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
