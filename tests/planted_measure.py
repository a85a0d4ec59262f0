"""Measuring what a planted-pattern model does (tests/planted_gguf.py): how often it follows the rule,
how often a draft agrees with it, and how much of its output prompt lookup would have found.

Works on any object with the engine's `decode(tokens, logits_rows)`, `truncate(n)` and `tokens`
(specchat.llama.engine.LlamaModel), so the tests and the benchmark-file script measure alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

PROMPT = (
    "Write a short function that reverses a string, then explain how it works, step by step, "
    "for a reader who has never seen Python before."
)


def greedy(model: Any, prompt: Sequence[int], n: int) -> list[int]:
    """The model's greedy continuation of `prompt` (its cache is emptied first)."""
    model.truncate(0)
    logits = model.decode(list(prompt), [len(prompt) - 1])
    out = [int(np.argmax(logits[-1]))]
    while len(out) < n:
        out.append(int(np.argmax(model.decode(out[-1:], [0])[0])))
    return out


def predictions(model: Any, prompt: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
    """The model's argmax after the prompt and after each token of `continuation` but the last (one
    batch: what a greedy draft of one token would propose at each step of that text)."""
    model.truncate(0)
    tokens = list(prompt) + list(continuation[:-1])
    rows = list(range(len(prompt) - 1, len(tokens)))
    return np.argmax(model.decode(tokens, rows), axis=1)


def planted_rate(tokens: Sequence[int], succ: np.ndarray) -> float:
    """Share of tokens that follow the rule from the token before them."""
    t = np.asarray(tokens)
    return float(np.mean(succ[t[:-1]] == t[1:]))


def lookup_rate(prompt: Sequence[int], output: Sequence[int], n: int = 2) -> float:
    """Share of output tokens prompt lookup predicts: the last `n` tokens occurred earlier in the
    prompt or output, and the token that followed them then (the latest occurrence) comes again."""
    seq = list(prompt) + list(output)
    last: dict[tuple[int, ...], int] = {}
    hits = 0
    for i in range(len(seq)):
        if i >= n:
            key = tuple(seq[i - n : i])
            if i >= len(prompt) and key in last and seq[last[key]] == seq[i]:
                hits += 1
            last[key] = i
    return hits / max(1, len(output))


@dataclass(frozen=True)
class PairReport:
    """A target's greedy text and how a draft (and the rule) fared along it."""

    target_rate: float  # the target follows the rule this often
    draft_rate: float  # the draft's proposals follow the rule this often
    agreement: float  # the draft's one-token proposal is the target's token this often
    lookup: float  # prompt lookup (2-gram) predicts this share of the target's tokens
    distinct: float  # distinct tokens / tokens in the target's text


def measure_pair(target: Any, draft: Any, prompt: Sequence[int], succ: np.ndarray, n: int = 64) -> PairReport:
    """Greedy `n` tokens from the target, then the draft's proposal at every step of that text."""
    out = greedy(target, prompt, n)
    pred = predictions(draft, prompt, out)
    ctx = [prompt[-1], *out]
    return PairReport(
        target_rate=planted_rate(ctx, succ),
        draft_rate=float(np.mean(pred == succ[np.asarray(ctx[:-1])])),
        agreement=float(np.mean(pred == np.asarray(out))),
        lookup=lookup_rate(prompt, out),
        distinct=len(set(out)) / len(out),
    )
