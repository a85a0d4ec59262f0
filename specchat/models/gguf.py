"""Read a GGUF file's header (metadata and tensor table) in pure Python, without llama.cpp.

Why: before loading a model we want cheap facts — architecture, layers, context length, chat template,
how big the KV cache will be — and we want a cut download or a text file named ``.gguf`` to give one clear
line instead of a llama.cpp crash. Reading the header only touches its first few megabytes (the file is
memory-mapped; tensor data is never read), so it is fast even for a 40 GB file.

Format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic ``GGUF``, uint32 version,
uint64 tensor count, uint64 metadata count, metadata key/value pairs, tensor infos (name, dims, ggml type,
offset), padding to ``general.alignment`` (default 32), then the tensor data. The end of the last tensor
is therefore known from the header alone, which is how truncation is detected.

Big arrays (``tokenizer.ggml.tokens``, ``merges``, ``scores``, ...) are skipped, not decoded: the metadata
holds an `ArrayRef` (with its length) and `GGUFInfo.array(key)` reads it on request.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from specchat.errors import ModelFileError
from specchat.models.ggml_types import FILE_TYPE_NAMES, GGML_TYPES

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
INLINE_ARRAY_MAX = 64
"""String arrays up to this many items are decoded into `GGUFInfo.metadata`; longer ones become `ArrayRef`."""
INLINE_NUMBER_ARRAY_MAX = 4096
"""Numeric arrays (per-layer head counts, ...) are decoded up to this length: one struct call each."""

REDOWNLOAD_HINT = "the download was cut; run `specchat pull --force MODEL` or download the file again"


class ValueType(IntEnum):
    """GGUF metadata value types."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR_FORMATS: dict[int, str] = {
    ValueType.UINT8: "B",
    ValueType.INT8: "b",
    ValueType.UINT16: "H",
    ValueType.INT16: "h",
    ValueType.UINT32: "I",
    ValueType.INT32: "i",
    ValueType.FLOAT32: "f",
    ValueType.BOOL: "?",
    ValueType.UINT64: "Q",
    ValueType.INT64: "q",
    ValueType.FLOAT64: "d",
}


@dataclass(frozen=True)
class ArrayRef:
    """A metadata array left undecoded: where it is, so `GGUFInfo.array` can read it later."""

    item_type: int
    count: int
    offset: int  # file offset of the first item

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table. `shape` is in ggml order (ne[0] first: the contiguous dimension)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the start of the tensor data

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        t = GGML_TYPES.get(self.ggml_type)
        return t.name if t else f"type{self.ggml_type}"

    @property
    def nbytes(self) -> int | None:
        """Size of the data in bytes, or None for a ggml type this table does not know."""
        t = GGML_TYPES.get(self.ggml_type)
        if t is None:
            return None
        return self.n_elements // t.block_size * t.type_size


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF header says, plus the sizes needed to tell a complete file from a cut one."""

    path: Path
    version: int
    byteorder: str  # "<" or ">"
    metadata: Mapping[str, Any]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    header_size: int  # bytes of magic + metadata + tensor infos (before alignment padding)
    data_offset: int  # file offset where tensor data starts
    tensor_data_end: int  # file offset just past the last byte of tensor data
    file_size: int

    # -- sizes -----------------------------------------------------------------------------------------

    @property
    def expected_size(self) -> int:
        """The smallest size a complete file can have (trailing alignment padding is optional)."""
        return self.tensor_data_end

    @property
    def is_truncated(self) -> bool:
        return self.file_size < self.expected_size

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    # -- common metadata -------------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value; long arrays (token lists, ...) come back as `ArrayRef`: see `array`."""
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """`{architecture}.{suffix}`, e.g. arch_get("block_count")."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def name(self) -> str | None:
        value = self.metadata.get("general.name")
        return None if value is None else str(value)

    @property
    def file_type(self) -> str | None:
        """Quantisation name from general.file_type (e.g. "Q4_K_M"), or None when absent/unknown."""
        ftype = self.metadata.get("general.file_type")
        return None if ftype is None else FILE_TYPE_NAMES.get(int(ftype))

    @property
    def n_layer(self) -> int:
        return int(self.arch_get("block_count", 0))

    @property
    def n_embd(self) -> int:
        return int(self.arch_get("embedding_length", 0))

    @property
    def context_length(self) -> int:
        """The training context length (0 when the file does not say)."""
        return int(self.arch_get("context_length", 0))

    @property
    def n_head(self) -> int:
        """Attention heads; for models with a per-layer list, the largest."""
        return max(self._ints("attention.head_count"), default=0)

    @property
    def n_head_kv(self) -> int:
        """Key/value heads (grouped-query attention); defaults to n_head. Per-layer lists: the largest."""
        if self.arch_get("attention.head_count_kv") is None:
            return self.n_head
        return max(self._ints("attention.head_count_kv"), default=0)

    @property
    def n_head_kv_per_layer(self) -> list[int]:
        """KV heads of each layer (some architectures vary them, 0 for layers without attention)."""
        has_kv = self.arch_get("attention.head_count_kv") is not None
        values = self._ints("attention.head_count_kv" if has_kv else "attention.head_count")
        return values if len(values) != 1 else values * self.n_layer

    @property
    def key_length(self) -> int:
        """Size of one key head: `attention.key_length`, else n_embd / n_head."""
        value = self.arch_get("attention.key_length")
        if value is not None:
            return int(value)
        return self.n_embd // self.n_head if self.n_head else 0

    @property
    def value_length(self) -> int:
        """Size of one value head: `attention.value_length`, else n_embd / n_head."""
        value = self.arch_get("attention.value_length")
        if value is not None:
            return int(value)
        return self.n_embd // self.n_head if self.n_head else 0

    @property
    def n_vocab(self) -> int:
        """Vocabulary size: the token list's length, else `{arch}.vocab_size`, else 0."""
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if tokens is not None:
            return len(tokens)
        return int(self.arch_get("vocab_size", 0))

    @property
    def tokenizer_model(self) -> str | None:
        value = self.metadata.get("tokenizer.ggml.model")
        return None if value is None else str(value)

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return None if value is None else str(value)

    def _ints(self, suffix: str) -> list[int]:
        """An architecture key that is either one number or a per-layer list, as a list."""
        key = f"{self.architecture}.{suffix}"
        value = self.metadata.get(key, 0)
        if isinstance(value, (list, ArrayRef)):
            return [int(v) for v in self.array(key)]
        return [int(value)]

    # -- big arrays ------------------------------------------------------------------------------------

    def array(self, key: str) -> list[Any]:
        """The full value of a metadata array (e.g. "tokenizer.ggml.tokens"), reading it if needed."""
        value = self.metadata[key]
        if not isinstance(value, ArrayRef):
            if not isinstance(value, list):
                raise TypeError(f"metadata {key!r} is not an array")
            return value
        with open(self.path, "rb") as f, _map(f, self.file_size) as buf:
            reader = _Reader(buf, self.path, self.byteorder)
            reader.pos = value.offset
            try:
                return reader.items(value.item_type, value.count)
            except _Truncated as t:  # the file changed since read_gguf: still one clear line
                raise _truncated_error(self.path, self.file_size, t.needed) from None


def _map(f: Any, size: int) -> mmap.mmap:
    return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)


class _Truncated(Exception):
    """Raised inside the parser when the header runs past the end of the file."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


class _Reader:
    """A cursor over the mapped file. Reads little- or big-endian values, checking the bounds."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path, byteorder: str) -> None:
        self.buf = buf
        self.size = len(buf)
        self.path = path
        self.bo = byteorder
        self.pos = 0

    def _need(self, n: int) -> None:
        if self.pos + n > self.size:
            raise _Truncated(self.pos + n)

    def scalar(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self._need(n)
        (value,) = struct.unpack_from(self.bo + fmt, self.buf, self.pos)
        self.pos += n
        return value

    def u32(self) -> int:
        return self.scalar("I")

    def u64(self) -> int:
        return self.scalar("Q")

    def string(self) -> str:
        n = self.u64()
        self._need(n)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8", errors="replace")

    def strings(self, count: int) -> list[str]:
        """`count` strings, decoded in a tight loop (the token list of a 150k vocab in ~0.1 s)."""
        unpack = struct.Struct(self.bo + "Q").unpack_from
        buf, pos, out = self.buf, self.pos, []
        try:
            for _ in range(count):
                n = unpack(buf, pos)[0]
                pos += 8
                if pos + n > self.size:
                    raise _Truncated(pos + n)
                out.append(buf[pos : pos + n].decode("utf-8", errors="replace"))
                pos += n
        except struct.error:
            raise _Truncated(pos + 8) from None
        self.pos = pos
        return out

    def skip_strings(self, count: int) -> None:
        """Jump over `count` strings: the hot loop of reading a header (150k tokens + 150k merges)."""
        unpack = struct.Struct(self.bo + "Q").unpack_from
        buf, pos = self.buf, self.pos
        try:
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
        except struct.error:
            raise _Truncated(pos + 8) from None
        if pos > self.size:
            raise _Truncated(pos)
        self.pos = pos

    def value(self, vtype: int) -> Any:
        fmt = _SCALAR_FORMATS.get(vtype)
        if fmt is not None:
            return self.scalar(fmt)
        if vtype == ValueType.STRING:
            return self.string()
        if vtype == ValueType.ARRAY:
            item_type = self.u32()
            return self.items(item_type, self.u64())
        raise _Corrupt(f"unknown metadata value type {vtype} at byte {self.pos}")

    def items(self, item_type: int, count: int) -> list[Any]:
        """`count` values of one type; numbers in a single struct call."""
        fmt = _SCALAR_FORMATS.get(item_type)
        if item_type == ValueType.STRING:
            return self.strings(count)
        if fmt is None:
            return [self.value(item_type) for _ in range(count)]
        n = count * struct.calcsize(fmt)
        self._need(n)
        values = list(struct.unpack_from(f"{self.bo}{count}{fmt}", self.buf, self.pos))
        self.pos += n
        return values

    def array_or_ref(self) -> list[Any] | ArrayRef:
        """Decode a short array; skip a long one (strings one length at a time, numbers in one jump)."""
        item_type = self.u32()
        count = self.u64()
        start = self.pos
        fmt = _SCALAR_FORMATS.get(item_type)
        if count <= (INLINE_ARRAY_MAX if fmt is None else INLINE_NUMBER_ARRAY_MAX):
            return self.items(item_type, count)
        if fmt is not None:
            n = count * struct.calcsize(fmt)
            self._need(n)
            self.pos += n
        elif item_type == ValueType.STRING:
            self.skip_strings(count)
        else:  # arrays of arrays: rare and small in practice; walk them
            for _ in range(count):
                self.value(item_type)
        return ArrayRef(item_type, count, start)


class _Corrupt(Exception):
    """Raised inside the parser for a structurally impossible header."""


def read_gguf(path: str | os.PathLike[str], *, allow_truncated: bool = False) -> GGUFInfo:
    """Parse the header of the GGUF file at `path`; raise `ModelFileError` with one clear line if the
    file is missing, is not a GGUF, has an unsupported version, is corrupt, or is truncated.

    `allow_truncated=True` returns the info of a file whose header is complete but whose tensor data is
    cut (`info.is_truncated` is then true): for diagnostics such as `specchat doctor`.
    """
    path = Path(path)
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a GGUF file")
    try:
        file_size = path.stat().st_size
        f = open(path, "rb")  # noqa: SIM115 - closed below, after the mapping
    except FileNotFoundError:
        raise ModelFileError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise ModelFileError(f"{path} is a directory, not a GGUF file") from None
    except OSError as err:
        raise ModelFileError(f"cannot read {path}: {err.strerror or err}") from None
    with f:
        head = f.read(8)
        _check_magic(path, head, file_size)
        with _map(f, file_size) as buf:
            return _parse(buf, path, file_size, allow_truncated)


def _check_magic(path: Path, head: bytes, file_size: int) -> None:
    if head[:4] != GGUF_MAGIC:
        if file_size == 0:
            raise ModelFileError(f"{path} is empty, not a GGUF file — {REDOWNLOAD_HINT}")
        raise ModelFileError(f"{path} is not a GGUF file (starts with {_describe_start(head)})")
    if len(head) < 8:
        raise ModelFileError(
            f"{path} is truncated: {file_size} bytes, expected at least 8 — {REDOWNLOAD_HINT}"
        )


def _describe_start(head: bytes) -> str:
    """Show the first bytes readably: text files as text, binary as hex."""
    sample = head[:8]
    try:
        text = sample.decode("ascii")
        if text.isprintable():
            return repr(text)
    except UnicodeDecodeError:
        pass
    return sample.hex(" ")


def _parse(buf: mmap.mmap, path: Path, file_size: int, allow_truncated: bool) -> GGUFInfo:
    # The version tells the byte order: GGUF files written on big-endian machines store it swapped.
    (version,) = struct.unpack_from("<I", buf, 4)
    byteorder = "<"
    if version not in SUPPORTED_VERSIONS and (version & 0xFFFF) == 0:
        (swapped,) = struct.unpack_from(">I", buf, 4)
        if swapped in SUPPORTED_VERSIONS:
            version, byteorder = swapped, ">"
    if version not in SUPPORTED_VERSIONS:
        raise ModelFileError(
            f"{path} uses GGUF version {version}, which specchat cannot read (supported: "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))}) — convert it again with a current llama.cpp"
        )

    r = _Reader(buf, path, byteorder)
    r.pos = 8
    try:
        n_tensors = r.u64()
        n_kv = r.u64()
        # Each tensor info is at least 24 bytes, each KV at least 13: absurd counts mean garbage.
        if n_tensors * 24 + n_kv * 13 > max(file_size, 1 << 40):
            raise _Corrupt(f"impossible counts ({n_tensors} tensors, {n_kv} metadata entries)")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.u32()
            metadata[key] = r.array_or_ref() if vtype == ValueType.ARRAY else r.value(vtype)

        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.u32()
            if n_dims > 8:
                raise _Corrupt(f"tensor {name!r} has {n_dims} dimensions")
            shape = tuple(r.u64() for _ in range(n_dims))
            tensors.append(TensorInfo(name, shape, r.u32(), r.u64()))
    except _Truncated as t:
        raise _truncated_error(path, file_size, t.needed) from None
    except _Corrupt as c:
        raise ModelFileError(f"{path} is a corrupt GGUF file: {c}") from None

    header_size = r.pos
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_offset = -(-header_size // alignment) * alignment
    data_end = data_offset if tensors else header_size  # vocab-only files need no padding
    for t in tensors:
        nbytes = t.nbytes
        # An unknown type still occupies at least one byte at its offset: a lower bound keeps us honest.
        data_end = max(data_end, data_offset + t.offset + (nbytes if nbytes is not None else 1))

    info = GGUFInfo(
        path=path,
        version=version,
        byteorder=byteorder,
        metadata=metadata,
        tensors=tuple(tensors),
        alignment=alignment,
        header_size=header_size,
        data_offset=data_offset,
        tensor_data_end=data_end,
        file_size=file_size,
    )
    if info.is_truncated and not allow_truncated:
        raise _truncated_error(path, file_size, data_end)
    return info


def _truncated_error(path: Path, file_size: int, needed: int) -> ModelFileError:
    return ModelFileError(
        f"{path} is truncated: {file_size} bytes, expected at least {needed} — {REDOWNLOAD_HINT}"
    )
