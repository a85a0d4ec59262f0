"""Tiny one-layer llama GGUF files whose every matmul weight has one ggml type: the models the build
self-check (buildcheck) and the batch-invariance probe (invariance) evaluate.

Why here and hand-written: both probes run in a child process of a fresh install, before the `gguf`
package is there (it is a dev extra), and they must reach the kernels real models use -- so the
weights are real quantised blocks (random quants, scales set so every value decodes to a finite
number of a sensible spread) in shapes the repack/AMX/tiled kernels accept (`PROBE_SHAPES`). The
probes compare llama.cpp with itself, so no float weights are needed to start from.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

#: Every weight matrix has rows and columns that are multiples of 256: K-quant blocks span 256 columns
#: (QK_K), the x86 repack kernels want row counts divisible by 8 and the AMX kernels output widths
#: divisible by 32 (TILE_N * 2) and inputs divisible by 32 or 256 (ggml-cpu/amx/amx.cpp supports_op,
#: ggml-cpu/repack.cpp ggml_repack_get_optimal_repack_type). The vocab (288) is the one output
#: dimension that is not, but it is still a multiple of 32.
#: Two query heads share each KV head (grouped-query attention, as in every model the registry ships),
#: so the probe covers flash attention's grouped path with more than one head per group.
PROBE_SHAPES = {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2, "n_vocab": 288, "n_ctx": 64}

#: ggml type name -> (ggml_type id, values per block, bytes per block)
GGML_TYPES = {
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "BF16": (30, 1, 2),
    "Q4_0": (2, 32, 18),
    "Q5_0": (6, 32, 22),
    "Q8_0": (8, 32, 34),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
}
#: the GGUF general.file_type (llama_ftype) a file of all-`type` weights declares
FILE_TYPES = {"F16": 1, "BF16": 32, "Q4_0": 2, "Q5_0": 8, "Q8_0": 7, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18}


def _blocks(qtype: str, n_out: int, n_in: int, rng: Any, gain: float = 1.0) -> bytes:
    """Random weights for an (n_out, n_in) matrix with values of std ~ gain / sqrt(n_in).

    Quantised types: the quants are random bytes and only the scales are set (`spread` is the std of
    one block's decoded integers), so every value decodes to a finite number. F16 and BF16: normal
    values (BF16 as the top half of each float32, which numpy has no type for)."""
    import numpy as np

    if qtype in ("F16", "BF16"):
        values = rng.standard_normal((n_out, n_in)) * gain / np.sqrt(n_in)
        if qtype == "F16":
            return values.astype(np.float16).tobytes()
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    _, block, size = GGML_TYPES[qtype]
    n_blocks = n_out * n_in // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    spread = {"Q4_0": 4.6, "Q5_0": 9.2, "Q8_0": 73.0, "Q4_K": 261.0, "Q5_K": 330.0, "Q6_K": 425.0}[qtype]
    d = np.full(n_blocks, gain / (spread * np.sqrt(n_in)), dtype=np.float16)
    if qtype == "Q6_K":  # ql[128] qh[64] int8 scales[16] d: scales kept moderate, d last
        raw[:, 192:208] = rng.integers(-40, 40, size=(n_blocks, 16)).astype(np.int8).view(np.uint8)
        raw[:, 208:210] = d.view(np.uint8).reshape(-1, 2)
        return raw.tobytes()
    raw[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    if qtype in ("Q4_K", "Q5_K"):  # w = d * scale * q - dmin * min: dmin centres the weights on zero
        centre = {"Q4_K": 7.5, "Q5_K": 15.5}[qtype]
        raw[:, 2:4] = (d * np.float16(centre)).view(np.uint8).reshape(-1, 2)
    return raw.tobytes()


def _gguf_string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _gguf_kv(key: str, value: Any) -> bytes:
    """One GGUF metadata pair: strings, u32 ints, f32 floats, bools, and arrays of str / i32 / f32."""
    head = _gguf_string(key)
    if isinstance(value, bool):
        return head + struct.pack("<IB", 7, value)
    if isinstance(value, int):
        return head + struct.pack("<II", 4, value)
    if isinstance(value, float):
        return head + struct.pack("<If", 6, value)
    if isinstance(value, str):
        return head + struct.pack("<I", 8) + _gguf_string(value)
    items = list(value)
    if all(isinstance(v, str) for v in items):
        return head + struct.pack("<IIQ", 9, 8, len(items)) + b"".join(_gguf_string(v) for v in items)
    if all(isinstance(v, int) for v in items):
        return head + struct.pack("<IIQ", 9, 5, len(items)) + struct.pack(f"<{len(items)}i", *items)
    return head + struct.pack("<IIQ", 9, 6, len(items)) + struct.pack(f"<{len(items)}f", *items)


def write_probe_gguf(
    path: Path, qtype: str, *, seed: int = 0, n_ctx: int | None = None, tied: bool = False
) -> Path:
    """A one-layer llama GGUF whose every matmul weight is `qtype` (see PROBE_SHAPES), with a
    SentencePiece vocab of byte tokens; written directly (GGUF v3) so the probe needs no `gguf` package.
    `n_ctx` (default PROBE_SHAPES) is the context length the file declares. `tied`: no output matrix,
    the embedding (then `qtype` too) doubles as the output, as on Qwen2.5's small models."""
    import numpy as np

    s = PROBE_SHAPES
    n_embd, n_ff, n_vocab = s["n_embd"], s["n_ff"], s["n_vocab"]
    n_kv = n_embd * s["n_head_kv"] // s["n_head"]  # K and V rows: head_dim x KV heads
    rng = np.random.default_rng(seed)
    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "general.name": f"specchat-probe-{qtype}",
        "general.file_type": FILE_TYPES[qtype],
        "general.alignment": 32,
        "llama.context_length": n_ctx or s["n_ctx"],
        "llama.embedding_length": n_embd,
        "llama.block_count": 1,
        "llama.feed_forward_length": n_ff,
        "llama.attention.head_count": s["n_head"],
        "llama.attention.head_count_kv": s["n_head_kv"],
        "llama.rope.dimension_count": n_embd // s["n_head"],
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.vocab_size": n_vocab,
        **vocab_meta(n_vocab),
    }

    def f32(*shape: int) -> tuple[str, tuple[int, ...], bytes]:
        return "F32", shape, (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32).tobytes()

    def q(n_out: int, n_in: int, gain: float = 1.0) -> tuple[str, tuple[int, ...], bytes]:
        return qtype, (n_in, n_out), _blocks(qtype, n_out, n_in, rng, gain)  # ggml lists dims inner first

    tensors = {
        "token_embd.weight": (
            "F32",
            (n_embd, n_vocab),
            rng.standard_normal((n_vocab, n_embd), np.float32).tobytes(),
        ),
        "blk.0.attn_norm.weight": f32(n_embd),
        "blk.0.attn_q.weight": q(n_embd, n_embd, 2.0),
        "blk.0.attn_k.weight": q(n_kv, n_embd, 2.0),
        "blk.0.attn_v.weight": q(n_kv, n_embd),
        "blk.0.attn_output.weight": q(n_embd, n_embd),
        "blk.0.ffn_norm.weight": f32(n_embd),
        "blk.0.ffn_gate.weight": q(n_ff, n_embd),
        "blk.0.ffn_up.weight": q(n_ff, n_embd),
        "blk.0.ffn_down.weight": q(n_embd, n_ff),
        "output_norm.weight": f32(n_embd),
        "output.weight": q(n_vocab, n_embd, 4.0),
    }
    if tied:  # llama.cpp loads token_embd.weight a second time as the output (TENSOR_DUPLICATED)
        tensors["token_embd.weight"] = tensors.pop("output.weight")
    return write_gguf(path, meta, tensors)


def vocab_meta(n_vocab: int) -> dict[str, Any]:
    """A SentencePiece vocab of byte tokens (ids 3..258), padded to `n_vocab`: the probes feed ids."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    tokens += [f"[pad{i}]" for i in range(n_vocab - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259)  # unknown, control, byte, normal
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * n_vocab,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


#: a tensor to write: (ggml type name, dims inner first, raw bytes)
Tensor = tuple[str, tuple[int, ...], bytes]


def write_gguf(path: Path, meta: dict[str, Any], tensors: dict[str, Tensor]) -> Path:
    """A GGUF v3 file of `meta` and `tensors`, 32-byte aligned."""
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    header += b"".join(_gguf_kv(k, v) for k, v in meta.items())
    offset, infos, datas = 0, [], []
    for name, (kind, shape, data) in tensors.items():
        infos.append(
            _gguf_string(name)
            + struct.pack(f"<I{len(shape)}Q", len(shape), *shape)
            + struct.pack("<IQ", GGML_TYPES[kind][0], offset)
        )
        pad = -len(data) % 32
        datas.append(data + b"\0" * pad)
        offset += len(data) + pad
    header += b"".join(infos)
    header += b"\0" * (-len(header) % 32)
    path.write_bytes(header + b"".join(datas))
    return path
