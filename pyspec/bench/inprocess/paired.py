"""Paired benchmark: can a configuration be 3 % slower than another?

A per-prompt median of two runs moves by about +-8 % on these machines, so a
systematic 5 % loss hides in it. Here every (prompt, repetition) runs all
configurations back to back, in ABBA order (the order reverses every other
repetition, so a drift of the machine's speed within a pair cancels; with more
than two configurations it also rotates, so that over 2n repetitions each of n
runs at every position equally often: the first run after a new prompt was
measured ~2 % slower), and the figure is the ratio of decode speeds *within* a
pair:

    ratio(p, r)  = rate_B(p, r) / rate_A(p, r)          one prompt p, one repetition r
    ratio(p)     = geometric mean over r of ratio(p, r)
    ratio(group) = geometric mean over the group's prompts of ratio(p)

Its 95 % interval is a two-stage bootstrap: resample the group's prompts with
replacement, then each drawn prompt's repetitions with replacement, and take
the 2.5 / 97.5 percentiles of the resampled ratio. Both sources of
uncertainty (which prompts, which runs) are in the interval.

Decode speed is tokens after the first per second after the first (as
``pyspec bench paired``): the prompt is processed by the same kernels on both sides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence

from ..stats import bootstrap_interval, geo_mean, run_order
from ..suite import BenchPrompt
from .backends import Sample, Settings

# Categories whose answers copy most of the prompt (where drafting must win),
# and those whose answers a grammar shapes; everything else is "ordinary"
# text (where drafting must not lose).
COPY_CATEGORIES = ("code_editing", "doc_correction")
CONSTRAINED_CATEGORIES = ("json", "tools", "grammar")
GROUPS = ("ordinary", "copy", "constrained", "all")


@dataclass(frozen=True)
class Config:
    """A named configuration: drafter and policy (None: plain decoding), or
    a ``Llama`` class's create_completion (``api``: "llama_cpp" or "pyspec")."""

    name: str
    drafter: Optional[str] = None
    policy: Optional[str] = None
    draft_max: Optional[int] = None
    api: Optional[str] = None

    @property
    def needs_draft_model(self) -> bool:
        from ...speculative import DRAFTERS

        return self.drafter is not None and DRAFTERS[self.drafter]["needs_draft_model"]


# The names users type most; anything else is DRAFTER[:POLICY[:K]].
ALIASES = {
    "plain": Config("plain"),
    "default": Config("default", "hybrid", "auto"),  # SpeculativeDecoder(target, draft)'s defaults
    "llama-cpp-python": Config("llama-cpp-python", api="llama_cpp"),  # llama_cpp.Llama(target)
    "pyspec.Llama": Config("pyspec.Llama", api="pyspec"),  # pyspec.Llama(target), the drop-in
}


def parse_config(text: str) -> Config:
    """``plain``, ``default`` (hybrid + auto with the draft model),
    ``llama-cpp-python`` and ``pyspec.Llama`` (the two Llama classes'
    create_completion), or ``DRAFTER[:POLICY[:K]]`` such as ``ngram`` (auto),
    ``model:fixed:4``."""
    from ...speculative import DRAFTERS, POLICIES

    text = text.strip()
    if text in ALIASES:
        return ALIASES[text]
    parts = text.split(":")
    if len(parts) > 3 or parts[0] not in DRAFTERS:
        raise ValueError(f"unknown configuration {text!r}: use plain, default or DRAFTER[:POLICY[:K]] with a "
                         f"drafter of {', '.join(DRAFTERS)}")
    policy = parts[1] if len(parts) > 1 and parts[1] else "auto"
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} in {text!r}; choose from {', '.join(POLICIES)}")
    k = None
    if len(parts) == 3:
        try:
            k = int(parts[2])
        except ValueError:
            k = -1
        if k < 1:
            raise ValueError(f"{text!r}: K must be an integer >= 1")
    return Config(text, parts[0], policy, k)


def run_paired(runners: Sequence, items: Sequence[BenchPrompt], tokenize: Callable[[BenchPrompt], List[int]], *,
               settings: Settings, reps: int, progress: Callable[[Optional[str]], None],
               constrain: Callable[[BenchPrompt], object] = lambda p: None) -> List[Sample]:
    """Every (repetition, prompt) runs every runner back to back (run_order),
    under the prompt's constraint (``constrain``; None: free text).
    Repetition r uses seed settings.seed + r on every side."""
    tokens = {p.id: tokenize(p) for p in items}
    constraints = {p.id: constrain(p) for p in items}
    samples: List[Sample] = []
    for rep in range(reps):
        order = run_order(list(runners), rep)
        s_rep = replace(settings, seed=settings.seed + rep)
        for p in items:
            for r in order:
                s = r.run(tokens[p.id], s_rep, constraints[p.id])
                s.prompt_id, s.category = p.id, p.category
                s.extra["rep"] = rep
                samples.append(s)
                progress(f"{p.id} {r.name}")
    return samples


def _rate(s: Sample) -> float:
    return s.decode_tokens / s.decode_s if s.decode_tokens > 0 and s.decode_s > 0 else float("nan")


def pair_logs(samples: Sequence[Sample], base: str, other: str) -> Dict[str, List[float]]:
    """{prompt id: [log(rate_other / rate_base) for each repetition where both ran]}."""
    by_key = {(s.runner, s.prompt_id, s.extra.get("rep", 0)): s for s in samples}
    out: Dict[str, List[float]] = {}
    for (runner, pid, rep), s in by_key.items():
        if runner != base or (other, pid, rep) not in by_key:
            continue
        a, b = _rate(s), _rate(by_key[(other, pid, rep)])
        if a > 0 and b > 0:
            out.setdefault(pid, []).append(math.log(b / a))
    return out


def _median(xs: Sequence[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else 0.5 * (ys[n // 2 - 1] + ys[n // 2])


def summarize_pair(samples: Sequence[Sample], base: str, other: str, n_boot: int = 2000,
                   seed: int = 0) -> Dict[str, dict]:
    """{group or category: figures of ``other`` against ``base``}: the geometric
    mean ratio with its bootstrap interval, how many prompts ran below 1.00x
    (at their median over repetitions), and the worst prompt."""
    logs = pair_logs(samples, base, other)
    cat_of = {s.prompt_id: s.category for s in samples}
    cats = list(dict.fromkeys(s.category for s in samples))
    members = {c: [p for p in logs if cat_of[p] == c] for c in cats}
    members["ordinary"] = [p for p in logs if cat_of[p] not in COPY_CATEGORIES + CONSTRAINED_CATEGORIES]
    members["copy"] = [p for p in logs if cat_of[p] in COPY_CATEGORIES]
    members["constrained"] = [p for p in logs if cat_of[p] in CONSTRAINED_CATEGORIES]
    members["all"] = list(logs)
    out: Dict[str, dict] = {}
    for name in cats + list(GROUPS):
        pids = members[name]
        if not pids:
            continue
        groups = [logs[p] for p in pids]
        lo, hi = bootstrap_interval(groups, n_boot, seed)
        medians = {p: math.exp(_median(logs[p])) for p in pids}
        worst = min(medians, key=medians.get)
        out[name] = {
            "ratio": geo_mean(groups), "low": lo, "high": hi, "n_prompts": len(pids),
            "n_pairs": sum(len(g) for g in groups), "below_1": sum(m < 1.0 for m in medians.values()),
            "worst_prompt": worst, "worst_ratio": medians[worst],
            "per_prompt": medians,
        }
    return out


def constrained_figures(samples: Sequence[Sample], items: Sequence[BenchPrompt],
                        template_source: Optional[str]) -> Dict[str, dict]:
    """Per configuration, over its constrained answers: how many are valid (and
    how many ran out of tokens first), text forced per answer and its share of
    the drafted tokens, and the grammar's masks: microseconds each and their
    share of the decode time."""
    from ..structured import valid

    task = {p.id: p.task for p in items if p.task is not None}
    out: Dict[str, dict] = {}
    for s in samples:
        if s.prompt_id not in task:
            continue
        f = out.setdefault(s.runner, {"answers": 0, "valid": 0, "cut_short": 0, "forced": 0, "drafted": 0,
                                      "masks": 0, "mask_s": 0.0, "decode_s": 0.0})
        x = s.extra
        f["answers"] += 1
        if x["stop_reason"] == "max_tokens":
            f["cut_short"] += 1
        else:
            f["valid"] += valid(task[s.prompt_id], x["text"], template_source)
        f["forced"] += x["forced_drafted"]
        f["drafted"] += x["drafted"]
        f["masks"] += x["masks"]
        f["mask_s"] += x["mask_s"]
        f["decode_s"] += s.decode_s + s.ttft_s
    for f in out.values():
        f["forced_per_answer"] = f["forced"] / f["answers"]
        f["forced_share_of_drafted"] = f["forced"] / f["drafted"] if f["drafted"] else 0.0
        f["mask_us"] = 1e6 * f["mask_s"] / f["masks"] if f["masks"] else 0.0
        f["mask_share"] = f["mask_s"] / f["decode_s"] if f["decode_s"] else 0.0
    return out


def format_constrained(figures: Dict[str, dict]) -> str:
    lines = ["constrained answers: valid (of those finished; cut short by max_tokens apart), forced text "
             "drafted per answer and its share of the drafted tokens, grammar masks (us each, share of the time)"]
    for name, f in figures.items():
        lines.append(f"  {name:<12} valid {f['valid']}/{f['answers'] - f['cut_short']} (cut short {f['cut_short']})"
                     f"  forced {f['forced_per_answer']:.1f}/answer ({100 * f['forced_share_of_drafted']:.0f} % of "
                     f"drafted)  masks {f['mask_us']:.0f} us ({100 * f['mask_share']:.1f} % of the time)")
    return "\n".join(lines)


def comparisons(names: Sequence[str]) -> List[tuple]:
    """(earlier, later) for every pair of configurations: each against the first,
    then against every other earlier one (plain,ngram,default: ngram / plain,
    default / plain, default / ngram)."""
    return [(a, b) for j, b in enumerate(names) for a in names[:j]]


def summarize_all(samples: Sequence[Sample], names: Sequence[str], seed: int = 0) -> Dict[str, Dict[str, dict]]:
    """{"B / A": summarize_pair(samples, A, B)} for every comparison, the first
    configuration's first."""
    pairs = sorted(comparisons(names), key=lambda ab: names.index(ab[0]))
    return {f"{b} / {a}": summarize_pair(samples, a, b, seed=seed) for a, b in pairs}


def format_paired(summary: Dict[str, Dict[str, dict]]) -> str:
    lines = ["decode speed ratio B / A: geometric mean over prompts, 95 % bootstrap interval "
             "(prompts and repetitions resampled); 'below' = prompts under 1.00x at their median"]
    for pair, rows in summary.items():
        lines.append(f"[{pair}]")
        lines.append(f"  {'group':<15} {'ratio':>7}  {'95 % interval':>15}  {'prompts':>7}  {'below':>5}  worst")
        for name, r in rows.items():
            lines.append(f"  {name:<15} {r['ratio']:6.3f}x  [{r['low']:.3f}, {r['high']:.3f}]  {r['n_prompts']:7d}  "
                         f"{r['below_1']:5d}  {r['worst_prompt']} {r['worst_ratio']:.2f}x")
    return "\n".join(lines)


def plot_paired(result: dict, path: str) -> None:
    """One panel per comparison: each prompt's median ratio (dots)
    and each category's / group's geometric mean with its interval (bars)."""
    from ..plot import palette, pyplot

    plt = pyplot()
    pairs = result["paired"]
    fig, axes = plt.subplots(1, len(pairs), figsize=(7 * len(pairs), 6), squeeze=False)
    colours = palette(2)
    for ax, (pair, rows) in zip(axes[0], pairs.items()):
        names = list(rows)
        for y, name in enumerate(names):
            r = rows[name]
            group = name in GROUPS
            ax.errorbar([r["ratio"]], [y], xerr=[[r["ratio"] - r["low"]], [r["high"] - r["ratio"]]], fmt="s",
                        color=colours[1 if group else 0], capsize=4)
            if not group:
                ax.scatter(list(r["per_prompt"].values()), [y + 0.2] * len(r["per_prompt"]), s=12, color="grey")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.axvline(0.98, color="red", linewidth=0.6, linestyle=":", label="0.98")
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names)
        ax.invert_yaxis()
        ax.set_xlabel("decode tok/s ratio (95 % bootstrap interval; dots: prompts' medians)")
        ax.set_title(f"{pair}, T = {result['settings']['sampling']['temperature']}, "
                     f"{result['settings']['max_tokens']} tokens, {result['reps']} reps")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
