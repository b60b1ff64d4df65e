"""Chat prompts as the model's own template writes them (``pyspec.chat``
exports this module's public names).

A GGUF file carries its chat template as Jinja source
(``tokenizer.chat_template``). llama-server, llama-cpp-python, transformers'
``apply_chat_template``, Ollama and LM Studio all render that source with
Jinja, so the same ``messages`` give the same prompt everywhere; pyspec does the
same. The rules, as llama-server applies them (common/chat.cpp) and
transformers defines them:

* variables: ``messages``, ``add_generation_prompt``, ``bos_token`` and
  ``eos_token`` (the tokens' text), ``tools`` when the request has them,
  ``raise_exception(msg)`` and ``strftime_now(fmt)``; as llama-server also
  ``enable_thinking`` (true), ``datetime`` and ``date_string`` (today), which
  the caller's variables (``chat_template_kwargs``) may replace;
* messages as llama-server passes them: role ``developer`` read as ``system``
  (not for GPT-OSS's template, which has both), a tool call's ``arguments``
  given as a JSON string parsed into an object;
* Jinja with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
  extension, ``{% generation %}`` passed through, and ``tojson`` as Python's
  ``json.dumps`` without ASCII escaping (Jinja's own escapes HTML);
* the text then goes through the tokenizer with its special tokens parsed and
  BOS added where the vocabulary asks; so a template that writes ``bos_token``
  itself has it removed first (and a trailing ``eos_token`` where the
  vocabulary adds EOS), or the prompt would hold two.

Templates are untrusted input (any GGUF file, any ``--chat-template``): they
run in :mod:`pyspec.chat.sandbox`, Jinja's immutable sandbox within bounds of
time (``RENDER_SECONDS``) and size (``MAX_SIZE``), where a template that loops
for ever, recurses or builds a huge value stops with :class:`ChatTemplateError`
(that module's docstring states what is checked where). This module is the
renderer: the variables, filters and extensions above, the messages as
llama-server passes them, and BOS/EOS.

Files without a template get llama.cpp's built-in ChatML (``llama_chat_apply_template``,
as before), with one warning per file.
"""

from __future__ import annotations

import json
import os
import warnings
from datetime import datetime
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple, Union

import jinja2
import jinja2.ext

from . import sandbox
from .sandbox import MAX_SIZE, RENDER_SECONDS, ChatTemplateError, OverLimit

__all__ = ["MAX_SIZE", "RENDER_SECONDS", "RESERVED", "ChatTemplate", "ChatTemplateError", "read_override"]

Message = Mapping[str, Any]


class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` (marks assistant
    text for training masks): rendered as its contents."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
            separators: Optional[Tuple[str, str]] = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _parsed_arguments(call: Any) -> Any:
    """A tool call whose ``function.arguments`` is a JSON string (OpenAI's form),
    with the arguments as an object (what templates print with ``tojson``)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = json.loads(fn["arguments"])
    except ValueError as e:
        raise ChatTemplateError(f"a tool call's arguments are not JSON: {e}") from None
    return {**call, "function": {**fn, "arguments": args}}


def _environment() -> jinja2.Environment:
    """The bounded sandbox with what llama-server gives a chat template."""
    return sandbox.environment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[jinja2.ext.loopcontrols, _GenerationTag],
                                    filters={"tojson": _tojson},
                                    functions={"raise_exception": _raise_exception, "strftime_now": _strftime_now})


#: Names a caller's variables may not take: the renderer's own and Jinja's globals.
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
                     | set(_environment().globals))


class ChatTemplate:
    """A model's chat template: Jinja ``source`` (None: llama.cpp's built-in
    ChatML via ``builtin``), rendered with the token texts and BOS/EOS rules of
    the model's vocabulary. ``origin`` names where the source came from, for errors."""

    def __init__(self, source: Optional[str], *, bos_token: str, eos_token: str, add_bos: bool, add_eos: bool,
                 origin: str, builtin: Optional[Callable[[List[Tuple[str, str]], bool], str]] = None) -> None:
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        self.add_bos, self.add_eos = add_bos, add_eos
        self.origin = origin
        self._builtin = builtin
        self._compiled: Optional[jinja2.Template] = None
        self._warned = False

    @classmethod
    def of_model(cls, core, *, override: Union[str, os.PathLike, None] = None) -> "ChatTemplate":
        """The template of ``core`` (a ``pyspec._core.Model``): ``override`` (a
        file path, or the template's source), else the file's own, else the built-in."""
        origin = f"the chat template of {core.path}"
        raw = core.chat_template
        source = raw.decode("utf-8", errors="replace") if raw is not None else None
        if override is not None:
            source, origin = read_override(override)

        def piece(token: int) -> str:
            return core.token_to_piece(token, True).decode("utf-8", errors="replace") if token >= 0 else ""

        return cls(source, bos_token=piece(core.bos), eos_token=piece(core.eos), add_bos=core.add_bos,
                   add_eos=core.add_eos, origin=origin, builtin=core.apply_chat_template)

    @property
    def is_builtin(self) -> bool:
        return self.source is None

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
               tools: Optional[Sequence[Mapping[str, Any]]] = None,
               variables: Optional[Mapping[str, Any]] = None) -> str:
        """The prompt text of ``messages`` ({"role", "content", ...} dicts), ready for
        the tokenizer (special tokens parsed, BOS added as the vocabulary asks).

        A chat that ends with an assistant message is a prefill, as llama-server
        reads it: the model continues that message (the chat before it, the
        assistant's opening, then its text). ``variables`` go to the template
        too (``chat_template_kwargs``, e.g. ``enable_thinking``)."""
        if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
            raise ChatTemplateError("every message must be a mapping with a 'role' string")
        if add_generation_prompt and messages and messages[-1].get("role") == "assistant":
            if len(messages) >= 2 and messages[-2].get("role") == "assistant":
                raise ChatTemplateError("a chat cannot end with two assistant messages")
            content = messages[-1].get("content") or ""
            if messages[-1].get("tool_calls"):
                raise ChatTemplateError("an assistant message with tool calls cannot be continued")
            if not isinstance(content, str):
                raise ChatTemplateError("an assistant prefill must be text")
            return self.render(messages[:-1], tools=tools, variables=variables) + content
        if self.source is None:
            return self._render_builtin(messages, add_generation_prompt)
        taken = sorted(set(variables or ()) & RESERVED)
        if taken:
            raise ChatTemplateError(f"the template variable '{taken[0]}' is the renderer's own")
        now = datetime.now()
        context: dict = {"enable_thinking": True, "datetime": now.strftime("%b %d %Y"),
                         "date_string": now.strftime("%d %b %Y")}
        context.update(variables or {})
        context.update(messages=[self._message(m) for m in messages], add_generation_prompt=add_generation_prompt,
                       bos_token=self.bos_token, eos_token=self.eos_token)
        if tools:
            context["tools"] = [dict(t) for t in tools]
        try:
            text = sandbox.render(self._template(), context, self.origin)
        except OverLimit as e:
            raise ChatTemplateError(str(e)) from None
        except ChatTemplateError as e:
            raise ChatTemplateError(f"{self.origin} refused the messages: {e}") from None
        except Exception as e:  # whatever a hostile template or odd values raise: the caller's error
            raise ChatTemplateError(f"{self.origin} failed: {type(e).__name__}: {e}") from None
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # e.g. tojson of a tool call's "\ud800": no tokenizer takes it
            raise ChatTemplateError(f"{self.origin} wrote text that is not Unicode (a lone surrogate)") from None
        # The tokenizer adds BOS (EOS) itself where the vocabulary asks: not twice.
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[:-len(self.eos_token)]
        return text

    def _message(self, m: Message) -> dict:
        m = dict(m)
        if m.get("role") == "developer" and "<|channel|>" not in self.source:
            m["role"] = "system"
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            m["tool_calls"] = [_parsed_arguments(c) for c in calls]
        return m

    def check(self) -> None:
        """Raise :class:`ChatTemplateError` now if the template does not compile."""
        if self.source is not None:
            self._template()

    def _template(self) -> jinja2.Template:
        if self._compiled is None:
            try:
                self._compiled = _environment().from_string(self.source)
            except jinja2.TemplateError as e:
                raise ChatTemplateError(f"{self.origin} does not compile ({type(e).__name__}: {e}); "
                                        f"give another with --chat-template FILE") from None
        return self._compiled

    def _render_builtin(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        if self._builtin is None:
            raise ChatTemplateError(f"{self.origin}: no template")
        if not self._warned:
            self._warned = True
            warnings.warn(f"{self.origin.replace('the chat template of ', '')} has no chat template: "
                          f"using llama.cpp's built-in ChatML (--chat-template FILE gives one)", stacklevel=3)
        pairs = []
        for m in messages:
            content = m.get("content")
            if not isinstance(content, str):
                raise ChatTemplateError("the built-in template takes text content only")
            role = "system" if m["role"] == "developer" else m["role"]  # as llama-server passes it
            pairs.append((role, content))
        return self._builtin(pairs, add_generation_prompt)


def read_override(value: Union[str, os.PathLike]) -> Tuple[str, str]:
    """``(source, origin)`` of a ``--chat-template`` value: a path (PathLike, or
    a string naming an existing file), else the template's source itself."""
    if isinstance(value, os.PathLike) or (isinstance(value, str) and "{" not in value and os.path.isfile(value)):
        path = os.fspath(value)
        try:
            with open(path, encoding="utf-8") as f:
                return f.read(), f"the chat template {path}"
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"cannot read the chat template {path}: {e}") from None
    if not isinstance(value, str) or "{" not in value:
        raise ChatTemplateError(f"chat_template: {value!r} is neither a file nor Jinja source")
    return value, "the chat template given"
