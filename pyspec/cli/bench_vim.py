"""`pyspec bench vim`: the real llama.vim plugin, in Vim, against servers
(pyspec/bench/serve/vim.py states the method)."""

from __future__ import annotations

import json
import sys

import click

from .._durable import cache_root
from .bench_editor import (check_llama_options, editor_backends, editor_models, llama_server_options,
                           resolve_llama_variants)
from .options import check_device, command_errors, device_options


@click.command("vim")
@editor_models
@click.option("--sites", "n_sites", default=10, show_default=True, type=click.IntRange(min=1),
              help="Lines typed again, each a statement's first line of one file of the standard library.")
@click.option("--steps", default=3, show_default=True, type=click.IntRange(min=1),
              help="Pauses while typing each line (after 1/N ... N/N of it); the last one's suggestion is "
                   "accepted with Tab.")
@click.option("--pace", default=0.15, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds between keystrokes (each ±30 %, seeded).")
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(min=1),
              help="Longest wait for a suggestion at a pause (seconds).")
@click.option("--instruct", default=4, show_default=True, type=click.IntRange(min=0),
              help="Instruction edits after the typing (the newer plugin's :LlamaInstruct, replayed in its request "
                   "shape): first token after Enter, its warm-up sent while the instruction is typed; 0: none.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the files, the sites and the pace.")
@llama_server_options("plain=")
@click.option("--threads", default=2, show_default=True, type=click.IntRange(min=1), help="Threads of every server.")
@click.option("--n-ctx", default=8192, show_default=True, type=click.IntRange(min=512),
              help="Context of every server (the plugin's ring of chunks takes several thousand tokens).")
@device_options
@click.option("--json", "json_path", default=None, is_flag=False, flag_value="-",
              type=click.Path(dir_okay=False, allow_dash=True),
              help="Print one JSON object (every pause and request, the summary) instead of the table; --json "
                   "FILE writes it to FILE.")
def bench_vim(model, draft, no_draft, n_sites, steps, pace, instruct, timeout, seed, llama_server, llama_variant,
              threads, n_ctx, device, json_path) -> None:
    """llama.vim, the plugin itself, in Vim, against pyspec serve and, given
    --llama-server PATH or $PYSPEC_LLAMA_SERVER, llama.cpp's llama-server.

    Vim (9, with +job +channel +timers +textprop) runs in a pseudo-terminal
    with the plugin at its defaults, pointed through a logging proxy at each
    server. The plugin is the one the pinned llama.cpp ships
    (examples/llama.vim in llama-cpp-python's sdist), fetched once from the
    package index into the cache. --sites lines of a file of the standard
    library are typed again from their indentation, a key every --pace
    seconds, pausing --steps times per line until the suggestion shows.
    Prints per server: the wait from the last keystroke to the suggestion on
    screen (p50, p90, 95 % intervals), pauses without one, empty ones,
    accepts that inserted what was shown, requests sent and given up, and
    the ratio of p50 waits on the same pauses; then, for --instruct edits,
    the first token's wait and its ratio. Progress goes to stderr.
    """
    from ..bench.serve import vim_plugin, vim_session
    from ..errors import PyspecError
    from ..model import resolve_path

    check_llama_options(llama_server, llama_variant)

    def say(line: str) -> None:
        click.echo(line, err=True)

    with command_errors(errors=(PyspecError, ValueError, OSError, RuntimeError)):
        check_device(device)
        path = resolve_path(model)
        draft_path = "" if no_draft or not draft else resolve_path(draft)
        variants, why = resolve_llama_variants(llama_server, list(llama_variant) or ["plain="], draft_path)
        if why:
            say(why)
        runtime = vim_plugin.fetch(cache_root(), progress=say)  # $PYSPEC_CACHE/plugins
        backends = editor_backends(path, draft_path, layouts=["still"], threads=threads, n_ctx=n_ctx,
                                   llama_server=llama_server, variants=variants, device=device)
        record = vim_session.run(backends, runtime, n_sites=n_sites, steps=steps, pace=pace, timeout=timeout,
                                 seed=seed, instruct=instruct, progress=say)
    summary = vim_session.summarize(record, timeout, seed)
    table = vim_session.format_summary(summary)
    result = {"model": path, "draft": draft_path or None, "threads": threads, "n_ctx": n_ctx, "seed": seed,
              "steps": steps, "pace_s": pace, "timeout_s": timeout, "plugin": str(runtime),
              "python": sys.version.split()[0],
              "backends": [{"name": b.name, "command": b.server.command} for b in backends],
              **record, "summary": summary, "table": table}
    if json_path:
        with click.open_file(json_path, "w") as f:
            json.dump(result, f, indent=2, default=float)
            f.write("\n")
    if json_path != "-":
        click.echo(f"{path} (draft {draft_path or 'none'}), {threads} threads, context {n_ctx}; llama.vim in Vim, "
                   f"{len(record['sites'])} lines of {record['file']} x {steps} pauses, a key every {pace} s\n"
                   + table)
