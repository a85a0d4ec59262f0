"""An EAGLE-3 draft head and a llama-layout target for it, random weights and the planted pattern
(tests/planted_gguf.py).

The head (llama.cpp arch "eagle3", as convert_hf_to_gguf.py writes SpecForge/vLLM checkpoints) is one
decoder layer that reads the target: `fc` fuses the target's inputs of three layers (its
`target_layers`) into the head's width, and the decoder at position P takes the token at P + 1 with
that fused row g_P (or, in a draft step, its own pre-norm output of the step before). Its layer:
RMS-normed token embedding and RMS-normed g concatenated, attention over both (Q, K, V from 2 x width),
the raw g as the residual, a SwiGLU FFN, the output norm and projection.

How the head carries the rule: its queries and keys read only the token half, the same projection for
both, so each position attends to itself (RoPE leaves a query and key at the same position aligned; at
other positions the scores are those of unrelated random vectors, far below); values read the token
half too, so attention returns the current token's own vector A(v). Output row succ[v] is the unit
vector of A(v): the head proposes succ[x] after x, whatever g says; g and the FFN are its noise. The
target follows the same rule at its own rate, so drafts are accepted about rate * rate of the time.

Usage
-----
    from .eagle3_models import write_llama, write_eagle3
    target = write_llama(tmp_path / "t.gguf")                 # 4 layers x 64, planted rule
    head = write_eagle3(tmp_path / "eagle3-t.gguf")           # reads its layers 1, 2, 3

or the session-scoped fixture `eagle3_pair` (re-exported by conftest.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gguf
import numpy as np
import pytest

from .planted_gguf import (
    Family,
    Header,
    Noise,
    QType,
    Spec,
    ffn_specs,
    norm_spec,
    planted_output,
    tiny_family,
)
from .planted_gguf import write_gguf as _write_gguf


@dataclass(frozen=True)
class LlamaShape:
    """Llama 3 hyperparameters (the 8B: 4096 x 32, heads 32/8 of 128, FFN 14336)."""

    n_embd: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 4096
    rope_base: float = 500_000.0


def write_llama(
    path: str | Path,
    *,
    shape: LlamaShape | None = None,
    family: Family | None = None,
    seed: int = 7,
    noise: float = 1.0,
    qtype: QType = "f32",
    name: str | None = None,
) -> Path:
    """A llama-layout target (attention without biases, SwiGLU FFN) over the family's vocabulary:
    llama.cpp's llama graph gives every layer's input to a reader of them (EAGLE-3)."""
    s = shape or LlamaShape()
    fam = family or tiny_family()
    z = Noise(seed)
    d, hd = s.n_embd, s.n_embd // s.n_head
    kv = s.n_head_kv * hd
    specs = fam.io_specs(d)
    specs.append(norm_spec(z, "output_norm.weight", d))
    for il in range(s.n_layer):
        p = f"blk.{il}."
        specs += [
            norm_spec(z, p + "attn_norm.weight", d),
            Spec(p + "attn_q.weight", (d, d), lambda p=p: z.mat(p + "attn_q", d, d, 2.0)),
            Spec(p + "attn_k.weight", (kv, d), lambda p=p: z.mat(p + "attn_k", kv, d, 2.0)),
            Spec(p + "attn_v.weight", (kv, d), lambda p=p: z.mat(p + "attn_v", kv, d)),
            Spec(p + "attn_output.weight", (d, d), lambda p=p: z.mat(p + "attn_output", d, d, noise)),
            norm_spec(z, p + "ffn_norm.weight", d),
            *ffn_specs(z, p, d, s.n_ff, noise),
        ]

    def hparams(w: gguf.GGUFWriter) -> None:
        w.add_context_length(s.n_ctx_train)
        w.add_embedding_length(d)
        w.add_block_count(s.n_layer)
        w.add_feed_forward_length(s.n_ff)
        w.add_head_count(s.n_head)
        w.add_head_count_kv(s.n_head_kv)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_dimension_count(hd)
        w.add_rope_freq_base(s.rope_base)
        w.add_vocab_size(fam.vocab.n_vocab)

    header = Header("llama", name or f"planted-llama-{s.n_layer}x{d}-s{seed}", fam.vocab, hparams)
    return _write_gguf(path, header, specs, qtype)


@dataclass(frozen=True)
class Eagle3Shape:
    """The head's own sizes (the Llama-3.1-8B head: 4096 wide, heads 32/8 of 128, FFN 14336, reading
    layers 2, 16, 29). `n_embd` may differ from the target's where the head has its own embedding."""

    n_embd: int = 32
    n_head: int = 2
    n_head_kv: int = 1
    n_ff: int = 64
    n_ctx_train: int = 4096
    rope_base: float = 500_000.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def _rms_normed(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-5) * weight


def write_eagle3(
    path: str | Path,
    *,
    target: LlamaShape | None = None,
    shape: Eagle3Shape | None = None,
    family: Family | None = None,
    target_layers: Sequence[int] = (1, 2, 3),
    own_embedding: bool = True,
    reduced_vocab: bool = False,
    d2t: np.ndarray | None = None,
    reads: Literal["token", "target"] = "token",
    seed: int = 8,
    focus: float = 8.0,
    g_gain: float = 0.3,
    noise: float = 0.4,
    name: str | None = None,
) -> Path:
    """The EAGLE-3 head of a `write_llama` target of shape `target` (same family).

    `own_embedding=False` embeds tokens with the target's table (the head's width must be the
    target's); `reduced_vocab` gives it a draft vocabulary of the ordinary tokens only, mapped back to
    the target's ids by a `d2t` table (as heads trained on a 32k subset of a 128k vocabulary are; `d2t`
    writes another table in its place, to test how a broken one is refused);
    `focus` scales the queries and keys (how sharply each position attends to itself); `g_gain` and
    `noise` set how loudly g and the FFN write into the residual stream (the head's noise). g enters
    the residual normed (the converter's `norm_before_residual`, as RedHat's speculators have it), so
    a draft step's g, the head's own state of the step before, is no louder than the target's.

    `reads="target"` makes a head that carries the rule through g alone (no attention): its fc reads
    the target's layer 0 input at P, which is the embedding of the token at P, and its output row
    succ[succ[v]] is what that becomes, so the entry at P (token P + 1, g_P) proposes the token two
    after P. It is right only where it reads the target's state at the position before its token:
    a test of that alignment (its draft steps, which feed back the head's own state, repeat)."""
    t = target or LlamaShape()
    s = shape or Eagle3Shape()
    fam = family or tiny_family()
    if not own_embedding and s.n_embd != t.n_embd:
        raise ValueError("a head without its own embedding has the target's width")
    if reads == "target" and target_layers[0] != 0:
        raise ValueError("a head that reads the target's token embedding reads its layer 0 first")
    z = Noise(seed)
    d, hd, n = s.n_embd, s.head_dim, fam.vocab.n_vocab
    d_in = len(target_layers) * t.n_embd
    embd = fam.embedding(d) if own_embedding else fam.embedding(t.n_embd)
    attn_norm = z.vec("attn_norm", d)
    proj = z.mat("qk", hd, d)  # queries and keys: the same projection of the token half
    val = z.mat("v", hd, d)
    zero = np.zeros((hd, d), dtype=np.float32)
    on = 0.0 if reads == "target" else 1.0  # attention carries the rule, or nothing
    wq = np.concatenate([np.concatenate([on * focus * proj, zero], axis=1)] * s.n_head)
    wk = np.concatenate([np.concatenate([on * focus * proj, zero], axis=1)] * s.n_head_kv)
    wv = np.concatenate([np.concatenate([on * val, zero], axis=1)] * s.n_head_kv)
    wo = z.mat("attn_output", d, s.n_head * hd)
    hidden_norm = z.vec("hidden_norm", d, g_gain, 0.1 * g_gain)
    fc = z.mat("fc", d, d_in, 0.1 if reads == "target" else 1.0)
    succ = fam.succ()
    if reads == "target":
        # g_P from the target's layer 0 input, the embedding of the token at P; the rule two ahead
        fc[:, : t.n_embd] = z.mat("fc_token", d, t.n_embd)
        carried = _rms_normed(fam.embedding(t.n_embd) @ fc[:, : t.n_embd].T, hidden_norm)
        succ = np.where(succ >= 0, succ[np.maximum(succ, 0)], -1)
    else:
        # what token v puts into the residual stream: every head returns v's own value
        own = _rms_normed(embd, attn_norm) @ val.T
        carried = np.concatenate([own] * s.n_head, axis=1) @ wo.T
    output = planted_output(carried, succ, fam.logit_scale)
    ordinary = fam.vocab.ordinary
    arrays: dict[str, np.ndarray] = {}
    if own_embedding:
        arrays["token_embd.weight"] = embd
    arrays["fc.weight"] = fc
    arrays["blk.0.attn_norm.weight"] = attn_norm
    arrays["blk.0.attn_norm_2.weight"] = hidden_norm
    arrays["blk.0.attn_q.weight"] = wq
    arrays["blk.0.attn_k.weight"] = wk
    arrays["blk.0.attn_v.weight"] = wv
    arrays["blk.0.attn_output.weight"] = wo
    arrays["blk.0.ffn_norm.weight"] = z.vec("ffn_norm", d)
    for spec in ffn_specs(z, "blk.0.", d, s.n_ff, noise):
        arrays[spec.name] = spec.make()
    arrays["output_norm.weight"] = z.vec("output_norm", d)
    arrays["output.weight"] = output[ordinary] if reduced_vocab else output
    if reduced_vocab:
        arrays["d2t"] = (ordinary if d2t is None else d2t).astype(np.int64)

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(Path(path), "eagle3")
    w.add_name(name or f"planted-eagle3-{d}-s{seed}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(d)
    w.add_block_count(1)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(s.rope_base)
    w.add_vocab_size(n)
    w.add_array("eagle3.target_layers", [int(i) for i in target_layers])
    w.add_uint32("eagle3.target_hidden_size", t.n_embd)
    w.add_bool("eagle3.norm_before_residual", True)
    fam.vocab.add_to(w)
    for key, array in arrays.items():
        if array.dtype == np.int64:
            w.add_tensor(key, array, raw_dtype=gguf.GGMLQuantizationType.I64)
        else:
            w.add_tensor(key, np.ascontiguousarray(array, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


@pytest.fixture(scope="session")
def eagle3_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(llama-layout target, its EAGLE-3 head): same vocabulary and rule. The head is in a folder of
    its own, so nothing lies beside the target (see models/heads.py)."""
    folder = tmp_path_factory.mktemp("eagle3_models")
    return write_llama(folder / "llama.gguf"), write_eagle3(folder / "heads" / "eagle3-llama.gguf")
