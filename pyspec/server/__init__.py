"""``pyspec serve``: an OpenAI-compatible HTTP server with continuous batching
and lossless speculative decoding (needs the ``server`` extra).

- :mod:`.protocol`: the OpenAI wire format (request validation, response shapes).
- :mod:`.scheduler`: one thread that owns the llama contexts and runs the batch.
- :mod:`.app`: the Starlette routes; :mod:`.metrics`: Prometheus' /metrics.
"""

from __future__ import annotations

__all__ = ["create_app"]


def create_app(*args, **kwargs):
    """See :func:`pyspec.server.app.create_app` (imported lazily: the extra is optional)."""
    from .app import create_app as make

    return make(*args, **kwargs)
