"""llama-server's own request fields, where pyspec's routes meet its clients
(llama.vim and llama.vscode send them to ``/infill`` and to
``/v1/chat/completions``): the ``samplers`` chain, which decides which of the
sampling fields act, and ``response_fields``, which picks flat ``"a/b"`` keys
out of an answer. One owner, so that both routes read them alike.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..sampling import Sampling
from ..server.api_error import APIError
from .fields import integer, number

#: llama-server's sampling defaults (common_params_sampling).
DEFAULTS = Sampling(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
#: Its default chain. The names a chain may hold besides the ones applied, each
#: with the body fields that leave it off: a chain naming one whose fields are
#: not neutral is refused.
DEFAULT_CHAIN = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
NEUTRAL_SAMPLERS = {
    "dry": {"dry_multiplier": (0, 0.0)},
    "top_n_sigma": {"top_n_sigma": (-1, -1.0)},
    "typ_p": {"typical_p": (1, 1.0), "typ_p": (1, 1.0)},
    "xtc": {"xtc_probability": (0, 0.0)},
}
#: The samplers pyspec applies (in its own order: cpp/core/sampling.h).
APPLIED = ("penalties", "top_k", "top_p", "min_p", "infill", "temperature")
#: The penalties' fields (OpenAI's two, llama-server's two more) and their neutral values.
PENALTY_FIELDS = {"repeat_penalty": (1, 1.0), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
                  "repeat_last_n": ()}
_ACCEPTED = set(APPLIED)
_CHAR_NAMES = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
               "m": "min_p", "x": "xtc", "t": "temperature", "i": "infill"}


def samplers(body: Dict[str, Any], default: Optional[List[str]] = None) -> Optional[List[str]]:
    """The body's chain (names, or llama.cpp's one-letter string), checked;
    ``default`` when it has none."""
    chain = body.get("samplers", default)
    if chain is None:
        return None
    if isinstance(chain, str):
        chain = [_CHAR_NAMES.get(ch, ch) for ch in chain]
    if not isinstance(chain, list) or not all(isinstance(x, str) for x in chain):
        raise APIError(400, "'samplers' must be a list of sampler names", param="samplers")
    for name in chain:
        if name not in _ACCEPTED and name not in NEUTRAL_SAMPLERS:
            raise APIError(400, f"unsupported sampler '{name}' (pyspec serve applies {', '.join(APPLIED)})",
                           param="samplers")
    for name, fields in NEUTRAL_SAMPLERS.items():
        for key, neutral in fields.items():
            if key in body and body[key] not in neutral and name in chain:
                raise APIError(400, f"unsupported parameter '{key}' with this value (pyspec serve does not "
                                    f"implement it)", param=key)
    if "penalties" not in chain:  # llama-server would ignore them: say so rather than drop them
        for key, neutral in PENALTY_FIELDS.items():
            if neutral and body.get(key) not in neutral + (None,):
                raise APIError(400, f"'{key}' needs \"penalties\" in 'samplers'", param=key)
    return chain


def penalties(body: Dict[str, Any], chain: Optional[List[str]]) -> Dict[str, Any]:
    """:class:`~pyspec.Sampling`'s bias and penalty fields from a body:
    OpenAI's ``frequency_penalty``, ``presence_penalty`` and ``logit_bias``,
    llama-server's ``repeat_penalty`` and ``repeat_last_n`` (its window, 64
    tokens, the prompt's included). A chain without ``penalties`` leaves them
    off; ``logit_bias`` is not a step of the chain there, so it always acts."""
    out: Dict[str, Any] = {"logit_bias": logit_bias(body)}
    if chain is not None and "penalties" not in chain:
        return out
    # From 0.01: a logit divided by much less overflows to +inf, which no row survives.
    repeat = number(body, "repeat_penalty", 0.01, 100.0, 1.0)
    out.update(repeat_penalty=repeat,
               frequency_penalty=number(body, "frequency_penalty", -2.0, 2.0, 0.0),
               presence_penalty=number(body, "presence_penalty", -2.0, 2.0, 0.0),
               penalty_last_n=integer(body, "repeat_last_n", -1, default=64))
    return out


#: Most tokens one request may bias (OpenAI allows 300).
MAX_LOGIT_BIAS = 1024


def logit_bias(body: Dict[str, Any]) -> Dict[int, float]:
    """``logit_bias`` as OpenAI sends it ({"token id": bias}) or as
    llama-server also takes it ([[token id, bias], ...]); a bias of ``false``
    forbids the token (llama-server's). Keys are token ids: text keys, which
    llama-server tokenizes, are refused with a clear error."""
    given = body.get("logit_bias")
    if given is None:
        return {}
    if isinstance(given, dict):
        items = list(given.items())
    elif isinstance(given, list) and all(isinstance(x, list) and len(x) == 2 for x in given):
        items = [tuple(x) for x in given]
    else:
        raise APIError(400, "'logit_bias' must map token ids to biases", param="logit_bias")
    if len(items) > MAX_LOGIT_BIAS:  # so that no request can forbid a whole vocabulary
        raise APIError(400, f"'logit_bias' holds {len(items)} tokens; at most {MAX_LOGIT_BIAS}", param="logit_bias")
    out: Dict[int, float] = {}
    for key, bias in items:
        try:
            token = int(key) if not isinstance(key, (bool, float)) else None
        except ValueError:
            token = None
        if token is None or token < 0:
            raise APIError(400, f"'logit_bias' keys must be token ids, got {key!r} (pyspec serve does not tokenize "
                                f"them: /tokenize gives the ids)", param="logit_bias")
        if bias is False:
            out[token] = float("-inf")
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise APIError(400, f"'logit_bias' for token {token} must be a number in [-100, 100] (OpenAI's range) "
                                f"or false (forbidden)", param="logit_bias")
        else:
            out[token] = float(bias)
    return out


def chain_sampling(body: Dict[str, Any], chain: List[str], defaults: Sampling) -> Sampling:
    """The sampling a chain asks for: each applied sampler's field (``defaults``
    where the body has none), the others off; no ``temperature`` in the chain
    samples at temperature 1, as llama-server's final draw does; ``infill``
    needs top-k (1..256) and its place in pyspec's order (after the
    truncations, before temperature)."""
    sampling = Sampling(
        temperature=number(body, "temperature", 0.0, 100.0, defaults.temperature) if "temperature" in chain else 1.0,
        top_k=integer(body, "top_k", 0, default=defaults.top_k) if "top_k" in chain else 0,
        top_p=number(body, "top_p", 0.0, 1.0, defaults.top_p) if "top_p" in chain else 1.0,
        min_p=number(body, "min_p", 0.0, 1.0, defaults.min_p) if "min_p" in chain else 0.0,
        infill="infill" in chain,
        **penalties(body, chain),
    )
    if sampling.top_p == 0:
        raise APIError(400, "'top_p' must be > 0", param="top_p")
    if sampling.infill:
        if not 1 <= sampling.top_k <= 256:
            raise APIError(400, "the 'infill' sampler needs 'top_k' in 1..256 in the chain (editor plugins send "
                                f"40), got {sampling.top_k}", param="top_k")
        at = chain.index("infill")
        if any(name in chain[at:] for name in ("top_k", "top_p", "min_p")) or "temperature" in chain[:at]:
            raise APIError(400, "pyspec applies 'infill' after top_k, top_p and min_p and before temperature "
                                "(editor plugins' order); this chain puts it elsewhere", param="samplers")
    return sampling


def response_fields(body: Dict[str, Any]) -> Optional[List[str]]:
    fields = body.get("response_fields")
    if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
        raise APIError(400, "'response_fields' must be a list of strings", param="response_fields")
    return fields


def pick(obj: Dict[str, Any], paths: Optional[List[str]]) -> Dict[str, Any]:
    """llama-server's response_fields: each path ("a/b" walks into objects) as a
    flat key, paths that lead nowhere left out (None: the whole object)."""
    if paths is None:
        return obj
    out = {}
    for path in paths:
        node: Any = obj
        for part in path.split("/"):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            out[path] = node
    return out
