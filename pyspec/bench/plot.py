"""Pictures of a benchmark: speed ratio per category and runner, and the
acceptance rate by draft position (matplotlib, the optional `plot` extra)."""

from __future__ import annotations

from typing import Dict, List

from ..results import PositionCounts


def acceptance_by_position(samples: List[dict]) -> Dict[str, List[float]]:
    """{runner: acceptance rate of draft position 1..k}, pooled over samples."""
    counts: Dict[str, PositionCounts] = {}
    for s in samples:
        d, a = s["extra"].get("drafted_at"), s["extra"].get("accepted_at")
        if d and sum(d):
            counts.setdefault(s["runner"], PositionCounts()).add(d, a)
    return {r: c.rates() for r, c in counts.items()}


def palette(n: int) -> list:
    """n distinct colours: tab10, then tab20's light shades, then a continuous map."""
    from matplotlib import colormaps

    base = list(colormaps["tab10"].colors) + list(colormaps["tab20"].colors[1::2])
    if n <= len(base):
        return base[:n]
    return [colormaps["turbo"](i / max(n - 1, 1)) for i in range(n)]


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend; RuntimeError naming the
    extra when matplotlib is missing (every --plot goes through here)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError("--plot needs matplotlib: pip install 'pyspec-llama[plot]'") from e
    return plt


def plot(result: dict, path: str) -> None:
    plt = pyplot()
    table = result["summary"]
    runners = result["runners"]
    cats = [c for c in table if c != "all"] + ["all"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, 6), gridspec_kw={"width_ratios": [2.2, 1]})
    width = 0.8 / len(runners)
    colours = palette(len(runners))
    for i, r in enumerate(runners):
        ys = [table[c].get(r, {}).get("ratio", float("nan")) for c in cats]
        ax1.bar([x + i * width for x in range(len(cats))], ys, width, label=r, color=colours[i])
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_xticks([x + 0.4 - width / 2 for x in range(len(cats))])
    ax1.set_xticklabels(cats, rotation=20)
    ax1.set_ylabel(f"decode tok/s ÷ {result['baseline']}")
    ax1.set_title(f"speed ratio (temperature {result['settings']['sampling']['temperature']}, {result['threads']} threads)")
    ax1.legend(fontsize=7, ncol=2)
    for r, rates in acceptance_by_position(result["samples"]).items():
        ax2.plot(range(1, len(rates) + 1), rates, marker="o", label=r, color=colours[runners.index(r)])
    ax2.xaxis.get_major_locator().set_params(integer=True)
    ax2.set_xlabel("draft position")
    ax2.set_ylabel("acceptance rate (given the position was reached)")
    ax2.set_ylim(0, 1.05)
    ax2.set_title("acceptance by draft position")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
