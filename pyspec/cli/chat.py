"""`pyspec chat`: a conversation in the terminal, on the default pair or -m.

Each turn renders the whole conversation with the model's chat template; both
models keep their caches between turns, and the engine reuses the longest
cached prefix, so a turn processes only its new tokens (its stats say how
many were cached). Without a terminal it reads one message per line (or a
block between two lines of three quotes) from stdin and writes each answer
on stdout, so it scripts; in a terminal it shows a prompt, takes multi-line
input (a line ending in a backslash goes on), puts the next turn's fixed head
into the caches while the person types (:func:`warm`), and Ctrl-C stops the
answer, not the session (pyspec/interrupts.py cancels the generation and
waits for it to leave the core before KeyboardInterrupt reaches this loop).
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Dict, List, Optional

import click

from ..errors import PyspecError
from ..interrupts import ctrl_c_held
from ..prefix import common_prefix
from .generate import _stats_summary
from .options import chat_template_option, command_errors, load_pair, max_tokens_option, model_options, \
    sampling_options

HELP = ("/clear forgets the conversation (the system message stays), /system TEXT sets the system message "
        "(and clears), /save FILE writes the conversation as JSON, /help, /exit (or Ctrl-D) ends")


#: At most this many tokens are processed ahead of a turn (see :func:`warm`).
WARM_MAX = 64


class Conversation:
    """The messages so far (the system message first, when there is one)."""

    def __init__(self, system: Optional[str]) -> None:
        self.system = system
        self.turns: List[Dict[str, str]] = []

    @property
    def messages(self) -> List[Dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def command(self, line: str) -> bool:
        """Run a /command; False for /exit."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/exit", "/quit"):
            return False
        if name == "/clear":
            self.turns.clear()
            click.echo("(conversation cleared)", err=True)
        elif name == "/system":
            self.system, self.turns = arg or None, []
            click.echo("(system message set; conversation cleared)" if arg else
                       "(no system message; conversation cleared)", err=True)
        elif name == "/save":
            if not arg:
                click.echo("usage: /save FILE", err=True)
                return True
            try:
                with open(arg, "w", encoding="utf-8") as f:
                    json.dump(self.messages, f, ensure_ascii=False, indent=2)
            except OSError as e:  # the session goes on
                click.echo(f"error: cannot save to {arg}: {e.strerror or e}", err=True)
                return True
            click.echo(f"(saved {len(self.messages)} messages to {arg})", err=True)
        elif name == "/help":
            click.echo(HELP, err=True)
        else:
            click.echo(f"unknown command {name}: {HELP}", err=True)
        return True


def read_message(tty: bool) -> Optional[str]:
    """The next message (None at the end of input): a line, or a block
    between two lines of three quotes; in a terminal also a line continued
    while it ends in a backslash (piped text keeps its backslashes)."""
    try:
        line = input(">>> " if tty else "")
    except EOFError:
        return None
    block = line.strip() == '"""'
    parts = [] if block else [line]
    try:
        while block or (tty and parts[-1].endswith("\\")):
            if not block:
                parts[-1] = parts[-1][:-1]
            more = input("... " if tty else "")
            if block and more.strip() == '"""':
                break
            parts.append(more)
    except EOFError:  # the input ended inside a block: what came is the message
        pass
    return "\n".join(parts)


def next_turn_head(gen, messages: List[Dict[str, str]]) -> List[int]:
    """The tokens that the next turn's prompt starts with, whatever the
    message: the conversation, the template's end of the last message and
    the start of a user message (what two different messages share)."""
    a = gen.prompt_tokens(messages + [{"role": "user", "content": "A"}])
    b = gen.prompt_tokens(messages + [{"role": "user", "content": "B"}])
    return a[:common_prefix(a, b)]


def warm(gen, messages: List[Dict[str, str]]) -> None:
    """Put the next turn's head (:func:`next_turn_head`) into the caches now,
    while the person reads the answer and types: the turn's first token then
    waits only for the message's own tokens (on a ChatML template the head
    adds five tokens to the answer: about a third of a short turn's new
    tokens). Only a model whose cache already holds the conversation, and
    only up to WARM_MAX tokens; the engine reuses the cache's longest common
    prefix, so a head the message does not continue costs nothing but time."""
    head = next_turn_head(gen, messages)
    draft = getattr(gen, "draft", None)
    jobs = []
    for model in [gen.target] + ([draft] if draft is not None else []):
        n = common_prefix(model.native.cached(0), head)
        if 0 < n < len(head) and len(head) - n <= WARM_MAX:
            jobs.append((model.native, n))
    if not jobs:
        return
    # Short, so Ctrl-C waits for it rather than leave it decoding under the next turn.
    with ctrl_c_held():
        for native, n in jobs:
            try:
                native.decode(head[n:], n, 1, 0)
            except (PyspecError, ValueError):  # a full context, say: the turn then processes the head itself
                return


def _one_line_warnings(message, category, filename, lineno, file=None, line=None) -> None:
    click.echo(f"warning: {message}", err=True)


@click.command()
@click.option("--model", "-m", default=None, help="Target model (path or default name) [default: the default pair].")
@click.option("--draft", "-d", default=None, help="Draft model (path or name).")
@click.option("--no-draft", is_flag=True, help="Plain decoding with the target alone.")
@click.option("--system", default=None, help="The system message.")
@click.option("--stats", "show_stats", is_flag=True,
              help="After each answer, on stderr: how many prompt tokens were new and how many came from the "
                   "cache, time to first token and speed.")
@click.option("--show-drafts", is_flag=True,
              help="In a terminal, colour tokens from accepted drafts green (as generate --show-drafts).")
@chat_template_option
@max_tokens_option()
@sampling_options()
@model_options
def chat(model, draft, no_draft, system, show_stats, show_drafts, chat_template, max_tokens, sampling, seed, n_ctx,
         threads, device) -> None:
    """Talk to a model: each message you type is answered, streamed as it is
    generated, with the model's chat template over the whole conversation.
    The conversation and both models' caches are kept across turns, so a turn
    processes only its new tokens (--stats shows how many).

    \b
    Commands:
      /clear        forget the conversation (the system message stays)
      /system TEXT  set the system message (and clear); /system alone removes it
      /save FILE    write the conversation as JSON (OpenAI-style messages)
      /help         this list
      /exit         end (so does Ctrl-D)

    In a terminal, end a line with a backslash to go on, or put a block
    between two lines of \"\"\"; Ctrl-C stops an answer, not the session (what
    was written stays in the conversation). Without a terminal, each line of
    stdin is a message (or a block between \"\"\" lines) and each answer is
    written to stdout with a blank line after it, so it scripts:

    \b
      printf 'Name a colour.\\nAnother one?\\n' | pyspec chat --stats -n 16
    """
    tty = sys.stdin.isatty()
    colour = show_drafts and sys.stdout.isatty()
    with command_errors():
        target, gen = load_pair(model, draft, no_draft=no_draft, drafter=None if model is None or draft else "suffix",
                                policy="auto", draft_max=None, default_draft=True, n_ctx=n_ctx, n_threads=threads,
                                n_seq_max=1, chat_template=chat_template, **device)
    if tty:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:  # pragma: no cover - a Python without it
            pass
        click.echo(f"pyspec chat: {target.path} ({HELP})", err=True)
    convo = Conversation(system)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warnings  # e.g. "no chat template": one line, not a source quote
        while True:
            try:
                text = read_message(tty)
            except KeyboardInterrupt:  # at the prompt: a new line, as shells do
                click.echo("", err=True)
                continue
            if text is None:
                if tty:
                    click.echo("", err=True)
                return
            if not text.strip():
                continue
            try:
                if text.startswith("/"):
                    if not convo.command(text.strip()):
                        return
                    continue
                answer(gen, convo, text, tty=tty, colour=colour, show_stats=show_stats, max_tokens=max_tokens,
                       sampling=sampling, seed=seed)
                if tty:  # a person reads and types now: the next turn's head goes into the caches meanwhile
                    try:
                        warm(gen, convo.messages)
                    except (PyspecError, ValueError):  # e.g. the context is full: the next turn says so
                        pass
            except KeyboardInterrupt:  # outside the answer (its stats, warm): back to the prompt
                click.echo("", err=True)


def answer(gen, convo: Conversation, text: str, *, tty: bool, colour: bool, show_stats: bool, **settings) -> None:
    """One turn: ``text`` joins the conversation and the answer streams to
    stdout. Ctrl-C stops it; what was written stays in the conversation."""
    convo.turns.append({"role": "user", "content": text})
    said: List[str] = []

    def echo(piece: str, drafted: bool) -> None:
        said.append(piece)
        sys.stdout.write(click.style(piece, fg="green") if colour and drafted else piece)
        sys.stdout.flush()

    out = None
    try:
        out = gen.generate(convo.messages, on_token=echo, **settings)
    except KeyboardInterrupt:  # the generation is cancelled and out of the core by now (interrupts.py)
        sys.stdout.flush()
        click.echo("\n(stopped)", err=True)
    except (PyspecError, ValueError) as e:  # e.g. the context is full: the session goes on
        click.echo(f"error: {e} (/clear starts again)", err=True)
        convo.turns.pop()
        return
    convo.turns.append({"role": "assistant", "content": out.text if out is not None else "".join(said)})
    sys.stdout.write("\n" if tty else "\n\n")
    sys.stdout.flush()
    if show_stats and out is not None:
        cached = out.stats.n_cached_tokens
        click.echo(f"prompt: {out.n_prompt_tokens - cached} new tokens of {out.n_prompt_tokens} ({cached} cached)",
                   err=True)
        click.echo(_stats_summary(out), err=True)


def register(main: click.Group) -> None:
    main.add_command(chat)
