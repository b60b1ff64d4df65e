"""`pyspec bench vim`'s session over backends, and its figures (vim.py states
the method): sites picked, each backend's server, proxy and Vim started,
sites typed on each in turn, the pauses and the proxy's logs summed up."""

from __future__ import annotations

import math
import random
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..stats import run_order
from . import editor_sites as es
from .concurrent import percentile
from .editor import bootstrap, paired_p50_ratio
from . import vim_instruct
from .vim import Pause, Vim, exchanges, open_files, settle, type_site
from .vim_proxy import Proxy


def pick(n: int, seed: int, root: Optional[str] = None) -> Tuple[str, str, List[es.Site]]:
    """(the file typed in, the file visited first, ``n`` fresh-line sites of the
    first in file order), from editor_sites' files, seeded."""
    texts = es.stdlib_texts(root or es.stdlib_dir(), es.FILES)
    rng = random.Random(seed)
    names = sorted(texts)
    rng.shuffle(names)
    main, other = names[0], names[1 % len(names)]
    lines = texts[main].split("\n")
    picked = sorted(rng.sample(es.candidates(texts[main], fresh=True), n))
    return main, other, [es.Site(main, k, lines[k - 1], (), (), True) for k in picked]


def quiet(log: Sequence, idle: float = 1.5, limit: float = 30.0) -> None:
    """Wait until the proxy has had no request in flight for ``idle`` seconds
    (the plugin's warm-ups done), so that one backend's work never runs beside
    the next one's typing."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        busy = any(not ex.t_out for ex in log)
        last = max([ex.t_out or ex.t_in for ex in log], default=0.0)
        if not busy and time.monotonic() - last >= idle:
            return
        time.sleep(0.1)


def run(backends: Sequence, runtime: Path, *, n_sites: int, steps: int, pace: float, timeout: float, seed: int,
        instruct: int = 0, progress: Callable[[str], None] = lambda s: None, root: Optional[str] = None) -> dict:
    """Type the same sites on every backend (EditorBackend: bench_editor.py),
    then make ``instruct`` instruction edits on each (vim_instruct.py); the records."""
    main, other, sites = pick(n_sites, seed, root)
    src = Path(root or es.stdlib_dir())
    work = Path(tempfile.mkdtemp(prefix="pyspec-bench-vim-"))
    started: List[tuple] = []
    pauses: List[Pause] = []
    try:
        for i, b in enumerate(backends):
            progress(f"starting {b.name}")
            folder = work / str(i)
            folder.mkdir()
            for name in (main, other):
                shutil.copy(src / name, folder / Path(name).name)
            server = b.server.start()
            proxy = Proxy(server.port)
            started.append((b.name, server, proxy, None))
            vim = Vim(runtime, folder / Path(main).name, proxy.url("/infill"))
            started[-1] = (b.name, server, proxy, vim)
            open_files(vim, folder / Path(other).name, folder / Path(main).name)
            settle(vim, 3)
            quiet(proxy.log)
        rng = random.Random(seed)
        for i, site in enumerate(sites):
            for name, _, proxy, vim in run_order(started, i):
                got = type_site(vim, proxy.log, site, i, name, steps=steps, pace=pace, timeout=timeout, rng=rng)
                pauses += got
                quiet(proxy.log)
                waits = ", ".join("-" if p.wait_s is None else f"{p.wait_s:.2f}" for p in got)
                progress(f"site {i + 1}/{len(sites)} {site.file}:{site.line_no} {name}: {waits} s")
        logs = {name: exchanges(proxy.log) for name, _, proxy, _ in started}
        edits = instruction_edits(started, src / main, src / other, instruct, pace, seed, progress)
    finally:
        for _, server, proxy, vim in started:
            if vim is not None:
                vim.close()
            proxy.close()
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {"file": main, "visited": other,
            "sites": [{"file": s.file, "line": s.line_no, "text": s.line} for s in sites],
            "pauses": [asdict(p) for p in pauses], "requests": logs, "edits": edits}


def instruction_edits(started: List[tuple], main: Path, other: Path, n: int, pace: float, seed: int,
                      progress: Callable[[str], None]) -> List[dict]:
    """``n`` instruction edits of blocks of ``main`` on each started backend,
    in run order, the Vims closed first (their ring warm-ups would interleave)."""
    if n <= 0:
        return []
    for k, (name, server, proxy, vim) in enumerate(started):
        if vim is not None:
            vim.close()
        started[k] = (name, server, proxy, None)
    lines = main.read_text(encoding="utf-8").split("\n")
    ring = "\n".join(other.read_text(encoding="utf-8").split("\n")[:vim_instruct.BLOCK * 8])
    rng = random.Random(seed + 1)
    first, last = vim_instruct.AROUND + 1, max(vim_instruct.AROUND + 1, len(lines) - vim_instruct.BLOCK)
    edits = []
    for j in range(n):
        start = rng.randint(first, last)
        instruction = vim_instruct.INSTRUCTIONS[j % len(vim_instruct.INSTRUCTIONS)]
        for name, server, _, _ in run_order(started, j):
            where = {"selection": j, "backend": name, "start": start, "instruction": instruction}
            try:
                e = vim_instruct.edit(server.port, lines, start, ring, instruction, pace)
            except (RuntimeError, OSError) as err:  # recorded: the typing's figures are kept
                edits.append({**where, "error": str(err)})
                progress(f"instruction {j + 1}/{n} {name}: failed: {err}")
                continue
            edits.append({**where, **e})
            progress(f"instruction {j + 1}/{n} at line {start} {name}: first token {e['ttft_s']:.2f} s "
                     f"({e['prompt_n']} prompt tokens; warm-up {e['warm_up_s']:.2f} s)")
    return edits


def _wait(p: dict) -> float:
    return math.inf if p["wait_s"] is None else p["wait_s"]


def figures(record: dict, backend: str, timeout: float, seed: int = 0) -> dict:
    ps = [p for p in record["pauses"] if p["backend"] == backend]
    by_site: Dict[int, List[float]] = {}
    for p in ps:
        by_site.setdefault(p["site"], []).append(_wait(p))
    waits = [w for g in by_site.values() for w in g]
    out: Dict[str, object] = {"backend": backend, "pauses": len(ps), "sites": len(by_site)}
    for q in (50, 90):
        out[f"wait_p{q}_s"] = percentile(waits, q)
        out[f"wait_p{q}_interval"] = bootstrap(list(by_site.values()), lambda xs, q=q: percentile(xs, q), seed=seed)
    out["no_hint"] = sum(p["wait_s"] is None for p in ps)
    out["empty"] = sum(p["wait_s"] is not None and not any(p["hint"]) for p in ps)
    tried = [p for p in ps if p["accepted"] is not None]
    out["accepted"], out["accepts"] = sum(bool(p["accepted"]) for p in tried), len(tried)
    reqs = record["requests"][backend]
    fims = [r for r in reqs if r["kind"] == "fim"]
    out["fim_requests"], out["warm_ups"] = len(fims), sum(r["kind"] == "warm-up" for r in reqs)
    out["given_up"] = sum(r["cancelled"] for r in fims)
    out["given_up_share"] = out["given_up"] / len(fims) if fims else math.nan
    out["fim_wall_p50_s"] = percentile([r["wall_s"] for r in fims if not r["cancelled"] and r["wall_s"]], 50)
    return out


def wait_ratio(record: dict, numerator: str, denominator: str, timeout: float, seed: int = 0) -> dict:
    """p50 keystroke-to-hint of ``numerator`` over ``denominator``'s on the same
    pauses (site and typed text), interval by resampling sites."""
    theirs = {(p["site"], p["typed"]): _wait(p) for p in record["pauses"] if p["backend"] == denominator}
    groups: Dict[int, list] = {}
    for p in record["pauses"]:
        if p["backend"] == numerator and (p["site"], p["typed"]) in theirs:
            groups.setdefault(p["site"], []).append((_wait(p), theirs[(p["site"], p["typed"])]))
    return {"numerator": numerator, "denominator": denominator, **paired_p50_ratio(list(groups.values()), seed)}


def summarize(record: dict, timeout: float, seed: int = 0) -> dict:
    names = list(record["requests"])
    edits = record.get("edits") or []
    return {"backends": names, "figures": [figures(record, n, timeout, seed) for n in names],
            "ratios": [wait_ratio(record, names[0], n, timeout, seed) for n in names[1:]],
            "instruct": [vim_instruct.figures(edits, n, seed) for n in names] if edits else [],
            "instruct_ratios": [vim_instruct.ttft_ratio(edits, names[0], n, seed) for n in names[1:]] if edits else []}


def _s(x: float) -> str:
    return "-" if x is None or math.isnan(x) else (">timeout" if math.isinf(x) else f"{x:.2f}")


def format_summary(summary: dict) -> str:
    lines = ["wait: last keystroke to the plugin's answer on screen, nearest-rank percentiles [95 % bootstrap "
             "interval over sites], seconds (a hint that never came counts as endless); no hint: none within the "
             "timeout; empty: an answer with nothing to show; accepted: Tab inserted exactly what was shown; "
             "requests: suggestions / warm-ups the plugin sent; given up: suggestions whose connection it closed "
             "first; /infill p50: wall time of the answered ones",
             f"  {'backend':<24} {'n':>3} {'p50 wait':>22} {'p90 wait':>22} {'no hint':>7} {'empty':>5} "
             f"{'accepted':>8} {'requests':>9} {'given up':>9} {'/infill p50':>11}"]
    for f in summary["figures"]:
        cells = []
        for q in (50, 90):
            lo, hi = f[f"wait_p{q}_interval"]
            cells.append(f"{_s(f[f'wait_p{q}_s'])} [{_s(lo)}, {_s(hi)}]")
        lines.append(f"  {f['backend']:<24} {f['pauses']:>3} {cells[0]:>22} {cells[1]:>22} {f['no_hint']:>7} "
                     f"{f['empty']:>5} {str(f['accepted']) + '/' + str(f['accepts']):>8} "
                     f"{str(f['fim_requests']) + ' / ' + str(f['warm_ups']):>9} "
                     f"{f['given_up']:>4} {'(' + format(f['given_up_share'], '.0%') + ')' if f['fim_requests'] else '':>4} "
                     f"{_s(f['fim_wall_p50_s']):>11}")
    for r in summary["ratios"]:
        lo, hi = r["interval"]
        lines.append(f"p50 wait {r['numerator']} / {r['denominator']}: {_s(r['ratio'])}x [{_s(lo)}, {_s(hi)}] "
                     f"({r['pairs']} pauses)")
    if summary.get("instruct"):
        lines.append("instruction edits (the newer plugin's request shape): first token after Enter, its warm-up "
                     "(n_predict 0) answered while the instruction was typed; prompt tokens then processed")
        for f in summary["instruct"]:
            lo, hi = f["ttft_p50_interval"]
            lines.append(f"  {f['backend']:<24} {f['edits']:>3} first token p50 {_s(f['ttft_p50_s'])} s "
                         f"[{_s(lo)}, {_s(hi)}]; warm-up p50 {_s(f['warm_up_p50_s'])} s; "
                         f"prompt tokens p50 {_s(f['prompt_n_p50'])}"
                         + (f"; {f['failed']} failed" if f["failed"] else ""))
        for r in summary["instruct_ratios"]:
            lo, hi = r["interval"]
            lines.append(f"p50 first token {r['numerator']} / {r['denominator']}: {_s(r['ratio'])}x "
                         f"[{_s(lo)}, {_s(hi)}] ({r['pairs']} edits)")
    return "\n".join(lines)
