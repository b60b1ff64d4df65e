"""What `pyspec bench editor`'s typing workload types (editor.py runs it and
sums it up): sites in files of the running interpreter's standard library
(code this project did not write), the /infill requests llama.vim would send
while each is typed, and the rules that judge a suggestion.

Two kinds of site:

- end of line (the default): a single-line statement of a function body,
  indented, :data:`MIN_CHARS` long, typed in ``steps`` steps after 1/steps ...
  steps/steps of its characters after the indentation;
- fresh lines (``fresh=True``): the first line of any statement (module
  level, ``def`` and ``class`` lines, control flow included),
  :data:`FRESH_MIN_CHARS` long, typed from its bare indentation, as just after
  Enter (the plugin's first request on a new line), then the same steps.

Either way the line is new: it is taken out of the file, its rest is empty
(typing at its end), and the lines after it stay in the suffix.
"""

from __future__ import annotations

import ast
import math
import os
import random
import sysconfig
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

#: Standard-library files the sites come from (those the interpreter lacks are skipped).
FILES = ("argparse.py", "calendar.py", "configparser.py", "csv.py", "dataclasses.py", "difflib.py", "fractions.py",
         "heapq.py", "json/decoder.py", "json/encoder.py", "shlex.py", "statistics.py", "string.py", "textwrap.py",
         "tokenize.py")
MIN_CHARS = 20
FRESH_MIN_CHARS = 8  # fresh lines: short heads ("else:" aside) count too
SAMPLERS = ("top_k", "top_p", "infill")
TYPED_MS, PREFETCH_MS = 250, 1000
RESPONSE_FIELDS = ("content", "tokens_predicted", "tokens_evaluated", "tokens_cached", "truncated", "stop_type",
                   "timings/prompt_n", "timings/prompt_ms", "timings/cache_n", "timings/predicted_n",
                   "timings/predicted_ms", "timings/draft_n", "timings/draft_n_accepted")




@dataclass(frozen=True)
class Site:
    """A line to type: ``file`` (relative to the stdlib), ``line_no`` (1-based), the lines around it."""

    file: str
    line_no: int
    line: str
    before: Tuple[str, ...]
    after: Tuple[str, ...]
    fresh: bool = False  # typed from its bare indentation (module docstring)

    @property
    def indent(self) -> int:
        return len(self.line) - len(self.line.lstrip())


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def candidates(source: str, fresh: bool = False) -> List[int]:
    """1-based numbers of the lines a site may be: a statement that starts its
    line, not a docstring; by default a single-line one inside a function
    body, indented, :data:`MIN_CHARS` long; ``fresh``: any statement's first
    line, :data:`FRESH_MIN_CHARS` long."""
    lines = source.split("\n")
    tree = ast.parse(source)
    out = set()
    scopes = [tree] if fresh else [fn for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef,
                                                                                   ast.AsyncFunctionDef))]
    for scope in scopes:
        for node in ast.walk(scope):
            if node is scope or not isinstance(node, ast.stmt) or (not fresh and node.lineno != node.end_lineno):
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value,
                                                                                                   str):
                continue
            text = lines[node.lineno - 1]
            indent = len(text) - len(text.lstrip())
            if node.col_offset != indent or len(text.strip()) < (FRESH_MIN_CHARS if fresh else MIN_CHARS):
                continue
            if fresh or (indent > 0 and node.lineno > scope.lineno):
                out.add(node.lineno)
    return sorted(out)


def stdlib_texts(root: str, files: Sequence[str]) -> Dict[str, str]:
    """The text of each of ``files`` under ``root`` that exists (none: ValueError)."""
    out = {}
    for f in files:
        path = os.path.join(root, f)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                out[f] = fh.read().replace("\r\n", "\n")
    if not out:
        raise ValueError(f"none of the standard library's files {', '.join(files)} are in {root}")
    return out


def sites(n: int, seed: int = 0, *, prefix_lines: int = 64, suffix_lines: int = 16, root: Optional[str] = None,
          files: Sequence[str] = FILES, fresh: bool = False) -> List[Site]:
    """``n`` sites, the same for the same seed (and interpreter): files taken
    in a seeded order, round robin, one seeded line of each at a time."""
    texts = stdlib_texts(root or stdlib_dir(), files)
    rng = random.Random(seed)
    order = sorted(texts)
    rng.shuffle(order)
    pools = {f: candidates(texts[f], fresh) for f in order}
    order = [f for f in order if pools[f]]
    out: List[Site] = []
    while len(out) < n and any(pools[f] for f in order):
        for f in order:
            if len(out) == n or not pools[f]:
                continue
            k = pools[f].pop(rng.randrange(len(pools[f])))
            lines = texts[f].split("\n")
            out.append(Site(f, k, lines[k - 1], tuple(lines[max(0, k - 1 - prefix_lines):k - 1]),
                            tuple(lines[k:k + suffix_lines]), fresh))
    return out


def cuts(site: Site, steps: int) -> List[int]:
    """Cursor positions of the typed steps: after 1/steps ... steps/steps of the
    characters after the indentation (strictly growing; the last is the line's
    end); a fresh site's first is the bare indentation."""
    body = len(site.line) - site.indent
    out = [site.indent] if site.fresh else []
    return list(dict.fromkeys(out + [site.indent + max(1, math.ceil(body * j / steps)) for j in range(1, steps + 1)]))


def infill_body(prefix: str, prompt: str, suffix: str, *, n_predict: int, t_max_ms: int,
                temperature: Optional[float] = 0.0) -> dict:
    """One /infill request as llama.vim sends it; ``temperature`` None: not sent."""
    body = {"input_prefix": prefix, "input_suffix": suffix, "prompt": prompt, "input_extra": [],
            "n_predict": n_predict, "n_indent": len(prompt) - len(prompt.lstrip()), "t_max_predict_ms": t_max_ms,
            "top_k": 40, "top_p": 0.90, "samplers": list(SAMPLERS), "stream": False, "cache_prompt": True,
            "id_slot": 0, "response_fields": list(RESPONSE_FIELDS)}
    if temperature is not None:
        body["temperature"] = temperature
        body["samplers"].append("temperature")
    return body


def site_requests(site: Site, steps: int, *, n_predict: int = 32, temperature: Optional[float] = 0.0) -> List[dict]:
    """The typed steps, then the prefetch: ``{"kind", "step", "cut", "rest", "body"}``
    (``rest``: what the user goes on to type on the line; None for the prefetch)."""
    prefix = "".join(x + "\n" for x in site.before)
    suffix = "\n" + "".join(x + "\n" for x in site.after)
    out = [{"kind": "typed", "step": j, "cut": c, "rest": site.line[c:],
            "body": infill_body(prefix, site.line[:c], suffix, n_predict=n_predict, t_max_ms=TYPED_MS,
                                temperature=temperature)}
           for j, c in enumerate(cuts(site, steps))]
    out.append({"kind": "prefetch", "step": len(out), "cut": 0, "rest": None,
                "body": infill_body(prefix + site.line + "\n", "", suffix, n_predict=n_predict, t_max_ms=PREFETCH_MS,
                                    temperature=temperature)})
    return out


def is_right(content: str, rest: str) -> bool:
    """The suggestion's first line is a non-empty prefix of ``rest``, or equals it."""
    first = content.split("\n", 1)[0]
    return first == rest or (first != "" and rest.startswith(first))


def is_whole(content: str, rest: str) -> bool:
    """Accepting the whole suggestion writes exactly ``rest`` (the rest of the
    line; the lines after it are already there), trailing whitespace aside:
    a suggestion that runs on into more lines would duplicate or invent code."""
    return content.rstrip() == rest.rstrip()
