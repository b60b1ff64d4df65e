"""`pyspec serve`: the OpenAI-compatible server (pyspec/server)."""

from __future__ import annotations

import os
import sys

import click

from ..memory import DEFAULT_CAP_MB
from ..model import Model
from ..speculative import DRAFTERS, POLICIES
from ..server.scheduler import DEFAULT_CACHE_RAM_MB, DEFAULT_CACHE_SLOTS
from ..server.supervisor import CHILD_PORT_ENV, supervise
from ..settings import MAX_SEQUENCES, N_CTX_SERVER, PARALLEL, PREFILL_CHUNK
from ..testing import TestControls
from .options import (DEFAULT_DRAFT, DEFAULT_MODEL, chat_template_option, command_errors, device_options, load_pair,
                      n_ctx_option, threads_option)


def _test_controls(ctx, param, value):
    """--test-controls JSON as the one TestControls value (TEST-ONLY)."""
    if value is None:
        return None
    try:
        return TestControls.from_json(value)
    except (ValueError, TypeError) as e:
        raise click.BadParameter(str(e)) from e


@click.command()
@click.option("--model", "-m", default=None,
              help=f"Target model: a .gguf path or a default model name [default: {DEFAULT_MODEL}].")
@click.option("--draft", "-d", default=None,
              help=f"Draft model (path or name). With neither --model nor --draft the default pair is served "
                   f"(draft: {DEFAULT_DRAFT}); with --model alone, suffix lookup drafts.")
@click.option("--no-draft", is_flag=True, help="Plain decoding with the target alone.")
@click.option("--drafter", type=click.Choice(list(DRAFTERS)), default=None,
              help="Drafter of every request that names none [default: hybrid with a draft model, else suffix].")
@click.option("--policy", type=click.Choice(list(POLICIES)), default="auto", show_default=True,
              help="Draft-length policy of requests that name none.")
@click.option("--draft-max", "-k", default=None, type=click.IntRange(min=0),
              help="Draft length cap of requests that give none [default: the policy's own].")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (the default admits this machine only).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option("--parallel", "-np", default=PARALLEL, show_default=True, type=click.IntRange(1, MAX_SEQUENCES),
              help="Sequences generated together (slots); more requests wait in the queue.")
@click.option("--cache-slots", default=DEFAULT_CACHE_SLOTS, show_default=True, type=click.IntRange(0, MAX_SEQUENCES - 1),
              help="The prompt cache's first tier: finished conversations kept in the context beside the --parallel "
                   "running ones "
                   "(they share its --n-ctx cells; the least recently used gives way). A request goes to the "
                   "slot that holds its conversation, so alternating chats prefill only their new tokens.")
@click.option("--cache-ram", default=DEFAULT_CACHE_RAM_MB, show_default=True, type=click.FloatRange(min=0),
              help="The prompt cache's second tier: MiB of host memory for conversations the context gives up "
                   "(both models' caches), put back when their conversation returns; the oldest go first. 0: none.")
@click.option("--cache-dir", "cache_dir", default=None, type=click.Path(file_okay=False),
              help="The prompt cache's third tier: a folder where the cached conversations (both models' caches) "
                   "are saved at shutdown and loaded at startup, so a restarted server answers them without a "
                   "prefill (within --cache-ram).")
@click.option("--prompt-cache", "old_cache_dir", default=None, type=click.Path(file_okay=False), hidden=True,
              help="The old name of --cache-dir.")
@click.option("--queue-size", default=None, type=click.IntRange(min=0),
              help="Requests that may wait for a slot; past it, 503 with Retry-After [default: 4 x --parallel].")
@n_ctx_option(N_CTX_SERVER, help="Context cells, shared by all slots (one unified cache); a prompt must fit in it.")
@click.option("--prefill-chunk", default=PREFILL_CHUNK, show_default=True, type=click.IntRange(min=0),
              help="Most prompt tokens a round prefills beside running sequences, and an editor's prompt per "
                   "decode even alone (0: no limit): bounds how long a new long prompt holds up the others, and "
                   "how long a superseded editor request holds the engine.")
@click.option("--api-key", default=None, envvar="PYSPEC_API_KEY", show_envvar=True,
              help="Require `Authorization: Bearer KEY` on the /v1 routes.")
@click.option("--model-alias", default=None, help="The model name clients use [default: the target's name].")
@click.option("--strict-model-name", is_flag=True,
              help="Answer 404 to a request naming another model (vLLM's rule). Without it a request naming "
                   "any model is answered by the loaded one, and the answer's `model` is its real name, as "
                   "llama-server does (local tools send their own default names).")
@threads_option
@device_options
@chat_template_option
@click.option("--embedding-model", default=None, type=click.Path(dir_okay=False),
              help="A GGUF that answers /v1/embeddings, /api/embed and /api/embeddings (mean pooling, unit "
                   "vectors) [default: the target, on a context of its own, made at the first request].")
@click.option("--memory/--no-memory", default=True, show_default=True,
              help="Keep each user's earlier prompts and answers for suffix drafting (per request field `user`; "
                   "requests without one share one memory). Off: a request drafts from its own text only.")
@click.option("--memory-mb", default=DEFAULT_CAP_MB, show_default=True, type=click.FloatRange(min=0.0625),
              help="Byte cap of each user's memory (least recently used text goes first).")
@click.option("--memory-users", default=8, show_default=True, type=click.IntRange(min=1),
              help="Users whose memories are kept (the least recently active is dropped first).")
@click.option("--test-controls", "test", default=None, hidden=True, callback=_test_controls,
              help="TEST-ONLY: a JSON object of pyspec.testing.TestControls fields: the lossless and prompt-cache "
                   "tests' negative controls (e.g. {\"variant\": \"residual_is_p\"}) and the PIT probe.")
def serve(model, draft, no_draft, drafter, policy, draft_max, host, port, parallel, cache_slots, cache_ram,
          cache_dir, old_cache_dir, queue_size, n_ctx, prefill_chunk, api_key, model_alias, strict_model_name, threads,
          device,
          chat_template, embedding_model, memory, memory_mb, memory_users, test) -> None:
    """Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models,
    /v1/embeddings), with /health and Prometheus /metrics; on the same port
    Anthropic's Messages, OpenAI's Responses, ollama's /api/* and llama-server's
    own routes (docs/connect.md).

    Requests are batched continuously: every round, one target decode verifies
    the drafts of every running request, and new requests join between rounds.
    Output keeps the target's distribution exactly (lossless speculation);
    `logprobs` are the target's. Extensions per request: top_k, min_p,
    draft_max, policy, drafter. Stop with Ctrl-C or SIGTERM: requests in flight
    end at the next round (their streams close properly) and the exit status
    is 0.

    With --rpc (or --draft-rpc) the model's layers live on RPC workers, and a
    lost worker would end the process: the server then runs as a child of a
    supervisor that keeps the port, answers with errors and /health while the
    worker is gone, and restarts the child when it is back (docs/distributed.md).
    """
    try:
        import uvicorn

        from ..server.app import create_app
    except ImportError as e:
        raise click.ClickException(f"the server needs its extra: pip install 'pyspec-llama[server]' ({e})") from e
    if old_cache_dir is not None:
        click.echo("pyspec: 'pyspec serve --prompt-cache' is now '--cache-dir' (the old name goes in a later release)",
                   err=True)
        cache_dir = cache_dir or old_cache_dir
    if cache_dir is not None and cache_ram <= 0:
        raise click.UsageError("--cache-dir needs host memory to load the folder into: --cache-ram > 0")
    name = model_alias or os.path.basename(model or DEFAULT_MODEL).removesuffix(".gguf")
    child_port = os.environ.get(CHILD_PORT_ENV)
    if (device["rpc"] or device["draft_rpc"]) and child_port is None:
        # ggml-rpc ends the process that loses a worker: this one supervises, a child serves.
        sys.exit(supervise(_serve_argv(), [*device["rpc"], *device["draft_rpc"]], host, port))
    if child_port is not None:
        host, port = "127.0.0.1", int(child_port)
    with command_errors():
        _, decoder = load_pair(model, draft, no_draft=no_draft, drafter=drafter, policy=policy, draft_max=draft_max,
                               n_ctx=n_ctx, n_threads=threads, n_seq_max=min(parallel + cache_slots, MAX_SEQUENCES),
                               chat_template=chat_template, **device)
        decoder.target.chat_template.check()  # a template that does not compile: say so now, not per request
        # Its own context is not used (the embedder makes one): the least it may have.
        embedder_model = Model(embedding_model, n_ctx=256, n_threads=threads) if embedding_model else None
    app = create_app(decoder, model_name=name, parallel=parallel,
                     queue_size=4 * parallel if queue_size is None else queue_size, api_key=api_key,
                     prefill_chunk=prefill_chunk, memory_mb=memory_mb if memory else 0, memory_users=memory_users,
                     cache_ram_mb=cache_ram, cache_dir=cache_dir, strict_model_name=strict_model_name,
                     embedding_model=embedder_model, _test=test)
    if test is not None and test.breaks_output:
        click.echo(f"pyspec serve: TEST-ONLY controls {test}: output is NOT the target's", err=True)
    click.echo(f"pyspec serve: {name} ({decoder!r}) on http://{host}:{port}/v1 with {parallel} slots, "
               f"{cache_slots} more conversations cached in the context and up to {cache_ram:g} MiB in host "
               f"memory (--cache-ram); Ctrl-C stops", err=True)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=10, lifespan="on")
    server = _Server(config, app)
    server.run()
    if not server.started:  # e.g. the port is taken (uvicorn logged why)
        sys.exit(1)


def _serve_argv() -> list:
    """This process's `serve ...` arguments, for the supervised child to repeat."""
    argv = sys.argv[1:]
    if "serve" not in argv:
        raise click.ClickException("pyspec serve --rpc runs its server as a child process: start it as "
                                   "`pyspec serve ...` (or `python -m pyspec.cli serve ...`)")
    return argv[argv.index("serve"):]


def _Server(config, app):
    import uvicorn

    class Server(uvicorn.Server):
        """On SIGINT/SIGTERM: running requests are cancelled at the next round, so
        their streams end properly before uvicorn closes the connections. And exit 0:
        uvicorn re-raises the signal after its graceful shutdown, which would report a
        clean stop as death by signal."""

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            getattr(self, "_captured_signals", []).clear()
            app.state.shutdown()

    return Server(config)


def register(main: click.Group) -> None:
    main.add_command(serve)
