"""`pyspec bench soak`: a long run of `pyspec serve` under mixed concurrent load,
failing when its memory, file descriptors, threads or KV cells do not stay
bounded (pyspec/bench/serve/soak.py states the method)."""

from __future__ import annotations

import os
import shlex
import sys

import click

from ..bench.serve.soak_report import Bounds
from ..settings import MAX_SEQUENCES, MAX_TOKENS, N_CTX_SERVER, PARALLEL
from .options import (DEFAULT_DRAFT, DEFAULT_MODEL, check_device, command_errors, device_options, max_tokens_option,
                      n_ctx_option, report_options, threads_option, write_report)

_B = Bounds()


@click.command("soak")
@click.option("--model", "-m", default=None,
              help=f"Target model of the server (path or default name; 'test' is the small test model) "
                   f"[default: the default pair, {DEFAULT_MODEL} with the draft {DEFAULT_DRAFT}].")
@click.option("--draft", "-d", default=None, help="Draft model (path or name), as `pyspec serve --draft`.")
@click.option("--no-draft", is_flag=True, help="Plain decoding with the target alone (`pyspec serve --no-draft`).")
@click.option("--clients", default=8, show_default=True, type=click.IntRange(1, 64),
              help="Concurrent clients, each sending one request after another.")
@click.option("--minutes", default=30.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Length of the soak (after the warm-up).")
@click.option("--warmup", "warmup_s", default=None, type=click.FloatRange(min=0),
              help="Seconds of the same load before the idle baseline is taken [default: 60, or a tenth of "
                   "--minutes if less].")
@click.option("--interval", default=10.0, show_default=True, type=click.FloatRange(min=0.5),
              help="Seconds between samples of the server.")
@click.option("--fill/--no-fill", default=True, show_default=True,
              help="Before the warm-up, write every KV cell once (--parallel token-id prompts that fill the "
                   "context): memory first touched late would read as growth.")
@click.option("--idle-timeout", default=60.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds the server may take to go idle after the clients stop (requests they dropped "
                   "must end); past it, the idle checks judge it as it is.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Seed of the request mix.")
@click.option("--parallel", default=PARALLEL, show_default=True, type=click.IntRange(1, MAX_SEQUENCES),
              help="The server's slots (`pyspec serve --parallel`).")
@n_ctx_option(N_CTX_SERVER,
              help="The server's context cells (`pyspec serve --n-ctx`); long requests are sized to fit it.")
@threads_option
@device_options
@max_tokens_option(MAX_TOKENS, minimum=32,
                   help="Longest answer of the mix (long answers ask for a quarter of it up to all of it; short ones "
                        "1-16 tokens); at most a quarter of a slot's share of --n-ctx.")
@click.option("--serve-args", default="", help="More `pyspec serve` arguments, e.g. '--memory-users 4'.")
@click.option("--rss-growth-mib", default=_B.rss_growth_mib, show_default=True, type=click.FloatRange(min=0),
              help="RSS growth allowed (with --rss-growth-pct: the larger of the two).")
@click.option("--rss-growth-pct", default=_B.rss_growth_pct, show_default=True, type=click.FloatRange(min=0),
              help="RSS growth allowed, in % of the second quarter's median RSS.")
@click.option("--fd-slack", default=_B.fd_slack, show_default=True, type=click.IntRange(min=0),
              help="Open fds allowed at idle after the run above the idle baseline.")
@click.option("--thread-slack", default=_B.thread_slack, show_default=True, type=click.IntRange(min=0),
              help="Threads allowed at idle after the run above the idle baseline.")
@report_options("every sample, the request counts and the verdict", "RSS, fds, threads and KV cells over time, "
                "with the bounds")
def bench_soak(model, draft, no_draft, clients, minutes, warmup_s, fill, interval, idle_timeout, seed, parallel,
               n_ctx, threads, device, max_tokens, serve_args, rss_growth_mib, rss_growth_pct, fd_slack, thread_slack,
               json_path, plot_path) -> None:
    """A soak: `pyspec serve` under mixed concurrent load for --minutes.

    Starts a real `pyspec serve` (the default pair unless --model/--draft say
    otherwise; `--model test` for a quick run on the small model) and drives
    --clients concurrent clients with a seeded mix: completions and chats,
    short and long prompts and answers, streamed or not, n of 1-3, greedy and
    sampled, and cancellations (streams dropped after a few chunks, requests
    with a tiny timeout); first, unless --no-fill, every KV cell is written
    once, then the same load runs --warmup seconds and the idle baseline is
    taken. Every --interval seconds it samples the server
    process: RSS, open fds and threads (/proc/PID), KV cells (/health) and
    throughput, one line on stderr each.

    It fails (exit status 1) unless: the server never dies and answers no
    5xx and no request fails; RSS grows by at most max(--rss-growth-mib,
    --rss-growth-pct) from the median of the second quarter of samples to
    that of the last (default max(64 MiB, 10 %)); and at idle after the run,
    fds and threads are within +--fd-slack/--thread-slack (default 4) of the
    idle baseline taken after the warm-up, no KV cell is held by a running
    sequence, and SIGTERM stops the server with exit status 0. Linux only
    (/proc). --n-gpu-layers, --flash-attn and --strict go to the server.
    """
    from ..bench.serve import soak, soak_load, soak_report
    from ..bench.serve.process import ServerProcess, free_port, pyspec_device_args

    bounds = Bounds(rss_growth_mib=rss_growth_mib, rss_growth_pct=rss_growth_pct, fd_slack=fd_slack,
                    thread_slack=thread_slack)
    seconds = minutes * 60
    warmup_s = min(60.0, seconds / 10) if warmup_s is None else warmup_s
    mix = soak_load.Mix(parallel=parallel, n_ctx=n_ctx, max_tokens=max_tokens)
    if mix.per_slot < 256:
        raise click.BadParameter(f"{n_ctx} cells for {parallel} slots leave {mix.per_slot} a slot; give at least "
                                 f"256 a slot", param_hint="--n-ctx")
    port = free_port()
    cmd = [sys.executable, "-m", "pyspec.cli", "serve", "--port", str(port), "--parallel", str(parallel),
           "--n-ctx", str(n_ctx)]
    cmd += ["--model", model] if model else []
    cmd += ["--draft", draft] if draft else []
    cmd += ["--no-draft"] if no_draft else []
    cmd += ["--threads", str(threads)] if threads else []
    cmd += pyspec_device_args(device)
    cmd += shlex.split(serve_args)

    def progress(line: str) -> None:
        click.echo(line, err=True)

    with command_errors(errors=(ValueError, OSError, RuntimeError)):
        if plot_path:  # fail before a long run, not after it
            from ..bench.plot import pyplot

            pyplot()
        soak.proc_figures(os.getpid())  # /proc is there (Linux)
        check_device(device)  # --strict on a build without a GPU backend: one line now, not a server that dies
        progress(f"starting: {shlex.join(cmd)}")
        server = ServerProcess(cmd, port)
        exit_status = None
        try:
            run = soak.run_soak(server, clients=clients, seconds=seconds, warmup_s=warmup_s, interval=interval,
                                seed=seed, mix=mix, bounds=bounds, progress=progress, fill=fill,
                                idle_timeout=idle_timeout)
        finally:
            log = server.output()
            if server.proc.poll() is None:
                exit_status = server.stop()
    tally = dict(run.requests)
    for key, value in run.warmup.items():  # the verdict counts failures of the warm-up too
        tally[key] = tally.get(key, 0) + value
    verdict = soak_report.verdict(run.samples, run.baseline, run.final, bounds, tally=tally, died=run.died,
                           exit_status=exit_status)
    result = {
        "command": cmd, "model": model, "draft": draft, "no_draft": no_draft, "clients": clients,
        "minutes": minutes, "warmup_s": warmup_s, "fill": run.fill or None, "interval_s": interval, "seed": seed,
        "parallel": parallel, "n_ctx": n_ctx, "n_gpu_layers": device["n_gpu_layers"],
        "flash_attn_requested": device["flash_attn"],
        "mix": {"long_max_tokens": mix.long_max_tokens, "long_prompt_chars": mix.long_prompt_chars,
                "max_n": mix.max_n, "users": soak_load.USERS},
        "baseline": run.baseline, "samples": run.samples, "final": run.final, "warmup_requests": run.warmup,
        "requests": run.requests, "failures": run.failures, "verdict": verdict,
    }
    if run.died or not verdict["ok"]:
        result["server_log_tail"] = log[-4000:]
    result["table"] = soak_report.format_report(result)
    write_report(result, json_path, plot_path, soak_report.plot,
                 f"{shlex.join(cmd[3:])}\n{clients} clients, {minutes:g} min after {warmup_s:g} s of warm-up, "
                 f"a sample every {interval:g} s\n" + result["table"])
    if run.died:
        click.echo(f"the server's last output:\n{log[-2000:]}", err=True)
    if not verdict["ok"]:
        sys.exit(1)
