"""The pure-Python GGUF header reader: facts from real (tiny) files, and one clear line for bad files."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from specchat.errors import ModelFileError
from specchat.models.ggml_types import GGML_TYPES
from specchat.models.gguf import ArrayRef, read_gguf

from .tiny_models import (
    CHATML_TEMPLATE,
    gpt2_vocab,
    write_tiny_llama,
)

REAL_MODELS = Path.home() / ".cache/specchat-dev/models"


def test_tiny_model_facts(tiny_target: Path) -> None:
    info = read_gguf(tiny_target)
    assert info.version == 3
    assert info.architecture == "llama"
    assert (info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == (2, 64, 4, 4)
    assert (info.key_length, info.value_length) == (16, 16)
    assert info.context_length == 512
    assert info.chat_template == CHATML_TEMPLATE
    assert info.tokenizer_model == "gpt2"
    assert info.file_type == "F32"
    assert info.n_vocab == 512
    assert info.file_size == tiny_target.stat().st_size
    assert info.expected_size <= info.file_size < info.expected_size + info.alignment
    assert not info.is_truncated
    assert info.metadata["tokenizer.ggml.eos_token_id"] == gpt2_vocab(512)[3]["eos"]


def test_big_arrays_are_skipped_but_readable(tiny_target: Path) -> None:
    info = read_gguf(tiny_target)
    ref = info.get("tokenizer.ggml.tokens")
    assert isinstance(ref, ArrayRef) and len(ref) == 512
    assert info.array("tokenizer.ggml.tokens") == gpt2_vocab(512)[0]
    assert info.array("tokenizer.ggml.merges") == gpt2_vocab(512)[2]


def test_agrees_with_the_reference_reader(tiny_target: Path) -> None:
    """Tensor table and data offset match gguf-py's own reader (the format's reference in Python)."""
    ours = read_gguf(tiny_target)
    ref = gguf.GGUFReader(tiny_target)
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for mine, theirs in zip(ours.tensors, ref.tensors, strict=True):
        assert mine.shape == tuple(int(d) for d in theirs.shape)
        assert mine.ggml_type == int(theirs.tensor_type)
        assert ours.data_offset + mine.offset == theirs.data_offset
        assert mine.nbytes == theirs.n_bytes
    assert ours.n_params == sum(int(t.n_elements) for t in ref.tensors)


def test_type_table_matches_ggml() -> None:
    for qtype, (block, size) in gguf.GGML_QUANT_SIZES.items():
        assert (GGML_TYPES[int(qtype)].block_size, GGML_TYPES[int(qtype)].type_size) == (block, size)
        assert GGML_TYPES[int(qtype)].name == qtype.name


def test_grouped_query_attention(tmp_path: Path) -> None:
    info = read_gguf(write_tiny_llama(tmp_path / "gqa.gguf", n_head=4, n_head_kv=2))
    assert (info.n_head, info.n_head_kv, info.n_head_kv_per_layer) == (4, 2, [2, 2])


def _write_custom(path: Path, *, endian: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE) -> Path:
    """A small GGUF holding every metadata value type and two tensors of different ggml types."""
    w = gguf.GGUFWriter(path, "custom", endianess=endian)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float32("t.f32", 0.5)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo 🦙")
    w.add_array("t.small", [1, 2, 3])
    w.add_array("t.layers", list(range(100)))  # numeric: decoded inline even when longer than 64
    w.add_array("t.strings", [f"s{i}" for i in range(1000)])
    w.add_array("t.floats", [float(i) for i in range(10_000)])
    w.add_tensor("a", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor(
        "b", np.zeros(272 * 3, dtype=np.uint8).reshape(3, 272), raw_dtype=gguf.GGMLQuantizationType.Q8_0
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_value_type(tmp_path: Path, endian: gguf.GGUFEndian) -> None:
    info = read_gguf(_write_custom(tmp_path / "custom.gguf", endian=endian))
    m = info.metadata
    assert info.byteorder == ("<" if endian == gguf.GGUFEndian.LITTLE else ">")
    assert (m["t.u8"], m["t.i8"], m["t.u16"], m["t.i16"]) == (200, -100, 60000, -30000)
    assert (m["t.u32"], m["t.i32"], m["t.u64"], m["t.i64"]) == (
        4_000_000_000,
        -2_000_000_000,
        2**63 + 5,
        -(2**62),
    )
    assert m["t.f32"] == 0.5 and m["t.f64"] == 0.1 and m["t.bool"] is True
    assert m["t.str"] == "héllo 🦙"
    assert m["t.small"] == [1, 2, 3]
    assert m["t.layers"] == list(range(100))
    assert isinstance(m["t.strings"], ArrayRef) and isinstance(m["t.floats"], ArrayRef)
    assert info.array("t.strings")[999] == "s999"
    assert info.array("t.floats")[-1] == 9999.0
    a, b = info.tensors
    assert (a.shape, a.type_name, a.nbytes) == ((32, 2), "F32", 256)
    assert (b.shape, b.type_name, b.nbytes) == ((256, 3), "Q8_0", 3 * 8 * 34)
    assert info.tensor_data_end == info.data_offset + b.offset + b.nbytes


def test_header_only_is_read(tmp_path: Path) -> None:
    """A file announcing 2 GiB of tensor data (sparse on disk) is checked without reading the data."""
    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    n = 1 << 30
    w.add_tensor_info("big", (n,), np.dtype(np.float16), 2 * n)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header_end = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(-(-header_end // 32) * 32 + 2 * n)
    info = read_gguf(path)
    assert info.expected_size == info.file_size == path.stat().st_size

    with open(path, "r+b") as f:
        f.truncate(info.file_size - 1)
    with pytest.raises(ModelFileError, match=rf"expected at least {info.expected_size}\b"):
        read_gguf(path)


def test_vocab_only_file(tmp_path: Path) -> None:
    """A GGUF with metadata and no tensors (llama.cpp's ggml-vocab-*.gguf) is complete as it is."""
    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_token_list(["a", "b", "c"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = read_gguf(path)
    assert info.tensors == () and not info.is_truncated
    assert info.get("tokenizer.ggml.tokens") == ["a", "b", "c"] and info.n_vocab == 3


def test_text_file_is_not_gguf(not_a_gguf: Path) -> None:
    with pytest.raises(ModelFileError) as err:
        read_gguf(not_a_gguf)
    assert str(err.value) == f"{not_a_gguf} is not a GGUF file (starts with 'these ar')"


def test_binary_garbage_is_shown_as_hex(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"\x00\x01\x02\x03\xff\xfe\xfd\xfc rest")
    with pytest.raises(ModelFileError, match=r"starts with 00 01 02 03 ff fe fd fc\)$"):
        read_gguf(path)


def test_truncated_tensor_data(tiny_truncated: Path, tiny_target: Path) -> None:
    full = tiny_target.stat().st_size
    with pytest.raises(ModelFileError) as err:
        read_gguf(tiny_truncated)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{tiny_truncated} is truncated: {full // 2} bytes, expected at least ")
    expected = int(message.split("expected at least ")[1].split()[0])
    assert full - 32 < expected <= full
    assert "specchat pull --force" in message

    info = read_gguf(tiny_truncated, allow_truncated=True)
    assert info.is_truncated and info.expected_size == expected


@pytest.mark.parametrize("keep", [4, 7, 30, 700, 9000])
def test_truncated_inside_header(tiny_target: Path, tmp_path: Path, keep: int) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_target.read_bytes()[:keep])
    with pytest.raises(
        ModelFileError, match=rf"^{path} is truncated: {keep} bytes, expected at least \d+ — "
    ):
        read_gguf(path)


def test_empty_missing_and_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelFileError, match="is empty"):
        read_gguf(empty)
    with pytest.raises(ModelFileError, match="does not exist"):
        read_gguf(tmp_path / "missing.gguf")
    with pytest.raises(ModelFileError, match="is a directory"):
        read_gguf(tmp_path)


@pytest.mark.parametrize("version", [1, 4, 99])
def test_unsupported_version(tiny_target: Path, tmp_path: Path, version: int) -> None:
    data = bytearray(tiny_target.read_bytes())
    data[4:8] = version.to_bytes(4, "little")
    path = tmp_path / "v.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=rf"uses GGUF version {version}, which specchat cannot read"):
        read_gguf(path)


def test_corrupt_counts(tiny_target: Path, tmp_path: Path) -> None:
    data = bytearray(tiny_target.read_bytes())
    data[8:16] = (2**62).to_bytes(8, "little")  # tensor count
    path = tmp_path / "c.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="corrupt GGUF"):
        read_gguf(path)


@pytest.mark.slow
@pytest.mark.parametrize("size", ["1.5b", "0.5b"])
def test_real_qwen(size: str) -> None:
    path = REAL_MODELS / f"qwen2.5-coder-{size}-instruct-q4_k_m.gguf"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    info = read_gguf(path)
    assert info.architecture == "qwen2" and info.file_type == "Q4_K_M"
    assert info.expected_size == info.file_size
    assert info.n_vocab == 151936 and info.n_head_kv == 2 and info.context_length == 32768
    assert "<|im_start|>" in (info.chat_template or "")
