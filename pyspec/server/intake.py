"""What a generation request passes before it becomes a :class:`~.jobs.Job`:
the API key, the body (its size, JSON, Unicode), the wire format
(:func:`pyspec.wire.openai.parse`), the model's name, its constraint
compiled, and its prompts tokenized into :class:`~pyspec.request.Request`
values (one per prompt, checked by pyspec/request.py's rules). Every refusal
is an :class:`~.api_error.APIError` (a 4xx), never a 500.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any, List, Optional, Sequence, Tuple

from starlette.requests import ClientDisconnect, Request

from .. import fim
from .. import prediction as prediction_
from .. import request as request_
from ..errors import ConstraintError, ContextOverflowError
from ..request import Request as GenerationRequest
from ..wire import openai as protocol
from ..wire.fields import fim_prompt
from ..wire.openai import APIError, ParsedRequest, RequestSettings

#: Largest request body accepted (a prompt of a few hundred thousand characters).
MAX_BODY_BYTES = 4 << 20


def authorized(request: Request, api_key: Optional[str]) -> bool:
    """Whether the request carries ``Authorization: Bearer <api_key>`` (always, without a key)."""
    if api_key is None:
        return True
    given = request.headers.get("authorization", "")
    return given.startswith("Bearer ") and same_key(given[7:].strip(), api_key)


def same_key(given: str, api_key: str) -> bool:
    """A constant-time comparison of a header's key (latin-1, as HTTP decodes
    it: any character, which compare_digest's str form refuses) with ours."""
    return hmac.compare_digest(given.encode("latin-1", errors="replace"), api_key.encode("utf-8"))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


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
        body = json.loads(raw, parse_constant=_no_constant)  # NaN, Infinity: Python's, not JSON
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
    a 400 for a prompt that cannot be built (its checks: :func:`checked`)."""
    try:
        if kind == "chat":
            return target.prompt_tokens(prompt, tools=parsed.tools, variables=parsed.template_vars)
        if isinstance(prompt, str):
            return target.tokenize(prompt, add_special=True, parse_special=True)
        return list(prompt)
    except (ValueError, RuntimeError) as e:
        raise APIError(400, f"cannot build the prompt: {e}",
                       param="messages" if kind == "chat" else "prompt") from None


def checked(request: GenerationRequest, target, param: str = "prompt") -> GenerationRequest:
    """``request`` if its prompt is one the model can answer (pyspec/request.py's
    checks, their wording kept), else a 400 naming ``param``."""
    try:
        return request.checked(target.n_ctx, target.n_vocab)
    except ContextOverflowError as e:
        raise APIError(400, f"{e} (pyspec serve --n-ctx)", param=param, code="context_length_exceeded") from None
    except ValueError as e:
        raise APIError(400, str(e), param=param) from None


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
    """One server's checks of a generation request: ``decoder`` (its target's
    vocabulary, context and chat template read prompts; it builds their
    drafting), served as ``model_name`` with ``parallel`` slots and the
    ``policies`` and ``drafters`` its requests may name."""

    def __init__(self, decoder, *, model_name: str, parallel: int, policies: Sequence[str],
                 drafters: Sequence[str], max_draft: int, strict_model_name: bool = False) -> None:
        self.decoder, self.target = decoder, decoder.target
        self.model_name, self.parallel = model_name, parallel
        self.strict_model_name = strict_model_name
        self.policies, self.drafters, self.max_draft = list(policies), list(drafters), max_draft

    async def read(self, request: Request, kind: str) -> Tuple[ParsedRequest, List[GenerationRequest]]:
        """The request (``kind``: "completion" or "chat") parsed, and one
        :class:`~pyspec.request.Request` per prompt (with a ``suffix``, FIM
        prompts: fim.py); raises :class:`APIError` (authorization is checked
        before)."""
        return await self.of_body(await read_body(request), kind)

    async def of_body(self, body: Any, kind: str) -> Tuple[ParsedRequest, List[GenerationRequest]]:
        """:meth:`read` of a decoded OpenAI body (the other dialects' adapters
        make one: pyspec/wire/)."""
        parsed = self.parse(body, kind)
        self.check_model(parsed.model)
        await compile_constraint(self.target, parsed)
        s = parsed.settings
        if parsed.suffix is None:
            if parsed.healing is not None:
                raise APIError(400, "'healing' is for a fill-in-the-middle request (one with a 'suffix')",
                               param="healing")
            prompts = [(prompt_tokens(self.target, kind, p, parsed), None) for p in parsed.prompts]
        else:
            fills = [fim_prompt(lambda: request_.infill_prompt(
                self.target, p, parsed.suffix, healing=parsed.healing, constrained=s.constraint is not None))
                for p in parsed.prompts]
            prompts = [(f.tokens, f) for f in fills]
        param = "messages" if kind == "chat" else "prompt"
        return parsed, [self.request(s, tokens, fill, param) for tokens, fill in prompts]

    def parse(self, body: Any, kind: str) -> ParsedRequest:
        """An OpenAI body parsed under this server's limits, policies, drafters
        and chat template (the one call of wire/openai.parse)."""
        return protocol.parse(kind, body, max_n=self.parallel, policies=self.policies, drafters=self.drafters,
                              max_draft=self.max_draft, template=self.target.chat_template.source)

    def request(self, s: RequestSettings, tokens: Sequence[int], fill: Optional["fim.InfillPrompt"] = None,
                param: str = "prompt") -> GenerationRequest:
        """The :class:`~pyspec.request.Request` of one prompt under a request's
        settings: drafting only where the decoder drafts (a plain server
        ignores those fields), the prediction's tokens, healing's constraint."""
        drafting = (self.decoder.drafting(drafter=s.drafter, policy=s.policy, draft_max=s.draft_max)
                    if self.decoder.speculative else None)
        predicted = tuple(prediction_.tokens_of(self.target, s.prediction)) if s.prediction else None
        try:
            tokens, constraint = request_.for_fill(fill, s.constraint) if fill is not None else (tokens, s.constraint)
            out = GenerationRequest(tuple(tokens), s.sampling, drafting, constraint, max_tokens=s.max_tokens,
                                    stop=tuple(s.stop), logprobs=s.logprobs, seed=s.seed, n=s.n, fill=fill,
                                    prediction=predicted)
        except request_.RequestError as e:
            raise APIError(400, str(e), param=e.param) from None
        return checked(out.with_prediction(self.decoder), self.target, param)

    def check_model(self, model: Optional[str]) -> None:
        """With ``strict_model_name``, a 404 for a request naming another model
        ("" and None: this one). Without it every name is this model: local
        tools send their own default names, and llama-server answers them."""
        if self.strict_model_name and model not in (None, "", self.model_name):
            raise APIError(404, f"the model '{model}' does not exist (this server has '{self.model_name}')",
                           param="model", code="model_not_found")
