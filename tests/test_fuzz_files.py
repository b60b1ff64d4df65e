"""Hostile model files and chat templates: a clear error, no crash, no hang.

Model files: mutations of a tiny one-layer llama model written from scratch
(tests/gguf_edit.py: 35 KB, loads in milliseconds), drawn by hypothesis
(derandomized): header counts, string and array lengths, value types, key-value
values and duplicates, tensor shapes, types, offsets and names, general.alignment,
byte flips and truncation in the header. Each file is loaded by pyspec.Model
(which then generates), by agree (as the reference: its chat streams, then
scores against the intact file) and by quantize (the core's llama_model_quantize
as pyspec.tools.quantize's child runs it), in a child process that reports one outcome
per job as JSON: a crash (segfault, abort) kills the child, not pytest, and is
pinned on the job it was running; a job over LOAD_BOUND_S is a hang. Every
outcome must be success or the documented exception whose message names the file.

Chat templates that loop, build huge values, raise or reach for Python's
internals must fail with ChatTemplateError within RENDER_SECONDS (plus slack),
without the child's peak memory passing MAX_RSS_MB; through ChatTemplate,
Model(chat_template=...) and a GGUF whose tokenizer.chat_template was replaced.

Over 500 lines on purpose: most of it is data (the mutation strategies and the
table of hostile templates with their expected errors) beside the one child-process
harness both kinds of file go through.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import struct
import subprocess
import sys
import time
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from hypothesis import given, settings
from hypothesis import strategies as st

import gguf_edit as ge
from pyspec.chat import RENDER_SECONDS

#: Seconds one job may take (load a file, generate two tokens, release it; or
#: refuse it) on this loaded 2-core machine; the intact file takes ~5 ms.
LOAD_BOUND_S = 10.0
#: The child's peak resident memory after every hostile template (its own
#: start-up, pyspec and llama.cpp included: ~100 MB).
MAX_RSS_MB = 600

# One child runs many jobs; it announces each before starting it, so a crash
# is pinned on that job. Errors are reported with their class hierarchy.
_CHILD = r"""
import json, os, resource, sys, time, warnings
warnings.simplefilter("ignore")
report = os.fdopen(os.dup(1), "w")  # ours; whatever the libraries print goes to stderr
os.dup2(2, 1)
import pyspec
from pyspec import _core
from pyspec.tools import quantize
from pyspec.agree import agree, builtin_streams, text_streams
from pyspec.chat import ChatTemplate

HI = [{"role": "user", "content": "hello world"}]

def peak_mb():
    # This process's peak RSS: VmHWM (ru_maxrss may carry the parent's from before exec)
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20 if sys.platform == "darwin" else 1024)

def run(job):
    kind, path = job["kind"], job.get("path")
    if kind == "model":
        m = pyspec.Model(path, n_ctx=64, n_threads=1)
        return m.generate("hello world", max_tokens=2, temperature=0).text
    if kind == "agree":
        ref = pyspec.Model(path, n_ctx=64, n_threads=1)
        builtin_streams(ref)  # its chat texts, through the file's template
        cand = pyspec.Model(job["intact"], n_ctx=64, n_threads=1)
        return agree(ref, cand, text_streams(ref, "hello world, the cat is in the hat " * 4, 32),
                     costs=False)["n_positions"]
    if kind == "quantize":  # as pyspec.tools.quantize's child runs it
        _core.quantize(path, job["out"], "Q8_0", 1, False)
        return "quantized"
    if kind == "quantize_cli":  # the whole path: a child process, its report, the error
        return str(quantize.quantize(path, job["out"], "Q8_0"))
    if kind == "template":
        t = ChatTemplate(job["source"], bos_token="<s>", eos_token="</s>", add_bos=True, add_eos=False, origin="T")
        return t.render(HI)
    if kind == "model_template":
        m = pyspec.Model(path, n_ctx=64, n_threads=1, chat_template=job["source"])
        return m.generate(HI, max_tokens=1, temperature=0).text
    raise ValueError(kind)

for line in open(sys.argv[1]):
    job = json.loads(line)
    print(json.dumps({"i": job["i"], "start": True}), file=report, flush=True)
    t = time.monotonic()
    try:
        out = {"outcome": "ok", "detail": str(run(job))[:200]}
    except Exception as e:
        out = {"outcome": "error", "types": [c.__name__ for c in type(e).__mro__], "message": str(e)[:2000]}
    out.update(i=job["i"], seconds=time.monotonic() - t, rss_mb=peak_mb())
    print(json.dumps(out), file=report, flush=True)
"""


def run_jobs(jobs: List[dict], workdir: Path, bound_s: float = LOAD_BOUND_S) -> Dict[int, dict]:
    """Each job's outcome: the child's report, or {"outcome": "crash"/"hang"}.
    After a crash or a hang a new child takes the remaining jobs."""
    results: Dict[int, dict] = {}
    pending = [dict(job, i=i) for i, job in enumerate(jobs)]
    while pending:
        listing = workdir / "jobs.jsonl"
        listing.write_text("".join(json.dumps(j) + "\n" for j in pending))
        with open(workdir / "child.err", "w+") as err:
            child = subprocess.Popen([sys.executable, "-c", _CHILD, str(listing)], stdout=subprocess.PIPE,
                                     stderr=err, text=True, cwd=workdir)
            current, deadline = None, time.monotonic() + 60  # start-up: imports
            sel = selectors.DefaultSelector()
            sel.register(child.stdout, selectors.EVENT_READ)
            while True:
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    child.kill()
                    child.wait()
                    results[current if current is not None else pending[0]["i"]] = {"outcome": "hang"}
                    break
                line = child.stdout.readline()
                if not line:  # the child ended: a crash of the job it was on (or, between jobs, the next)
                    rc = child.wait()
                    left = [j["i"] for j in pending if j["i"] not in results]
                    if left:
                        err.seek(0)
                        culprit = current if current is not None else left[0]
                        results[culprit] = {"outcome": "crash", "returncode": rc, "stderr": err.read()[-1500:]}
                    break
                msg = json.loads(line)
                if msg.get("start"):
                    current, deadline = msg["i"], time.monotonic() + bound_s
                else:
                    results[msg["i"]], current = msg, None
            sel.close()
            child.stdout.close()
        pending = [j for j in pending if j["i"] not in results]
    return results


# ---------------------------------------------------------------- mutations

INTERESTING = [0, 1, 2, 3, 4, 5, 7, 8, 31, 32, 33, 64, 255, 256, 4096, 0x7FFF, 0xFFFF, 2**31 - 1, 2**31,
               2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
INT_TYPES = {0: (0, 2**8), 1: (-2**7, 2**7), 2: (0, 2**16), 3: (-2**15, 2**15), 4: (0, 2**32), 5: (-2**31, 2**31),
             10: (0, 2**64), 11: (-2**63, 2**63)}


def _int(vtype: int):
    lo, hi = INT_TYPES[vtype]
    near = [v for v in INTERESTING + [-1, -2, -2**31, lo] if lo <= v < hi]
    return st.sampled_from(near) | st.integers(lo, hi - 1)


_FLOATS = st.sampled_from([0.0, -1.0, 1e-30, 1e30, float("nan"), float("inf"), -float("inf")]) | st.floats(width=32)
_TEXT = st.sampled_from(["", "llama", "gpt2", "none", "gemma3", "\x00", "é" * 100]) | st.text(max_size=20)


def values(depth: int = 0):
    """(GGUF type, value) pairs of every type, arrays included (not nested twice)."""
    scalars = [st.tuples(st.just(t), _int(t)) for t in INT_TYPES]
    scalars += [st.tuples(st.just(6), _FLOATS), st.tuples(st.just(12), _FLOATS), st.tuples(st.just(7), st.booleans()),
                st.tuples(st.just(8), _TEXT)]
    if depth:
        return st.one_of(scalars)
    arrays = values(1).flatmap(lambda tv: st.tuples(
        st.just(ge.ARRAY), st.tuples(st.just(tv[0]), st.lists(st.just(tv[1]), max_size=300))))
    return st.one_of(scalars + [arrays])


@dataclass
class Mutation:
    """A change to the intact model: structural (on the header's values), then on
    its bytes (numeric fields overwritten, bytes set, the file cut)."""

    what: str
    structural: Optional[tuple] = None
    slot_edits: tuple = ()
    byte_edits: tuple = ()
    cut: Optional[int] = None

    def apply(self, base: ge.Gguf) -> bytes:
        g = deepcopy(base)
        kind, *args = self.structural or ("none",)
        kvs = list(g.kvs.items())
        if kind == "value":
            key, tv = args
            g.kvs[key] = tv
        elif kind == "delete":
            del g.kvs[args[0]]
        elif kind == "duplicate":
            key = args[0]
            g.kvs = kvs + [(key, g.kvs[key])]  # type: ignore[assignment]
        elif kind == "element":
            key, j, value = args
            etype, items = g.kvs[key][1]
            g.kvs[key] = (ge.ARRAY, (etype, items[:j] + [value] + items[j + 1:]))
        elif kind == "shorten":
            key, n = args
            etype, items = g.kvs[key][1]
            g.kvs[key] = (ge.ARRAY, (etype, items[:n]))
        elif kind == "tensor":
            j, field_, value = args
            setattr(g.tensors[j], field_, value)
        elif kind == "drop_tensor":
            del g.tensors[args[0]]
        raw, slots = ge.write(g)
        data = bytearray(raw)
        for index, value in self.slot_edits:
            slot = slots[index % len(slots)]
            struct.pack_into("<" + slot.fmt, data, slot.offset, value % 2 ** (8 * struct.calcsize(slot.fmt)))
        for pos, byte in self.byte_edits:
            data[pos % len(data)] = byte
        return bytes(data if self.cut is None else data[:self.cut])


VALUES = values()
_INTS = {t: _int(t) for t in INT_TYPES}
_ALIGNMENTS = st.sampled_from([0, 1, 3, 24, 48, 64, 2**31, 2**32 - 1])
_KINDS = st.sampled_from(["slots", "bytes", "cut", "value", "delete", "duplicate", "element", "shorten", "tensor",
                          "drop_tensor"])
_SHAPES = st.lists(st.sampled_from(INTERESTING[:16] + [2**40, 2**63 - 1]), max_size=6)
_GGML_TYPES = st.integers(0, 50) | st.sampled_from([2**31 - 1, 2**32 - 1])


def mutations(base: ge.Gguf):
    """A strategy of Mutations of ``base`` (its strategies built once: hypothesis
    validates each new strategy, which costs more than drawing from it)."""
    raw, slots = ge.write(base)
    header = len(raw) - len(base.data)
    keys = st.sampled_from(list(base.kvs))
    arrays = st.sampled_from([k for k, (t, _) in base.kvs.items() if t == ge.ARRAY])
    value_keys = st.sampled_from(list(base.kvs) + ["general.alignment", "tokenizer.chat_template", "llama.vocab_size"])
    slot_edits = st.lists(st.tuples(st.integers(0, len(slots) - 1),
                                    st.sampled_from(INTERESTING + [len(raw), len(raw) + 1, header])
                                    | st.integers(0, 2**64 - 1)), min_size=1, max_size=3)
    byte_edits = st.lists(st.tuples(st.integers(0, header - 1), st.integers(0, 255)), min_size=1, max_size=8)
    cuts = st.integers(0, header + 64) | st.integers(0, len(raw) - 1)
    tensor_index = st.integers(0, len(base.tensors) - 1)
    tensor_fields = st.sampled_from(["shape", "ggml_type", "offset", "name"])
    offsets = st.sampled_from([1, 16, 31, 2**40, len(base.data), len(base.data) + 32]) | st.integers(0, len(base.data))
    names = st.sampled_from(["", "x" * 63, "x" * 64, "x" * 1000] + [t.name for t in base.tensors])

    @st.composite
    def draw_one(draw) -> Mutation:
        kind = draw(_KINDS)
        if kind == "slots":
            edits = draw(slot_edits)
            return Mutation(", ".join(f"{slots[i].what} = {v}" for i, v in edits), slot_edits=tuple(edits))
        if kind == "bytes":
            edits = draw(byte_edits)
            return Mutation(f"header bytes {edits}", byte_edits=tuple(edits))
        if kind == "cut":
            n = draw(cuts)
            return Mutation(f"cut at byte {n} of {len(raw)}", cut=n)
        if kind == "value":
            key = draw(value_keys)
            tv = (ge.UINT32, draw(_ALIGNMENTS)) if key == "general.alignment" and draw(st.booleans()) else draw(VALUES)
            return Mutation(f"{key} = {tv!r:.200}", structural=("value", key, tv))
        if kind in ("delete", "duplicate"):
            key = draw(keys)
            return Mutation(f"{kind} {key}", structural=(kind, key))
        if kind == "element":
            key = draw(arrays)
            etype, items = base.kvs[key][1]
            j = draw(st.integers(0, len(items) - 1))
            value = draw(_TEXT if etype == ge.STRING else _FLOATS if etype == 6 else _INTS[etype])
            return Mutation(f"{key}[{j}] = {value!r}", structural=("element", key, j, value))
        if kind == "shorten":
            key = draw(arrays)
            n = draw(st.integers(0, len(base.kvs[key][1][1]) - 1))
            return Mutation(f"{key} cut to {n} items", structural=("shorten", key, n))
        j = draw(tensor_index)
        name = base.tensors[j].name
        if kind == "drop_tensor":
            return Mutation(f"drop tensor {name}", structural=("drop_tensor", j))
        field_ = draw(tensor_fields)
        value = draw({"shape": _SHAPES.map(tuple), "ggml_type": _GGML_TYPES, "offset": offsets, "name": names}[field_])
        return Mutation(f"tensor {name}: {field_} = {value!r:.80}", structural=("tensor", j, field_, value))

    return draw_one()


def draw_mutations(base: ge.Gguf, n: int) -> List[Mutation]:
    """n mutations of ``base``, drawn by hypothesis (derandomized: the same every run)."""
    drawn: List[Mutation] = []

    @settings(max_examples=n, deadline=None, derandomize=True, database=None)
    @given(mutations(base))
    def collect(m):
        drawn.append(m)

    collect()
    return drawn


# ---------------------------------------------------------------- tests

#: What each load path may raise for a damaged file (class names; the errors'
#: hierarchy is in pyspec/errors.py and pyspec/chat/sandbox.py).
ALLOWED = {
    "model": {"InvalidModelError", "ChatTemplateError", "DecodeError"},
    "agree": {"InvalidModelError", "ChatTemplateError", "IncompatibleModelsError", "DecodeError"},
    "quantize": {"InvalidModelError", "QuantizeError"},
}
#: Errors of a file that loaded, raised as it computes (a tensor's bytes read as
#: another type give NaN logits): their messages speak of the generation.
COMPUTED = {"DecodeError"}


def _verdict(kind: str, path: str, result: dict) -> Optional[str]:
    """Why ``result`` breaks the contract, or None."""
    if result["outcome"] == "ok":
        return None
    if result["outcome"] != "error":
        return f"{result['outcome']}: {json.dumps(result)[:600]}"
    if not ALLOWED[kind] & set(result["types"]):
        return f"raised {result['types'][0]}: {result['message'][:300]}"
    if path not in result["message"] and not COMPUTED & set(result["types"]):
        return f"{result['types'][0]} does not name the file: {result['message'][:300]}"
    return None


#: Mutations drawn: each is loaded three ways (model, agree, quantize).
N_MUTATIONS = 1000


def test_mutated_headers_give_clear_errors(tmp_path):
    base = ge.tiny_llama()
    intact = tmp_path / "intact.gguf"
    ge.save(base, intact)
    drawn = draw_mutations(base, N_MUTATIONS)
    jobs = []
    for i, m in enumerate(drawn):
        path = tmp_path / f"m{i:04d}.gguf"
        path.write_bytes(m.apply(base))
        jobs += [{"kind": "model", "path": str(path)},
                 {"kind": "agree", "path": str(path), "intact": str(intact)},
                 {"kind": "quantize", "path": str(path), "out": str(tmp_path / f"q{i:04d}.gguf")}]
    results = run_jobs(jobs, tmp_path)
    failures = [f"{job['kind']} of {drawn[k // 3].what}: {why}" for k, job in enumerate(jobs)
                if (why := _verdict(job["kind"], job["path"], results[k]))]
    assert not failures, f"{len(failures)} of {len(jobs)} jobs broke the contract:\n" + "\n".join(failures[:40])
    # The mutations reach past the first check: some files load, most are refused.
    loaded = sum(results[k]["outcome"] == "ok" for k in range(0, len(jobs), 3))
    assert 0.02 * len(drawn) < loaded < 0.5 * len(drawn), loaded
    assert max(r["seconds"] for r in results.values()) < LOAD_BOUND_S


def _with(base: ge.Gguf, **changes) -> ge.Gguf:
    g = deepcopy(base)
    for key, value in changes.items():
        g.kvs[key.replace("__", ".")] = value
    return g


def _token(base: ge.Gguf, index: int, text) -> ge.Gguf:
    g = deepcopy(base)
    etype, tokens = g.kvs["tokenizer.ggml.tokens"][1]
    g.kvs["tokenizer.ggml.tokens"] = (ge.ARRAY, (etype, tokens[:index] + [text] + tokens[index + 1:]))
    return g


def _retyped(base: ge.Gguf, name: str, ggml_type: int) -> ge.Gguf:
    g = deepcopy(base)
    next(t for t in g.tensors if t.name == name).ggml_type = ggml_type
    return g


def _empty_key(base: ge.Gguf) -> ge.Gguf:
    g = deepcopy(base)
    g.kvs["\x00name"] = (ge.STRING, "read as a C string: an empty key")  # as fuzzing made it (header byte 303)
    return g


def _reshaped(base: ge.Gguf, name: str, shape: tuple) -> ge.Gguf:
    g = deepcopy(base)
    next(t for t in g.tensors if t.name == name).shape = shape
    return g


def test_findings_stay_fixed(tmp_path):
    """The files the fuzzing found each failure with (see the report of pyspec
    issue 26): each now a clear error."""
    base = ge.tiny_llama()
    h = 3 + ord("h")  # the byte token of 'h': SentencePiece's byte fallback spells "hello" with it
    cases = {
        # the CPU backend aborted (GGML_ASSERT) on tensor data off a 32-byte boundary
        "alignment 1": (_with(base, general__alignment=(ge.UINT32, 1)), "model",
                        "InvalidModelError", r"starts at byte \d+, not a multiple of 32"),
        # the tokenizer's std::out_of_range reached Python as IndexError: unordered_map::at
        "byte token missing": (_token(base, h, "é" * 8), "model", "InvalidModelError", "lacks a token"),
        # llama.cpp's loader aborted the process (GGML_ASSERT) on these two
        "block_count 2**28": (_with(base, llama__block_count=(ge.UINT32, 2**28)), "model", "InvalidModelError",
                              r"llama\.block_count = 268435456 is outside \[1, 512\]"),
        "a token twice": (_token(base, 200, "<0x10>"), "quantize_cli", "InvalidModelError", "token 200 .* repeats"),
        # the CPU backend aborted (GGML_ASSERT eps >= 0) in the first decode's RMS norm
        "negative norm epsilon": (_with(base, llama__attention__layer_norm_rms_epsilon=(ge.FLOAT32, -2.0e15)),
                                  "model", "InvalidModelError", r"layer_norm_rms_epsilon = .* is not a finite number"),
        # the CPU backend crashed (SIGSEGV) multiplying by a tensor of an activation type
        "a Q8_1 weight": (_retyped(base, "blk.0.ffn_down.weight", 9), "model", "InvalidModelError",
                          "type q8_1, which is not a weight type"),
        # llama_model_quantize aborted (GGML_ASSERT): it sizes a tensor by three dimensions
        "quantize: a 4-D weight": (_reshaped(base, "blk.0.ffn_down.weight", (64, 2, 2, 2)), "quantize_cli",
                                   "InvalidModelError", "4 dimensions"),
        # llama_model_quantize divided by a row of length 0 (SIGFPE; issue 35's CI under ASan)
        "quantize: an empty weight": (_reshaped(base, "blk.0.ffn_down.weight", (0, 16)), "quantize_cli",
                                      "InvalidModelError", "dimension of 0"),
        # ggml's GGUF writer asserted on a metadata key that reads as empty (an abort)
        "quantize: an empty key": (_empty_key(base), "quantize_cli", "InvalidModelError", "is empty"),
        # the error message quoting it failed to build (UnicodeDecodeError)
        "token not UTF-8": (_token(base, 262, b"\xff\xfe"), "agree", "InvalidModelError", "not UTF-8"),
        # llama.cpp's reason alone ("unknown model architecture: ''") named no file
        "quantize: no architecture": (_with(base, general__architecture=(ge.STRING, "")), "quantize_cli",
                                      "QuantizeError", "cannot quantize .*: unknown model architecture"),
        # the core's message spoke of a draft and a target and named no file
        "agree: another vocabulary": (_token(base, 265, "▁hat"), "agree", "IncompatibleModelsError",
                                      "candidate .*intact.gguf cannot be compared with the reference"),
    }
    intact = tmp_path / "intact.gguf"
    ge.save(base, intact)
    jobs = []
    for i, (g, kind, _, _) in enumerate(cases.values()):
        path = tmp_path / f"f{i}.gguf"
        ge.save(g, path)
        jobs.append({"kind": kind, "path": str(path), "intact": str(intact), "out": str(tmp_path / f"q{i}.gguf")})
    results = run_jobs(jobs, tmp_path)
    for k, (name, (_, _, error, pattern)) in enumerate(cases.items()):
        r = results[k]
        assert r["outcome"] == "error" and r["types"][0] == error, (name, r)
        assert re.search(pattern, r["message"]) and jobs[k]["path"] in r["message"], (name, r["message"])


# A template for each way of not ending, of growing without bound, of raising,
# and of reaching for Python's internals; and what its error says.
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}"
HOSTILE = {
    "nested range loops": (LOOP, "ran longer than"),
    "nested loops, no output": ("{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i * j %}"
                                "{% endfor %}{% endfor %}", "ran longer than"),
    "recursive loop()": ("{% for m in [1] recursive %}{{ loop([1]) }}{% endfor %}", "RecursionError"),
    "recursive macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    "exponential macro": ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% else %}x{% endif %}"
                          "{% endmacro %}{{ f(60) }}", "ran longer than|would write"),
    "~ doubling in a namespace": ("{% set ns = namespace(s='x') %}{% for i in range(100) %}"
                                  "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}", "would build"),
    "+ doubling of a list": ("{% set ns = namespace(s=[1]) %}{% for i in range(100) %}"
                             "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}", "would build"),
    "nested lists sharing items": ("{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(100) %}"
                                   "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}"
                                   "{{ ns.a == ns.b }}", "would build"),
    "a new list each iteration": ("{% for i in range(100000) %}{% for j in range(100000) %}"
                                  "{% set x = [i, j, 'x' * 100] %}{% endfor %}{% endfor %}", "ran longer than"),
    "'x' * 10**9": ("{{ 'x' * 10**9 }}", "would build"),
    "[1] * 10**9": ("{{ [1] * 10**9 }}", "would build"),
    "10 ** (10 ** 9)": ("{{ 10 ** (10 ** 9) }}", "integer of more than"),
    # Within the digit cap, but 29 s inside one operator before integers were capped in bits.
    "big integer division": ("{% set a = 3 ** 4000000 %}{% set b = a // 7 ** 1000000 %}x", "integer of more than"),
    "str.ljust(10**9)": ("{{ 'x'.ljust(10**9) }}", "passed 1,000,000,000"),
    "str.format width": ("{{ '{:>1000000000}'.format('x') }}", "would build"),
    "% width": ("{{ '%1000000000s' % 'x' }}", "would build"),
    "format filter width": ("{{ '%1000000000s'|format('x') }}", "would build"),
    "str.replace blow-up": ("{% set s = 'a' * 1000000 %}{{ s.replace('a', s) }}", "would build"),
    "str.expandtabs": ("{% set s = '\t' * 1000000 %}{{ s.expandtabs(1000) }}", "would build"),
    "indent filter": ("{% set s = '\n' * 1000000 %}{{ s|indent(1000000) }}", "would build"),
    "join filter": ("{% set s = 'a' * 100000 %}{{ [s, s]|join(s * 40) }}", "would build"),
    "tojson indent": ("{{ messages|tojson(indent=1000000) }}", "would build"),
    "batch fill": ("{{ [1]|batch(10**9, 'x')|list }}", "passed 1,000,000,000"),
    "output past the cap": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "would write"),
    "macro output past the cap": ("{% macro f() %}{% for i in range(100000) %}{% for j in range(100000) %}"
                                  "{{ 'x' * 1000 }}{% endfor %}{% endfor %}{% endmacro %}{{ f()|length }}",
                                  "would write"),
    "set block past the cap": ("{% set s %}{% for i in range(100000) %}{% for j in range(100000) %}"
                               "{{ 'x' * 1000 }}{% endfor %}{% endfor %}{% endset %}{{ s|length }}", "would write"),
    "raise_exception": ("{{ raise_exception('roles must alternate') }}", "refused the messages: roles must"),
    "division by zero": ("{{ 1 / 0 }}", "ZeroDivisionError"),
    "undefined attribute": ("{{ messages[0].nope.deeper }}", "UndefinedError"),
    "__class__ and __subclasses__": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
    "__globals__": ("{{ raise_exception.__globals__ }}", "SecurityError"),
    "cycler.__init__.__globals__": ("{{ cycler.__init__.__globals__ }}", "SecurityError"),
    "self._TemplateReference__context": ("{{ self._TemplateReference__context }}", "SecurityError"),
    "lipsum.__globals__": ("{{ lipsum.__globals__ }}", "UndefinedError|SecurityError"),
    "format-string attack": ("{{ '{0.__class__}'.format(messages) }}", "SecurityError"),
    "|attr('__class__')": ("{{ messages|attr('__class__') }}", "SecurityError"),
    "map(attribute=...)": ("{{ messages|map(attribute='__class__')|list }}", "SecurityError"),
    "mutating the messages": ("{{ messages.append({'role': 'user'}) }}", "SecurityError"),
}
#: Rendered by every path (ChatTemplate, --chat-template, the GGUF's own): one of each kind.
EVERY_PATH = ["nested range loops", "'x' * 10**9", "raise_exception", "__class__ and __subclasses__"]
# Templates within the bounds render as before (tests/test_chat_template.py holds the real ones to llama.cpp's).
ORDINARY = {
    "ChatML": ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
               "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"),
    "loops, macros, namespace within bounds": (
        "{% macro sq(n) %}{{ n * n }}{% endmacro %}{% set ns = namespace(t=0, s='') %}"
        "{% for i in range(100) %}{% for j in range(100) %}{% set ns.t = ns.t + 1 %}{% endfor %}{% endfor %}"
        "{% for i in range(10) %}{% set ns.s = ns.s ~ 'ab' * 1000 %}{% endfor %}"
        "{{ ns.t }} {{ ns.s|length }} {{ sq(12) }} {{ '%05d|{:>4}'.format(7) % 42 }} {{ messages|tojson(indent=2)|length }}",
        "10000 20000 144 00042|   7 60"),
}


def test_hostile_chat_templates_fail_in_bounds(tmp_path):
    """Every hostile template gives ChatTemplateError within the time bound and
    without the memory growing; ordinary ones render as before. Through the
    three ways a template arrives: ChatTemplate itself, Model(chat_template=...)
    (--chat-template) and a GGUF's tokenizer.chat_template (Model and agree)."""
    intact = tmp_path / "intact.gguf"
    ge.save(ge.tiny_llama(), intact)
    jobs, expected = [], []
    for name, (source, pattern) in HOSTILE.items():
        jobs.append({"kind": "template", "source": source})
        expected.append((name, "template", pattern))
    for name in EVERY_PATH:
        source, pattern = HOSTILE[name]
        path = tmp_path / f"t{len(jobs)}.gguf"
        ge.save(ge.tiny_llama(chat_template=source), path)
        jobs += [{"kind": "model_template", "path": str(intact), "source": source},
                 {"kind": "model", "path": str(path)},
                 {"kind": "agree", "path": str(path), "intact": str(intact)}]
        expected += [(name, "--chat-template", pattern), (name, "GGUF, Model", f"{path}.*(?:{pattern})"),
                     (name, "GGUF, agree", f"{path}.*(?:{pattern})")]
    for name, (source, text) in ORDINARY.items():
        jobs.append({"kind": "template", "source": source})
        expected.append((name, "template", None))
    results = run_jobs(jobs, tmp_path)
    bound = RENDER_SECONDS + 1.5  # the deadline, then one bounded step and the unwinding, on a loaded machine
    for k, (name, path, pattern) in enumerate(expected):
        r = results[k]
        if pattern is None:
            assert r["outcome"] == "ok" and r["detail"] == ORDINARY[name][1], (name, r)
            continue
        assert r["outcome"] == "error" and "ChatTemplateError" in r["types"], (name, path, r)
        assert re.search(pattern, r["message"], re.S), (name, path, r["message"])
        assert r["seconds"] < bound, (name, path, r["seconds"])
    peak = max(range(len(jobs)), key=lambda k: results[k]["rss_mb"])
    if not os.environ.get("PYSPEC_SANITIZE"):  # a sanitizer's allocator holds freed memory back
        assert results[peak]["rss_mb"] < MAX_RSS_MB, (expected[peak], results[peak])
