"""`pyspec generate`: the main job."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import click

from ..errors import ConstraintError
from ..drafting import POLICY_DEFAULTS
from ..speculative import DRAFTERS, POLICIES
from ..settings import MAX_SEQUENCES
from .options import (DEFAULT_DRAFT, DEFAULT_MODEL, chat_template_option, command_errors, constraint_options,
                      load_pair, max_tokens_option, model_options, sampling_options)


@click.command()
@click.argument("prompt")
@click.option("--model", "-m", default=None,
              help=f"Target model: a .gguf path or a default model name (see `pyspec models list`) "
                   f"[default: {DEFAULT_MODEL}].")
@click.option("--draft", "-d", default=None,
              help="Draft model for speculative decoding (path or name). With neither --model nor --draft, "
                   f"the default pair is used (draft: {DEFAULT_DRAFT}); with --model alone, suffix lookup drafts.")
@click.option("--no-draft", is_flag=True, help="Plain decoding with the target alone.")
@click.option("--draft-max", "-k", default=None, type=click.IntRange(min=0),
              help="Tokens drafted per target pass (fixed policy) or their cap (other policies); 0 = plain "
                   "[default: " + ", ".join(f"{n} {p['default_draft_max']}" for n, p in POLICIES.items()) + "].")
@click.option("--drafter", type=click.Choice(list(DRAFTERS)), default=None,
              help="; ".join(f"{n}: {d['summary']}" for n, d in DRAFTERS.items())
                   + " [default: hybrid with a draft model, else suffix].")
@click.option("--policy", type=click.Choice(list(POLICIES)), default="auto", show_default=True,
              help="Draft length per round (see docs/drafters.md): "
                   + "; ".join(f"{n}: {p['summary']}" for n, p in POLICIES.items()) + ".")
@click.option("--p-min", default=POLICY_DEFAULTS.p_min, show_default=True, type=click.FloatRange(0, 1),
              help="confidence policy: stop when the draft's probability of its own token is below this.")
@click.option("--svip-h", default=POLICY_DEFAULTS.h, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="svip policy: stop when sqrt(gamma * entropy) exceeds this (gamma = --svip-gamma).")
@click.option("--svip-gamma", default=POLICY_DEFAULTS.gamma, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--raw", is_flag=True, help="Send PROMPT as is, without the model's chat template.")
@click.option("--stop", multiple=True, help="Stop when this text appears (repeatable); it is not printed.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (text, tokens, n_prompt_tokens, n_generated_tokens, stats, flash_attn, "
                   "n_gpu_layers) "
                   "instead of streaming.")
@click.option("--stats", "show_stats", is_flag=True, help="Print a summary of speed and acceptance on stderr.")
@click.option("--show-drafts", is_flag=True,
              help="On a terminal, colour accepted draft tokens (green) apart from tokens the target sampled.")
@click.option("--n", "n_samples", default=1, show_default=True, type=click.IntRange(1, MAX_SEQUENCES),
              help="Independent samples of PROMPT, generated together (one target pass per round for all; "
                   "drafted by consensus among them, without a draft model). Printed one after another; "
                   "--json gives a `choices` list and batch `stats`.")
@click.option("--memory", "memory_file", default=None, type=click.Path(dir_okay=False),
              help="A memory file: earlier prompts and answers to draft from (suffix drafter); created if "
                   "missing, and this run's prompt and answer are added to it.")
@click.option("--suffix", default=None,
              help="Fill in the middle: PROMPT is the text before the cursor and this the text after it; the "
                   "answer is what goes between (the model's FIM tokens; no chat template).")
@click.option("--no-healing", is_flag=True,
              help="With --suffix: keep a half-typed last word's token in the prompt (the plain FIM law) instead "
                   "of healing it (docs/editor.md: token healing).")
@click.option("--prediction", "prediction_file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="A file the answer will mostly copy (Predicted Outputs: an edit of it): drafted from, never "
                   "trusted; --json counts its accepted and rejected tokens.")
@chat_template_option
@constraint_options
@max_tokens_option()
@sampling_options()
@model_options
def generate(prompt, model, draft, no_draft, draft_max, drafter, policy, p_min, svip_h, svip_gamma, raw, stop,
             as_json, show_stats, show_drafts, n_samples, max_tokens, sampling, seed, n_ctx, threads, device,
             memory_file, chat_template, constraint, suffix, no_healing, prediction_file) -> None:
    """Generate a continuation of PROMPT and stream it to stdout.

    By default the default target/draft pair runs speculative decoding, which
    keeps the target's output distribution exactly: the hybrid drafter (n-gram
    lookup where the text repeats, the draft model elsewhere) under the auto
    policy, which drafts only where its measurements say it pays. With
    --model and no --draft, suffix lookup drafts (this text, the other samples,
    and --memory). --no-draft decodes plainly.
    """
    # Samples draft by lookup unless a draft model is named (on a CPU the default
    # pair's draft model rarely pays, and n samples would need n draft sequences).
    default_draft = n_samples == 1
    if draft is None and drafter is None and not (model is None and default_draft):
        drafter = "suffix"  # no draft model: lookup, which auto uses only where it pays
    colour = show_drafts and sys.stdout.isatty() and not as_json
    with command_errors():
        target, gen = load_pair(model, draft, no_draft=no_draft, drafter=drafter, policy=policy,
                                draft_max=draft_max, default_draft=default_draft, n_ctx=n_ctx, n_threads=threads,
                                n_seq_max=n_samples, chat_template=chat_template, **device)
        # The call's drafting, built once (the pair's drafter, policy and cap came with the decoder).
        drafting = gen.drafting(p_min=p_min, svip_h=svip_h, svip_gamma=svip_gamma) if gen.speculative else None
        kwargs = dict(drafting=drafting, constraint=constraint, suffix=suffix)
        if no_healing:
            if suffix is None:
                raise click.UsageError("--no-healing is for a fill-in-the-middle prompt (--suffix)")
            kwargs["healing"] = False
        if prediction_file is not None:
            with open(prediction_file, encoding="utf-8") as f:
                kwargs["prediction"] = f.read()
        if constraint is not None:
            try:
                target.grammars.compile(constraint)  # an invalid one is a usage error, before any work
            except ConstraintError as e:
                raise click.UsageError(f"the constraint does not compile: {e}") from None
        memory = _open_memory(memory_file, gen)

        def echo(text: str, drafted: bool) -> None:
            sys.stdout.write(click.style(text, fg="green") if colour and drafted else text)
            sys.stdout.flush()

        if n_samples > 1:
            batch = gen.generate(prompt, n=n_samples, max_tokens=max_tokens, sampling=sampling, seed=seed,
                                 stop=list(stop), chat=not raw and suffix is None, **kwargs)
            _save_memory(memory, memory_file, target)
    if n_samples > 1:
        _print_samples(batch, as_json, show_stats, target.flash_attn, device["n_gpu_layers"])
        return
    with command_errors():
        out = gen.generate(
            prompt,
            max_tokens=max_tokens,
            sampling=sampling,
            seed=seed,
            stop=list(stop),
            chat=not raw and suffix is None,
            on_token=None if as_json else echo,
            **kwargs,
        )
        _save_memory(memory, memory_file, target)
    if as_json:
        d = out.to_dict()
        d["flash_attn"] = target.flash_attn  # as the target's context runs it ("on"/"off")
        d["n_gpu_layers"] = device["n_gpu_layers"]  # as asked (a build without a GPU backend warned)
        click.echo(json.dumps(d, indent=2, ensure_ascii=False))
    else:
        click.echo()
    if show_stats:
        sys.stdout.flush()
        click.echo(_stats_summary(out, flash_attn=target.flash_attn, requested=device["flash_attn"]), err=True)


def _open_memory(path, gen):
    """The generator's memory, with the documents of the --memory file added."""
    if path is None:
        return None
    from ..memory import vocab_fingerprint

    if gen.memory is None:
        raise click.UsageError("--memory needs a model loaded with memory (memory_mb > 0)")
    if os.path.exists(path):
        gen.memory.load(path, vocab_fingerprint(gen.target))
    return gen.memory


def _save_memory(memory, path, target) -> None:
    if memory is not None:
        from ..memory import vocab_fingerprint

        memory.save(path, vocab_fingerprint(target))


def _print_samples(batch, as_json: bool, show_stats: bool, flash_attn: str, n_gpu_layers: int) -> None:
    if as_json:
        d = batch.to_dict()
        d["flash_attn"] = flash_attn
        d["n_gpu_layers"] = n_gpu_layers
        click.echo(json.dumps(d, indent=2, ensure_ascii=False))
    else:
        for i, c in enumerate(batch.choices):
            click.echo(click.style(f"--- sample {i + 1} of {len(batch.choices)} "
                                   f"({c.n_generated_tokens} tokens, {c.stop_reason}, seed {c.stats.seed}) ---",
                                   bold=True))
            click.echo(c.text)
    if show_stats:
        s = batch.stats
        ttft = ", ".join(f"{t:.2f}" for t in s.ttft_s)
        click.echo(f"{s.n_seq} samples, {s.n_generated} tokens in {s.rounds} target passes "
                   f"({s.rows} rows, at most {s.max_rows} in one); aggregate {s.aggregate_tok_s:.1f} tok/s "
                   f"after each sample's first token; time to first token {ttft} s (seed {s.seed})", err=True)


def _stats_summary(out, flash_attn: Optional[str] = None, requested: Optional[str] = None) -> str:
    s = out.stats
    lines = [
        f"{out.n_prompt_tokens} prompt tokens, {out.n_generated_tokens} generated ({out.stop_reason})",
        f"time to first token {s.ttft_s:.2f} s, then {s.decode_tok_s:.1f} tok/s (seed {s.seed})",
    ]
    if flash_attn is not None:
        lines.append(f"flash attention {flash_attn}" + (f" (--flash-attn {requested})" if requested else ""))
    if s.rounds and (s.drafted or s.policy_plain):
        per_pos = " ".join(f"{a:.2f}" for a, d in zip(s.accepted_per_position, s.drafted_at) if d)
        lines.append(
            f"{s.rounds} target passes, {s.drafted} drafted, {s.accepted} accepted "
            f"(acceptance {s.acceptance_rate:.2f}; {s.mean_accepted_len:.2f} tokens per pass; by position: {per_pos})"
        )
        calib = f", calibration {s.calibrate_s:.2f} s" if s.calibrate_s else ""
        lines.append(f"time: draft {s.draft_s:.2f} s, verify {s.verify_s:.2f} s, host overhead {s.overhead_s:.3f} s"
                     f"{calib}")
        hist = " ".join(f"{k}:{n}" for k, n in enumerate(s.length_hist) if n)
        lines.append(f"draft lengths (length:rounds) {hist}; policy chose plain {s.policy_plain} times; "
                     f"lookup drafted {s.ngram_rounds} rounds ({s.ngram_reanchored} re-anchored after an edit, "
                     f"{s.memory_rounds} from memory)")
    if s.masks:
        per_mask = 1e6 * s.mask_s / s.masks
        lines.append(f"grammar: {s.masks} masks ({per_mask:.0f} us each, {s.mask_s:.3f} s); forced text drafted "
                     f"{s.forced_drafted} tokens in {s.forced_rounds} passes, {s.forced_accepted} accepted; "
                     f"{s.grammar_cuts} lookup drafts cut")
    return "\n".join(lines)


def register(main: click.Group) -> None:
    main.add_command(generate)
