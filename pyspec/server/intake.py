"""What a generation request passes before it becomes a :class:`~.jobs.Job`:
the API key, the body (its size, JSON, Unicode), the wire format
(:func:`.protocol.parse`), the model's name, its constraint compiled, and its
prompts tokenized and checked against the vocabulary and the context. Every
refusal is an :class:`~.protocol.APIError` (a 4xx), never a 500.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any, List, Optional, Sequence, Tuple

from starlette.requests import ClientDisconnect, Request

from .. import fim
from .. import prediction as prediction_
from ..errors import ConstraintError
from . import protocol
from .protocol import APIError, ParsedRequest

#: Largest request body accepted (a prompt of a few hundred thousand characters).
MAX_BODY_BYTES = 4 << 20


def authorized(request: Request, api_key: Optional[str]) -> bool:
    """Whether the request carries ``Authorization: Bearer <api_key>`` (always, without a key)."""
    if api_key is None:
        return True
    given = request.headers.get("authorization", "")
    return given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip(), api_key)


async def read_body(request: Request) -> Any:
    """The request's JSON body, decoded: a 413 past :data:`MAX_BODY_BYTES`, a 499
    when the client leaves before it arrives, a 400 when it is not JSON or holds
    a lone surrogate."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    raw = b""
    try:
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    except ClientDisconnect:  # gone before its body arrived: counted as a client that left
        raise APIError(499, "the client left before its request body arrived") from None
    try:
        body = json.loads(raw)
    except ValueError as e:  # UnicodeDecodeError (not UTF-8) is one
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply") from None
    return unicode_checked(body)


def unicode_checked(body: Any) -> Any:
    """``body`` (decoded JSON) if every string in it is Unicode text, else a 400.

    JSON may escape a lone surrogate (``"\\ud800"``), which Python decodes into a
    ``str`` that has no UTF-8 form: the tokenizer, the engine's stop strings and
    the JSON of an error that quotes it could not take it. Walked without
    recursion (the decoder admits nesting up to Python's recursion limit)."""
    todo = [body]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            todo.extend(v)
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise APIError(400, f"the request body holds a lone surrogate (\\u{ord(v[e.start]):04x}), "
                                    f"which is not Unicode text") from None
    return body


def prompt_tokens(target, kind: str, prompt, parsed: ParsedRequest) -> List[int]:
    """One prompt's token ids (chat: the template's rendering of its messages):
    a 400 for ids outside the vocabulary, a prompt that cannot be built, an
    empty one, or one the context cannot hold with room for an answer."""
    try:
        if kind == "chat":
            ids = target.prompt_tokens(prompt, tools=parsed.tools, variables=parsed.template_vars)
        elif isinstance(prompt, str):
            ids = target.tokenize(prompt, add_special=True, parse_special=True)
        else:
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < target.n_vocab]
            if bad:
                raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{target.n_vocab - 1})",
                               param="prompt")
    except (ValueError, RuntimeError) as e:
        raise APIError(400, f"cannot build the prompt: {e}",
                       param="messages" if kind == "chat" else "prompt") from None
    if not ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    if len(ids) >= target.n_ctx:
        raise APIError(400, f"This model's maximum context length is {target.n_ctx} tokens; the prompt has "
                            f"{len(ids)} (pyspec serve --n-ctx)", param="messages" if kind == "chat" else "prompt",
                       code="context_length_exceeded")
    return ids


async def compile_constraint(target, parsed: ParsedRequest) -> None:
    """Compile the request's one constraint (protocol.parse decided it), off the
    event loop: a 400 naming the field when it does not compile."""
    s = parsed.settings
    if s.constraint is not None:
        try:
            await asyncio.get_running_loop().run_in_executor(None, target.grammars.compile, s.constraint)
        except ConstraintError as e:
            raise APIError(400, f"'{s.constraint_param}': {e}", param=s.constraint_param) from None


class Intake:
    """One server's checks of a generation request: ``target`` (the model whose
    vocabulary, context and chat template prompts are read with), served as
    ``model_name`` with ``parallel`` slots and the ``policies`` and
    ``drafters`` its requests may name."""

    def __init__(self, target, *, model_name: str, parallel: int, policies: Sequence[str],
                 drafters: Sequence[str], max_draft: int, strict_model_name: bool = False) -> None:
        self.target, self.model_name, self.parallel = target, model_name, parallel
        self.strict_model_name = strict_model_name
        self.policies, self.drafters, self.max_draft = list(policies), list(drafters), max_draft

    async def read(self, request: Request, kind: str
                   ) -> Tuple[ParsedRequest, List[List[int]], Optional[List[fim.InfillPrompt]]]:
        """The request (``kind``: "completion" or "chat") parsed, its prompts'
        token ids, and with a ``suffix`` their FIM prompts (fim.py); raises
        :class:`APIError` (authorization is checked before)."""
        body = await read_body(request)
        parsed = protocol.parse(kind, body, max_n=self.parallel, policies=self.policies, drafters=self.drafters,
                                max_draft=self.max_draft, template=self.target.chat_template.source)
        self.check_model(parsed.model)
        await compile_constraint(self.target, parsed)
        if parsed.suffix is None:
            if parsed.healing is not None:
                raise APIError(400, "'healing' is for a fill-in-the-middle request (one with a 'suffix')",
                               param="healing")
            return parsed, [prompt_tokens(self.target, kind, p, parsed) for p in parsed.prompts], None
        try:
            heal = fim.healing(parsed.healing, parsed.settings.constraint is not None)
        except ValueError as e:
            raise APIError(400, str(e), param="healing") from None
        fills = [fim_prompt(self.target, lambda: fim.for_prefix(self.target, p, parsed.suffix, healing=heal))
                 for p in parsed.prompts]
        return parsed, [f.tokens for f in fills], fills

    def check_model(self, model: Optional[str]) -> None:
        """With ``strict_model_name``, a 404 for a request naming another model
        ("" and None: this one). Without it every name is this model: local
        tools send their own default names, and llama-server answers them."""
        if self.strict_model_name and model not in (None, "", self.model_name):
            raise APIError(404, f"the model '{model}' does not exist (this server has '{self.model_name}')",
                           param="model", code="model_not_found")

    def prediction(self, text: Optional[str]) -> Optional[List[int]]:
        """A Predicted Output's tokens (None: none)."""
        return prediction_.tokens_of(self.target, text) if text else None


def fim_prompt(target, build) -> "fim.InfillPrompt":
    """``build()``'s FIM prompt: a 501 for a model without FIM tokens (as
    llama-server answers), a 400 for one the context cannot hold."""
    try:
        fill = build()
    except fim.FimUnsupported as e:
        raise APIError(501, str(e), type="not_supported_error") from None
    if len(fill.tokens) >= target.n_ctx:
        raise APIError(400, f"This model's maximum context length is {target.n_ctx} tokens; the prompt has "
                            f"{len(fill.tokens)} (pyspec serve --n-ctx)", param="prompt",
                       code="context_length_exceeded")
    return fill
