"""Run the prompt suite through several runners, interleaved, in one process."""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Callable, Dict, List, Optional, Sequence

from ..suite import prompts as suite_prompts
from .backends import Sample, Settings
from .report import format_table, summarize

BASELINE = "llama-cpp-python"


def run_bench(
    runners: Sequence,
    tokenize: Callable[[str], List[int]],
    *,
    settings: Settings,
    categories: Optional[Sequence[str]] = None,
    per_category: Optional[int] = None,
    reps: int = 1,
    warmup: bool = True,
    progress: bool = True,
    baseline: str = BASELINE,
) -> Dict:
    """Every (repetition, prompt) is run by every runner back to back, so slow
    drifts of the machine hit all runners alike. Returns samples and summary."""
    items = suite_prompts(categories, per_category)
    prompt_tokens = {p.id: tokenize(p.text) for p in items}
    if warmup:  # page in weights, warm caches: the first run of a process is slow
        first = items[0]
        for r in runners:
            r.run(prompt_tokens[first.id], Settings(max_tokens=8, sampling=settings.sampling))
    samples: List[Sample] = []
    total = reps * len(items) * len(runners)
    bar = progress_bar(total, progress)
    for rep in range(reps):
        for p in items:
            for r in runners:
                s = r.run(prompt_tokens[p.id], settings)
                s.prompt_id, s.category = p.id, p.category
                samples.append(s)
                bar(f"{p.id} {r.name}")
    bar(None)
    table = summarize(samples, baseline)
    return {
        "settings": asdict(settings),
        "reps": reps,
        "baseline": baseline,
        "runners": [r.name for r in runners],
        "summary": table,
        "samples": [asdict(s) for s in samples],
        "table": format_table(table, [r.name for r in runners], baseline),
    }


def progress_bar(total: int, enabled: bool):
    """A one-line progress bar on stderr (a no-op when disabled)."""
    state = {"done": 0}

    def step(label: Optional[str]) -> None:
        if not enabled:
            return
        if label is None:
            sys.stderr.write("\n")
            sys.stderr.flush()
            return
        state["done"] += 1
        n = state["done"]
        filled = int(30 * n / max(total, 1))
        line = f"\r[{'#' * filled}{'.' * (30 - filled)}] {n}/{total} {label[:40]:<40}"
        if sys.stderr.isatty():
            sys.stderr.write(line)
        elif n == total or n % max(1, total // 10) == 0:
            sys.stderr.write(line.strip() + "\n")
        sys.stderr.flush()

    return step
