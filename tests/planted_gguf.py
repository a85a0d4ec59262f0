"""The parts every random-weight GGUF with a planted pattern shares: tokenizer, pattern, weights, writer.

Why a planted pattern: random weights alone give a draft that never agrees with its target (or, as
perturbed copies, one that agrees only when it has the target's very layout). Here every model of a
family carries the same hidden rule over its vocabulary, "after token v comes succ[v]" (one random
cycle through all ordinary tokens, so following it never repeats a short loop), and adds its own random
noise on top. Through that shared rule a target, a draft of another architecture and an MTP head agree
as often as the rule beats their noise, however different their layers are.

How a model carries the rule: its input embedding row E[v] is a random vector, and its output row
succ[v] is the unit vector of E[v] times `logit_scale` (control and unused tokens get a zero row, so
they are never the argmax). The embedding reaches the final hidden state through the residual stream;
every layer adds random context-dependent noise to it (residual writers drawn with gain `noise`). At the
final norm the hidden state h has RMS ~1, so the rule's token scores ~logit_scale * sqrt(width) * cos(h,
E[v]) and every other token ~logit_scale * N(0, 1): the rule wins while the signal's share of h beats
the largest of n_vocab Gaussians (~3 for 512 tokens, ~4.9 for 151,936). `noise` sets that share, so
how often each model follows the rule (its "planted rate"); a draft with rate p_d agrees with a target
of rate p_t about p_t * p_d of the time, and the rule's misses, steered by the context, keep the text
from repeating.

Tensors are described first (name, numpy shape (out, in), how to make it) and written one at a time,
each from its own seeded generator: memory holds one tensor at a time (and the embedding, until the
output matrix made from it is written), and a tensor's values depend only on (seed, name), never on
which tensors were written before it.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np

from .tiny_models import CHATML_TEMPLATE, gpt2_vocab

QType = Literal["f32", "f16", "q8_0"]
PATTERN_SEED = 1
LOGIT_SCALE = 3.0
QK8_0 = 32  # weights per Q8_0 block
Q8_0_BLOCK_BYTES = 2 + QK8_0  # f16 scale + 32 int8
FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}


# ---------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------


@dataclass
class Vocab:
    """A tokenizer to write into a GGUF: every `tokenizer.*` key with its GGUF type, plus which token
    ids are ordinary text (the planted rule runs over those only)."""

    fields: dict[str, tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType | None]]
    types: np.ndarray  # int32 token types, one per token
    label: str

    @property
    def n_vocab(self) -> int:
        return len(self.types)

    @property
    def ordinary(self) -> np.ndarray:
        """Ids of the tokens a model may emit: NORMAL (and BYTE) tokens, not control/unused ones."""
        ok = (self.types == gguf.TokenType.NORMAL) | (self.types == gguf.TokenType.BYTE)
        return np.flatnonzero(ok)

    def add_to(self, w: gguf.GGUFWriter) -> None:
        for key, (value, vtype, sub) in self.fields.items():
            w.add_key_value(key, value, vtype, sub_type=sub)

    @classmethod
    def synthetic(cls, n_vocab: int = 512) -> Vocab:
        """tests/tiny_models.py's byte-level BPE (ChatML control tokens), padded to `n_vocab`."""
        tokens, types, merges, ids = gpt2_vocab(n_vocab)
        A, S, U, B = (
            gguf.GGUFValueType.ARRAY,
            gguf.GGUFValueType.STRING,
            gguf.GGUFValueType.UINT32,
            gguf.GGUFValueType.BOOL,
        )
        fields = {
            gguf.Keys.Tokenizer.MODEL: ("gpt2", S, None),
            gguf.Keys.Tokenizer.PRE: ("qwen2", S, None),
            gguf.Keys.Tokenizer.LIST: (tokens, A, S),
            gguf.Keys.Tokenizer.TOKEN_TYPE: (types, A, gguf.GGUFValueType.INT32),
            gguf.Keys.Tokenizer.MERGES: (merges, A, S),
            gguf.Keys.Tokenizer.BOS_ID: (ids["bos"], U, None),
            gguf.Keys.Tokenizer.EOS_ID: (ids["eos"], U, None),
            gguf.Keys.Tokenizer.EOT_ID: (ids["eot"], U, None),
            gguf.Keys.Tokenizer.PAD_ID: (ids["pad"], U, None),
            gguf.Keys.Tokenizer.ADD_BOS: (False, B, None),
            gguf.Keys.Tokenizer.ADD_EOS: (False, B, None),
            gguf.Keys.Tokenizer.CHAT_TEMPLATE: (CHATML_TEMPLATE, S, None),
        }
        return cls(fields, np.asarray(types, dtype=np.int32), f"synthetic BPE, {n_vocab} tokens")

    @classmethod
    def from_gguf(cls, path: str | Path) -> Vocab:
        """Every `tokenizer.*` key of an existing GGUF (its vocabulary, merges, special ids and chat
        template), read without loading its weights."""
        reader = gguf.GGUFReader(str(path))
        fields: dict[str, tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType | None]] = {}
        types: np.ndarray | None = None
        for key, f in reader.fields.items():
            if not key.startswith("tokenizer."):
                continue
            vtype = f.types[0]
            sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
            value = f.contents()
            fields[key] = (value, vtype, sub)
            if key == gguf.Keys.Tokenizer.TOKEN_TYPE:
                types = np.asarray(value, dtype=np.int32)
        if types is None or gguf.Keys.Tokenizer.LIST not in fields:
            raise ValueError(f"{path} holds no tokenizer (no {gguf.Keys.Tokenizer.TOKEN_TYPE})")
        return cls(fields, types, f"tokenizer of {Path(path).name}, {len(types)} tokens")


# ---------------------------------------------------------------------------------------------------
# The planted rule and the tensors that carry it
# ---------------------------------------------------------------------------------------------------


def successors(vocab: Vocab, pattern_seed: int) -> np.ndarray:
    """succ[v] for every token id: one random cycle through the ordinary tokens (so the rule never
    closes a short loop), -1 for control and unused tokens."""
    ordinary = vocab.ordinary
    order = np.random.default_rng([pattern_seed, 0x5EED]).permutation(ordinary)
    succ = np.full(vocab.n_vocab, -1, dtype=np.int64)
    succ[order] = np.roll(order, -1)
    return succ


def planted_embedding(pattern_seed: int, n_vocab: int, width: int, *, rms: float = 1.0) -> np.ndarray:
    """A family's input embedding at one width: N(0, rms^2) rows, shared by its models of that width."""
    rng = np.random.default_rng([pattern_seed, width, 0xE])
    return rng.standard_normal((n_vocab, width), dtype=np.float32) * np.float32(rms)


def planted_output(inputs: np.ndarray, succ: np.ndarray, logit_scale: float) -> np.ndarray:
    """The output matrix that carries the rule: row succ[v] = logit_scale * unit(inputs[v]), where
    inputs[v] is what token v puts into the residual stream; rows no rule leads to are zero."""
    out = np.zeros_like(inputs)
    src = np.flatnonzero(succ >= 0)
    for part in np.array_split(src, max(1, len(src) // 8192)):  # slices: no full-size temporaries
        rows = inputs[part]
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        rows *= np.float32(logit_scale)
        out[succ[part]] = rows
    return out


@dataclass(frozen=True)
class Family:
    """What a target and its drafts share: the tokenizer and the planted rule over it."""

    vocab: Vocab
    pattern_seed: int = PATTERN_SEED
    logit_scale: float = LOGIT_SCALE

    def succ(self) -> np.ndarray:
        return successors(self.vocab, self.pattern_seed)

    def embedding(self, width: int, rms: float = 1.0) -> np.ndarray:
        return planted_embedding(self.pattern_seed, self.vocab.n_vocab, width, rms=rms)

    def io_specs(self, width: int, *, rms: float = 1.0, output: str = "output.weight") -> list[Spec]:
        """token_embd and the planted output matrix of a model whose residual stream starts as E[v]
        (times any constant: the output rows are unit vectors)."""
        n = self.vocab.n_vocab
        cache: dict[str, np.ndarray] = {}

        def embd() -> np.ndarray:
            cache["e"] = self.embedding(width, rms)
            return cache["e"]

        def out() -> np.ndarray:
            e = cache.pop("e", None)
            e = self.embedding(width, rms) if e is None else e
            return planted_output(e, self.succ(), self.logit_scale)

        return [Spec("token_embd.weight", (n, width), embd), Spec(output, (n, width), out)]


@functools.lru_cache(maxsize=4)
def tiny_family(n_vocab: int = 512) -> Family:
    """The tests' family: tests/tiny_models.py's tokenizer and pattern PATTERN_SEED (cached: a pure
    function of its argument, and building the vocabulary is most of a tiny model's write time)."""
    return Family(Vocab.synthetic(n_vocab))


class Noise:
    """Seeded random weights, each tensor from its own generator keyed by (seed, tensor name)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(name.encode())])

    def mat(self, name: str, n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        """(n_out, n_in) with entries N(0, gain^2 / n_in): maps an RMS-1 input to an RMS-`gain` output."""
        x = self.rng(name).standard_normal((n_out, n_in), dtype=np.float32)
        return x * np.float32(gain / np.sqrt(n_in))

    def vec(self, name: str, n: int, center: float = 1.0, spread: float = 0.1) -> np.ndarray:
        """A norm weight (or bias): center + spread * N(0, 1)."""
        x = self.rng(name).standard_normal(n, dtype=np.float32)
        return np.float32(center) + np.float32(spread) * x


# ---------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------


@dataclass
class Spec:
    """One tensor to write: its name, numpy shape (out, in), how to make it (called once, when its turn
    comes), and whether the file's weight type applies (matrices) or it stays F32 (norms, biases,
    convolution kernels, scalars)."""

    name: str
    shape: tuple[int, ...]
    make: Callable[[], np.ndarray]
    quantize: bool = True

    def qtype(self, qtype: QType) -> QType:
        if not self.quantize or len(self.shape) != 2:
            return "f32"
        if qtype == "q8_0" and self.shape[-1] % QK8_0:
            return "f16"
        return qtype

    def nbytes(self, qtype: QType) -> int:
        n = int(np.prod(self.shape))
        t = self.qtype(qtype)
        return 4 * n if t == "f32" else 2 * n if t == "f16" else n // QK8_0 * Q8_0_BLOCK_BYTES


def _encode(array: np.ndarray, qtype: QType) -> np.ndarray:
    if qtype == "f32":
        return np.ascontiguousarray(array, dtype=np.float32)
    if qtype == "f16":
        return np.ascontiguousarray(array, dtype=np.float16)
    out = np.empty((array.shape[0], array.shape[1] // QK8_0 * Q8_0_BLOCK_BYTES), dtype=np.uint8)
    step = max(1, (1 << 22) // array.shape[1])  # quantise in slices of ~4M weights: bounded memory
    for r in range(0, array.shape[0], step):
        out[r : r + step] = gguf.quants.quantize(array[r : r + step], gguf.GGMLQuantizationType.Q8_0)
    return out


@dataclass
class Header:
    """What goes before the tensors: architecture, hyperparameters (a callback on the writer) and the
    tokenizer."""

    arch: str
    name: str
    vocab: Vocab
    hparams: Callable[[gguf.GGUFWriter], None]


def write_gguf(path: str | Path, header: Header, specs: Iterable[Spec], qtype: QType = "f32") -> Path:
    """Write a GGUF: the header, every tensor's info, then each tensor's data as it is made."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    specs = list(specs)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate tensor names in {path.name}")
    w = gguf.GGUFWriter(path, header.arch)
    w.add_name(header.name)
    w.add_file_type(FILE_TYPES[qtype])
    header.hparams(w)
    header.vocab.add_to(w)
    raw = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0}
    for s in specs:
        t = s.qtype(qtype)
        nbytes = s.nbytes(qtype)
        if t == "q8_0":
            w.add_tensor_info(
                s.name, (s.shape[0], nbytes // s.shape[0]), np.dtype(np.uint8), nbytes, raw_dtype=raw[t]
            )
        else:
            w.add_tensor_info(s.name, s.shape, np.dtype(np.float32 if t == "f32" else np.float16), nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for s in specs:
        array = s.make()
        if tuple(array.shape) != tuple(s.shape):
            raise ValueError(f"{s.name}: made {array.shape}, declared {s.shape}")
        w.write_tensor_data(_encode(array, s.qtype(qtype)))
    w.close()
    return path


def ffn_specs(noise: Noise, prefix: str, n_embd: int, n_ff: int, gain: float) -> list[Spec]:
    """A gated FFN (gate, up, down): down is a residual writer, drawn with the noise gain."""
    return [
        Spec(
            prefix + "ffn_gate.weight", (n_ff, n_embd), lambda: noise.mat(prefix + "ffn_gate", n_ff, n_embd)
        ),
        Spec(prefix + "ffn_up.weight", (n_ff, n_embd), lambda: noise.mat(prefix + "ffn_up", n_ff, n_embd)),
        Spec(
            prefix + "ffn_down.weight",
            (n_embd, n_ff),
            lambda: noise.mat(prefix + "ffn_down", n_embd, n_ff, gain),
        ),
    ]


def norm_spec(noise: Noise, name: str, n: int, center: float = 1.0, spread: float = 0.1) -> Spec:
    return Spec(name, (n,), lambda: noise.vec(name, n, center, spread), quantize=False)


def const_spec(name: str, values: Sequence[float] | np.ndarray) -> Spec:
    array = np.asarray(values, dtype=np.float32)
    return Spec(name, tuple(array.shape), lambda: array, quantize=False)
