"""Continuous batching for the server: one thread owns the llama contexts.

HTTP handlers :meth:`Scheduler.submit` a :class:`Job` (one request: one or more
choices) and read its events from an asyncio queue. The scheduler thread runs
the engine's :class:`~pyspec._core.BatchSession`: between rounds it admits
waiting jobs while sequence slots are free (a job's choices join together, so
the engine prefills their shared prompt once), cancels the sequences of jobs
whose clients left, and after each round hands every choice the text and
log-probabilities it gained. Every running sequence's rows go into the round's
one target decode; new prompts are prefilled in chunks beside them.

Each sequence slot j of the server has its own drafter and length policy (per
drafter name and policy setting, kept across requests: ``auto`` keeps learning);
drafter j drafts in sequence j of the draft model's context, so two running
sequences never share one.
"""

from __future__ import annotations

import bisect

import asyncio
import collections
import itertools
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Deque, Dict, List, Optional, Tuple

from .. import _core
from ..generation import SEED_BITS, SequenceSetup
from .protocol import Sampling

if TYPE_CHECKING:
    from ..memory import Memory

#: Largest draft a request may ask for (draft_max); the session's cap.
MAX_DRAFT = 63


class SchedulerError(Exception):
    """Why the scheduler refused or ended a job (the HTTP layer maps each kind
    to a status: server/app.py)."""


class QueueFull(SchedulerError):
    """Too many jobs already wait for a slot; the client may retry soon."""


class ShuttingDown(SchedulerError):
    """The server is stopping and takes no new jobs."""


class JobRefused(SchedulerError):
    """The engine refused one of the job's sequences (e.g. a context overflow)."""


class JobCancelled(SchedulerError):
    """The job was cancelled (its client left) before it started."""


class EngineFailed(SchedulerError):
    """The engine broke; every job in flight ends with this."""


@dataclass
class Choice:
    """One sequence of a job, as the scheduler thread tracks it."""

    index: int
    prompt: List[int]
    seed: int
    handle: int = -1
    slot: int = -1
    setup: Optional[SequenceSetup] = None
    tokens: List[int] = field(default_factory=list)  # emitted, not yet delivered
    text: List[bytes] = field(default_factory=list)
    delivered: int = 0                                # tokens delivered so far
    done: bool = False


@dataclass
class Job:
    """One HTTP request. Events on ``events`` (from the scheduler thread):
    ("delta", index, text, tokens, logprobs), ("done", index, result, seed),
    ("error", SchedulerError)."""

    sampling: Sampling
    prompts: List[List[int]]          # token ids, one per prompt
    loop: asyncio.AbstractEventLoop
    events: "asyncio.Queue[Tuple]" = field(default_factory=asyncio.Queue)
    choices: List[Choice] = field(default_factory=list)
    cancelled: bool = False
    memory: Optional["Memory"] = None  # the user's: drafts copy from it, answers join it
    admitted: float = 0.0              # time.monotonic() when it left the queue (0: not yet)

    @property
    def need(self) -> int:
        """Sequence slots it takes: one per choice."""
        return len(self.prompts) * self.sampling.n

    def cancel(self) -> None:
        """The client is gone: its sequences end at the next round (thread-safe)."""
        self.cancelled = True


class Scheduler:
    """Owns ``decoder``'s contexts on one thread; see the module docstring."""

    def __init__(self, decoder, *, parallel: int, queue_size: int, prefill_chunk: int = 256, _test=None) -> None:
        self.decoder = decoder
        self.target = decoder.target
        self.parallel = parallel
        self.queue_size = queue_size
        self._lock = threading.Condition()
        self._waiting: Deque[Job] = collections.deque()
        self._running: List[Job] = []
        self._free_slots = list(range(parallel))
        self._by_handle: Dict[int, Tuple[Job, Choice]] = {}
        self._stopping = False
        self._seeds = itertools.count()
        self.error: Optional[BaseException] = None
        # Figures for /health and /metrics (written by the scheduler thread).
        self.counters = collections.Counter()
        self.drafted_per_pos = [0] * MAX_DRAFT   # draft tokens verified at each draft position (0: the first)
        self.accepted_per_pos = [0] * MAX_DRAFT  # ... and accepted there
        self.kv_cells = (0, 0)
        # _test: TEST-ONLY negative controls (a wrong acceptance rule), for the server's lossless test.
        self._session = decoder.open_session(self._on_token, prefill_chunk=prefill_chunk, draft_cap=MAX_DRAFT,
                                             _test=_test)
        self._thread = threading.Thread(target=self._run, name="pyspec-scheduler", daemon=True)
        self._thread.start()

    # -------------------------------------------------------------- handlers' side
    @property
    def queue_depth(self) -> int:
        """Requests waiting for slots (not those the next round admits)."""
        with self._lock:
            return self._queued()

    def _queued(self) -> int:
        """Waiting jobs that the free slots cannot take in order (lock held)."""
        free, queued = len(self._free_slots), 0
        for job in self._waiting:
            if queued or job.need > free:
                queued += 1
            else:
                free -= job.need
        return queued

    def _unclaimed(self) -> int:
        """Free slots that no waiting job will take (lock held)."""
        return len(self._free_slots) - sum(j.need for j in self._waiting)

    @property
    def busy_slots(self) -> int:
        return self.parallel - len(self._free_slots)

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
        """shutdown(), then wait for the thread to end and release the contexts."""
        self.shutdown()
        self._thread.join(timeout)
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
                    self._send(job, ("error", err))
                self._waiting.clear()
                self._running.clear()

    def _admit(self) -> None:
        """Waiting jobs join the batch in order while their choices all fit (lock held)."""
        while self._waiting:
            job = self._waiting[0]
            if job.cancelled:
                self._waiting.popleft()
                self._send(job, ("error", JobCancelled("cancelled")))
                continue
            if job.need > len(self._free_slots) or job.need > self._session.free_slots:
                return
            self._waiting.popleft()
            job.admitted = time.monotonic()
            try:
                self._start(job)
            # The engine refused it (e.g. a context overflow) or the core took none of a
            # setting (a TypeError, an OverflowError): this job's error, not the engine's
            # failure. Anything else is a bug: it stops the engine, logged (docs/promises.md).
            except (ValueError, RuntimeError, TypeError, OverflowError) as e:
                self._send(job, ("error", JobRefused(str(e))))
                job.cancel()  # choices already added end at the next round and free their slots
                if not job.choices:
                    continue
            self._running.append(job)

    def _start(self, job: Job) -> None:
        s = job.sampling
        base = s.seed if s.seed is not None else secrets.randbits(SEED_BITS)
        # Drafting settings only where the decoder drafts (a plain server ignores them).
        drafting = (dict(drafter=s.drafter, policy=s.policy, draft_max=s.draft_max, memory=job.memory)
                    if self.decoder.speculative else {})
        for p_i, prompt in enumerate(job.prompts):
            for j in range(s.n):
                index = p_i * s.n + j
                # The lowest free slot: one client's requests keep one slot, whose
                # policy goes on learning (and whose draft sequence keeps the chat).
                c = Choice(index=index, prompt=prompt, seed=_core.sequence_seed(base, index),
                           slot=self._free_slots.pop(0))
                try:
                    # No answer outgrows the context, and a top_k past the vocabulary keeps it
                    # all: clamped, since the core's ints are 32-bit (protocol.py bounds neither).
                    n_ctx = self.target.n_ctx
                    c.setup = self.decoder.setup(
                        max_tokens=n_ctx if s.max_tokens is None else min(s.max_tokens, n_ctx),
                        temperature=s.temperature, top_k=min(s.top_k, self.target.n_vocab), top_p=s.top_p,
                        min_p=s.min_p, seed=base,
                        stop=s.stop, logprobs=s.logprobs, slots=[c.slot], drafters="slots", **drafting)[0]
                    c.handle = self._session.add(prompt, c.setup.params, drafter=c.setup.drafter,
                                                 policy=c.setup.policy, stream=index)
                except BaseException:  # refused: its slot goes back (the choices added before run on)
                    bisect.insort(self._free_slots, c.slot)
                    raise
                self._by_handle[c.handle] = (job, c)
                job.choices.append(c)
                self.counters["prompt_tokens"] += len(prompt)

    def _on_token(self, handle: int, token: int, text: bytes, drafted: bool) -> bool:
        job, c = self._by_handle[handle]
        if token >= 0:
            c.tokens.append(token)
        if text:
            c.text.append(text)
        return not job.cancelled

    def _deliver(self) -> None:
        finished = dict(self._session.take_finished())
        for handle, (job, c) in list(self._by_handle.items()):
            result = finished.get(handle)
            if c.tokens or c.text:
                logprobs = None
                if job.sampling.logprobs is not None and c.tokens:
                    logprobs = (result.logprobs[c.delivered:] if result is not None
                                else self._session.logprobs(handle, c.delivered))
                self._send(job, ("delta", c.index, b"".join(c.text).decode("utf-8", errors="replace"),
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
                    self._count_positions(st.drafted_at, st.accepted_at)
                self.decoder.record(c.setup, st)
                if job.memory is not None:
                    job.memory.add(c.prompt + list(result.tokens))
                self._send(job, ("done", c.index, result, c.seed))
                if all(x.done for x in job.choices):
                    with self._lock:
                        self._end(job)
                        self._running.remove(job)
        bs = self._session.stats
        self.counters["rounds"], self.counters["batch_rows"] = bs.rounds, bs.rows
        self.kv_cells = self._session.kv_cells

    def _count_positions(self, drafted_at: List[int], accepted_at: List[int]) -> None:
        """A finished sequence's drafts, by draft position (for /metrics)."""
        self.counters["drafts"] += drafted_at[0]  # every draft has a first token
        drafted, accepted = self.drafted_per_pos, self.accepted_per_pos
        for i, n in enumerate(drafted_at):
            if not n:  # no draft reached this far (nor further)
                break
            if i == len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[i] += n
            accepted[i] += accepted_at[i]

    def _end(self, job: Job) -> None:
        for c in job.choices:
            if c.slot >= 0:
                bisect.insort(self._free_slots, c.slot)
                c.slot = -1

    @staticmethod
    def _send(job: Job, event: Tuple) -> None:
        try:
            job.loop.call_soon_threadsafe(job.events.put_nowait, event)
        except RuntimeError:  # the client's event loop is closed: nobody listens
            pass
