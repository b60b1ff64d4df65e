"""generate() and stream(), shared by plain and speculative generation.

Over 400 lines on purpose: :class:`Generator` is the one place a call's three
values are resolved and a sequence is set up (``setup``); its entries
(``generate``, ``generate_batch``, ``stream``, sessions, saved prefixes) sit
beside it so that none grows its own copy.

Both run the same C++ loop (``_core.Engine``); a plain model's engine has no
drafter. This module owns prompt handling, seeds, Ctrl-C, streaming through a
worker thread, and turning the core's result into a
:class:`~pyspec.results.Completion`. The core validates every setting.

Threads: the C++ core owns one lock per llama context and every generation
holds the locks of the contexts it uses, so any number of threads may share
models and decoders; they take turns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import signal
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _core, constraints, fim
from . import prediction as prediction_
from .constraints import Constraint
from .drafting import FIELDS as DRAFTING_FIELDS
from .drafting import Drafting
from .memory import choose as choose_memory
from .results import BatchStats, Completion, Completions, GenerationStats
from .settings import MAX_TOKENS, check_seed
from .sampling import Sampling
from .testing import TestControls, controls

if TYPE_CHECKING:
    from .memory import Memory
    from .model import Model

Message = Mapping[str, str]
#: A string, a list of chat messages, ready token ids, or a FIM prompt (pyspec/fim.py).
Prompt = Union[str, Sequence[Message], Sequence[int], "fim.InfillPrompt"]
#: Called with each piece of text as soon as it is safe to show. Return False to stop.
TextCallback = Callable[[str], Optional[bool]]
#: Like TextCallback, plus whether the token came from an accepted draft.
TokenTextCallback = Callable[[str, bool], Optional[bool]]
#: For batches: (sequence index, text, drafted). Returning False stops that sequence.
BatchTokenCallback = Callable[[int, str, bool], Optional[bool]]


def run_interruptible(call: Callable[[], "_core.GenerateResult"], cancel: "_core.CancelToken") -> "_core.GenerateResult":
    """Run ``call`` (a C++ generation) on a worker thread so that the main thread
    stays free to receive Ctrl-C; on KeyboardInterrupt, cancel the generation
    (llama.cpp's abort callback stops even a long prompt within a graph node),
    wait for it to unwind, and re-raise."""
    box: dict = {}
    finished = threading.Event()

    def work() -> None:
        try:
            box["out"] = call()
        except BaseException as e:  # handed to the calling thread
            box["err"] = e
        finally:
            finished.set()

    worker = threading.Thread(target=work, name="pyspec-generate", daemon=True)
    started = False
    try:
        with ctrl_c_held():
            worker.start()
            started = True
        while not finished.wait(0.1):  # polled: Windows does not interrupt an untimed wait
            pass
    except KeyboardInterrupt:
        if started:
            cancel.set()
            _wait_through_interrupts(finished)
        raise
    if "err" in box:
        raise box["err"]
    return box["out"]


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Hold Ctrl-C back for the block and raise it as the block ends: around
    ``Thread.start()``, whose wait for the new thread is interruptible. A
    KeyboardInterrupt from inside start() left its caller not knowing that
    the worker had begun, so the generation went on uncancelled (still
    streaming, holding the models) and the process, exiting under it,
    faulted in ggml's freed state (issue 51: SIGSEGV after Ctrl-C, /exit).
    SIGINT's handler runs on the main thread only; elsewhere this does nothing."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(handler):
        yield
        return
    held: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if held:
            handler(signal.SIGINT, held[0])


def _wait_through_interrupts(finished: threading.Event) -> None:
    """Wait until a cancelled worker is out of the C++ core, even through more
    Ctrl-C. Not Thread.join(): on CPython <= 3.12 a KeyboardInterrupt inside
    join() can mark a running thread as stopped (the bpo-45274 fix), so a second
    join() returns at once; the interpreter may then exit while the worker is in
    C++, and finalization kills it with a forced unwind that aborts the process."""
    while True:
        try:
            while not finished.wait(0.1):
                pass
            return
        except KeyboardInterrupt:
            continue


@dataclass
class SequenceSetup:
    """What the engine needs to run one sequence, besides its prompt: the
    settings, and the sequence's drafter and length policy (both None: plain
    decoding; drafter None with a policy: the engine's own drafter)."""

    params: "_core.SequenceParams"
    drafter: Optional["_core.Drafter"] = None
    policy: Optional["_core.LengthPolicy"] = None


class Generator:
    """Base of :class:`~pyspec.Model` and :class:`~pyspec.SpeculativeDecoder`."""

    _engine: "_core.Engine"
    #: The model whose distribution the output follows (it also tokenizes).
    target: "Model"
    #: Whether generations draft (a SpeculativeDecoder) or decode plainly.
    speculative: bool = False
    #: The drafter's name (None: plain).
    drafter: Optional[str] = None
    #: The memory lookup drafters copy from, and where finished generations (prompt
    #: and answer) are remembered when ``remember``; None: none.
    memory: Optional["Memory"] = None
    remember: bool = True
    #: Most share of decoding time that the ``auto`` policy may spend timing the
    #: target's batch sizes between rounds (kept on disk per model and machine: a
    #: first run's cost only); 1e9 times them all after the first round.
    calibration_share: float = _core.SessionParams().calibration_share

    def clear_cache(self) -> None:  # pragma: no cover - abstract
        """Forget the processed prompt, so the next call processes all of it."""
        raise NotImplementedError

    @property
    def engine(self) -> "_core.Engine":
        """The C++ engine that runs this generator's loop (for sessions: :meth:`open_session`)."""
        return self._engine

    # ------------------------------------------------------------ sequence set-up
    def setup(
        self,
        *,
        max_tokens: int,
        sampling: Sampling,
        seed: int,
        stop: Optional[Sequence[str]] = None,
        logprobs: Optional[int] = None,
        slots: Sequence[int] = (0,),
        drafters: str = "engine",
        constraint: Optional[Constraint] = None,
        drafting: Optional[Drafting] = None,
        policy_keys: Optional[List] = None,
    ) -> List[SequenceSetup]:
        """The one way to set up sequences: ``generate``, ``generate_batch`` and
        the server all come here. Returns one :class:`SequenceSetup` per entry of
        ``slots`` (sequence slots of a batch or a server; each slot keeps its own
        length policy across calls), sharing one ``SequenceParams``.

        ``drafters`` says whose drafters the sequences use: ``"engine"`` (the
        engine's own: a single generation), ``"batch"`` (new ones for this
        batch) or ``"slots"`` (each slot's, kept across calls: a server).
        Three values, each resolved where the call entered: ``sampling``,
        ``drafting`` (a :class:`~pyspec.Drafting` from :meth:`drafting`; None:
        plain) and ``constraint`` (one :class:`~pyspec.Constraint`, or None).
        ``policy_keys``: whose length policy each slot uses (default: the
        slot's own; a server's follow the user). How the session runs them
        (chunks, calibration, test controls) is not a sequence's:
        :meth:`session_params`. The core validates every setting (ValueError)."""
        native = sampling.native()
        params = _core.SequenceParams(max_tokens=max_tokens, sampling=native, draft_sampling=native,
                                      seed=check_seed(seed), stop=list(stop or []),
                                      logprobs=-1 if logprobs is None else logprobs)
        penalties = sampling.native_penalties()  # checked even where they change nothing
        if sampling.penalized:
            params.penalties = penalties
        if constraint is not None:
            params.grammar = self.target.grammars.compile(constraint)
        keys = list(slots) if policy_keys is None else list(policy_keys)
        return [SequenceSetup(params, drafter, policy)
                for drafter, policy in self._drafting(params, list(slots), drafters, drafting, keys)]

    @staticmethod
    def sampling(sampling: Optional[Sampling] = None, **changes) -> Sampling:
        """The one :class:`~pyspec.Sampling` of a call: ``sampling`` (default
        :attr:`Sampling.API`) with the fields given by name (``temperature=``,
        ``top_k=``, ``top_p=``, ``min_p=``, the penalties and ``logit_bias``;
        None keeps the field)."""
        return (Sampling.API if sampling is None else sampling).replace(**changes)

    def drafting(self, drafting: Optional[Drafting] = None, **changes) -> Optional[Drafting]:
        """The :class:`~pyspec.Drafting` of a call (None: plain decoding). A
        plain generator takes none: any drafting setting is a TypeError."""
        given = sorted(k for k, v in changes.items() if v is not None)
        if drafting is not None or given:
            raise TypeError(f"unexpected arguments for plain generation: {', '.join(given) or 'drafting'}")
        return None

    def _drafting(self, params: "_core.SequenceParams", slots: List[int], drafters: str,
                  drafting: Optional[Drafting], policy_keys: List
                  ) -> List[Tuple[Optional["_core.Drafter"], Optional["_core.LengthPolicy"]]]:
        """Fill the drafting fields of ``params``; each slot's (drafter, policy).
        Plain generation: nothing to fill, nothing drafts."""
        if drafting is not None:
            raise TypeError("a plain generator does not draft")
        return [(None, None)] * len(slots)

    def record(self, setup: SequenceSetup, stats: "_core.GenerationStats", *, defer: bool = False):
        """A sequence set up by :meth:`setup` finished with ``stats`` (the
        speculative decoder keeps what its policy measured). With ``defer``, the
        file writes are not made but returned as one callable (None: nothing
        to write), for a thread other than the round's."""
        return None

    def session_params(self, *, prefill_chunk: int = 0,
                       _test: Optional[TestControls] = None) -> "_core.SessionParams":
        """How a session runs all its sequences (every generation is one):
        prompt chunks beside running sequences, this generator's
        :attr:`calibration_share`, and ``_test`` (TEST-ONLY,
        :class:`pyspec.testing.TestControls`)."""
        return _core.SessionParams(prefill_chunk=prefill_chunk, calibration_share=self.calibration_share,
                                   test=controls(_test).native())

    def open_session(self, on_token, *, prefill_chunk: int = 0,
                     host_cache: Optional["_core.HostCache"] = None,
                     _test: Optional[TestControls] = None) -> "_core.BatchSession":
        """A continuous-batching session on this generator's models (a server's):
        sequences set up with ``setup(drafters="slots")`` join and leave it
        between rounds (each drafts as its own policy says, none: plain). Caches
        the context gives up go to ``host_cache`` (the prompt cache's host-memory
        tier) and come back."""
        return self._engine.session(self.session_params(prefill_chunk=prefill_chunk, _test=_test),
                                    on_token=on_token, draft_models=self._draft_models(), host_cache=host_cache)

    def _draft_models(self) -> List["_core.Model"]:
        """The models a session drafts with, besides the target (subclasses)."""
        return []

    # ------------------------------------------------------------ saved prefixes
    def _prefix_models(self) -> List["_core.Model"]:
        """The contexts a saved prefix covers: the target's (and the draft model's)."""
        return [self.target.native, *self._draft_models()]

    def save_prefix(self, prefix: Prompt, path, *, chat: bool = False) -> int:
        """Process ``prefix`` once and save every model's cache of it (the draft
        model's too) to ``path`` (pyspec/prefix.py); returns its length in tokens.
        ``prefix``: token ids, a string (raw text unless ``chat``), or chat
        messages, rendered without opening the assistant's turn (a system
        prompt and tools that later conversations begin with). A later
        generation whose prompt starts with these tokens, in this process after
        :meth:`load_prefix` or in another, processes only the rest."""
        if isinstance(prefix, str) and not chat:
            tokens = self.target.tokenize(prefix, add_special=True, parse_special=True)
        elif isinstance(prefix, str) or (prefix and not all(isinstance(t, int) for t in prefix)):
            messages = [{"role": "user", "content": prefix}] if isinstance(prefix, str) else prefix
            text = self.target.apply_chat_template(messages, add_assistant=False)
            tokens = self.target.tokenize(text, add_special=True, parse_special=True)
        else:
            tokens = list(prefix)
        from . import prefix as prefixes

        prefixes.save(self._prefix_models(), tokens, path)
        return len(tokens)

    def load_prefix(self, path) -> int:
        """Put a prefix saved by :meth:`save_prefix` (with these models and this
        build) into the contexts; returns its length in tokens. Raises
        :class:`~pyspec.prefix.PrefixFileError` for a file of other models, of
        another build, or a damaged one."""
        from . import prefix as prefixes

        return prefixes.load(self._prefix_models(), path)

    def prompt_tokens(self, prompt: Prompt, *, chat: bool = True, **template):
        """The target's prompt tokens (``Model.prompt_tokens``: ``tools``, ``variables``)."""
        return self.target.prompt_tokens(prompt, chat=chat, **template)

    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = MAX_TOKENS,
        sampling: Optional[Sampling] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        penalize_prompt: Optional[bool] = None,
        logit_bias=None,
        seed: Optional[int] = None,
        stop: Optional[Sequence[str]] = None,
        chat: bool = True,
        on_text: Optional[TextCallback] = None,
        on_token: Optional[TokenTextCallback] = None,
        cancel: Optional["_core.CancelToken"] = None,
        n: int = 1,
        json_schema=None,
        grammar: Optional[str] = None,
        regex: Optional[str] = None,
        constraint: Optional[Constraint] = None,
        drafting: Optional[Drafting] = None,
        drafter: Optional[str] = None,
        policy: Optional[str] = None,
        draft_max: Optional[int] = None,
        p_min: Optional[float] = None,
        svip_gamma: Optional[float] = None,
        svip_h: Optional[float] = None,
        draft_sampling: Optional[Sampling] = None,
        memory=None,
        suffix: Optional[str] = None,
        healing: Optional[bool] = None,
        prediction: Optional[Union[str, Sequence[int]]] = None,
        logprobs: Optional[int] = None,
        _test: Optional[TestControls] = None,
    ) -> Union[Completion, Completions]:
        """Generate a continuation of ``prompt``.

        With ``n`` > 1, ``n`` independent samples of the prompt are generated
        together, one target decode per round for all of them (the prompt is
        processed once), and a :class:`~pyspec.Completions` is returned: its
        ``choices`` in order, each as a single generation with the seed in its
        ``stats.seed`` would give. ``on_token`` then receives ``(index, text,
        drafted)``. See :meth:`generate_batch`.

        ``prompt`` is a string (wrapped as one user message in the model's chat
        template unless ``chat=False``), a list of ``{"role", "content"}``
        messages, or token ids. Sampling: ``sampling`` (a
        :class:`~pyspec.Sampling`, default ``Sampling.API``: temperature 0.8,
        top-k 40, top-p 0.95, min-p 0.05) with any of ``temperature``,
        ``top_k``, ``top_p``, ``min_p`` given by name changed; ``temperature`` 0
        is greedy; top-k, top-p and min-p truncate (0, 1.0 and 0.0 switch them
        off); ``logit_bias`` ({token id: bias}) and the repetition penalties
        (``repeat_penalty``, ``frequency_penalty``, ``presence_penalty`` over
        the last ``penalty_last_n`` tokens, the prompt's among them when
        ``penalize_prompt``) come before them, as :class:`~pyspec.Sampling`
        says. Without a
        ``seed`` every call draws a fresh sample (or the next seed of the model's
        own ``seed`` sequence); the seed used is in ``stats.seed``, and passing it
        back gives the same output on the same build. ``stop`` strings end
        generation and are not included. ``on_text`` receives text as it is
        produced (return False to stop); ``on_token(text, drafted)`` also learns
        whether the piece came from an accepted draft. ``cancel`` (a
        :class:`pyspec.CancelToken`) stops the generation from another thread.
        Ctrl-C stops it within about a graph node, even in a long prompt, and
        raises KeyboardInterrupt; the model stays usable.

        Structured output (docs/structured.md): ``json_schema`` (a dict or its
        JSON text; the answer is JSON that follows it, on one line),
        ``grammar`` (llguidance Lark or llama.cpp GBNF text) or ``regex``; or
        one :class:`~pyspec.Constraint`. The output then follows the target's
        distribution restricted to what the constraint allows, exactly
        (speculation included); an invalid one raises
        :class:`~pyspec.ConstraintError`.

        Drafting (a :class:`~pyspec.SpeculativeDecoder`; a plain model takes
        none): ``drafting`` (a :class:`~pyspec.Drafting`) with any of
        ``drafter``, ``policy``, ``draft_max`` (0: plain), ``p_min``,
        ``svip_gamma``, ``svip_h``, ``draft_sampling`` and ``memory`` given by
        name changed; None keeps the decoder's. ``_test``: TEST-ONLY negative
        controls (:class:`pyspec.testing.TestControls`).

        Fill in the middle (docs/editor.md): with ``suffix``, ``prompt`` is the
        text before the cursor and the answer the text between it and
        ``suffix``, asked for with the model's FIM tokens (pyspec/fim.py;
        :meth:`infill` takes other files' text too). A half-typed last word is
        healed unless ``healing=False`` (or another constraint is given):
        its last token is taken back and the answer must begin with its text,
        which the answer shown leaves out (``fim.heal`` says what law that
        samples). ``prediction`` (text or
        token ids): what the answer will mostly be (OpenAI's Predicted
        Outputs; pyspec/prediction.py): drafted from, never trusted, so the
        output's law is unchanged; the completion counts its
        ``accepted_prediction_tokens`` and ``rejected_prediction_tokens``.

        ``logprobs`` (k >= 0): the completion's ``logprobs`` holds, per
        generated token, its log-probability and the k most likely tokens'
        (the target's, at temperature 1 without truncation, as the server
        reports them).
        """
        _test = controls(_test)  # a wrong kind fails before any work (or a seed drawn)
        sampling = self.sampling(sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                 repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                 presence_penalty=presence_penalty, penalty_last_n=penalty_last_n,
                                 penalize_prompt=penalize_prompt, logit_bias=logit_bias)
        constraint = constraints.from_keywords(constraint, json_schema=json_schema, grammar=grammar, regex=regex)
        drafting = self.drafting(drafting, drafter=drafter, policy=policy, draft_max=draft_max, p_min=p_min,
                                 svip_gamma=svip_gamma, svip_h=svip_h, draft_sampling=draft_sampling, memory=memory)
        if n != 1 and on_text is not None:
            raise TypeError("with n > 1 use on_token(index, text, drafted): on_text cannot tell samples apart")
        fill = prompt if isinstance(prompt, fim.InfillPrompt) else None
        if suffix is not None:
            if not isinstance(prompt, str):
                raise TypeError("suffix= fills in between two texts: the prompt must be the text before it")
            fill = fim.for_prefix(self.target, prompt, suffix, healing=fim.healing(healing, constraint is not None))
        elif healing is not None:
            raise TypeError("healing= acts where a fill-in-the-middle prompt is built: with suffix= or infill() "
                            "(an InfillPrompt has it built in)")
        if fill is not None:
            if fill.heal and constraint is not None:
                raise ValueError("a healed FIM prompt takes no other constraint (build it with healing=False)")
            tokens, constraint = list(fill.tokens), constraint or fill.constraint()
        else:
            tokens = self.prompt_tokens(prompt, chat=chat)
        predicted = prediction_.tokens_of(self.target, prediction) if prediction is not None else None
        if predicted and drafting is not None:
            drafting = self.with_prediction(drafting, tokens, predicted)
        unheal = fim.Unheal(fill.heal if fill is not None else "")
        if n != 1 or (drafting is not None and drafting.drafter not in (None, self.drafter)):
            # A batch, or a drafter other than the engine's own: one sequence of a batch is the same law.
            batch_callback = None
            if on_token is not None or on_text is not None:
                cuts = [fim.Unheal(unheal.heal) for _ in range(n)]

                def batch_callback(j: int, text: str, drafted: bool):
                    text = cuts[j](text)
                    if not text:
                        return True
                    return on_token(j, text, drafted) if n != 1 else (
                        on_token(text, drafted) if on_token is not None else on_text(text))

            out = self._generate_batch([tokens] * n, seed=seed, on_token=batch_callback, cancel=cancel,
                                       max_tokens=max_tokens, sampling=sampling, stop=stop, constraint=constraint,
                                       drafting=drafting, logprobs=logprobs, _test=_test)
            choices = [self._finished(c, fill, predicted) for c in out.choices]
            return choices[0] if n == 1 else dataclasses.replace(out, choices=choices)
        callback = None
        if on_text is not None or on_token is not None:

            def callback(token: int, piece: bytes, drafted: bool):
                text = unheal(piece.decode("utf-8", errors="replace")) if piece else ""
                if not text:
                    return True
                return on_token(text, drafted) if on_token is not None else on_text(text)

        out = self._run(tokens, callback, cancel, max_tokens=max_tokens, sampling=sampling, seed=seed, stop=stop,
                        constraint=constraint, drafting=drafting, logprobs=logprobs, _test=_test)
        return self._finished(out, fill, predicted)

    def infill(self, prefix: str, suffix: str, *, extra: Sequence["fim.Chunk"] = (), layout: str = "still",
               **settings) -> Union[Completion, Completions]:
        """The text between ``prefix`` and ``suffix`` (code before and after the
        cursor), asked for with the model's FIM tokens (pyspec/fim.py):
        ``extra`` holds other files' text (:class:`pyspec.fim.Chunk`),
        ``layout`` is ``"still"`` (pyspec's) or ``"llama-server"``. The other
        ``settings`` are :meth:`generate`'s (``prediction`` and ``healing`` included).
        Raises :class:`pyspec.fim.FimUnsupported` for a model without FIM tokens."""
        constrained = any(settings.get(k) is not None for k in ("constraint", "json_schema", "grammar", "regex"))
        fill = fim.for_prefix(self.target, prefix, suffix, extra=extra, layout=layout,
                              healing=fim.healing(settings.pop("healing", None), constrained))
        return self.generate(fill, **settings)

    def with_prediction(self, drafting: Drafting, tokens: Sequence[int], predicted: Sequence[int]) -> Drafting:
        """``drafting`` that drafts from a prediction (pyspec/prediction.py)."""
        has_draft = bool(self._draft_models())
        return dataclasses.replace(drafting, prediction=prediction_.memory_for(tokens, predicted),
                                   drafter=prediction_.drafter_for(drafting.drafter or self.drafter, has_draft))

    @staticmethod
    def _finished(out: Completion, fill: Optional["fim.InfillPrompt"], predicted: Optional[List[int]]) -> Completion:
        """A completion with the healed text taken out and the prediction counted."""
        changes: dict = {}
        if fill is not None and fill.heal:
            changes["text"] = fill.visible(out.text)
        if predicted is not None:
            accepted, rejected = prediction_.counts(predicted, out.tokens)
            changes.update(accepted_prediction_tokens=accepted, rejected_prediction_tokens=rejected)
        return dataclasses.replace(out, **changes) if changes else out

    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        *,
        seed: Optional[int] = None,
        chat: bool = True,
        on_token: Optional[BatchTokenCallback] = None,
        cancel: Optional["_core.CancelToken"] = None,
        sampling: Optional[Sampling] = None,
        **settings,
    ) -> Completions:
        """Generate a continuation of every prompt together: each round is one
        target decode over all unfinished sequences. The target must be loaded
        with ``n_seq_max`` >= ``len(prompts)``. Sequence j samples from its own
        random stream (``stats.seed`` of choice j reproduces it alone); equal
        prompts are processed once. ``settings``: :meth:`generate`'s
        (``max_tokens``, ``temperature`` ..., ``stop``, ``json_schema``,
        ``grammar``, ``regex``, the drafting ones; a constraint applies to
        every sequence, each following it on its own);
        ``on_token(index, text, drafted)`` streams every sequence, and returning
        False from it stops that sequence only."""
        if isinstance(prompts, (str, bytes)) or (prompts and all(isinstance(p, int) for p in prompts)):
            raise TypeError("generate_batch takes a list of prompts (this is one prompt: use generate(), "
                            "or generate(prompt, n=k) for k samples of it)")
        if not prompts:
            raise ValueError("generate_batch needs at least one prompt")
        token_lists = [self.prompt_tokens(p, chat=chat) for p in prompts]
        # The call's three values, each resolved here once.
        sampling = self.sampling(sampling, **{f.name: settings.pop(f.name, None) for f in dataclasses.fields(Sampling)})
        constraint = constraints.from_keywords(settings.pop("constraint", None),
                                               json_schema=settings.pop("json_schema", None),
                                               grammar=settings.pop("grammar", None), regex=settings.pop("regex", None))
        drafting = self.drafting(settings.pop("drafting", None),
                                 **{name: settings.pop(name, None) for name in DRAFTING_FIELDS})
        max_tokens, stop = settings.pop("max_tokens", MAX_TOKENS), settings.pop("stop", None)
        test = controls(settings.pop("_test", None))
        if settings:
            raise TypeError(f"generate_batch() got unexpected keyword arguments: {', '.join(sorted(settings))}")
        return self._generate_batch(token_lists, seed=seed, on_token=on_token, cancel=cancel, sampling=sampling,
                                    constraint=constraint, drafting=drafting, max_tokens=max_tokens, stop=stop,
                                    _test=test)

    def _generate_batch(self, token_lists: List[List[int]], *, seed: Optional[int],
                        on_token: Optional[BatchTokenCallback], cancel: Optional["_core.CancelToken"],
                        sampling: Sampling, constraint: Optional[Constraint], drafting: Optional[Drafting],
                        max_tokens: int, stop: Optional[Sequence[str]],
                        _test: Optional[TestControls], logprobs: Optional[int] = None) -> Completions:
        n, n_seq = len(token_lists), self.target.n_seq_max
        if n > n_seq:
            raise ValueError(f"{n} sequences in one batch need a target loaded with n_seq_max >= {n} "
                             f"(this one holds {n_seq}): pyspec.Model(..., n_seq_max={n})")
        callback = None
        if on_token is not None:

            def callback(j: int, token: int, piece: bytes, drafted: bool):
                return on_token(j, piece.decode("utf-8", errors="replace"), drafted) if piece else True

        if seed is None:
            seed = self.target.next_seed()
        seqs = self.setup(max_tokens=max_tokens, sampling=sampling, seed=seed, stop=stop, logprobs=logprobs,
                          slots=range(len(token_lists)), drafters="batch", constraint=constraint, drafting=drafting)
        session = self.session_params(_test=_test)
        cancel = cancel if cancel is not None else _core.CancelToken()

        def call():
            return self._engine.generate_batch(token_lists, seqs[0].params, session=session,
                                               drafters=[s.drafter for s in seqs] if drafting else [],
                                               policies=[s.policy for s in seqs] if drafting else [],
                                               on_token=callback, cancel=cancel)

        on_main = threading.current_thread() is threading.main_thread()
        outs, batch = run_interruptible(call, cancel) if on_main else call()
        choices = []
        for j, (seq, tokens, out) in enumerate(zip(seqs, token_lists, outs)):
            self.record(seq, out.stats)
            self._remember(tokens, out.tokens, drafting)
            choices.append(self._completion(tokens, out, _core.sequence_seed(seed, j), logprobs is not None))
        return Completions(choices, BatchStats(batch, seed, tuple(o.stats.ttft_s for o in outs)))

    def stream(self, prompt: Prompt, **kwargs) -> Iterator[str]:
        """Like :meth:`generate`, but yields text pieces as they are produced.
        Closing the iterator early (``break``) stops generation. The
        iterator's return value (``result = yield from spec.stream(...)``) is
        the :class:`~pyspec.Completion`."""
        pieces: "queue.Queue" = queue.Queue()
        box: dict = {}
        cancel = _core.CancelToken()
        done = object()

        def on_text(text: str) -> bool:
            pieces.put(text)
            return not cancel.is_set

        finished = threading.Event()

        def work() -> None:
            try:
                box["out"] = self.generate(prompt, on_text=on_text, cancel=cancel, **kwargs)
                pieces.put(done)
            except BaseException as e:  # handed to the consuming thread
                pieces.put(e)
            finally:
                finished.set()

        worker = threading.Thread(target=work, name="pyspec-stream", daemon=True)
        started = False
        try:
            with ctrl_c_held():  # a Ctrl-C inside start(): the worker is cancelled below, not left running
                worker.start()
                started = True
            while True:
                item = pieces.get()
                if item is done:
                    return box["out"]
                if isinstance(item, BaseException):
                    raise item
                if item:
                    yield item
        finally:
            if started:
                cancel.set()
                _wait_through_interrupts(finished)

    # ------------------------------------------------------------ internals
    @staticmethod
    def _completion(tokens, out: "_core.GenerateResult", seed: int, logprobs: bool = False) -> Completion:
        return Completion(
            text=out.text.decode("utf-8", errors="replace"),
            tokens=list(out.tokens),
            n_prompt_tokens=len(tokens),
            stop_reason=out.stop_reason,
            stats=GenerationStats(out.stats, seed=seed),
            logprobs=[(lp, list(top)) for lp, top in out.logprobs] if logprobs else None,
        )

    def _run(self, tokens, callback, cancel, *, seed: Optional[int], max_tokens: int, sampling: Sampling,
             stop: Optional[Sequence[str]], constraint: Optional[Constraint], drafting: Optional[Drafting],
             _test: Optional[TestControls] = None, logprobs: Optional[int] = None):
        """One generation of ``tokens`` (the call's values resolved: :meth:`setup`)."""
        if seed is None:
            seed = self.target.next_seed()
        seq = self.setup(max_tokens=max_tokens, sampling=sampling, seed=seed, stop=stop, logprobs=logprobs,
                         constraint=constraint, drafting=drafting)[0]
        session = self.session_params(_test=_test)
        cancel = cancel if cancel is not None else _core.CancelToken()

        def call() -> "_core.GenerateResult":
            return self._engine.generate(tokens, seq.params, session=session, policy=seq.policy,
                                         on_token=callback, cancel=cancel)

        on_main = threading.current_thread() is threading.main_thread()
        out = run_interruptible(call, cancel) if on_main else call()
        self.record(seq, out.stats)
        self._remember(tokens, out.tokens, drafting)
        return self._completion(tokens, out, seed, logprobs is not None)

    def _remember(self, prompt: Sequence[int], output: Sequence[int], drafting: Optional[Drafting]) -> None:
        """A finished generation joins the memory it drafted from (the call's
        ``memory``; plain, and by default, the generator's own): later ones may copy from it."""
        store = choose_memory(drafting.memory if drafting is not None else True, self.memory)
        if self.remember and store is not None and len(output) > 0:
            store.add(list(prompt) + list(output))
