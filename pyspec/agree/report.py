"""The `pyspec agree` report: its summary table and what JSON can hold."""

from __future__ import annotations

import math

ROW_FORMAT = [  # (label, key, format) of the summary table
    ("positions", "n_positions", "{:d}"),
    ("acceptance α (settings)", "acceptance_mean", "{:.4f}"),
    ("  α p1 / p10 / median", ("acceptance_p1", "acceptance_p10", "acceptance_median"), "{:.3f}"),
    ("top-1 agreement (α at T=0)", "top1_agreement", "{:.4f}"),
    ("KL mean (nats)", "kl_mean", "{:.5f}"),
    ("  KL median / p90 / p99", ("kl_median", "kl_p90", "kl_p99"), "{:.4f}"),
    ("  KL p99.9 / max", ("kl_p999", "kl_max"), "{:.3f}"),
    ("p(next token) ref / cand", ("token_prob_ref", "token_prob_cand"), "{:.3f}"),
    ("perplexity ratio cand/ref", "ppl_ratio", "{:.4f}"),
]


def _cell(summary: dict, key, fmt: str) -> str:
    keys = key if isinstance(key, tuple) else (key,)
    return " / ".join(fmt.format(summary[k]) if math.isfinite(summary[k]) else str(summary[k]) for k in keys)


def format_report(r: dict) -> str:
    cats = ["all"] + list(r["per_category"])
    cols = {"all": r, **r["per_category"]}
    lines = []
    for role in ("reference", "candidate"):
        m = r["models"][role]
        lines.append(f"{role:<10} {m['path']}  ({m['type']}, {m['n_params'] / 1e6:.0f}M parameters)")
    s = r["settings"]
    lines.append(f"sampling   T={s['temperature']:g} top-k={s['top_k']} top-p={s['top_p']:g} min-p={s['min_p']:g}; "
                 f"{s['streams']} streams, teacher-forced")
    table = [[""] + cats] + [[label] + [_cell(cols[c], key, fmt) for c in cats] for label, key, fmt in ROW_FORMAT]
    widths = [max(len(row[i]) for row in table) for i in range(len(cats) + 1)]
    lines.append("")
    lines += ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
              for row in table]
    spec = r["speculation"]
    lines.append("")
    lines.append("speculation (the candidate drafting for the reference, k tokens per round):")
    has_speed = "speedup" in spec["sampled"][0]
    header = "  k  tokens/pass  " + ("speed-up  " if has_speed else "") + "| greedy: tokens/pass" + \
             ("  speed-up" if has_speed else "")
    lines.append(header)
    for a, g in zip(spec["sampled"], spec["greedy"]):
        row = f"  {a['k']}  {a['tokens_per_pass']:11.2f}  " + (f"{a['speedup']:7.2f}x  " if has_speed else "")
        row += f"|         {g['tokens_per_pass']:11.2f}" + (f"  {g['speedup']:7.2f}x" if has_speed else "")
        lines.append(row)
    by_pos = " ".join("-" if a is None else f"{a:.2f}" for a in spec["acceptance_by_position"])
    lines.append(f"  acceptance by draft position 1..{len(spec['acceptance_by_position'])}: {by_pos}")
    if has_speed:
        best = max(spec["sampled"], key=lambda p: p["speedup"])
        pays = "pays" if best["speedup"] > 1 else "does not pay"
        lines.append(f"  on this machine drafting {pays} at these settings: best k={best['k']}, "
                     f"{best['speedup']:.2f}x (reference V(n) and candidate step timed here)")
    lines.append("")
    lines.append(f"verdict: {r['verdict'].upper()}: {r['reason']}")
    return "\n".join(lines)


def json_safe(x):
    """JSON has no infinity or NaN: such values become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    return x
