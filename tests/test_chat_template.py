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

import json
import os
import warnings

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

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city (°C) <b>&'",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
CHATS = {
    "no system": ([{"role": "user", "content": "Write a haiku about rust."}], None),
    "system": ([{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello?"}], None),
    "multi-turn": ([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                    {"role": "user", "content": "And times 3 <b>now</b>?"}], None),
    "prefill": ([{"role": "user", "content": "List three colours."}, {"role": "assistant", "content": "1. Red\n2."}],
                None),
    "tools": ([{"role": "user", "content": "Weather in Zürich?"}], TOOLS),
}


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
    from pyspec.server.protocol import APIError, parse

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


LLAMA_SERVER = os.environ.get("PYSPEC_LLAMA_SERVER", "/tmp/llama-build/bin/llama-server")


@pytest.mark.skipif(not os.path.exists(LLAMA_SERVER), reason="llama.cpp's llama-server is not built "
                    "(docs/server.md#building-llama-server; PYSPEC_LLAMA_SERVER names it)")
@pytest.mark.parametrize("which", ["draft", "test"])
def test_same_text_as_llama_servers_apply_template(which, draft_path, gemma_path, load_model):
    """llama-server's own rendering (POST /apply-template) of every chat above,
    tools and prefill included, against pyspec's: the same text."""
    import http.client

    from pyspec.bench.server_process import ServerProcess, free_port

    path = draft_path if which == "draft" else gemma_path
    model = load_model(path, n_ctx=1024, seed=1)
    port = free_port()
    server = ServerProcess([LLAMA_SERVER, "-m", path, "--port", str(port), "-np", "1", "-c", "1024", "-t", "1",
                            "--no-webui"], port)
    try:
        for name, (messages, tools) in CHATS.items():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/apply-template", body=json.dumps({"messages": messages, "tools": tools or []}),
                         headers={"Content-Type": "application/json"})
            theirs = json.loads(conn.getresponse().read())["prompt"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the test model has no template: ChatML, with a warning
                assert model.apply_chat_template(messages, tools=tools) == theirs, name
    finally:
        server.stop()
