"""``pyspec serve``: an OpenAI-compatible HTTP server with continuous batching
and lossless speculative decoding (needs the ``server`` extra).

- Requests are read by their dialect's module in :mod:`pyspec.wire`
  (``openai``, ``llama_server``, ``anthropic``, ``openai_responses``, ``ollama``); :mod:`.api_error`: the refusal (APIError);
  :mod:`.responses`: the shape of responses (usage, timings, logprobs objects).
- :mod:`.intake`: a request's checks before it becomes a job (API key, body,
  tokens, the constraint compiled, one pyspec.request.Request per prompt).
- :mod:`.jobs`: a request as the scheduler sees it (Job, Choice, the refusals).
- :mod:`.scheduler`: admission and slot choice: one thread that owns the llama
  contexts and runs the batch.
- :mod:`.users`: per-user state (draft memories, length policies);
  :mod:`.saved`: saved conversations (the --cache-dir folder).
- :mod:`.answer`: a job's events as a JSON response or an SSE stream, and the
  HTTP status of every refusal.
- :mod:`.doors`: the other dialects' routes (Anthropic Messages, OpenAI
  Responses, ollama, llama-server's own), each read into OpenAI's body by its
  adapter in :mod:`pyspec.wire`; :mod:`.turn`: one answer as the parts they write.
- :mod:`.app`: create_app and the routes; :mod:`.metrics`: Prometheus' /metrics;
  :mod:`.supervisor`: ``serve --rpc``'s supervising process.
"""

from __future__ import annotations

__all__ = ["create_app"]


def create_app(*args, **kwargs):
    """See :func:`pyspec.server.app.create_app` (imported lazily: the extra is optional)."""
    from .app import create_app as make

    return make(*args, **kwargs)
