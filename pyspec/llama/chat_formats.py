"""llama-cpp-python's named chat formats, for ``pyspec.Llama(chat_format=NAME)``:
each one's prompt, stop strings and BOS rule as data, rendered by pyspec.

A format is a small Jinja template (pyspec's own, written to give the same
text as llama-cpp-python 0.3.36's formatter of that name, checked against it
in tests/test_chat_formats.py), its stop strings (added after the caller's),
and whether the tokenizer adds BOS where the vocabulary asks (llama-cpp-python's
``added_special=False``: every named format but ``phi-3``). The templates see

* ``system``: the first system message's content ("" without one);
* ``turns``: the system, user and assistant messages in order, each
  ``{"role", "content"}`` with non-text content as none (other roles, such as
  ``tool``, are not shown: llama-cpp-python drops them too);
* ``messages`` as given, ``tools`` and ``show_tools`` (``chatml-function-calling``).

The formats render a chat as written: a last assistant message is a whole
turn, and the assistant's next turn opens after it (llama-cpp-python's rule;
pyspec's GGUF-template path continues it instead).

``phi-3`` is not among llama-cpp-python's names: it is what llama-cpp-python
does with a Phi-3 GGUF (Phi-3-mini's template through its template handler,
which adds no BOS), with ``<|end|>`` added to the stops so that the turn ends
on any vocabulary. ``chatml-function-calling`` renders as that handler of
llama-cpp-python does, down to its quirk of HTML-escaping the messages
(``&`` as ``&amp;``) and writing the tools' schemas with Jinja's
HTML-safe ``tojson`` (keys sorted, ``<`` as ``\\u003c``); what it does with
tools is pyspec/llama/functions.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import jinja2.utils
from markupsafe import Markup

from ..chat import sandbox
from ..chat.sandbox import ChatTemplateError, OverLimit

#: The handler that shows the model tools (pyspec/llama/functions.py).
FUNCTION_CALLING = "chatml-function-calling"


@dataclass(frozen=True)
class ChatFormat:
    template: str
    stop: Tuple[str, ...] = ()
    add_bos: bool = True  # BOS where the vocabulary asks (llama-cpp-python's added_special=False)


# The user and assistant turns of the ChatML family, each closed by <|im_end|>
# (a turn without text is only its opening, as llama-cpp-python writes it).
_CHATML_TURNS = ("{% for m in turns if m.role != 'system' %}<|im_start|>{{ m.role }}\n"
                 "{% if m.content %}{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}<|im_start|>assistant\n")

_FUNCTIONS_TEXT = (
    "\n\nYou have access to the following functions:\n"
    "{% for t in tools %}\nfunctions.{{ t.function.name | e }}:\n{{ (t.function.parameters or {}) | htmljson }}\n"
    "{% endfor %}"
    "\n\nYou can respond to users messages with either a single message or one or more function calls."
    "\n\nTo respond with a message begin the message with 'message:', use the following format:"
    "\n\nmessage:\n<message>"
    "\n\nTo respond with one or more function calls begin the message with 'functions.<function_name>:', "
    "use the following format:"
    "\n\nfunctions.<function_name>:\n{ \"arg1\": \"value1\", \"arg2\": \"value2\" }"
    "\nfunctions.<function_name>:\n{ \"arg1\": \"value1\", \"arg2\": \"value2\" }")

FORMATS: Dict[str, ChatFormat] = {
    "chatml": ChatFormat("<|im_start|>system\n{{ system }}<|im_end|>\n" + _CHATML_TURNS, ("<|im_end|>",)),
    # qwen: ChatML with a default system prompt, stopping at <|endoftext|> (as there)
    "qwen": ChatFormat("<|im_start|>system\n{{ system or 'You are a helpful assistant.' }}<|im_end|>\n"
                       + _CHATML_TURNS, ("<|endoftext|>",)),
    # llama-2: the system prompt opens the first user turn, which then has no [INST] of its own;
    # separators alternate " " and "</s>" by the turn's place; no stop string
    "llama-2": ChatFormat(
        "{% if system %}[INST] <<SYS>>\n{{ system }}\n<</SYS>>{% endif %} "
        "{% for m in turns if m.role != 'system' %}"
        "{% set tag = '<s>[INST]' if m.role == 'user' else '[/INST]' %}"
        "{% if system and loop.first %}{{ m.content or '' }} "
        "{% elif m.content %}{{ tag }}{{ m.content }} {{ ' ' if loop.index0 is even else '</s>' }}"
        "{% else %}{{ tag }} {% endif %}{% endfor %}[/INST]"),
    "llama-3": ChatFormat(
        "{% for m in turns %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
        "{% if m.content %}{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n", ("<|eot_id|>",)),
    # mistral-instruct: no system prompt; an empty user message still opens [INST]
    "mistral-instruct": ChatFormat(
        "{% for m in turns %}{% if m.role == 'user' and m.content is not none %}[INST] {{ m.content }}"
        "{% elif m.role == 'assistant' and m.content is not none %} [/INST]{{ m.content }}</s>{% endif %}"
        "{% endfor %} [/INST]", ("</s>",)),
    # gemma: no system prompt (llama-cpp-python drops it)
    "gemma": ChatFormat(
        "{% for m in turns if m.role != 'system' %}<start_of_turn>{{ 'user' if m.role == 'user' else 'model' }}\n"
        "{% if m.content %}{{ m.content }}<end_of_turn>\n{% endif %}{% endfor %}<start_of_turn>model\n",
        ("<end_of_turn>\n",)),
    # phi-3: Phi-3-mini's template, as llama-cpp-python's template handler renders a Phi-3 GGUF
    "phi-3": ChatFormat("{% for m in turns %}<|{{ m.role }}|>\n{{ m.content or '' }}<|end|>\n{% endfor %}"
                        "<|assistant|>\n", ("<|end|>", "<|endoftext|>"), add_bos=False),
    # chatml-function-calling: every message opens a turn (a tool's too, with nothing in it);
    # the system turn lists the tools when they are shown, and assistant text is then a "message:"
    FUNCTION_CALLING: ChatFormat(
        "{% for m in messages %}<|im_start|>{{ m.role | e }}\n"
        "{% if m.role == 'system' %}{{ m.content | e }}{% if show_tools %}" + _FUNCTIONS_TEXT
        + "{% endif %}<|im_end|>\n"
        "{% elif m.role == 'user' %}{{ m.content | e }}<|im_end|>\n"
        "{% elif m.role == 'assistant' %}"
        "{% if m.content and m.content | length > 0 %}{% if show_tools %}message:\n{% endif %}"
        "{{ m.content | e }}<|im_end|>\n{% endif %}"
        "{% if 'tool_calls' in m %}{% for c in m.tool_calls %}functions.{{ c.function.name | e }}:\n"
        "{{ c.function.arguments | e }}{% endfor %}<|im_end|>\n{% endif %}"
        "{% endif %}{% endfor %}<|im_start|>assistant\n", ("<|im_end|>",)),
}

#: Every name ``chat_format`` takes, besides None and "chat_template.default" (the GGUF's own template).
NAMES: Tuple[str, ...] = tuple(sorted(FORMATS))


@dataclass(frozen=True)
class Rendered:
    """llama-cpp-python's ``ChatFormatterResponse``: the prompt, its stop
    strings, and whether the tokenizer adds BOS (``not added_special``)."""

    prompt: str
    stop: List[str]
    add_bos: bool


def check(name: str) -> str:
    if name not in FORMATS:
        raise ValueError(f"chat_format={name!r} is not a chat format pyspec knows: give None or "
                         f"'chat_template.default' (the GGUF's own template) or one of {', '.join(NAMES)}")
    return name


def _htmljson(value: Any) -> Markup:
    """Jinja's own ``tojson`` (keys sorted, HTML-safe), which llama-cpp-python's
    function-calling template gets under autoescaping."""
    return jinja2.utils.htmlsafe_json_dumps(value, sort_keys=True)


_compiled: Dict[str, Any] = {}


def _template(name: str):
    if name not in _compiled:
        env = sandbox.environment(keep_trailing_newline=True, filters={"htmljson": _htmljson})
        _compiled[name] = env.from_string(FORMATS[name].template)
    return _compiled[name]


def render(name: str, messages: Sequence[Mapping[str, Any]], *, tools: Optional[Sequence[Mapping[str, Any]]] = None,
           show_tools: bool = False) -> Rendered:
    """The prompt of ``messages`` in the format ``name``, its stops and BOS rule."""
    fmt = FORMATS[check(name)]
    if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
        raise ChatTemplateError("every message must be a mapping with a 'role' string")
    system = next((m.get("content") or "" for m in messages if m["role"] == "system"), "")
    turns = [{"role": m["role"], "content": m.get("content") if isinstance(m.get("content"), str) else None}
             for m in messages if m["role"] in ("system", "user", "assistant")]
    context = {"system": system, "turns": turns, "messages": [dict(m) for m in messages],
               "tools": [dict(t) for t in tools or []], "show_tools": show_tools}
    origin = f"the chat format {name!r}"
    try:
        prompt = sandbox.render(_template(name), context, origin)
    except OverLimit as e:
        raise ChatTemplateError(str(e)) from None
    except Exception as e:  # odd values in the messages: the caller's error
        raise ChatTemplateError(f"{origin} failed on the messages: {type(e).__name__}: {e}") from None
    return Rendered(prompt, list(fmt.stop), fmt.add_bos)
