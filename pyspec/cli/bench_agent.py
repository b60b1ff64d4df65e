"""`pyspec bench agent`: a coding agent's traffic through /v1/chat/completions,
/v1/messages and /v1/responses, against servers (pyspec/bench/serve/agent.py
states the method)."""

from __future__ import annotations

import json
import sys

import click

from .bench_editor import check_llama_options, line_range, llama_server_options, resolve_llama_variants
from .options import DEFAULT_DRAFT, DEFAULT_MODEL, check_device, command_errors, device_options


@click.command("agent")
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Target model (path or default name).")
@click.option("--draft", "-d", default=DEFAULT_DRAFT, show_default=True, help="Draft model of pyspec serve.")
@click.option("--no-draft", is_flag=True,
              help="pyspec serve with its lookup drafting only (and no llama-server draft variant).")
@click.option("--sessions", "n_sessions", default=3, show_default=True, type=click.IntRange(min=1),
              help="Agent sessions, each on its own window of a standard-library file; the routes in turn.")
@click.option("--lines", "lines_", default="30-60", show_default=True, metavar="MIN-MAX",
              help="Lines of each session's file.")
@click.option("--routes", default="chat,messages,responses", show_default=True,
              help="Routes the sessions go through, in turn: chat (/v1/chat/completions), messages "
                   "(/v1/messages), responses (/v1/responses).")
@click.option("--kinds", default="prose,code,write,edit,tests", show_default=True,
              help="Steps of each session, in order (the first one starts the conversation): prose, code (the "
                   "file in a code block), write (a write_file call), edit (an edit_file call), tests (prose "
                   "after test output).")
@click.option("--reps", default=2, show_default=True, type=click.IntRange(min=1),
              help="Repetitions: every backend runs every session once per repetition, on a fresh server.")
@click.option("--max-tokens", "cap", default=None, type=click.IntRange(min=1),
              help="At most this many tokens per answer [default: prose 96; a copy 1.3 x the file's tokens + 32; "
                   "an edit half that].")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the files and the intervals.")
@llama_server_options()
@click.option("--threads", default=2, show_default=True, type=click.IntRange(min=1), help="Threads of every server.")
@click.option("--n-ctx", default=8192, show_default=True, type=click.IntRange(min=512),
              help="Context of every server (one slot).")
@device_options
@click.option("--json", "json_path", default=None, is_flag=False, flag_value="-",
              type=click.Path(dir_okay=False, allow_dash=True),
              help="Print one JSON object (every request and its answer, the summary) instead of the table; "
                   "--json FILE writes it to FILE.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Draw each backend's decode rate per step kind to FILE.png (needs matplotlib: the `plot` extra).")
def bench_agent(model, draft, no_draft, n_sessions, lines_, routes, kinds, reps, cap, seed, llama_server,
                llama_variant, threads, n_ctx, device, json_path, plot_path) -> None:
    """A coding agent's sessions, as Claude Code and Codex send them, against
    pyspec serve and, given --llama-server PATH or $PYSPEC_LLAMA_SERVER,
    llama.cpp's llama-server.

    Each session: a system prompt with four tools (read_file, write_file,
    edit_file, run_tests), the user's task (rename a variable in a file of
    the standard library), the agent's read_file call and the file as its
    result; then one request per --kinds step, each re-sending the
    conversation: two sentences about the file (the new conversation), the
    file in a code block, the file as a write_file call, an edit_file call,
    and prose after failing test output. Streamed, greedy, through the
    sessions' --routes in turn. Backends: pyspec serve, pyspec serve
    --no-draft and each llama-server variant, one slot each, the same model
    and threads, a fresh server per repetition, in rotating order.

    Prints per backend and step kind the median first-byte time, decode
    tokens/s, wall time, tokens and forced tool calls answered as that tool;
    then pyspec serve's decode-rate ratio over each other backend per kind
    and its new conversations' first-byte ratio (geometric means, 95 %
    intervals). Progress goes to stderr.
    """
    from ..bench.serve import agent
    from ..bench.serve import editor_edits as ee
    from ..bench.serve.process import Backend, llama_server_backends, pyspec_serve_command, token_counter
    from ..errors import PyspecError
    from ..model import resolve_path

    route_list = [x.strip() for x in routes.split(",") if x.strip()]
    if not route_list or any(x not in agent.ROUTES for x in route_list):
        raise click.BadParameter(f"{routes!r}: give some of {', '.join(agent.ROUTES)}", param_hint="--routes")
    kind_list = [x.strip() for x in kinds.split(",") if x.strip()]
    if not kind_list or any(x not in agent.KINDS for x in kind_list) or len(set(kind_list)) < len(kind_list):
        raise click.BadParameter(f"{kinds!r}: give some of {', '.join(agent.KINDS)}, each once", param_hint="--kinds")
    check_llama_options(llama_server, llama_variant)
    lines = line_range(lines_, "--lines")

    def say(line: str) -> None:
        click.echo(line, err=True)

    with command_errors(errors=(PyspecError, ValueError, OSError, RuntimeError)):
        if plot_path:  # fail before a long run, not after it
            from ..bench.plot import pyplot

            pyplot()
        check_device(device)
        path = resolve_path(model)
        draft_path = "" if no_draft or not draft else resolve_path(draft)
        edits = ee.edits(n_sessions, seed, lines=lines)
        if not edits:
            raise ValueError(f"no window of {lines_} lines with a name to rename in the standard library")
        sessions = agent.sessions(edits, route_list)
        ours = pyspec_serve_command(path, parallel=1, n_ctx=n_ctx, threads=threads, device=device)
        backends = [Backend("pyspec serve", ours + (["--draft", draft_path] if draft_path else [])),
                    Backend("pyspec serve --no-draft", ours + ["--no-draft"])]
        variants, why = resolve_llama_variants(llama_server, llama_variant, draft_path)
        if why:
            say(why)
        for name, args in variants:
            (b,) = llama_server_backends(llama_server, path, parallel=1, n_ctx=n_ctx, threads=threads,
                                         specs=["none"], args=args, device=device)
            backends.append(Backend(f"llama-server {name}", b.command))
        rows = agent.run(backends, sessions, kinds=kind_list, reps=reps, count=token_counter(path), cap=cap,
                         progress=say)
    summary = agent.summarize(rows, seed=seed)
    table = agent.format_summary(summary)
    if plot_path:
        agent.plot(summary, plot_path)
    result = {"model": path, "draft": draft_path or None, "threads": threads, "n_ctx": n_ctx, "reps": reps,
              "seed": seed, "python": sys.version.split()[0], "system": agent.SYSTEM, "tools": agent.TOOLS,
              "sessions": [{"file": s.edit.file, "line": s.edit.start, "lines": s.edit.n_lines, "route": s.route,
                            "old": s.edit.old, "new": s.edit.new} for s in sessions],
              "backends": [{"name": b.name, "command": b.command} for b in backends],
              "requests": rows, "summary": summary, "table": table}
    if json_path:
        with click.open_file(json_path, "w") as f:
            json.dump(result, f, indent=2, default=float)
            f.write("\n")
    if json_path != "-":
        click.echo(f"{path} (draft {draft_path or 'none'}), {threads} threads, context {n_ctx}; {len(sessions)} agent "
                   f"sessions x {len(kind_list)} steps x {reps} repetitions\n" + table)
