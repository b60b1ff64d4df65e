"""`pyspec chat`: a conversation in the terminal, on the default pair or -m.

Each turn renders the whole conversation with the model's chat template; both
models keep their caches between turns, and the engine reuses the longest
cached prefix, so a turn processes only its new tokens (its stats say how
many were cached). Without a terminal it reads one message per line from
stdin and writes each answer on stdout, so it scripts; in a terminal it shows
a prompt, takes multi-line input (a line ending in a backslash goes on, or a
block between two lines of three quotes), and Ctrl-C stops the answer, not
the session.
"""

from __future__ import annotations

import json
import sys
from typing import Dict, List, Optional, TextIO

import click

from ..errors import PyspecError
from .generate import _stats_summary
from .options import chat_template_option, command_errors, load_pair, max_tokens_option, model_options, \
    sampling_options

HELP = ("/clear forgets the conversation (the system message stays), /system TEXT sets the system message "
        "(and clears), /save FILE writes the conversation as JSON, /exit (or Ctrl-D) ends")


class Conversation:
    """The messages so far (the system message first, when there is one)."""

    def __init__(self, system: Optional[str]) -> None:
        self.system = system
        self.turns: List[Dict[str, str]] = []

    @property
    def messages(self) -> List[Dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def command(self, line: str, out: TextIO) -> bool:
        """Run a /command; False for /exit."""
        name, _, arg = line.partition(" ")
        if name in ("/exit", "/quit"):
            return False
        if name == "/clear":
            self.turns.clear()
            click.echo("(conversation cleared)", err=True)
        elif name == "/system":
            self.system, self.turns = arg.strip() or None, []
            click.echo("(system message set; conversation cleared)", err=True)
        elif name == "/save":
            if not arg.strip():
                click.echo("usage: /save FILE", err=True)
            else:
                with open(arg.strip(), "w", encoding="utf-8") as f:
                    json.dump(self.messages, f, ensure_ascii=False, indent=2)
                click.echo(f"(saved {len(self.messages)} messages to {arg.strip()})", err=True)
        else:
            click.echo(f"unknown command {name}: {HELP}", err=True)
        return True


def read_message(tty: bool) -> Optional[str]:
    """The next message (None at the end of input). In a terminal: a line,
    continued while it ends in a backslash, or a block between \"\"\" lines."""
    try:
        line = input(">>> " if tty else "")
    except EOFError:
        return None
    if not tty:
        return line
    if line.strip() == '"""':
        lines = []
        while True:
            more = input("... ")
            if more.strip() == '"""':
                return "\n".join(lines)
            lines.append(more)
    parts = [line]
    while parts[-1].endswith("\\"):
        parts[-1] = parts[-1][:-1]
        parts.append(input("... "))
    return "\n".join(parts)


@click.command()
@click.option("--model", "-m", default=None, help="Target model (path or default name) [default: the default pair].")
@click.option("--draft", "-d", default=None, help="Draft model (path or name).")
@click.option("--no-draft", is_flag=True, help="Plain decoding with the target alone.")
@click.option("--system", default=None, help="The system message.")
@click.option("--stats", "show_stats", is_flag=True, help="After each answer, its speed and cached prompt on stderr.")
@click.option("--show-drafts", is_flag=True, help="In a terminal, colour tokens from accepted drafts green.")
@chat_template_option
@max_tokens_option()
@sampling_options()
@model_options
def chat(model, draft, no_draft, system, show_stats, show_drafts, chat_template, max_tokens, sampling, seed, n_ctx,
         threads, device) -> None:
    """Talk to a model: each line you type is a message, the answer streams
    back. The conversation and both models' caches are kept across turns, so
    a turn processes only its new tokens.

    /clear, /system TEXT, /save FILE, /exit. In a terminal, end a line with a
    backslash to go on, or put a block between two lines of \"\"\"; Ctrl-C
    stops an answer (what was written stays in the conversation). Without a
    terminal, each line of stdin is a message and each answer a paragraph of
    stdout.
    """
    tty = sys.stdin.isatty()
    colour = show_drafts and sys.stdout.isatty()
    with command_errors():
        target, gen = load_pair(model, draft, no_draft=no_draft, drafter=None if model is None or draft else "suffix",
                                policy="auto", draft_max=None, default_draft=True, n_ctx=n_ctx, n_threads=threads,
                                n_seq_max=1, chat_template=chat_template, **device)
    if tty:
        click.echo(f"pyspec chat: {target.path} ({HELP})", err=True)
    convo = Conversation(system)
    while True:
        try:
            text = read_message(tty)
        except KeyboardInterrupt:  # at the prompt: a new line, as shells do
            click.echo("", err=True)
            continue
        if text is None:
            return
        if not text.strip():
            continue
        if text.startswith("/"):
            if not convo.command(text.strip(), sys.stdout):
                return
            continue
        convo.turns.append({"role": "user", "content": text})
        said: List[str] = []

        def echo(piece: str, drafted: bool) -> None:
            said.append(piece)
            sys.stdout.write(click.style(piece, fg="green") if colour and drafted else piece)
            sys.stdout.flush()

        out = None
        try:
            out = gen.generate(convo.messages, max_tokens=max_tokens, sampling=sampling, seed=seed, on_token=echo)
        except KeyboardInterrupt:
            click.echo("\n(stopped)", err=True)
        except (PyspecError, ValueError) as e:  # e.g. the context is full: the session goes on
            click.echo(f"error: {e} (/clear starts again)", err=True)
            convo.turns.pop()
            continue
        convo.turns.append({"role": "assistant", "content": out.text if out is not None else "".join(said)})
        sys.stdout.write("\n" if tty else "\n\n")
        sys.stdout.flush()
        if show_stats and out is not None:
            s = out.stats
            click.echo(f"prompt: {out.n_prompt_tokens - s.n_cached_tokens} new tokens of {out.n_prompt_tokens} "
                       f"({s.n_cached_tokens} cached)", err=True)
            click.echo(_stats_summary(out), err=True)


def register(main: click.Group) -> None:
    main.add_command(chat)
