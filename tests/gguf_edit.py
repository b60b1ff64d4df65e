"""Just enough GGUF to damage a model on purpose: find a tensor's bytes in a
.gguf file (the header's key-values are skipped by their types, the tensor
table read) and scramble the block scales of a Q8_0 tensor, or zero a tensor,
so the file still loads but computes nonsense. Format: ggml's docs/gguf.md
(little-endian, v2/v3); block sizes: ggml's type traits (ggml.c)."""

from __future__ import annotations

import struct
from typing import BinaryIO, Dict, Tuple

import numpy as np

Q8_0 = 8          # ggml_type
Q8_0_BLOCK = 34   # bytes: an f16 scale, then 32 int8 weights
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
#: ggml_type -> (weights per block, bytes per block): each block's weights scale
#: by its f16/f32 scale(s), so all-zero bytes are all-zero weights.
_BLOCKS = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
           10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210)}


def _read(f: BinaryIO, fmt: str):
    return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]


def _string(f: BinaryIO) -> str:
    return f.read(_read(f, "Q")).decode("utf-8", "replace")


def _value(f: BinaryIO, vtype: int):
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        etype, n = _read(f, "I"), _read(f, "Q")
        return [_value(f, etype) for _ in range(n)]
    return _read(f, _SCALAR[vtype])


def tensors(path: str) -> Dict[str, Tuple[int, int, Tuple[int, ...]]]:
    """name -> (ggml type, absolute byte offset of its data, shape)."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, n_tensors, n_kv = _read(f, "I"), _read(f, "Q"), _read(f, "Q")
        if version < 2:
            raise ValueError(f"GGUF v{version} is not supported here")
        alignment = 32
        for _ in range(n_kv):
            key = _string(f)
            value = _value(f, _read(f, "I"))
            if key == "general.alignment":
                alignment = int(value)
        table = {}
        for _ in range(n_tensors):
            name = _string(f)
            shape = tuple(_read(f, "Q") for _ in range(_read(f, "I")))
            table[name] = (_read(f, "I"), _read(f, "Q"), shape)
        data = (f.tell() + alignment - 1) // alignment * alignment
    return {name: (t, data + off, shape) for name, (t, off, shape) in table.items()}


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
