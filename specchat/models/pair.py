"""The draft/target compatibility check, as llama.cpp's `common_speculative_are_compatible` does it.

Drafts are token ids: they only help if both models mean the same text by the same id. Correctness never
depends on this (the target verifies every token), so only disagreement on ordinary tokens is fatal;
control/special tokens that differ (chat markers, unused slots) only earn a warning.
"""

from __future__ import annotations

from typing import Protocol

from ..errors import IncompatiblePair

MAX_VOCAB_DIFF = 128
FIRST_CHECKED_ID = 5


class VocabSource(Protocol):
    name: str

    def vocab_facts(self) -> object: ...

    def token_text(self, token: int) -> str: ...

    def is_control(self, token: int) -> bool: ...


def check_pair(target: VocabSource, draft: VocabSource) -> list[str]:
    """Raise IncompatiblePair for a pair whose drafts would be meaningless; return warnings otherwise."""
    t, d = target.vocab_facts(), draft.vocab_facts()
    hint = "pick a draft from the same model family (`specchat models --drafts-for TARGET`)"
    if t.vocab_type != d.vocab_type:
        raise IncompatiblePair(
            f"draft and target use different tokenizers (vocab type {d.vocab_type} vs {t.vocab_type})", hint
        )
    if t.add_bos != d.add_bos or (t.add_bos and t.bos != d.bos):
        raise IncompatiblePair(f"draft and target use different BOS tokens ({d.bos} vs {t.bos})", hint)
    if t.add_eos != d.add_eos or (t.add_eos and t.eos != d.eos):
        raise IncompatiblePair(f"draft and target use different EOS tokens ({d.eos} vs {t.eos})", hint)
    if abs(t.n_vocab - d.n_vocab) > MAX_VOCAB_DIFF:
        raise IncompatiblePair(
            f"draft and target use different tokenizers (vocab sizes {d.n_vocab} vs {t.n_vocab})", hint
        )
    warnings: list[str] = []
    special_mismatch = 0
    first_special: int | None = None
    for i in range(FIRST_CHECKED_ID, min(t.n_vocab, d.n_vocab)):
        tt, dt = target.token_text(i), draft.token_text(i)
        if tt == dt:
            continue
        if target.is_control(i) or draft.is_control(i):
            special_mismatch += 1
            first_special = i if first_special is None else first_special
            continue
        raise IncompatiblePair(
            f"draft and target use different tokenizers: token {i} is {dt!r} in the draft "
            f"but {tt!r} in the target",
            hint,
        )
    if special_mismatch:
        warnings.append(
            f"draft and target differ in {special_mismatch} control/special token(s) "
            f"(first: id {first_special}); "
            "drafting still works, the target verifies every token"
        )
    if t.n_vocab != d.n_vocab:
        warnings.append(
            f"vocab sizes differ ({d.n_vocab} draft vs {t.n_vocab} target); "
            "ids the target lacks are never accepted"
        )
    return warnings
