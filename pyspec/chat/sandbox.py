"""The sandbox chat templates render in: Jinja's immutable sandbox within
bounds of time and size (the one owner of those bounds).

Over 400 lines on purpose: the compile-time checks (a code generator that
wraps every operator, call and frame) and the run-time bounds they call must
agree rule for rule, so one file holds both and a reviewer reads each bound once.

Templates are untrusted input (any GGUF file, any ``--chat-template``).
Jinja's ``ImmutableSandboxedEnvironment`` refuses mutation of the values passed
in and access to Python internals (here an error, where Jinja gives an empty
Undefined; ``lipsum``, which loops on its own, is not offered), but it has no
bounds: a template that loops for ever would hang transformers or
llama-server. :func:`render` stops a render with :class:`ChatTemplateError`

* after ``RENDER_SECONDS``: the compiled template checks the deadline as each
  frame starts (the render, each loop iteration, macro call and block: Jinja
  has no other way to repeat), as does every call and filter; once past it
  the render fails even if something caught the error;
* before any value it builds would pass ``MAX_SIZE`` characters or items
  (nested items counted): operators (``+ * ** %``, ``~``), list, tuple and
  dict literals, calls, filters and ``format`` are checked, those that can
  multiply sizes (``*``, ``**``, padding widths, ``replace``, ``join``,
  ``indent``, ``expandtabs``, ``format``, ``tojson(indent)``) before they
  run, and no number above ``MAX_SIZE`` may be passed to a call or filter;
  every ``{{ value }}`` is sized before it becomes text; integer arithmetic
  (any operator) on or into more than ``MAX_INT_BITS`` bits is refused before
  it runs (its time grows faster than its size); and the rendered
  text, and every block's or macro's output as it is written, is capped at
  ``MAX_SIZE``.

Where: ``_BoundedCodeGenerator`` compiles the deadline checks, the sizing of
literals and ``~`` and the capped output buffers into the template;
``_BoundedEnvironment`` sizes operators and calls; ``_bounded_filter`` wraps
every filter; ``_finalize`` sizes printed values. A render's deadline and
size cache are its ``_Budget``, found through a context variable.

Why not ``sys.settrace``: a tracer checking the deadline did the same job,
measured about 12 times slower than a render with the checks compiled in.

What a template sees (its variables, filters, globals, extensions) is the
renderer's business: :mod:`pyspec.chat.templates` gives them to :func:`environment`.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import re
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import jinja2
from jinja2.compiler import CodeGenerator
from jinja2.runtime import Namespace
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template does not compile, or refused these messages (``raise_exception``),
    or a render stopped at a bound. Defined here, where the bounds raise it (one
    import direction: :mod:`pyspec.chat.templates` uses this module); the public name is
    ``pyspec.chat.ChatTemplateError``."""


class OverLimit(ChatTemplateError):
    """A render stopped at a bound (time or size); its message says which."""


#: Seconds one render may run; characters or items any value it builds may hold
#: (nested items counted), its output included.
RENDER_SECONDS = 2.0
MAX_SIZE = 1 << 22
MAX_INT_BITS = 1 << 16  # about 20,000 digits: arithmetic past it is refused (_check_int_bits)


class _Budget:
    """One render's bounds: its deadline, and the sizes of the large containers
    it has seen (by id, holding them so that ids stay theirs) so that a value
    built from earlier ones costs only its own items to size. Without the cache
    sizing stays linear: a walk stops once past MAX_SIZE."""

    #: Containers smaller than this are sized by walking them again (the cache
    #: holds what it sizes: it must not keep a loop's small garbage alive).
    CACHE_FROM = 1024

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.deadline = time.monotonic() + RENDER_SECONDS
        self.expired = False
        self._sizes: Dict[int, Tuple[int, int, Any]] = {}
        self._cached = 0  # their sizes summed: cleared past MAX_SIZE, so what it keeps alive is bounded

    def fail(self, what: str):
        raise OverLimit(f"{self.origin} {what}")

    def check_time(self) -> None:
        if self.expired or time.monotonic() > self.deadline:
            self.expired = True  # for good: the render cannot swallow the error and go on
            self.fail(f"ran longer than {RENDER_SECONDS:g} s (a loop that does not end?)")

    def size(self, value: Any) -> Tuple[int, int]:
        """(size, depth): characters of a string, digits of an int, items of a
        container with its items' sizes (capped just past MAX_SIZE)."""
        if isinstance(value, str):
            return len(value), 0
        if isinstance(value, int):
            return value.bit_length() // 3 + 1, 0
        if isinstance(value, Namespace):  # its repr shows what it holds
            value = object.__getattribute__(value, "_Namespace__attrs")
        if not isinstance(value, (list, tuple, dict, set, frozenset)):
            return 1, 0
        known = self._sizes.get(id(value))
        if known is not None:
            return known[0], known[1]
        total, depth = len(value) + 1, 0
        for item in (itertools.chain.from_iterable(value.items()) if isinstance(value, dict) else value):
            n, d = self.size(item)
            total, depth = total + n, max(depth, d + 1)
            if total > MAX_SIZE:
                break
        if total >= self.CACHE_FROM:
            self._cached += total
            if self._cached > MAX_SIZE:
                self._sizes.clear()
                self._cached = total
            self._sizes[id(value)] = (total, depth, value)
        return total, depth

    def text(self, value: Any) -> int:
        """An upper bound on the length of ``str(value)`` (repr escapes included)."""
        n = self.size(value)[0]
        return n if isinstance(value, (str, int)) else 10 * n

    def need(self, n: int, what: str) -> None:
        if n > MAX_SIZE:
            self.fail(f"would build a value of {n:,} characters or items by {what} (at most {MAX_SIZE:,})")

    def built(self, value: Any, what: str) -> Any:
        self.need(self.size(value)[0], what)
        return value


_budget: contextvars.ContextVar[Optional[_Budget]] = contextvars.ContextVar("pyspec_chat_budget", default=None)


def _current() -> _Budget:
    # Outside render (Jinja folding constants while it compiles): sizes alone.
    return _budget.get() or _Budget("the chat template")


_WIDTH = re.compile(r"\d+")


def _format_bound(budget: _Budget, fmt: str, marker: str, values: Iterable[Any]) -> int:
    """An upper bound on the length of ``fmt`` (printf ``%`` or ``str.format``)
    filled with ``values``: each field at most the widest value, or the widest
    width written in ``fmt`` or passed as an int."""
    values = list(values)
    widths = [int(w) if len(w) < 10 else MAX_SIZE + 1 for w in _WIDTH.findall(fmt)]
    widths += [abs(v) for v in values if isinstance(v, int)]
    widest = max([budget.text(v) for v in values] + [0])
    return len(fmt) + fmt.count(marker) * (widest + max(widths + [0]) + 1)


def _values(args: Any) -> List[Any]:
    if isinstance(args, dict):
        return list(args.values())
    return list(args) if isinstance(args, (tuple, list)) else [args]


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_int_bits(budget: _Budget, op: str, a: Any, b: Any) -> None:
    """Integer arithmetic costs more than linear time in the digits (a 3 ** 4000000
    divided by 7 ** 1000000 took 29 s, inside one operator, where no deadline is
    checked): operands and products past MAX_INT_BITS are refused before they run."""
    if not (_int(a) or _int(b)):
        return
    bits = max(a.bit_length() if _int(a) else 0, b.bit_length() if _int(b) else 0)
    if op == "*" and _int(a) and _int(b):
        bits = a.bit_length() + b.bit_length()
    elif op == "**" and _int(a) and _int(b):
        bits = a.bit_length() * max(b, 0) if b > 1 else a.bit_length()
    if bits > MAX_INT_BITS:
        budget.fail(f"builds an integer of more than {MAX_INT_BITS} bits with '{op}'")


def _binop_bound(budget: _Budget, op: str, a: Any, b: Any) -> Optional[int]:
    """The size of ``a op b`` where an operator can multiply sizes, before it runs."""
    if op == "*":
        if isinstance(a, int) and not isinstance(b, int):
            a, b = b, a
        if isinstance(b, int) and isinstance(a, (str, list, tuple)):
            return budget.size(a)[0] * max(b, 0)
        if isinstance(a, int) and isinstance(b, int):
            return budget.size(a)[0] + budget.size(b)[0]
    elif op == "**" and isinstance(a, int) and isinstance(b, int):
        return budget.size(a)[0] * max(b, 0)
    elif op == "+" and isinstance(a, (str, list, tuple)):
        return budget.size(a)[0] + budget.size(b)[0]
    elif op == "%" and isinstance(a, str):
        return _format_bound(budget, a, "%", _values(b))
    return None


def _padded(s: str, width: Any = 0, *rest: Any) -> int:
    return max(len(s), width if isinstance(width, int) else 0)


#: str methods that can return much more than they are given: the size of the result, before it runs.
_STR_BOUNDS: Dict[str, Callable[..., int]] = {
    "ljust": _padded, "rjust": _padded, "center": _padded, "zfill": _padded,
    "expandtabs": lambda s, tabsize=8: len(s) + s.count("\t") * max(tabsize, 0),
    "replace": lambda s, old, new, count=-1: len(s) + max(len(new) - len(old), 0) * (
        len(s) + 1 if not old else s.count(old)),
    "join": lambda s, items: len(s) * len(items) + sum(len(x) for x in items if isinstance(x, str)),
    "translate": lambda s, table: len(s) * max([len(v) for v in getattr(table, "values", list)()
                                                if isinstance(v, str)] + [1]),
}


def _filter_bound(budget: _Budget, name: str, args: tuple, kwargs: dict) -> Optional[int]:
    """The size of a filter's result where it can multiply sizes, before it runs."""
    value = args[0] if args else ""
    text = budget.text(value)
    if name == "indent":
        width = kwargs.get("width", args[1] if len(args) > 1 else 4)
        width = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        return text + (str(value).count("\n") + 1) * width if text <= MAX_SIZE else text
    if name == "center":
        width = kwargs.get("width", args[1] if len(args) > 1 else 80)
        return max(text, width if isinstance(width, int) else 0)
    if name == "join":
        sep = str(kwargs.get("d", args[1] if len(args) > 1 else ""))
        if isinstance(value, (list, tuple)):
            return sum(budget.text(x) for x in value) + len(sep) * len(value)
        return text + len(sep) * budget.size(value)[0]
    if name == "replace":
        old = kwargs.get("old", args[1] if len(args) > 1 else "")
        new = kwargs.get("new", args[2] if len(args) > 2 else "")
        if isinstance(value, str) and isinstance(old, str) and isinstance(new, str):
            return _STR_BOUNDS["replace"](value, old, new)
        return text * (len(str(new)) + 1)
    if name == "wordwrap":
        width = kwargs.get("width", args[1] if len(args) > 1 else 79)
        wrap = kwargs.get("wrapstring", args[3] if len(args) > 3 else None) or "\n"
        return text + (text // max(width, 1) + 1 if isinstance(width, int) else text) * len(str(wrap))
    if name == "format":
        return _format_bound(budget, str(value), "%", list(args[1:]) + list(kwargs.values()))
    if name == "tojson":  # JSON escapes a character in at most 6; an indent repeats per line and level
        indent = kwargs.get("indent", args[2] if len(args) > 2 else None)
        size, depth = budget.size(value)
        width = indent if isinstance(indent, int) else len(indent) if isinstance(indent, str) else 0
        return 6 * size + (_items(value) * width * depth if width else 0)
    return None


def _items(value: Any, limit: int = MAX_SIZE) -> int:
    """Values in ``value`` (containers and scalars: lines of its indented JSON), counted up to ``limit``."""
    count, stack = 0, [value]
    while stack and count <= limit:
        v = stack.pop()
        count += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return count


def _check_ints(budget: _Budget, args: Iterable[Any]) -> None:
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_SIZE:
            budget.fail(f"passed {a:,} to a call (numbers given to calls are at most {MAX_SIZE:,})")


def _bounded_filter(name: str, f: Callable) -> Callable:
    passes_first = getattr(f, "jinja_pass_arg", None) is not None  # Jinja's context, eval context or environment

    @functools.wraps(f)  # keeps that mark
    def filtered(*args, **kwargs):
        budget = _current()
        budget.check_time()
        given = args[1:] if passes_first else args
        _check_ints(budget, list(given) + list(kwargs.values()))
        bound = _filter_bound(budget, name, given, kwargs)
        if bound is not None:
            budget.need(bound, f"the filter {name}")
        return budget.built(f(*args, **kwargs), f"the filter {name}")

    return filtered


class _OutputBuffer(list):
    """A macro's or block's output as it is written, capped at MAX_SIZE then
    (not only once the macro returns: its loops could fill memory first)."""

    __slots__ = ("_total",)

    def __init__(self) -> None:
        super().__init__()
        self._total = 0

    def append(self, piece: str) -> None:
        self._total += len(piece)
        if self._total > MAX_SIZE:
            _current().fail(f"would write more than {MAX_SIZE:,} characters")
        super().append(piece)

    def extend(self, pieces: Iterable[str]) -> None:
        for piece in pieces:
            self.append(piece)


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator, with literals and ``~`` sized by the render's
    budget, and its deadline checked where each frame starts (the render, each
    loop iteration, macro call, block)."""

    def enter_frame(self, frame) -> None:
        super().enter_frame(frame)
        self.writeline("environment.tick()")

    def buffer(self, frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.output_buffer()")

    def _sized(self, visit, node, frame) -> None:
        if getattr(node, "ctx", "load") != "load":  # an assignment target: as it is
            return visit(node, frame)
        self.write("environment.sized(")
        visit(node, frame)
        self.write(")")

    def visit_List(self, node, frame) -> None:
        self._sized(super().visit_List, node, frame)

    def visit_Tuple(self, node, frame) -> None:
        self._sized(super().visit_Tuple, node, frame)

    def visit_Dict(self, node, frame) -> None:
        self._sized(super().visit_Dict, node, frame)

    def visit_Concat(self, node, frame) -> None:
        self.write("environment.joined((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with every operator, call, literal and output that
    can build a large value sized first (see the module's docstring)."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and type(left) is str and type(right) is str and len(left) + len(right) <= MAX_SIZE:
            return left + right  # what templates add most: text, as fast as the sandbox's own
        budget = _current()
        budget.check_time()
        _check_int_bits(budget, operator, left, right)
        bound = _binop_bound(budget, operator, left, right)
        if bound is not None:
            budget.need(bound, f"'{operator}'")
        return budget.built(super().call_binop(context, operator, left, right), f"'{operator}'")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's own names)
        budget = _current()
        budget.check_time()
        _check_ints(budget, list(args) + list(kwargs.values()))
        wrapped = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner, name = getattr(wrapped, "__self__", None), getattr(wrapped, "__name__", "")
        if isinstance(owner, str):
            if name in ("format", "format_map"):
                values = list(args) + list(kwargs.values())
                if name == "format_map" and args:
                    values = _values(args[0])
                budget.need(_format_bound(budget, owner, "{", values), f"str.{name}")
            elif name in _STR_BOUNDS:
                if name == "join" and args:
                    args = (list(args[0]),) + args[1:]
                try:
                    bound = _STR_BOUNDS[name](owner, *args, **kwargs)
                except TypeError:  # wrong arguments: the call itself says so
                    bound = 0
                budget.need(bound, f"str.{name}")
        return budget.built(super().call(__context, __obj, *args, **kwargs), f"a call of {name or __obj!r}")

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        """Reaching for Python's internals (``__class__``, ``_private``...) is an
        error, not the empty Undefined that Jinja's sandbox gives back."""
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    output_buffer = _OutputBuffer

    def tick(self) -> None:
        _current().check_time()

    def sized(self, value: Any) -> Any:
        return _current().built(value, "a literal")

    def joined(self, pieces: tuple) -> str:
        budget = _current()
        budget.need(sum(budget.text(p) for p in pieces), "'~'")
        return "".join(map(str, pieces))

    def concat(self, pieces: Iterable[Any]) -> str:  # type: ignore[override]
        """Jinja joins every output (the render's, a block's, a macro's) with
        this: the output is capped as it grows."""
        budget, out, total = _current(), [], 0
        for piece in pieces:
            total += len(piece)
            if total > MAX_SIZE:
                budget.fail(f"would write more than {MAX_SIZE:,} characters")
            out.append(piece)
        return "".join(out)


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}`` before it becomes text: containers sized first."""
    budget = _current()
    budget.need(budget.text(value), "printing a value")
    return value


def environment(*, filters: Optional[Mapping[str, Callable]] = None,
                functions: Optional[Mapping[str, Callable]] = None, **options: Any) -> ImmutableSandboxedEnvironment:
    """A bounded sandbox with Jinja's ``options`` (``trim_blocks``, ``extensions``...),
    Jinja's filters and ``filters`` all bounded, and ``functions`` added to its
    globals (calls to them bounded too); render its templates with :func:`render`."""
    env = _BoundedEnvironment(finalize=_finalize, **options)
    env.filters.update(filters or {})
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    # lipsum writes as many paragraphs as asked, in a loop of its own: not for chat templates.
    del env.globals["lipsum"]
    env.globals.update(functions or {})
    return env


def render(template: jinja2.Template, context: dict, origin: str) -> str:
    """``template`` (from :func:`environment`) rendered with ``context`` within the
    bounds (RENDER_SECONDS, MAX_SIZE); past one, :class:`OverLimit` names ``origin``."""
    budget = _Budget(origin)
    token = _budget.set(budget)
    try:
        text = template.render(context)
    finally:
        _budget.reset(token)
    budget.check_time()  # also after the last check: past the deadline is an error, however it ended
    return text
