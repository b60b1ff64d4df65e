"""Chat prompts as the model's own template writes them.

A GGUF file carries its chat template as Jinja source
(``tokenizer.chat_template``). llama-server, llama-cpp-python, transformers'
``apply_chat_template``, Ollama and LM Studio all render that source with
Jinja, so the same ``messages`` give the same prompt everywhere; pyspec does the
same. The rules, as llama-server applies them (common/chat.cpp) and
transformers defines them:

* variables: ``messages``, ``add_generation_prompt``, ``bos_token`` and
  ``eos_token`` (the tokens' text), ``tools`` when the request has them,
  ``raise_exception(msg)`` and ``strftime_now(fmt)``; as llama-server also
  ``enable_thinking`` (true), ``datetime`` and ``date_string`` (today), which
  the caller's variables (``chat_template_kwargs``) may replace;
* messages as llama-server passes them: role ``developer`` read as ``system``
  (not for GPT-OSS's template, which has both), a tool call's ``arguments``
  given as a JSON string parsed into an object;
* Jinja with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
  extension, ``{% generation %}`` passed through, and ``tojson`` as Python's
  ``json.dumps`` without ASCII escaping (Jinja's own escapes HTML);
* the text then goes through the tokenizer with its special tokens parsed and
  BOS added where the vocabulary asks; so a template that writes ``bos_token``
  itself has it removed first (and a trailing ``eos_token`` where the
  vocabulary adds EOS), or the prompt would hold two.

Templates are untrusted input (any GGUF file, any ``--chat-template``): they
run in Jinja's immutable sandbox, which refuses mutation of the values passed
in and access to Python internals (here an error, where Jinja gives an empty
Undefined; ``lipsum`` is not offered), and within bounds of time and size that
the sandbox lacks (a template that loops for ever would hang transformers or
llama-server). A render stops with :class:`ChatTemplateError`

* after ``RENDER_SECONDS``: the compiled template checks the deadline as each
  loop iteration, macro call and block starts (Jinja has no other way to
  repeat; a sys.settrace tracer did the same at ten times the cost of a
  render);
* before any value it builds would pass ``MAX_SIZE`` characters or items
  (nested items counted): operators (``+ * ** %``, ``~``), list, tuple and
  dict literals, calls, filters and ``format`` are checked, those that can
  multiply sizes (``*``, ``**``, padding widths, ``replace``, ``join``,
  ``indent``, ``expandtabs``, ``format``, ``tojson(indent)``) before they
  run, and no number above ``MAX_SIZE`` may be passed to a call or filter;
  the rendered text, and every block's or macro's output as it is written,
  is capped at ``MAX_SIZE``.

Files without a template get llama.cpp's built-in ChatML (``llama_chat_apply_template``,
as before), with one warning per file.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import json
import os
import re
import time
import warnings
from datetime import datetime
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import jinja2
import jinja2.ext
from jinja2.compiler import CodeGenerator
from jinja2.runtime import Namespace
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

Message = Mapping[str, Any]


class ChatTemplateError(ValueError):
    """The template does not compile, or refused these messages (``raise_exception``)."""


class _OverLimit(ChatTemplateError):
    """A render stopped at a bound (time or size); its message says which."""


class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` (marks assistant
    text for training masks): rendered as its contents."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
            separators: Optional[Tuple[str, str]] = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _parsed_arguments(call: Any) -> Any:
    """A tool call whose ``function.arguments`` is a JSON string (OpenAI's form),
    with the arguments as an object (what templates print with ``tojson``)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = json.loads(fn["arguments"])
    except ValueError as e:
        raise ChatTemplateError(f"a tool call's arguments are not JSON: {e}") from None
    return {**call, "function": {**fn, "arguments": args}}


# ---------------------------------------------------------------- bounds

#: Seconds one render may run; characters or items any value it builds may hold
#: (nested items counted), its output included.
RENDER_SECONDS = 2.0
MAX_SIZE = 1 << 22


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
        raise _OverLimit(f"{self.origin} {what}")

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
    # Outside _render (Jinja folding constants while it compiles): sizes alone.
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
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and type(left) is str and type(right) is str and len(left) + len(right) <= MAX_SIZE:
            return left + right  # what templates add most: text, as fast as the sandbox's own
        budget = _current()
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


def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, finalize=_finalize,
                              extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    # lipsum writes as many paragraphs as asked, in a loop of its own: not for chat templates.
    del env.globals["lipsum"]
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    return env


def _render(template: jinja2.Template, context: dict, origin: str) -> str:
    """``template`` rendered within the bounds (RENDER_SECONDS, MAX_SIZE)."""
    budget = _Budget(origin)
    token = _budget.set(budget)
    try:
        text = template.render(context)
    finally:
        _budget.reset(token)
    if budget.expired:  # the time ran out, and something caught the error: still an error
        budget.check_time()
    return text


#: Names a caller's variables may not take: the renderer's own and Jinja's globals.
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
                     | set(_environment().globals))


class ChatTemplate:
    """A model's chat template: Jinja ``source`` (None: llama.cpp's built-in
    ChatML via ``builtin``), rendered with the token texts and BOS/EOS rules of
    the model's vocabulary. ``origin`` names where the source came from, for errors."""

    def __init__(self, source: Optional[str], *, bos_token: str, eos_token: str, add_bos: bool, add_eos: bool,
                 origin: str, builtin: Optional[Callable[[List[Tuple[str, str]], bool], str]] = None) -> None:
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        self.add_bos, self.add_eos = add_bos, add_eos
        self.origin = origin
        self._builtin = builtin
        self._compiled: Optional[jinja2.Template] = None
        self._warned = False

    @classmethod
    def of_model(cls, core, *, override: Union[str, os.PathLike, None] = None) -> "ChatTemplate":
        """The template of ``core`` (a ``pyspec._core.Model``): ``override`` (a
        file path, or the template's source), else the file's own, else the built-in."""
        origin = f"the chat template of {core.path}"
        raw = core.chat_template
        source = raw.decode("utf-8", errors="replace") if raw is not None else None
        if override is not None:
            source, origin = read_override(override)

        def piece(token: int) -> str:
            return core.token_to_piece(token, True).decode("utf-8", errors="replace") if token >= 0 else ""

        return cls(source, bos_token=piece(core.bos), eos_token=piece(core.eos), add_bos=core.add_bos,
                   add_eos=core.add_eos, origin=origin, builtin=core.apply_chat_template)

    @property
    def is_builtin(self) -> bool:
        return self.source is None

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
               tools: Optional[Sequence[Mapping[str, Any]]] = None,
               variables: Optional[Mapping[str, Any]] = None) -> str:
        """The prompt text of ``messages`` ({"role", "content", ...} dicts), ready for
        the tokenizer (special tokens parsed, BOS added as the vocabulary asks).

        A chat that ends with an assistant message is a prefill, as llama-server
        reads it: the model continues that message (the chat before it, the
        assistant's opening, then its text). ``variables`` go to the template
        too (``chat_template_kwargs``, e.g. ``enable_thinking``)."""
        if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
            raise ChatTemplateError("every message must be a mapping with a 'role' string")
        if add_generation_prompt and messages and messages[-1].get("role") == "assistant":
            if len(messages) >= 2 and messages[-2].get("role") == "assistant":
                raise ChatTemplateError("a chat cannot end with two assistant messages")
            content = messages[-1].get("content") or ""
            if messages[-1].get("tool_calls"):
                raise ChatTemplateError("an assistant message with tool calls cannot be continued")
            if not isinstance(content, str):
                raise ChatTemplateError("an assistant prefill must be text")
            return self.render(messages[:-1], tools=tools, variables=variables) + content
        if self.source is None:
            return self._render_builtin(messages, add_generation_prompt)
        taken = sorted(set(variables or ()) & RESERVED)
        if taken:
            raise ChatTemplateError(f"the template variable '{taken[0]}' is the renderer's own")
        now = datetime.now()
        context: dict = {"enable_thinking": True, "datetime": now.strftime("%b %d %Y"),
                         "date_string": now.strftime("%d %b %Y")}
        context.update(variables or {})
        context.update(messages=[self._message(m) for m in messages], add_generation_prompt=add_generation_prompt,
                       bos_token=self.bos_token, eos_token=self.eos_token)
        if tools:
            context["tools"] = [dict(t) for t in tools]
        try:
            text = _render(self._template(), context, self.origin)
        except _OverLimit as e:
            raise ChatTemplateError(str(e)) from None
        except ChatTemplateError as e:
            raise ChatTemplateError(f"{self.origin} refused the messages: {e}") from None
        except Exception as e:  # whatever a hostile template or odd values raise: the caller's error
            raise ChatTemplateError(f"{self.origin} failed: {type(e).__name__}: {e}") from None
        # The tokenizer adds BOS (EOS) itself where the vocabulary asks: not twice.
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[:-len(self.eos_token)]
        return text

    def _message(self, m: Message) -> dict:
        m = dict(m)
        if m.get("role") == "developer" and "<|channel|>" not in self.source:
            m["role"] = "system"
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            m["tool_calls"] = [_parsed_arguments(c) for c in calls]
        return m

    def check(self) -> None:
        """Raise :class:`ChatTemplateError` now if the template does not compile."""
        if self.source is not None:
            self._template()

    def _template(self) -> jinja2.Template:
        if self._compiled is None:
            try:
                self._compiled = _environment().from_string(self.source)
            except jinja2.TemplateError as e:
                raise ChatTemplateError(f"{self.origin} does not compile ({type(e).__name__}: {e}); "
                                        f"give another with --chat-template FILE") from None
        return self._compiled

    def _render_builtin(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        if self._builtin is None:
            raise ChatTemplateError(f"{self.origin}: no template")
        if not self._warned:
            self._warned = True
            warnings.warn(f"{self.origin.replace('the chat template of ', '')} has no chat template: "
                          f"using llama.cpp's built-in ChatML (--chat-template FILE gives one)", stacklevel=3)
        pairs = []
        for m in messages:
            content = m.get("content")
            if not isinstance(content, str):
                raise ChatTemplateError("the built-in template takes text content only")
            pairs.append((m["role"], content))
        return self._builtin(pairs, add_generation_prompt)


def read_override(value: Union[str, os.PathLike]) -> Tuple[str, str]:
    """``(source, origin)`` of a ``--chat-template`` value: a path (PathLike, or
    a string naming an existing file), else the template's source itself."""
    if isinstance(value, os.PathLike) or (isinstance(value, str) and "{" not in value and os.path.isfile(value)):
        path = os.fspath(value)
        try:
            with open(path, encoding="utf-8") as f:
                return f.read(), f"the chat template {path}"
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"cannot read the chat template {path}: {e}") from None
    if not isinstance(value, str) or "{" not in value:
        raise ChatTemplateError(f"chat_template: {value!r} is neither a file nor Jinja source")
    return value, "the chat template given"
