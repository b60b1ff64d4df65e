"""Chats become the prompt that the model's own template gives everywhere else.

The reference is independent of pyspec's code: llama-cpp-python reads the GGUF
(its own reader of ``tokenizer.chat_template`` and the BOS/EOS tokens), renders
the template with its own Jinja formatter (the one its server uses), and
tokenizes the text with its own bindings; BOS is handled as llama-server does
(a template that writes ``bos_token`` loses it, the tokenizer adds it where
the vocabulary asks). A file without a template is held to llama-server's
fallback, ChatML rendered by Jinja. An assistant prefill is held to
transformers' ``continue_final_message``: the chat rendered without the
generation prompt, cut after the final message's text.

Negative control: llama.cpp's built-in approximation (``llama_chat_apply_template``,
pyspec's renderer before) must fail the same comparison on Qwen, whose template
adds a default system message that the approximation leaves out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from pathlib import Path

import pytest
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from pyspec.chat import ChatTemplate, ChatTemplateError

# llama-server's fallback for files without a template (common/chat.cpp, CHATML_TEMPLATE_SRC).
CHATML = ("{%- for message in messages -%}\n"
          "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
          "{%- endfor -%}\n"
          "{%- if add_generation_prompt -%}\n"
          "  {{- '<|im_start|>assistant\\n' -}}\n"
          "{%- endif -%}")

# The chats, and llama-server's renderings of them: tests/fixtures/chat_renderings (capture.py made them).
GOLDEN = Path(__file__).parent / "fixtures" / "chat_renderings"
_spec = importlib.util.spec_from_file_location("chat_renderings_capture", GOLDEN / "capture.py")
capture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(capture)
TOOLS, CHATS = capture.TOOLS, capture.CHATS


class Reference:
    """llama-cpp-python's view of a GGUF: its template, tokens and tokenizer."""

    def __init__(self, path: str) -> None:
        self.llm = Llama(model_path=path, vocab_only=True, verbose=False)
        model = self.llm._model
        self.source = self.llm.metadata.get("tokenizer.chat_template") or CHATML
        self.bos = model.token_get_text(self.llm.token_bos()) if self.llm.token_bos() >= 0 else ""
        self.eos = model.token_get_text(self.llm.token_eos()) if self.llm.token_eos() >= 0 else ""
        self.add_bos = model.add_bos_token()

    def text(self, messages, tools) -> str:
        prefill = messages[-1]["role"] == "assistant"
        fmt = Jinja2ChatFormatter(self.source, eos_token=self.eos, bos_token=self.bos,
                                  add_generation_prompt=not prefill)
        text = fmt(messages=messages, tools=tools).prompt
        if prefill:  # transformers' continue_final_message
            final = messages[-1]["content"]
            text = text[:text.rindex(final) + len(final)]
        if self.add_bos and self.bos and text.startswith(self.bos):
            text = text[len(self.bos):]
        return text

    def tokens(self, messages, tools):
        return self.llm.tokenize(self.text(messages, tools).encode(), add_bos=self.add_bos, special=True)


def mismatches(model, ref: Reference, render) -> list:
    """Names of the chats whose prompt tokens differ from the reference's."""
    bad = []
    for name, (messages, tools) in CHATS.items():
        if tools is not None and "tools" not in ref.source:
            continue  # a template that shows no tools
        ours = model.tokenize(render(messages, tools), add_special=True, parse_special=True)
        if ours != ref.tokens(messages, tools):
            bad.append(name)
    return bad


def builtin(model):
    return lambda messages, tools: model.native.apply_chat_template(
        [(m["role"], m["content"]) for m in messages], True)


@pytest.mark.parametrize("which", ["target", "draft"])
def test_default_models_render_their_own_template(which, target_path, draft_path, load_model):
    model = load_model(target_path if which == "target" else draft_path, n_ctx=1024, seed=1)
    ref = Reference(model.path)
    assert not model.chat_template.is_builtin and model.chat_template.source == ref.source
    assert mismatches(model, ref, lambda m, t: model.apply_chat_template(m, tools=t)) == []
    # prompt_tokens (what generate and the server send) is the same rendering.
    messages, tools = CHATS["tools"]
    assert model.prompt_tokens(messages, tools=tools) == ref.tokens(messages, tools)
    assert model.prompt_tokens("Hello?") == ref.tokens([{"role": "user", "content": "Hello?"}], None)
    # Negative control: the old built-in renderer fails the same comparison.
    assert "no system" in mismatches(model, ref, builtin(model))


def test_file_without_template_uses_chatml_as_llama_server(gemma):
    ref = Reference(gemma.path)
    assert ref.source is CHATML and gemma.chat_template.is_builtin
    with pytest.warns(UserWarning, match="no chat template"):
        assert mismatches(gemma, ref, lambda m, t: gemma.apply_chat_template(m)) == []


def _template(source, **kw) -> ChatTemplate:
    args = dict(bos_token="<s>", eos_token="</s>", add_bos=True, add_eos=False, origin="test")
    return ChatTemplate(source, **{**args, **kw})


def test_bos_written_by_the_template_is_not_doubled():
    t = _template("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    assert t.render([{"role": "user", "content": "x"}]) == "x"
    assert _template(t.source, add_bos=False).render([{"role": "user", "content": "x"}]) == "<s>x"


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",            # reach Python's internals
    "{{ messages.append({'role': 'user'}) }}",                    # mutate the request
    "{{ raise_exception('roles must alternate') }}",              # the template's own refusal
    "{% for m in messages %}{{ m.content }}",                     # does not compile
])
def test_untrusted_templates_fail_cleanly(source):
    with pytest.raises(ChatTemplateError):
        _template(source).render([{"role": "user", "content": "x"}])
    assert issubclass(ChatTemplateError, ValueError)  # the server answers 400, the CLI prints it


def test_tojson_keeps_unicode_and_html():
    # transformers' tojson (llama-server's too): no ASCII or HTML escaping (Jinja's own escapes <>&').
    text = _template("{{ tools | tojson }}").render([], add_generation_prompt=False, tools=TOOLS)
    assert text == json.dumps(TOOLS, ensure_ascii=False) and "°C) <b>&'" in text


@pytest.mark.parametrize("variables", [{"namespace": 1}, {"raise_exception": 0}, {"messages": []}])
def test_variables_cannot_replace_the_renderers_own(variables):
    t = _template("{% set ns = namespace(x=1) %}{{ ns.x }}{{ messages | length }}")
    with pytest.raises(ChatTemplateError):
        t.render([{"role": "user", "content": "x"}], variables=variables)
    # Names of Python's render() machinery are plain variables (no TypeError, no 500).
    assert t.render([{"role": "user", "content": "x"}], variables={"self": 1, "enable_thinking": False}) == "11"


def test_odd_values_fail_as_chat_errors():
    # tojson of an undefined value (a tool call without arguments under Qwen-like templates)
    t = _template("{% for m in messages %}{{ m.tool_calls[0].function.arguments | tojson }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="TypeError"):
        t.render([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}],
                 add_generation_prompt=False)


def test_messages_as_llama_server_passes_them():
    t = _template("{% for m in messages %}{{ m.role }}:{{ m.tool_calls[0].function.arguments.city "
                  "if m.tool_calls else m.content }};{% endfor %}{{ enable_thinking }}")
    chat = [{"role": "developer", "content": "be brief"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Bern"}'}}]}]
    assert t.render(chat, add_generation_prompt=False) == "system:be brief;assistant:Bern;True"
    with pytest.raises(ChatTemplateError, match="not JSON"):
        t.render([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{oops"}}]}],
                 add_generation_prompt=False)
    with pytest.raises(ChatTemplateError, match="tool calls cannot be continued"):
        t.render([{"role": "user", "content": "q"}, chat[1]])


def test_server_request_fields_for_templates():
    from pyspec.wire.openai import APIError, parse

    def chat(**extra):
        return parse("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                        {"type": "text", "text": "b"}]}], **extra},
                     max_n=4, policies=["auto"], drafters=["suffix"], max_draft=8)

    req = chat(tools=TOOLS, tool_choice="auto", chat_template_kwargs={"enable_thinking": False})
    assert req.tools == TOOLS and req.template_vars == {"enable_thinking": False}
    assert req.prompts[0][0]["content"] == "a\nb"  # parts joined as llama-server joins them
    for bad in (dict(chat_template_kwargs={"namespace": 1}), dict(chat_template_kwargs=[1]), dict(tools="x"),
                dict(tool_choice="required")):
        with pytest.raises(APIError) as e:
            chat(**bad)
        assert e.value.status == 400


@pytest.mark.parametrize("messages", [["hi"], [{"content": "no role"}], [{"role": 1, "content": "x"}]])
def test_malformed_messages_are_chat_errors(messages):
    for template in (_template("{{ messages | length }}"), _template(None, builtin=lambda pairs, add: "")):
        with pytest.raises(ChatTemplateError, match="'role'"):
            template.render(messages)


def test_two_final_assistant_messages_are_refused():
    with pytest.raises(ChatTemplateError, match="two assistant"):
        _template("x").render([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}])


def test_chat_template_override_from_the_cli(tmp_path, gemma_path):
    from click.testing import CliRunner

    from pyspec.cli import main

    path = tmp_path / "t.jinja"
    path.write_text("{{ raise_exception('custom template was used') }}")
    out = CliRunner().invoke(main, ["generate", "hi", "-m", gemma_path, "-n", "2", "--chat-template", str(path),
                                    "--n-ctx", "256"])
    assert out.exit_code != 0 and "custom template was used" in out.output
    assert "Traceback" not in out.output


# Golden renderings: llama-server's POST /apply-template of every chat, captured by
# tests/fixtures/chat_renderings/capture.py (its docstring has the command), held here
# byte for byte in CI, where no llama-server is built.
PATH_FIXTURES = {"target": "target_path", "draft": "draft_path", "test": "gemma_path"}
N_CTX = {"target": 1024, "draft": 1024, "test": 512}  # as the other tests load them: one load each


#: Chats where pyspec's text is known to differ from llama-server's, by fixture
#: (a fix makes the test fail until the entry goes). None now: the golden files
#: found one (a file without a template kept the role "developer", where
#: llama-server's ChatML fallback says "system"), and it was fixed.
KNOWN_DIFFERENCES: dict = {}


def golden(name: str) -> dict:
    with open(GOLDEN / f"{name}.json", encoding="utf-8") as f:
        return json.load(f)


def golden_mismatches(render, data: dict) -> list:
    """(chat, ours, llama-server's) for each chat whose text differs from the golden file's."""
    bad = []
    for r in data["renderings"]:
        try:
            ours = render(r["messages"], r["tools"])
        except Exception as e:  # a naive renderer's error (the negative controls): a mismatch
            ours = f"{type(e).__name__}: {e}"
        if ours != r["prompt"]:
            bad.append((r["chat"], ours, r["prompt"]))
    return bad


def pyspec_renderer(role, source, request, load_model):
    """pyspec's rendering on the model of ``role``: the file's own template, or
    ``source`` given as --chat-template / Model(chat_template=) gives it."""
    model = load_model(request.getfixturevalue(PATH_FIXTURES[role]), n_ctx=N_CTX[role], seed=1)
    template = ChatTemplate.of_model(model.native, override=source)  # what Model builds; its own warning state

    def render(messages, tools):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the test model has no template: ChatML, with a warning
            return template.render(messages, tools=tools)
    return model, render


def test_golden_files_are_what_capture_py_makes():
    """One file per template of capture.py, holding its chats and template now
    (a chat or template changed without recapturing fails here)."""
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(capture.jobs())
    for name, (role, source, chats) in capture.jobs().items():
        data = golden(name)
        assert data["model"] == capture.MODELS[role] and data["captured_by"] == capture.COMMAND
        assert [(r["chat"], r["messages"], r["tools"]) for r in data["renderings"]] == \
            [(chat, messages, tools) for chat, (messages, tools) in chats.items()], name
        if source is not None:
            assert data["template"] == source and data["template_sha256"] == capture.sha256(source), name


@pytest.mark.parametrize("role", list(capture.MODELS))
def test_model_templates_render_as_llama_server_did(role, request, load_model):
    """The default pair's and the test model's own templates (the test model has
    none: llama-server's ChatML) against the golden file, text for text."""
    data = golden(role)
    model, render = pyspec_renderer(role, None, request, load_model)
    assert os.path.basename(model.path) == data["model"], "the catalog's model changed: recapture"
    assert capture.sha256(model.chat_template.source) == data["template_sha256"], "its template changed: recapture"
    assert [m[0] for m in golden_mismatches(render, data)] == KNOWN_DIFFERENCES.get(role, []), \
        golden_mismatches(render, data)
    if role != "test":  # Negative control: llama.cpp's built-in approximation fails the same files.
        assert "no system" in [m[0] for m in golden_mismatches(builtin(model), data)]


def _plain_jinja(source: str, bos: str, eos: str):
    """A naive renderer: Jinja's defaults (no trim_blocks/lstrip_blocks, HTML-safe
    tojson), BOS kept, tool-call arguments left as JSON strings."""
    import jinja2.sandbox

    template = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(source)
    return lambda messages, tools: template.render(messages=messages, tools=tools, add_generation_prompt=True,
                                                   bos_token=bos, eos_token=eos)


@pytest.mark.parametrize("name", list(capture.HOSTILE))
def test_hostile_templates_render_as_llama_server_did(name, request, load_model):
    """Templates that a plain renderer gets wrong (BOS written by the template,
    block whitespace, tojson, roles and tool-call arguments, namespaces and loops),
    given as --chat-template on the test model, against the golden file."""
    data = golden(f"hostile_{name}")
    model, render = pyspec_renderer("test", data["template"], request, load_model)
    assert golden_mismatches(render, data) == []
    # Negative control: the golden file tells a naive renderer apart.
    t = model.chat_template
    assert golden_mismatches(_plain_jinja(data["template"], t.bos_token, t.eos_token), data) != []


LLAMA_SERVER = os.environ.get("PYSPEC_LLAMA_SERVER", "/tmp/llama-build/bin/llama-server")


@pytest.mark.skipif(not os.path.exists(LLAMA_SERVER), reason="llama.cpp's llama-server is not built "
                    "(docs/server.md#building-llama-server; PYSPEC_LLAMA_SERVER names it); the golden files "
                    "above hold its renderings")
@pytest.mark.parametrize("name", list(capture.jobs()))
def test_same_text_as_llama_servers_apply_template(name, request, load_model):
    """A live llama-server's rendering (POST /apply-template) of every chat of a
    golden file, tools and prefill included: the same text as pyspec's, and as the
    golden file's (a file out of date with this build fails here)."""
    role, source, chats = capture.jobs()[name]
    model, render = pyspec_renderer(role, source, request, load_model)
    with capture.LlamaServer(LLAMA_SERVER, model.path, source) as server:
        for chat, (messages, tools) in chats.items():
            theirs = server.render(messages, tools)
            known = chat in KNOWN_DIFFERENCES.get(name, [])
            assert (render(messages, tools) == theirs) != known, chat
            assert [r["prompt"] for r in golden(name)["renderings"] if r["chat"] == chat] == [theirs], chat
