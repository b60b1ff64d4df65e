"""`pyspec bench rpc`: speculation over a network (pyspec/bench/inprocess/rpc.py)."""

from __future__ import annotations

import click

from .options import (DEFAULT_DRAFT, DEFAULT_MODEL, command_errors, labelled_progress, max_tokens_option,
                      report_options, threads_option, write_report)


class DelayList(click.ParamType):
    """Comma-separated one-way delays in ms, e.g. 0,2,5,20."""

    name = "MS"

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return list(value)
        try:
            out = [float(x) for x in str(value).split(",") if x.strip()]
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of milliseconds, e.g. 0,2,5,20", param, ctx)
        if not out or min(out) < 0:
            self.fail(f"{value!r}: give delays >= 0", param, ctx)
        return out


@click.command("rpc")
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Target model (path or name).")
@click.option("--draft", "-d", default=DEFAULT_DRAFT, show_default=True, help="Draft model of the default decoder.")
@click.option("--rpc-delay-ms", "delays", default="0,2,5,20", show_default=True, type=DelayList(),
              help="One-way delays the proxy adds in front of each worker (round trip: twice this).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 8),
              help="Loopback `pyspec rpc-server` workers the target's layers are split over.")
@max_tokens_option(96)
@click.option("--reps", default=2, show_default=True, type=click.IntRange(min=1), help="Repetitions per prompt.")
@click.option("--prompts", "n_prompts", default=3, show_default=True, type=click.IntRange(1, 6),
              help="Copy-heavy prompts of the suite (code editing, document correction).")
@threads_option
@click.option("--llama-server", default=None, type=click.Path(exists=True, dir_okay=False),
              help="llama.cpp's llama-server binary (built with -DGGML_RPC=ON): run it with --rpc on the same "
                   "proxies, per --llama-spec.")
@click.option("--llama-spec", "llama_specs", default="none,ngram-mod,ngram-simple", show_default=True,
              help="llama-server --spec-type values to run ('none': plain; draft-simple uses --draft).")
@report_options("every run and row", "speed-up against delay beside the ceiling")
def bench_rpc(model, draft, delays, workers, max_tokens, reps, n_prompts, threads, llama_server, llama_specs,
              json_path, plot_path) -> None:
    """Speculation over RPC: the target's layers on loopback workers behind a
    proxy that adds a delay each way; plain decoding against the default
    decoder (its draft here), at each delay, and llama-server --rpc.

    Reports tokens/s, round trips per token (counted by the proxy), the
    default's speed-up over plain with a 95 % interval (paired, ABBA), and the
    ceiling: the best speed-up a perfect free draft of some length could give,
    (k+1)V(1)/V(k+1) from the target's batch costs V(n) measured over the same
    network. The "local" row runs without workers. Takes ~15 minutes with the
    defaults on 2 cores.
    """
    from ..bench.inprocess import rpc as bench
    from ..bench.suite import prompts
    from ..model import resolve_path
    from .._platform import physical_cores

    texts = [p.text for p in prompts(["code_editing", "doc_correction"])][:n_prompts]
    specs = [s.strip() for s in llama_specs.split(",") if s.strip()]
    per_delay = 4 + n_prompts * reps * 2 + (len(specs) * (1 + n_prompts * reps) if llama_server else 0)
    with command_errors(), labelled_progress(per_delay * (len(delays) + 1), "bench rpc") as (bar, say):
        def progress(what: str) -> None:
            bar.update(1)
            say(what)

        result = bench.bench_rpc(str(resolve_path(model)), str(resolve_path(draft)), texts, delays_ms=delays,
                                 n_workers=workers, max_tokens=max_tokens, reps=reps,
                                 threads=threads or physical_cores(), n_ctx=4096, llama_server=llama_server,
                                 llama_specs=specs, progress=progress)
    write_report(result, json_path, plot_path, bench.plot, bench.report(result))
