"""--n-gpu-layers, --flash-attn and --strict: one definition (device_options in
pyspec/cli/options.py) on every command that loads a model, handed on to what
the command loads or starts (docs/cli.md#where-models-run)."""

from __future__ import annotations

import json
import re

import click
import pytest
from click.testing import CliRunner

from pyspec import _core
from pyspec.bench.serve.llama_server import PYSPEC, PYSPEC_PLAIN
from pyspec.bench.serve.process import LLAMA_SERVER
from pyspec.cli import main
from pyspec.cli.options import device_options
from cli_helpers import pyspec_cmd

#: The commands that load a model, or start a `pyspec serve` that does.
DEVICE_COMMANDS = {"generate", "chat", "serve", "agree", "bench paired", "bench simulate", "bench parallel",
                   "bench multiturn", "bench serve", "bench editor", "bench vim", "bench agent", "bench soak"}

#: Commands that take a model but run nothing on it: nothing to offload.
# Commands that take a model but no device flags, and why.
NO_INFERENCE = {"quantize": "llama_model_quantize rewrites SOURCE's tensors on the CPU; no context",
                "bench rpc": "places the target itself, on the loopback RPC workers (behind delay proxies) it starts"}

DEVICE_OPTIONS = ("n_gpu_layers", "flash_attn", "strict", "rpc", "tensor_split", "local_output", "draft_rpc")

cpu_only = pytest.mark.skipif(_core.supports_gpu_offload(), reason="this build can offload: --strict does not fail")


def commands(group: click.Group = main, prefix: str = ""):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from commands(cmd, f"{prefix}{name} ")
        else:
            yield prefix + name, cmd


def takes_a_model(cmd: click.Command) -> bool:
    """A --model/-m option, or a positional argument that the command's help
    calls a model (``REFERENCE ... (GGUF paths or default model names``)."""
    for p in cmd.params:
        if isinstance(p, click.Option) and {"--model", "-m"} & set(p.opts):
            return True
        if isinstance(p, click.Argument) and re.search(
                rf"\b{p.human_readable_name}\b[^.]*\b(GGUF|model names?)\b", cmd.help or ""):
            return True
    return False


def test_every_command_that_takes_a_model_has_the_device_options():
    cmds = dict(commands())
    with_model = {name for name, c in cmds.items() if takes_a_model(c)}
    assert set(NO_INFERENCE) <= with_model, "an exemption that no longer takes a model: drop it"
    assert with_model - set(NO_INFERENCE) == DEVICE_COMMANDS, (
        "a command takes a model: give it @device_options (and pass **device to its loads), "
        "or list it in NO_INFERENCE with the reason")
    for opt in DEVICE_OPTIONS:
        having = {name for name, c in cmds.items() if any(p.name == opt for p in c.params)}
        assert having == DEVICE_COMMANDS, opt
    # One definition: the same flags, defaults and help everywhere.
    for opt in DEVICE_OPTIONS:
        defined = {(tuple(p.opts), p.default, p.is_flag, p.help, repr(p.type))
                   for name in DEVICE_COMMANDS for p in cmds[name].params if p.name == opt}
        assert len(defined) == 1, (opt, defined)
    params = {p.name: p for p in cmds["bench paired"].params}
    assert params["n_gpu_layers"].opts == ["--n-gpu-layers"] and params["n_gpu_layers"].default == 0
    assert params["flash_attn"].type.choices == ("auto", "on", "off") and params["flash_attn"].default == "auto"
    assert params["strict"].is_flag  # off unless given: test_device_options_hand_the_command_one_device


def test_device_options_hand_the_command_one_device():
    @click.command()
    @device_options
    def show(device):
        click.echo(json.dumps(device))

    out = CliRunner().invoke(show, ["--n-gpu-layers", "-1", "--flash-attn", "off", "--strict", "--rpc",
                                    "a:1, b:2", "--tensor-split", "3,1", "--draft-rpc", "c:3"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {"n_gpu_layers": -1, "flash_attn": "off", "strict": True, "rpc": ["a:1", "b:2"],
                                      "tensor_split": [3.0, 1.0], "local_output": False, "draft_rpc": ["c:3"]}
    assert json.loads(CliRunner().invoke(show, []).output) == {"n_gpu_layers": 0, "flash_attn": "auto", "strict": False,
                                                               "rpc": [], "tensor_split": None, "local_output": False,
                                                               "draft_rpc": []}
    bad = CliRunner().invoke(show, ["--tensor-split", "1,-1"])
    assert bad.exit_code == 2 and "shares >= 0" in bad.output


def test_device_reaches_each_model_and_each_server_it_starts():
    """--rpc and --tensor-split go to the target, --draft-rpc to the draft; and
    to the `pyspec serve` and llama-server processes a benchmark starts (the
    draft of llama-server stays here unless --draft-rpc)."""
    from pyspec.bench.serve.process import llama_server_backends, llama_server_device_args, pyspec_device_args
    from pyspec.cli.options import model_device

    device = dict(n_gpu_layers=0, flash_attn="auto", strict=False, rpc=("h:1", "h:2"), tensor_split=(3.0, 1.0),
                  local_output=True, draft_rpc=("d:3",))
    assert model_device(device) == dict(n_gpu_layers=0, flash_attn="auto", strict=False, rpc=("h:1", "h:2"),
                                        tensor_split=(3.0, 1.0), local_output=True)
    assert model_device(device, role="draft") == dict(n_gpu_layers=0, flash_attn="auto", strict=False, rpc=("d:3",),
                                                      tensor_split=None, local_output=False)
    assert pyspec_device_args(device)[-7:] == ["--rpc", "h:1,h:2", "--tensor-split", "3,1", "--rpc-local-output",
                                               "--draft-rpc", "d:3"]
    assert llama_server_device_args(device)[:8] == ["-ngl", "999", "-fa", "auto", "--rpc", "h:1,h:2", "-ts", "3,1"]
    assert llama_server_device_args(device)[8] == "-ot"
    (backend,) = llama_server_backends("llama-server", "t.gguf", parallel=1, n_ctx=512, threads=1,
                                       specs=["draft-simple"], draft="d.gguf", device=dict(device, draft_rpc=()))
    cmd = backend.command
    assert cmd[cmd.index("-ngld") + 1] == "0"


#: Each device command's least arguments with a model (``{m}``); --strict must stop
#: it before any model loads or any server starts.
STRICT_ARGS = {
    "generate": ["hi", "-m", "{m}", "-n", "1"],
    "serve": ["-m", "{m}", "--port", "0"],
    "agree": ["{m}", "{m}"],
    "bench paired": ["-m", "{m}"],
    "bench simulate": ["-m", "{m}"],
    "bench parallel": ["-m", "{m}"],
    "bench multiturn": ["-m", "{m}"],
    "bench serve": ["-m", "{m}", "--turns", "2"],
    "bench soak": ["--model", "{m}", "--minutes", "0.01"],
    "bench editor": ["-m", "{m}", "--sites", "1"],
    "bench vim": ["-m", "{m}", "--sites", "1"],
    "bench agent": ["-m", "{m}", "--sessions", "1"],
    "chat": ["-m", "{m}"],
}


def test_strict_args_cover_every_device_command():
    assert set(STRICT_ARGS) == DEVICE_COMMANDS


@cpu_only
@pytest.mark.parametrize("command", sorted(STRICT_ARGS))
def test_strict_offload_on_a_cpu_build_is_a_one_line_error(command, gemma_path, monkeypatch):
    """In process, with model loading and server starts replaced by failures
    that say they were reached: --strict must stop the command before either."""
    import pyspec.bench.serve.process as process

    def reached(*args, **kwargs):
        raise AssertionError("reached a model load or a server start despite --strict")

    monkeypatch.setattr(_core, "Model", reached)
    monkeypatch.setattr(process, "ServerProcess", reached)
    args = [a.replace("{m}", gemma_path) for a in STRICT_ARGS[command]]
    out = CliRunner().invoke(main, [*command.split(), *args, "--strict", "--n-gpu-layers", "-1"])
    assert out.exit_code == 1, (out.output, out.exception)
    assert isinstance(out.exception, SystemExit), out.exception
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("Error: n_gpu_layers=-1 asks for GPU offload"), line


@cpu_only
@pytest.mark.parametrize("args", [["bench", "paired", "-m", "{m}"], ["agree", "{m}", "{m}"],
                                  ["bench", "simulate", "-m", "{m}"]])
def test_strict_offload_fails_as_users_see_it(args, gemma_path):
    out = pyspec_cmd(*[a.replace("{m}", gemma_path) for a in args], "--strict", "--n-gpu-layers", "-1", timeout=60)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("Error: ") and "asks for GPU offload" in line and "no GPU backend" in line


def test_serve_commands_carry_the_device():
    from pyspec.bench.serve.llama_server import comparison_backends
    from pyspec.bench.serve.process import llama_server_backends

    device = {"n_gpu_layers": -1, "flash_attn": "off", "strict": True}
    py, plain, ls = (b.command for b in comparison_backends("m.gguf", "", parallel=2, n_ctx=1024, threads=2,
                                                           llama_server="ls", llama_specs=["none"], device=device))
    for cmd in (py, plain):
        assert cmd[cmd.index("--n-gpu-layers") + 1] == "-1" and cmd[cmd.index("--flash-attn") + 1] == "off"
        assert "--strict" in cmd
    assert ls[ls.index("-ngl") + 1] == "999" and ls[ls.index("-fa") + 1] == "off", "-1: all layers"
    (draft,) = llama_server_backends("ls", "t.gguf", parallel=2, n_ctx=1024, threads=2, specs=["draft-simple"],
                                     draft="d.gguf", device={**device, "n_gpu_layers": 12})
    cmd = draft.command
    assert cmd[cmd.index("-ngl") + 1] == "12" and cmd[cmd.index("-ngld") + 1] == "12"
    # Without a device (library callers): the servers' own defaults, as before.
    (bare,) = llama_server_backends("ls", "t.gguf", parallel=2, n_ctx=1024, threads=2, specs=["none"])
    assert "-ngl" not in bare.command and "-fa" not in bare.command


def test_llama_cpp_python_server_gets_the_offload(monkeypatch):
    from pyspec.bench.serve import concurrent

    started = []
    monkeypatch.setattr(concurrent, "ServerProcess", lambda cmd, port, **kw: started.append(cmd))
    monkeypatch.setattr(concurrent, "free_port", lambda: 1)
    concurrent.start_llama("m.gguf", n_ctx=512, threads=2, n_gpu_layers=-1, flash_attn=True)
    concurrent.start_pyspec("m.gguf", "", parallel=2, n_ctx=512, threads=2,
                            device={"n_gpu_layers": -1, "flash_attn": "auto", "strict": False})
    theirs, ours = started
    assert theirs[theirs.index("--n_gpu_layers") + 1] == "-1" and theirs[theirs.index("--flash_attn") + 1] == "True"
    assert ours[ours.index("--n-gpu-layers") + 1] == "-1" and ours[ours.index("--flash-attn") + 1] == "auto"
    assert "--strict" not in ours


def test_bench_soak_and_bench_serve_start_their_servers_with_the_device(gemma_path, tmp_path, monkeypatch):
    """The CLI end: the commands' server command lines, caught at the start."""
    import pyspec.bench.serve.process as process
    import pyspec.bench.serve.turns as turns

    started = []

    def catch(cmd, *args, **kwargs):
        started.append(cmd)
        raise ValueError("caught the server's command line")

    monkeypatch.setattr(process, "ServerProcess", catch)
    flags = ["--n-gpu-layers", "7", "--flash-attn", "off"]
    out = CliRunner().invoke(main, ["bench", "soak", "--model", gemma_path, "--minutes", "0.01", *flags])
    assert out.exit_code == 1 and "caught the server's command line" in out.output, out.output
    (soak,) = started
    assert soak[soak.index("serve"):].count("--n-gpu-layers") == 1 and soak[soak.index("--n-gpu-layers") + 1] == "7"
    assert soak[soak.index("--flash-attn") + 1] == "off" and "--strict" not in soak
    if not _core.supports_gpu_offload():
        assert "warning: n_gpu_layers=7 asks for GPU offload" in out.stderr, "said once, before the server starts"

    seen = []

    def catch_backends(backends, *args, **kwargs):
        seen.extend(backends)
        raise RuntimeError("caught the backends")

    monkeypatch.setattr(turns, "run_turns", catch_backends)
    fake = tmp_path / "llama-server"
    fake.write_text("")
    out = CliRunner().invoke(main, ["bench", "serve", "-m", gemma_path, "--draft", "", "--turns", "2",
                                    "--llama-server", str(fake), *flags])
    assert out.exit_code == 1 and "caught the backends" in out.output, out.output
    assert [b.name for b in seen] == [PYSPEC, PYSPEC_PLAIN, LLAMA_SERVER]
    for b in seen[:2]:
        assert b.command[b.command.index("--n-gpu-layers") + 1] == "7", b.command
        assert b.command[b.command.index("--flash-attn") + 1] == "off"
    ls = seen[2].command
    assert ls[ls.index("-ngl") + 1] == "7" and ls[ls.index("-fa") + 1] == "off"
