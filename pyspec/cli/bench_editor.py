"""`pyspec bench editor`: a replay of code-editor traffic against servers:
completion while typing, /infill (pyspec/bench/serve/editor.py states the
method), and edits asked in chat, with the file as the prediction
(pyspec/bench/serve/editor_edits.py)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import click

from .options import DEFAULT_DRAFT, DEFAULT_MODEL, check_device, command_errors, device_options

#: llama-server as llama.vim's README runs it for completion (its -c and threads are the bench's).
LLAMA_EDITOR_ARGS = ("--cache-reuse", "256", "-ub", "1024", "-b", "1024")
LAYOUTS = ("still", "llama-server")
WORKLOADS = ("typing", "edits", "both")


def line_range(text: str, option: str = "--edit-lines") -> tuple:
    """``option``'s MIN-MAX (or N: exactly N) as (MIN, MAX)."""
    lo, _, hi = text.partition("-")
    try:
        out = (int(lo), int(hi or lo))
    except ValueError:
        out = (0, 0)
    if not 1 <= out[0] <= out[1]:
        raise click.BadParameter(f"{text!r}: give MIN-MAX lines, 1 <= MIN <= MAX (or N)", param_hint=option)
    return out


def edit_servers(backends) -> tuple:
    """The edits workload's servers, ``[(name, Backend)]``, and its variants:
    the first pyspec serve (its layout is an /infill field), every llama-server."""
    from ..bench.serve import editor_edits as ee

    ours = [b for b in backends if b.name.startswith("pyspec")][:1]
    others = [b for b in backends if not b.name.startswith("pyspec")]
    servers = [("pyspec", b.server) for b in ours] + [(b.name, b.server) for b in others]
    return servers, ee.variants("pyspec" if ours else None, [b.name for b in others])


def llama_variants(given, draft: str, llama_server: str) -> list:
    """``[(name, args)]`` from --llama-variant NAME=ARGS (``{draft}`` in ARGS: the
    draft model); by default plain, ngram-mod where this build's --help names
    it, and with a draft model ``draft=-md {draft}``."""
    if not given:
        given = ["plain="]
        try:
            help_text = subprocess.run([llama_server, "--help"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            help_text = ""
        if "ngram-mod" in help_text:
            given.append("ngram-mod=--spec-type ngram-mod")
        if draft:
            given.append("draft=-md {draft}")
    out = []
    for v in given:
        name, eq, args = v.partition("=")
        if not eq or not name.strip():
            raise click.BadParameter(f"{v!r}: give NAME=ARGS, e.g. 'plain=' or 'draft=-md {{draft}}'",
                                     param_hint="--llama-variant")
        if "{draft}" in args and not draft:
            raise click.BadParameter(f"{v!r} needs a draft model (--draft)", param_hint="--llama-variant")
        out.append((name.strip(), [a.replace("{draft}", draft) for a in shlex.split(args)]))
    return out


#: --llama-variant's default in the benches that take it.
DEFAULT_VARIANTS_HELP = "plain=, ngram-mod=--spec-type ngram-mod where supported, draft=-md {draft}"


def llama_server_options(default_help: str = DEFAULT_VARIANTS_HELP):
    """--llama-server PATH (or $PYSPEC_LLAMA_SERVER) and --llama-variant NAME=ARGS
    of the benches that run llama-server beside pyspec (editor, vim, agent)."""

    def add(command):
        command = click.option("--llama-variant", "llama_variant", multiple=True, metavar="NAME=ARGS",
                               help="A llama-server variant: extra arguments, '{draft}' for the draft model "
                                    f"(repeatable) [default: {default_help}].")(command)
        return click.option("--llama-server", "llama_server", default=None, envvar="PYSPEC_LLAMA_SERVER",
                            show_envvar=True, type=click.Path(dir_okay=False),
                            help="Also run llama.cpp's llama-server binary, per --llama-variant.")(command)

    return add


def check_llama_options(llama_server, llama_variant) -> None:
    """--llama-variant without a llama-server to run it: a usage error."""
    if llama_variant and not llama_server:
        raise click.UsageError("--llama-variant needs --llama-server PATH (or $PYSPEC_LLAMA_SERVER)")


def resolve_llama_variants(llama_server, given, draft: str) -> tuple:
    """(``[(name, args)]`` as :func:`llama_variants`, or [] with the line that
    says why llama-server is skipped; None when it is not)."""
    if not llama_server:
        return [], "llama-server: skipped (give --llama-server PATH or set $PYSPEC_LLAMA_SERVER)"
    if not os.path.isfile(llama_server):
        return [], f"llama-server: skipped ({llama_server} is not a file)"
    return llama_variants(list(given), draft, llama_server), None


def editor_backends(path: str, draft_path: str, *, layouts, threads: int, n_ctx: int, llama_server, variants,
                    device: dict) -> list:
    """pyspec serve per layout (a process each: no cache shared between them),
    then llama-server per variant."""
    from ..bench.serve.editor import EditorBackend
    from ..bench.serve.process import Backend, llama_server_backends, pyspec_serve_command

    ours = pyspec_serve_command(path, parallel=1, n_ctx=n_ctx, threads=threads, device=device)
    ours += ["--draft", draft_path] if draft_path else ["--no-draft"]
    out = [EditorBackend("pyspec" if layout == "still" else f"pyspec layout={layout}", Backend("pyspec", ours),
                         {"layout": layout}) for layout in layouts]
    for name, args in variants:
        (b,) = llama_server_backends(llama_server, path, parallel=1, n_ctx=n_ctx, threads=threads, specs=["none"],
                                     args=[*LLAMA_EDITOR_ARGS, *args], device=device)
        out.append(EditorBackend(f"llama-server {name}", b))
    return out


def editor_models(command):
    """--model, --draft and --no-draft of the editor benchmarks (editor, vim)."""
    for option in reversed((
            click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True,
                         help="Target model (path or default name); it needs FIM tokens (a coder model)."),
            click.option("--draft", "-d", default=DEFAULT_DRAFT, show_default=True,
                         help="Draft model of pyspec serve."),
            click.option("--no-draft", is_flag=True,
                         help="pyspec serve --no-draft (and no llama-server draft variant)."))):
        command = option(command)
    return command


@click.command("editor")
@click.option("--workload", type=click.Choice(WORKLOADS), default="typing", show_default=True,
              help="typing: /infill requests while a line is typed; edits: a rename asked in chat of a file, the "
                   "file as the prediction (pyspec serve's plain, default and prediction variants); both.")
@editor_models
@click.option("--sites", "n_sites", default=6, show_default=True, type=click.IntRange(min=1),
              help="Lines typed, each at a site of its own in the standard library's code.")
@click.option("--steps", default=4, show_default=True, type=click.IntRange(min=1),
              help="Requests while typing each line (the cursor after 1/N ... N/N of it), then one prefetch.")
@click.option("--fresh", is_flag=True,
              help="Fresh lines: any statement's first line (module level, def, class and control-flow lines "
                   "too), typed from its bare indentation, as just after Enter (one more request per line).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the sites, the edits and the intervals.")
@click.option("--prefix-lines", default=64, show_default=True, type=click.IntRange(min=0),
              help="Lines before the cursor sent (llama.vim sends 256).")
@click.option("--suffix-lines", default=16, show_default=True, type=click.IntRange(min=0),
              help="Lines after the cursor sent.")
@click.option("--n-predict", default=32, show_default=True, type=click.IntRange(min=1),
              help="Most tokens per suggestion.")
@click.option("--greedy/--sampled", default=True, show_default=True,
              help="Send temperature 0 (and the temperature sampler), so that texts and the right share are "
                   "comparable; --sampled sends the plugin's sampling as is.")
@click.option("--temperature", default=None, type=click.FloatRange(min=0),
              help="With --sampled: send this temperature (and the temperature sampler) [default: none sent].")
@click.option("--layouts", default="still", show_default=True,
              help="pyspec serve's FIM layouts, comma-separated: still, llama-server (a server each).")
@llama_server_options()
@click.option("--edits", "n_edits", default=4, show_default=True, type=click.IntRange(min=1),
              help="Edits workload: files to edit, each a window of the standard library's code.")
@click.option("--edit-lines", default="60-150", show_default=True, metavar="MIN-MAX",
              help="Edits workload: lines of each file.")
@click.option("--edit-max-tokens", default=None, type=click.IntRange(min=1),
              help="Edits workload: at most this many tokens per answer [default: 1.3 x the file's tokens + 32].")
@click.option("--threads", default=2, show_default=True, type=click.IntRange(min=1), help="Threads of every server.")
@click.option("--n-ctx", default=None, type=click.IntRange(min=512),
              help="Context of every server (one slot) [default: 4096; 8192 with the edits workload].")
@device_options
@click.option("--json", "json_path", default=None, is_flag=False, flag_value="-",
              type=click.Path(dir_okay=False, allow_dash=True),
              help="Print one JSON object (every request, the summary) instead of the table; --json FILE writes it "
                   "to FILE.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Draw each backend's latency distribution to FILE.png (needs matplotlib: the `plot` extra).")
def bench_editor(workload, model, draft, no_draft, n_sites, steps, fresh, seed, prefix_lines, suffix_lines,
                 n_predict, greedy, temperature, layouts, llama_server, llama_variant, n_edits, edit_lines, edit_max_tokens,
                 threads, n_ctx, device, json_path, plot_path) -> None:
    """Code-editor traffic against pyspec serve and, given --llama-server
    PATH or $PYSPEC_LLAMA_SERVER, llama.cpp's llama-server.

    Typing (--workload typing, the default): llama.vim's /infill requests.
    --sites lines of the interpreter's standard library are typed again, each
    in --steps requests as the cursor moves along the line, then a prefetch
    of the next line; all servers run at once (one slot each), every site on
    each in turn. Prints per backend the latency of a suggestion (p50, p90,
    with 95 % intervals), the prompt tokens each request processed, the
    tokens a suggestion gets within 250 ms and 1 s, how often the first line
    of a suggestion is what the user goes on to type (right), how often all
    of it is (whole) and how often it is blank where more follows (empty);
    with several backends, the ratio of p50 latencies on the same requests.

    Edits (--workload edits): --edits windows of --edit-lines lines of the
    same files, each with a local variable to rename, asked in chat
    (temperature 0) of pyspec serve without drafting (plain), with its
    default drafting, and with the original as the prediction (OpenAI's
    Predicted Outputs), and of each llama-server variant. Prints per variant
    the request time, decode tokens/s, each edit's decode and request time
    over pyspec plain's (geometric mean, 95 % interval over edits), the
    prediction tokens accepted and rejected, and the answers equal to the
    renamed file.

    Progress goes to stderr, one line per site or edit.
    """
    from ..bench.serve import editor as be
    from ..bench.serve import editor_edits as ee
    from ..bench.serve import editor_sites as es
    from ..errors import PyspecError
    from ..model import resolve_path

    names = [x.strip() for x in layouts.split(",") if x.strip()]
    if not names or any(x not in LAYOUTS for x in names):
        raise click.BadParameter(f"{layouts!r}: give some of {', '.join(LAYOUTS)}", param_hint="--layouts")
    if temperature is not None and greedy:
        raise click.UsageError("--temperature goes with --sampled (--greedy sends temperature 0)")
    check_llama_options(llama_server, llama_variant)
    if plot_path and workload == "edits":
        raise click.UsageError("--plot draws the typing workload (--workload typing or both)")
    lines = line_range(edit_lines)
    typing, editing = workload in ("typing", "both"), workload in ("edits", "both")
    n_ctx = n_ctx or (8192 if editing else 4096)

    def say(line: str) -> None:
        click.echo(line, err=True)

    skipped = []
    with command_errors(errors=(PyspecError, ValueError, OSError, RuntimeError)):
        if plot_path:  # fail before a long run, not after it
            from ..bench.plot import pyplot

            pyplot()
        check_device(device)
        path = resolve_path(model)
        draft_path = "" if no_draft or not draft else resolve_path(draft)
        variants, why = resolve_llama_variants(llama_server, llama_variant, draft_path)
        skipped += [why] if why else []
        for line in skipped:
            say(line)
        backends = editor_backends(path, draft_path, layouts=names, threads=threads, n_ctx=n_ctx,
                                   llama_server=llama_server, variants=variants, device=device)
        sent_temperature = 0.0 if greedy else temperature
        if typing:
            sites = es.sites(n_sites, seed, prefix_lines=prefix_lines, suffix_lines=suffix_lines, fresh=fresh)
            records = be.run(backends, sites, steps=steps, n_predict=n_predict, temperature=sent_temperature,
                             progress=say)
            summary = be.summarize(records, seed=seed)
        if editing:
            edits = ee.edits(n_edits, seed, lines=lines)
            if not edits:
                raise ValueError(f"no window of {edit_lines} lines with a name to rename in the standard library")
            if no_draft:
                say("pyspec serve --no-draft: its edit variants (plain, default, prediction) all decode plainly")
            for e in edits:
                need = ee.max_tokens(e, edit_max_tokens) + len(e.original) // 3 + 64
                if need > n_ctx:
                    say(f"edit {e.file}:{e.start}: its prompt and answer may need ~{need} tokens, over --n-ctx {n_ctx}")
            servers, edit_variants = edit_servers(backends)
            edit_records = ee.run(servers, edit_variants, edits, cap=edit_max_tokens, progress=say)
            edit_summary = ee.summarize(edit_records, [v.name for v in edit_variants], seed=seed)
    result = {"workload": workload, "model": path, "draft": draft_path or None, "threads": threads, "n_ctx": n_ctx,
              "n_gpu_layers": device["n_gpu_layers"], "seed": seed, "python": sys.version.split()[0],
              "stdlib": es.stdlib_dir(),
              "backends": [{"name": b.name, "command": b.server.command, "fields": b.fields} for b in backends],
              "skipped": skipped}
    tables, heads = [], []
    if typing:
        result.update({"steps": steps, "fresh": fresh, "n_predict": n_predict, "prefix_lines": prefix_lines,
                       "suffix_lines": suffix_lines, "temperature": sent_temperature,
                       "sites": [{"file": s.file, "line": s.line_no, "text": s.line} for s in sites],
                       "summary": summary, "requests": records})
        tables.append(be.format_summary(summary))
        heads.append(f"{len(sites)} {'fresh lines' if fresh else 'sites'} x {steps + fresh} steps + prefetch, "
                     f"{n_predict} tokens at most, "
                     f"{'greedy' if greedy else 'sampled'}")
    if editing:
        result["edits"] = {
            "edit_lines": list(lines), "max_tokens_cap": edit_max_tokens, "temperature": 0, "system": ee.SYSTEM,
            "edits": [{"file": e.file, "line": e.start, "lines": e.n_lines, "old": e.old, "new": e.new,
                       "uses": e.uses, "max_tokens": ee.max_tokens(e, edit_max_tokens)} for e in edits],
            "variants": [{"name": v.name, "server": v.server, "fields": v.fields, "prediction": v.predicted}
                         for v in edit_variants],
            "summary": edit_summary, "requests": edit_records, "table": ee.format_summary(edit_summary)}
        tables.append(result["edits"]["table"])
        heads.append(f"{len(edits)} edits ({edit_lines}-line files, a rename each), greedy")
    result["table"] = "\n\n".join(tables)
    if json_path:
        with click.open_file(json_path, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    if plot_path:
        be.plot(result, plot_path)
    if json_path != "-":
        click.echo(f"{path} (draft {draft_path or 'none'}), {threads} threads, context {n_ctx}; "
                   + "; ".join(heads) + "\n" + result["table"])
