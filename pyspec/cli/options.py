"""Options and helpers shared by the commands."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import warnings
from contextlib import contextmanager
from typing import Optional

import click

from ..errors import PyspecError
from ..settings import MAX_TOKENS, N_CTX, N_CTX_MIN, SEED_MAX
from ..sampling import Sampling
from ..models import DEFAULT_DRAFT, DEFAULT_TARGET as DEFAULT_MODEL

__all__ = ["DEFAULT_DRAFT", "DEFAULT_MODEL", "IntList", "check_device", "command_errors", "device_options",
           "load_model", "load_pair", "max_tokens_option", "model_options", "n_ctx_option", "report_options",
           "sampling_options", "suite_options", "threads_option"]


@contextmanager
def command_errors(interrupted: str = "interrupted", errors: tuple = (PyspecError, ValueError, OSError)):
    """A command's failure as users should see it: Ctrl-C exits 130 with one line,
    a known error becomes click's one-line `Error: ...` (exit 1), not a traceback."""
    try:
        yield
    except KeyboardInterrupt:
        click.echo(f"\n{interrupted}", err=True)
        sys.exit(130)
    except errors as e:
        raise click.ClickException(str(e)) from e


class IntList(click.ParamType):
    """Comma-separated integers >= ``minimum``, e.g. ``1,2,4,8``: a sorted list
    without repeats, or in the order given (``unique=False``)."""

    name = "INTS"

    def __init__(self, minimum: int = 1, unique: bool = True) -> None:
        self.minimum, self.unique = minimum, unique

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            values = [int(x) for x in str(value).split(",") if x.strip()]
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of integers, e.g. 1,2,4,8", param, ctx)
        if not values or min(values) < self.minimum:
            self.fail(f"{value!r}: give integers >= {self.minimum}", param, ctx)
        return sorted(set(values)) if self.unique else values


def suite_options(f):
    """The target model and the bench prompts to use (bench, simulate)."""
    from ..bench.suite import CATEGORIES

    opts = [
        click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True,
                     help="Target model (path or default name)."),
        click.option("--category", "categories", multiple=True, type=click.Choice(CATEGORIES),
                     help="Only these prompt categories (repeatable). json, tools and grammar (answers under a "
                          "constraint: bench paired --paired applies it) run only when named."),
        click.option("--per-category", type=click.IntRange(min=1), default=None,
                     help="Use only the first N prompts of each category."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def report_options(json_what: str, plot_what: str):
    """--json FILE and --plot FILE of the benchmarks: what each saves, in words."""
    def decorate(f):
        f = click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
                         help=f"Draw {plot_what}, to FILE.png (needs matplotlib: the `plot` extra).")(f)
        return click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False, allow_dash=True),
                            help=f"Write {json_what} as JSON to FILE ('-' for stdout).")(f)
    return decorate


@contextlib.contextmanager
def labelled_progress(length: int, label: str):
    """A progress bar on stderr whose label tells what runs now: yields the bar and
    progress(what), which relabels it."""
    with click.progressbar(length=length, label=label, file=sys.stderr, item_show_func=lambda x: x) as bar:
        def progress(what: str) -> None:
            bar.label = what
            bar.render_progress()

        yield bar, progress


def write_report(result: dict, json_path, plot_path, draw, text: str) -> None:
    """A bench's result as report_options promise it: --json (the whole of it),
    --plot (draw), and the table on stdout unless the JSON goes there."""
    if json_path:
        with click.open_file(json_path, "w") as f:
            json.dump(result, f, indent=2)
    if plot_path:
        draw(result, plot_path)
    if json_path != "-":
        click.echo(text)


def _logit_bias(ctx, param, values) -> tuple:
    """--logit-bias TOKEN=BIAS (repeatable; BIAS a number or -inf) as pairs."""
    pairs = []
    for v in values:
        token, sep, bias = v.partition("=")
        try:
            if not sep:
                raise ValueError
            pairs.append((int(token), float(bias)))
        except ValueError:
            raise click.BadParameter(f"{v!r}: expected TOKEN_ID=BIAS, e.g. 15043=-inf or 15043=2.5") from None
    return tuple(pairs)


def sampling_options(preset: Sampling = Sampling.API, *, seed: bool = True, penalties: bool = True):
    """--temperature, --top-k, --top-p and --min-p (defaults: ``preset``), with
    ``penalties`` the repetition penalties and --logit-bias, handed to the
    command as one ``sampling`` (a :class:`~pyspec.Sampling`), and --seed."""
    def decorate(f):
        @functools.wraps(f)
        def command(*args, temperature, top_k, top_p, min_p, **kwargs):
            more = {k: kwargs.pop(k) for k in ("repeat_penalty", "repeat_last_n", "frequency_penalty",
                                               "presence_penalty", "logit_bias") if penalties and k in kwargs}
            if "repeat_last_n" in more:
                more["penalty_last_n"] = more.pop("repeat_last_n")
            return f(*args, sampling=Sampling(temperature, top_k, top_p, min_p, **more), **kwargs)

        opts = [
            click.option("--temperature", "-t", default=preset.temperature, show_default=True, type=float,
                         help="Sampling temperature; 0 means greedy (deterministic)."),
            click.option("--top-k", default=preset.top_k, show_default=True, type=int,
                         help="Keep the k most likely tokens; 0 = off."),
            click.option("--top-p", default=preset.top_p, show_default=True, type=float,
                         help="Keep the smallest set of tokens whose mass reaches p; 1 = off."),
            click.option("--min-p", default=preset.min_p, show_default=True, type=float,
                         help="Drop tokens less likely than min-p times the most likely one; 0 = off."),
        ]
        if penalties:  # llama-cli's names and defaults; the window holds the prompt's tokens, as there
            opts += [
                click.option("--repeat-penalty", default=preset.repeat_penalty, show_default=True, type=float,
                             help="Divide the logit of a token seen in the last --repeat-last-n tokens by this "
                                  "(multiply a negative one); 1 = off."),
                click.option("--repeat-last-n", default=preset.penalty_last_n, show_default=True,
                             type=click.IntRange(-1), help="The penalties' window: the last N tokens, prompt "
                                                           "included; -1 all of them, 0 off."),
                click.option("--frequency-penalty", default=preset.frequency_penalty, show_default=True,
                             type=float, help="Lower a token's logit by this per occurrence in the window; 0 = off."),
                click.option("--presence-penalty", default=preset.presence_penalty, show_default=True, type=float,
                             help="Lower the logit of a token present in the window by this; 0 = off."),
                click.option("--logit-bias", multiple=True, callback=_logit_bias, metavar="TOKEN_ID=BIAS",
                             help="Add BIAS to a token's logit before sampling (repeatable); -inf forbids it."),
            ]
        if seed:
            opts.append(click.option(
                "--seed", "-s", default=None, type=click.IntRange(0, SEED_MAX),
                help="Random seed: the same seed gives the same output on the same build "
                     "[default: a fresh one each run, printed by --stats and --json]."))
        for opt in reversed(opts):
            command = opt(command)
        return command
    return decorate


def constraint_options(f):
    """--json-schema, --grammar and --regex, handed to the command as one
    ``constraint`` (a :class:`pyspec.Constraint`, or None)."""
    @functools.wraps(f)
    def command(*args, json_schema, grammar, regex, **kwargs):
        from ..constraints import from_keywords

        if json_schema is not None and os.path.isfile(json_schema):
            with open(json_schema, encoding="utf-8") as fh:
                json_schema = fh.read()
        if grammar is not None:
            if not os.path.isfile(grammar):
                raise click.BadParameter(f"no such file: {grammar}", param_hint="--grammar")
            with open(grammar, encoding="utf-8") as fh:
                grammar = fh.read()
        try:
            constraint = from_keywords(json_schema=json_schema, grammar=grammar, regex=regex)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        return f(*args, constraint=constraint, **kwargs)

    for opt in reversed([
        click.option("--json-schema", default=None, metavar="FILE_OR_JSON",
                     help="Answer with JSON that follows this JSON schema (a file, or the schema itself); "
                          "written on one line (docs/structured.md)."),
        click.option("--grammar", default=None, metavar="FILE",
                     help="Answer in the language of this grammar file (llguidance Lark, or llama.cpp GBNF)."),
        click.option("--regex", default=None, help="Answer with text that matches this regular expression."),
    ]):
        command = opt(command)
    return command


def max_tokens_option(default: Optional[int] = MAX_TOKENS, minimum: int = 0,
                      help: str = "Maximum number of tokens to generate."):
    return click.option("--max-tokens", "-n", default=default, show_default=default is not None,
                        type=click.IntRange(min=minimum), help=help)


def threads_option(f):
    return click.option("--threads", default=None, type=click.IntRange(min=1),
                        help="CPU threads [default: physical cores].")(f)


def n_ctx_option(default: Optional[int] = N_CTX, help: str = "Context window in tokens (prompt + generation)."):
    return click.option("--n-ctx", default=default, show_default=default is not None,
                        type=click.IntRange(min=N_CTX_MIN), help=help)


class FloatList(click.ParamType):
    """Comma-separated non-negative numbers, e.g. ``3,1`` (--tensor-split)."""

    name = "SHARES"

    def __repr__(self) -> str:
        return "FloatList()"

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return tuple(value)
        try:
            values = tuple(float(x) for x in str(value).split(",") if x.strip())
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of numbers, e.g. 3,1", param, ctx)
        if not values or min(values) < 0 or sum(values) <= 0:
            self.fail(f"{value!r}: give shares >= 0, not all 0", param, ctx)
        return values


def device_options(f):
    """Where the models run, on every command that loads one (or starts a
    `pyspec serve` that does): --n-gpu-layers, --flash-attn, --strict, and the
    RPC workers (--rpc, --tensor-split, --draft-rpc; docs/distributed.md).
    Handed to the command as one ``device``, a dict that :func:`load_model` and
    :func:`load_pair` take as keywords (``**device``): ``{"n_gpu_layers",
    "flash_attn", "strict", "rpc", "tensor_split", "local_output", "draft_rpc"}``."""
    @functools.wraps(f)
    def command(*args, n_gpu_layers, flash_attn, strict, rpc, tensor_split, local_output, draft_rpc, **kwargs):
        from ..model import rpc_endpoints

        device = dict(n_gpu_layers=n_gpu_layers, flash_attn=flash_attn, strict=strict, rpc=rpc_endpoints(rpc),
                      tensor_split=tensor_split, local_output=local_output, draft_rpc=rpc_endpoints(draft_rpc))
        return f(*args, device=device, **kwargs)

    for opt in reversed([
        click.option("--n-gpu-layers", default=0, show_default=True, type=int,
                     help="Layers to offload on Metal/CUDA builds of llama.cpp (-1 = all); on a build without a GPU "
                          "backend this warns (see `pyspec info`), and --strict makes it an error. With --rpc: "
                          "layers on the workers (all by default)."),
        click.option("--flash-attn", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
                     help="Flash attention: auto lets llama.cpp enable it where the device supports it (on for the "
                          "CPU); on/off force it. Logits differ slightly between on and off."),
        click.option("--strict", is_flag=True,
                     help="Fail instead of warning when --n-gpu-layers asks for GPU offload on a build that has no "
                          "GPU backend."),
        click.option("--rpc", default=None, metavar="HOST:PORT[,...]",
                     help="Put the target's layers on these RPC workers (`pyspec rpc-server` or llama.cpp's "
                          "rpc-server on each machine), split as llama.cpp splits them; the draft stays here. "
                          "See docs/distributed.md."),
        click.option("--tensor-split", default=None, type=FloatList(),
                     help="With --rpc: the share of the layers per worker (then per local GPU), e.g. 3,1 for a "
                          "machine three times the other's memory [default: by free memory]."),
        click.option("--rpc-local-output", "local_output", is_flag=True,
                     help="With --rpc: keep the target's output layer here, so that the workers send back hidden "
                          "states (6 KB a row for the default target) instead of the vocabulary's logits (600 KB): "
                          "for networks slower than loopback."),
        click.option("--draft-rpc", default=None, metavar="HOST:PORT[,...]",
                     help="Put the draft model's layers on RPC workers too [default: the draft runs here]."),
    ]):
        command = opt(command)
    return command


def model_options(f):
    """--n-ctx, --threads and :func:`device_options` (generate)."""
    for opt in reversed([n_ctx_option(), threads_option, device_options]):
        f = opt(f)
    return f


def check_device(device: dict) -> None:
    """What loading a model with ``device`` would say about GPU offload, said now:
    for the commands that leave the loading to `pyspec serve` processes they start
    (under command_errors, --strict on a build without a GPU backend is then a
    one-line error, not a server that dies at startup)."""
    from ..model import check_gpu_offload

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if not device.get("rpc"):  # with workers the layers go to them, not to a local GPU
            check_gpu_offload(device["n_gpu_layers"], device["strict"])
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)


chat_template_option = click.option(
    "--chat-template", "chat_template", default=None, type=click.Path(exists=True, dir_okay=False),
    help="A Jinja chat template file to use instead of the model's own (as llama-server's "
         "--chat-template-file); by default chats are rendered with the GGUF's tokenizer.chat_template.")


def model_device(device: dict, *, role: str = "target") -> dict:
    """A command's ``device`` as :class:`pyspec.Model` keywords for the
    ``role`` ("target" or "draft") model: the draft gets --draft-rpc (and no
    --tensor-split or --rpc-local-output), the target --rpc."""
    kwargs = {k: v for k, v in device.items() if k != "draft_rpc"}
    if role == "draft":
        kwargs["rpc"], kwargs["tensor_split"], kwargs["local_output"] = device.get("draft_rpc", ()), None, False
    return kwargs


def load_model(name, *, role: str = "target", **kwargs):
    """pyspec.Model, with its warnings (GPU layers on a CPU-only build) as one
    line on stderr. ``kwargs`` may hold a command's whole ``device``: the
    ``role`` model takes its part (:func:`model_device`)."""
    from ..model import Model

    if "draft_rpc" in kwargs or role == "draft":
        kwargs = model_device(kwargs, role=role)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = Model(name, **kwargs)
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    return model


def _path(file):
    from pathlib import Path

    return Path(file) if file is not None else None


def needs_draft_model(drafter) -> bool:
    """Whether ``drafter`` (a name; None: the default, hybrid) drafts with a draft
    model, as the core's drafter catalog says."""
    from ..speculative import DRAFTERS

    return drafter is None or DRAFTERS[drafter]["needs_draft_model"]


def load_pair(model, draft, *, no_draft: bool = False, drafter=None, policy: str = "auto", draft_max=None,
              default_draft: bool = True, chat_template=None, **load):
    """The commands' one way to load what generates: ``(target, generator)``.

    With ``no_draft`` the target alone decodes plainly. Otherwise a
    SpeculativeDecoder with ``drafter``; its draft model (``draft``, or the
    default pair's when neither model is named and ``default_draft``) is loaded
    only if the drafter needs one. ``load``: Model settings for both models;
    ``chat_template`` (a file) the target's chat template."""
    from ..speculative import SpeculativeDecoder

    wants_model = needs_draft_model(drafter)
    if draft is None and model is None and not no_draft and wants_model and default_draft:
        draft = DEFAULT_DRAFT
    target = load_model(model or DEFAULT_MODEL, chat_template=_path(chat_template), **load)
    if no_draft:
        return target, target
    draft_model = load_model(draft, role="draft", **load) if draft and wants_model else None
    return target, SpeculativeDecoder(target, draft_model, drafter=drafter, policy=policy, draft_max=draft_max)
