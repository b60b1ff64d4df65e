"""Tool calls: how a chat template's model writes them, the grammar that makes
it write a well-formed one, and the parser that reads them back out of its text.

Formats (chosen from the template's own text, :func:`tool_format`):

* ``hermes`` (Qwen2.5, Hermes, many others):
  ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, one block
  per call;
* ``llama3`` (Llama 3.1-3.3 JSON tool calling): the whole answer is
  ``{"name": "f", "parameters": {...}}``, maybe after ``<|python_tag|>``;
* ``mistral``: ``[TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]`` (the
  control token does not show in the text).

Under hermes, a whole answer that is one ``{"name": ..., "arguments": ...}``
object naming a tool of the request, bare or in a Markdown ```json block, is
read as that call too: code models of the Qwen2.5 family answer so under
``"auto"`` (llama-server then returns the block as content, and no call).

``tool_choice`` (OpenAI's): ``"none"`` shows the model no tools; ``"auto"``
leaves the text free until the model opens a call, whose body then follows
the grammar of the tools' parameter schemas (a lazy trigger; hermes); with
``"required"`` or a named function the whole answer is a call (hermes, llama3).
The answer side, reading calls back out of the text, is chat/calls.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..constraints import JSON_WHITESPACE, Constraint
from ..errors import ConstraintError

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
FENCE = "```json"
FORMATS = ("hermes", "llama3", "mistral")


def tool_format(template_source: Optional[str]) -> str:
    """The format a template's model writes calls in (hermes when the template
    does not say: the built-in ChatML template's family)."""
    src = template_source or ""
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<|python_tag|>" in src or ("ipython" in src and '"parameters"' in src):
        return "llama3"
    return "hermes"


# ------------------------------------------------------------------ request side

@dataclass(frozen=True)
class ToolChoice:
    """What a request allows: ``mode`` "none", "auto" or "required" (a named
    function is "required" with ``name``), and several calls or one."""

    mode: str = "auto"
    name: Optional[str] = None
    parallel: bool = True


def check_tools(tools: Any) -> List[Dict[str, Any]]:
    """OpenAI's ``tools``, validated: each ``{"type": "function", "function":
    {"name", "description"?, "parameters"?}}``. ConstraintError names the field."""
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ConstraintError("tools must be a list of tool objects")
    names = set()
    for i, t in enumerate(tools):
        fn = t.get("function")
        if t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ConstraintError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise ConstraintError(f"tools[{i}].function.name must be a non-empty string of at most 64 characters")
        if name in names:
            raise ConstraintError(f"tools[{i}].function.name '{name}' is defined twice")
        names.add(name)
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ConstraintError(f"tools[{i}].function.parameters must be a JSON schema object")
    return tools


def check_choice(choice: Any, tools: Optional[Sequence[Mapping[str, Any]]], parallel: Any = None) -> ToolChoice:
    """OpenAI's ``tool_choice`` and ``parallel_tool_calls`` against ``tools``."""
    if parallel is not None and not isinstance(parallel, bool):
        raise ConstraintError("parallel_tool_calls must be a boolean")
    par = True if parallel is None else parallel
    names = [t["function"]["name"] for t in tools or []]
    if choice is None:
        return ToolChoice("auto" if names else "none", parallel=par)
    if choice in ("none", "auto", "required"):
        if choice == "required" and not names:
            raise ConstraintError("tool_choice 'required' needs tools")
        return ToolChoice(choice, parallel=par)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise ConstraintError(f"tool_choice names the function {name!r}, which is not among the tools")
        return ToolChoice("required", name=name, parallel=False)
    raise ConstraintError("tool_choice must be 'none', 'auto', 'required' or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}")


def _call_schema(tools: Sequence[Mapping[str, Any]], name: Optional[str], args_key: str) -> Dict[str, Any]:
    """One call to any of the tools (or the one named): its name, then arguments
    that follow that tool's parameter schema."""
    options = []
    for t in tools:
        fn = t["function"]
        if name is not None and fn["name"] != name:
            continue
        params = fn.get("parameters") or {"type": "object"}
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, args_key: params},
                        "required": ["name", args_key], "additionalProperties": False})
    schema: Dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": JSON_WHITESPACE}


def _hermes_required(call_json: str, parallel: bool) -> str:
    """The whole answer is calls (one unless ``parallel``), and the turn may end
    wherever the template's model ends it after a complete call: right after
    its JSON (models that never learnt the closing tag end there, and would
    otherwise be made to write it as text, whose last token may be ">\\n"),
    after the closing tag, or after the newline that follows it. A separator
    that must be followed by another call would leave a model that writes
    ">\\n", or "</tool_call>" then "\\n", no way to stop: it runs to max_tokens
    (issue 48). The parser reads a last call without its closing tag."""
    close = f'"\\n{HERMES_CLOSE}"'
    rules = f'body: "{HERMES_OPEN}\\n" {call_json}\nlast: body ({close} "\\n"?)?\n'
    if not parallel:
        return "start: last\n" + rules
    return f'start: (body {close} "\\n")* last\n' + rules


def tool_constraint(fmt: str, tools: Sequence[Mapping[str, Any]], choice: ToolChoice) -> Optional[Constraint]:
    """The grammar of a request's answer under ``choice`` (None: free text)."""
    if choice.mode == "none" or not tools:
        return None
    if fmt == "hermes":
        call_json = "%json " + json.dumps(_call_schema(tools, choice.name, "arguments"))
        if choice.mode == "required":
            return Constraint("lark", _hermes_required(call_json, choice.parallel))
        # auto: any text, until the model opens a call; then the call's grammar.
        calls = "call*" if choice.parallel else "call?"
        return Constraint("lark", f"start: {calls} TEXT\n"
                                  f"call: opening \"\\n\" {call_json} \"\\n{HERMES_CLOSE}\"\n"
                                  f"opening[lazy]: TEXT \"{HERMES_OPEN}\"\n"
                                  f"TEXT: /(.|\\n)*/\n")
    if fmt == "llama3" and choice.mode == "required":
        return Constraint("lark", "start: %json " + json.dumps(_call_schema(tools, choice.name, "parameters")) + "\n")
    return None  # mistral, and llama3 under auto: parsed, not constrained
