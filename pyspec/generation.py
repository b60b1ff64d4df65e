"""The in-process driver, shared by plain and speculative generation.

Over 400 lines on purpose: :class:`Generator` is the one place a request
becomes the core's sequences (``setup``, the server's way in too); its thin
entries and saved prefixes sit beside it so that none grows its own copy.

:class:`Generator` runs :class:`~pyspec.request.Request` values
(pyspec/request.py; its entries ``generate``, ``infill``,
``generate_batch`` and ``stream`` build them with wire/python.py and stay
thin), and ``setup`` is where every request, the server's too, becomes the
core's sequences. Both plain and speculative decoders run the same C++ loop
(``_core.Engine``); a plain model's engine has no drafter. This module turns
the core's result into a :class:`~pyspec.results.Completion`; Ctrl-C and the
stream's worker thread are interrupts.py's. The core validates every setting.

Threads: the C++ core owns one lock per llama context and every generation
holds the locks of the contexts it uses, so any number of threads may share
models and decoders; they take turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _core, fim, interrupts
from .wire import python as keywords
from .drafting import Drafting
from .memory import choose as choose_memory
from .request import Request
from .results import BatchStats, Completion, Completions
from .settings import check_seed
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
    #: A new prompt's first token from its prompt's decode (one decode before it,
    #: as llama-server) instead of from a first round after the prompt. Off by
    #: default: a row's logits depend on the batch that computed it, so a first
    #: token would then depend on whether the prompt was cached (a near tie can
    #: flip). The server turns it on for its sessions.
    first_with_prompt: bool = False

    def clear_cache(self) -> None:  # pragma: no cover - abstract
        """Forget the processed prompt, so the next call processes all of it."""
        raise NotImplementedError

    @property
    def engine(self) -> "_core.Engine":
        """The C++ engine that runs this generator's loop (for sessions: :meth:`open_session`)."""
        return self._engine

    # ------------------------------------------------------------ sequence set-up
    def setup(self, request: Request, *, seed: int, slots: Sequence[int] = (0,), drafters: str = "engine",
              policy_keys: Optional[List] = None) -> List[SequenceSetup]:
        """The one way to set up sequences: every driver comes here with a
        :class:`~pyspec.request.Request` (its values resolved where it
        entered) and the ``seed`` it runs with (the request's, or one drawn).
        Returns one :class:`SequenceSetup` per entry of ``slots`` (a batch's
        or a server's; each keeps its length policy across calls), sharing
        one ``SequenceParams``.

        ``drafters`` says whose drafters the sequences use: ``"engine"`` (the
        engine's own: a single generation), ``"batch"`` (new ones for this
        batch) or ``"slots"`` (each slot's, kept across calls: a server).
        ``policy_keys``: whose length policy each slot uses (default: the
        slot's own; a server's follow the user). How the session runs them
        (chunks, calibration, test controls) is not a sequence's:
        :meth:`session_params`. The core validates every setting (ValueError)."""
        n_ctx = self.target.n_ctx  # no answer outgrows the context
        max_tokens = n_ctx if request.max_tokens is None else min(request.max_tokens, n_ctx)
        native = request.sampling.native()
        params = _core.SequenceParams(max_tokens=max_tokens, sampling=native, draft_sampling=native,
                                      seed=check_seed(seed), stop=list(request.stop),
                                      logprobs=-1 if request.logprobs is None else request.logprobs)
        penalties = request.sampling.native_penalties()  # checked even where they change nothing
        if request.sampling.penalized:
            params.penalties = penalties
        if request.constraint is not None:
            params.grammar = self.target.grammars.compile(request.constraint)
        keys = list(slots) if policy_keys is None else list(policy_keys)
        return [SequenceSetup(params, drafter, policy)
                for drafter, policy in self._drafting(params, list(slots), drafters, request.drafting, keys)]

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

    def session_params(self, *, prefill_chunk: int = 0, first_with_prompt: Optional[bool] = None,
                       _test: Optional[TestControls] = None) -> "_core.SessionParams":
        """How a session runs all its sequences (every generation is one):
        prompt chunks beside running sequences, this generator's
        :attr:`calibration_share` and :attr:`first_with_prompt` (None: the
        attribute's), and ``_test`` (TEST-ONLY, :class:`pyspec.testing.TestControls`)."""
        first = self.first_with_prompt if first_with_prompt is None else first_with_prompt
        return _core.SessionParams(prefill_chunk=prefill_chunk, calibration_share=self.calibration_share,
                                   first_with_prompt=bool(first), test=controls(_test).native())

    def open_session(self, on_token, *, prefill_chunk: int = 0, first_with_prompt: Optional[bool] = None,
                     host_cache: Optional["_core.HostCache"] = None,
                     _test: Optional[TestControls] = None) -> "_core.BatchSession":
        """A continuous-batching session on this generator's models (a server's):
        sequences set up with ``setup(drafters="slots")`` join and leave it
        between rounds (each drafts as its own policy says, none: plain). Caches
        the context gives up go to ``host_cache`` (the prompt cache's host-memory
        tier) and come back."""
        params = self.session_params(prefill_chunk=prefill_chunk, first_with_prompt=first_with_prompt, _test=_test)
        return self._engine.session(params, on_token=on_token, draft_models=self._draft_models(), host_cache=host_cache)

    def _draft_models(self) -> List["_core.Model"]:
        """The models a session drafts with, besides the target (subclasses)."""
        return []

    @property
    def has_draft_model(self) -> bool:
        """Whether generations may draft with a draft model."""
        return bool(self._draft_models())

    def _use_memory(self, seq: SequenceSetup, drafting: Drafting) -> None:
        """Point ``seq``'s drafter at ``drafting``'s memory (a batch's prompts each predicted)."""

    # ------------------------------------------------------------ saved prefixes
    @property
    def cache_models(self) -> List["_core.Model"]:
        """The contexts a conversation's cache covers, wherever it is kept (a
        saved prefix, the server's prompt cache and its folder): the target's,
        and the draft model's where one drafts."""
        return [self.target.native, *self._draft_models()]

    def save_prefix(self, prefix: Prompt, path, *, chat: bool = False) -> int:
        """Process ``prefix`` once and save every model's cache of it (the draft
        model's too) to ``path`` (pyspec/prefix.py); returns its length in tokens.
        ``prefix``: token ids, a string (raw text unless ``chat``), or chat
        messages, rendered without opening the assistant's turn (a system
        prompt and tools that later conversations begin with). A later
        generation whose prompt starts with these tokens, in this process after
        :meth:`load_prefix` or in another, processes only the rest."""
        from . import prefix as prefixes

        tokens = prefixes.tokens_of(self.target, prefix, chat=chat)
        prefixes.save(self.cache_models, tokens, path)
        return len(tokens)

    def load_prefix(self, path) -> int:
        """Put a prefix saved by :meth:`save_prefix` (with these models and this
        build) into the contexts; returns its length in tokens. Raises
        :class:`~pyspec.prefix.PrefixFileError` for a file of other models, of
        another build, or a damaged one."""
        from . import prefix as prefixes

        return prefixes.load(self.cache_models, path)

    def prompt_tokens(self, prompt: Prompt, *, chat: bool = True, **template):
        """The target's prompt tokens (``Model.prompt_tokens``: ``tools``, ``variables``)."""
        return self.target.prompt_tokens(prompt, chat=chat, **template)

    @keywords.takes_keywords()
    def generate(self, prompt: Prompt, *, on_text: Optional[TextCallback] = None,
                 on_token: Optional[TokenTextCallback] = None, cancel: Optional["_core.CancelToken"] = None,
                 _test: Optional[TestControls] = None, **settings) -> Union[Completion, Completions]:
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
        says. Without a ``seed`` (or with -1) every call draws a fresh sample
        (or the next seed of the model's own ``seed`` sequence); the seed used
        is in ``stats.seed``, and passing it back gives the same output on the
        same build. ``stop`` strings (one string, or a list) end generation and
        are not included; empty ones are dropped. ``on_text`` receives text as it is
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
        samples). ``prediction`` (text or token ids): what the answer will
        mostly be (OpenAI's Predicted Outputs; pyspec/prediction.py): drafted
        from, never trusted; the completion counts its
        ``accepted_prediction_tokens`` and ``rejected_prediction_tokens``.

        ``logprobs`` (k >= 0): the completion's ``logprobs`` holds, per
        generated token, its log-probability and the k most likely tokens'
        (the target's, at temperature 1 without truncation, as the server
        reports them).
        """
        _test = controls(_test)  # a wrong kind fails before any work (or a seed drawn)
        request, = keywords.requests(self, [prompt], settings)
        return self.run(request, on_text=on_text, on_token=on_token, cancel=cancel, _test=_test)

    def run(self, request: Request, *, on_text: Optional[TextCallback] = None,
            on_token: Optional[TokenTextCallback] = None, cancel: Optional["_core.CancelToken"] = None,
            _test: Optional[TestControls] = None) -> Union[Completion, Completions]:
        """Run one :class:`~pyspec.request.Request` (``n`` samples of its
        prompt): the in-process driver behind :meth:`generate`,
        :meth:`infill` and :meth:`stream`; the callbacks as :meth:`generate` takes them."""
        n = request.n
        if n != 1 and on_text is not None:
            raise TypeError("with n > 1 use on_token(index, text, drafted): on_text cannot tell samples apart")
        if n != 1 or (request.drafting is not None and request.drafting.drafter not in (None, self.drafter)):
            # A batch, or a drafter other than the engine's own: one sequence of a batch is the same law.
            batch_callback = None
            if on_token is not None or on_text is not None:
                cuts = [request.unheal() for _ in range(n)]

                def batch_callback(j: int, text: str, drafted: bool):
                    text = cuts[j](text)
                    if not text:
                        return True
                    return on_token(j, text, drafted) if n != 1 else (
                        on_token(text, drafted) if on_token is not None else on_text(text))

            out = self._run_batch([request] * n, on_token=batch_callback, cancel=cancel, _test=_test)
            return out.choices[0] if n == 1 else out
        callback = None
        if on_text is not None or on_token is not None:
            unheal = request.unheal()

            def callback(token: int, piece: bytes, drafted: bool):
                text = unheal(piece.decode("utf-8", errors="replace")) if piece else ""
                if not text:
                    return True
                return on_token(text, drafted) if on_token is not None else on_text(text)

        return self._run(request, callback, cancel, _test=_test)

    @keywords.takes_keywords("suffix")
    def infill(self, prefix: str, suffix: str, *, extra: Sequence["fim.Chunk"] = (), layout: str = "still",
               on_text: Optional[TextCallback] = None, on_token: Optional[TokenTextCallback] = None,
               cancel: Optional["_core.CancelToken"] = None, _test: Optional[TestControls] = None,
               **settings) -> Union[Completion, Completions]:
        """The text between ``prefix`` and ``suffix`` (code before and after the
        cursor), asked for with the model's FIM tokens (pyspec/fim.py):
        ``extra`` holds other files' text (:class:`pyspec.fim.Chunk`),
        ``layout`` is ``"still"`` (pyspec's) or ``"llama-server"``. The other
        ``settings`` are :meth:`generate`'s (``prediction`` and ``healing`` included).
        Raises :class:`pyspec.fim.FimUnsupported` for a model without FIM tokens."""
        _test = controls(_test)
        request, = keywords.requests(self, [prefix], settings, what="infill",
                                     infill=dict(suffix=suffix, extra=extra, layout=layout))
        return self.run(request, on_text=on_text, on_token=on_token, cancel=cancel, _test=_test)

    @keywords.takes_keywords("n", "suffix", "healing")
    def generate_batch(self, prompts: Sequence[Prompt], *, on_token: Optional[BatchTokenCallback] = None,
                       cancel: Optional["_core.CancelToken"] = None, _test: Optional[TestControls] = None,
                       **settings) -> Completions:
        """Generate a continuation of every prompt together: each round is one
        target decode over all unfinished sequences. The target must be loaded
        with ``n_seq_max`` >= ``len(prompts)``. Sequence j samples from its own
        random stream (``stats.seed`` of choice j reproduces it alone); equal
        prompts are processed once. ``settings``: :meth:`generate`'s but
        ``n``, ``suffix`` and ``healing`` (a constraint applies to every
        sequence, each following it on its own; a ``prediction`` too);
        ``on_token(index, text, drafted)`` streams every sequence, and returning
        False from it stops that sequence only."""
        if isinstance(prompts, (str, bytes)) or (prompts and all(isinstance(p, int) for p in prompts)):
            raise TypeError("generate_batch takes a list of prompts (this is one prompt: use generate(), "
                            "or generate(prompt, n=k) for k samples of it)")
        if not prompts:
            raise ValueError("generate_batch needs at least one prompt")
        for key in ("n", "suffix", "healing"):
            if key in settings:
                raise TypeError(f"generate_batch() takes no {key}= (generate() does)")
        if any(isinstance(p, fim.InfillPrompt) for p in prompts):  # each heals its own way: one request each
            raise TypeError("generate_batch takes no FIM prompts: infill() or generate(suffix=) each")
        requests = keywords.requests(self, prompts, settings, what="generate_batch")
        return self._run_batch(requests, on_token=on_token, cancel=cancel, _test=controls(_test))

    def _run_batch(self, requests: List[Request], *, on_token: Optional[BatchTokenCallback],
                   cancel: Optional["_core.CancelToken"], _test: Optional[TestControls]) -> Completions:
        """Requests with the same settings (one call built them), one
        sequence each, run together: the batch driver."""
        n, n_seq = len(requests), self.target.n_seq_max
        if n > n_seq:
            raise ValueError(f"{n} sequences in one batch need a target loaded with n_seq_max >= {n} "
                             f"(this one holds {n_seq}): pyspec.Model(..., n_seq_max={n})")
        callback = None
        if on_token is not None:

            def callback(j: int, token: int, piece: bytes, drafted: bool):
                return on_token(j, piece.decode("utf-8", errors="replace"), drafted) if piece else True

        first = requests[0]
        seed = first.seed if first.seed is not None else self.target.next_seed()
        seqs = self.setup(first, seed=seed, slots=range(n), drafters="batch")
        drafting = first.drafting
        if drafting is not None and any(r.drafting is not drafting for r in requests):
            # Each prompt's prediction is its own memory: give each its own drafter's memory.
            for seq, r in zip(seqs, requests):
                self._use_memory(seq, r.drafting)
        session = self.session_params(_test=_test)
        cancel = cancel if cancel is not None else _core.CancelToken()
        token_lists = [list(r.tokens) for r in requests]

        def call():
            return self._engine.generate_batch(token_lists, seqs[0].params, session=session,
                                               drafters=[s.drafter for s in seqs] if drafting else [],
                                               policies=[s.policy for s in seqs] if drafting else [],
                                               on_token=callback, cancel=cancel)

        outs, batch = interrupts.run_interruptible(call, cancel)
        choices = []
        for j, (seq, request, out) in enumerate(zip(seqs, requests, outs)):
            self.record(seq, out.stats)
            self._remember(request.tokens, out.tokens, request.drafting)
            done = Completion.of(request.tokens, out, _core.sequence_seed(seed, j), request.logprobs is not None)
            choices.append(request.finish(done))
        return Completions(choices, BatchStats(batch, seed, tuple(o.stats.ttft_s for o in outs)))

    def stream(self, prompt: Prompt, **kwargs) -> Iterator[str]:
        """Like :meth:`generate` (or :meth:`run`, given a
        :class:`~pyspec.request.Request`), but yields text pieces as they are produced.
        Closing the iterator early (``break``) stops generation. The
        iterator's return value (``result = yield from spec.stream(...)``) is
        the :class:`~pyspec.Completion`."""
        def work(on_text, cancel):
            if isinstance(prompt, Request):
                return self.run(prompt, on_text=on_text, cancel=cancel, **kwargs)
            return self.generate(prompt, on_text=on_text, cancel=cancel, **kwargs)

        return (yield from interrupts.streamed(work))

    # ------------------------------------------------------------ internals
    def _run(self, request: Request, callback, cancel, *, _test: Optional[TestControls] = None) -> Completion:
        """One sequence of ``request`` on the engine's own drafter: the single driver."""
        seed = request.seed if request.seed is not None else self.target.next_seed()
        seq = self.setup(request, seed=seed)[0]
        session = self.session_params(_test=_test)
        cancel = cancel if cancel is not None else _core.CancelToken()
        tokens = list(request.tokens)

        def call() -> "_core.GenerateResult":
            return self._engine.generate(tokens, seq.params, session=session, policy=seq.policy,
                                         on_token=callback, cancel=cancel)

        out = interrupts.run_interruptible(call, cancel)
        self.record(seq, out.stats)
        self._remember(tokens, out.tokens, request.drafting)
        return request.finish(Completion.of(tokens, out, seed, request.logprobs is not None))

    def _remember(self, prompt: Sequence[int], output: Sequence[int], drafting: Optional[Drafting]) -> None:
        """A finished generation joins the memory it drafted from (the call's
        ``memory``; plain, and by default, the generator's own): later ones may copy from it."""
        store = choose_memory(drafting.memory if drafting is not None else True, self.memory)
        if self.remember and store is not None and len(output) > 0:
            store.add(list(prompt) + list(output))
