"""GGUF files for tests: read one (header, key-values, tensor table), write one
(with every numeric field of the header located, so a fuzzer can overwrite it),
build a tiny working model from scratch, and damage a real model's weights on
purpose (scramble the block scales of a Q8_0 tensor, or zero a tensor, so the
file still loads but computes nonsense). Format: ggml's docs/gguf.md
(little-endian, v2/v3); block sizes: ggml's type traits (ggml.c)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Dict, List, Optional, Tuple

import numpy as np

Q8_0 = 8          # ggml_type
Q8_0_BLOCK = 34   # bytes: an f16 scale, then 32 int8 weights
F32 = 0
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
UINT32, INT32, FLOAT32, BOOL = 4, 5, 6, 7
#: ggml_type -> (weights per block, bytes per block): each block's weights scale
#: by its f16/f32 scale(s), so all-zero bytes are all-zero weights.
_BLOCKS = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
           10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210)}


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize("<" + fmt)
    raw = f.read(size)
    if len(raw) < size:
        raise ValueError("unexpected end of file")
    return struct.unpack("<" + fmt, raw)[0]


def _string(f: BinaryIO) -> str:
    return f.read(_read(f, "Q")).decode("utf-8", "replace")


def _value(f: BinaryIO, vtype: int):
    if vtype == STRING:
        return _string(f)
    if vtype == ARRAY:
        etype, n = _read(f, "I"), _read(f, "Q")
        return (etype, [_value(f, etype) for _ in range(n)])
    return _read(f, _SCALAR[vtype])


@dataclass
class Tensor:
    name: str
    shape: Tuple[int, ...]
    ggml_type: int
    offset: int  # within the data section


@dataclass
class Gguf:
    """A GGUF file's header as values. ``kvs``: key -> (type, value), an array's
    value being (element type, list); ``data``: the data section's bytes."""

    kvs: Dict[str, Tuple[int, Any]]
    tensors: List[Tensor]
    data: bytes = b""
    version: int = 3

    @property
    def alignment(self) -> int:
        """general.alignment where it is a valid one (what the data is padded to), else 32."""
        vtype, value = dict(items(self.kvs)).get("general.alignment", (UINT32, 32))
        return value if vtype == UINT32 and value > 0 and value & (value - 1) == 0 else 32


def items(kvs) -> List[Tuple[str, Tuple[int, Any]]]:
    """The key-values of a Gguf: a dict, or a list of pairs (where keys repeat on purpose)."""
    return list(kvs.items()) if isinstance(kvs, dict) else list(kvs)


def read(path: str, *, data: bool = True) -> Gguf:
    """The header of the GGUF file at ``path`` (and its data section, with ``data``)."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, n_tensors, n_kv = _read(f, "I"), _read(f, "Q"), _read(f, "Q")
        if version < 2:
            raise ValueError(f"GGUF v{version} is not supported here")
        kvs = {}
        for _ in range(n_kv):
            key = _string(f)
            vtype = _read(f, "I")
            kvs[key] = (vtype, _value(f, vtype))
        table = []
        for _ in range(n_tensors):
            name = _string(f)
            shape = tuple(_read(f, "Q") for _ in range(_read(f, "I")))
            table.append(Tensor(name, shape, _read(f, "I"), _read(f, "Q")))
        g = Gguf(kvs, table, version=version)
        start = (f.tell() + g.alignment - 1) // g.alignment * g.alignment
        if data:
            f.seek(start)
            g.data = f.read()
    g.data_start = start  # type: ignore[attr-defined]
    return g


def tensors(path: str) -> Dict[str, Tuple[int, int, Tuple[int, ...]]]:
    """name -> (ggml type, absolute byte offset of its data, shape)."""
    g = read(path, data=False)
    return {t.name: (t.ggml_type, g.data_start + t.offset, t.shape) for t in g.tensors}  # type: ignore[attr-defined]


# ---------------------------------------------------------------- writing

@dataclass
class Slot:
    """One numeric field of a written header: where it is, its struct format, what it is."""

    offset: int
    fmt: str
    what: str


@dataclass
class _Writer:
    out: bytearray = field(default_factory=bytearray)
    slots: List[Slot] = field(default_factory=list)

    def num(self, fmt: str, value, what: Optional[str] = None) -> None:
        if what is not None:
            self.slots.append(Slot(len(self.out), fmt, what))
        self.out += struct.pack("<" + fmt, value)

    def string(self, s, what: str) -> None:
        raw = s if isinstance(s, bytes) else s.encode("utf-8")  # bytes: written as they are (not UTF-8, say)
        self.num("Q", len(raw), f"length of {what}")
        self.out += raw

    def value(self, vtype: int, value, what: str, slots: bool = True) -> None:
        if vtype == STRING:
            if slots:
                self.string(value, what)
            else:
                raw = value if isinstance(value, bytes) else value.encode("utf-8")
                self.out += struct.pack("<Q", len(raw)) + raw
        elif vtype == ARRAY:
            etype, items = value
            self.num("I", etype, f"element type of {what}")
            self.num("Q", len(items), f"length of {what}")
            for item in items:  # elements: too many to be slots
                self.value(etype, item, what, slots=False)
        else:
            self.num(_SCALAR[vtype], value, None)


def write(g: Gguf) -> Tuple[bytes, List[Slot]]:
    """The bytes of ``g`` as a file, and the header's numeric fields (counts,
    string and array lengths, value types, tensor dims, types and offsets)."""
    w = _Writer()
    w.out += b"GGUF"
    w.num("I", g.version, "version")
    w.num("Q", len(g.tensors), "n_tensors")
    w.num("Q", len(g.kvs), "n_kv")
    for key, (vtype, value) in items(g.kvs):
        w.string(key, f"key {key}")
        w.num("I", vtype, f"type of {key}")
        w.value(vtype, value, key)
    for t in g.tensors:
        w.string(t.name, f"name of tensor {t.name}")
        w.num("I", len(t.shape), f"n_dims of {t.name}")
        for i, n in enumerate(t.shape):
            w.num("Q", n, f"dim {i} of {t.name}")
        w.num("I", t.ggml_type, f"ggml type of {t.name}")
        w.num("Q", t.offset, f"offset of {t.name}")
    w.out += bytes(-len(w.out) % g.alignment)
    return bytes(w.out) + g.data, w.slots


def save(g: Gguf, path) -> None:
    with open(path, "wb") as f:
        f.write(write(g)[0])


def with_tensors(kvs: Dict[str, Tuple[int, Any]], arrays: Dict[str, np.ndarray], alignment: int = 32) -> Gguf:
    """A Gguf of F32 ``arrays`` (numpy shape order: the GGUF shape reversed), laid out in order."""
    tensors_, data = [], bytearray()
    for name, a in arrays.items():
        tensors_.append(Tensor(name, tuple(reversed(a.shape)), F32, len(data)))
        data += np.ascontiguousarray(a, dtype="<f4").tobytes()
        data += bytes(-len(data) % alignment)
    return Gguf(dict(kvs), tensors_, bytes(data))


def tiny_llama(chat_template: Optional[str] = None, *, n_embd: int = 16, n_ff: int = 32, seed: int = 0) -> Gguf:
    """A one-layer 'llama' model with random F32 weights and a SentencePiece
    vocabulary of <unk>, <s>, </s>, the 256 byte tokens and a few words: about
    70 KB, loads in milliseconds, generates (nonsense) like any model."""
    words = ["▁hello", "▁world", "▁the", "▁a", "▁is", "▁of", "▁and", "▁to", "▁in", "▁it"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)  # unknown, control, byte, normal
    n_vocab = len(tokens)
    kvs: Dict[str, Tuple[int, Any]] = {
        "general.architecture": (STRING, "llama"),
        "general.name": (STRING, "tiny"),
        "llama.context_length": (UINT32, 256),
        "llama.embedding_length": (UINT32, n_embd),
        "llama.block_count": (UINT32, 1),
        "llama.feed_forward_length": (UINT32, n_ff),
        "llama.attention.head_count": (UINT32, 2),
        "llama.attention.head_count_kv": (UINT32, 2),
        "llama.rope.dimension_count": (UINT32, n_embd // 2),
        "llama.attention.layer_norm_rms_epsilon": (FLOAT32, 1e-5),
        "general.alignment": (UINT32, 32),
        "tokenizer.ggml.model": (STRING, "llama"),
        "tokenizer.ggml.tokens": (ARRAY, (STRING, tokens)),
        "tokenizer.ggml.scores": (ARRAY, (FLOAT32, [0.0] * 259 + [-float(i) for i in range(len(words))])),
        "tokenizer.ggml.token_type": (ARRAY, (INT32, types)),
        "tokenizer.ggml.unknown_token_id": (UINT32, 0),
        "tokenizer.ggml.bos_token_id": (UINT32, 1),
        "tokenizer.ggml.eos_token_id": (UINT32, 2),
    }
    if chat_template is not None:
        kvs["tokenizer.chat_template"] = (STRING, chat_template)
    rng = np.random.default_rng(seed)

    def w(*shape):
        return rng.normal(0, 0.1, size=shape).astype(np.float32)

    arrays = {
        "token_embd.weight": w(n_vocab, n_embd),
        "output_norm.weight": np.ones(n_embd, np.float32),
        "blk.0.attn_norm.weight": np.ones(n_embd, np.float32),
        "blk.0.attn_q.weight": w(n_embd, n_embd),
        "blk.0.attn_k.weight": w(n_embd, n_embd),
        "blk.0.attn_v.weight": w(n_embd, n_embd),
        "blk.0.attn_output.weight": w(n_embd, n_embd),
        "blk.0.ffn_norm.weight": np.ones(n_embd, np.float32),
        "blk.0.ffn_gate.weight": w(n_ff, n_embd),
        "blk.0.ffn_up.weight": w(n_ff, n_embd),
        "blk.0.ffn_down.weight": w(n_embd, n_ff),
    }
    return with_tensors(kvs, arrays)


# ---------------------------------------------------------------- damage

def scramble_q8_0_scales(path: str, name: str, seed: int = 0) -> int:
    """Shuffle the per-block scales of Q8_0 tensor `name` in place (every weight
    keeps its int8 value but gets another block's scale); returns the blocks."""
    ggml_type, offset, shape = tensors(path)[name]
    if ggml_type != Q8_0:
        raise ValueError(f"{name} is ggml type {ggml_type}, not Q8_0")
    n_blocks = int(np.prod(shape)) // 32
    with open(path, "r+b") as f:
        f.seek(offset)
        blocks = np.frombuffer(f.read(n_blocks * Q8_0_BLOCK), dtype=np.uint8).reshape(n_blocks, Q8_0_BLOCK).copy()
        scales = blocks[:, :2].copy()
        blocks[:, :2] = scales[np.random.default_rng(seed).permutation(n_blocks)]
        f.seek(offset)
        f.write(blocks.tobytes())
    return n_blocks


def zero_tensor(path: str, name: str) -> int:
    """Zero the bytes of tensor `name` in place (of the types in _BLOCKS: every
    weight becomes 0, the file still loads); returns the bytes written."""
    ggml_type, offset, shape = tensors(path)[name]
    if ggml_type not in _BLOCKS:
        raise ValueError(f"{name} is ggml type {ggml_type}, whose block size is not known here")
    per_block, block_bytes = _BLOCKS[ggml_type]
    n_bytes = int(np.prod(shape)) // per_block * block_bytes
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(n_bytes))
    return n_bytes
