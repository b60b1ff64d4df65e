"""Editors' stale requests: a client's newest fill-in-the-middle request wins
(``/infill``, ``/v1/completions`` with a ``suffix``, ollama's ``/api/generate``
with one, streamed or sent with an ``X-Client-Id``: :func:`editor_like`), per
route.

An editor plugin sends a request per keystroke, and llama.vim also sends a
warm-up of its ring of chunks every second while the user pauses (``n_predict:
0``, or in older versions a request with only ``input_extra``: both are
warm-ups, wire/llama_server.py). Once the user
has typed past a request its answer is thrown away, but on a 2-core machine
it still holds the engine, and the requests queue behind each other (issue
61: 6 s per ``/infill`` with the plugin's own traffic). llama.vim cancels by
killing curl, which closes the connection (answer.py notices within half a
second); other clients just send the next request. So here:

- a new real request cancels the same client's older ones, queued or running,
  warm-ups included (it caches everything a warm-up would);
- a new warm-up cancels only the client's older warm-ups: it never stops a real
  request.

A client is the peer's address with its API key, ``User-Agent`` and
``X-Client-Id`` header, on one route: two editors on one machine that send the same headers
set different ids to keep each other's requests (docs/editor.md). The
registry lives on the event loop's thread (no lock); the scheduler counts
what cancelled jobs had cost (server/metrics.py: ``requests_superseded``,
``abandoned_*``).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from starlette.requests import Request

from .jobs import Job

Client = Tuple[str, str, str, str, str]


def editor_like(parsed, request: Request) -> bool:
    """Whether a request to a general route (``/v1/completions``, ollama's
    ``/api/generate``) is an editor's, whose older ones it makes stale: one
    with a suffix, streamed (a suggestion shows as it comes) or sent with an
    ``X-Client-Id``. A script's parallel fill-in-the-middle requests, not
    streamed, are never cut short by each other."""
    return parsed.suffix is not None and (bool(parsed.stream) or "x-client-id" in request.headers)


def client_of(request: Request) -> Client:
    """Who sent ``request``, as far as stale requests go (module docstring)."""
    h = request.headers
    host = request.client.host if request.client is not None else ""
    return host, h.get("authorization", ""), h.get("user-agent", ""), h.get("x-client-id", ""), request.url.path


class NewestWins:
    """Each client's live editor jobs, and the rule that cancels the stale ones."""

    def __init__(self) -> None:
        self._live: Dict[Client, List[Tuple[Job, bool]]] = {}

    def claim(self, client: Client, job: Job, warm_up: bool) -> int:
        """``job`` is the client's newest: cancel what it makes stale (module
        docstring) and keep it. Returns how many jobs were cancelled."""
        for key in [k for k, jobs in self._live.items() if not any(_alive(j) for j, _ in jobs)]:
            del self._live[key]  # clients whose jobs have all ended
        live = [(j, w) for j, w in self._live.get(client, []) if _alive(j)]
        stale = [j for j, w in live if w or not warm_up]
        for j in stale:
            j.cancel("superseded")
        self._live[client] = [(j, w) for j, w in live if j not in stale] + [(job, warm_up)]
        return len(stale)

    def join(self, client: Client, job: Job) -> None:
        """A warm-up that goes with the client's newest (warm_ups.py): it cancels
        nothing, and what would cancel a warm-up of the client's cancels it."""
        self._live.setdefault(client, []).append((job, True))


def _alive(job: Job) -> bool:
    return not (job.cancelled or job.ended)
