"""Multi-turn conversations in one process (`pyspec bench multiturn`).

Each conversation of ``../conversations.py`` runs turn by turn. At every turn the
sides generate from the same prompt, back to back, greedy:

* ``plain``: the target's own ``generate`` (plain decoding);
* ``default``: ``SpeculativeDecoder(target)``, the suffix drafter under the
  auto policy, with a memory of the conversation's earlier requests (a fresh
  :class:`~pyspec.Memory` per conversation, as the server keeps one per user);
* ``memory off``: the same decoder with ``memory=False`` (it still looks up
  the prompt), so that the report shows what memory adds.

The order of the sides rotates and reverses from turn to turn (``run_order`` of
``paired.py``: each side at every position equally often). The next turn's
prompt holds the *default* side's answers, so that every side sees the same
text; greedy decoding is lossless, so the other sides' answers must equal it,
and the report lists any that do not (a near tie decided differently by a
batched verification is the expected cause, not a wrong draft).

Figures are the paired ones of ``paired.py``: per turn, the ratio of decode
speeds (tokens after the first per second after the first) of two sides; over
a conversation, their geometric mean over turns 2 onwards (turn 1 has no
history to copy from); over conversations, the geometric mean with a 95 %
two-stage bootstrap interval (conversations, then their turns, resampled).

Why the target is loaded without a memory of its own: a Model's generations
join ``Model.memory``, so the plain side's answer would be handed to the
default side as a draft of the very text it is about to write.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ...memory import Memory
from ...sampling import Sampling
from ..conversations import RAW_STOP, Conversation, transcript
from ..stats import bootstrap_interval, run_order
from .backends import Sample
from .paired import comparisons, pair_logs

PLAIN, DEFAULT, NO_MEMORY = "plain", "default", "memory off"
# Stats copied into a turn's record (the per-position arrays stay out).
_STATS = ("n_generated", "ttft_s", "decode_s", "decode_tok_s", "rounds", "drafted", "accepted", "memory_rounds",
          "memory_drafted", "memory_accepted", "policy_plain")


def make_sides(target, *, memory_mb: float, memory_off: bool = True) -> List[Tuple[str, object]]:
    """(name, generator) of each side over ``target`` (loaded with ``memory_mb=0``)."""
    from ...speculative import SpeculativeDecoder

    if target.memory is not None:
        raise ValueError("load the target with memory_mb=0: its plain generations would feed the default side")
    sides = [(PLAIN, target), (DEFAULT, SpeculativeDecoder(target, memory=Memory(memory_mb)))]
    if memory_off:
        sides.append((NO_MEMORY, SpeculativeDecoder(target, memory=False)))
    return sides


def prompt_tokens(target, messages: Sequence[dict], raw: bool) -> List[int]:
    """The chat template's rendering of ``messages``, or a plain transcript (``raw``)."""
    if raw:
        return target.tokenize(transcript(messages), add_special=True)
    return target.prompt_tokens(list(messages))


def run_multiturn(target, sides: Sequence[Tuple[str, object]], convs: Sequence[Conversation], *, max_tokens: int,
                  raw: bool = False, progress: Callable[[Optional[str]], None] = lambda _: None) -> List[dict]:
    """Every conversation, turn by turn, every side at every turn. Returns one
    record per (conversation, turn): the prompt's size, the order the sides
    ran in, each side's figures and whether its answer equals the default's."""
    names = [n for n, _ in sides]
    stop = list(RAW_STOP) if raw else None
    records: List[dict] = []
    k = 0  # turns so far: the rotation of the order
    for conv in convs:
        for _, gen in sides:  # each conversation starts with an empty memory
            if gen.memory is not None:
                gen.memory.clear()
        answers: List[str] = []
        for turn in range(len(conv.turns)):
            tokens = prompt_tokens(target, conv.messages(turn, answers), raw)
            order = run_order(list(sides), k)
            k += 1
            outs = {}
            for name, gen in order:
                outs[name] = gen.generate(tokens, max_tokens=max_tokens, sampling=Sampling.GREEDY, seed=0, stop=stop)
                progress(f"{conv.id} {turn + 1}/{len(conv.turns)} {name}")
            ref = outs[DEFAULT]
            answers.append(ref.text)
            records.append({
                "conversation": conv.id, "kind": conv.kind, "turn": turn + 1, "n_prompt": len(tokens),
                "order": [n for n, _ in order],
                "sides": {n: {**{f: getattr(outs[n].stats, f) for f in _STATS}, "stop_reason": outs[n].stop_reason}
                          for n in names},
                "equal": {n: outs[n].tokens == ref.tokens for n in names if n != DEFAULT},
                "first_difference": {n: _first_difference(outs[n].tokens, ref.tokens) for n in names
                                     if n != DEFAULT and outs[n].tokens != ref.tokens},
            })
    return records


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def samples(records: Sequence[dict]) -> List[Sample]:
    """The records as paired.py's samples: a conversation is a "prompt", a turn
    a "repetition" (``extra["rep"]``), so its pairing and bootstrap apply."""
    out = []
    for r in records:
        for name, s in r["sides"].items():
            out.append(Sample(name, r["conversation"], r["kind"], r["n_prompt"], s["n_generated"], s["ttft_s"],
                              s["decode_s"], {"rep": r["turn"], **s}))
    return out


def _geo(groups: Sequence[Sequence[float]]) -> float:
    """Geometric mean over groups of each group's geometric mean (logs in)."""
    return math.exp(sum(sum(g) / len(g) for g in groups) / len(groups)) if groups else float("nan")


def _figure(logs: Dict[str, List[float]], seed: int) -> dict:
    groups = [logs[c] for c in logs if logs[c]]
    lo, hi = bootstrap_interval(groups, seed=seed)
    return {"ratio": _geo(groups), "low": lo, "high": hi, "n_conversations": len(groups),
            "n_turns": sum(len(g) for g in groups)}


def summarize(records: Sequence[dict], names: Sequence[str], seed: int = 0) -> Dict[str, dict]:
    """{"B / A": figures} for every pair of sides (each against every earlier one:
    default / plain, memory off / plain, default / memory off): over turns 2
    onwards, over turn 1, per turn, and per conversation (turns 2 onwards)."""
    ss = samples(records)
    later = [s for s in ss if s.extra["rep"] >= 2]
    out: Dict[str, dict] = {}
    for a, b in comparisons(names):
        if (a, b) == (DEFAULT, NO_MEMORY):
            a, b = b, a  # what memory adds: "default / memory off"
        logs = pair_logs(later, a, b)
        turns = sorted({s.extra["rep"] for s in ss})
        out[f"{b} / {a}"] = {
            "turns 2+": _figure(logs, seed),
            "turn 1": _figure(pair_logs([s for s in ss if s.extra["rep"] == 1], a, b), seed),
            "per_turn": {str(t): _figure(pair_logs([s for s in ss if s.extra["rep"] == t], a, b), seed)
                         for t in turns},
            "per_conversation": {c: math.exp(sum(x) / len(x)) for c, x in logs.items() if x},
        }
    return out


def _rate(side: dict) -> float:
    n = side["n_generated"] - 1
    return n / side["decode_s"] if n > 0 and side["decode_s"] > 0 else float("nan")


def add_turn_ratios(records: Sequence[dict], pairs: Sequence[str]) -> None:
    """Each record's own ratio of every pair ("B / A") of ``summarize``."""
    for r in records:
        r["ratios"] = {}
        for pair in pairs:
            b, a = pair.split(" / ")
            r["ratios"][pair] = _rate(r["sides"][b]) / _rate(r["sides"][a])


def side_totals(records: Sequence[dict], names: Sequence[str]) -> Dict[str, dict]:
    """Each side's counts pooled over turns 2 onwards: decode tok/s (a ratio of
    sums), acceptance, tokens per target pass, and the share of accepted drafts
    that came from memory."""
    out = {}
    for n in names:
        ss = [r["sides"][n] for r in records if r["turn"] >= 2]
        tot = {f: sum(s[f] for s in ss) for f in ("n_generated", "decode_s", "rounds", "drafted", "accepted",
                                                  "memory_drafted", "memory_accepted")}
        decode_tokens = sum(max(s["n_generated"] - 1, 0) for s in ss)
        out[n] = {
            "decode_tok_s": decode_tokens / tot["decode_s"] if tot["decode_s"] > 0 else float("nan"),
            "acceptance": tot["accepted"] / tot["drafted"] if tot["drafted"] else None,
            "tokens_per_pass": tot["n_generated"] / tot["rounds"] if tot["rounds"] else None,
            "from_memory": tot["memory_accepted"] / tot["accepted"] if tot["accepted"] else None,
            **tot,
        }
    return out


def format_report(summary: Dict[str, dict], totals: Dict[str, dict], records: Sequence[dict]) -> str:
    """The ratios (turns 2+ with the interval, turn 1, each turn), each side's
    pooled figures, each conversation's ratios and the answers that differ."""
    n_turns = max(r["turn"] for r in records)
    convs = list(dict.fromkeys(r["conversation"] for r in records))
    lines = [f"decode speed ratio B / A over {len(convs)} conversations, greedy: geometric mean over conversations "
             f"of turns 2+ with a 95 % bootstrap interval (conversations and turns resampled); per turn: over "
             f"conversations"]
    head = f"  {'B / A':<22} {'turns 2+':>8}  {'95 % interval':>15}  " + " ".join(
        f"{'turn ' + str(t):>7}" for t in range(1, n_turns + 1))
    lines.append(head)
    for pair, s in summary.items():
        a = s["turns 2+"]
        per = " ".join(f"{s['per_turn'].get(str(t), {}).get('ratio', float('nan')):6.2f}x"
                       for t in range(1, n_turns + 1))
        lines.append(f"  {pair:<22} {a['ratio']:7.3f}x  [{a['low']:.3f}, {a['high']:.3f}]  {per}")
    lines.append("each side over turns 2+ (pooled): decode tok/s, acceptance, tokens per target pass, accepted "
                 "drafts that came from memory")

    def fmt(v, spec: str) -> str:
        return format(v, spec) if v is not None else "-"

    for n, t in totals.items():
        lines.append(f"  {n:<12} {t['decode_tok_s']:7.1f} tok/s  accept {fmt(t['acceptance'], '.2f'):>5}  "
                     f"L {fmt(t['tokens_per_pass'], '.2f'):>5}  from memory {fmt(t['from_memory'], '.2f'):>5}")
    lines.append("per conversation (turns 2+):")
    pairs = list(summary)
    lines.append(f"  {'conversation':<20} {'kind':<7} " + " ".join(f"{p:>22}" for p in pairs))
    kinds = {r["conversation"]: r["kind"] for r in records}
    for c in convs:
        vals = " ".join(f"{summary[p]['per_conversation'].get(c, float('nan')):21.2f}x" for p in pairs)
        lines.append(f"  {c:<20} {kinds[c]:<7} {vals}")
    lines.append(answers_line(records))
    return "\n".join(lines)


def answers_line(records: Sequence[dict]) -> str:
    """How many turns' answers equal the default side's, per side, and where not."""
    sides = list(records[0]["equal"]) if records else []
    parts = [f"{n}: {sum(r['equal'][n] for r in records)}/{len(records)}" for n in sides]
    text = "answers equal to the default side's (greedy, lossless): " + ", ".join(parts)
    diffs = [f"{r['conversation']} turn {r['turn']} {n} (from token {i})" for r in records
             for n, i in r["first_difference"].items()]
    return text + ("\n  differ: " + "; ".join(diffs) if diffs else "")


def plot(result: dict, path: str) -> None:
    """Each comparison's ratio per turn (geometric mean over conversations, with
    its interval) and over turns 2+ (the dashed line)."""
    from ..plot import palette, pyplot

    plt = pyplot()
    summary = result["summary"]
    fig, ax = plt.subplots(figsize=(9, 5))
    colours = palette(len(summary))
    for i, (pair, s) in enumerate(summary.items()):
        turns = sorted(int(t) for t in s["per_turn"])
        rows = [s["per_turn"][str(t)] for t in turns]
        xs = [t + (i - (len(summary) - 1) / 2) * 0.08 for t in turns]
        ys = [r["ratio"] for r in rows]
        err = [[y - r["low"] for y, r in zip(ys, rows)], [r["high"] - y for y, r in zip(ys, rows)]]
        ax.errorbar(xs, ys, yerr=err, fmt="o-", capsize=3, color=colours[i], label=pair)
        ax.axhline(s["turns 2+"]["ratio"], color=colours[i], linestyle="--", linewidth=0.8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("turn")
    ax.set_ylabel("decode tok/s ratio (95 % bootstrap interval; dashed: turns 2+)")
    ax.set_title(f"multi-turn, {len(result['conversations'])} conversations, {result['max_tokens']} tokens max, "
                 f"{result['threads']} threads")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
