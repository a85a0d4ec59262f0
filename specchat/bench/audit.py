"""The exactness audit: every distinct output teacher-forced through the target one token at a time,
each token checked to be the argmax within `TIE_TOLERANCE`, and where outputs part from plain decoding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..decoding.model import Model
from .measure import Measurement
from .suite import Config, PreparedPrompt

TIE_TOLERANCE = 0.05  # logits; see the module docstring


@dataclass(frozen=True, slots=True)
class AuditFailure:
    """A token that is not the target's argmax by more than the tie tolerance."""

    index: int
    token: int
    argmax: int
    gap: float


@dataclass(frozen=True, slots=True)
class Audit:
    """Teacher-forced check of one distinct greedy output (shared by every config that produced it)."""

    prompt: str
    configs: tuple[str, ...]
    n_tokens: int
    worst_gap: float
    worst_index: int | None
    failures: tuple[AuditFailure, ...]
    gaps: tuple[float, ...] = field(repr=False)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "configs": list(self.configs),
            "tokens": self.n_tokens,
            "worst_gap": round(self.worst_gap, 6),
            "worst_index": self.worst_index,
            "ok": self.ok,
            "failures": [
                {"index": f.index, "token": f.token, "argmax": f.argmax, "gap": round(f.gap, 6)}
                for f in self.failures
            ],
        }


def teacher_force(target: Model, prompt: Sequence[int], output: Sequence[int]) -> list[tuple[float, int]]:
    """For each output token: (max logit − its logit, argmax), decoding one token at a time.

    One token per decode is how plain decoding runs, so this is the target's own reference answer at
    every position, whatever batch sizes the speculative run verified with.
    """
    if not prompt:
        raise ValueError("the prompt must contain at least one token")
    target.truncate(0)
    try:
        if len(prompt) > 1:
            target.decode(list(prompt[:-1]), [])
        out: list[tuple[float, int]] = []
        inputs = [prompt[-1], *output[:-1]]
        for tok_in, tok_out in zip(inputs, output, strict=True):
            row = target.decode([int(tok_in)], [0])[0]  # a view the next decode overwrites: use it now
            top = int(np.argmax(row))
            out.append((float(row[top]) - float(row[int(tok_out)]), top))
        return out
    finally:
        target.truncate(0)


def audit_output(
    target: Model,
    prompt: PreparedPrompt,
    output: Sequence[int],
    configs: Sequence[str],
    *,
    tolerance: float = TIE_TOLERANCE,
) -> Audit:
    """Check that every token of a greedy `output` is the target's argmax within `tolerance`."""
    forced = teacher_force(target, prompt.tokens, output)
    gaps = tuple(g for g, _ in forced)
    failures = tuple(
        AuditFailure(i, int(output[i]), top, gap) for i, (gap, top) in enumerate(forced) if gap > tolerance
    )
    worst_index = max(range(len(gaps)), key=gaps.__getitem__) if gaps else None
    return Audit(
        prompt=prompt.name,
        configs=tuple(configs),
        n_tokens=len(output),
        worst_gap=gaps[worst_index] if worst_index is not None else 0.0,
        worst_index=worst_index,
        failures=failures,
        gaps=gaps,
    )


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a speculative greedy output first differs from the plain greedy output of the same prompt.

    `gap` is how far the speculative token's logit is below the target's maximum at that position
    (teacher-forced); `tie` is whether that is within the tolerance, i.e. an expected near-tie swap.
    """

    prompt: str
    config: str
    index: int
    token: int | None
    plain_token: int | None
    gap: float | None
    tie: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "config": self.config,
            "index": self.index,
            "token": self.token,
            "plain_token": self.plain_token,
            "gap": None if self.gap is None else round(self.gap, 6),
            "tie": self.tie,
        }


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where the sequences differ (the shorter length if one is a prefix), else None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def find_divergences(
    prompt: PreparedPrompt,
    configs: Sequence[Config],
    measurements: Sequence[Measurement],
    audits: dict[tuple[int, ...], Audit],
) -> list[Divergence]:
    """For each speculative config, the earliest point where any of its outputs parts from plain's."""
    plain_cfg = next(c for c in configs if c.plain)
    mine = [m for m in measurements if m.prompt == prompt.name]
    plain = next(m.tokens for m in mine if m.config == plain_cfg.name)
    out: list[Divergence] = []
    for cfg in configs:
        if cfg.plain:
            continue
        first: tuple[int, tuple[int, ...]] | None = None
        for m in mine:
            if m.config != cfg.name:
                continue
            i = first_difference(m.tokens, plain)
            if i is not None and (first is None or i < first[0]):
                first = (i, m.tokens)
        if first is None:
            continue
        i, toks = first
        gaps = audits[toks].gaps if toks in audits else ()
        gap = gaps[i] if i < len(gaps) else None
        out.append(
            Divergence(
                prompt=prompt.name,
                config=cfg.name,
                index=i,
                token=toks[i] if i < len(toks) else None,
                plain_token=plain[i] if i < len(plain) else None,
                gap=gap,
                tie=gap is not None and gap <= TIE_TOLERANCE,
            )
        )
    return out
