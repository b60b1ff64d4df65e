"""ollama's API (``/api/chat``, ``/api/generate``, ``/api/show`` ...), the
dialect of Copilot Chat's and Continue's ollama providers, Zed and Open WebUI:
bodies read into OpenAI's chat or completion body (:func:`chat_body`,
:func:`generate_body`, then wire/openai.py's one parse), answers written as
ollama's JSON objects (one, or NDJSON lines ending with ``done: true``).

``options`` map to sampling: ``temperature``, ``top_k``, ``top_p``, ``min_p``,
``num_predict`` (-1, -2: until the context ends), ``stop``, ``seed``,
``repeat_penalty``, ``repeat_last_n``, ``presence_penalty``,
``frequency_penalty``, with ollama's defaults where absent (temperature 0.8,
top_k 40, top_p 0.9, repeat_penalty 1.1 over 64 tokens). Options that place
or size the model (``num_ctx``, ``num_gpu``, ``num_thread`` ...) are the
server's to decide (``pyspec serve --n-ctx`` ...) and are checked for type
only; ``mirostat``, ``tfs_z`` and ``typical_p`` away from neutral are a 400.
``/api/generate`` with ``suffix`` is a fill-in-the-middle request (pyspec's FIM
path, as ``/infill``); without ``raw`` its prompt is templated as one user turn.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Tuple

from ..server.api_error import APIError
from . import fields

#: The version /api/version reports: clients gate features on it (Copilot Chat wants >= 0.6.4).
VERSION = "0.13.0"
#: ollama's sampling defaults (its api/types.go DefaultOptions).
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.1,
            "repeat_last_n": 64}
_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed", "stop", "repeat_penalty", "repeat_last_n",
             "presence_penalty", "frequency_penalty")
_NEUTRAL = {"mirostat": (0,), "tfs_z": (1, 1.0), "typical_p": (1, 1.0)}
_RUNTIME = {"num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "vocab_only", "use_mmap",
            "use_mlock", "num_thread", "numa", "num_keep", "penalize_newline", "mirostat_eta", "mirostat_tau"}
_CHAT_FIELDS = {"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think"}
_GENERATE_FIELDS = {"model", "prompt", "suffix", "system", "template", "context", "raw", "format", "options",
                    "stream", "keep_alive", "images", "think"}
PARAMS = {"n_predict": "options.num_predict", "temperature": "options.temperature", "top_k": "options.top_k",
          "top_p": "options.top_p", "min_p": "options.min_p", "stop": "options.stop", "seed": "options.seed",
          "repeat_penalty": "options.repeat_penalty", "repeat_last_n": "options.repeat_last_n",
          "response_format": "format", "prompt": "prompt", "suffix": "suffix"}


def _check(body: Any, allowed: set) -> Dict[str, Any]:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name in sorted(body):
        if name not in allowed:
            raise APIError(400, f"unsupported field '{name}' (pyspec serve does not implement it)", param=name)
    return body


def _options(body: Dict[str, Any], out: Dict[str, Any]) -> None:
    """``options`` into the OpenAI body's sampling fields (ollama's defaults where absent)."""
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise fields.type_error("options", "an object")
    for name in options:
        if name in _NEUTRAL:
            if options[name] not in _NEUTRAL[name]:
                raise APIError(400, f"options.{name} is not supported (pyspec serve does not implement it)",
                               param=f"options.{name}")
        elif name not in _SAMPLING and name not in _RUNTIME and name != "num_predict":
            raise APIError(400, f"unknown option '{name}'", param=f"options.{name}")
    fields.integer(options, "num_ctx", 1)
    out.update(DEFAULTS)
    out.update({k: options[k] for k in _SAMPLING if options.get(k) is not None})
    n = fields.integer(options, "num_predict", -2)
    if n is not None:
        out["n_predict"] = -1 if n < 0 else n
    out["stream"] = fields.flag(body, "stream", True)  # ollama streams unless told not to


def _format(value: Any) -> Optional[Dict[str, Any]]:
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}
    raise APIError(400, "'format' must be \"json\" or a JSON schema object", param="format")


def _no_images(m: Dict[str, Any], where: str) -> None:
    if m.get("images"):
        raise APIError(400, f"{where}: images are not supported (pyspec serves text-only models)", param="images")


def _messages(value: Any) -> List[Dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise fields.type_error("messages", "a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"{where} must be an object with a 'role'", param="messages")
        _no_images(m, where)
        msg: Dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if not isinstance(msg["content"], str):
            raise APIError(400, f"{where}.content must be a string", param="messages")
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                      for c in calls):
                raise APIError(400, f"{where}.tool_calls must be a list of {{\"function\": {{...}}}}",
                               param="messages")
            msg["tool_calls"] = [{"id": f"call_{i}_{j}", "type": "function",
                                  "function": {"name": c["function"].get("name"),
                                               "arguments": json.dumps(c["function"].get("arguments") or {})}}
                                 for j, c in enumerate(calls)]
        if m.get("tool_name") is not None:
            msg["name"] = m["tool_name"]
        out.append(msg)
    return out


def chat_body(body: Any) -> Dict[str, Any]:
    """The OpenAI chat body of an ``/api/chat`` body."""
    _check(body, _CHAT_FIELDS)
    chat: Dict[str, Any] = {"model": body.get("model"), "messages": _messages(body.get("messages"))}
    if body.get("tools"):
        chat["tools"] = body["tools"]
    fmt = _format(body.get("format"))
    if fmt is not None:
        chat["response_format"] = fmt
    _options(body, chat)
    return chat


def generate_body(body: Any) -> Optional[Tuple[str, Dict[str, Any]]]:
    """The kind ("chat" or "completion") and OpenAI body of an ``/api/generate``
    body: a chat turn, a raw completion, or a fill-in-the-middle completion
    (``suffix``); None for a request with no prompt (ollama loads the model then)."""
    _check(body, _GENERATE_FIELDS)
    _no_images(body, "images")
    if body.get("template"):
        raise APIError(400, "'template' is not supported: pyspec renders the GGUF's own chat template (give "
                            "'raw': true for a prompt of your own)", param="template")
    if body.get("context"):  # ollama's deprecated way to continue; pyspec's answers do not return one
        raise APIError(400, "'context' is not supported: send the conversation to /api/chat (its prompt cache "
                            "prefills only the new turn)", param="context")
    prompt, suffix, system = body.get("prompt") or "", body.get("suffix") or "", body.get("system")
    for name, v in (("prompt", prompt), ("suffix", suffix), ("system", system)):
        if v is not None and not isinstance(v, str):
            raise fields.type_error(name, "a string")
    if not prompt and not suffix:
        return None
    out: Dict[str, Any] = {"model": body.get("model")}
    kind = "completion"
    if suffix:
        out.update(prompt=prompt, suffix=suffix)
    elif fields.flag(body, "raw", False):
        out.update(prompt=prompt)
    else:
        kind = "chat"
        out["messages"] = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": prompt}]
    fmt = _format(body.get("format"))
    if fmt is not None:
        out["response_format"] = fmt
    _options(body, out)
    if kind == "completion" and "n_predict" not in out:
        out["n_predict"] = -1  # ollama's default: no limit (a completion's would be OpenAI's 16)
    return kind, out


# ------------------------------------------------------------------ answers

def created_at() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def figures(end, arrival: float) -> Dict[str, Any]:
    """The final object's counts and durations (nanoseconds): prompt tokens
    processed (the cached ones are not), answer tokens, and their times."""
    st = end.stats
    return {"done_reason": "length" if end.finish == "length" else "stop", "done": True,
            "total_duration": int((time.monotonic() - arrival) * 1e9), "load_duration": 0,
            "prompt_eval_count": end.n_prompt - end.n_cached, "prompt_eval_duration": int(st.ttft_s * 1e9),
            "eval_count": end.n_out, "eval_duration": int(st.decode_s * 1e9)}


def calls_of(calls: List[Any]) -> List[Dict[str, Any]]:
    out = []
    for i, c in enumerate(calls):
        try:
            args = json.loads(c.arguments)
        except ValueError:
            args = {}
        out.append({"function": {"index": i, "name": c.name, "arguments": args if isinstance(args, dict) else {}}})
    return out


def error_body(e: APIError) -> Dict[str, Any]:
    return {"error": e.message}


def details(target) -> Dict[str, Any]:
    """The model's details as ollama lists them (from llama.cpp's description:
    architecture, size, quantization)."""
    words = target.description.split(" ", 2)
    arch = words[0] if words else "unknown"
    quant = words[2] if len(words) > 2 else ""
    for long, short in ((" - Medium", "_M"), (" - Small", "_S"), (" - Large", "_L")):
        quant = quant.replace(long, short)
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
            "parameter_size": words[1] if len(words) > 1 else "", "quantization_level": quant}
