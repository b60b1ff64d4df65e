"""The verdict on a soak (`pyspec bench soak`) and its report: the bounds it
must hold, its checks, the table over time and the plot (pyspec/bench/serve/soak.py
states the method)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

MIB = 1024  # KiB per MiB: /proc reports kB

# ------------------------------------------------------------------ the bounds


@dataclass(frozen=True)
class Bounds:
    """What a soak must hold to pass."""

    rss_growth_mib: float = 64.0   # RSS growth allowed: the larger of this ...
    rss_growth_pct: float = 10.0   # ... and this share of the second quarter's median
    fd_slack: int = 4              # idle fds after the run: at most baseline + this
    thread_slack: int = 4          # idle threads after the run: at most baseline + this

    def rss_allowed_kib(self, reference_kib: float) -> float:
        return max(self.rss_growth_mib * MIB, self.rss_growth_pct / 100 * reference_kib)

    def describe(self) -> str:
        return (f"RSS growth (median of the last quarter of samples over that of the second) <= "
                f"max({self.rss_growth_mib:g} MiB, {self.rss_growth_pct:g} %); at idle after the run fds <= "
                f"baseline + {self.fd_slack}, threads <= baseline + {self.thread_slack}, KV cells of running "
                f"sequences 0; no 5xx, no failed request, no server death, exit 0 on SIGTERM")


# ------------------------------------------------------------------ the verdict


def rss_growth(rss_kib: Sequence[float], bounds: Bounds) -> Dict[str, Any]:
    """RSS check over the soak's samples: median of the last quarter against
    the median of the second (ok None: fewer than 4 samples, not judged)."""
    n = len(rss_kib)
    if n < 4:
        return {"name": "rss growth", "ok": None,
                "detail": f"not judged: {n} samples (needs 4; run longer or sample more often)"}
    q = n // 4
    ref, last = statistics.median(rss_kib[q:2 * q]), statistics.median(rss_kib[n - q:])
    allowed = bounds.rss_allowed_kib(ref)
    growth = last - ref
    return {"name": "rss growth", "ok": growth <= allowed, "reference_kib": ref, "last_kib": last,
            "growth_kib": growth, "allowed_kib": allowed, "quarter": q,
            "detail": f"{growth / MIB:+.1f} MiB (median {ref / MIB:.1f} -> {last / MIB:.1f} MiB), "
                      f"allowed {allowed / MIB:.1f} MiB"}


def verdict(samples: List[Dict[str, Any]], baseline: Dict[str, Any], final: Dict[str, Any], bounds: Bounds, *,
            tally: Dict[str, int], died: Optional[str] = None, exit_status: Optional[int] = None) -> Dict[str, Any]:
    """The checks of a soak (each {name, ok, detail}) and ``ok``: all hold (a
    check with ok None was not judged). ``tally``: the clients' counts (warm-up
    included); ``died``: how the server died, if it did; ``exit_status``: its
    status after SIGTERM (None: not stopped yet)."""
    checks: List[Dict[str, Any]] = []

    def check(name: str, ok: Optional[bool], detail: str) -> None:
        checks.append({"name": name, "ok": ok, "detail": detail})

    check("server alive", died is None, died or "answered /health throughout")
    server_5xx = max([s.get("server_5xx", 0) for s in samples + [final]] or [0])
    client_5xx = tally.get("status_5xx", 0)
    check("no 5xx", client_5xx == 0 and server_5xx == 0,
          f"{client_5xx} seen by clients, {server_5xx} counted by the server's /metrics")
    failed = tally.get("failed", 0)
    check("no failed request", failed == 0, f"{failed} of {tally.get('sent', 0)}")
    checks.append(rss_growth([s["rss_kib"] for s in samples if "rss_kib" in s], bounds))
    if died is None:
        idle = final.get("slots_busy") == 0 and final.get("queue") == 0
        check("idle after the run", idle, f"slots busy {final.get('slots_busy')}, queue {final.get('queue')} "
                                          f"({'after' if idle else 'still, after'} {final.get('idle_after_s')} s)")
        for key, slack in (("fds", bounds.fd_slack), ("threads", bounds.thread_slack)):
            check(f"{key} at idle", final[key] <= baseline[key] + slack,
                  f"{final[key]} (baseline {baseline[key]}, allowed {baseline[key] + slack}; "
                  f"peak {max([s[key] for s in samples] or [final[key]])})")
        check("KV cells at idle", final.get("kv_running") == 0,
              f"{final.get('kv_running')} held by running sequences ({final.get('kv_cached')} cached)")
    if exit_status is not None:
        check("clean stop", exit_status == 0, f"exit status {exit_status} after SIGTERM")
    return {"ok": all(c["ok"] is not False for c in checks), "bounds": asdict(bounds),
            "bounds_text": bounds.describe(), "checks": checks}



# ------------------------------------------------------------------ output

_COLUMNS = (("t", "t s", 7, ".0f"), ("rss_kib", "RSS MiB", 8, None), ("fds", "fds", 5, "d"),
            ("threads", "thr", 4, "d"), ("kv_running", "KV run", 7, "d"), ("kv_cached", "KV cache", 8, "d"),
            ("slots_busy", "busy", 4, "d"), ("done", "done", 6, "d"), ("cancelled", "cancel", 6, "d"),
            ("failed", "fail", 5, "d"), ("tok_s", "tok/s", 7, ".1f"))


def header() -> str:
    return " ".join(f"{title:>{w}}" for _, title, w, _ in _COLUMNS)


def row(s: Dict[str, Any]) -> str:
    cells = []
    for key, _, w, fmt in _COLUMNS:
        v = s.get(key)
        if key == "rss_kib" and v is not None:
            v, fmt = v / MIB, ".1f"
        cells.append(f"{'-' if v is None else format(v, fmt):>{w}}")
    line = " ".join(cells)
    if s.get("health") not in (None, "ok"):
        line += f"  health: {s['health']}"
    return line


def format_report(result: Dict[str, Any], max_rows: int = 40) -> str:
    """The table over time (thinned evenly to ``max_rows``: --json has every
    sample), the baseline and final idle rows, the requests and the verdict."""
    samples = result["samples"]
    step = max(1, -(-len(samples) // max_rows))
    shown = samples[::step]
    if samples and shown[-1] is not samples[-1]:
        shown.append(samples[-1])
    lines = [header()]
    if result.get("baseline"):
        lines.append(row({**result["baseline"], "t": None}) + "  <- baseline (idle, after warm-up)")
    if step > 1:
        lines.append(f"(every {step}th of {len(samples)} samples)")
    lines += [row(s) for s in shown]
    if result.get("final"):
        lines.append(row({**result["final"], "t": None}) + "  <- final (idle, after the run)")
    r = result["requests"]
    lines.append(
        f"requests: {r.get('sent', 0)} sent, {r.get('done', 0)} done, {r.get('cancelled', 0)} cancelled "
        f"({r.get('cancelled_disconnect', 0)} dropped streams, {r.get('cancelled_timeout', 0)} tiny timeouts, "
        f"{r.get('cancelled_end', 0)} at the end), {r.get('failed', 0)} failed; {r.get('chat', 0)} chat, "
        f"{r.get('stream', 0)} streamed, {r.get('n_multi', 0)} with n > 1, {r.get('sampled', 0)} sampled")
    for why in result.get("failures", [])[:5]:
        lines.append(f"  failed: {why}")
    v = result["verdict"]
    lines.append(f"bounds: {v['bounds_text']}")
    for c in v["checks"]:
        mark = {True: "ok  ", False: "FAIL", None: "--  "}[c["ok"]]
        lines.append(f"  {mark} {c['name']}: {c['detail']}")
    lines.append(f"soak: {'PASS' if v['ok'] else 'FAIL'}")
    return "\n".join(lines)


def plot(result: Dict[str, Any], path: str) -> None:
    """Four panels over time: RSS (with the growth bound over the last
    quarter), fds and threads (with baseline + slack), KV cells (running and
    cached, with n_ctx); the idle baseline and final values as markers."""
    from ..plot import pyplot

    plt = pyplot()
    samples, base, final = result["samples"], result.get("baseline") or {}, result.get("final") or {}
    bounds = result["verdict"]["bounds"]
    t = [s["t"] for s in samples]
    t_end = (t[-1] if t else 0) + result["interval_s"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    panels = (("rss_kib", "RSS (MiB)", MIB), ("fds", "open file descriptors", 1), ("threads", "threads", 1),
              ("kv_running", "KV cells", 1))
    for ax, (key, label, scale) in zip(axes.flat, panels):
        ax.plot(t, [s.get(key, float("nan")) / scale if s.get(key) is not None else float("nan") for s in samples],
                marker=".", label="during the soak" if key != "kv_running" else "running sequences")
        for where, s, marker in ((0, base, "s"), (t_end, final, "D")):
            if s.get(key) is not None:
                ax.plot([where], [s[key] / scale], marker=marker, color="black", linestyle="none")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    rss = next((c for c in result["verdict"]["checks"] if c["name"] == "rss growth"), {})
    if rss.get("ok") is not None:  # the two quarters compared, their reference and the bound on the last
        q, ax, half = rss["quarter"], axes[0, 0], result["interval_s"] / 2
        ax.axvspan(t[q] - half, t[2 * q - 1] + half, color="grey", alpha=0.2, label="second quarter")
        ax.axvspan(t[len(t) - q] - half, t[-1] + half, color="orange", alpha=0.2, label="last quarter")
        ax.hlines(rss["reference_kib"] / MIB, t[q], t[-1], color="grey", linestyle=":",
                  label="median of the second quarter")
        ax.hlines((rss["reference_kib"] + rss["allowed_kib"]) / MIB, t[q], t[-1], color="red",
                  label="bound on the last quarter's median: + max(%g MiB, %g %%)"
                        % (bounds["rss_growth_mib"], bounds["rss_growth_pct"]))
    for ax, key, slack in ((axes[0, 1], "fds", bounds["fd_slack"]), (axes[1, 0], "threads", bounds["thread_slack"])):
        if base.get(key) is not None:
            ax.axhline(base[key] + slack, color="red", label=f"idle bound: baseline + {slack}")
    ax = axes[1, 1]
    ax.plot(t, [s.get("kv_cached") for s in samples], linestyle="--", label="cached (prefix cache included)")
    ax.axhline(result["n_ctx"], color="grey", linewidth=0.8, label=f"n_ctx {result['n_ctx']}")
    for ax in axes.flat:
        ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("seconds into the soak (square: idle baseline, diamond: idle after the run)")
    v = "PASS" if result["verdict"]["ok"] else "FAIL"
    fig.suptitle(f"pyspec serve soak: {result['clients']} clients, {result['minutes']:g} min — {v}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
