"""Token streams for `pyspec agree`, and the per-position agreement over them.

A stream is a token list both models read (teacher forcing) and the first row
to score: row t is the prediction of token t + 1 from tokens 0..t. The core
(cpp/tools/agreement.h: its docstring defines alpha, top1, kl, logp_ref, logp_cand)
scores all rows of a stream in one call, with both models' logits kept in C++.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from .. import _core
from ..interrupts import run_interruptible
from ..sampling import Sampling
from .texts import TEXTS

ROWS = ("alpha", "top1", "kl", "logp_ref", "logp_cand")


@dataclass
class Stream:
    category: str
    tokens: List[int]
    first: int  # first scored row (a prompt's rows before it are read, not scored)

    @property
    def n_rows(self) -> int:
        return len(self.tokens) - 1 - self.first


def builtin_streams(reference) -> List[Stream]:
    """TEXTS, tokenized by the reference (chat through its template when it has one)."""
    out = []
    for category, texts in TEXTS.items():
        for text in texts:
            if not isinstance(text, str):
                messages = [{"role": r, "content": c} for r, c in text]
                if reference.chat_template.is_builtin:  # no template of its own: a plain transcript
                    text = "\n".join(f"{r.capitalize()}: {c}" for r, c in text)
                else:
                    text = reference.apply_chat_template(messages, add_assistant=False)
            out.append(Stream(category, reference.tokenize(text, add_special=True, parse_special=True), 0))
    return out


def text_streams(reference, text: str, window: int) -> List[Stream]:
    """A text file, tokenized once and cut into windows of `window` tokens (the
    last, shorter one kept when it has a row to score)."""
    tokens = reference.tokenize(text, add_special=True)
    return [Stream("text", tokens[i:i + window], 0) for i in range(0, len(tokens), window)
            if len(tokens[i:i + window]) >= 2]


def prompt_streams(reference, prompts: Sequence[str], *, max_tokens: int, chat: bool, seed: int,
                   sampling: Sampling, progress: Optional[Callable[[int], None]] = None) -> List[Stream]:
    """Each prompt followed by the reference's own continuation (at `sampling`,
    seeded seed, seed + 1, ...): only the continuation's rows are scored, the
    rows a speculative run of the reference would draft."""
    out = []
    for i, prompt in enumerate(prompts):
        tokens = reference.prompt_tokens(prompt, chat=chat)
        result = reference.generate(tokens, max_tokens=max_tokens, seed=seed + i, sampling=sampling)
        if result.tokens:
            out.append(Stream("prompts", tokens + list(result.tokens), len(tokens) - 1))
        if progress:
            progress(1)
    return out


def score(reference, candidate, streams: Sequence[Stream], *, sampling: Sampling = Sampling.OPENAI,
          progress: Optional[Callable[[int], None]] = None) -> List[Dict[str, np.ndarray]]:
    """Per stream: the core's rows ({name: [n_rows]}, plus "nonfinite")."""
    settings = sampling.native()
    out = []
    for s in streams:
        cancel = _core.CancelToken()
        out.append(run_interruptible(lambda: _core.agreement(reference.native, candidate.native, s.tokens, s.first,
                                                          settings, cancel), cancel))
        if progress:
            progress(s.n_rows)
    return out


def summarize(rows: Sequence[Dict[str, np.ndarray]]) -> Dict[str, float]:
    """Means and percentiles over the rows of some streams."""
    cat = {k: np.concatenate([r[k] for r in rows]) for k in ROWS}
    alpha, kl, top1 = cat["alpha"], cat["kl"], cat["top1"]
    lp, lq = cat["logp_ref"], cat["logp_cand"]
    with np.errstate(over="ignore", invalid="ignore"):
        nll_ref, nll_cand = -lp.mean(), -lq.mean()
        return {
            "n_positions": int(len(alpha)),
            "acceptance_mean": float(alpha.mean()),
            "acceptance_p1": float(np.percentile(alpha, 1)),
            "acceptance_p10": float(np.percentile(alpha, 10)),
            "acceptance_median": float(np.median(alpha)),
            "top1_agreement": float(top1.mean()),
            "kl_mean": float(kl.mean()),
            "kl_median": float(np.median(kl)),
            "kl_p90": float(np.percentile(kl, 90)),
            "kl_p99": float(np.percentile(kl, 99)),
            "kl_p999": float(np.percentile(kl, 99.9)),
            "kl_max": float(kl.max()),
            "token_prob_ref": float(np.exp(lp).mean()),
            "token_prob_cand": float(np.exp(lq).mean()),
            "ppl_ref": float(np.exp(nll_ref)),
            "ppl_cand": float(np.exp(nll_cand)),
            "ppl_ratio": float(np.exp(nll_cand - nll_ref)),
            "nonfinite": int(sum(int(r["nonfinite"]) for r in rows)),
        }
