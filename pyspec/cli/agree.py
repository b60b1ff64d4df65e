"""`pyspec agree` (how two models agree) and `pyspec quantize` (libllama's quantiser)."""

from __future__ import annotations

import json
import os
import sys

import click

from ..agree.plot import plot_agreement
from ..agree.report import json_safe, format_report
from ..errors import PyspecError
from ..tools.quantize import TYPES
from ..settings import MAX_DRAFT, N_CTX_BENCH, SEED_BITS
from ..sampling import Sampling
from .._platform import physical_cores
from .options import (command_errors, device_options, load_model, max_tokens_option, n_ctx_option, report_options,
                      sampling_options, threads_option)


@click.command()
@click.argument("reference")
@click.argument("candidate")
@click.option("--text", "text_file", type=click.File("r", encoding="utf-8"), default=None,
              help="Score this text (cut into --window-token streams) instead of the built-in mix.")
@click.option("--prompts", "prompts_file", type=click.File("r", encoding="utf-8"), default=None,
              help="One prompt per line (or a JSON string, or {\"prompt\": ...}, per line for prompts with "
                   "newlines): each is continued by the reference (--max-tokens, at the sampling settings) and "
                   "the continuation is scored: the tokens speculation would draft.")
@max_tokens_option(128, minimum=1, help="Continuation length of each --prompts prompt.")
@click.option("--raw", is_flag=True, help="Send --prompts as is, without the reference's chat template.")
@click.option("--window", default=512, show_default=True, type=click.IntRange(min=2),
              help="Tokens per stream of a --text file.")
@sampling_options(Sampling.OPENAI, seed=False, penalties=False)
@click.option("--seed", "-s", default=0, show_default=True, type=click.IntRange(0, 2**SEED_BITS - 1),
              help="Seed of the --prompts continuations (prompt i: seed + i).")
@click.option("--draft-max", "-k", default=8, show_default=True, type=click.IntRange(1, MAX_DRAFT),
              help="Predict speculation for k = 1..K draft tokens per round.")
@click.option("--costs/--no-costs", default=True, show_default=True,
              help="Time both models here to predict speed-ups (--no-costs: tokens per pass only).")
@n_ctx_option(N_CTX_BENCH, help="Context of each model: the longest stream must fit.")
@threads_option
@device_options
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@report_options("the report (acceptance_mean, kl_mean, top1_agreement, n_positions, verdict, per_category, "
                "speculation, ...)", "the CDFs of per-position acceptance and KL")
def agree(reference, candidate, text_file, prompts_file, max_tokens, raw, window, sampling,
          seed, draft_max, costs, n_ctx, threads, device, quiet, json_path, plot_path) -> None:
    """How CANDIDATE agrees with REFERENCE (GGUF paths or default model names
    sharing one vocabulary), position by position over the same text.

    For each position both models read (teacher-forced): acceptance
    α = Σ min(p, q) = 1 - TV(p, q) at the sampling settings (the probability
    that a token CANDIDATE drafts is accepted by REFERENCE), top-1 agreement
    (α at T = 0), KL(p ‖ q) of the full T = 1 distributions (as
    llama-perplexity --kl-divergence) and the probability of the text's next
    token under each. Prints means and percentiles per category, the
    speculation view (acceptance by draft position, expected tokens per
    target pass and the predicted speed-up for k = 1..8 from both models'
    costs timed on this machine), and a verdict for a quantised CANDIDATE:
    healthy / suspicious / broken, against published KL scoreboards for its
    quantisation type. Text: a built-in mix (code, prose, math, chat),
    --text FILE, or --prompts FILE continued by REFERENCE.
    """
    if text_file and prompts_file:
        raise click.UsageError("give --text or --prompts, not both")
    ctx = click.get_current_context()
    for name, needs, given in (("max_tokens", "--prompts", prompts_file), ("seed", "--prompts", prompts_file),
                               ("raw", "--prompts", prompts_file), ("window", "--text", text_file)):
        if not given and ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT:
            raise click.UsageError(f"--{name.replace('_', '-')} applies to {needs} only")
    if plot_path:  # fail before minutes of work, not after
        from ..bench.plot import pyplot

        try:
            pyplot()
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None
    show = not quiet and json_path != "-"
    with command_errors():
        from ..agree import agree as run_agree, builtin_streams, prompt_streams, text_streams
        sampling.native()  # bad settings fail now, not after the models load
        load = dict(n_ctx=n_ctx, n_threads=threads, **device)
        ref = load_model(reference, **load)
        cand = load_model(candidate, role="draft", **load)
        if prompts_file:
            prompts = [_prompt(line) for line in prompts_file if line.strip()]
            with _bar(len(prompts), "continuing prompts", show) as bar:
                streams = prompt_streams(ref, prompts, max_tokens=max_tokens, chat=not raw, seed=seed,
                                         progress=bar.update, sampling=sampling)
        elif text_file:
            streams = text_streams(ref, text_file.read(), window)
        else:
            streams = builtin_streams(ref)
        if show:  # a line, not only the bar: logs and tests see that scoring began
            click.echo(f"pyspec agree: scoring {sum(s.n_rows for s in streams)} positions of {len(streams)} "
                       f"streams", err=True)
        with _bar(sum(s.n_rows for s in streams), "scoring positions", show) as bar:
            report = run_agree(ref, cand, streams, ks=range(1, draft_max + 1), costs=costs, progress=bar.update,
                               keep_rows=bool(plot_path), sampling=sampling)
    rows = report.pop("rows", None)
    if plot_path:
        plot_agreement(rows, plot_path, f"{report['models']['candidate']['path']} vs its reference")
    if json_path:  # as the benches write theirs ('-': stdout, without the table)
        with click.open_file(json_path, "w") as f:
            f.write(json.dumps(json_safe(report), indent=2) + "\n")
    if json_path != "-":
        click.echo(format_report(report))


def _prompt(line: str) -> str:
    """A --prompts line: a JSON string or {"prompt": ...} (JSON lines), else the line itself."""
    line = line.rstrip("\n")
    if line.lstrip()[:1] in ('"', "{"):
        try:
            value = json.loads(line)
        except ValueError:
            return line
        if isinstance(value, dict) and isinstance(value.get("prompt"), str):
            return value["prompt"]
        if isinstance(value, str):
            return value
    return line


def _bar(length: int, label: str, show: bool):
    import io

    return click.progressbar(length=length, label=label, file=sys.stderr if show else io.StringIO(),
                             show_pos=True)


@click.command()
@click.argument("source")
@click.argument("output", type=click.Path(dir_okay=False))
@click.option("--type", "qtype", required=True, type=click.Choice(list(TYPES), case_sensitive=False),
              help="Quantisation type (llama-quantize's names).")
@click.option("--allow-requantize", is_flag=True,
              help="Accept an already quantised SOURCE (its rounding adds to the new one; an F16/BF16/F32 "
                   "source is better).")
@click.option("--force", is_flag=True, help="Overwrite OUTPUT if it exists.")
@threads_option
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def quantize(source, output, qtype, allow_requantize, force, threads, quiet) -> None:
    """Quantise SOURCE (a GGUF path or default model name) to OUTPUT with
    libllama's own llama_model_quantize.

    OUTPUT appears only when complete (written under a temporary name beside
    it, then renamed); Ctrl-C or a failure leaves nothing behind. Check the
    result with `pyspec agree SOURCE OUTPUT`.
    """
    from ..tools.quantize import quantize as run_quantize

    state = {"bar": None}

    def progress(done: int, total: int) -> None:
        if quiet:
            return
        if state["bar"] is None:
            click.echo(f"pyspec quantize: {total} tensors to {qtype.upper()}", err=True)
            state["bar"] = _bar(total, f"quantizing to {qtype.upper()}", True).__enter__()
        state["bar"].update(done - state["bar"].pos)

    with command_errors(errors=(PyspecError, ValueError, OSError)):
        try:
            path = run_quantize(source, output, qtype.upper(), allow_requantize=allow_requantize,
                                n_threads=threads or physical_cores(), overwrite=force, progress=progress)
        finally:
            if state["bar"] is not None:
                state["bar"].__exit__(None, None, None)
    size = os.path.getsize(path)
    click.echo(f"wrote {path} ({qtype.upper()}, {size / 2**20:.1f} MiB)")


def register(main: click.Group) -> None:
    main.add_command(agree)
    main.add_command(quantize)
