"""Real-size GGUF models with random Q4_0 weights: what a timing needs where the real files are not.

How long a decode takes depends on the shapes and the weight type, not on the weights' values, so a
Llama-3-8B-shaped target and a Llama-3.2-1B-shaped draft, Q4_0 throughout (norms in F32), time like
the real pair on the same build (tests/perf/curves/cuda-rtx3090-8b.json is llama-bench's 8B Q4_0 and
1B Q4_0). Both share one tokenizer (tests/tiny_models.py's byte-level BPE, padded with unused tokens to
the real vocab size), so specchat's pair check accepts them.

Q4_0 blocks are written raw: per 32 weights an f16 scale then 16 bytes of 4-bit values (x = (q - 8) * d).
The 4-bit values are random bytes (one pool, read at a random offset per tensor); the scale is one
finite f16 per tensor, chosen so that each matrix has about the spread of a trained one (std
gain / sqrt(n_in)): activations stay finite through every layer and the logits have a spread of a
few units, as a real model's do (the greedy tie margin, measured from batched-vs-one-token rounding,
scales with them). Tensors are streamed to the file one at a time: an 8B writes in seconds in a few
hundred MB of memory.

Usage (also a library: `write_random_gguf(path, PRESETS["llama-8b"])`):
  python tests/perf/device/random_gguf.py OUT.gguf --preset llama-8b [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

QK4_0 = 32  # weights per Q4_0 block
Q4_0_BLOCK_BYTES = 2 + QK4_0 // 2  # f16 scale + 32 nibbles
#: the standard deviation of (q - 8) for q uniform on 0..15: a Q4_0 block's spread in units of d
Q4_0_STD = float(np.sqrt((16**2 - 1) / 12))


@dataclass(frozen=True, slots=True)
class Shape:
    """A llama-architecture model's hyperparameters."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    vocab: int
    tied: bool = False  # no output.weight: llama.cpp multiplies by token_embd (Llama 3.2 1B)
    rope_base: float = 500000.0
    n_ctx_train: int = 8192
    label: str = ""

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def matrices(self) -> list[tuple[str, int, int, float]]:
        """(name, rows, columns, gain) of every quantised matrix, in file order (numpy's (out, in))."""
        kv = self.n_head_kv * self.head_dim
        # token_embd: its rows are the layer-0 input (RMSNorm rescales them) and, tied, the output
        # matrix too, so it gets the output's spread (logits of std ~3)
        out = [("token_embd.weight", self.vocab, self.n_embd, 3.0)]
        for i in range(self.n_layer):
            p = f"blk.{i}."
            out += [
                (p + "attn_q.weight", self.n_embd, self.n_embd, 1.0),
                (p + "attn_k.weight", kv, self.n_embd, 1.0),
                (p + "attn_v.weight", kv, self.n_embd, 1.0),
                (p + "attn_output.weight", self.n_embd, self.n_embd, 0.5),
                (p + "ffn_gate.weight", self.n_ff, self.n_embd, 1.0),
                (p + "ffn_up.weight", self.n_ff, self.n_embd, 1.0),
                (p + "ffn_down.weight", self.n_embd, self.n_ff, 0.5),
            ]
        if not self.tied:
            out.append(("output.weight", self.vocab, self.n_embd, 3.0))
        return out

    def norms(self) -> list[str]:
        return [f"blk.{i}.{n}_norm.weight" for i in range(self.n_layer) for n in ("attn", "ffn")] + [
            "output_norm.weight"
        ]

    def n_params(self) -> int:
        return sum(r * c for _, r, c, _ in self.matrices()) + self.n_embd * len(self.norms())

    def file_bytes(self) -> int:
        """About the GGUF's size (tensor data; the header adds the vocabulary, a few MB)."""
        q = sum(r * c for _, r, c, _ in self.matrices()) // QK4_0 * Q4_0_BLOCK_BYTES
        return q + 4 * self.n_embd * len(self.norms())


#: the pair of tests/perf/curves/cuda-rtx3090-8b.json (Llama 3 8B, Llama 3.2 1B), and tiny stand-ins
#: of the same layout for a dry run on a CPU (seconds) and the test suite (milliseconds)
PRESETS: dict[str, Shape] = {
    "llama-8b": Shape(4096, 32, 32, 8, 14336, 128256, label="llama 8B Q4_0 (Llama 3 8B shapes)"),
    "llama-1b": Shape(2048, 16, 32, 8, 8192, 128256, tied=True, label="llama 1B Q4_0 (Llama 3.2 1B shapes)"),
    "small-target": Shape(512, 8, 8, 2, 1536, 4096, label="small llama 30M Q4_0 (dry run)"),
    "small-draft": Shape(256, 4, 4, 2, 768, 4096, tied=True, label="small llama 3M Q4_0 (dry run)"),
    "tiny-target": Shape(64, 2, 4, 2, 128, 512, n_ctx_train=2048, label="tiny llama Q4_0 (tests)"),
    "tiny-draft": Shape(32, 1, 2, 1, 64, 512, tied=True, n_ctx_train=2048, label="tiny llama Q4_0 (tests)"),
}


def q4_0_scale(n_in: int, gain: float) -> np.ndarray:
    """The f16 scale (as 2 little-endian bytes) giving weights of std gain / sqrt(n_in)."""
    d = np.float16(gain / (np.sqrt(n_in) * Q4_0_STD))
    if not (np.isfinite(d) and d > 0):
        raise ValueError(f"Q4_0 scale {d} for n_in={n_in}, gain={gain} is not a finite positive f16")
    return np.frombuffer(np.array([d], dtype="<f2").tobytes(), dtype=np.uint8)


def write_random_gguf(path: str | Path, shape: Shape, *, seed: int = 0, name: str | None = None) -> Path:
    """Write a llama-architecture GGUF of `shape` with random Q4_0 weights; return its path."""
    import gguf

    from tests.tiny_models import CHATML_TEMPLATE, add_gpt2_tokenizer

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if shape.n_embd % shape.n_head or shape.n_head % shape.n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    mats = shape.matrices()
    for tname, _, cols, _ in mats:
        if cols % QK4_0:
            raise ValueError(f"{tname}: {cols} columns is not a multiple of {QK4_0} (Q4_0 blocks)")

    w = gguf.GGUFWriter(path, "llama")
    w.add_name(name or shape.label or "random-llama-q4_0")
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(shape.vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    _, ids = add_gpt2_tokenizer(w, shape.vocab)
    w.add_bos_token_id(ids["bos"])
    w.add_eos_token_id(ids["eos"])
    w.add_eot_token_id(ids["eot"])
    w.add_pad_token_id(ids["pad"])
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    # every tensor's info first (the header holds them all), then the data one tensor at a time
    norm_names = shape.norms()
    for tname, rows, cols, _ in mats:
        nbytes = rows * cols // QK4_0 * Q4_0_BLOCK_BYTES
        w.add_tensor_info(
            tname,
            (rows, nbytes // rows),
            np.dtype(np.uint8),
            nbytes,
            raw_dtype=gguf.GGMLQuantizationType.Q4_0,
        )
    for tname in norm_names:
        w.add_tensor_info(tname, (shape.n_embd,), np.dtype(np.float32), 4 * shape.n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    rng = np.random.default_rng(seed)
    most = max(rows * cols // QK4_0 for _, rows, cols, _ in mats)
    spare = max(1024, most // 16)
    pool = np.frombuffer(rng.bytes((most + spare) * (QK4_0 // 2)), dtype=np.uint8).reshape(-1, QK4_0 // 2)
    buf = np.empty((most, Q4_0_BLOCK_BYTES), dtype=np.uint8)
    for _tname, rows, cols, gain in mats:
        n = rows * cols // QK4_0
        off = int(rng.integers(0, spare))
        blocks = buf[:n]
        blocks[:, 2:] = pool[off : off + n]
        blocks[:, :2] = q4_0_scale(cols, gain)
        w.write_tensor_data(blocks)
    for _ in norm_names:
        w.write_tensor_data((1.0 + 0.05 * rng.standard_normal(shape.n_embd)).astype(np.float32))
    w.close()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama-8b")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    shape = PRESETS[args.preset]
    t = time.perf_counter()
    write_random_gguf(args.out, shape, seed=args.seed)
    print(
        f"{args.out}: {shape.label}, {shape.n_params() / 1e9:.2f}B parameters, "
        f"{args.out.stat().st_size / 2**30:.2f} GiB, written in {time.perf_counter() - t:.1f} s"
    )


if __name__ == "__main__":
    main()
