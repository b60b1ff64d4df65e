"""Models on RPC workers (docs/distributed.md), on loopback: real `pyspec
rpc-server` processes, the real ggml RPC protocol.

- Layers on two workers (split unevenly, too) give the tokens the same model
  gives here, plainly and through speculation (a greedy run is the model's
  argmax path: any wrong row would show). The T > 0 proof over RPC is a case
  of tests/test_pit_lossless.py (tier "rpc").
- Faults: an unreachable worker at start is an error naming it, at once; a
  worker killed mid-generation ends the process within a bound with one line
  naming it (exit 75); `pyspec serve --rpc` answers the request in flight with
  an error, stays up, says so in /health, and serves again once the worker is
  back.
- The worker listens on loopback only, unless told otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

import pyspec
from pyspec import rpc
from pyspec.bench.rpc_net import DelayProxy, WorkerProcess, free_port

from cli_helpers import pyspec_cmd

PROMPT = "The history of the printing press begins"
REPEAT = ("def add(a, b):\n    return a + b\n\n" * 4) + "def sub(a, b):\n    return a - b\n\n"
# How long a killed worker may take to be reported: the abort's probes (< 3 s) and the exit.
FAULT_BOUND_S = 10.0

pytestmark = pytest.mark.skipif(not pyspec._core.rpc_available(),
                                reason="this llama.cpp build has no RPC backend (docs/distributed.md)")


@pytest.fixture(scope="module")
def workers():
    with WorkerProcess() as a, WorkerProcess() as b:
        yield a, b


def greedy(model_or_decoder, prompt: str, n: int = 40):
    return model_or_decoder.generate(prompt, max_tokens=n, temperature=0, chat=False).tokens


def test_two_workers_give_the_local_tokens(gemma_path, workers):
    """The same rows as here, bit for bit, once this machine computes them with
    the workers' kernels: a CPU worker never repacks weights, and repacked
    kernels round differently (greedy paths part at a near-tie)."""
    local = pyspec.Model(gemma_path, n_ctx=512, n_threads=1, memory_mb=0, repack=False)
    expected = greedy(local, PROMPT)
    spec_args = dict(drafter="ngram", policy="fixed", draft_max=6)
    expected_copy = pyspec.SpeculativeDecoder(local, None, **spec_args).generate(
        REPEAT, max_tokens=40, temperature=0, chat=False).tokens
    del local
    endpoints = [w.endpoint for w in workers]
    for split in (None, [3.0, 1.0]):
        remote = pyspec.Model(gemma_path, n_ctx=512, n_threads=1, memory_mb=0, rpc=endpoints, tensor_split=split)
        assert remote.rpc == tuple(endpoints) and remote.n_gpu_layers == -1
        assert greedy(remote, PROMPT) == expected, f"split {split}"
        # Speculation over RPC: n-gram drafts verified in batches on the workers.
        spec = pyspec.SpeculativeDecoder(remote, None, **spec_args)
        out = spec.generate(REPEAT, max_tokens=40, temperature=0, chat=False)
        assert out.stats.drafted > 0, "no drafts: the batched path did not run"
        assert out.tokens == expected_copy, f"split {split}"
        del spec, remote
    for w in workers:  # both held layers: each served a client
        assert "Accepted client connection" in w.output()


def test_draft_on_a_worker_and_the_target_here(gemma_path):
    """Draft layers on a worker, the target here: the drafts, and so the
    verification batches and the tokens, are those of a local draft computed
    with the worker's kernels (repack=False). And `--draft-rpc` drives it from
    the command line. (A worker of its own: one serves one driver at a time.)"""
    load = dict(n_ctx=512, n_threads=1, memory_mb=0, repack=False)
    target = pyspec.Model(gemma_path, **load)
    args = dict(max_tokens=32, temperature=0, chat=False)
    local = pyspec.SpeculativeDecoder(target, pyspec.Model(gemma_path, **load), drafter="model", policy="fixed",
                                      draft_max=4).generate(PROMPT, **args)
    with WorkerProcess() as worker:
        draft = pyspec.Model(gemma_path, rpc=[worker.endpoint], **load)
        remote = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed",
                                           draft_max=4).generate(PROMPT, **args)
        del draft
    assert remote.stats.drafted > 0 and remote.stats.drafted == local.stats.drafted
    assert remote.tokens == local.tokens
    with WorkerProcess() as worker:
        r = pyspec_cmd("generate", PROMPT, "-m", gemma_path, "-d", gemma_path, "--drafter", "model", "--policy",
                       "fixed", "-k", "4", "--raw", "--json", "-n", "16", "-t", "0", "--threads", "1",
                       "--draft-rpc", worker.endpoint, timeout=300)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["stats"]["drafted"] > 0
        assert "Accepted client connection" in worker.output()


def test_busy_worker_is_a_clear_error_not_a_hang(gemma_path, workers):
    """A worker serves one driver at a time: a second driver (another process)
    is told so within the probe's timeout, instead of waiting forever."""
    holder = pyspec.Model(gemma_path, n_ctx=256, n_threads=1, memory_mb=0, rpc=[workers[0].endpoint])
    start = time.monotonic()
    r = pyspec_cmd("generate", "hi", "-m", gemma_path, "--rpc", workers[0].endpoint, "-n", "4", timeout=120)
    del holder  # the worker serves its next driver once this one lets go
    assert r.returncode == 1, r.stderr
    assert f"the RPC worker at {workers[0].endpoint} accepted a connection but did not answer" in r.stderr, r.stderr
    assert time.monotonic() - start < 60


def test_unreachable_worker_is_a_clear_error_at_once(gemma_path):
    closed = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(pyspec.RpcError, match=closed):
        pyspec.Model(gemma_path, n_ctx=256, rpc=[closed])
    with pytest.raises(pyspec.RpcError, match="HOST:PORT"):
        pyspec.Model(gemma_path, n_ctx=256, rpc=["no-port-here"])
    r = pyspec_cmd("generate", "hi", "-m", gemma_path, "--rpc", closed, "-n", "4")
    assert r.returncode == 1 and f"cannot reach the RPC worker at {closed}" in r.stderr, r.stderr
    assert time.monotonic() - start < 30


def test_killed_worker_ends_generation_with_a_clear_error_in_bounded_time(gemma_path):
    with WorkerProcess() as worker:
        cmd = [sys.executable, "-m", "pyspec.cli", "generate", "Write a very long story about a dragon.",
               "-m", gemma_path, "--rpc", worker.endpoint, "--no-draft", "-n", "4000", "-t", "0.9",
               "--threads", "1"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=tempfile.gettempdir())
        first = proc.stdout.read(40)  # it generates: the worker holds the layers and answers
        assert first, proc.stderr.read()
        worker.kill()
        killed = time.monotonic()
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("generation hung after its worker was killed")
        took = time.monotonic() - killed
    assert proc.returncode == rpc.LOST_WORKER_EXIT == 75, err
    assert f"lost the RPC worker at {worker.endpoint}" in err, err
    assert took < FAULT_BOUND_S, f"the fault took {took:.1f} s to report"


def test_worker_refuses_a_public_address_without_allow_remote():
    r = pyspec_cmd("rpc-server", "--host", "0.0.0.0", "--port", str(free_port()), timeout=60)
    assert r.returncode == 1
    assert "refusing to listen on 0.0.0.0" in r.stderr and "--allow-remote" in r.stderr
    # With the flag, it warns once, in plain words (checked without serving).
    with pytest.warns(RuntimeWarning, match="no authentication"):
        rpc.check_listen("0.0.0.0", free_port(), allow_remote=True)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert rpc.is_loopback(host)
    assert not rpc.is_loopback("192.168.1.5") and not rpc.is_loopback("0.0.0.0")


def test_worker_port_in_use_is_a_clear_error():
    with WorkerProcess() as worker:
        r = pyspec_cmd("rpc-server", "--port", str(worker.port), timeout=60)
    assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{worker.port}" in r.stderr, r.stderr


def test_delay_proxy_adds_its_delay_and_counts_round_trips(gemma_path):
    """The benchmark's network: a model through the proxy gives the same tokens,
    and a token costs at least one delayed round trip."""
    with WorkerProcess() as worker, DelayProxy(worker.endpoint, delay_ms=20) as proxy:
        model = pyspec.Model(gemma_path, n_ctx=256, n_threads=1, memory_mb=0, rpc=[proxy.endpoint])
        greedy(model, PROMPT, 2)
        proxy.reset_counts()
        start = time.perf_counter()
        greedy(model, PROMPT, 8)
        took = time.perf_counter() - start
        assert proxy.round_trips >= 8, proxy.round_trips
        assert took >= 8 * 0.040, f"8 tokens took {took:.3f} s through a 40 ms round trip"
        logits_down = proxy.bytes_down / 8
        assert logits_down >= 4 * model.n_vocab, "each token brings its row of logits back"
        del model
        # --rpc-local-output: the output layer here, hidden states back instead of logits.
        model = pyspec.Model(gemma_path, n_ctx=256, n_threads=1, memory_mb=0, rpc=[proxy.endpoint],
                             local_output=True)
        greedy(model, PROMPT, 2)
        proxy.reset_counts()
        assert len(greedy(model, PROMPT, 8)) == 8
        assert proxy.bytes_down / 8 < logits_down / 20, (proxy.bytes_down / 8, logits_down)
        del model


def test_serve_survives_a_lost_worker_and_serves_again_when_it_is_back(gemma_path):
    from server_helpers import ServerProcess

    port = free_port()
    worker = WorkerProcess(port=port)
    server = ServerProcess("--model", gemma_path, "--rpc", worker.endpoint, "--threads", "1", "--n-ctx", "1024",
                           "--parallel", "2", "--cache-slots", "0")
    try:
        body = dict(prompt=PROMPT, max_tokens=8, temperature=0)
        ok = server.post("/v1/completions", body)
        assert ok.status_code == 200, ok.text
        assert server.health()["rpc"]["workers"] == [{"endpoint": worker.endpoint, "reachable": True}]
        # A stream in flight when the worker dies ends with an error event.
        with httpx.stream("POST", server.url("/v1/completions"), timeout=60,
                          json=dict(prompt="Write a very long story.", max_tokens=4000, stream=True)) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # it streams
            worker.kill()
            rest = [line for line in lines if line.startswith("data:")]
        assert "rpc_worker_unavailable" in rest[-1] and worker.endpoint in rest[-1], rest[-1:]
        health = httpx.get(server.url("/health"), timeout=10)
        assert health.status_code == 503 and worker.endpoint in health.json()["error"]
        assert health.json()["rpc"]["workers"][0]["reachable"] is False
        refused = server.post("/v1/completions", body)
        assert refused.status_code == 503 and refused.headers.get("retry-after")
        worker = WorkerProcess(port=port)  # back, on the same address
        deadline = time.monotonic() + 120
        while httpx.get(server.url("/health"), timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the server did not come back with its worker"
            time.sleep(0.3)
        again = server.post("/v1/completions", body)
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == ok.json()["choices"][0]["text"]
        assert server.health()["rpc"]["restarts"] == 1
    finally:
        assert server.stop() == 0, server.output()
        worker.stop()


@pytest.mark.skipif(not os.environ.get("PYSPEC_LLAMA_RPC_SERVER"),
                    reason="PYSPEC_LLAMA_RPC_SERVER names llama.cpp's own rpc-server binary (same protocol version)")
def test_llama_cpp_rpc_server_is_a_worker_too(gemma_path):
    """llama.cpp's rpc-server (of the vendored llama.cpp, built with -DGGML_RPC=ON)
    holds the layers as pyspec's worker does: the same rows."""
    load = dict(n_ctx=512, n_threads=1, memory_mb=0, repack=False)
    expected = greedy(pyspec.Model(gemma_path, **load), PROMPT)
    with WorkerProcess(command=[os.environ["PYSPEC_LLAMA_RPC_SERVER"]]) as worker:
        model = pyspec.Model(gemma_path, rpc=[worker.endpoint], **load)
        assert greedy(model, PROMPT) == expected
        del model
