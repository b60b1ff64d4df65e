"""`pyspec bench multiturn`: multi-turn editing conversations, speculative
(suffix drafter, memory) against plain decoding, in one process; and the
multi-turn mode of `pyspec bench serve` (through pyspec's and llama.cpp's
servers)."""

from __future__ import annotations

from typing import Optional, Sequence

import click

from ..bench.conversations import CONVERSATIONS
from ..memory import DEFAULT_CAP_MB
from ..settings import N_CTX_SERVER
from ..sampling import Sampling
from .options import (DEFAULT_MODEL, check_device, command_errors, device_options, labelled_progress, load_model,
                      max_tokens_option, n_ctx_option, report_options, threads_option, write_report)


@click.command("multiturn")
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Target model (path or default name).")
@click.option("--conversations", "n_conversations", default=None, type=click.IntRange(1, len(CONVERSATIONS)),
              help="Run only the first N conversations [default: all 6].")
@max_tokens_option(512, minimum=2,
                   help="Most tokens per answer (greedy); an answer cut short is still the next turn's history.")
@threads_option
@n_ctx_option(N_CTX_SERVER, help="Context window: a conversation's last prompt and answer must fit in it.")
@device_options
@click.option("--memory-mb", default=DEFAULT_CAP_MB, show_default=True, type=click.FloatRange(min=0.0625),
              help="Byte cap of the default side's memory (a fresh one per conversation).")
@click.option("--memory-off/--no-memory-off", "with_memory_off", default=True,
              help="Also run the default decoder with memory=False, a third side: what memory adds "
                   "[default: --memory-off].")
@click.option("--raw", is_flag=True,
              help="Send the conversations as a plain 'User: / Assistant:' transcript (models without a chat "
                   "template).")
@report_options("every turn's figures and the summary", "each comparison's ratio per turn with its interval")
def bench_multiturn(model, n_conversations, max_tokens, threads, n_ctx, device, memory_mb, with_memory_off,
                    raw, json_path, plot_path) -> None:
    """Multi-turn conversations: the default decoder against plain decoding.

    Runs conversations that ask for a file back with one change per turn
    (rename, add a parameter, fix a bug, reformat, translate comments), and
    repeated tasks (the same instruction on similar files, each request alone),
    turn by turn in one process. At every turn the sides generate greedily from
    the same prompt, back to back in rotating order: plain (the target's own
    generate), default (SpeculativeDecoder: suffix drafter, auto policy, a
    memory of the conversation's earlier requests) and, unless
    --no-memory-off, the default decoder without memory. Every side's next
    prompt holds the default side's answers; the answers must be equal
    (lossless), and any that differ are listed.

    Prints decode-speed ratios (tokens after the first) per turn and, as the
    headline, the geometric mean over conversations of turns 2 onwards with a
    95 % bootstrap interval; then each side's pooled acceptance and the share
    of accepted drafts that came from memory. Progress goes to stderr;
    pyspec/bench/inprocess/multiturn.py states the method.
    """
    from .._platform import physical_cores
    from ..bench.inprocess import multiturn as mt
    from ..bench.conversations import conversations
    from ..bench.inprocess.runner import progress_bar
    from ..errors import PyspecError

    n_threads = threads or physical_cores()
    with command_errors(errors=(PyspecError, ValueError, OSError, RuntimeError)):
        if plot_path:  # fail before a long run, not after it
            from ..bench.plot import pyplot

            pyplot()
        convs = conversations(n_conversations)
        # memory_mb=0: the plain side's answers must not reach the default side's drafts (multiturn.py).
        target = load_model(model, n_ctx=n_ctx, n_threads=n_threads, memory_mb=0, **device)
        sides = mt.make_sides(target, memory_mb=memory_mb, memory_off=with_memory_off)
        names = [n for n, _ in sides]
        warm = mt.prompt_tokens(target, convs[0].messages(0, []), raw)
        for _, gen in sides:  # page in weights, calibrate the auto policy: the first run of a process is slow
            gen.generate(warm, max_tokens=8, sampling=Sampling.GREEDY, seed=0)
        bar = progress_bar(sum(len(c.turns) for c in convs) * len(sides), True)
        records = mt.run_multiturn(target, sides, convs, max_tokens=max_tokens, raw=raw, progress=bar)
        bar(None)
    summary = mt.summarize(records, names)
    mt.add_turn_ratios(records, list(summary))
    totals = mt.side_totals(records, names)
    result = {
        "model": target.path, "threads": n_threads, "flash_attn": target.flash_attn,
        "n_gpu_layers": device["n_gpu_layers"], "n_ctx": n_ctx,
        "max_tokens": max_tokens, "sampling": Sampling.GREEDY.to_dict(), "raw": raw, "memory_mb": memory_mb, "sides": names,
        "conversations": [c.id for c in convs], "summary": summary, "sides_turns_2plus": totals,
        "turns": records,
    }
    result["table"] = mt.format_report(summary, totals, records)
    write_report(result, json_path, plot_path, mt.plot,
            f"{target.path} ({n_threads} threads, flash attention {target.flash_attn}), greedy, "
            f"at most {max_tokens} tokens per answer\n" + result["table"])


def bench_serve_multiturn(model: str, *, n_conversations: Optional[int], max_tokens: int, reps: int, threads: int,
                          n_ctx: Optional[int], llama_server: Optional[str], llama_specs: Sequence[str],
                          llama_args: str, memory_off: bool, raw: bool, json_path, plot_path,
                          device: dict) -> None:
    """`pyspec bench serve --multiturn`: pyspec/bench/serve/multiturn.py states the method.
    ``device``: bench serve's --n-gpu-layers, --flash-attn and --strict, for every server."""
    import shlex

    from ..bench.serve import multiturn as sm
    from ..bench.serve.process import token_counter
    from ..bench.conversations import conversations
    from ..errors import PyspecError
    from ..model import resolve_path

    if llama_server is None and not memory_off:
        raise click.UsageError("--multiturn compares pyspec serve with llama.cpp's server (--llama-server PATH) "
                               "and/or with itself without memory (--memory-off)")
    with command_errors(errors=(PyspecError, ValueError, OSError, RuntimeError)):
        if plot_path:  # fail before a long run, not after it
            from ..bench.plot import pyplot

            pyplot()
        check_device(device)
        convs = conversations(4 if n_conversations is None else n_conversations)
        ctx = n_ctx or sm.CTX_PER_CONVERSATION * len(convs)
        path = resolve_path(model)
        backends = sm.backends(path, parallel=len(convs), n_ctx=ctx, threads=threads, llama_server=llama_server,
                               llama_specs=llama_specs, llama_args=shlex.split(llama_args or ""),
                               memory_off=memory_off, device=device)
        count = token_counter(path)
        with labelled_progress(reps * len(backends), "bench serve --multiturn") as (bar, progress):
            runs = sm.run(backends, convs, max_tokens=max_tokens, reps=reps, count=count, raw=raw,
                          progress=progress, done=lambda: bar.update(1))
    summary = sm.summarize(runs, [b.name for b in backends])
    result = {"mode": "multiturn", "model": path, "threads": threads, "n_gpu_layers": device["n_gpu_layers"],
              "flash_attn_requested": device["flash_attn"], "n_ctx": ctx, "parallel": len(convs),
              "max_tokens": max_tokens, "reps": reps, "raw": raw, "conversations": [c.id for c in convs],
              "backends": [{"name": b.name, "command": b.command} for b in backends], "summary": summary,
              "runs": runs}
    result["table"] = sm.format_report(summary, runs)
    write_report(result, json_path, plot_path, sm.plot,
            f"{path}, {threads} threads, {len(convs)} concurrent conversations and slots, context {ctx}, "
            f"at most {max_tokens} greedy tokens per answer\n" + result["table"])
