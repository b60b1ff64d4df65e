"""The constrained part of the benchmark suite: answers a grammar shapes, where
much of the text is forced (the frame of a JSON object, of a tool call).

* ``json``: extraction into a JSON schema of 5 to 10 fields;
* ``tools``: a tool call through the model's chat template (``tool_choice``
  "required", parallel calls allowed: the calls' grammar from
  pyspec/chat/tools.py), some with several tools; an answer is valid when it
  is calls and nothing else (no markup of a call cut short);
* ``grammar``: a llama.cpp GBNF grammar.

Each task knows how to check its answer without the engine that wrote it
(:func:`valid`): JSON against its schema (the subset of JSON Schema used
here), calls against their tool's parameters, grammar answers against a
regular expression of the same language.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..chat.calls import parse_calls
from ..chat.tools import ToolChoice, tool_constraint, tool_format
from ..constraints import Constraint


@dataclass(frozen=True)
class Task:
    """What a constrained prompt asks for: a schema, tools or a grammar (with
    the regex its answers must match)."""

    schema: Optional[Mapping[str, Any]] = None
    tools: Optional[Sequence[Mapping[str, Any]]] = None
    gbnf: Optional[str] = None
    pattern: Optional[str] = None


def _obj(props: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


S, I, N, B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
_PERSON = _obj({"name": S, "age": I, "email": S, "city": S, "country": S, "employed": B})
_ORDER = _obj({"order_id": S, "customer": S, "items": {"type": "array", "items": _obj({"product": S, "quantity": I})},
               "total": N, "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]}, "paid": B,
               "shipping_city": S})
_BOOK = _obj({"title": S, "author": S, "year": I, "pages": I, "publisher": S, "isbn": S, "genre": S,
              "language": S, "rating": N})
_EVENT = _obj({"event": S, "date": S, "start_time": S, "end_time": S, "location": S, "organizer": S,
               "attendees": {"type": "array", "items": S}, "online": B})

_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": _obj({"city": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}})}}
_CALENDAR = {"type": "function", "function": {
    "name": "create_event", "description": "Add an event to the user's calendar",
    "parameters": _obj({"title": S, "date": S, "time": S, "duration_minutes": I, "attendees": {
        "type": "array", "items": S}})}}
_SEARCH = {"type": "function", "function": {
    "name": "search_flights", "description": "Search for flights",
    "parameters": _obj({"origin": S, "destination": S, "date": S, "passengers": I,
                        "cabin": {"type": "string", "enum": ["economy", "business", "first"]}})}}

_CURRENCY = {"type": "function", "function": {
    "name": "convert_currency", "description": "Convert an amount between currencies",
    "parameters": _obj({"amount": N, "from": S, "to": S})}}

_LIST_GBNF = 'root ::= item item item\nitem ::= "- " [A-Za-z ,]+ "\\n"'
_CSV_GBNF = ('root ::= header row row row\nheader ::= "name,quantity,price\\n"\n'
             'row ::= [a-z]+ "," [0-9]+ "," [0-9]+ "." [0-9] [0-9] "\\n"')
_VERDICT_GBNF = 'root ::= ("yes" | "no") ", because " [a-zA-Z ,]+ "."'

TASKS: Dict[str, List[tuple]] = {
    "json": [
        ("Extract the person as JSON: Maria Lopez, 34, works as a nurse in Madrid, Spain; write to "
         "maria.lopez@example.com.", Task(schema=_PERSON)),
        ("Extract the order as JSON: order A-1043 from Tom Baker, 2 lamps and 1 rug, 189.50 EUR in total, "
         "paid, ship to Leeds.", Task(schema=_ORDER)),
        ("Describe the book 'The Hobbit' by J.R.R. Tolkien (1937, 310 pages, Allen & Unwin, ISBN 0261102214, "
         "fantasy, English, rated 4.7) as JSON.", Task(schema=_BOOK)),
        ("Turn this into JSON: the quarterly review is on 2025-03-14 from 10:00 to 11:30 in room B2, organised "
         "by Priya, with Sam, Lee and Ana attending in person.", Task(schema=_EVENT)),
    ],
    "tools": [
        ("What's the weather like in Lisbon right now, in celsius?", Task(tools=(_WEATHER, _CALENDAR, _SEARCH))),
        ("Put a 45 minute design review with Ana and Joe in my calendar for 2025-05-02 at 14:00.",
         Task(tools=(_WEATHER, _CALENDAR, _SEARCH))),
        ("Find me business class flights from Berlin to Tokyo on 2025-09-10 for two people.",
         Task(tools=(_WEATHER, _CALENDAR, _SEARCH))),
        # Issue 48: one call asked for, two tools: this ran to max_tokens.
        ("What is the weather in Oslo right now, in celsius?", Task(tools=(_WEATHER, _CURRENCY))),
    ],
    "grammar": [
        ("List three fruits.", Task(gbnf=_LIST_GBNF, pattern=r"(- [A-Za-z ,]+\n){3}")),
        ("Write a CSV of three grocery items with quantity and price.",
         Task(gbnf=_CSV_GBNF, pattern=r"name,quantity,price\n([a-z]+,[0-9]+,[0-9]+\.[0-9]{2}\n){3}")),
        ("Is Python a compiled language? Answer and say why.",
         Task(gbnf=_VERDICT_GBNF, pattern=r"(yes|no), because [a-zA-Z ,]+\.")),
    ],
}
CATEGORIES = tuple(TASKS)


def constraint_for(task: Task, template_source: Optional[str]) -> Constraint:
    """The task's constraint (tools: a call in the template's own format)."""
    if task.schema is not None:
        return Constraint.json_schema(task.schema)
    if task.tools is not None:
        # As a request with the defaults asks (parallel_tool_calls true): the turn must end by itself.
        c = tool_constraint(tool_format(template_source), task.tools, ToolChoice("required"))
        if c is None:
            raise ValueError("this chat template's tool-call format has no grammar for tool_choice 'required'")
        return c
    return Constraint.grammar(task.gbnf)


def conforms(value: Any, schema: Mapping[str, Any]) -> bool:
    """``value`` against the JSON Schema subset of these tasks: type, enum,
    properties, required, additionalProperties false, items."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    t = schema.get("type")
    if t == "object":
        if not isinstance(value, dict):
            return False
        props = schema.get("properties", {})
        if any(k not in value for k in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and any(k not in props for k in value):
            return False
        return all(conforms(v, props[k]) for k, v in value.items() if k in props)
    if t == "array":
        return isinstance(value, list) and all(conforms(v, schema.get("items", {})) for v in value)
    checks = {"string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)}
    return checks[t](value) if t in checks else True


def valid(task: Task, text: str, template_source: Optional[str]) -> bool:
    """Whether a finished answer is what the task asked for."""
    if task.schema is not None:
        try:
            return conforms(json.loads(text), task.schema)
        except ValueError:
            return False
    if task.tools is not None:
        tools = {t["function"]["name"]: t["function"] for t in task.tools}
        content, calls = parse_calls(tool_format(template_source), text, list(tools))
        return bool(calls) and not content and all(conforms(json.loads(c.arguments), tools[c.name].get("parameters") or {})
                                   for c in calls)
    return re.fullmatch(task.pattern, text) is not None
