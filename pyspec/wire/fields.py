"""Typed readers of the fields every JSON dialect has (OpenAI's routes,
llama-server's ``/infill``, and the dialects still to come): each reads one
field of a decoded body, refuses a wrong type or range with a 400 that names
it (:class:`~pyspec.server.api_error.APIError`), and hands what it means to
pyspec/request.py's rules (seeds, stop strings). A dialect's own fields and
quirks stay in its module.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple

from .. import fim, request
from ..server.api_error import APIError
from ..settings import SEED_BITS

Body = Dict[str, Any]

#: The names of an answer's length, in the order llama-server reads them
#: (its own first).
MAX_TOKENS_FIELDS = ("n_predict", "max_completion_tokens", "max_tokens")


def type_error(name: str, want: str) -> APIError:
    return APIError(400, f"'{name}' must be {want}", param=name)


def integer(body: Body, name: str, lo: int, hi: Optional[int] = None, default=None) -> Optional[int]:
    """An integer field in [lo, hi] (absent or null: ``default``)."""
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise type_error(name, "an integer")
    if v < lo or (hi is not None and v > hi):
        raise APIError(400, f"'{name}' must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}", param=name)
    return v


def number(body: Body, name: str, lo: float, hi: float, default: float) -> float:
    """A finite number in [lo, hi] (absent or null: ``default``)."""
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise type_error(name, "a number")
    if not lo <= v <= hi:
        raise APIError(400, f"'{name}' must be in [{lo}, {hi}], got {v}", param=name)
    return float(v)


def flag(body: Body, name: str, default: Optional[bool] = None) -> Optional[bool]:
    """A boolean field (absent or null: ``default``)."""
    v = body.get(name)
    if v is not None and not isinstance(v, bool):
        raise type_error(name, "a boolean")
    return default if v is None else v


def choice(body: Body, name: str, allowed: Sequence[str]) -> Optional[str]:
    """One of ``allowed`` (absent or null: None)."""
    v = body.get(name)
    if v is None:
        return None
    if v not in allowed:
        raise APIError(400, f"'{name}' must be one of {', '.join(allowed)}; got {v!r}", param=name)
    return v


def stop(body: Body) -> Tuple[str, ...]:
    """``stop``: a string or a list of strings; empty ones are dropped (request.stops_of)."""
    v = body.get("stop")
    if v is not None and not (isinstance(v, str) or isinstance(v, list) and all(isinstance(s, str) for s in v)):
        raise type_error("stop", "a string or a list of strings")
    return request.stops_of(v)


def seed(body: Body) -> Optional[int]:
    """``seed``: an integer in [0, 2**63), or -1 / 4294967295 (llama.cpp's
    default) for a fresh one, as None (request.seed_of)."""
    v = body.get("seed")
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and v in request.FRESH_SEEDS):
        return None
    return integer(body, "seed", 0, 2**SEED_BITS - 1)


def max_tokens(body: Body, default: Optional[int], unlimited: Sequence[str] = ("n_predict",)) -> Optional[int]:
    """The answer's length: the first of :data:`MAX_TOKENS_FIELDS` given
    (``default`` when none is); None runs to the end of the context. -1 says
    so in the fields named ``unlimited`` (llama-server's); elsewhere the
    least is 0 (OpenAI's)."""
    for name in MAX_TOKENS_FIELDS:
        if body.get(name) is not None:
            n = integer(body, name, -1 if name in unlimited else 0)
            return None if n < 0 else n
    return default


def draft_max(body: Body, cap: int) -> Optional[int]:
    """``draft_max`` (pyspec's): a draft length cap in [0, ``cap``]."""
    return integer(body, "draft_max", 0, cap)


def fim_prompt(build) -> "fim.InfillPrompt":
    """``build()``'s FIM prompt: a 501 for a model without FIM tokens (as
    llama-server answers), a 400 for a healing that cannot be."""
    try:
        return build()
    except fim.FimUnsupported as e:
        raise APIError(501, str(e), type="not_supported_error") from None
    except request.RequestError as e:
        raise APIError(400, str(e), param=e.param) from None


def function_tools(value: Any, keep, schema_key: str) -> Optional[list]:
    """A dialect's ``tools`` as OpenAI's function tools: those ``keep(tool)``
    says the model calls (the rest, tools the provider runs itself, are
    skipped, as llama-server skips them), each with its schema under
    ``schema_key``; keys in llama-server's order (name, description,
    parameters), as templates print them with tojson. None for none."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise type_error("tools", "a list of tools")
    out = []
    for i, t in enumerate(value):
        if not isinstance(t, dict):
            raise APIError(400, f"tools[{i}] must be an object", param="tools")
        if not keep(t):
            continue
        schema = t.get(schema_key) or {"type": "object", "properties": {}}
        if not isinstance(schema, dict):
            raise APIError(400, f"tools[{i}].{schema_key} must be a JSON schema object", param="tools")
        fn = {"name": t.get("name"), **({"description": t["description"]} if t.get("description") is not None
                                        else {}), "parameters": schema}
        out.append({"type": "function", "function": fn})
    return out or None
