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
