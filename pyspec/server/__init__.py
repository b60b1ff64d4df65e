"""``pyspec serve``: an OpenAI-compatible HTTP server with continuous batching
and lossless speculative decoding (needs the ``server`` extra).

- :mod:`.protocol`: the OpenAI wire format of requests (validation, APIError);
  :mod:`.responses`: that of responses (usage, timings, logprobs objects).
- :mod:`.intake`: a request's checks before it becomes a job (API key, body,
  tokens and context, the constraint compiled).
- :mod:`.jobs`: a request as the scheduler sees it (Job, Choice, the refusals).
- :mod:`.scheduler`: admission and slot choice: one thread that owns the llama
  contexts and runs the batch.
- :mod:`.users`: per-user state (draft memories, length policies);
  :mod:`.saved`: saved conversations (the --cache-dir folder).
- :mod:`.answer`: a job's events as a JSON response or an SSE stream, and the
  HTTP status of every refusal.
- :mod:`.app`: create_app and the routes; :mod:`.metrics`: Prometheus' /metrics;
  :mod:`.supervisor`: ``serve --rpc``'s supervising process.
"""

from __future__ import annotations

__all__ = ["create_app"]


def create_app(*args, **kwargs):
    """See :func:`pyspec.server.app.create_app` (imported lazily: the extra is optional)."""
    from .app import create_app as make

    return make(*args, **kwargs)
