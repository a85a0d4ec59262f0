"""Draft sources. A drafter proposes up to k next tokens for the committed context, each with the
distribution q it was drawn from (needed for exact verification when sampling).

Drafters never decide what is emitted: the target verifies every proposal. So a bad drafter can only
make generation slower, never wrong.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .events import Source
from .model import Model, common_prefix_len, sync_cache
from .sampling import SamplingParams, probs, sample, top_prob


@dataclass(slots=True)
class Proposal:
    """Draft tokens and, when sampling, the distribution each was drawn from (None when greedy)."""

    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray] | None = None
    seconds: float = 0.0


class Drafter(Protocol):
    name: str
    source: Source

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        """Up to k tokens likely to follow `context` (the committed tokens, last one included)."""
        ...

    def prepare(self, context: Sequence[int]) -> None:
        """Process the prompt before decoding starts (so its cost counts as prefill)."""
        ...

    def settle(self, context: Sequence[int]) -> None:
        """Forget anything beyond `context` (called when generation stops)."""
        ...


def default_p_min(params: SamplingParams) -> float:
    """The draft confidence cut-off when the user gives none: 0.75 greedy (llama.cpp's usual setting),
    0.5 when sampling, where the draft's top probability is naturally lower."""
    return 0.75 if params.greedy else 0.5


class ModelDrafter:
    """A small GGUF model run autoregressively. Its KV cache persists between rounds: each round it
    only decodes the tokens committed since its last proposal (usually one or two)."""

    source = Source.DRAFT

    def __init__(self, model: Model, p_min: float) -> None:
        self.model = model
        self.name = model.name
        self.p_min = p_min

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        start = time.perf_counter()
        out = Proposal(q=None if params.greedy else [])
        room = self.model.n_ctx - len(context)
        k = min(k, room)
        if k <= 0:
            return out
        logits = sync_cache(self.model, context, logits_row_last=True)
        for i in range(k):
            assert logits is not None
            if params.greedy:
                tok, conf = top_prob(logits)
            else:
                q = probs(logits, params)
                tok = sample(q, rng)
                conf = float(q.max())
            if conf < self.p_min:
                break
            out.tokens.append(tok)
            if out.q is not None:
                out.q.append(q)
            if i == k - 1 or self.model.is_eog(tok):
                break
            logits = self.model.decode([tok], [0])[0]
        out.seconds = time.perf_counter() - start
        return out

    def prepare(self, context: Sequence[int]) -> None:
        sync_cache(self.model, context, logits_row_last=False)

    def settle(self, context: Sequence[int]) -> None:
        keep = common_prefix_len(self.model.tokens, context)
        if keep < len(self.model.tokens):
            self.model.truncate(keep)


class NgramDrafter:
    """Model-free drafting by prompt lookup: find the most recent earlier occurrence of the context's
    last n tokens (longest n first) and propose what followed it then.

    Free to run, and right surprisingly often wherever the answer copies its input: code edits,
    refactors, summaries, retrieval answers. An index from each n-gram to its latest end position is
    extended incrementally, so a lookup costs O(max_n) regardless of context length.

    Matches shorter than `min_n` propose nothing: after a single shared token the continuation is
    right too rarely to pay for the longer verify batch (on the benchmark suite a 1-token match was
    accepted 4-76% of the time, a 2-token match 17-84%). An empty proposal costs nothing: the round
    is then plain decoding.
    """

    source = Source.NGRAM

    def __init__(self, max_n: int = 4, min_n: int = 2, name: str = "ngram") -> None:
        self.name = name
        self.max_n = max_n
        self.min_n = min_n
        self._seen: list[int] = []
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]

    def _sync(self, context: Sequence[int]) -> None:
        """Index every n-gram that ends before the context's last token."""
        if common_prefix_len(self._seen, context) < len(self._seen):  # context changed: re-index
            self._seen = []
            self._index = [{} for _ in range(self.max_n + 1)]
        for pos in range(len(self._seen), len(context) - 1):
            self._seen.append(int(context[pos]))
            for n in range(1, self.max_n + 1):
                if pos + 1 >= n:
                    self._index[n][tuple(self._seen[pos + 1 - n : pos + 1])] = pos + 1

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        start = time.perf_counter()
        self._sync(context)
        out = Proposal()
        for n in range(min(self.max_n, len(context) - 1), self.min_n - 1, -1):
            end = self._index[n].get(tuple(context[len(context) - n :]))
            if end is not None:
                out.tokens = [int(t) for t in context[end : end + k]]
                break
        out.seconds = time.perf_counter() - start
        return out

    def prepare(self, context: Sequence[int]) -> None:
        self._sync(context)

    def settle(self, context: Sequence[int]) -> None:
        return None
