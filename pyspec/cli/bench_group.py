"""`pyspec bench`: the benchmarks, one group, so that the top level shows what a
user does. The commands themselves live in bench.py (paired, parallel,
simulate), bench_multiturn.py, bench_rpc.py, bench_serve.py, bench_editor.py,
bench_vim.py, bench_agent.py, bench_soak.py and tools.py (verify).

The old spellings (`pyspec bench-serve ...`, `pyspec simulate ...`, and
`pyspec bench [options]`, now `pyspec bench paired [options]`) still run the
same command, after one line on stderr (stdout stays the command's), and are
not listed by --help; they go in a later release.
"""

from __future__ import annotations

import click

from . import bench as bench_inprocess
from . import bench_agent, bench_editor, bench_multiturn, bench_rpc, bench_serve, bench_soak, bench_vim, tools

#: The old top-level names and the `pyspec bench` subcommands they now are.
RENAMED: dict[str, str] = {
    "bench-multiturn": "multiturn",
    "bench-parallel": "parallel",
    "bench-rpc": "rpc",
    "bench-serve": "serve",
    "bench-soak": "soak",
    "bench-verify": "verify",
    "simulate": "simulate",
}


def notice(old: str, new: str, what: str = "name") -> None:
    """The one line an old spelling prints, on stderr (stdout stays the command's: --json)."""
    click.echo(f"pyspec: 'pyspec {old}' is now 'pyspec {new}' (the old {what} goes in a later release)", err=True)


class BenchGroup(click.Group):
    """Lists its subcommands in the order they were added (the one to start
    with first); options before any subcommand, or nothing at all, are the
    old `pyspec bench [options]`, i.e. `bench paired` (bare `pyspec bench`
    ran the default suite, and still does, after the notice)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0].startswith("-") and args[0] not in ctx.help_option_names):
            if not ctx.resilient_parsing:
                notice("bench [options]", "bench paired [options]", what="spelling")
            args = ["paired", *args]
        return super().parse_args(ctx, args)


class WithOldBenchNames(click.Group):
    """The top-level group: also answers to the old benchmark names (RENAMED),
    without listing them."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        if args and args[0] in RENAMED and args[0] not in self.commands:
            old, new = args[0], RENAMED[args[0]]
            if not ctx.resilient_parsing:
                notice(old, f"bench {new}")
            return old, bench.commands[new], args[1:]
        return super().resolve_command(ctx, args)


@click.group(cls=BenchGroup, no_args_is_help=False,
             short_help="The benchmarks: speed, servers, soaks (pyspec bench --help).")
def bench() -> None:
    """Benchmarks: pyspec's speed against plain decoding, llama-cpp-python
    and llama.cpp's llama-server; and a soak of its server.

    Start with `pyspec bench paired --paired plain,default --reps 4`: is
    speculative decoding faster on this machine, as ratios with 95 %
    intervals. docs/performance.md describes each benchmark; every one has
    --help.
    """


#: (subcommand, command, the line `pyspec bench --help` shows for it), in that order.
_SUBCOMMANDS = (
    ("paired", bench_inprocess.bench,
     "Decode speed vs llama-cpp-python; --paired: A/B ratios."),
    ("multiturn", bench_multiturn.bench_multiturn,
     "Multi-turn editing conversations: the default decoder vs plain."),
    ("parallel", bench_inprocess.bench_parallel,
     "Many sequences in one batch against one at a time."),
    ("serve", bench_serve.bench_serve,
     "pyspec serve vs llama-cpp-python's or llama.cpp's server."),
    ("editor", bench_editor.bench_editor,
     "Code-editor completion traffic (/infill) against servers."),
    ("vim", bench_vim.bench_vim,
     "The real llama.vim plugin, in Vim, against servers."),
    ("agent", bench_agent.bench_agent,
     "Coding-agent sessions (tools; three dialects) against servers."),
    ("soak", bench_soak.bench_soak,
     "`pyspec serve` under mixed concurrent load for --minutes."),
    ("rpc", bench_rpc.bench_rpc,
     "Speculation over RPC workers behind a network delay."),
    ("verify", tools.bench_verify_cmd,
     "Verification rounds per second of the sampling core (no model)."),
    ("simulate", bench_inprocess.simulate,
     "The oracle gap of n-gram drafting on the bench prompts."),
)
for _name, _cmd, _line in _SUBCOMMANDS:
    assert _cmd.name == _name, (_cmd.name, _name)
    _cmd.short_help = _line
    bench.add_command(_cmd)


def register(main: click.Group) -> None:
    main.add_command(bench)
