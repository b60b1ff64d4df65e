"""The C++/Python boundary has one schema: the typed stub matches the module
(names, parameters and their defaults, struct fields), and the Python layer
reads names and defaults from the core."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pyspec
from pyspec import _core
from pyspec import sampling as py_sampling
from pyspec.results import GenerationStats
from pyspec.speculative import DRAFTERS, POLICIES

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


def _stub_members(tree):
    return _members(tree.body)


def _public(cls):
    """A class's own public members, and __init__ where it has a bound constructor
    (pybind11 gives the others a slot wrapper that raises)."""
    own = vars(cls)
    ctor = "__init__" in own and not type(own["__init__"]).__name__.endswith("wrapper_descriptor")
    protocol = {n for n in ("__enter__", "__exit__") if n in own}  # a with-block, which the stub must type
    return {n for n in own if not n.startswith("_")} | ({"__init__"} if ctor else set()) | protocol


# ------------------------------------------------------------------ signatures

NO_DEFAULT = "no default"
UNSTATED = "..."  # a stub default of `...`: there is one, its value is the C++ source's


def _literal(text_or_node):
    """A default as a Python value, or ("<source>",) where it is not a literal."""
    try:
        return ast.literal_eval(text_or_node)
    except (ValueError, SyntaxError, TypeError):
        src = text_or_node if isinstance(text_or_node, str) else ast.unparse(text_or_node)
        return (f"<{src}>",)


def _split_top(text: str, sep: str = ","):
    """Split at `sep` outside brackets and quotes."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return parts + ([cur] if cur.strip() else [])


def _params_of_line(line: str):
    """[(name, kind, default)] of a pybind11 signature line `name(a: T = d, ...) -> R`;
    kind: "pos" (positional or keyword), "posonly" (pybind11's argN), "kwonly",
    "*" or "**"; self is left out."""
    inner = line[line.index("(") + 1:]
    depth = 1
    for i, ch in enumerate(inner):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            inner = inner[:i]
            break
    out, kwonly = [], False
    for part in _split_top(inner):
        part = part.strip()
        if part == "*":
            kwonly = True
            continue
        if part == "/":
            out = [(n, "posonly", d) for n, _, d in out]
            continue
        head, _, default = part.partition(" = ")
        name = head.split(":")[0].strip()
        if name.startswith("**"):
            out.append(("**", "**", NO_DEFAULT))
        elif name.startswith("*"):
            out.append(("*", "*", NO_DEFAULT))
            kwonly = True
        elif name != "self":
            kind = "posonly" if re.fullmatch(r"arg\d+", name) else "kwonly" if kwonly else "pos"
            out.append((name, kind, _literal(default) if default else NO_DEFAULT))
    return out


def _module_signatures(obj):
    """Every signature pybind11 wrote into the docstring (one per overload)."""
    lines = (obj.__doc__ or "").splitlines()
    if len(lines) > 1 and lines[1].strip() == "Overloaded function.":
        return [_params_of_line(m.group(1)) for m in (re.match(r"\d+\. (.*)", l) for l in lines) if m]
    return [_params_of_line(lines[0])] if lines and "(" in lines[0] else []


def _stub_params(fn: ast.FunctionDef, method: bool):
    a = fn.args
    positional = [(x, "posonly") for x in a.posonlyargs] + [(x, "pos") for x in a.args]
    defaults = [NO_DEFAULT] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = []
    for i, ((arg, kind), d) in enumerate(zip(positional, defaults)):
        if i == 0 and method and arg.arg == "self":
            continue
        if arg.arg.startswith("__") and not arg.arg.endswith("__"):
            kind = "posonly"  # the pre-3.8 spelling of a positional-only parameter
        out.append((arg.arg, kind, d))
    if a.vararg:
        out.append(("*", "*", NO_DEFAULT))
    out += [(x.arg, "kwonly", d if d is not None else NO_DEFAULT) for x, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append(("**", "**", NO_DEFAULT))
    return [(n, k, d if isinstance(d, str) else UNSTATED if isinstance(d, ast.Constant) and d.value is ...
             else _literal(d)) for n, k, d in out]


def _same_default(stub, module) -> bool:
    if stub == UNSTATED:
        return module != NO_DEFAULT
    return type(stub) is type(module) and stub == module


def _signature_problems(where: str, stub_sigs, module_sigs):
    if len(stub_sigs) != len(module_sigs):
        return [f"{where}: {len(stub_sigs)} signature(s) in the stub, {len(module_sigs)} in the module"]
    problems = []
    for s_sig, m_sig in zip(stub_sigs, module_sigs):
        if [k for _, k, _ in s_sig] != [k for _, k, _ in m_sig] or any(
                sk not in ("posonly", "*", "**") and sn != mn for (sn, sk, _), (mn, _, _) in zip(s_sig, m_sig)):
            problems.append(f"{where}: parameters {[(n, k) for n, k, _ in s_sig]} in the stub, "
                            f"{[(n, k) for n, k, _ in m_sig]} in the module")
            continue
        problems += [f"{where}: default of {sn} is {sd!r} in the stub, {md!r} in the module"
                     for (sn, _, sd), (_, _, md) in zip(s_sig, m_sig) if not _same_default(sd, md)]
    return problems


def _defs(body):
    """{name: [FunctionDef, ...]} (overloads in order) and {name: ClassDef}."""
    fns, classes = {}, {}
    for node in body:
        if isinstance(node, ast.FunctionDef):
            fns.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = node
    return fns, classes


# ------------------------------------------------------------------ struct fields

def _annotation_holds(ann: ast.expr, value) -> bool:
    """Whether a default-constructed field's value is of the stub's declared type."""
    src = ast.unparse(ann)
    if src.startswith("Optional["):
        return value is None or _annotation_holds(ann.slice, value)
    base = src.split("[")[0]
    simple = {"int": int, "float": float, "str": str, "bool": bool, "bytes": bytes, "List": list,
              "Tuple": tuple, "Dict": dict}
    if base in simple:
        return isinstance(value, simple[base]) and (base != "int" or not isinstance(value, bool))
    cls = getattr(_core, base, None)
    return isinstance(value, cls) if isinstance(cls, type) else True


def _struct_problems(name: str, node: ast.ClassDef, cls):
    """A bound struct (one with FIELDS): the stub's fields are the module's, in
    order, and a default-constructed instance's values are of the declared types
    (and equal to the stub's value where it states one)."""
    fields = [n for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
              and not ast.unparse(n.annotation).startswith("ClassVar")]
    names = tuple(n.target.id for n in fields)
    if names != tuple(cls.FIELDS):
        return [f"{name}: fields {names} in the stub, FIELDS {tuple(cls.FIELDS)} in the module"]
    instance, problems = cls(), []
    for n in fields:
        value = getattr(instance, n.target.id)
        if not _annotation_holds(n.annotation, value):
            problems.append(f"{name}.{n.target.id}: {ast.unparse(n.annotation)} in the stub, "
                            f"the default instance holds {value!r}")
        elif n.value is not None and _literal(n.value) != value:
            problems.append(f"{name}.{n.target.id}: default {ast.unparse(n.value)} in the stub, {value!r} in the module")
    return problems


def _stub_differences(text: str):
    """Every way the stub `text` disagrees with the module: names of members,
    parameters (names, kinds, defaults) of functions and methods, and the fields
    of bound structs. Empty when they agree."""
    tree = ast.parse(text)
    stub = _stub_members(tree)
    problems = []
    top = {n for n in stub if "." not in n}
    module = {n for n in dir(_core) if not n.startswith("_")}
    # `sampling` (a submodule) is typed as an instance of the stub class _Sampling.
    if top - {"_Sampling"} != module:
        problems.append(f"top-level names: stub only {sorted(top - {'_Sampling'} - module)}, "
                        f"module only {sorted(module - top)}")
    for name, members in stub.items():
        if members is None or name == "_Sampling":
            continue
        obj = _core.sampling if name.startswith("_Sampling.") else _core
        cls = getattr(obj, name.split(".")[-1], None)
        if cls is None:
            continue
        if members != _public(cls):
            problems.append(f"{name}: stub {sorted(members)} vs module {sorted(_public(cls))}")
    if stub.get("_Sampling") != {n for n in dir(_core.sampling) if not n.startswith("_")}:
        problems.append("_Sampling: the stub's members are not the submodule's")

    fns, classes = _defs(tree.body)
    for fname, nodes in fns.items():
        if hasattr(_core, fname):
            problems += _signature_problems(fname, [_stub_params(f, False) for f in nodes],
                                            _module_signatures(getattr(_core, fname)))

    def walk(classes, owner, where, module_level_self=False):
        for cname, node in classes.items():
            cls = getattr(owner, cname, None) if cname != "_Sampling" else _core.sampling
            if cls is None:
                continue
            methods, inner = _defs(node.body)
            for mname, nodes in methods.items():
                member = getattr(cls, mname, None)
                if member is None or (mname == "__init__" and "__init__" not in _public(cls)):
                    continue
                if mname.startswith("__") and mname != "__init__":
                    continue  # protocol methods: pybind11 writes no signature the stub could follow
                problems.extend(_signature_problems(f"{where}{cname}.{mname}",
                                                    [_stub_params(f, True) for f in nodes],
                                                    _module_signatures(member)))
            if isinstance(cls, type) and hasattr(cls, "FIELDS"):
                problems.extend(_struct_problems(f"{where}{cname}", node, cls))
            walk(inner, cls, f"{where}{cname}.")

    walk(classes, _core, "")
    return problems


def test_stub_matches_the_module():
    """The stub's names, every function's and method's parameters (names, kinds,
    defaults; pybind11 writes them on the docstring's first line, one line per
    overload) and every bound struct's fields agree with the module."""
    problems = _stub_differences(STUB.read_text(encoding="utf-8"))
    assert not problems, "the stub pyspec/_core.pyi disagrees with the module:\n" + "\n".join(problems)


def _broken_stub(pattern: str, replacement: str) -> str:
    text = STUB.read_text(encoding="utf-8")
    broken = re.sub(pattern, replacement, text, count=1)
    assert broken != text, pattern
    return broken


def test_stub_detects_a_missing_member():
    """Negative control: a stub without one method must fail the comparison."""
    problems = _stub_differences(_broken_stub(r"\n    def verify_cost\(.*?\n", "\n"))
    assert any(p.startswith("AutoPolicy:") for p in problems), problems


@pytest.mark.parametrize("pattern, replacement, what", [
    (r"(def truncate\(self, pos: int, seq: int = )0", r"\g<1>1", "Model.truncate: default of seq"),
    (r"(def decode\(self, tokens: Sequence\[int\], pos0: int, )n_logits", r"\g<1>n_rows", "Model.decode: parameters"),
    (r"(class NgramDrafter\(Drafter\):\n    def __init__\(self, n_vocab: int, n_min: int = 1, )n_max",
     r"\g<1>max_n", "NgramDrafter.__init__: parameters"),
    (r"(def propose\(self, history: Sequence\[int\], max_n: int)\)", r"\g<1> = 4)", "propose: default of max_n"),
    (r'(variant: str = "correct", storage: str = )"auto"', r'\g<1>"dense"', "_Sampling.verify_many: default of storage"),
    (r"(\n    seed: )int\n", r"\g<1>str\n", "SequenceParams.seed: str in the stub"),
])
def test_stub_detects_a_wrong_signature(pattern, replacement, what):
    """Negative controls: a wrong default (also in the sampling submodule), a
    renamed parameter, a default the module lacks, a field of the wrong type
    must each fail the comparison."""
    problems = _stub_differences(_broken_stub(pattern, replacement))
    assert any(what in p for p in problems), problems


def test_python_reads_names_and_defaults_from_the_core():
    assert list(POLICIES) == [p["name"] for p in _core.policies()]
    assert list(DRAFTERS) == [d["name"] for d in _core.drafters()]
    for name, info in POLICIES.items():
        assert _core.make_policy(_core.PolicyParams(name=name)).draft_max == info["default_draft_max"]
    assert GenerationStats.FIELDS[:-1] == tuple(_core.GenerationStats.FIELDS)
    assert py_sampling.VARIANTS == tuple(_core.sampling.VARIANTS)


def test_test_controls_are_one_typed_value():
    """pyspec.testing.TestControls: validated, JSON for `serve --test-controls`,
    one native part; anything else as `_test=` is a TypeError naming it."""
    from pyspec.testing import TestControls, controls

    assert TestControls(variant="residual_is_p").breaks_output and TestControls(grammar="stale").breaks_output
    assert not TestControls(pit=True).breaks_output and not TestControls(slot_choice="lowest").breaks_output
    wrong = TestControls(variant="accept_all", grammar="unmasked", shared_stream=True, pit=True)
    assert TestControls.from_json(wrong.to_json()) == wrong
    native = wrong.native()
    assert (native.variant, native.grammar, native.shared_stream, native.pit) == ("accept_all", "unmasked", True, True)
    with pytest.raises(ValueError, match="variant"):
        TestControls(variant="nope")
    with pytest.raises(ValueError, match="slot_choice"):
        TestControls(slot_choice="nope")
    with pytest.raises(TypeError, match="pyspec.testing.TestControls, not builtins.dict"):
        controls({"variant": "accept_all"})
    assert controls(None) == TestControls()


def test_struct_keywords_are_checked():
    with pytest.raises(TypeError, match="unexpected argument 'nope'"):
        _core.SequenceParams(nope=1)
    with pytest.raises(ValueError, match="top_p"):
        _core.SamplingParams(top_p=0.0)
    p = _core.SessionParams(prefill_chunk=7, test=_core.TestControls(variant="accept_all", grammar="stale"))
    assert p.prefill_chunk == 7 and p.test.variant == "accept_all" and p.to_dict()["prefill_chunk"] == 7
    assert p.test.grammar == "stale" and _core.TestControls().grammar == "off"
    with pytest.raises(ValueError, match="variant"):
        p.test.variant = "nope"
    with pytest.raises(ValueError, match="grammar control"):
        p.test.grammar = "nope"
