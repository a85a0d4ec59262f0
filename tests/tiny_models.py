"""Tiny but real GGUF models for tests: llama architecture, random (seeded) weights, working tokenizer.

Usage
-----
Write a model directly::

    from .tiny_models import write_tiny_llama          # tests/ is a package
    target = write_tiny_llama(tmp_path / "t.gguf", seed=1)
    draft = write_tiny_llama(tmp_path / "d.gguf", seed=2, perturb_from=(1, 0.01))  # agrees ~90%
    other = write_tiny_llama(tmp_path / "o.gguf", seed=3, n_layer=1)              # same vocab, ~0%
    alien = write_tiny_llama(tmp_path / "a.gguf", vocab_variant=1)                # incompatible tokenizer
    stops = write_tiny_llama(tmp_path / "s.gguf", eog_bias=40.0)                  # emits EOG at once

or use the session-scoped pytest fixtures below (import them into conftest.py)::

    from .tiny_models import tiny_pair, tiny_incompatible  # noqa: F401  (fixtures)

    def test_something(tiny_pair):
        target_path, draft_path = tiny_pair

Fixtures: `tiny_models_dir`, `tiny_target`, `tiny_pair` (draft agrees with target most of the time),
`tiny_pair_unrelated` (same vocab, low agreement), `tiny_incompatible` (ordinary tokens differ from
id 5), `tiny_special_mismatch` (only control-token texts differ), `tiny_spm` (SentencePiece "llama"
tokenizer), `tiny_truncated` (a tiny model cut in half) and `not_a_gguf` (a text file named .gguf).

What the files look like
------------------------
* ``tokenizer="gpt2"`` (default): byte-level BPE like Qwen/Llama 3. Ids 0..255 are the 256 byte tokens in
  GPT-2 byte-to-unicode form, then BPE merges learned (deterministically) from a small built-in corpus,
  then control tokens ``<|endoftext|>`` (BOS, pad), ``<|im_start|>``, ``<|im_end|>`` (EOS and EOT) and
  ``<|extra_N|>``. No BOS is added. Any UTF-8 text round-trips through tokenize/detokenize.
* ``tokenizer="llama"``: SentencePiece style with byte fallback: ``<unk>``, ``<s>`` (BOS, added), ``</s>``
  (EOS), ``<0x00>``..``<0xFF>``, ASCII characters and merged pieces with scores, then the same ChatML
  control tokens.
* ``vocab_variant=v`` rotates the order of the 256 byte tokens (ordinary tokens), so ids 0..255 get other
  texts at the same vocab size: the pair check must call such a pair incompatible (first mismatch <= id 5).
* ``special_variant=v`` renames only the ``<|extra_N|>`` control tokens: the pair check should warn only.
* Weights are float32, drawn from ``seed``; the output matrix is scaled by ``logit_scale`` so that the
  next-token distribution is peaked (top probability ~0.6; greedy decoding has a clear argmax).
  ``perturb_from=(base, eps)`` gives the weights of ``seed=base`` plus ``eps`` times noise drawn from
  ``seed``: a draft that mostly agrees with its target (greedy agreement ~90% at eps 0.01, ~75% at 0.05,
  ~50% at 0.1, ~0% for an unrelated seed). Only equal shapes can be perturbed.
* Control tokens get a logit bias of about ``control_bias`` (-30: never emitted), so generation runs to the
  token limit unless ``eog_bias`` says otherwise (+40: the first token is an end-of-generation token).
  Byte tokens are ordinary, so random output contains invalid/partial UTF-8: good for streaming tests.

Default size: vocab 512, n_embd 64, 2 layers -> about 600 KB; the first write in a process takes ~0.2 s
(BPE training, then cached), later ones ~20 ms.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np
import pytest

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class _Default:
    """Sentinel type: 'use the built-in ChatML template' (None means 'no template at all')."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()

BIAS_LANE = 4.0
"""Value of residual dimension 0 in every token embedding: the lane that carries the logit bias."""

BIAS_LANE_OUT = 2.2
"""Typical value of dimension 0 after the final RMSNorm (measured): converts a logit bias to a weight."""

TARGET_SEED = 1
CLOSE_DRAFT_EPS = 0.01
"""Noise of the close draft: ~90% greedy agreement with the target (0.05 gives ~75%, 0.1 ~50%)."""

N_EXTRA_SPECIAL = 3
"""Number of ``<|extra_N|>`` control tokens, the ones `special_variant` renames."""

# English and Python text: ~490 merges, so vocabs up to ~750 are all real BPE (the rest is padding).
_CORPUS = (
    """
The quick brown fox jumps over the lazy dog. Speculative decoding lets a small draft model propose
tokens that a large target model verifies in a single batch, so the output is exactly what the target
would have written, only faster. When the draft is right, several tokens are accepted at once; when it
is wrong, the target supplies a correction and nothing is lost but a little time.
def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)
for index, value in enumerate(values):
    print(f"{index}: {value}")
class Tokenizer:
    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.merges = merges
    def encode(self, text):
        return [self.vocab[piece] for piece in self.split(text)]
import numpy as np
import json
with open("config.json") as handle:
    config = json.load(handle)
return sorted(items, key=lambda item: item.priority, reverse=True)
Hello, world! How are you today? I am fine, thank you. What time is it? It is seven o'clock in
the morning, and the weather is lovely: sunny, warm and quiet. Please write a function that reverses a
string, then explain how it works. Another example: sum the squares of the even numbers in a list.
Machine learning models read numbers, not words; a tokenizer turns text into numbers and back again.
The kitchen was bright, the coffee was strong, and the newspaper lay unread on the table beside her.
Questions, answers, functions, variables, arguments, parameters, exceptions, iterators, generators.
"""
    * 3
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, which byte-level BPE token texts use."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


@functools.lru_cache(maxsize=8)
def _train_bpe(n_merges: int) -> tuple[tuple[str, str], ...]:
    """Learn up to `n_merges` byte-level BPE merges from the corpus; ties broken lexically (deterministic).

    Cached (a pure function of its argument) because training is most of the time it takes to write a model.
    """
    b2u = bytes_to_unicode()
    words = Counter(re.findall(r" ?\w+| ?[^\s\w]+|\s+", _CORPUS))
    seqs = {tuple(b2u[b] for b in w.encode()): c for w, c in words.items()}
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for seq, c in seqs.items():
            for a, b in itertools.pairwise(seq):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        new: dict[tuple[str, ...], int] = {}
        for seq, c in seqs.items():
            out: list[str] = []
            i = 0
            while i < len(seq):
                if i + 1 < len(seq) and (seq[i], seq[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        seqs = new
    return tuple(merges)


def _special_texts(special_variant: int) -> list[str]:
    """The extra control tokens; a non-zero variant renames them (only control texts change)."""
    stem = "extra" if special_variant == 0 else f"reserved{special_variant}"
    return [f"<|{stem}_{i}|>" for i in range(N_EXTRA_SPECIAL)]


def _rotate(items: list[str], vocab_variant: int) -> list[str]:
    """Rotate the byte-token order: a different id -> text map with the same set of texts."""
    k = (vocab_variant * 97) % len(items)
    return items[k:] + items[:k]


def gpt2_vocab(
    vocab: int, *, vocab_variant: int = 0, special_variant: int = 0
) -> tuple[list[str], list[int], list[str], dict[str, Any]]:
    """Byte-level BPE vocab: (tokens, token types, merges, special ids by role: bos/eos/eot/pad, and
    eog = the ids llama.cpp treats as end of generation)."""
    b2u = bytes_to_unicode()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_special_texts(special_variant)]
    n_merges = vocab - 256 - len(specials)
    if n_merges < 0:
        raise ValueError(f"vocab must be at least {256 + len(specials)} for the gpt2 tokenizer")
    merges = _train_bpe(n_merges)
    tokens = _rotate([b2u[b] for b in range(256)], vocab_variant) + [a + b for a, b in merges]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    # The corpus ran out of merges: pad with tokens no merge produces (harmless, never emitted by BPE).
    for i in range(n_merges - len(merges)):
        tokens.append(f"[unused{i}]")
        types.append(gguf.TokenType.UNUSED)
    base = len(tokens)
    tokens += specials
    types += [gguf.TokenType.CONTROL] * len(specials)
    ids = {"bos": base, "pad": base, "eos": base + 2, "eot": base + 2, "eog": [base, base + 2]}
    return tokens, [int(t) for t in types], [f"{a} {b}" for a, b in merges], ids


def add_gpt2_tokenizer(
    w: Any, vocab: int, *, vocab_variant: int = 0, special_variant: int = 0
) -> tuple[list[int], dict[str, Any]]:
    """Write the byte-level BPE tokenizer (gpt2_vocab) into a GGUFWriter `w`; its token types and ids.
    Shared with tests/perf/device/random_gguf.py, whose real-size models use the same tokenizer."""
    tokens, types, merges, ids = gpt2_vocab(
        vocab, vocab_variant=vocab_variant, special_variant=special_variant
    )
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_add_bos_token(False)
    return types, ids


def spm_vocab(
    vocab: int, *, vocab_variant: int = 0, special_variant: int = 0
) -> tuple[list[str], list[int], list[float], dict[str, Any]]:
    """SentencePiece vocab with byte fallback: (tokens, token types, scores, special ids by role)."""
    head = ["<unk>", "<s>", "</s>"]
    byte_tokens = _rotate([f"<0x{b:02X}>" for b in range(256)], vocab_variant)
    chars = ["▁" if c == " " else c for c in map(chr, range(32, 127))]
    specials = ["<|im_start|>", "<|im_end|>", *_special_texts(special_variant)]
    n_pieces = vocab - len(head) - 256 - len(chars) - len(specials)
    if n_pieces < 0:
        raise ValueError(f"vocab must be at least {vocab - n_pieces} for the llama tokenizer")
    u2b = {u: b for b, u in bytes_to_unicode().items()}
    pieces: list[str] = []
    seen = set(chars)
    for a, b in _train_bpe(n_pieces + 200):  # a few byte-level merges collapse to the same text
        text = bytes(u2b[ch] for ch in a + b).decode("utf-8", errors="replace").replace(" ", "▁")
        if text not in seen and "\ufffd" not in text:
            seen.add(text)
            pieces.append(text)
        if len(pieces) == n_pieces:
            break
    pieces += [f"[unused{i}]" for i in range(n_pieces - len(pieces))]
    tokens = head + byte_tokens + chars + pieces + specials
    T = gguf.TokenType
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256 + [T.NORMAL] * (len(chars) + len(pieces))
    types += [T.CONTROL] * len(specials)
    # Higher score = merged earlier; characters and bytes score lowest, specials are never merged.
    scores = [0.0, 0.0, 0.0] + [-1e4] * 256 + [-9e3] * len(chars)
    scores += [-float(i) for i in range(len(pieces))] + [0.0] * len(specials)
    base = len(head) + 256 + len(chars) + len(pieces)
    ids = {"bos": 1, "eos": 2, "eot": base + 1, "pad": 0, "unk": 0, "eog": [2, base + 1]}
    return tokens, [int(t) for t in types], scores, ids


def _weights(
    seed: int,
    *,
    n_vocab: int,
    n_embd: int,
    n_layer: int,
    n_head_kv_dim: int,
    n_ff: int,
    logit_scale: float,
    token_bias: np.ndarray,
) -> dict[str, np.ndarray]:
    """Random float32 weights in the llama layout (numpy shape = (out, in), ggml reverses it).

    Llama has no output bias, so one is built: residual dimension 0 holds the constant BIAS_LANE in
    every token embedding, no layer writes to it (row 0 of attn_output and ffn_down is zero), so after the
    final RMSNorm it is a positive number (about 1) and output[:, 0] acts as a per-token logit bias.
    """
    rng = np.random.default_rng(seed)

    def lin(n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": rng.standard_normal((n_vocab, n_embd)).astype(np.float32)}
    w["token_embd.weight"][:, 0] = BIAS_LANE
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(n_embd)
        w[p + "attn_q.weight"] = lin(n_embd, n_embd, 2.0)
        w[p + "attn_k.weight"] = lin(n_head_kv_dim, n_embd, 2.0)
        w[p + "attn_v.weight"] = lin(n_head_kv_dim, n_embd)
        w[p + "attn_output.weight"] = lin(n_embd, n_embd)
        w[p + "attn_output.weight"][0] = 0.0
        w[p + "ffn_norm.weight"] = norm(n_embd)
        w[p + "ffn_gate.weight"] = lin(n_ff, n_embd)
        w[p + "ffn_up.weight"] = lin(n_ff, n_embd)
        w[p + "ffn_down.weight"] = lin(n_embd, n_ff)
        w[p + "ffn_down.weight"][0] = 0.0
    w["output_norm.weight"] = norm(n_embd)
    w["output_norm.weight"][0] = 1.0
    w["output.weight"] = lin(n_vocab, n_embd, logit_scale)
    w["output.weight"][:, 0] = token_bias
    return w


def write_tiny_llama(
    path: str | Path,
    *,
    seed: int = 0,
    vocab: int = 512,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int | None = None,
    n_ff: int | None = None,
    n_ctx_train: int = 512,
    tokenizer: Literal["gpt2", "llama"] = "gpt2",
    chat_template: str | _Default | None = DEFAULT,
    vocab_variant: int = 0,
    special_variant: int = 0,
    perturb_from: tuple[int, float] | None = None,
    logit_scale: float = 6.0,
    control_bias: float = -30.0,
    eog_bias: float | None = None,
    name: str | None = None,
) -> Path:
    """Write a tiny llama-architecture GGUF that llama.cpp loads and runs; return its path.

    `n_head_kv` < `n_head` gives grouped-query attention (like real models); `n_ff` defaults to 2*n_embd.
    `chat_template=None` writes no template (for testing the "no chat template" path).

    `control_bias` is added (approximately) to the logits of every control token, so by default the
    random model never emits one and generation always runs to the token limit. `eog_bias` overrides it
    for the end-of-generation tokens: e.g. +40 makes the model stop at once.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n_head_kv = n_head if n_head_kv is None else n_head_kv
    n_ff = 2 * n_embd if n_ff is None else n_ff
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    head_dim = n_embd // n_head

    w = gguf.GGUFWriter(path, "llama")
    w.add_name(name or f"tiny-llama-{tokenizer}-s{seed}")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    if tokenizer == "gpt2":
        types, ids = add_gpt2_tokenizer(
            w, vocab, vocab_variant=vocab_variant, special_variant=special_variant
        )
    elif tokenizer == "llama":
        tokens, types, scores, ids = spm_vocab(
            vocab, vocab_variant=vocab_variant, special_variant=special_variant
        )
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_scores(scores)
        w.add_unk_token_id(ids["unk"])
        w.add_add_bos_token(True)
        w.add_add_space_prefix(True)
    else:
        raise ValueError(f"unknown tokenizer kind {tokenizer!r}")
    w.add_bos_token_id(ids["bos"])
    w.add_eos_token_id(ids["eos"])
    w.add_eot_token_id(ids["eot"])
    w.add_pad_token_id(ids["pad"])
    w.add_add_eos_token(False)
    if isinstance(chat_template, _Default):
        w.add_chat_template(CHATML_TEMPLATE)
    elif chat_template is not None:
        w.add_chat_template(chat_template)

    token_bias = np.zeros(vocab, dtype=np.float32)
    token_bias[np.asarray(types) == gguf.TokenType.CONTROL] = control_bias / BIAS_LANE_OUT
    if eog_bias is not None:
        token_bias[[i for i in ids["eog"]]] = eog_bias / BIAS_LANE_OUT
    shapes = {
        "n_vocab": vocab,
        "n_embd": n_embd,
        "n_layer": n_layer,
        "n_head_kv_dim": n_head_kv * head_dim,
        "n_ff": n_ff,
        "logit_scale": logit_scale,
        "token_bias": token_bias,
    }
    if perturb_from is None:
        weights = _weights(seed, **shapes)
    else:
        base_seed, eps = perturb_from
        base = _weights(base_seed, **shapes)
        noise = _weights(seed, **shapes)
        weights = {k: (base[k] + np.float32(eps) * noise[k]).astype(np.float32) for k in base}
    for tensor_name, array in weights.items():
        w.add_tensor(tensor_name, array)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_special_mismatch_pair(directory: str | Path, *, seed: int = 0) -> tuple[Path, Path]:
    """A (target, draft) pair whose vocabularies differ only in control-token texts (warning case).

    The draft is a close perturbation of the target, so it is still a useful draft.
    """
    directory = Path(directory)
    target = write_tiny_llama(directory / "special-target.gguf", seed=seed)
    draft = write_tiny_llama(
        directory / "special-draft.gguf",
        seed=seed + 1000,
        perturb_from=(seed, CLOSE_DRAFT_EPS),
        special_variant=1,
    )
    return target, draft


def write_truncated(src: str | Path, dst: str | Path, fraction: float = 0.5) -> Path:
    """Copy the first `fraction` of a file: what an interrupted download leaves behind."""
    data = Path(src).read_bytes()
    dst = Path(dst)
    dst.write_bytes(data[: int(len(data) * fraction)])
    return dst


# ---------------------------------------------------------------------------------------------------
# Fixtures (session-scoped: each file is written once per test run). Import them into conftest.py.
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory holding every tiny model of the session."""
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="session")
def tiny_target(tiny_models_dir: Path) -> Path:
    """The tiny target model (gpt2 tokenizer, ChatML template, seed TARGET_SEED)."""
    path = tiny_models_dir / "target.gguf"
    return path if path.exists() else write_tiny_llama(path, seed=TARGET_SEED)


@pytest.fixture(scope="session")
def tiny_pair(tiny_models_dir: Path, tiny_target: Path) -> tuple[Path, Path]:
    """(target, draft): the draft is the target plus small noise, so greedy acceptance is high."""
    draft = write_tiny_llama(
        tiny_models_dir / "draft-close.gguf", seed=2, perturb_from=(TARGET_SEED, CLOSE_DRAFT_EPS)
    )
    return tiny_target, draft


@pytest.fixture(scope="session")
def tiny_pair_unrelated(tiny_models_dir: Path, tiny_target: Path) -> tuple[Path, Path]:
    """(target, draft): same tokenizer, unrelated weights and a smaller shape, so acceptance is low."""
    draft = write_tiny_llama(tiny_models_dir / "draft-unrelated.gguf", seed=3, n_layer=1, n_embd=32)
    return tiny_target, draft


@pytest.fixture(scope="session")
def tiny_incompatible(tiny_models_dir: Path, tiny_target: Path) -> tuple[Path, Path]:
    """(target, draft) with the same vocab size but different ordinary-token texts from id 5 on."""
    draft = write_tiny_llama(tiny_models_dir / "draft-alien.gguf", seed=4, vocab_variant=1)
    return tiny_target, draft


@pytest.fixture(scope="session")
def tiny_special_mismatch(tiny_models_dir: Path) -> tuple[Path, Path]:
    """(target, draft) differing only in control-token texts: the pair check should only warn."""
    return write_special_mismatch_pair(tiny_models_dir / "special")


@pytest.fixture(scope="session")
def tiny_spm(tiny_models_dir: Path) -> Path:
    """A tiny model with a SentencePiece ("llama") tokenizer with byte fallback."""
    return write_tiny_llama(tiny_models_dir / "spm.gguf", seed=5, tokenizer="llama")


@pytest.fixture(scope="session")
def tiny_truncated(tiny_models_dir: Path, tiny_target: Path) -> Path:
    """The tiny target cut in half, like an interrupted download."""
    return write_truncated(tiny_target, tiny_models_dir / "truncated.gguf")


@pytest.fixture(scope="session")
def not_a_gguf(tiny_models_dir: Path) -> Path:
    """A text file with a .gguf name."""
    path = tiny_models_dir / "notes.gguf"
    path.write_text("these are my notes, not a model\n")
    return path
