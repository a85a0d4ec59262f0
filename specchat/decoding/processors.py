"""Logits processors: settings that need the tokens generated so far (OpenAI's `presence_penalty`,
`frequency_penalty`, `logit_bias`, or a library user's own), applied to every row a token is
decided from, the target's and the drafts' alike.

A processor is a function of (the tokens this answer has generated before the row's position, the
row) returning the adjusted row. Why it keeps speculative decoding exact: the loop hands verify row
i the answer so far plus drafts d1..d_i, which is exactly what plain decoding would have generated
before that position whenever row i is read at all (a row is only read once the drafts before it
are accepted). So every decided row is the one plain decoding would decide with: greedy output
equals `--no-draft` with the same settings token for token, and when sampling the target's p is
the processed distribution. A draft model processes its own rows the same way (`AnswerProcessor`
with its drafted tokens), so its drafts follow the penalised target, and its q is the distribution
it actually drew from, as exact verification requires of any q.

The prompt is not "generated": penalties count only the answer's tokens, as OpenAI's API does.
Processors never change a row in place: a row may be a view of the engine's logits buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .settings import SamplingParams


class LogitsProcessor(Protocol):
    """Adjusts one logits row for the answer so far."""

    def __call__(self, generated: Sequence[int], row: np.ndarray) -> np.ndarray:
        """`row` adjusted, as a new array (never `row` changed in place). `generated`: the tokens
        this answer holds before the row's position (not the prompt)."""
        ...


@dataclass(frozen=True, slots=True)
class Penalties:
    """OpenAI's presence and frequency penalties: a token's logit is lowered by
    `presence * [count > 0] + frequency * count`, count being how often the answer holds it."""

    presence: float = 0.0
    frequency: float = 0.0

    def __call__(self, generated: Sequence[int], row: np.ndarray) -> np.ndarray:
        if not generated:
            return row
        ids, counts = np.unique(np.asarray(generated, dtype=np.int64), return_counts=True)
        inside = ids < row.shape[0]  # a draft's id beyond the target's vocabulary has no logit here
        ids, counts = ids[inside], counts[inside]
        out = row.copy()
        out[ids] -= (self.presence + self.frequency * counts).astype(row.dtype)
        return out


@dataclass(frozen=True, slots=True)
class LogitBias:
    """OpenAI's `logit_bias`: a fixed number added to some tokens' logits (-100 bans a token in
    effect, 100 forces it). Ids beyond the row (a draft's smaller vocabulary) are left out there."""

    bias: tuple[tuple[int, float], ...]

    def __call__(self, generated: Sequence[int], row: np.ndarray) -> np.ndarray:
        pairs = [(token, value) for token, value in self.bias if token < row.shape[0]]
        if not pairs:
            return row
        out = row.copy()
        ids = np.array([t for t, _ in pairs], dtype=np.int64)
        out[ids] += np.array([v for _, v in pairs], dtype=row.dtype)
        return out


@dataclass(frozen=True, slots=True)
class Chain:
    """Several processors, each given the row the one before returned."""

    processors: tuple[LogitsProcessor, ...]

    def __call__(self, generated: Sequence[int], row: np.ndarray) -> np.ndarray:
        for processor in self.processors:
            row = processor(generated, row)
        return row


def for_params(params: SamplingParams, extra: Sequence[LogitsProcessor] = ()) -> LogitsProcessor | None:
    """The processor the sampling settings ask for (penalties, then the bias), followed by `extra`
    (a library user's own); None when there is nothing to do, so plain settings cost nothing."""
    chain: list[LogitsProcessor] = []
    if params.presence_penalty or params.frequency_penalty:
        chain.append(Penalties(params.presence_penalty, params.frequency_penalty))
    if params.logit_bias:
        chain.append(LogitBias(params.logit_bias))
    chain.extend(extra)
    if not chain:
        return None
    return chain[0] if len(chain) == 1 else Chain(tuple(chain))


@dataclass(frozen=True, slots=True)
class AnswerProcessor:
    """A processor bound to one answer: `start` is where the answer begins in the context (the
    prompt's length). What drafters are given (Drafter.propose's `processor`): they know the
    context, not where the answer in it begins."""

    processor: LogitsProcessor
    start: int

    def __call__(self, context: Sequence[int], row: np.ndarray, drafted: Sequence[int] = ()) -> np.ndarray:
        """`row`, the logits after `context` and then `drafted`, adjusted for the answer so far."""
        return self.processor([*context[self.start :], *drafted], row)

    def rows(self, rows: np.ndarray, context: Sequence[int], drafts: Sequence[int]) -> ProcessedRows:
        """A verify batch's rows (after `context`, then `drafts`), each processed when first read."""
        so_far, drafted = list(context[self.start :]), list(drafts)  # as they are now, not as they grow
        return ProcessedRows(rows, lambda i, row: self.processor([*so_far, *drafted[:i]], row))


@dataclass(slots=True)
class ProcessedRows:
    """A verify batch's rows as the loop decides with them: row i processed for the answer so far
    plus drafts d1..d_i, computed once when first read (the loop's decisions and the logprobs of
    the same tokens read the same rows). Valid for the rows the loop reads: row i only once d1..d_i
    are accepted, so the drafts are then the answer's own tokens."""

    raw: np.ndarray
    process: Callable[[int, np.ndarray], np.ndarray]
    _done: dict[int, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, i: int) -> np.ndarray:
        row = self._done.get(i)
        if row is None:
            row = self._done[i] = self.process(i, self.raw[i])
        return row
