"""The `pyspec agree` plot: CDFs of per-position acceptance and KL."""

from __future__ import annotations


def plot_agreement(rows, path: str, title: str) -> None:
    import numpy as np

    from ..bench.plot import pyplot

    plt = pyplot()

    alpha = np.sort(np.concatenate([r["alpha"] for r in rows]))
    kl = np.sort(np.concatenate([r["kl"] for r in rows]))
    cdf = np.arange(1, len(alpha) + 1) / len(alpha)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(alpha, cdf)
    a.set_xlabel("acceptance α = 1 - TV(p, q) per position")
    a.set_ylabel("fraction of positions ≤ x")
    a.set_xlim(0, 1)
    b.plot(np.clip(kl, 1e-6, None), cdf)
    b.set_xscale("log")
    b.set_xlabel("KL(p ‖ q) per position (nats; < 1e-6 drawn at 1e-6)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
