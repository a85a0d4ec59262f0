"""Block drafters: a drafter that proposes a whole block of tokens in one pass (DFlash, llama/dflash.py)
rather than one pass per token.

Each position of a block has its own distribution, computed together from the committed context
alone, so position i's token is drawn from its row without looking at the tokens drawn before it:
that is still a distribution that depends only on what precedes the draft, so the verifier's
rejection sampling stays exact when the rows are handed over as q. The drafter reads where to stop
from each row's top probability (its confidence), as a draft model does, but pays nothing per
position: the whole block costs one pass, which the planner prices once per round, and each token
only the verify row it would take. That pass computes a row per position (its output layer's above
all), so a deeper block costs the drafter more: as the target's batch of those rows does, scaled to
the drafter's weights (AutoPlanner's pass_scale).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

import numpy as np

from .drafters import Alternative, DraftBudget, Proposal, pick_side, second_choice
from .events import Source
from .model import Model, common_prefix_len
from .processors import AnswerProcessor
from .sampling import SamplingParams, probs, sample, top_prob


class BlockModel(Protocol):
    """What a block drafter runs: one pass gives the logits of the next n tokens."""

    name: str
    #: the most tokens one block proposes
    max_drafts: int

    @property
    def n_ctx(self) -> int: ...

    @property
    def injected(self) -> Sequence[int]:
        """The committed text its cache holds (the context less its last token, once synced)."""
        ...

    def sync(self, context: Sequence[int]) -> None:
        """Bring its cache up to `context` (all but the last token)."""
        ...

    def block(self, context: Sequence[int], n: int) -> np.ndarray:
        """Logits (n, n_vocab) of the n tokens after `context`, in one pass."""
        ...

    #: DFlash2's path selector: candidates per position (0: the drafts are read from the logits)
    selector_top_k: int

    @property
    def lattice(self) -> np.ndarray | None:
        """DFlash2: the last block's selector rows, one per position: its `selector_top_k` candidate
        token ids, then the scores of every transition (candidate before x candidate here)."""
        ...

    @property
    def confidence(self) -> np.ndarray | None:
        """The last block's per-position estimates of acceptance from a confidence head (DSpark's),
        or None where the drafter has none."""
        ...

    def truncate(self, n: int) -> None:
        """Keep what it holds of the first n tokens."""
        ...

    def is_eog(self, token: int) -> bool: ...


class BlockDrafter:
    """Drafts with a block model: one pass, then each position's token read from its row (argmax
    when greedy, drawn from the row's distribution when sampling) until k tokens, a token below
    `p_min`, the chance that every token so far is accepted below the budget's floor, or an
    end-of-generation token. A token's confidence is its row's top probability, or the model's
    confidence head's estimate where it has one (DSpark)."""

    source = Source.MTP
    #: trained on the target's own features, like a head
    prior = (4.0, 2.0)
    route_priors: Mapping[str, tuple[float, float]] = MappingProxyType({})
    #: no model to price per token (model None): a block costs one pass, which the planner prices on
    #: every round it drafts (per_pass) by the rows it computes (pass_share), learned from the rounds
    model: Model | None = None
    per_pass = True

    def __init__(self, block: BlockModel, p_min: float, tree_width: int = 0, pass_share: float = 0.0) -> None:
        self._block = block
        self.name = block.name
        self.p_min: float | None = p_min
        #: side nodes of a round's token tree at most: positions' runners-up in their own rows
        self.tree_width = tree_width
        #: the block's pass over the target's batch of as many rows, before one is measured
        #: (models/heads.py block_pass_share; 0: priced as free until measured)
        self.pass_share = pass_share

    def route(self, context: Sequence[int]) -> str | None:
        return "block" if 0 < len(context) < self._block.n_ctx else None

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        budget: DraftBudget | None = None,
        processor: AnswerProcessor | None = None,
    ) -> Proposal:
        start = time.perf_counter()
        out = Proposal(q=None if params.greedy else [])
        k = min(k, self._block.max_drafts, self._block.n_ctx - len(context))
        if k <= 0:
            return out
        # catching up (the target's features for what was committed since the last block) is timed
        # apart: the planner prices the block's pass, and a first block after a long prompt or idle
        # rounds would otherwise teach it a pass many times dearer than it is
        self._block.sync(context)
        out.catch_up_seconds = time.perf_counter() - start
        rows = self._block.block(context, k)
        out.decodes = k + 1  # the rows the pass computed (the anchor's and k guesses), as priced
        if self._block.selector_top_k:
            return self._walk(k, budget, start, out.catch_up_seconds)
        head = self._block.confidence
        reach = 1.0
        p_min = self.p_min or 0.0
        alternatives: list[Alternative] = []
        for i, row in enumerate(rows):
            logits = processor(context, row, out.tokens) if processor is not None else row
            if params.greedy:
                tok, peak = top_prob(logits)
            else:
                q = probs(logits, params)
                tok = sample(q, rng)
                peak = float(q.max())
            # a confidence head is trained to predict acceptance: a better stopping rule than the peak
            conf = float(head[i]) if head is not None else peak
            before = reach
            chance = budget.accept_chance(conf, i) if budget is not None else conf
            if budget is not None:
                reach *= chance
            if conf < p_min or (budget is not None and reach < budget.floor_at(i)):
                break
            if self.tree_width > 0:  # the row's runner-up: a side node after the same tokens[:i]
                alt = second_choice(logits, tok, peak, i, before, chance, None if params.greedy else q, rng)
                if alt is not None:
                    alternatives.append(alt)
            out.tokens.append(tok)
            out.confidence.append(conf)
            if out.q is not None:
                out.q.append(q)
            if self._block.is_eog(tok):
                break
        if alternatives:
            pick_side(out, alternatives, self.tree_width, budget)
        out.seconds = time.perf_counter() - start
        return out

    def _walk(self, k: int, budget: DraftBudget | None, start: float, catch_up: float) -> Proposal:
        """DFlash2's draft: the selector's path through the block (walk_lattice), cut as any block is.
        The path's tokens come with no distribution (q None whether greedy or sampling): the verifier
        treats them as a lookup's, which keeps sampling exact."""
        out = Proposal(q=None, catch_up_seconds=catch_up, decodes=k + 1)
        lattice = self._block.lattice
        if lattice is None:
            return out
        reach = 1.0
        p_min = self.p_min or 0.0
        tokens, confidence = walk_lattice(lattice[:k], self._block.selector_top_k)
        for i, (tok, conf) in enumerate(zip(tokens, confidence, strict=True)):
            if budget is not None:
                reach *= budget.accept_chance(conf, i)
            if conf < p_min or (budget is not None and reach < budget.floor_at(i)):
                break
            out.tokens.append(tok)
            out.confidence.append(conf)
            if self._block.is_eog(tok):
                break
        out.seconds = time.perf_counter() - start
        return out

    def lag(self, context: Sequence[int]) -> int:
        return 0

    def prepare(self, context: Sequence[int]) -> None:
        self._block.sync(context)

    def settle(self, context: Sequence[int]) -> None:
        self._block.truncate(common_prefix_len(self._block.injected, context))

    def reset(self) -> None:
        self._block.truncate(0)


def walk_lattice(rows: np.ndarray, top_k: int) -> tuple[list[int], list[float]]:
    """DFlash2's path, as llama.cpp's `draft-dflash` walks it: row i holds position i's `top_k`
    candidates (token ids) and then, per candidate chosen at the position before (the anchor, for the
    first position: its scores are those of candidate 0), the scores of this position's candidates.
    Each position takes its best-scoring candidate after the one chosen before it; its confidence is
    the softmax of those scores at it."""
    tokens: list[int] = []
    confidence: list[float] = []
    before = 0
    for row in rows:
        scores = row[top_k + before * top_k : top_k + (before + 1) * top_k].astype(np.float64)
        before = int(np.argmax(scores))
        tokens.append(int(row[before]))
        confidence.append(float(1.0 / np.exp(scores - scores[before]).sum()))
    return tokens, confidence
