"""`pyspec bench serve`: pyspec's server against llama-cpp-python's or
llama.cpp's, under concurrent clients (pyspec/bench/serve/concurrent.py and
serve/llama_server.py state the methods; --multiturn is bench_multiturn.py's)."""

from __future__ import annotations

import json

import click

from ..bench.conversations import CONVERSATIONS
from ..settings import N_CTX_BENCH, N_CTX_SERVER
from .options import (DEFAULT_DRAFT, DEFAULT_MODEL, IntList, check_device, command_errors, device_options,
                      labelled_progress, load_model, max_tokens_option, n_ctx_option, report_options, threads_option,
                      write_report)


@click.command("serve")
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Target model (path or default name).")
@click.option("--draft", "-d", default=DEFAULT_DRAFT, show_default=True,
              help="pyspec's draft model; '' for lookup drafting only (without --llama-server: n-gram, since "
                   "llama-cpp-python's server has no draft model; with it: pyspec serve's own default, suffix).")
@click.option("--clients", "counts", default=None, type=IntList(1),
              help="Comma-separated numbers of clients [default: 1,2,4,8; --llama-server: 1,4,8,16].")
@max_tokens_option(None, minimum=2,
                   help="Tokens per answer (greedy) [default: 64; --llama-server: 128; --multiturn: at most 512].")
@click.option("--reps", default=2, show_default=True, type=click.IntRange(min=1), help="Repetitions.")
@threads_option
@device_options
@n_ctx_option(None, help="Context of each server (pyspec's is shared by its slots; llama-server splits -c among "
                        "its slots) [default: 8192; --llama-server: what the longest prompt and answer need per slot, "
                        "times the slots; --multiturn: 4096 per conversation].")
@click.option("--generate/--no-generate", "with_generate", default=True, show_default=True,
              help="At 1 client, also run the prompts through `pyspec generate`'s code in this process "
                   "(not with --llama-server or --multiturn).")
@click.option("--raw", is_flag=True, help="Send the prompts as raw text (no chat template).")
@click.option("--multiturn", is_flag=True,
              help="Multi-turn mode: --conversations editing conversations at once (bench multiturn's), each by "
                   "its own client and `user`, against --llama-server and/or --memory-off; --clients, --draft "
                   "and --generate do not apply (pyspec serve runs its defaults: suffix drafter, memory).")
@click.option("--conversations", "n_conversations", default=None, type=click.IntRange(1, len(CONVERSATIONS)),
              help="--multiturn: concurrent conversations, and slots of every server [default: 4].")
@click.option("--llama-server", "llama_server", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Compare with llama.cpp's llama-server binary (instead of llama-cpp-python's server), run on "
                   "the same model, threads, slots and cells (docs/server.md says how to build it).")
@click.option("--llama-spec", "llama_specs", default=None,
              help="With --llama-server: its variants, comma-separated --spec-type values ('none': plain; "
                   "'draft-simple': llama-server with -md and pyspec's --draft model) "
                   "[default: none,ngram-mod; --multiturn: none,ngram-mod,ngram-simple].")
@click.option("--llama-args", default="", help="With --llama-server: extra llama-server arguments, e.g. '-kvu'.")
@click.option("--cached-same-user", is_flag=True,
              help="With --llama-server: the cached wave sends the first wave's `user` again, so that pyspec's "
                   "memory holds the answers it gave [default: a new user: the cached wave measures the prefix "
                   "cache].")
@click.option("--local-user", is_flag=True,
              help="With --llama-server: no request sends a `user` (one local user, as editors and agents run): "
                   "the cached wave is that user resending, and pyspec's one shared memory drafts from the first "
                   "wave's answers.")
@click.option("--memory-off", is_flag=True, help="--multiturn: also run `pyspec serve --no-memory`.")
@click.option("--turns", default=None, type=click.IntRange(min=2),
              help="Conversations-in-turn mode: --conversations chats (default 2), each with a long system prompt "
                   "of its own (--system-tokens), sent one request at a time in turn for this many rounds, each "
                   "request the whole conversation so far, with no `user`: the TTFT of every turn, against "
                   "--llama-server if given (pyspec/bench/serve/turns.py).")
@click.option("--resend", is_flag=True,
              help="--turns: every round sends each conversation's first request again (A, B, A, B, ...) instead "
                   "of continuing it.")
@click.option("--system-tokens", default=2000, show_default=True, type=click.IntRange(min=64),
              help="--turns: tokens of each conversation's system prompt.")
@click.option("--slots", default=4, show_default=True, type=click.IntRange(min=1),
              help="--turns: slots of every server (--parallel, llama-server's -np).")
@report_options("every wave's figures (--llama-server: and answers)", "aggregate tok/s and TTFT against the number of "
                "clients (--multiturn: the ratios with their intervals, and every run's aggregate tok/s)")
@click.pass_context
def bench_serve(ctx, model, draft, counts, max_tokens, reps, threads, device, n_ctx, with_generate, raw, multiturn,
                n_conversations, llama_server, llama_specs, llama_args, cached_same_user, local_user, memory_off,
                turns, resend, system_tokens, slots, json_path, plot_path) -> None:
    """pyspec's server against llama.cpp's or llama-cpp-python's, under concurrent clients.

    With --llama-server PATH: `pyspec serve` (with the draft model), `pyspec
    serve --no-draft` and llama.cpp's llama-server, plainly and with each
    --llama-spec (default ngram-mod), on the same model, threads and slots (the
    most clients). For each number of clients (1, 4, 8, 16) and repetition,
    each backend on a fresh server: a first wave of that many clients at
    once, each streaming one greedy chat answer to a different prompt of the
    suite (tagged: new to the server), then a cached wave of exactly the same
    messages (the prompts in the prefix caches). Prints per backend the
    aggregate tok/s and slowest TTFT of each wave, the paired ratios pyspec /
    llama-server with 95 % intervals over repetitions, and how many answers
    are identical to llama-server's (and pyspec's to pyspec --no-draft's).
    pyspec/bench/serve/llama_server.py states the method.

    Without it: `pyspec serve` and `python -m llama_cpp.server` (needs the
    `bench` extra) on the same model and threads; for each number of clients,
    all clients stream one greedy completion of a different prompt of the
    suite (chat-templated) at once, alternating the servers, over --reps
    repetitions. Prints aggregate tokens/s with its ratio to
    llama-cpp-python, TTFT p50/p95 and per-request continuation speed.

    With --multiturn: multi-turn conversations (4 at once, each its own
    `user`) through /v1/chat/completions of `pyspec serve` and of llama.cpp's
    llama-server (--llama-server PATH; plain and with each --llama-spec),
    backends alternating run by run, each run on a fresh server, every backend
    sent the same prompts.
    Prints each backend's aggregate tok/s, TTFT and drafts, and the ratio
    pyspec serve / each other backend with a 95 % interval over repetitions
    (pyspec/bench/serve/multiturn.py states the method).

    Every server runs --n-gpu-layers and --flash-attn as `pyspec serve` does
    (llama-server: -ngl, -fa; llama-cpp-python's server: --n_gpu_layers, and
    the flash attention pyspec's context runs); --strict goes to `pyspec serve`.

    Progress goes to stderr.
    """
    from click.core import ParameterSource

    from .._platform import physical_cores

    given = [n for n in ctx.params if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE]
    flags = {"counts": "--clients", "with_generate": "--generate", "n_conversations": "--conversations",
             "llama_specs": "--llama-spec"}

    def refuse(names, where: str) -> None:
        ignored = [flags.get(n, f"--{n.replace('_', '-')}") for n in names if n in given]
        if ignored:
            verb = "do not apply" if len(ignored) > 1 else "does not apply"
            raise click.UsageError(f"{', '.join(ignored)} {verb} {where}")

    if multiturn:
        refuse(("counts", "draft", "with_generate", "cached_same_user", "local_user"), "to --multiturn")
    elif not turns:
        refuse(("n_conversations", "memory_off"), "without --multiturn or --turns")
    if llama_server is None:
        refuse(("llama_specs", "llama_args", "cached_same_user", "local_user"), "without --llama-server")
    elif not multiturn:
        refuse(("with_generate",), "with --llama-server")
    specs = [x.strip() for x in (llama_specs or "").split(",") if x.strip()]
    if llama_specs is not None and not specs:
        raise click.BadParameter("give at least one --spec-type value, e.g. none", param_hint="--llama-spec")
    if turns:
        refuse(("counts", "with_generate", "cached_same_user", "local_user", "multiturn", "memory_off", "raw"),
               "to --turns")
        return _bench_serve_turns(model, draft, turns, n_conversations or 2, resend=resend,
                                  system_tokens=system_tokens, slots=slots, max_tokens=max_tokens or 32, reps=reps,
                                  threads=threads or physical_cores(), n_ctx=n_ctx, llama_server=llama_server,
                                  llama_specs=specs or ["none"], llama_args=llama_args, json_path=json_path,
                                  plot_path=plot_path, device=device)
    refuse(("system_tokens", "slots", "resend"), "without --turns")
    if multiturn:
        from .bench_multiturn import bench_serve_multiturn

        return bench_serve_multiturn(model, n_conversations=n_conversations, max_tokens=max_tokens or 512, reps=reps,
                                     threads=threads or physical_cores(), n_ctx=n_ctx, llama_server=llama_server,
                                     llama_specs=specs or ["none", "ngram-mod", "ngram-simple"],
                                     llama_args=llama_args, memory_off=memory_off, raw=raw, json_path=json_path,
                                     plot_path=plot_path, device=device)
    if llama_server:
        return _bench_serve_llama(model, draft, counts or [1, 4, 8, 16], max_tokens=max_tokens or 128, reps=reps,
                                  threads=threads or physical_cores(), n_ctx=n_ctx, raw=raw,
                                  llama_server=llama_server, llama_specs=specs or ["none", "ngram-mod"],
                                  llama_args=llama_args, same_user=cached_same_user, local_user=local_user,
                                  json_path=json_path, plot_path=plot_path, device=device)
    counts = counts or [1, 2, 4, 8]
    n_ctx, max_tokens = n_ctx or N_CTX_SERVER, max_tokens or 64
    from ..bench.serve import concurrent as bs
    from ..bench.serve.process import token_counter
    from ..bench.suite import prompts as suite_prompts
    from ..speculative import SpeculativeDecoder

    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as e:
        raise click.ClickException(f"llama-cpp-python's server is not installed: pip install "
                                   f"'pyspec-llama[bench]' ({e})") from e
    from .. import cpu

    if cpu.excluded_buffer_types():  # its Llama cannot be told to leave a buffer type out
        raise click.ClickException(
            f"skipped: llama-cpp-python's server would put weights in the {cpu.verdict().buffer_type} buffer type, "
            f"which is unusable on this CPU ({cpu.verdict().reason}); compare against llama-server instead "
            f"(--llama-server PATH), which pyspec starts with --no-repack here")
    n_threads = threads or physical_cores()
    with command_errors():
        load = dict(n_ctx=N_CTX_BENCH, n_threads=n_threads, **device)
        target = load_model(model, **load)
        decoder = None
        if with_generate and 1 in counts:
            decoder = SpeculativeDecoder(target, load_model(draft, role="draft", **load) if draft else None)
        texts = [p.text for p in suite_prompts(per_category=1)]

        def render(text: str) -> str:
            return text if raw else target.apply_chat_template([{"role": "user", "content": text}])

        count = token_counter(target.path)
        with labelled_progress(reps * len(counts), "bench serve") as (bar, progress):
            rows = bs.run(target.path, draft, texts, counts, max_tokens=max_tokens, reps=reps, n_ctx=n_ctx,
                          threads=n_threads, decoder=decoder, count=count, render=render,
                          progress=progress, device=device, flash_attn=target.flash_attn == "on")
            bar.update(reps * len(counts))
    result = {"model": target.path, "draft": draft, "threads": n_threads, "flash_attn": target.flash_attn,
              "n_gpu_layers": device["n_gpu_layers"], "max_tokens": max_tokens, "rows": rows,
              "table": bs.summarize(rows)}
    if json_path:
        with click.open_file(json_path, "w") as f:
            json.dump(result, f, indent=2)
    if plot_path:
        bs.plot(rows, plot_path)
    if json_path != "-":
        click.echo(f"{target.path} (draft {draft or 'none: n-gram lookup'}), {n_threads} threads, "
                   f"flash attention {target.flash_attn}, --n-gpu-layers {device['n_gpu_layers']}, "
                   f"{max_tokens} greedy tokens per request")
        click.echo(result["table"])


#: How bench serve --llama-server counts tokens (the same rule for every backend).
COUNTING = ("every answer tokenized with the model's own vocabulary (llama-cpp-python's tokenizer); "
            "the servers' usage.completion_tokens kept as reported_tokens")


def _bench_serve_llama(model, draft, counts, *, max_tokens, reps, threads, n_ctx, raw, llama_server, llama_specs,
                       llama_args, same_user, local_user, json_path, plot_path, device) -> None:
    """`pyspec bench serve --llama-server PATH`: pyspec/bench/serve/llama_server.py states the method."""
    import shlex

    from ..bench.serve import llama_server as bs
    from ..bench.serve.process import token_counter
    from ..bench.suite import prompts as suite_prompts
    from ..errors import PyspecError
    from ..model import resolve_path

    with command_errors(errors=(PyspecError, ValueError, OSError, RuntimeError)):
        if plot_path:  # fail before a long run, not after it
            from ..bench.plot import pyplot

            pyplot()
        check_device(device)
        path = resolve_path(model)
        draft_path = resolve_path(draft) if draft else ""
        count = token_counter(path)
        texts = [p.text for p in suite_prompts()]
        per_slot = bs.slot_ctx(max(count(t) for t in texts), max_tokens)
        parallel = max(counts)
        ctx = n_ctx or per_slot * parallel
        backends = bs.comparison_backends(path, draft_path, parallel=parallel, n_ctx=ctx, threads=threads,
                                          llama_server=llama_server, llama_specs=llama_specs,
                                          llama_args=shlex.split(llama_args or ""), device=device)
        with labelled_progress(reps * len(counts) * len(backends), "bench serve --llama-server") as (bar, progress):
            waves = bs.run_comparison(backends, texts, counts, max_tokens=max_tokens, reps=reps, count=count, raw=raw,
                                      same_user=same_user, local_user=local_user, progress=progress,
                                      done=lambda: bar.update(1))
        # Where answers part, the target's own probabilities of the two tokens (a lone pass).
        explain = bs.tie_explainer(path, **device) if not raw else None
        summary = bs.summarize_comparison(waves, count=count, explain=explain)
    result = {"mode": "llama-server", "model": path, "draft": draft_path or None, "threads": threads,
              "n_gpu_layers": device["n_gpu_layers"], "flash_attn_requested": device["flash_attn"],
              "parallel": parallel, "n_ctx": ctx, "n_ctx_per_slot": ctx // parallel, "clients": list(counts),
              "max_tokens": max_tokens, "reps": reps, "raw": raw, "cached_same_user": same_user,
              "local_user": local_user,
              "counting": COUNTING, "backends": [{"name": b.name, "command": b.command} for b in backends],
              "summary": summary, "waves": waves}
    result["table"] = bs.format_comparison(summary)
    write_report(result, json_path, plot_path, bs.plot_comparison,
                 f"{path} (draft {draft_path or 'none: lookup drafting'}), {threads} threads, {parallel} slots, "
                 f"context {ctx} ({ctx // parallel} per slot), {max_tokens} greedy tokens per answer, "
                 f"{reps} repetition{'s' if reps != 1 else ''}\n" + result["table"])


def _bench_serve_turns(model, draft, turns, conversations, *, resend, system_tokens, slots, max_tokens, reps,
                       threads, n_ctx, llama_server, llama_specs, llama_args, json_path, plot_path, device) -> None:
    """`pyspec bench serve --turns N`: pyspec/bench/serve/turns.py states the method."""
    import shlex

    from ..bench.serve import llama_server as serve_llama, turns as bt
    from ..bench.serve.process import token_counter
    from ..errors import PyspecError
    from ..model import resolve_path

    with command_errors(errors=(PyspecError, ValueError, OSError, RuntimeError)):
        if plot_path:
            from ..bench.plot import pyplot

            pyplot()
        check_device(device)
        path = resolve_path(model)
        draft_path = resolve_path(draft) if draft else ""
        count = token_counter(path)
        systems = bt.system_prompts(conversations, system_tokens, count)
        longest = max(count(s) for s in systems) + turns * (max_tokens + 64)
        # Every server gets room for every conversation in full (llama-server splits -c among its slots).
        ctx = n_ctx or serve_llama.slot_ctx(longest, max_tokens) * max(slots, conversations)
        backends = serve_llama.comparison_backends(path, draft_path, parallel=slots, n_ctx=ctx, threads=threads,
                                                   llama_server=llama_server or "", llama_specs=llama_specs,
                                                   llama_args=shlex.split(llama_args or ""), device=device)
        if not llama_server:
            backends = backends[:2]
        with labelled_progress(reps * len(backends), "bench serve --turns") as (bar, progress):
            rows = bt.run_turns(backends, systems, turns, max_tokens=max_tokens, reps=reps, resend=resend,
                                progress=progress, done=lambda: bar.update(1))
        summary = bt.summarize_turns(rows)
    result = {"mode": "turns", "model": path, "draft": draft_path or None, "threads": threads,
              "n_gpu_layers": device["n_gpu_layers"], "flash_attn_requested": device["flash_attn"], "slots": slots,
              "n_ctx": ctx, "conversations": conversations, "turns": turns, "resend": resend,
              "system_tokens": system_tokens,
              "max_tokens": max_tokens, "reps": reps,
              "backends": [{"name": b.name, "command": b.command} for b in backends], "summary": summary,
              "rows": rows}
    result["table"] = bt.format_turns(summary, conversations, turns, system_tokens, resend)
    write_report(result, json_path, plot_path, bt.plot_turns,
                 f"{path} (draft {draft_path or 'none'}), {threads} threads, {slots} slots, context {ctx}, "
                 f"{max_tokens} greedy tokens per answer, {reps} repetition{'s' if reps != 1 else ''}\n"
                 + result["table"])
