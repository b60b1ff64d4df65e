"""Multi-turn conversations of local work, for `pyspec bench multiturn` and
`pyspec bench serve --multiturn`.

Local work repeats itself: a file comes back with one change per turn, and the
same instruction meets a similar input. Two kinds:

* ``edit``: one file, 4-6 turns that each ask for one change (rename, add a
  parameter, fix a bug, reformat, translate comments) and the whole file back.
  A turn's prompt is the conversation so far, the assistant's earlier answers
  included, so a drafter that looks up this text finds the file in it.
* ``repeat``: the same instruction on similar inputs, each request alone (a
  tool that sends one file at a time). Only a memory of earlier requests
  (``pyspec.Memory``, one per user in the server) sees the earlier answers.

The files are short (20-40 lines) so that an answer is about 150-400 tokens.
Every user message asks for the whole file back (``WHOLE_FILE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

#: The words every turn's request contains.
WHOLE_FILE = "Return the whole file."
KINDS = ("edit", "repeat")

SYSTEM = ("You are a precise coding assistant. When asked to change a file, reply with the complete updated file "
          "in one fenced code block and nothing else: no explanation.")

Message = Dict[str, str]


@dataclass(frozen=True)
class Conversation:
    """A conversation's user turns; ``kind`` says whether a turn's prompt holds the
    conversation so far (``edit``) or only its own request (``repeat``)."""

    id: str
    kind: str
    turns: Tuple[str, ...]
    system: str = SYSTEM

    def messages(self, turn: int, answers: Sequence[str]) -> List[Message]:
        """The chat messages of turn ``turn`` (0-based): the system message, then
        for ``edit`` every earlier turn with its answer (``answers[i]``), then the
        turn's request."""
        out: List[Message] = [{"role": "system", "content": self.system}]
        if self.kind == "edit":
            if len(answers) < turn:
                raise ValueError(f"{self.id}: turn {turn + 1} needs the answers of the {turn} turns before it")
            for user, answer in zip(self.turns[:turn], answers):
                out += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        out.append({"role": "user", "content": self.turns[turn]})
        return out


def transcript(messages: Sequence[Message]) -> str:
    """Messages as plain text, for models without a chat template (``--raw``);
    ends with the assistant's cue."""
    names = {"system": "System", "user": "User", "assistant": "Assistant"}
    return "".join(f"{names[m['role']]}: {m['content']}\n\n" for m in messages) + "Assistant:"


#: What ends an answer in a raw transcript (the model starting the next turn itself).
RAW_STOP = ("\nUser:",)


def _first(name: str, lang: str, text: str, request: str) -> str:
    return f"Here is `{name}`:\n\n```{lang}\n{text}```\n\n{request} {WHOLE_FILE}"


# ---------------------------------------------------------------- edit: Python
_TASKS = '''"""A small in-memory task queue with priorities."""

import heapq
import time


class TaskQueue:
    def __init__(self):
        # heap of (priority, created, name)
        self.heap = []
        self.done = []

    def push(self, name, priority=0):
        # lower numbers run first
        heapq.heappush(self.heap, (priority, time.time(), name))

    def pop(self):
        if not self.heap:
            return None
        priority, created, name = heapq.heappop(self.heap)
        self.done.append(name)
        return name

    def pending(self):
        return [name for _, _, name in sorted(self.heap)]

    def stats(self):
        # average wait of finished tasks is not tracked yet
        return {"pending": len(self.heap), "done": len(self.dones)}
'''

# ---------------------------------------------------------------- edit: JavaScript, German comments
_CART = '''// Warenkorb: Artikel hinzufügen, entfernen und Summe berechnen
class Cart {
  constructor() {
    this.items = [];
  }

  // Fügt einen Artikel hinzu
  add(name, price, quantity) {
    this.items.push({ name, price, quantity });
  }

  // Entfernt alle Artikel mit diesem Namen
  remove(name) {
    this.items = this.items.filter((item) => item.name !== name);
  }

  // Berechnet die Summe aller Artikel
  total() {
    let sum = 0;
    for (let i = 1; i < this.items.length; i++) {
      sum += this.items[i].price * this.items[i].quantity;
    }
    return sum;
  }
}

module.exports = { Cart };
'''

# ---------------------------------------------------------------- edit: a text document
_POLICY = '''# Remote work guidelines

Everyone may work from home up to three days a week. The team meets in the
office every Monday, so please plan your remote days around it.

## Equipment

The company provides a laptop and a headset. A second screen can be ordered
through the IT portal. Broken equipment must be reported imediately.
Personal devices may not be used for customer data.

## Working hours

Core hours are from 10:00 to 15:00. Outside them you may organise your day
freely, as long as you are reachable by chat. Please keep your calender up to
date and mark the days you work remotely.

## Travel

Trips to the office on Monday are reimbursed up to 30 euros. Keep the recipts
and submit them with the monthly expense report, which is due on the last
Monday of the month. Late reports are processed the following month, and
approvel may take up to two weeks.
'''

# ---------------------------------------------------------------- edit: a YAML workflow
_WORKFLOW = '''name: tests

on:
  push:
    branches: [main]
  pull_request:

jobs:
  test:
    runs-on: ubuntu-latest
    strategy:
      matrix:
        python: ["3.9", "3.10", "3.11"]
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: ${{ matrix.python }}
      - name: Install
        run: pip install -e '.[test]'
      - name: Test
        run: pytest -q
'''

# ---------------------------------------------------------------- repeat: docstrings on similar validators
_VALIDATOR = '''import re

{upper} = re.compile(r"{pattern}")


def is_{name}(text):
    return bool({upper}.match(normalize_{name}(text)))


def normalize_{name}(text):
    return {normalize}


def {part}_of(text):
    if not is_{name}(text):
        raise ValueError(f"not a valid {label}: {{text!r}}")
    return normalize_{name}(text){split}
'''

_VALIDATORS = [
    dict(name="email", upper="EMAIL", pattern=r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$", normalize="text.strip().lower()",
         part="domain", label="email address", split='.split("@", 1)[1]'),
    dict(name="phone", upper="PHONE", pattern=r"^\+[0-9]{8,15}$", normalize='text.replace(" ", "").replace("-", "")',
         part="country_code", label="phone number", split='.removeprefix("+")[:2]'),
    dict(name="url", upper="URL", pattern=r"^https?://[^/\s]+(/\S*)?$", normalize="text.strip()",
         part="host", label="URL", split='.split("/")[2]'),
    dict(name="postcode", upper="POSTCODE", pattern=r"^[A-Z]{1,2}[0-9][A-Z0-9]? [0-9][A-Z]{2}$",
         normalize="text.strip().upper()", part="area", label="postcode", split='.split(" ")[0]'),
    dict(name="username", upper="USERNAME", pattern=r"^[a-z][a-z0-9_]{2,15}$", normalize="text.strip().lower()",
         part="initial", label="username", split="[0]"),
]

_DOCSTRING_TASK = "Add a one-line docstring to every function in this file; change nothing else."

# ---------------------------------------------------------------- repeat: translate Spanish comments on similar loaders
_LOADER = '''import csv


# Lee el archivo de {es_what} y devuelve una lista de filas
def load_{what}(path):
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            # Convierte {es_field} a número
            row["{field}"] = {conv}(row["{field}"])
            rows.append(row)
    return rows


# Suma {es_field} por {es_key}
def total_by_{key}(rows):
    totals = {{}}
    for row in rows:
        # Las claves que faltan empiezan en cero
        totals[row["{key}"]] = totals.get(row["{key}"], 0) + row["{field}"]
    return totals
'''

_LOADERS = [
    dict(what="sales", es_what="ventas", field="amount", es_field="el importe", conv="float", key="region",
         es_key="región"),
    dict(what="orders", es_what="pedidos", field="price", es_field="el precio", conv="float", key="customer",
         es_key="cliente"),
    dict(what="stock", es_what="existencias", field="quantity", es_field="la cantidad", conv="int",
         key="warehouse", es_key="almacén"),
    dict(what="visits", es_what="visitas", field="minutes", es_field="los minutos", conv="int", key="page",
         es_key="página"),
]

_TRANSLATE_TASK = "Translate the Spanish comments in this file into English; change nothing else."


def _edits(id: str, name: str, lang: str, text: str, first: str, *then: str) -> Conversation:
    """An ``edit`` conversation on one file: ``first`` comes with the file, each
    later request alone; every request ends with ``WHOLE_FILE``."""
    return Conversation(id, "edit", (_first(name, lang, text, first), *(f"{task} {WHOLE_FILE}" for task in then)))


def _repeats(id: str, task: str, template: str, fills: Sequence[Dict[str, str]], named_by: str) -> Conversation:
    """A ``repeat`` conversation: the same ``task`` on one Python file per entry
    of ``fills`` (``template`` filled with it), named after its ``named_by``."""
    return Conversation(id, "repeat", tuple(_first(f"{fill[named_by]}.py", "python", template.format(**fill), task)
                                            for fill in fills))


CONVERSATIONS: Tuple[Conversation, ...] = (
    _edits("python-edits", "tasks.py", "python", _TASKS,
           "Rename the class `TaskQueue` to `JobQueue`; change nothing else.",
           "Add a parameter `limit=None` to `pending`: when it is given, return at most `limit` names.",
           "`stats` raises AttributeError. Fix the bug.",
           "Add type hints to every method's parameters and return value.",
           "Make every comment start with a capital letter and end with a full stop."),
    _repeats("docstrings-repeat", _DOCSTRING_TASK, _VALIDATOR, _VALIDATORS, named_by="name"),
    _edits("js-edits", "cart.js", "javascript", _CART,
           "Translate the comments into English; change nothing else.",
           "The loop in `total` skips the first item. Fix it.",
           "Rename the method `remove` to `removeAll`.",
           "Give the parameter `quantity` of `add` a default value of 1.",
           "Add a method `count()` after `total` that returns the sum of the quantities.",
           "Rename the field `items` to `entries` everywhere."),
    _edits("text-edits", "REMOTE_WORK.md", "markdown", _POLICY,
           "Replace every \"Monday\" with \"Friday\".",
           "Fix the four spelling mistakes.",
           "Reformat the paragraph under \"Equipment\" as a bulleted list, one item per sentence.",
           "Add a section \"## Contact\" at the end with the line \"Questions go to hr@example.com.\""),
    _repeats("translate-repeat", _TRANSLATE_TASK, _LOADER, _LOADERS, named_by="what"),
    _edits("yaml-edits", "tests.yml", "yaml", _WORKFLOW,
           "Add \"3.12\" to the Python matrix.",
           "Rename the job `test` to `unit-tests`.",
           "Add a step named \"Lint\" before \"Test\" that runs `ruff check .`.",
           "Also run the workflow on pushes to branches named `release/*`.",
           "Rename the matrix variable `python` to `python-version` everywhere."),
)


def conversations(n: Optional[int] = None) -> List[Conversation]:
    """The first ``n`` conversations (all by default); their order mixes the kinds,
    so that any four hold both."""
    if n is not None and not 1 <= n <= len(CONVERSATIONS):
        raise ValueError(f"there are {len(CONVERSATIONS)} conversations; asked for {n}")
    return list(CONVERSATIONS[:n])
