"""Random-weight GGUFs of the layouts people run now, sharing a planted pattern (tests/planted_gguf.py):
Qwen3.5/3.6 dense (hybrid Gated DeltaNet + gated attention, optionally with its NextN/MTP block), a
qwen2 draft over the same vocabulary, LFM2 (short convolutions + attention) and its smaller LFM2
draft, Gemma 4 and its MTP "assistant" drafter.

Usage
-----
    from .hybrid_models import write_qwen35, write_qwen2
    target = write_qwen35(tmp_path / "t.gguf", nextn=1)         # trunk + one NextN block
    draft = write_qwen2(tmp_path / "d.gguf")                    # same rule, its own noise

or the session-scoped fixtures (re-exported by conftest.py): `qwen35_pair` (target, qwen2 draft),
`qwen35_mtp` (target with one NextN block), `lfm2_pair` (target, LFM2 draft) and `gemma4_pair`
(target, assistant).

A model follows the family's rule with a "planted rate" that its `noise` sets (the defaults give
0.65-0.9 at these sizes); a drafter's proposal then matches the target's token about rate * rate of
the time: measured on an AVX512 CPU, 0.54-0.63 for the drafts, 0.50-0.56 for the NextN head (against
the token after next) and 0.38-0.50 for the Gemma 4 assistant. The same (vocab, `pattern_seed`) gives
the same rule; `seed` draws a model's own noise.

Structure follows the real releases (names, keys and shapes as llama.cpp's converter writes them)
at small sizes, with one deliberate difference: every model has its own output matrix (the rule
lives there), where the small Qwen3.5, LFM2 and Gemma 4 releases tie it to the embedding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from .gemma4_models import write_gemma4, write_gemma4_assistant
from .planted_gguf import (
    Family,
    Header,
    Noise,
    QType,
    Spec,
    const_spec,
    ffn_specs,
    norm_spec,
    tiny_family,
    write_gguf,
)


def _common(
    w: gguf.GGUFWriter,
    *,
    n_ctx: int,
    n_embd: int,
    n_block: int,
    n_ff: int | list[int],
    n_head: int,
    n_head_kv: int | list[int],
    eps: float,
) -> None:
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_block)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(eps)


# ---------------------------------------------------------------------------------------------------
# Qwen3.5 / 3.6 dense (llama.cpp arch "qwen35") and its NextN block
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Qwen35Shape:
    """Qwen3.5 dense hyperparameters (the 0.8B has 1024 x 24, heads 8/2 of 256, linear attention 16
    heads of 128, FFN 3584). `n_layer` counts trunk layers; `nextn` NextN blocks follow them."""

    n_embd: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_ff: int = 192
    lin_k_heads: int = 4
    lin_v_heads: int = 4
    lin_head_dim: int = 16
    conv_kernel: int = 4
    interval: int = 4  # every interval-th layer is full attention, the rest Gated DeltaNet
    nextn: int = 0
    n_ctx_train: int = 4096
    rope_base: float = 10_000_000.0

    def is_recurrent(self, il: int) -> bool:
        return il < self.n_layer and (il + 1) % self.interval != 0


def _qwen35_attn(z: Noise, p: str, s: Qwen35Shape, gain: float) -> list[Spec]:
    d, q, kv = s.n_embd, s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    return [
        Spec(p + "attn_q.weight", (2 * q, d), lambda: z.mat(p + "attn_q", 2 * q, d)),  # query + gate
        Spec(p + "attn_k.weight", (kv, d), lambda: z.mat(p + "attn_k", kv, d)),
        Spec(p + "attn_v.weight", (kv, d), lambda: z.mat(p + "attn_v", kv, d)),
        Spec(p + "attn_output.weight", (d, q), lambda: z.mat(p + "attn_output", d, q, gain)),
        norm_spec(z, p + "attn_q_norm.weight", s.head_dim, 1.5),
        norm_spec(z, p + "attn_k_norm.weight", s.head_dim, 1.5),
    ]


def _qwen35_deltanet(z: Noise, p: str, s: Qwen35Shape, gain: float) -> list[Spec]:
    d, nv = s.n_embd, s.lin_v_heads
    kd, vd = s.lin_head_dim * s.lin_k_heads, s.lin_head_dim * s.lin_v_heads
    conv = 2 * kd + vd
    k = s.conv_kernel
    return [
        Spec(p + "attn_qkv.weight", (conv, d), lambda: z.mat(p + "attn_qkv", conv, d)),
        Spec(p + "attn_gate.weight", (vd, d), lambda: z.mat(p + "attn_gate", vd, d)),
        Spec(
            p + "ssm_conv1d.weight", (conv, k), lambda: z.mat(p + "ssm_conv1d", conv, k, 1.5), quantize=False
        ),
        # decay per step exp(softplus(alpha + dt) * a): dt ~ -3 and a in [-16, -1] keep 0.45-0.95
        norm_spec(z, p + "ssm_dt.bias", nv, -3.0, 0.5),
        const_spec(p + "ssm_a", -np.exp(z.rng(p + "ssm_a").uniform(0.0, np.log(16.0), nv))),
        Spec(p + "ssm_beta.weight", (nv, d), lambda: z.mat(p + "ssm_beta", nv, d)),
        Spec(p + "ssm_alpha.weight", (nv, d), lambda: z.mat(p + "ssm_alpha", nv, d, 0.5)),
        norm_spec(z, p + "ssm_norm.weight", s.lin_head_dim),
        Spec(p + "ssm_out.weight", (d, vd), lambda: z.mat(p + "ssm_out", d, vd, gain)),
    ]


def qwen35_specs(
    fam: Family, s: Qwen35Shape, z: Noise, noise: float, mtp_noise: float, nextn_head: bool
) -> list[Spec]:
    """token_embd, output, the trunk and the NextN blocks, in the converter's order."""
    d = s.n_embd
    out = fam.io_specs(d)
    out.append(norm_spec(z, "output_norm.weight", d))
    for il in range(s.n_layer + s.nextn):
        p = f"blk.{il}."
        mtp = il >= s.n_layer
        gain = mtp_noise if mtp else noise
        out += [norm_spec(z, p + "attn_norm.weight", d), norm_spec(z, p + "post_attention_norm.weight", d)]
        if s.is_recurrent(il):
            out += _qwen35_deltanet(z, p, s, gain)
        else:
            out += _qwen35_attn(z, p, s, gain)
        out += ffn_specs(z, p, d, s.n_ff, gain)
        if mtp:
            out += _nextn_specs(fam, z, p, d, nextn_head)
    return out


#: how much of the NextN block's input comes from the next token's embedding (the rest: a random
#: projection of the target's hidden state, which predicts the token before it)
NEXTN_EMBED_GAIN = 1.0


def _nextn_specs(fam: Family, z: Noise, p: str, d: int, own_head: bool) -> list[Spec]:
    """eh_proj maps [enorm(E[x]), hnorm(h)] to the block's input: the embedding part passes through
    (the rule then predicts succ[x], the token after next), the hidden-state part is noise."""

    def eh_proj() -> np.ndarray:
        m = np.empty((d, 2 * d), dtype=np.float32)
        m[:, :d] = np.eye(d, dtype=np.float32) * np.float32(NEXTN_EMBED_GAIN)
        m[:, d:] = z.mat(p + "nextn.eh_proj", d, d)
        return m

    out = [
        Spec(p + "nextn.eh_proj.weight", (d, 2 * d), eh_proj),
        norm_spec(z, p + "nextn.enorm.weight", d),
        norm_spec(z, p + "nextn.hnorm.weight", d),
        norm_spec(z, p + "nextn.shared_head_norm.weight", d),
    ]
    if own_head:  # the optional copies some conversions carry
        emb, head = fam.io_specs(d, output=p + "nextn.shared_head_head.weight")
        out += [Spec(p + "nextn.embed_tokens.weight", emb.shape, emb.make), head]
    return out


def qwen35_header(fam: Family, s: Qwen35Shape, name: str) -> Header:
    def hparams(w: gguf.GGUFWriter) -> None:
        _common(
            w,
            n_ctx=s.n_ctx_train,
            n_embd=s.n_embd,
            n_block=s.n_layer + s.nextn,
            n_ff=s.n_ff,
            n_head=s.n_head,
            n_head_kv=s.n_head_kv,
            eps=1e-6,
        )
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
        n_rot = s.head_dim // 4  # partial_rotary_factor 0.25
        w.add_rope_dimension_count(n_rot)
        a = n_rot // 2 * 11 // 32  # the release's [11, 11, 10] of 32, scaled
        w.add_rope_dimension_sections([a, a, n_rot // 2 - 2 * a, 0])
        w.add_rope_freq_base(s.rope_base)
        w.add_ssm_conv_kernel(s.conv_kernel)
        w.add_ssm_state_size(s.lin_head_dim)
        w.add_ssm_group_count(s.lin_k_heads)
        w.add_ssm_time_step_rank(s.lin_v_heads)
        w.add_ssm_inner_size(s.lin_head_dim * s.lin_v_heads)
        w.add_full_attention_interval(s.interval)
        # the converter's per-layer list (from the config's layer_types); gguf 0.19 has no writer for it
        recurrent = [s.is_recurrent(il) for il in range(s.n_layer + s.nextn)]
        w.add_array(f"{w.arch}.attention.recurrent_layers", recurrent)
        if s.nextn:
            w.add_nextn_predict_layers(s.nextn)
        w.add_vocab_size(fam.vocab.n_vocab)

    return Header("qwen35", name, fam.vocab, hparams)


def write_qwen35(
    path: str | Path,
    *,
    shape: Qwen35Shape | None = None,
    nextn: int | None = None,
    family: Family | None = None,
    seed: int = 1,
    noise: float = 1.25,
    mtp_noise: float = 3.0,
    nextn_head: bool = False,
    qtype: QType = "f32",
    name: str | None = None,
) -> Path:
    """A Qwen3.5-layout target (3 Gated DeltaNet layers to 1 gated attention layer); `nextn=1` adds
    the NextN/MTP block as blk.{n_layer} (block_count counts it). `nextn_head` also writes the block's
    optional own embedding and head (copies of the model's)."""
    s = shape or Qwen35Shape()
    if nextn is not None:
        s = Qwen35Shape(**{**s.__dict__, "nextn": nextn})
    fam = family or tiny_family()
    specs = qwen35_specs(fam, s, Noise(seed), noise, mtp_noise, nextn_head)
    header = qwen35_header(fam, s, name or f"planted-qwen35-{s.n_layer}x{s.n_embd}-s{seed}")
    return write_gguf(path, header, specs, qtype)


# ---------------------------------------------------------------------------------------------------
# qwen2: the attention-only draft
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Qwen2Shape:
    """Qwen2/2.5 hyperparameters (the 0.5B has 896 x 24, heads 14/2 of 64, FFN 4864)."""

    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 4096
    rope_base: float = 1_000_000.0


def write_qwen2(
    path: str | Path,
    *,
    shape: Qwen2Shape | None = None,
    family: Family | None = None,
    seed: int = 2,
    noise: float = 1.5,
    qtype: QType = "f32",
    name: str | None = None,
) -> Path:
    """A qwen2-layout model (attention with q/k/v biases, SwiGLU FFN) over the family's vocabulary."""
    s = shape or Qwen2Shape()
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
            norm_spec(z, p + "attn_q.bias", d, 0.0),
            norm_spec(z, p + "attn_k.bias", kv, 0.0),
            norm_spec(z, p + "attn_v.bias", kv, 0.0),
            Spec(p + "attn_output.weight", (d, d), lambda p=p: z.mat(p + "attn_output", d, d, noise)),
            norm_spec(z, p + "ffn_norm.weight", d),
            *ffn_specs(z, p, d, s.n_ff, noise),
        ]

    def hparams(w: gguf.GGUFWriter) -> None:
        _common(
            w,
            n_ctx=s.n_ctx_train,
            n_embd=d,
            n_block=s.n_layer,
            n_ff=s.n_ff,
            n_head=s.n_head,
            n_head_kv=s.n_head_kv,
            eps=1e-6,
        )
        w.add_rope_dimension_count(hd)
        w.add_rope_freq_base(s.rope_base)
        w.add_vocab_size(fam.vocab.n_vocab)

    header = Header("qwen2", name or f"planted-qwen2-{s.n_layer}x{d}-s{seed}", fam.vocab, hparams)
    return write_gguf(path, header, specs, qtype)


# ---------------------------------------------------------------------------------------------------
# LFM2
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lfm2Shape:
    """LFM2 hyperparameters (the 1.2B: 2048 x 16, attention at layers 2, 5, 8, 10, 12, 14 with heads
    32/8, FFN 8192, the rest short convolutions of 3 taps; the 350M: 1024 wide, heads 16/8, FFN 4608)."""

    n_embd: int = 64
    n_layer: int = 4
    attn_layers: tuple[int, ...] = (2,)
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 192
    l_cache: int = 3
    n_ctx_train: int = 4096
    rope_base: float = 1_000_000.0


def write_lfm2(
    path: str | Path,
    *,
    shape: Lfm2Shape | None = None,
    family: Family | None = None,
    seed: int = 3,
    noise: float = 0.75,
    qtype: QType = "f32",
    name: str | None = None,
) -> Path:
    """An LFM2-layout model: gated short-convolution layers with a few attention layers (head_count_kv
    0 marks a convolution layer, as the converter writes it); final norm named token_embd_norm."""
    s = shape or Lfm2Shape()
    fam = family or tiny_family()
    z = Noise(seed)
    d, hd = s.n_embd, s.n_embd // s.n_head
    kv = s.n_head_kv * hd
    specs = fam.io_specs(d)
    specs.append(norm_spec(z, "token_embd_norm.weight", d))
    for il in range(s.n_layer):
        p = f"blk.{il}."
        specs += [norm_spec(z, p + "attn_norm.weight", d), norm_spec(z, p + "ffn_norm.weight", d)]
        specs += ffn_specs(z, p, d, s.n_ff, noise)
        if il in s.attn_layers:
            specs += [
                norm_spec(z, p + "attn_q_norm.weight", hd, 1.5),
                norm_spec(z, p + "attn_k_norm.weight", hd, 1.5),
                Spec(p + "attn_q.weight", (d, d), lambda p=p: z.mat(p + "attn_q", d, d)),
                Spec(p + "attn_k.weight", (kv, d), lambda p=p: z.mat(p + "attn_k", kv, d)),
                Spec(p + "attn_v.weight", (kv, d), lambda p=p: z.mat(p + "attn_v", kv, d)),
                Spec(p + "attn_output.weight", (d, d), lambda p=p: z.mat(p + "attn_output", d, d, noise)),
            ]
        else:
            L = s.l_cache
            specs += [
                Spec(
                    p + "shortconv.conv.weight",
                    (d, L),
                    lambda p=p: z.mat(p + "shortconv.conv", d, s.l_cache, 1.5),
                    quantize=False,
                ),
                Spec(
                    p + "shortconv.in_proj.weight",
                    (3 * d, d),
                    lambda p=p: z.mat(p + "shortconv.in_proj", 3 * d, d),
                ),
                Spec(
                    p + "shortconv.out_proj.weight",
                    (d, d),
                    lambda p=p: z.mat(p + "shortconv.out_proj", d, d, noise),
                ),
            ]

    def hparams(w: gguf.GGUFWriter) -> None:
        kv_heads = [s.n_head_kv if il in s.attn_layers else 0 for il in range(s.n_layer)]
        _common(
            w,
            n_ctx=s.n_ctx_train,
            n_embd=d,
            n_block=s.n_layer,
            n_ff=s.n_ff,
            n_head=s.n_head,
            n_head_kv=kv_heads,
            eps=1e-5,
        )
        w.add_rope_dimension_count(hd)
        w.add_rope_freq_base(s.rope_base)
        w.add_shortconv_l_cache(s.l_cache)
        w.add_vocab_size(fam.vocab.n_vocab)

    header = Header("lfm2", name or f"planted-lfm2-{s.n_layer}x{d}-s{seed}", fam.vocab, hparams)
    return write_gguf(path, header, specs, qtype)


#: the tests' LFM2 draft: narrower and shallower than the target (conv, attention, conv)
LFM2_DRAFT = Lfm2Shape(n_embd=32, n_layer=3, attn_layers=(1,))
LFM2_DRAFT_NOISE = 0.4


def write_lfm2_draft(path: str | Path, **kw: Any) -> Path:
    """The LFM2 draft of the tests: LFM2_DRAFT's shape, following the rule about as often as the target."""
    return write_lfm2(path, **{"shape": LFM2_DRAFT, "noise": LFM2_DRAFT_NOISE, "seed": 7, **kw})


# ---------------------------------------------------------------------------------------------------
# Fixtures (session-scoped: each file is written once per test run). Re-exported by conftest.py.
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def hybrid_models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory holding every planted-pattern model of the session."""
    return tmp_path_factory.mktemp("hybrid_models")


@pytest.fixture(scope="session")
def qwen35_pair(hybrid_models_dir: Path) -> tuple[Path, Path]:
    """(Qwen3.5-layout target, qwen2 draft): same vocabulary and rule, the draft agrees ~60%."""
    return write_qwen35(hybrid_models_dir / "qwen35.gguf"), write_qwen2(
        hybrid_models_dir / "qwen2-draft.gguf"
    )


@pytest.fixture(scope="session")
def qwen35_mtp(hybrid_models_dir: Path) -> Path:
    """A Qwen3.5-layout target with one NextN block (blk.4.nextn.*), which predicts the token after next."""
    return write_qwen35(hybrid_models_dir / "qwen35-mtp.gguf", nextn=1)


@pytest.fixture(scope="session")
def lfm2_pair(hybrid_models_dir: Path) -> tuple[Path, Path]:
    """(LFM2 target, smaller LFM2 draft): same vocabulary and rule, the draft agrees ~60%."""
    return write_lfm2(hybrid_models_dir / "lfm2.gguf"), write_lfm2_draft(
        hybrid_models_dir / "lfm2-draft.gguf"
    )


@pytest.fixture(scope="session")
def gemma4_pair(hybrid_models_dir: Path) -> tuple[Path, Path]:
    """(Gemma 4 target, its MTP assistant): the assistant's first proposal agrees ~45%."""
    return (
        write_gemma4(hybrid_models_dir / "gemma4.gguf"),
        write_gemma4_assistant(hybrid_models_dir / "gemma4-assistant.gguf"),
    )
