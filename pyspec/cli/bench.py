"""`pyspec bench paired` (decode speed side by side with llama-cpp-python;
--paired: configurations against each other), `bench parallel` and
`bench simulate`; the server's benchmarks are in bench_serve.py,
bench_multiturn.py and bench_soak.py, the `pyspec bench` group in
bench_group.py."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import click

from ..settings import MAX_DRAFT, N_CTX_BENCH
from ..sampling import Sampling
from ..speculative import POLICIES
from .options import (DEFAULT_DRAFT, DEFAULT_MODEL, IntList, command_errors, device_options, load_model,
                      labelled_progress, max_tokens_option, n_ctx_option, report_options, sampling_options,
                      suite_options, threads_option, write_report)


@click.command("paired")
@suite_options
@max_tokens_option(128, minimum=2)
@sampling_options(Sampling.GREEDY, seed=False, penalties=False)
@click.option("--reps", default=1, show_default=True, type=click.IntRange(min=1), help="Repetitions of the suite.")
@threads_option
@n_ctx_option(N_CTX_BENCH)
@device_options
@click.option("--draft", "-d", default=DEFAULT_DRAFT, show_default=True, help="Draft model (path or name).")
@click.option("--draft-max", "-k", "k_values", default="1,2,4", show_default=True, type=IntList(0, unique=False),
              help="Comma-separated draft lengths to measure (one pyspec runner each).")
@click.option("--policy", "policies", default="fixed,auto", show_default=True,
              help="Comma-separated length policies to measure with the draft model "
                   "(fixed runs each --draft-max; the others run up to --cap); '' for none.")
@click.option("--ngram", "ngram_policies", default="auto", show_default=True,
              help="Comma-separated policies to measure with the n-gram drafter (e.g. fixed,auto); '' for none.")
@click.option("--hybrid", "hybrid_policies", default="auto", show_default=True,
              help="Comma-separated policies to measure with the hybrid drafter; '' for none.")
@click.option("--cap", default=None, type=click.IntRange(min=1),
              help="Longest draft of the adaptive policies, and the n-gram/hybrid fixed length "
                   "[default: 16; svip 40, its paper's cap].")
@click.option("--lookup", default=10, show_default=True, type=click.IntRange(min=0),
              help="Tokens per draft for llama-cpp-python's LlamaPromptLookupDecoding (0 = skip that runner).")
@click.option("--paired", default=None, metavar="A,B[,C...]",
              help="Paired mode: run only these configurations, alternately (ABBA) on every prompt, and report "
                   "each one's speed ratio to every earlier one (B / A, C / A, C / B) as a geometric mean over "
                   "prompts with a 95 % bootstrap interval, per category and for ordinary / copy-heavy / all "
                   "prompts. A configuration "
                   "is plain, default (hybrid + auto with the draft model), DRAFTER[:POLICY[:K]] (e.g. "
                   "ngram, model:fixed:4), or llama-cpp-python / pyspec.Llama: the same create_completion calls "
                   "on llama_cpp.Llama and on pyspec's drop-in (its default drafting). The runner options (-k, "
                   "--policy, --ngram, --hybrid, --cap, --lookup) do not apply. Use --reps >= 4.")
@click.option("--repeat-penalty", default=1.0, show_default=True, type=float,
              help="Every runner's repetition penalty, as llama-cpp-python applies it (its last 64 generated "
                   "tokens; 1 = off, its default).")
@click.option("--memory-from", "memory_from", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="--paired: text files that fill a fixed memory the lookup drafters may copy from (repeatable); "
                   "the bench's own answers never join it. Without it they have no memory, so repetitions of a "
                   "prompt stay independent.")
@click.option("--raw", is_flag=True, help="Use the prompts as raw text (no chat template: models without one).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Seed of the first repetition (repetition r uses seed + r); matters for -t > 0.")
@report_options("every figure and sample", "ratios per category and runner, and acceptance by draft position "
                "(--paired: each category's ratio with its interval, and every prompt's)")
@click.pass_context
def bench(ctx, model, categories, per_category, max_tokens, sampling, reps, threads, n_ctx, device, draft,
          k_values, policies, ngram_policies, hybrid_policies, cap, lookup, paired, repeat_penalty, memory_from, raw,
          seed, json_path, plot_path) -> None:
    """Measure decode speed side by side with llama-cpp-python.

    Runs the shipped prompt suite (chat template applied) through each runner,
    interleaved in one process with the same prompts, threads and settings:
    pyspec plain, pyspec speculative at each --draft-max, llama-cpp-python's
    create_completion and its prompt-lookup decoding; optionally other length
    policies and the n-gram / hybrid drafters. Prints, per category and
    overall: decode tok/s (tokens after the first), the ratio to
    llama-cpp-python plain and to pyspec plain, acceptance, tokens per target
    pass (L), mean draft length (d) and rounds where the policy chose plain
    decoding. Progress goes to stderr; --json and --plot save the figures.

    Both sides run the same flash-attention setting: --flash-attn auto takes
    what llama.cpp chose for pyspec's target and gives llama-cpp-python
    (whose own default is off) the same; and the same --n-gpu-layers.
    """
    from .._platform import physical_cores
    from ..bench.inprocess.runner import run_bench
    from ..bench.inprocess.backends import LlamaCppRunner, PyspecRunner, Settings
    from ..speculative import SpeculativeDecoder

    n_threads = threads or physical_cores()
    if repeat_penalty != 1.0:
        sampling = sampling.replace(repeat_penalty=repeat_penalty, penalty_last_n=64, penalize_prompt=False)
    if paired is not None:
        from click.core import ParameterSource

        ignored = [f"--{n.replace('_', '-')}" for n in ("k_values", "policies", "ngram_policies", "hybrid_policies",
                                                         "cap", "lookup")
                   if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE]
        if ignored:
            raise click.UsageError(f"--paired runs its own configurations; {', '.join(ignored)} would be ignored")
        return _bench_paired(model, draft, paired, categories, per_category, max_tokens, sampling, reps, seed,
                             n_threads, n_ctx, device, raw, json_path, plot_path, memory_from)
    if memory_from:
        raise click.UsageError("--memory-from applies to --paired")
    with command_errors():
        # No memory: a repeated prompt would otherwise copy its earlier answer.
        load = dict(n_ctx=n_ctx, n_threads=n_threads, memory_mb=0, **device)
        target = load_model(model, **load)
        # llama-cpp-python takes a bool: give it what pyspec's context runs; and the same offload.
        llama = dict(n_ctx=n_ctx, n_threads=n_threads, flash_attn=target.flash_attn == "on",
                     n_gpu_layers=device["n_gpu_layers"])
        if device["rpc"]:
            click.echo("warning: llama-cpp-python 0.3.36 cannot reach RPC workers: its runners decode on this "
                       "machine (compare pyspec's runners with each other, or use pyspec bench rpc)", err=True)
        runners = [PyspecRunner(target, "pyspec plain")]
        names = lambda text: [x.strip() for x in text.split(",") if x.strip()]  # noqa: E731
        draft_model = None

        def limit(pol: str) -> int:  # the cap of an adaptive policy, or an n-gram/hybrid fixed length
            return cap if cap is not None else 16 if pol == "fixed" else POLICIES[pol]["default_draft_max"]

        model_policies = names(policies)
        if model_policies:
            draft_model = load_model(draft, role="draft", **load)
            spec = SpeculativeDecoder(target, draft_model, drafter="model")
            for pol in model_policies:
                if pol == "fixed":
                    runners += [PyspecRunner(spec, f"pyspec k={k}", draft_max=k, policy="fixed") for k in k_values]
                else:
                    runners.append(PyspecRunner(spec, f"pyspec {pol}", draft_max=limit(pol), policy=pol))
        if ngram_policies:
            ng = SpeculativeDecoder(target, drafter="ngram")
            runners += [PyspecRunner(ng, f"pyspec ngram {pol}", draft_max=limit(pol), policy=pol)
                        for pol in names(ngram_policies)]
        if hybrid_policies:
            draft_model = draft_model or load_model(draft, role="draft", **load)
            hy = SpeculativeDecoder(target, draft_model, drafter="hybrid")
            runners += [PyspecRunner(hy, f"pyspec hybrid {pol}", draft_max=limit(pol), policy=pol)
                        for pol in names(hybrid_policies)]
        runners.append(LlamaCppRunner(target.path, **llama))
        if lookup:
            runners.append(LlamaCppRunner(target.path, **llama, prompt_lookup=lookup))
        result = run_bench(
            runners,
            lambda text: target.prompt_tokens(text, chat=not raw),
            settings=Settings(max_tokens=max_tokens, sampling=sampling, seed=seed),
            categories=categories or None,
            per_category=per_category,
            reps=reps,
        )
    result["threads"] = n_threads
    result["flash_attn"] = target.flash_attn  # what both pyspec and llama-cpp-python ran
    result["flash_attn_requested"] = device["flash_attn"]
    result["rpc"] = list(device["rpc"])  # the target's workers (docs/distributed.md); [] local
    result["n_gpu_layers"] = device["n_gpu_layers"]  # both sides (pyspec's: all layers with --rpc)
    result["model"] = target.path
    result["draft"] = draft if draft_model is not None else None
    from ..bench.plot import plot

    write_report(result, json_path, plot_path, plot,
            f"flash attention {target.flash_attn} for pyspec and llama-cpp-python "
            f"(--flash-attn {device['flash_attn']}), --n-gpu-layers {device['n_gpu_layers']}\n"
            + result["table"])


def _fixed_memory(target, paths):
    """A memory holding the text of ``paths`` (one document per file), or None."""
    if not paths:
        return None
    from ..memory import Memory

    memory = Memory()
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            memory.add(target.tokenize(f.read(), add_special=False))
    return memory


def _bench_paired(model, draft, paired, categories, per_category, max_tokens, sampling, reps, seed, n_threads,
                  n_ctx, device, raw, json_path, plot_path, memory_from=()) -> None:
    """`pyspec bench paired --paired`: see pyspec/bench/inprocess/paired.py for the method."""
    from ..errors import PyspecError
    from ..bench.inprocess.paired import (constrained_figures, format_constrained, format_paired, parse_config,
                                          plot_paired, run_paired, summarize_all)
    from ..bench.structured import constraint_for
    from ..bench.inprocess.runner import progress_bar
    from ..bench.inprocess.backends import LlamaCppRunner, PyspecLlamaRunner, PyspecRunner, Settings
    from ..bench.suite import prompts as suite_prompts
    from ..speculative import SpeculativeDecoder

    try:
        configs = [parse_config(x) for x in paired.split(",") if x.strip()]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--paired") from e
    names = [c.name for c in configs]
    if len(configs) < 2 or len(set(names)) != len(names):
        raise click.BadParameter("give at least two different configurations, e.g. plain,default",
                                 param_hint="--paired")
    with command_errors(errors=(PyspecError, ValueError, OSError, RuntimeError)):
        if plot_path:  # fail before a long run, not after it
            from ..bench.plot import pyplot

            pyplot()
        items = suite_prompts(categories or None, per_category)
        load = dict(n_ctx=n_ctx, n_threads=n_threads, memory_mb=0, **device)
        target = load_model(model, **load)
        draft_model = load_model(draft, role="draft", **load) if any(c.needs_draft_model for c in configs) else None
        memory = _fixed_memory(target, memory_from)
        runners = []
        llama = dict(n_ctx=n_ctx, n_threads=n_threads, flash_attn=target.flash_attn == "on",
                     n_gpu_layers=device["n_gpu_layers"])
        for c in configs:
            if c.api is not None:  # the same calls on either Llama class
                runners.append(LlamaCppRunner(target.path, **llama) if c.api == "llama_cpp"
                               else PyspecLlamaRunner(target.path, **llama))
                continue
            if c.drafter is None:
                runners.append(PyspecRunner(target, c.name))
                continue
            gen = SpeculativeDecoder(target, draft_model if c.needs_draft_model else None, drafter=c.drafter,
                                     policy=c.policy, draft_max=c.draft_max, memory=memory or False, remember=False)
            runners.append(PyspecRunner(gen, c.name))
        settings = Settings(max_tokens=max_tokens, sampling=sampling, seed=seed)
        template = target.chat_template.source

        def tokenize(p):
            if p.task is not None and p.task.tools:
                return target.prompt_tokens([{"role": "user", "content": p.text}], tools=list(p.task.tools))
            return target.prompt_tokens(p.text, chat=not raw)

        def constrain(p):
            return constraint_for(p.task, template) if p.task is not None else None

        for r in runners:  # page in weights, warm caches and calibrations: the first run of a process is slow
            r.run(tokenize(items[0]), Settings(max_tokens=8, sampling=sampling))
        bar = progress_bar(reps * len(items) * len(runners), True)
        samples = run_paired(runners, items, tokenize, settings=settings, reps=reps, progress=bar,
                             constrain=constrain)
        bar(None)
    summary = summarize_all(samples, names, seed=seed)
    constrained = constrained_figures(samples, items, template)
    result = {
        "configurations": names, "reps": reps, "order": "ABBA",
        "settings": asdict(settings), "threads": n_threads, "flash_attn": target.flash_attn,
        "n_gpu_layers": device["n_gpu_layers"], "model": target.path,
        "draft": draft if draft_model is not None else None,
        "memory_tokens": memory.n_tokens if memory else 0,
        "paired": summary, "constrained": constrained, "samples": [asdict(s) for s in samples],
    }
    text = format_paired(summary) + ("\n" + format_constrained(constrained) if constrained else "")
    write_report(result, json_path, plot_path, plot_paired, text)



@click.command()
@suite_options
@max_tokens_option(minimum=2)
@click.option("--draft-max", "-k", default=16, show_default=True, type=click.IntRange(1, MAX_DRAFT),
              help="Longest draft (auto's cap, and the oracle's).")
@threads_option
@device_options
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def simulate(model, categories, per_category, max_tokens, draft_max, threads, device, as_json) -> None:
    """The oracle gap of n-gram drafting on the bench prompts.

    Generates each prompt's greedy output once, then replays it: the n-gram
    drafter (copy cursor included) under the real auto policy, and under a
    myopic oracle that knows how many drafts each round would keep. Target
    batch costs are timed once, so the figures carry no timing noise. Prints
    the speed-up over plain decoding of both, per prompt and per category.
    """
    from ..bench.inprocess.simulate import batch_costs
    from ..bench.inprocess.simulate import simulate as replay
    from ..bench.suite import prompts

    with command_errors():
        target = load_model(model, n_threads=threads, **device)
        costs = batch_costs(target, draft_max + 1)
        rows = []
        chosen = prompts(categories or None, per_category)
        with click.progressbar(chosen, label="greedy outputs and replays", file=sys.stderr) as bar:
            for p in bar:
                tokens = target.prompt_tokens(p.text)
                out = target.generate(tokens, max_tokens=max_tokens, sampling=Sampling.GREEDY)
                r = replay(tokens, out.tokens, costs, target.n_vocab, draft_max)
                rows.append({"prompt": p.id, "category": p.category, "n_generated": len(out.tokens), **r})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo("speed-up over plain (greedy replay, timed batch costs): auto | myopic oracle | gap")
    for r in rows:
        click.echo(f"  {r['prompt']:<18} {r['auto']:5.2f}x  {r['oracle']:5.2f}x  {r['oracle'] / r['auto']:5.2f}")
    cats = sorted({r["category"] for r in rows}, key=[r["category"] for r in rows].index)
    for c in cats + ["all"]:
        rs = [r for r in rows if c in ("all", r["category"])]
        # Pooled like the bench: total plain time over total simulated time.
        plain = sum(r["plain_s"] for r in rs)
        auto = plain / sum(r["plain_s"] / r["auto"] for r in rs)
        oracle = plain / sum(r["plain_s"] / r["oracle"] for r in rs)
        click.echo(f"[{c}] auto {auto:.2f}x, oracle {oracle:.2f}x, gap {oracle / auto:.2f}")


@click.command("parallel")
@click.option("--model", "-m", default=DEFAULT_MODEL, show_default=True, help="Target model (path or default name).")
@click.option("--n", "sizes", default="1,2,4,8,16", show_default=True, type=IntList(1),
              help="Comma-separated batch sizes (samples of one prompt decoded together).")
@max_tokens_option(64, minimum=2)
@sampling_options(Sampling.API.replace(temperature=0.7), seed=False, penalties=False)  # > 0: the samples differ
@click.option("--reps", default=2, show_default=True, type=click.IntRange(min=1), help="Repetitions.")
@threads_option
@device_options
@click.option("--prompt", default=None, help="The prompt of the batch-size runs [default: the suite's qa/0].")
@click.option("--consensus-n", default=8, show_default=True, type=click.IntRange(min=0),
              help="Samples per prompt of the consensus runs (math and code prompts); 0 = skip them.")
@click.option("--per-category", default=2, show_default=True, type=click.IntRange(min=1),
              help="Math and code prompts of the consensus runs, per category.")
@click.option("--raw", is_flag=True, help="Use the prompts as raw text (no chat template).")
@click.option("--llama/--no-llama", "with_llama", default=True, show_default=True,
              help="Also run llama-cpp-python, generating the samples one after another.")
@report_options("every figure", "speed-up against n beside the ceiling n/V(n), and consensus acceptance by draft "
                "position")
def bench_parallel(model, sizes, max_tokens, sampling, reps, threads, device, prompt, consensus_n, per_category, raw,
                   with_llama, json_path, plot_path) -> None:
    """Many sequences in one batch against one at a time.

    For each batch size n: V(n), the measured cost of one target decode with n
    sequences x 1 row in single-row steps, and the ceiling n / V(n) it puts on
    batching; then, interleaved in one process with the same prompt and
    settings, the aggregate speed (tokens after each sequence's first, per
    second of decoding) of pyspec decoding the n samples in one batch, of pyspec
    decoding them one after another, and of llama-cpp-python doing the same.
    Then consensus drafting (samples drafting from each other's text) against
    plain batched decoding on math and code prompts. Progress goes to stderr.
    """
    from .._platform import physical_cores
    from ..bench.inprocess.parallel import plot_parallel, run_consensus, run_parallel, summarize
    from ..bench.inprocess.backends import LlamaCppRunner, Settings
    from ..bench.suite import PROMPTS, prompts

    if 1 not in sizes:
        sizes = [1] + sizes  # V(n) is in units of V(1)
    if sampling.temperature <= 0:
        raise click.BadParameter("--temperature must be > 0 (greedy samples would all be the same)")
    n_threads = threads or physical_cores()
    settings = Settings(max_tokens=max_tokens, sampling=sampling)
    n_max = max(sizes + [consensus_n])
    consensus_prompts = prompts(["math", "code"], per_category) if consensus_n else []
    with command_errors():
        # Every sequence needs room for its prompt and its tokens in the shared cache.
        longest = max([len(t) for t in [prompt or PROMPTS["qa"][0]] + [p.text for p in consensus_prompts]])
        n_ctx = max(N_CTX_BENCH, n_max * (longest + max_tokens + 64))
        target = load_model(model, n_ctx=n_ctx, n_threads=n_threads, n_seq_max=n_max, **device)
        llama = (LlamaCppRunner(target.path, n_ctx=N_CTX_BENCH, n_threads=n_threads,
                                flash_attn=target.flash_attn == "on", n_gpu_layers=device["n_gpu_layers"])
                 if with_llama else None)
        tokens = target.prompt_tokens(prompt or PROMPTS["qa"][0], chat=not raw)
        with labelled_progress(reps * (len(sizes) + len(consensus_prompts)), "bench parallel") as (bar, progress):
            parallel = []
            for rep in range(reps):
                rows = run_parallel(target, tokens, sizes, settings, 1, llama, progress)
                for r in rows:
                    r["rep"] = rep
                    bar.update(1)
                parallel += rows
            consensus = []
            if consensus_n:
                for rep in range(reps):
                    rows = run_consensus(target, consensus_prompts, consensus_n, settings, 1, progress, chat=not raw)
                    for r in rows:
                        r["rep"] = rep
                        bar.update(1)
                    consensus += rows
    result = {"model": target.path, "threads": n_threads, "flash_attn": target.flash_attn,
              "n_gpu_layers": device["n_gpu_layers"], "max_tokens": max_tokens, "sampling": sampling.to_dict(),
              "parallel": parallel, "consensus": consensus,
              "table": summarize(parallel, consensus)}
    if json_path:
        with click.open_file(json_path, "w") as f:
            json.dump(result, f, indent=2)
    if plot_path:
        plot_parallel(parallel, consensus, plot_path)
    if json_path != "-":
        click.echo(f"{target.path} ({n_threads} threads, flash attention {target.flash_attn}), "
                   f"{max_tokens} tokens per sample at T={sampling.temperature}")
        click.echo(result["table"])
