"""A GGUF file's header checked before any reader trusts it.

``check_gguf`` walks the header (magic, version, counts, keys, values, arrays, tensor infos)
with every count and size checked against what the file has left, and the tensors' offsets
against the data section, so a damaged or hostile file is refused naming it, instead of a reader
(the ``gguf`` package, transformers' converter) looping or allocating by its counts.
"""

from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path

from specdec.errors import CorruptFileError

_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_UINT32, _GGUF_STRING, _GGUF_ARRAY = 4, 8, 9
_GGUF_MAX_DIMS = 4  # llama.cpp's GGML_MAX_DIMS
_GGUF_MAX_NESTING = 8  # arrays of arrays
_GGUF_MIN_KEY = 8 + 4 + 1  # key length, value type, the smallest value
_GGUF_MIN_TENSOR = 8 + 4 + 8 + 4 + 8  # name length, dimension count, one dimension, type, offset


class _Damaged(Exception):
    """What is wrong with a GGUF file (raised while its header is walked)."""


class _GgufCursor:
    """Reads a GGUF header from ``data`` (``size`` bytes) with every length checked against what
    the file has left."""

    def __init__(self, data, size: int, order: str, offset: int):
        self.data, self.size, self.order, self.offset = data, size, order, offset

    def take(self, count: int, what: str) -> int:
        if count > self.size - self.offset:
            raise _Damaged(
                f"{what} at byte {self.offset} needs {count} bytes, past the end of the file "
                f"({self.size} bytes): truncated or damaged"
            )
        start, self.offset = self.offset, self.offset + count
        return start

    def number(self, code: str, what: str) -> int:
        start = self.take(struct.calcsize(code), what)
        return struct.unpack_from(self.order + code, self.data, start)[0]

    def string(self, what: str, *, text: bool = True) -> str:
        length = self.number("Q", f"the length of {what}")
        start = self.take(length, what)
        if not text:
            return ""
        try:
            return bytes(self.data[start : start + length]).decode("utf-8")
        except UnicodeDecodeError:
            raise _Damaged(f"{what} at byte {start} is not UTF-8 text") from None

    def skip_value(self, kind: int, key: str, depth: int = 0) -> None:
        what = f"the value of {key!r}"
        if kind in _GGUF_SCALARS:
            self.take(_GGUF_SCALARS[kind], what)
        elif kind == _GGUF_STRING:
            self.string(what, text=False)
        elif kind == _GGUF_ARRAY:
            if depth >= _GGUF_MAX_NESTING:
                raise _Damaged(f"{what} nests arrays more than {_GGUF_MAX_NESTING} deep")
            item = self.number("I", what)
            count = self.number("Q", what)
            least = _GGUF_SCALARS.get(item, 8 if item == _GGUF_STRING else 12)
            if item not in _GGUF_SCALARS and item not in (_GGUF_STRING, _GGUF_ARRAY):
                raise _Damaged(
                    f"{what} is an array of value type {item}, which GGUF does not define"
                )
            if count * least > self.size - self.offset:
                raise _Damaged(
                    f"{what} claims {count} items, more than the {self.size - self.offset} bytes "
                    "left in the file hold: truncated or damaged"
                )
            if item in _GGUF_SCALARS:
                self.take(count * least, what)
            else:
                for _ in range(count):
                    self.skip_value(item, key, depth + 1)
        else:
            raise _Damaged(f"{what} has value type {kind}, which GGUF does not define")


def _ggml_sizes() -> dict[int, tuple[int, int]] | None:
    """{tensor type: (elements per block, bytes per block)} of the gguf package, if installed."""
    try:
        from gguf.constants import GGML_QUANT_SIZES  # optional: gguf (hf extra)
    except ImportError:
        return None
    return {int(kind): (int(block), int(size)) for kind, (block, size) in GGML_QUANT_SIZES.items()}


def _gguf_problem(data, size: int) -> str | None:
    if size < 24:
        return f"it has only {size} bytes, fewer than a GGUF header's 24"
    order = "<"
    (version,) = struct.unpack_from("<I", data, 4)
    if version & 0xFFFF == 0:  # written on a machine of the other byte order
        order = ">"
        (version,) = struct.unpack_from(">I", data, 4)
    if version not in (2, 3):
        return f"it says GGUF version {version}; GGUF readers read versions 2 and 3"
    cursor = _GgufCursor(data, size, order, 8)
    tensors = cursor.number("Q", "the tensor count")
    keys = cursor.number("Q", "the metadata key count")
    for count, least, what in (
        (keys, _GGUF_MIN_KEY, "metadata keys"),
        (tensors, _GGUF_MIN_TENSOR, "tensors"),
    ):
        if count * least > size - 24:
            return f"its header claims {count} {what}, more than its {size} bytes can hold"
    alignment, seen = 32, set()
    for _ in range(keys):
        key = cursor.string("a metadata key")
        if key in seen:
            return f"it holds metadata key {key!r} twice"
        seen.add(key)
        kind = cursor.number("I", f"the value type of {key!r}")
        start = cursor.offset
        cursor.skip_value(kind, key)
        if key == "general.alignment":
            value = (
                struct.unpack_from(order + "I", data, start)[0] if kind == _GGUF_UINT32 else None
            )
            if not value or value & (value - 1):
                return "its general.alignment is not a power of two stored as a uint32"
            alignment = value
    infos, names = [], set()
    for _ in range(tensors):
        name = cursor.string("a tensor name")
        if name in names:
            return f"it holds tensor {name!r} twice"
        names.add(name)
        dims = cursor.number("I", f"the dimension count of tensor {name!r}")
        if not 1 <= dims <= _GGUF_MAX_DIMS:
            return f"tensor {name!r} has {dims} dimensions (GGUF tensors have 1 to 4)"
        shape = [cursor.number("Q", f"the shape of tensor {name!r}") for _ in range(dims)]
        kind = cursor.number("I", f"the type of tensor {name!r}")
        offset = cursor.number("Q", f"the offset of tensor {name!r}")
        infos.append((name, shape, kind, offset))
    start = cursor.offset + (-cursor.offset) % alignment
    sizes = _ggml_sizes()
    spans = []
    for name, shape, kind, offset in infos:
        length = 0
        if sizes is not None:
            if kind not in sizes:
                return f"tensor {name!r} has type {kind}, which GGUF does not define"
            block, block_bytes = sizes[kind]
            if shape[0] % block:
                return (
                    f"tensor {name!r} has a first dimension of {shape[0]}, not a multiple of its "
                    f"type's block of {block}"
                )
            length = math.prod(shape) // block * block_bytes
        if offset % alignment:
            return f"tensor {name!r} starts at offset {offset}, not a multiple of {alignment}"
        if start + offset + length > size:
            return (
                f"tensor {name!r} (shape {shape}) ends at byte {start + offset + length}, past the "
                f"end of the file ({size} bytes): truncated or damaged"
            )
        spans.append((offset, offset + length, name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            return f"tensors {first!r} and {second!r} overlap"
    return None


def gguf_architecture(path) -> str | None:
    """The ``general.architecture`` of a sound GGUF file (``check_gguf`` first), read from its
    header alone (a GGUF reader parses every key, a vocabulary of 50k strings included, first);
    None where the header names none."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        size = Path(path).stat().st_size
        (version,) = struct.unpack_from("<I", data, 4)
        order = ">" if version & 0xFFFF == 0 else "<"
        cursor = _GgufCursor(data, size, order, 8)
        cursor.number("Q", "the tensor count")
        for _ in range(cursor.number("Q", "the metadata key count")):
            key = cursor.string("a metadata key")
            kind = cursor.number("I", f"the value type of {key!r}")
            if key == "general.architecture" and kind == _GGUF_STRING:
                return cursor.string(f"the value of {key!r}")
            cursor.skip_value(kind, key)
    return None


def check_gguf(path) -> None:
    """Raise CorruptFileError unless ``path`` is a structurally sound GGUF file: its magic and
    version, every metadata key and value and every tensor's name, shape, type and offset inside
    the file, tensors that neither overlap nor end past it. Reads the header only."""
    path = Path(path)
    with open(path, "rb") as handle:
        size = path.stat().st_size
        magic = handle.read(4)
        if magic != b"GGUF":
            raise CorruptFileError(
                f"{path} is not a GGUF file (it starts {magic!r}, not b'GGUF'); pass a GGUF file, "
                "or restore it"
            )
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                problem = _gguf_problem(data, size)
            except _Damaged as exc:
                problem = str(exc)
    if problem:
        raise CorruptFileError(f"GGUF file {path} is damaged: {problem}; restore or re-create it")


# ---------------------------------------------------------------------------- torch pickles
