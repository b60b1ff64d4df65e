"""Admission and slot choice: one thread owns the llama contexts and runs the batch.

HTTP handlers :meth:`Scheduler.submit` a :class:`~.jobs.Job` (one request: one
or more choices) and read its events from an asyncio queue. The scheduler
thread runs the engine's :class:`~pyspec._core.BatchSession`: between rounds it
admits waiting jobs while sequence slots are free (a job's choices join
together, so the engine prefills their shared prompt once), cancels the
sequences of jobs whose clients left, and after each round hands every choice
the text and log-probabilities it gained. Every running sequence's rows go into
the round's one target decode; new prompts are prefilled in chunks beside them.

Prompt cache: the contexts hold more sequences (slots) than run at once
(``parallel``), so finished conversations stay cached side by side in the
unified cache; a request goes to the slot the engine picks for its prompt
(``BatchSession.pick_slot``: the one its conversation left, else the least
recently used), and caches the context must give up go to host memory
(``HostCache``, ``--cache-ram``) and come back when their conversation does
(and to disk across restarts: saved.py). Slot j's drafter drafts in sequence j
of the draft model's context, so the draft model's cache follows the
conversation too, and two running sequences never share one. Length policies
and memories follow the user (the request's ``user`` field: users.py), not the
slot. The counts of /metrics are kept here (written by this thread, read by
metrics.py when scraped).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Deque, Dict, List, Optional, Set, Tuple

from .. import _core, escaped
from ..fim import EditorStops
from ..results import PositionCounts
from ..settings import PREFILL_CHUNK
from ..testing import TestControls, controls
from .jobs import Choice, EngineFailed, Job, JobCancelled, JobRefused, QueueFull, ShuttingDown
from .saved import SavedConversations
from .users import UserPolicies

if TYPE_CHECKING:
    from ..memory import Memory

#: Largest draft a request may ask for (draft_max): the core's bound (policy.h).
MAX_DRAFT = _core.MAX_DRAFT
#: Host memory for the conversations the context gives up (pyspec serve --cache-ram), in MiB.
DEFAULT_CACHE_RAM_MB = 1024
#: Finished conversations the context keeps cached beside the running ones
#: (pyspec serve --cache-slots; the contexts hold --parallel plus these sequences,
#: in the same unified cache of --n-ctx cells).
DEFAULT_CACHE_SLOTS = 8


def _said_if_failed(done: Future) -> None:
    """Work done after an answer (a memory add, a calibration write) that failed:
    said, not silently lost; the answers were sent and the engine goes on."""
    e = done.exception()
    if e is not None:
        warnings.warn(f"pyspec serve: work after an answer failed: {type(e).__name__}: {e}", RuntimeWarning,
                      stacklevel=1)


class Scheduler:
    """Owns ``decoder``'s contexts on one thread; see the module docstring."""

    def __init__(self, decoder, *, parallel: int, queue_size: int, prefill_chunk: int = PREFILL_CHUNK,
                 cache_ram_mb: float = 0, cache_dir: Optional[str] = None,
                 memories: Optional[Callable[[str], Optional["Memory"]]] = None,
                 _test: Optional[TestControls] = None) -> None:
        self.decoder = decoder
        self.target = decoder.target
        self.parallel = parallel
        self.queue_size = queue_size
        self.memories = memories
        self._lock = threading.Condition()
        self._waiting: Deque[Job] = collections.deque()
        self._running: List[Job] = []
        self._n_running = 0               # sequences holding a slot (at most `parallel`)
        self._cached_slots = 0
        self._busy: Set[int] = set()      # their slots
        self._test = controls(_test)      # TEST-ONLY (pyspec/testing.py): off in the product
        self.policies = UserPolicies()    # the length policy each user's sequences teach
        # Memory adds and calibration writes: off the round's thread, in order.
        self._after = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pyspec-after")
        # The prompt cache's host-memory tier (--cache-ram) and disk tier (--cache-dir).
        self.host_cache = _core.HostCache(int(cache_ram_mb * 2**20)) if cache_ram_mb > 0 else None
        self.saved: Optional[SavedConversations] = None
        if cache_dir is not None:
            self.saved = SavedConversations(cache_dir, self.host_cache, decoder.cache_models)
            self.saved.load()
        self._by_handle: Dict[int, Tuple[Job, Choice]] = {}
        self._stopping = False
        self.error: Optional[BaseException] = None
        # Figures for /health and /metrics (written by the scheduler thread).
        self.counters = collections.Counter()
        self.positions = PositionCounts(MAX_DRAFT)  # draft tokens verified and accepted at each draft position
        self.kv_cells = (0, 0)
        # A new request's first token from its prompt's decode, as llama-server's
        # (engine.h, SessionParams::first_with_prompt): the rounds already mix requests.
        self._session = decoder.open_session(self._on_token, prefill_chunk=prefill_chunk, first_with_prompt=True,
                                             host_cache=self.host_cache, _test=self._test)
        self._thread = threading.Thread(target=self._run, name="pyspec-scheduler", daemon=True)
        self._thread.start()

    # -------------------------------------------------------------- handlers' side
    @property
    def queue_depth(self) -> int:
        """Requests waiting for slots (not those the next round admits)."""
        with self._lock:
            return self._queued()

    @property
    def _n_free(self) -> int:
        return self.parallel - self._n_running

    def _queued(self) -> int:
        """Waiting jobs that the free slots cannot take in order (lock held)."""
        free, queued = self._n_free, 0
        for job in self._waiting:
            if queued or job.need > free:
                queued += 1
            else:
                free -= job.need
        return queued

    def _unclaimed(self) -> int:
        """Free slots that no waiting job will take (lock held)."""
        return self._n_free - sum(j.need for j in self._waiting)

    @property
    def busy_slots(self) -> int:
        return self._n_running

    @property
    def conversations_cached(self) -> int:
        """Slots holding a cache that no running sequence uses."""
        return self._cached_slots

    def submit(self, job: Job) -> None:
        """Queue a job, or raise :class:`ShuttingDown` or :class:`QueueFull`."""
        with self._lock:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            queued = self._queued()
            if (queued or job.need > self._unclaimed()) and queued >= self.queue_size:
                self.counters["rejected"] += 1
                raise QueueFull(f"the server is busy: {queued} requests already wait for a slot; retry later")
            self._waiting.append(job)
            self._lock.notify()

    def shutdown(self) -> None:
        """Refuse new jobs; cancel the running and waiting ones at the next round
        (their clients get what was generated, then the end of the answer)."""
        with self._lock:
            self._stopping = True
            self._lock.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """shutdown(), then wait for the thread to end and release the contexts
        (with a prompt cache folder, the conversations cached go there first)."""
        self.shutdown()
        self._thread.join(timeout)
        self._after.shutdown(wait=True)
        if self.saved is not None and not self._thread.is_alive() and self.error is None:
            self._session.release_cache()  # every slot's cache into the prompt cache, then to disk
            self.saved.save()
        self._session.close()

    # -------------------------------------------------------------- the thread
    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._stopping and not self._waiting and not self._running:
                        self._lock.wait()
                    if self._stopping:
                        for job in list(self._waiting) + self._running:
                            job.cancel()
                    stopping = self._stopping
                    self._admit()
                for job in self._running:
                    if job.cancelled:
                        for c in job.choices:
                            if not c.done:
                                self._session.cancel(c.handle)
                self._session.step()
                self._deliver()
                if stopping and not self._running and not self._waiting:
                    return
        except BaseException as e:  # a broken engine: every client hears of it
            self.error = e
            err = EngineFailed(f"the engine failed: {e}")
            with self._lock:
                self._stopping = True
                for job in list(self._waiting) + self._running:
                    job.ended = True
                    job.send(("error", err))
                self._waiting.clear()
                self._running.clear()

    def _next_waiting(self) -> Optional[Job]:
        """The job to admit next: the first cancelled or real one; a warm-up only
        while no real job runs or waits, so that it never delays one (lock held)."""
        warm = None
        for job in self._waiting:
            if job.cancelled or not job.warm_up:
                return job
            warm = warm or job
        return None if any(not j.warm_up for j in self._running) else warm

    def _admit(self) -> None:
        """Waiting jobs join the batch in order while their choices all fit (lock held)."""
        while self._waiting:
            job = self._next_waiting()
            if job is None:
                return
            if job.cancelled:
                self._waiting.remove(job)
                self._abandoned(job)
                job.ended = True
                job.send(("error", JobCancelled("cancelled")))
                continue
            if job.need > self._n_free or job.need > self._session.free_slots:
                return
            self._waiting.remove(job)
            job.admitted = time.monotonic()
            try:
                self._start(job)
            # The engine refused it (e.g. a context overflow) or the core took none of a
            # setting (a TypeError, an OverflowError): this job's error, not the engine's
            # failure. Anything else is a bug: it stops the engine, logged (docs/promises.md).
            except (ValueError, RuntimeError, TypeError, OverflowError) as e:
                job.send(("error", JobRefused(str(e))))
                job.cancel()  # choices already added end at the next round and free their slots
                if not job.choices:
                    job.ended = True
                    continue
            self._running.append(job)

    def _start(self, job: Job) -> None:
        first = job.requests[0]
        base = first.seed if first.seed is not None else self.target.next_seed()
        if self.memories is not None and self.decoder.speculative:
            job.memory = self.memories(job.user)  # only now: a refused request evicts nobody's memory
        for p_i, request in enumerate(job.requests):
            if job.memory is not None and request.drafting is not None:  # the user's memory (server/users.py)
                if request.constraint is not None and self._test.escaped_views:  # copies into JSON strings
                    escaped.remember(job.memory, self.target, request.tokens)
                request = dataclasses.replace(request, drafting=dataclasses.replace(request.drafting,
                                                                                    memory=job.memory))
            for j in range(request.n):
                index = p_i * request.n + j
                prompt = list(request.tokens)
                slot = self._pick_slot(prompt)
                c = Choice(index=index, prompt=prompt, seed=_core.sequence_seed(base, index), slot=slot)
                key = self.policies.key(job.user)
                if request.heal:
                    c.unheal = request.unheal()
                if job.editor is not None:
                    c.watch = EditorStops(**job.editor, skip=len(request.heal))
                c.setup = self.decoder.setup(request, seed=base, slots=[slot], drafters="slots",
                                             policy_keys=[key])[0]
                c.handle = self._session.add(prompt, c.setup.params, drafter=c.setup.drafter,
                                             policy=c.setup.policy, stream=index, slot=slot,
                                             chunked=job.supersedable)
                self._busy.add(slot)
                self._n_running += 1
                self.policies.hold(c.handle, key)
                self._by_handle[c.handle] = (job, c)
                job.choices.append(c)
                self.counters["prompt_tokens"] += len(prompt)

    def _pick_slot(self, prompt: List[int]) -> int:
        if self._test.slot_choice == "lowest":  # TEST-ONLY: the prompt-cache test's control
            return min(set(range(self.target.n_seq_max)) - self._busy)
        return self._session.pick_slot(prompt)

    def _on_token(self, handle: int, token: int, text: bytes, drafted: bool) -> bool:
        job, c = self._by_handle[handle]
        if token >= 0:
            c.tokens.append(token)
        if text:
            c.text.append(text)
            # The editor's rules judge what the user would see (EditorStops.skip: the healed text).
            if c.watch is not None and not c.watch.feed(text.decode("utf-8", errors="ignore")):
                return False
        return not job.cancelled

    def _deliver(self) -> None:
        finished = dict(self._session.take_finished())
        for handle, (job, c) in list(self._by_handle.items()):
            result = finished.get(handle)
            if c.tokens or c.text:
                logprobs = None
                if job.requests[0].logprobs is not None and c.tokens:
                    logprobs = (result.logprobs[c.delivered:] if result is not None
                                else self._session.logprobs(handle, c.delivered))
                text = b"".join(c.text).decode("utf-8", errors="replace")
                job.send(("delta", c.index, c.unheal(text) if c.unheal is not None else text,
                          list(c.tokens), logprobs))
                c.delivered += len(c.tokens)
                self.counters["generated_tokens"] += len(c.tokens)
                c.tokens.clear()
                c.text.clear()
            if result is not None:
                c.done = True
                del self._by_handle[handle]
                st = result.stats
                self.counters["draft_tokens"] += st.drafted
                self.counters["draft_accepted"] += st.accepted
                if st.drafted:
                    self.counters["drafts"] += st.drafted_at[0]  # every draft has a first token
                    self.positions.add(st.drafted_at, st.accepted_at)
                self.policies.release(handle)
                self._release(c)
                if job.why:  # what the abandoned work cost: its prompt's new tokens and its answer's
                    self.counters["abandoned_tokens"] += st.n_prompt_decoded + st.n_generated
                writes = self.decoder.record(c.setup, st, defer=True)
                if writes is not None:
                    self._after.submit(writes).add_done_callback(_said_if_failed)
                if job.memory is not None:
                    self._after.submit(job.memory.add, c.prompt + list(result.tokens)).add_done_callback(
                        _said_if_failed)
                last = all(x.done for x in job.choices)
                if last:
                    job.ended = True  # before its last event: the client may send its next request at once
                job.send(("done", c.index, result, c.seed))
                if last:
                    with self._lock:
                        self._end(job)
                        self._running.remove(job)
                    self._abandoned(job)
        bs = self._session.stats
        self.counters["rounds"], self.counters["batch_rows"] = bs.rounds, bs.rows
        self.counters["prompt_tokens_cached"] = bs.cached_tokens
        self.counters["cache_evictions"] = bs.cache_evictions
        self.kv_cells = self._session.kv_cells
        self._cached_slots = self._session.cached_slots

    def _end(self, job: Job) -> None:
        for c in job.choices:
            self._release(c)
        job.ended = True

    def _abandoned(self, job: Job) -> None:
        """Count a job its client gave up (left, or sent a newer one) and the
        time it held the batch for nothing (/metrics: abandoned_*)."""
        if not job.why:
            return
        self.counters["requests_abandoned"] += 1
        self.counters["requests_superseded"] += job.why == "superseded"
        if job.admitted:
            self.counters["abandoned_seconds"] += time.monotonic() - job.admitted

    def _release(self, c: Choice) -> None:
        """c's slot is free again (its cache stays: the next turn finds it)."""
        if c.slot >= 0:
            self._busy.discard(c.slot)
            self._n_running -= 1
            c.slot = -1
