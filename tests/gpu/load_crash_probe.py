"""Which process state makes a GPU model load crash? (issue 37)

usage: python tests/gpu/load_crash_probe.py MODEL [--n-gpu-layers -1]

On an H200, `_core.Model(...)` crashed (SIGSEGV) on the first model load of a
pytest process (n_ctx=256, all layers offloaded), while the same load in a bare
interpreter did not in 16 combinations of offload, context and flash attention.
What differs in a pytest process is what it imported and enabled first. This
loads the model once in a fresh interpreter per variant, each adding one of
those things, and prints per variant the exit status (a negative one is the
signal) and the tail of stderr (faulthandler's Python stack); a crashing
variant is re-run under gdb, where there is one, for the C stack.

  bare            the load alone
  faulthandler    python -X faulthandler (pytest enables it)
  llama_cpp       `import llama_cpp` first: llama-cpp-python's ctypes libllama
                  and its Python log callback (tests/test_chat_template.py imports it)
  collected       every tests/test_*.py module imported first, as collection does
  pytest          the load as a test, under pytest with the suite's plugins
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)

LOAD = """
import pyspec
m = pyspec.Model({path!r}, n_ctx=256, n_gpu_layers={ngl}, memory_mb=0)
m.native.decode(m.tokenize("Hello world"), 0, 1)
print("loaded", m.native.logits(0)[:2])
"""

COLLECT = """
import glob, importlib, os, sys
sys.path.insert(0, {tests!r})
for f in sorted(glob.glob(os.path.join({tests!r}, "test_*.py"))):
    try:
        importlib.import_module(os.path.basename(f)[:-3])
    except Exception as e:
        print("import failed:", f, e, file=sys.stderr)
"""


def run(cmd, cwd=None) -> dict:
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)
    return {"rc": p.returncode, "stdout": p.stdout[-300:], "stderr": p.stderr[-1500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    args = ap.parse_args()
    load = LOAD.format(path=os.path.abspath(args.model), ngl=args.n_gpu_layers)
    py = sys.executable
    work = tempfile.mkdtemp(prefix="pyspec-crash-probe-")
    with open(os.path.join(work, "test_load.py"), "w") as f:
        f.write("def test_load():\n" + "".join("    " + line + "\n" for line in load.strip().splitlines()))
    variants = {
        "bare": [py, "-c", load],
        "faulthandler": [py, "-X", "faulthandler", "-c", load],
        "llama_cpp": [py, "-X", "faulthandler", "-c", "import llama_cpp\n" + load],
        "collected": [py, "-X", "faulthandler", "-c", COLLECT.format(tests=TESTS) + load],
        "pytest": [py, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", "--timeout", "120",
                   os.path.join(work, "test_load.py")],
    }
    results = {}
    for name, cmd in variants.items():
        r = run(cmd, cwd=work)
        results[name] = r
        print(json.dumps({"variant": name, "rc": r["rc"], "stderr_tail": r["stderr"][-600:]}), flush=True)
        if r["rc"] < 0 and shutil.which("gdb"):
            g = run(["gdb", "-batch", "-ex", "run", "-ex", "bt 30", "--args"] + cmd, cwd=work)
            print(json.dumps({"variant": name, "gdb": g["stdout"][-300:] + g["stderr"][-2500:]}), flush=True)
    crashed = [n for n, r in results.items() if r["rc"] != 0]
    print(json.dumps({"crashed": crashed}))


if __name__ == "__main__":
    main()
