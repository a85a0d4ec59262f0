"""A DFlash block drafter (llama.cpp arch "dflash") and a Qwen3 target for it, random weights and the
planted pattern (tests/planted_gguf.py). Usable at test sizes and, as a script, at realistic ones.

The drafter proposes a whole block in one pass: its input is the last committed token (the anchor)
at position P followed by mask tokens at P + 1 ... P + B - 1, attention is not causal, and its K/V
cache also holds rows made from the target's features (the inputs of `target_layers`, fused by `fc`)
at every committed position. Slot i's logits are its guess for the token at P + i.

How the drafter carries the rule: slot i must say succ^i[anchor]. Its first layer does that with
attention alone, one head per block offset:

* Keys. Every embedding row has a constant in dimension 0 and ordinary tokens a flag in dimension 1
  (the mask token has 0 there). Keys read dimension 1 only, so the anchor is the one position of the
  whole cache with a key (the masks' and the injected rows' keys are exactly 0: `fc` writes nothing
  into dimension 1, and RMS-normed zeros stay zeros); its key is the same vector c for every token.
* Queries read dimension 0: every slot asks the same question, head h with c rotated back by h
  positions, so under RoPE the score of the anchor for head h at slot i is c . R(h - i) c: the full
  sqrt(head_dim) * w_q * w_k where i == h, and close to nothing elsewhere (the rope base is chosen so
  that mean_j cos(theta_j x), the side lobes, stay near 0 for every offset a block has).
* Each head has an attention sink between the two, so head h reads the anchor at slot h only and
  returns nothing anywhere else (a sink takes weight, gives no value).
* Head h's values and output map the anchor's embedding into a transform T_h of its own, and output
  row t is the sum over h of unit(T_h E[succ^-h t]) (times the family's logit scale): at slot i only
  the term h == i lines up, so slot i scores succ^i[anchor] highest.

Its other layers, the FFNs and `fc` are noise. The target follows the rule at its own rate, so slot i
is accepted while the target kept to the rule i times in a row: blocks are partly accepted.

Usage
-----
    from .dflash_models import write_qwen3, write_dflash
    target = write_qwen3(tmp_path / "t.gguf")                 # 4 layers x 256, planted rule
    drafter = write_dflash(tmp_path / "dflash-t.gguf")        # reads its layers 1, 2, 3

or the session-scoped fixture `dflash_pair`; as a script, realistic sizes with the vocabulary of a
real GGUF:

    python -m tests.dflash_models OUT_DIR --vocab-from qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

At those sizes (16 x 1024, 151,936 tokens) the target's planted rate falls steeply with its noise:
llama-server's `draft-dflash` (n-max 8) had ~100% of the drafts accepted at noise 1.25, ~60% at 1.5
(the script's default), ~15% at 1.8 and ~2% at 2.0.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import pytest

from .planted_gguf import (
    Family,
    Header,
    Noise,
    QType,
    Spec,
    Vocab,
    const_spec,
    ffn_specs,
    norm_spec,
    planted_output,
    tiny_family,
    write_gguf,
)

#: the architecture llama.cpp gives DFlash and DSpark drafter files
DFLASH_ARCH = "dflash"


@dataclass(frozen=True)
class Qwen3Shape:
    """Qwen3 hyperparameters (the 0.6B: 1024 x 28, heads 16/8 of 128, FFN 3072)."""

    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 8
    n_head_kv: int = 4
    n_ff: int = 256
    n_ctx_train: int = 4096
    rope_base: float = 1_000_000.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def write_qwen3(
    path: str | Path,
    *,
    shape: Qwen3Shape | None = None,
    family: Family | None = None,
    seed: int = 7,
    noise: float = 1.0,
    qtype: QType = "f32",
    name: str | None = None,
) -> Path:
    """A Qwen3-layout target (attention with per-head Q/K norms, SwiGLU FFN) over the family's
    vocabulary: llama.cpp's qwen3 graph hands every layer's input to a reader of them (DFlash)."""
    s = shape or Qwen3Shape()
    fam = family or tiny_family()
    z = Noise(seed)
    d, hd = s.n_embd, s.head_dim
    q, kv = s.n_head * hd, s.n_head_kv * hd
    specs = fam.io_specs(d)
    specs.append(norm_spec(z, "output_norm.weight", d))
    for il in range(s.n_layer):
        p = f"blk.{il}."
        specs += [
            norm_spec(z, p + "attn_norm.weight", d),
            Spec(p + "attn_q.weight", (q, d), lambda p=p: z.mat(p + "attn_q", q, d, 2.0)),
            Spec(p + "attn_k.weight", (kv, d), lambda p=p: z.mat(p + "attn_k", kv, d, 2.0)),
            Spec(p + "attn_v.weight", (kv, d), lambda p=p: z.mat(p + "attn_v", kv, d)),
            Spec(p + "attn_output.weight", (d, q), lambda p=p: z.mat(p + "attn_output", d, q, noise)),
            norm_spec(z, p + "attn_q_norm.weight", hd),
            norm_spec(z, p + "attn_k_norm.weight", hd),
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
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(s.rope_base)
        w.add_vocab_size(fam.vocab.n_vocab)

    header = Header("qwen3", name or f"planted-qwen3-{s.n_layer}x{d}-s{seed}", fam.vocab, hparams)
    return write_gguf(path, header, specs, qtype)


@dataclass(frozen=True)
class DFlashShape:
    """The drafter's own sizes (z-lab's Qwen3-8B drafter: 5 layers, heads 32/8 of 128, block 16).
    Its width is its target's (llama.cpp reads the fused features as n_layers x its own width). One
    head per block offset carries the rule, so n_head >= block_size; its K/V heads are its heads."""

    n_layer: int = 2
    n_head: int = 8
    n_ff: int = 256
    block_size: int = 8
    n_ctx_train: int = 4096


def quiet_rope_base(head_dim: int, block_size: int) -> float:
    """The rope base whose side lobes (mean_j cos(theta_j x) over NeoX's frequencies, for every
    offset 0 < |x| <= block_size) are lowest: under it a query aimed at one offset misses the others."""
    xs = np.concatenate([np.arange(-block_size, 0), np.arange(1, block_size + 1)])
    best_lobe, best = np.inf, 1.0
    for base in np.geomspace(1e-3, 1.0, 300):
        theta = base ** (-2.0 * np.arange(head_dim // 2) / head_dim)
        lobe = float(np.cos(np.outer(xs, theta)).mean(axis=1).max())
        if lobe < best_lobe:
            best_lobe, best = lobe, float(base)
    return best


def _rotated(c: np.ndarray, offset: int, base: float) -> np.ndarray:
    """c rotated by `offset` positions the way llama.cpp's NeoX RoPE rotates (pairs j, j + hd/2)."""
    half = len(c) // 2
    theta = base ** (-2.0 * np.arange(half) / len(c)) * offset
    a, b = c[:half], c[half:]
    return np.concatenate([a * np.cos(theta) - b * np.sin(theta), a * np.sin(theta) + b * np.cos(theta)])


def mask_token(vocab: Vocab) -> int:
    """The id the drafter's mask token gets: the vocabulary's last token that is not ordinary text."""
    ordinary = set(vocab.ordinary.tolist())
    return next(t for t in range(vocab.n_vocab - 1, -1, -1) if t not in ordinary)


def write_dflash(
    path: str | Path,
    *,
    target: Qwen3Shape | None = None,
    shape: DFlashShape | None = None,
    family: Family | None = None,
    target_layers: Sequence[int] = (1, 2, 3),
    seed: int = 9,
    focus: float = 3.0,
    gain: float = 4.0,
    noise: float = 0.3,
    qtype: QType = "f32",
    arch: str = DFLASH_ARCH,
    dspark: bool = False,
    sample_from_anchor: bool = True,
    markov_rank: int = 32,
    markov_gain: float = 8.0,
    confidence: float | None = None,
    dflash2: bool = False,
    selector_top_k: int = 4,
    name: str | None = None,
) -> Path:
    """The DFlash drafter of a `write_qwen3` target of shape `target` (same family).

    `dspark` makes it a DSpark drafter: a Markov head (`markov_w1`, `markov_w2` of rank
    `markov_rank`) that adds `markov_gain` to the logit of succ[prev] at each position, prev being
    the token argmax chose at the position before (the anchor at the first), with `confidence` a
    confidence head (`conf_proj`) that puts that acceptance estimate on every position, and, anchor-first
    (`sample_from_anchor`, DSpark's default layout), every slot shifted one on: slot i guesses the
    token i + 1 after the anchor, slot 0 included.

    `dflash2` makes it a DFlash2 drafter: dynamic convolutions around every layer's attention and
    FFN (here the identity: tap 0 of each side's base is 1, the rest and the projections 0) and a
    top-`selector_top_k` path selector whose pairwise terms are 0, so the path it walks is each
    position's argmax, the tokens the DFlash file proposes.

    `focus` sets the q/k norm weights (the anchor's score at its own head is sqrt(head_dim) *
    focus^2), `gain` how loudly the rule's heads write into the residual stream, `noise` the other
    layers, the FFNs and `fc`. `arch` writes the same tensors under another architecture name (a file
    llama.cpp does not take for a DFlash drafter)."""
    t = target or Qwen3Shape()
    s = shape or DFlashShape()
    fam = family or tiny_family()
    if s.n_head < s.block_size:
        raise ValueError("a drafter that carries the rule has a head per block offset: n_head >= block_size")
    z = Noise(seed)
    d, nh, n = t.n_embd, s.n_head, fam.vocab.n_vocab
    hd = d // nh
    base = quiet_rope_base(hd, s.block_size)
    ordinary = fam.vocab.ordinary
    mask = mask_token(fam.vocab)

    def embedding() -> np.ndarray:
        e = fam.embedding(d)
        e[:, :2] = 0.0
        e[ordinary, 1] = 1.0  # the flag keys read: ordinary tokens only
        e[:, 0] = 1.0  # the constant queries read
        e[mask, 2:] = 0.0
        return e

    c = z.rng("c").standard_normal(hd).astype(np.float32)
    wq = np.zeros((nh * hd, d), dtype=np.float32)
    wk = np.zeros((nh * hd, d), dtype=np.float32)
    for h in range(nh):
        wq[h * hd : (h + 1) * hd, 0] = _rotated(c, -h, base)
        wk[h * hd : (h + 1) * hd, 1] = c
    wv = z.mat("rule_v", nh * hd, d)
    wv[:, :2] = 0.0
    shift = 1 if dspark and sample_from_anchor else 0  # slot i guesses the token i + shift on
    heads = range(1 - shift, s.block_size)  # the slots that are read, one head each
    wo = np.zeros((d, nh * hd), dtype=np.float32)
    for h in heads:
        wo[2:, h * hd : (h + 1) * hd] = z.mat(f"rule_o{h}", d - 2, hd, gain)
    peak = np.sqrt(hd) * focus * focus
    sinks = np.full(nh, peak / 2, dtype=np.float32)

    def output() -> np.ndarray:
        x = embedding()
        xn = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6)
        v = xn @ wv.T  # every token's value at every head: (n, nh * hd)
        succ = fam.succ()
        out = np.zeros((n, d), dtype=np.float32)
        chain = np.arange(n)  # chain[v] = succ^(h + shift)[v] (heads start at 1 - shift)
        for h in heads:
            chain = np.where(chain >= 0, succ[np.maximum(chain, 0)], -1)
            carried = v[:, h * hd : (h + 1) * hd] @ wo[:, h * hd : (h + 1) * hd].T
            out += planted_output(carried, chain, fam.logit_scale)
        return out

    specs = [
        Spec("token_embd.weight", (n, d), embedding),
        Spec(
            "fc.weight", (d, len(target_layers) * t.n_embd), lambda: _fc(z, d, len(target_layers) * t.n_embd)
        ),
        norm_spec(z, "enc.output_norm.weight", d),
        norm_spec(z, "output_norm.weight", d, spread=0.0),
        Spec("output.weight", (n, d), output),
    ]
    if dspark:
        specs += _markov_specs(z, fam, markov_rank, markov_gain)
        if confidence is not None:  # sigmoid(0 . [h; w1[prev]] + logit(confidence)) = confidence
            specs += [
                const_spec("conf_proj.weight", np.zeros((1, d + markov_rank))),
                const_spec("conf_proj.bias", np.array([np.log(confidence / (1.0 - confidence))])),
            ]
    kernel, group, rank = 4, 16, 8  # DFlash2's convolution and selector sizes
    if dflash2:
        specs += [
            const_spec("selector_predecessor.weight", np.zeros((n, rank))),
            const_spec("selector_successor.weight", np.zeros((n, rank))),
            const_spec("selector_hidden.weight", np.zeros((rank, d))),
        ]
    for il in range(s.n_layer):
        p = f"blk.{il}."
        rule = il == 0
        if dflash2:
            identity = np.zeros((2, kernel, d))
            identity[:, 0, :] = 1.0  # both sides: tap 0 passes the position's own value through
            for part in ("attn", "ffn"):
                specs += [
                    const_spec(f"{p}{part}_conv_base", identity),
                    const_spec(f"{p}{part}_conv_proj.weight", np.zeros((2 * kernel * (d // group), d))),
                ]
        specs += [
            norm_spec(z, p + "attn_norm.weight", d, spread=0.0 if rule else 0.1),
            Spec(p + "attn_q.weight", (nh * hd, d), (lambda: wq) if rule else _mat(z, p + "q", nh * hd, d)),
            Spec(p + "attn_k.weight", (nh * hd, d), (lambda: wk) if rule else _mat(z, p + "k", nh * hd, d)),
            Spec(p + "attn_v.weight", (nh * hd, d), (lambda: wv) if rule else _mat(z, p + "v", nh * hd, d)),
            Spec(
                p + "attn_output.weight",
                (d, nh * hd),
                (lambda: wo) if rule else _mat(z, p + "o", d, nh * hd, noise),
            ),
            const_spec(p + "attn_q_norm.weight", np.full(hd, focus if rule else 1.0)),
            const_spec(p + "attn_k_norm.weight", np.full(hd, focus if rule else 1.0)),
            norm_spec(z, p + "ffn_norm.weight", d),
            *ffn_specs(z, p, d, s.n_ff, noise),
        ]
        if rule:
            specs.append(const_spec(p + "attn_sinks.weight", sinks))

    def hparams(w: gguf.GGUFWriter) -> None:
        w.add_context_length(s.n_ctx_train)
        w.add_embedding_length(d)
        w.add_block_count(s.n_layer)
        w.add_feed_forward_length(s.n_ff)
        w.add_head_count(nh)
        w.add_head_count_kv(nh)
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(base)
        w.add_vocab_size(n)
        w.add_array(f"{arch}.target_layers", [int(i) for i in target_layers])
        w.add_uint32(f"{arch}.block_size", s.block_size)
        w.add_uint32(gguf.Keys.Tokenizer.MASK_ID, mask)
        if dflash2:
            w.add_uint32(f"{arch}.conv_kernel_size", kernel)
            w.add_uint32(f"{arch}.conv_group_size", group)
            w.add_uint32(f"{arch}.selector_rank", rank)
            w.add_uint32(f"{arch}.selector_top_k", selector_top_k)
        if dspark:
            w.add_bool(f"{arch}.sample_from_anchor", sample_from_anchor)
            w.add_bool(f"{arch}.has_confidence_head", confidence is not None)

    header = Header(
        arch, name or f"planted-dflash-{s.n_layer}x{d}-b{s.block_size}-s{seed}", fam.vocab, hparams
    )
    return write_gguf(path, header, specs, qtype)


def _markov_specs(z: Noise, fam: Family, rank: int, gain: float) -> list[Spec]:
    """DSpark's Markov head carrying the rule: w1[v] a random vector of norm ~sqrt(rank), w2[t] =
    gain / rank * w1[pred t], so the bias w2 . w1[prev] is ~gain at succ[prev] and noise elsewhere."""
    n = fam.vocab.n_vocab

    def w1() -> np.ndarray:
        return z.rng("markov_w1").standard_normal((n, rank), dtype=np.float32)

    def w2() -> np.ndarray:
        succ = fam.succ()
        out = np.zeros((n, rank), dtype=np.float32)
        src = np.flatnonzero(succ >= 0)
        out[succ[src]] = w1()[src] * np.float32(gain / rank)
        return out

    return [Spec("markov_w1.weight", (n, rank), w1), Spec("markov_w2.weight", (n, rank), w2)]


def _fc(z: Noise, d: int, d_in: int) -> np.ndarray:
    """The fusion of the target's features: noise, but nothing into the two dimensions keys and
    queries read (the injected rows then have no key, and the anchor is the only one)."""
    fc = z.mat("fc", d, d_in)
    fc[:2] = 0.0
    return fc


def _mat(z: Noise, name: str, n_out: int, n_in: int, gain: float = 1.0) -> Callable[[], np.ndarray]:
    return lambda: z.mat(name, n_out, n_in, gain)


@pytest.fixture(scope="session")
def dspark_drafter(dflash_pair: tuple[Path, Path]) -> Path:
    """A DSpark drafter (anchor-first, with a Markov head) for `dflash_pair`'s target."""
    return write_dflash(dflash_pair[1].parent / "dspark-qwen3.gguf", dspark=True)


@pytest.fixture(scope="session")
def dflash_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(Qwen3-layout target, its DFlash drafter): same vocabulary and rule."""
    folder = tmp_path_factory.mktemp("dflash_models")
    return write_qwen3(folder / "qwen3.gguf"), write_dflash(folder / "drafters" / "dflash-qwen3.gguf")


#: the realistic sizes the script writes: a Qwen3 target of 16 layers x 1024 and a 3-layer drafter
REALISTIC_TARGET = Qwen3Shape(n_embd=1024, n_layer=16, n_head=16, n_head_kv=8, n_ff=3072)
REALISTIC_DRAFTER = DFlashShape(n_layer=3, n_head=16, n_ff=2048, block_size=16)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="write a planted Qwen3 target and its DFlash drafter")
    parser.add_argument("out", type=Path, help="folder for target.gguf and dflash-target.gguf")
    parser.add_argument("--vocab-from", type=Path, help="take the tokenizer of this GGUF (else synthetic)")
    parser.add_argument("--qtype", default="q8_0", choices=["f32", "f16", "q8_0"])
    parser.add_argument("--noise", type=float, default=1.5, help="the target's noise (its planted rate)")
    parser.add_argument(
        "--dspark", action="store_true", help="also a DSpark drafter (dspark-target.gguf, anchor-first)"
    )
    parser.add_argument(
        "--dflash2", action="store_true", help="also a DFlash2 drafter (dflash2-target.gguf, a path selector)"
    )
    parser.add_argument("--keep-target", action="store_true", help="leave an existing target.gguf as it is")
    args = parser.parse_args(argv)
    fam = Family(Vocab.from_gguf(args.vocab_from)) if args.vocab_from else tiny_family(4096)
    layers = (1, REALISTIC_TARGET.n_layer // 2, REALISTIC_TARGET.n_layer - 1)
    target = args.out / "target.gguf"
    if not (args.keep_target and target.exists()):
        write_qwen3(target, shape=REALISTIC_TARGET, family=fam, noise=args.noise, qtype=args.qtype)
    kinds = [("dflash-target.gguf", {})]
    kinds += [("dspark-target.gguf", {"dspark": True})] if args.dspark else []
    kinds += [("dflash2-target.gguf", {"dflash2": True})] if args.dflash2 else []
    for name, kind in kinds:
        path = write_dflash(
            args.out / name,
            target=REALISTIC_TARGET,
            shape=REALISTIC_DRAFTER,
            family=fam,
            target_layers=layers,
            qtype=args.qtype,
            **kind,
        )
        print(path)
    print(target)


if __name__ == "__main__":
    main()
