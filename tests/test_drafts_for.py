"""`specchat models --drafts-for`: the registry's family claim confirmed by the real tokenizer check."""

from __future__ import annotations

from specchat.cli.models import _confirm_vocab


def test_vocab_check_marks_same_different_and_missing(tiny_pair, tiny_incompatible, tiny_special_mismatch):
    target, close = tiny_pair
    rows = [
        {"alias": "close", "path": str(close)},
        {"alias": "alien", "path": str(tiny_incompatible[1])},
        {"alias": "special", "path": str(tiny_special_mismatch[1])},
        {"alias": "absent", "path": None},
    ]
    _confirm_vocab(target, rows)
    vocab = {r["alias"]: r["vocab"] for r in rows}
    assert vocab["close"] == "same"
    assert vocab["alien"].startswith("different: draft and target use different tokenizers")
    assert vocab["absent"] is None
    # differs from this target only in control-token texts: usable, with a warning
    assert vocab["special"].startswith("warning: draft and target differ in"), vocab["special"]


def test_no_target_file_means_no_verdicts(tiny_pair):
    rows = [{"alias": "close", "path": str(tiny_pair[1])}]
    _confirm_vocab(None, rows)
    assert rows[0]["vocab"] is None
