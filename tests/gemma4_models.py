"""Gemma 4 with its MTP "assistant" drafter, random weights and the planted pattern (tests/planted_gguf.py).

The assistant (llama.cpp arch "gemma4-assistant", as google/gemma-4-*-it-assistant convert) is no
model of its own: its context is created with the target's as `ctx_other`, it embeds tokens with the
TARGET's token_embd, reads the target's K/V of its last sliding and last full attention layer (its own
layers have only queries), and takes the target's final hidden state h. Its layers: pre_projection
[E_target(x) * sqrt(n_embd_target), h] -> its width, then attention (Q only) + GELU FFN with Gemma's
pre/post norms and a per-layer output scale, a final norm, logits through its own token_embd (tied),
and post_projection back to the target's width (the h of its next draft step). The rule rides on the
embedding half of pre_projection: token_embd row succ[v] is the unit vector of what token v becomes
there, so the assistant proposes succ[x] after x; the h half and its layers are its noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from .planted_gguf import (
    Family,
    Header,
    Noise,
    QType,
    Spec,
    const_spec,
    ffn_specs,
    norm_spec,
    planted_output,
    tiny_family,
    write_gguf,
)


@dataclass(frozen=True)
class Gemma4Shape:
    """Gemma 4 hyperparameters (E2B: 1536 x 35, 4 sliding layers to 1 full, heads 8/1, head 256 sliding
    and 512 full, window 512; 31B: 5376 x 60, 5 to 1, heads 32 with 16 KV sliding / 4 full). No
    per-layer embeddings, KV sharing or experts here (the 31B and 26B have none of the first two)."""

    n_embd: int = 64
    n_layer: int = 4
    swa_period: int = 4  # layers i with (i + 1) % swa_period == 0 are full attention
    n_head: int = 4
    n_head_kv_swa: int = 2
    n_head_kv_full: int = 1
    head_dim_swa: int = 16
    head_dim_full: int = 32
    n_ff: int = 128
    sliding_window: int = 512
    n_ctx_train: int = 8192
    rope_base: float = 1_000_000.0
    rope_base_swa: float = 10_000.0
    softcap: float = 30.0

    def is_swa(self, il: int) -> bool:
        return (il + 1) % self.swa_period != 0

    def head_dim(self, il: int) -> int:
        return self.head_dim_swa if self.is_swa(il) else self.head_dim_full

    def n_head_kv(self, il: int) -> int:
        return self.n_head_kv_swa if self.is_swa(il) else self.n_head_kv_full


def _rope_freqs(head_dim_full: int) -> np.ndarray:
    """Full layers' "proportional" RoPE (partial_rotary_factor 0.25) as the converter writes it:
    factor 1 on the rotated quarter, 1e30 (no rotation) on the rest."""
    n_rot = head_dim_full // 8
    return np.array([1.0] * n_rot + [1e30] * (head_dim_full // 2 - n_rot), dtype=np.float32)


def _gemma4_hparams(
    w: gguf.GGUFWriter, s: Gemma4Shape, n_embd: int, n_layer: int, n_ff: int, swa: list[bool], n_vocab: int
) -> None:
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv([s.n_head_kv_swa if x else s.n_head_kv_full for x in swa])
    w.add_key_length(s.head_dim_full)
    w.add_value_length(s.head_dim_full)
    w.add_key_length_swa(s.head_dim_swa)
    w.add_value_length_swa(s.head_dim_swa)
    w.add_rope_dimension_count(s.head_dim_full)
    w.add_rope_dimension_count_swa(s.head_dim_swa)
    w.add_rope_freq_base(s.rope_base)
    w.add_rope_freq_base_swa(s.rope_base_swa)
    w.add_sliding_window(s.sliding_window)
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(0)
    w.add_embedding_length_per_layer_input(0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(n_vocab)


def _attn_norm_center(head_dim: int) -> float:
    """Gemma 4 scores q.k unscaled (attention scale 1) with q and k RMS-normalised: norm weights of
    (2 / sqrt(head_dim))^(1/2) each keep the scores' spread near 2, as trained weights do."""
    return float(np.sqrt(2.0 / np.sqrt(head_dim)))


def _layer_specs(z: Noise, p: str, d: int, n_q: int, hd: int, n_ff: int, noise: float) -> list[Spec]:
    """What a Gemma 4 layer and an assistant layer share: norms around attention and FFN (the post
    norms set how loudly the layer writes into the residual stream: `noise`), queries, output."""
    c = _attn_norm_center(hd)
    return [
        norm_spec(z, p + "attn_norm.weight", d),
        Spec(p + "attn_q.weight", (n_q * hd, d), lambda: z.mat(p + "attn_q", n_q * hd, d)),
        Spec(p + "attn_output.weight", (d, n_q * hd), lambda: z.mat(p + "attn_output", d, n_q * hd)),
        norm_spec(z, p + "attn_q_norm.weight", hd, c),
        norm_spec(z, p + "post_attention_norm.weight", d, noise, 0.1 * noise),
        const_spec(p + "layer_output_scale.weight", [1.0]),
        norm_spec(z, p + "ffn_norm.weight", d),
        *ffn_specs(z, p, d, n_ff, 1.0),
        norm_spec(z, p + "post_ffw_norm.weight", d, noise, 0.1 * noise),
    ]


def write_gemma4(
    path: str | Path,
    *,
    shape: Gemma4Shape | None = None,
    family: Family | None = None,
    seed: int = 4,
    noise: float = 0.7,
    qtype: QType = "f32",
    name: str | None = None,
) -> Path:
    """A Gemma 4 (dense) target: sliding and full attention layers, the last two sliding then full
    (the assistant reads those two)."""
    s = shape or Gemma4Shape()
    fam = family or tiny_family()
    if not (s.is_swa(s.n_layer - 2) and not s.is_swa(s.n_layer - 1)):
        raise ValueError("the last two layers must be sliding then full attention")
    z = Noise(seed)
    d = s.n_embd
    # embeddings of RMS 1/sqrt(d): the graph scales them by sqrt(d), so the stream starts at RMS 1
    specs = fam.io_specs(d, rms=1.0 / np.sqrt(d))
    specs += [
        norm_spec(z, "output_norm.weight", d),
        const_spec("rope_freqs.weight", _rope_freqs(s.head_dim_full)),
    ]
    for il in range(s.n_layer):
        p, hd, kv = f"blk.{il}.", s.head_dim(il), s.n_head_kv(il) * s.head_dim(il)
        specs += _layer_specs(z, p, d, s.n_head, hd, s.n_ff, noise)
        specs += [
            Spec(p + "attn_k.weight", (kv, d), lambda p=p, kv=kv: z.mat(p + "attn_k", kv, d)),
            Spec(p + "attn_v.weight", (kv, d), lambda p=p, kv=kv: z.mat(p + "attn_v", kv, d)),
            norm_spec(z, p + "attn_k_norm.weight", hd, _attn_norm_center(hd)),
        ]
    swa = [s.is_swa(il) for il in range(s.n_layer)]

    def hparams(w: gguf.GGUFWriter) -> None:
        _gemma4_hparams(w, s, d, s.n_layer, s.n_ff, swa, fam.vocab.n_vocab)
        w.add_final_logit_softcapping(s.softcap)

    header = Header("gemma4", name or f"planted-gemma4-{s.n_layer}x{d}-s{seed}", fam.vocab, hparams)
    return write_gguf(path, header, specs, qtype)


@dataclass(frozen=True)
class AssistantShape:
    """The assistant's own sizes; its heads' widths and KV heads are the target's (it reads the
    target's cache)."""

    n_embd: int = 32
    n_layer: int = 4
    n_head: int = 4
    n_ff: int = 64


def write_gemma4_assistant(
    path: str | Path,
    *,
    target: Gemma4Shape | None = None,
    shape: AssistantShape | None = None,
    family: Family | None = None,
    seed: int = 5,
    noise: float = 0.4,
    qtype: QType = "f32",
    name: str | None = None,
) -> Path:
    """The MTP assistant of a `write_gemma4` target of shape `target` (same family)."""
    t = target or Gemma4Shape()
    a = shape or AssistantShape()
    fam = family or tiny_family()
    z = Noise(seed)
    d, db, n = a.n_embd, t.n_embd, fam.vocab.n_vocab
    swa = [t.is_swa(il) for il in range(a.n_layer - 1)] + [False]  # ends on a full layer, as released
    cache: dict[str, np.ndarray] = {}

    def pre() -> np.ndarray:
        cache["pre"] = np.concatenate([z.mat("pre_e", d, db), z.mat("pre_h", d, db)], axis=1)
        return cache["pre"]

    def tok_embd() -> np.ndarray:
        # token v enters as E_target[v] * sqrt(db) (RMS 1), then the embedding half of pre_projection
        inputs = fam.embedding(db, 1.0) @ cache.pop("pre")[:, :db].T
        return planted_output(inputs, fam.succ(), fam.logit_scale)

    specs = [
        Spec("nextn.pre_projection.weight", (d, 2 * db), pre),
        Spec("token_embd.weight", (n, d), tok_embd),
        norm_spec(z, "output_norm.weight", d),
        Spec("nextn.post_projection.weight", (db, d), lambda: z.mat("post", db, d)),
        const_spec("rope_freqs.weight", _rope_freqs(t.head_dim_full)),
    ]
    for il in range(a.n_layer):
        hd = t.head_dim_swa if swa[il] else t.head_dim_full
        specs += _layer_specs(z, f"blk.{il}.", d, a.n_head, hd, a.n_ff, noise)

    def hparams(w: gguf.GGUFWriter) -> None:
        s = Gemma4Shape(**{**t.__dict__, "n_head": a.n_head})
        _gemma4_hparams(w, s, d, a.n_layer, a.n_ff, swa, n)
        w.add_embedding_length_out(db)
        w.add_nextn_predict_layers(a.n_layer)

    header = Header(
        "gemma4-assistant", name or f"planted-gemma4-assistant-{a.n_layer}x{d}-s{seed}", fam.vocab, hparams
    )
    return write_gguf(path, header, specs, qtype)
