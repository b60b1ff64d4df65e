"""The benchmark prompt suite, in the spirit of Spec-Bench: a few chat prompts
per category. Code editing and document correction are deliberately copy-heavy
(the answer repeats most of the prompt with a few edits), which is where cheap
drafters shine; math and creative writing are where drafting must not cost.
The constrained categories (JSON, tool calls, a grammar: structured.py) run
only when asked for by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from . import structured
from .structured import Task

_CLASS = '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count=1):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count=1):
        if name not in self.items:
            raise KeyError(name)
        self.items[name] -= count
        if self.items[name] <= 0:
            del self.items[name]

    def total(self):
        return sum(self.itms.values())

    def report(self):
        lines = []
        for name, count in sorted(self.items.items()):
            lines.append(f"{name}: {count}")
        return "\\n".join(lines)
'''

_FUNC = '''def parse_config(path):
    config = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config


def load_settings(path, defaults):
    settings = dict(defaults)
    settings.update(parse_config(path))
    return settings
'''

_JS = '''function formatPrice(amount, currency) {
  const rounded = Math.round(amount * 100) / 100;
  return currency + " " + rounded.toFixed(2);
}

function totalPrice(items, currency) {
  let sum = 0;
  for (const item of items) {
    sum += item.price * item.quantity;
  }
  return formatPrice(sum, currency);
}
'''

_ARTICLE = (
    "The city council met on Tuesday to discuss the new public transport plan. The plan adds "
    "three bus lines connecting the northern suburbs with the city centre, extends the tram "
    "line to the university campus, and introduces a single ticket valid on buses, trams and "
    "regional trains for ninety minutes. Supporters say the changes will cut commuting times "
    "and reduce traffic in the centre. Critics worry about the cost, estimated at 40 million "
    "euros over five years, and about construction works on the main avenue. The council will "
    "vote on the plan next month after a public consultation."
)

_TYPO_PARAGRAPH = (
    "Our team has recieved many questions about the new schedule. Starting next month, the "
    "office will open at eight in the morning and close at six in the evening. Employes who "
    "prefer to work remotly can do so on Mondays and Fridays, but they must be availble for "
    "meetings between ten and twelve. Please adress any concerns to your manager before the "
    "end of the week, so that we can acommodate everyone's needs. Thank you for your "
    "patience during this transition."
)

_MODULE = '''import json


def load_users(path):
    with open(path) as f:
        return json.load(f)


def find_user(users, name):
    for user in users:
        if user["name"] == name:
            return user
    return None


def average_age(users):
    total = 0
    for user in users:
        total += user["age"]
    return total / len(users)


def save_users(users, path):
    with open(path, "w") as f:
        json.dump(users, f, indent=2)
'''

_SCHEMA = (
    "Tables: customers(id, name, city, created_at), orders(id, customer_id, total, placed_at), "
    "order_items(order_id, product_id, quantity, price), products(id, name, category)."
)

PROMPTS: Dict[str, List[str]] = {
    "code": [
        "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
        "Write a C function that reverses a singly linked list in place.",
        "Write a Python class implementing a stack with push, pop, peek and is_empty.",
    ],
    "code_editing": [
        "Fix the typo in this class (an attribute name is misspelled) and return the whole corrected "
        "class, unchanged otherwise:\n\n" + _CLASS,
        "Add type hints to these functions and return the complete code, unchanged otherwise:\n\n" + _FUNC,
        "Rename the parameter `currency` to `currencyCode` everywhere in this code and return the "
        "complete code:\n\n" + _JS,
        "Change `average_age` so that it returns 0 for an empty list, and return the whole file with "
        "only that function changed:\n\n" + _MODULE,
    ],
    "doc_correction": [
        "Correct the spelling mistakes in this paragraph and return the full corrected text, "
        "unchanged otherwise:\n\n" + _TYPO_PARAGRAPH,
        "Replace every mention of 'Mondays and Fridays' with 'Tuesdays and Thursdays' in this text and "
        "return the full text:\n\n" + _TYPO_PARAGRAPH,
    ],
    "sql": [
        _SCHEMA + " Write a SQL query that returns the ten customers with the highest total order "
        "value in 2024, with their city.",
        _SCHEMA + " Write a SQL query that lists, for each product category, the number of orders "
        "and the revenue, sorted by revenue.",
    ],
    "math": [
        "A train travels 180 km in 2.5 hours. What is its average speed in km/h? Explain step by step.",
        "Solve for x: 3x + 7 = 22. Show your steps.",
        "What is the sum of the integers from 1 to 100? Explain the method.",
    ],
    "qa": [
        "What is the difference between a process and a thread?",
        "Why is the sky blue?",
        "What does HTTP status code 404 mean?",
    ],
    "summarization": [
        "Summarize the following article in two sentences:\n\n" + _ARTICLE,
        "List the three main points of this article as bullet points:\n\n" + _ARTICLE,
    ],
    "translation": [
        "Translate into French: 'The meeting has been moved to Thursday afternoon because the "
        "manager is travelling.'",
        "Translate into German: 'Please remember to save your work before closing the program.'",
        "Translate into Spanish: 'The library opens at nine and closes at six on weekdays.'",
    ],
    "creative": [
        "Write a short poem about a lighthouse in winter.",
        "Write the opening paragraph of a mystery story set on a train.",
        "Describe a sunrise over the mountains in a few vivid sentences.",
    ],
}

FREE_CATEGORIES = tuple(PROMPTS)
CATEGORIES = FREE_CATEGORIES + structured.CATEGORIES


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    index: int
    text: str
    task: Optional[Task] = None  # the constrained categories' (structured.py); None: free text

    @property
    def id(self) -> str:
        return f"{self.category}/{self.index}"


def prompts(categories: Optional[Sequence[str]] = None, per_category: Optional[int] = None) -> List[BenchPrompt]:
    """The suite's prompts (by default the free-text categories), optionally
    restricted to some categories and to the first ``per_category`` prompts of each."""
    chosen = list(categories) if categories else list(FREE_CATEGORIES)
    unknown = [c for c in chosen if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"unknown categories {unknown}; choose from {', '.join(CATEGORIES)}")
    out = []
    for cat in chosen:
        if cat in PROMPTS:
            items = PROMPTS[cat][:per_category] if per_category else PROMPTS[cat]
            out.extend(BenchPrompt(cat, i, t) for i, t in enumerate(items))
        else:
            tasks = structured.TASKS[cat][:per_category] if per_category else structured.TASKS[cat]
            out.extend(BenchPrompt(cat, i, t, task) for i, (t, task) in enumerate(tasks))
    return out
