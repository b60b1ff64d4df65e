"""`pyspec agree`: how a candidate model agrees with a reference model.

One pass of both models over the same token streams (teacher-forced, in the
C++ core) gives, per position, the acceptance alpha = 1 - TV(p, q) at the
chosen sampling settings, top-1 agreement (alpha at T = 0), KL(p || q) and the
stream's next token's probability under both (cpp/tools/agreement.h defines them).
From those: summaries per category (measure.py), a health verdict for a
quantised candidate (verdict.py, bands from published KL scoreboards; a
candidate of the reference's own type should agree almost exactly), and the
speculation view, the speed-up drafting with the candidate would bring on this
machine (speculation.py).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

from .measure import Stream, builtin_streams, prompt_streams, score, summarize, text_streams
from .speculation import acceptance_by_position, predict
from .verdict import judge, type_name
from ..sampling import Sampling

__all__ = ["Stream", "agree", "builtin_streams", "prompt_streams", "text_streams"]

KS = tuple(range(1, 9))


def agree(reference, candidate, streams: Optional[Sequence[Stream]] = None, *,
          sampling: Sampling = Sampling.OPENAI, ks: Sequence[int] = KS, costs: bool = True,
          progress: Optional[Callable[[int], None]] = None, keep_rows: bool = False) -> Dict:
    """The agreement report of ``candidate`` against ``reference`` (both
    :class:`pyspec.Model`, sharing a vocabulary) over ``streams`` (default: the
    built-in texts), both models' distributions taken at ``sampling`` (default
    the models' own: temperature 1, untruncated). ``costs``: time both models here for the speed-up
    prediction (False: tokens per pass only). ``progress(n)`` is called with
    rows scored. Keys: ``acceptance_mean``, ``kl_mean``, ``top1_agreement``,
    ``n_positions``, ``verdict`` and the rest of :func:`measure.summarize`, plus
    ``reason``, ``healthy_below``/``broken_above`` (the band edges applied),
    ``same_type`` (judged as a same-type pair: verdict.py), ``per_category``,
    ``speculation``, ``models``, ``settings`` (and ``rows``, each stream's
    per-position arrays, with ``keep_rows``)."""
    from .. import _core
    from ..errors import IncompatibleModelsError

    try:
        _core.check_compatible(reference.native, candidate.native)
    except IncompatibleModelsError as e:  # its words are a draft's and a target's: name the files
        raise IncompatibleModelsError(f"the candidate {candidate.path} cannot be compared with the reference "
                                      f"{reference.path}: {e}") from None
    streams = list(streams) if streams is not None else builtin_streams(reference)
    if not streams:
        raise ValueError("no token stream to score")
    rows = score(reference, candidate, streams, sampling=sampling, progress=progress)
    report: Dict = summarize(rows)
    v = judge(kl_mean=report["kl_mean"], top1=report["top1_agreement"], nonfinite=report["nonfinite"],
              cand_type=candidate.native.file_type, cand_params=candidate.native.n_params,
              ref_params=reference.native.n_params, ref_type=reference.native.file_type)
    report.update(verdict=v.verdict, reason=v.reason, healthy_below=v.healthy_below, broken_above=v.broken_above,
                  same_type=v.same_type)
    categories: Dict[str, List] = {}
    for s, r in zip(streams, rows):
        categories.setdefault(s.category, []).append(r)
    report["per_category"] = {c: summarize(rs) for c, rs in categories.items()}
    report["speculation"] = speculation_view(reference, candidate, rows, ks, costs)
    report["models"] = {role: {"path": m.path, "description": m.native.description, "type": type_name(m.native.file_type),
                               "n_params": int(m.native.n_params)}
                        for role, m in (("reference", reference), ("candidate", candidate))}
    report["settings"] = {**sampling.to_dict(), "streams": len(streams)}
    if keep_rows:
        report["rows"] = rows
    return report


def speculation_view(reference, candidate, rows, ks: Sequence[int], costs: bool) -> Dict:
    """Acceptance by draft position and tokens per pass (at the settings, and
    greedy), and with ``costs`` this machine's timings and predicted speed-ups."""
    sampled = [r["alpha"] for r in rows]
    greedy = [r["top1"].astype(float) for r in rows]
    k_max = max(ks)
    view: Dict = {"acceptance_by_position": acceptance_by_position(sampled, k_max),
                  "acceptance_by_position_greedy": acceptance_by_position(greedy, k_max)}
    v, step = None, 0.0
    if costs:
        from ..bench.inprocess.simulate import batch_costs

        v = batch_costs(reference, k_max + 1)
        step = batch_costs(candidate, 1)[1]
        view["costs"] = {"reference_batch_s": {str(n): t for n, t in v.items()}, "candidate_step_s": step}
    view["sampled"] = predict(sampled, ks, v, step)
    view["greedy"] = predict(greedy, ks, v, step)
    return view
