"""The tiny GGUF models other tests rely on: llama.cpp loads them, their tokenizers work, and the pairs
behave as their fixtures promise (close draft agrees, unrelated draft does not, variants differ)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from .tiny_models import (
    CLOSE_DRAFT_EPS,
    TARGET_SEED,
    gpt2_vocab,
    spm_vocab,
    write_tiny_llama,
)

llama_cpp = pytest.importorskip("llama_cpp")

TEXT = "Hello wörld! Tiếng Việt 你好 🦙 def f(x):\n    return x  # ok"


def load(path: Path, **kw: object) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False, **kw)


@pytest.fixture
def loaded() -> Iterator[list[llama_cpp.Llama]]:
    """Models loaded by a test, closed after it (llama.cpp memory is not garbage-collected promptly)."""
    models: list[llama_cpp.Llama] = []
    yield models
    for m in models:
        m.close()


def greedy(llm: llama_cpp.Llama, prompt: list[int], n: int) -> list[int]:
    llm.reset()
    out: list[int] = []
    for token in llm.generate(prompt, temp=0.0, top_k=1):
        out.append(token)
        if len(out) == n:
            break
    return out


def all_logits(llm: llama_cpp.Llama, tokens: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)])


def token_texts(llm: llama_cpp.Llama) -> list[bytes]:
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return [llama_cpp.llama_vocab_get_text(vocab, i) for i in range(llm.n_vocab())]


def test_write_is_fast_and_small(tmp_path: Path) -> None:
    start = time.perf_counter()
    path = write_tiny_llama(tmp_path / "m.gguf", seed=7)
    assert time.perf_counter() - start < 1.0
    assert 100_000 < path.stat().st_size < 1_000_000


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_tokenizer_round_trips_unicode(tmp_path: Path, kind: str, loaded: list) -> None:
    llm = load(write_tiny_llama(tmp_path / f"{kind}.gguf", tokenizer=kind))
    loaded.append(llm)
    ids = llm.tokenize(TEXT.encode(), add_bos=True)
    assert len(ids) < len(TEXT.encode())  # merges happen: not one token per byte
    assert llm.detokenize(ids).decode() == TEXT
    im_start, im_end = (
        llm.tokenize(t.encode(), add_bos=False, special=True) for t in ("<|im_start|>", "<|im_end|>")
    )
    assert len(im_start) == len(im_end) == 1
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    assert llama_cpp.llama_vocab_is_eog(vocab, im_end[0])
    assert llama_cpp.llama_vocab_is_control(vocab, im_start[0])
    assert llm.metadata["tokenizer.chat_template"].startswith("{% for message in messages %}")


def test_greedy_has_a_clear_winner_and_never_emits_control_tokens(tiny_target: Path, loaded: list) -> None:
    llm = load(tiny_target, logits_all=True)
    loaded.append(llm)
    prompt = llm.tokenize(b"def fibonacci(n):")
    out = greedy(llm, prompt, 40)
    assert len(set(out)) > 10  # not stuck on one token
    assert max(out) < gpt2_vocab(512)[3]["bos"]  # control tokens sit at the end of the vocab
    top2 = np.sort(all_logits(llm, prompt + out), axis=1)[:, -2:]
    assert np.median(top2[:, 1] - top2[:, 0]) > 0.5


def test_eog_bias_makes_the_model_stop(tmp_path: Path, loaded: list) -> None:
    llm = load(write_tiny_llama(tmp_path / "stop.gguf", eog_bias=40.0))
    loaded.append(llm)
    first = greedy(llm, llm.tokenize(b"Hello"), 1)[0]
    assert llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llm.model), first)


def agreement(target: llama_cpp.Llama, draft: llama_cpp.Llama, text: bytes, n: int = 40) -> float:
    """How often the draft's argmax equals the target's along the target's own greedy continuation."""
    prompt = target.tokenize(text)
    seq = prompt + greedy(target, prompt, n)
    t = all_logits(target, seq).argmax(axis=1)[len(prompt) - 1 : -1]
    d = all_logits(draft, seq).argmax(axis=1)[len(prompt) - 1 : -1]
    return float((t == d).mean())


def test_close_draft_agrees_and_unrelated_draft_does_not(
    tiny_pair: tuple[Path, Path], tiny_pair_unrelated: tuple[Path, Path], loaded: list
) -> None:
    target, close = (load(p, logits_all=True) for p in tiny_pair)
    unrelated = load(tiny_pair_unrelated[1], logits_all=True)
    loaded.extend([target, close, unrelated])
    assert target.n_vocab() == close.n_vocab() == unrelated.n_vocab()
    assert token_texts(target) == token_texts(close) == token_texts(unrelated)
    high = agreement(target, close, b"The quick brown fox")
    low = agreement(target, unrelated, b"The quick brown fox")
    assert high >= 0.75, f"close draft (eps={CLOSE_DRAFT_EPS} around seed {TARGET_SEED}) agrees {high:.0%}"
    assert low <= 0.25


def test_incompatible_vocab_differs_in_ordinary_tokens(
    tiny_incompatible: tuple[Path, Path], loaded: list
) -> None:
    target, draft = (load(p, vocab_only=True) for p in tiny_incompatible)
    loaded.extend([target, draft])
    assert target.n_vocab() == draft.n_vocab()
    t, d = token_texts(target), token_texts(draft)
    assert min(i for i in range(len(t)) if t[i] != d[i]) <= 5


def test_special_mismatch_differs_only_in_control_tokens(
    tiny_special_mismatch: tuple[Path, Path], loaded: list
) -> None:
    target, draft = (load(p, vocab_only=True) for p in tiny_special_mismatch)
    loaded.extend([target, draft])
    t, d = token_texts(target), token_texts(draft)
    differing = [i for i in range(len(t)) if t[i] != d[i]]
    assert differing
    vocab = llama_cpp.llama_model_get_vocab(target.model)
    assert all(llama_cpp.llama_vocab_is_control(vocab, i) for i in differing)


def test_spm_fixture_has_byte_fallback(tiny_spm: Path, loaded: list) -> None:
    llm = load(tiny_spm, vocab_only=True)
    loaded.append(llm)
    tokens = spm_vocab(512)[0]
    ids = llm.tokenize("🦙".encode(), add_bos=False)
    assert [tokens[i] for i in ids if tokens[i] != "▁"] == ["<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]
