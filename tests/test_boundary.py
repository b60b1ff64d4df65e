"""The C++/Python boundary has one schema: the typed stub matches the module,
the Python layer reads names and defaults from the core, and the README's
tables describe exactly the drafters and policies the core builds."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import pyspec
from pyspec import _core
from pyspec import sampling as py_sampling
from pyspec.results import GenerationStats
from pyspec.speculative import DRAFTERS, POLICIES

ROOT = Path(__file__).resolve().parents[1]
STUB = Path(pyspec.__file__).with_name("_core.pyi")


def _members(body):
    """{name: set of member names (classes) or None (functions, attributes)} of a stub body."""
    out = {}
    for node in body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = set(_members(node.body))
            out.update({f"{node.name}.{k}": v for k, v in _members(node.body).items() if v is not None})
        elif isinstance(node, ast.FunctionDef):
            out[node.name] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = None
    return out


def _stub_members():
    return _members(ast.parse(STUB.read_text(encoding="utf-8")).body)


def _public(cls):
    """A class's own public members, and __init__ where it has a bound constructor
    (pybind11 gives the others a slot wrapper that raises)."""
    own = vars(cls)
    ctor = "__init__" in own and not type(own["__init__"]).__name__.endswith("wrapper_descriptor")
    protocol = {n for n in ("__enter__", "__exit__") if n in own}  # a with-block, which the stub must type
    return {n for n in own if not n.startswith("_")} | ({"__init__"} if ctor else set()) | protocol


def test_stub_matches_the_module():
    stub = _stub_members()
    top = {n for n in stub if "." not in n}
    module = {n for n in dir(_core) if not n.startswith("_")}
    # `sampling` (a submodule) is typed as an instance of the stub class _Sampling.
    assert top - {"_Sampling"} == module, "stub and module disagree on top-level names"
    for name, members in stub.items():
        if members is None or name == "_Sampling":
            continue
        obj = _core.sampling if name.startswith("_Sampling.") else _core
        cls = getattr(obj, name.split(".")[-1])
        assert members == _public(cls), f"{name}: stub {sorted(members)} vs module {sorted(_public(cls))}"
    assert stub["_Sampling"] == {n for n in dir(_core.sampling) if not n.startswith("_")}


def test_stub_detects_a_missing_member(tmp_path, monkeypatch):
    """Negative control: a stub without one method must fail the comparison."""
    text = STUB.read_text(encoding="utf-8")
    broken = re.sub(r"\n    def verify_cost\(.*?\n", "\n", text, count=1)
    assert broken != text
    monkeypatch.setattr(sys.modules[__name__], "STUB", tmp_path / "_core.pyi")
    (tmp_path / "_core.pyi").write_text(broken, encoding="utf-8")
    with pytest.raises(AssertionError, match="AutoPolicy"):
        test_stub_matches_the_module()


def test_python_reads_names_and_defaults_from_the_core():
    assert list(POLICIES) == [p["name"] for p in _core.policies()]
    assert list(DRAFTERS) == [d["name"] for d in _core.drafters()]
    for name, info in POLICIES.items():
        assert _core.make_policy(_core.PolicyParams(name=name)).draft_max == info["default_draft_max"]
    assert GenerationStats.FIELDS[:-1] == tuple(_core.GenerationStats.FIELDS)
    assert py_sampling.VARIANTS == tuple(_core.sampling.VARIANTS)


def _readme_table(heading: str):
    """Rows (first column's code name, last column) of the table under `heading`."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index(heading):]
    rows = []
    for line in section.splitlines()[1:]:
        m = re.match(r"\| `(\w+)` \|.*\| ([^|]*)\|$", line)
        if m:
            rows.append((m.group(1), m.group(2).strip()))
        elif rows and not line.startswith("|"):
            break
    return rows


def test_readme_describes_exactly_the_core_catalog():
    policies = _readme_table("| policy | rule |")
    assert [n for n, _ in policies] == list(POLICIES)
    assert [int(cap) for _, cap in policies] == [p["default_draft_max"] for p in POLICIES.values()]
    assert [n for n, _ in _readme_table("| drafter | what |")] == list(DRAFTERS)


def test_struct_keywords_are_checked():
    with pytest.raises(TypeError, match="unexpected argument 'nope'"):
        _core.GenerateParams(nope=1)
    with pytest.raises(ValueError, match="top_p"):
        _core.SamplingParams(top_p=0.0)
    p = _core.GenerateParams(max_tokens=7, variant="accept_all")
    assert p.max_tokens == 7 and p.variant == "accept_all" and p.to_dict()["max_tokens"] == 7
    with pytest.raises(ValueError, match="variant"):
        p.variant = "nope"
