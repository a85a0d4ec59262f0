"""Draft sources. A drafter proposes up to k next tokens for the committed context, each with the
distribution q it was drawn from (needed for exact verification when sampling).

Drafters never decide what is emitted: the target verifies every proposal. So a bad drafter can only
make generation slower, never wrong.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

import numpy as np

from .events import Source
from .model import Model, common_prefix_len, sync_cache
from .processors import AnswerProcessor
from .sampling import SamplingParams, probs, sample, top_prob


@dataclass(slots=True)
class Proposal:
    """Draft tokens and, when sampling, the distribution each was drawn from (None when greedy)."""

    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray] | None = None
    seconds: float = 0.0
    #: part of `seconds` spent catching the drafter's cache up with the context (see Drafter.lag)
    catch_up_seconds: float = 0.0
    #: the drafter's confidence in each token (its top probability), where it has one
    confidence: list[float] = field(default_factory=list)
    #: one-token draft decodes after the catch-up (which gave the first token's distribution): what
    #: a draft model's cost per token is learned from (a round of one token has none); a block
    #: drafter's: the rows its pass computed
    decodes: int = 0
    #: a token tree's side nodes (decoding/tree.py), as (position, token): an alternative to
    #: `tokens[position]`, after the same tokens[:position]. Empty: a chain
    side: list[tuple[int, int]] = field(default_factory=list)
    #: per side node, the earlier side node it continues (its index in `side`; its position is then
    #: the parent's plus one), or -1 for a sibling of a chain token. Empty: every one a sibling
    side_parent: list[int] = field(default_factory=list)
    #: when sampling, the distribution each side token was drawn from (its position's q)
    side_q: list[np.ndarray] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DraftBudget:
    """How far a drafter that knows its confidence should draft this round (Planner.draft_budget).

    Two decisions per position, priced separately because they cost different things. Whether to
    *propose* a token whose distribution is already computed: its only cost left is its row of the
    verify batch, so it goes in while the chance that the whole draft so far is accepted is at least
    `floor_at(i)`. Whether to *compute* the next position at all: that costs a draft decode as well,
    so the drafter looks ahead only while the chance so far times what a token there is usually
    accepted at (`expect_at`) reaches `ahead_at`. (Priced together, a drafter would decode one
    position too many every round: the one whose token it then declines.)

    `chance[d][i]` is the measured acceptance of tokens drafted at position d (the last entry: every
    later position) with a confidence in the i-th of len(chance[d]) equal bins: a draft model's top
    probability is a ranking, not a probability (a 0.5B draft of its own family is right far more
    often than it says when unsure), so the planner learns the map from what the verifier accepted.
    Empty: take the confidence at its word.

    `chance` may be read optimistically (a bin is learned only from tokens that were proposed, so
    an unsure bin has to be tried now and then: ConfidenceCurve.chances); a try costs a verify row.
    A draft decode is dearer, and the decision to make one reads `sure`, the bins' posterior means:
    read optimistically there too, a drafter whose step is dear (a NextN head's is a good part of a
    target pass) would run on through unsure tokens, paying a decode for each."""

    #: the propose threshold at positions past `floors`
    floor: float = 0.0
    #: per draft position (the last entry for every position past it), per confidence bin
    chance: tuple[tuple[float, ...], ...] = ()
    #: the same at the bins' posterior means (empty: `chance`)
    sure: tuple[tuple[float, ...], ...] = ()
    #: per draft position: propose while the chance the draft so far is accepted is at least this
    #: (what its verify row is worth at the round's planned speed)
    floors: tuple[float, ...] = ()
    #: per draft position: compute it (a draft decode) while the chance so far times `expect` is at
    #: least this (its decode and its row); past the end: the propose floor
    ahead: tuple[float, ...] = ()
    #: per draft position: the acceptance a token drafted there usually has (the planner's per-depth
    #: estimate); past the end: 1, so the propose floor alone decides
    expect: tuple[float, ...] = ()
    #: a lookup's learned chance that, where the target turns its copy down beside a branch, a
    #: branch holds the target's token (decoding/lookup_tree.py)
    branch: float = 0.5

    def floor_at(self, i: int) -> float:
        return self.floors[i] if i < len(self.floors) else self.floor

    def ahead_at(self, i: int) -> float:
        return self.ahead[i] if i < len(self.ahead) else self.floor_at(i)

    def expect_at(self, i: int) -> float:
        return self.expect[i] if i < len(self.expect) else 1.0

    def looks_ahead(self, reach: float, i: int) -> bool:
        """Whether position i is worth a draft decode after a draft accepted with chance `reach`."""
        return reach * self.expect_at(i) >= self.ahead_at(i)

    def accept_chance(self, confidence: float, i: int) -> float:
        """The chance a token drafted at position i with this confidence is accepted (its
        predecessors accepted), as proposing reads it."""
        return _binned(self.chance, confidence, i)

    def sure_chance(self, confidence: float, i: int) -> float:
        """The same chance at the bins' means, as deciding a draft decode reads it."""
        return _binned(self.sure or self.chance, confidence, i)


def _binned(chances: tuple[tuple[float, ...], ...], confidence: float, i: int) -> float:
    if not chances:
        return confidence
    bins = chances[min(i, len(chances) - 1)]
    return bins[min(len(bins) - 1, int(confidence * len(bins)))]


class Drafter(Protocol):
    """What the loop and the planner need of a draft source, declared by the drafter itself (the
    planner never asks what class it is): a new drafter is one module implementing this plus one
    entry in decoding/registry.py (model-free) or a model reference (ModelDrafter)."""

    name: str
    source: Source
    #: the model it runs, or None for a model-free drafter. A model's per-token cost is calibrated
    #: and learned, it must catch up on tokens committed while it was idle (lag), and its cache is
    #: what the server's prompt cache saves; a model-free drafter's proposals are free to the planner
    model: Model | None
    #: its draft costs one pass per round (a block drafter): the planner prices that pass on every
    #: round it drafts, by the rows it computes and learned from its rounds, not per drafted token
    per_pass: bool
    #: a per_pass drafter's pass of n rows over the target's batch of n rows, before any is measured
    #: (its weights per row over the target's); 0 for the others
    pass_share: float
    #: Beta(a, b) prior of a drafted token's acceptance before any evidence on its routes
    prior: tuple[float, float]
    #: per-route priors (route() names) that override `prior` where they are known
    route_priors: Mapping[str, tuple[float, float]]
    #: confidence cut-off for drafting (follow_temperature sets it); None: the drafter has none
    p_min: float | None

    def route(self, context: Sequence[int]) -> str | None:
        """The kind of context this round is in, for the planner's per-context acceptance statistics
        (a drafter's hit rate can differ by an order of magnitude between contexts, e.g. an n-gram
        match of 2 tokens vs 16); None when the drafter has nothing to propose here, so the round
        can go to another drafter or be plain decoding."""
        ...

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
        """Up to k tokens likely to follow `context` (the committed tokens, last one included).
        A drafter that knows how sure it is stops once the chance that all its tokens so far are
        right falls below the `budget`'s floor (the planner's price of one more token).

        `processor`: the answer's logits processors (penalties, logit bias: processors.py), or None.
        A drafter that draws from logits applies it to each row before drawing,
        `processor(context, row, drafted_so_far)`, so its drafts follow the adjusted target and its
        q is what it drew from; a lookup has no logits and ignores it."""
        ...

    def lag(self, context: Sequence[int]) -> int:
        """Context tokens this drafter must process before it can propose. A draft model left idle
        while other drafters worked must catch up on every token committed since (dozens after a
        long copy): the planner counts that cost before choosing it. 0 for model-free drafters."""
        ...

    def prepare(self, context: Sequence[int]) -> None:
        """Process the prompt before decoding starts (so its cost counts as prefill)."""
        ...

    def settle(self, context: Sequence[int]) -> None:
        """The answer ended with `context` committed (however it ended: its end, a stop string, a
        hang-up): forget anything beyond it. The end-of-answer hook; called once per answer."""
        ...

    def reset(self) -> None:
        """Forget everything learned from earlier text (the bench calls it between measurements,
        so no measurement reuses what another one left behind)."""
        ...


def default_p_min(params: SamplingParams, *, auto: bool = False) -> float:
    """The draft confidence cut-off when the user gives none: 0.75 greedy (llama.cpp's usual setting),
    0.5 when sampling, where the draft's top probability is naturally lower. None under `-k auto`:
    there the planner's budget (Planner.draft_budget) prices each further token from the measured
    costs, which a fixed cut-off cannot (on a big target with a cheap draft, a 0.75 cut-off stops
    drafts well short of the depth that pays)."""
    if auto:
        return 0.0
    return 0.75 if params.greedy else 0.5


class ModelDrafter:
    """A small GGUF model run autoregressively. Its KV cache persists between rounds: each round it
    only decodes the tokens committed since its last proposal (usually one or two)."""

    source = Source.DRAFT
    per_pass = False  # one decode per drafted token: priced per token
    pass_share = 0.0
    #: a draft of the target's own family agrees with it more often than not from the start
    prior = (3.0, 2.0)
    route_priors: Mapping[str, tuple[float, float]] = MappingProxyType({})

    def __init__(self, model: Model, p_min: float, tree_width: int = 0) -> None:
        self._model = model
        self.name = model.name
        self.p_min: float | None = p_min
        #: side nodes a round's tree may have at most (Proposal.side; 0: chains only)
        self.tree_width = tree_width

    @property
    def model(self) -> Model:
        return self._model

    def route(self, context: Sequence[int]) -> str | None:
        """One route: a model drafts anywhere, and its confidence stop already adapts per token."""
        return "model" if len(context) < self._model.n_ctx else None

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
        """Draft greedily (or by sampling) until k tokens, a token below `p_min`, the chance that every
        token so far is accepted (the budget's calibrated confidences, multiplied) below the budget's
        floor, or a next position not worth its draft decode (DraftBudget). Each row is adjusted by
        `processor` first, as the target's will be."""
        start = time.perf_counter()
        out = Proposal(q=None if params.greedy else [])
        room = self._model.n_ctx - len(context)
        k = min(k, room)
        if k <= 0:
            return out
        logits = sync_cache(self._model, context, logits_row_last=True)
        # the drafts are decoded one at a time and most are taken back after the verify: a recurrent
        # draft model keeps its state here, so going back is a copy, not a re-decode
        self._model.checkpoint()
        out.catch_up_seconds = time.perf_counter() - start
        reach = sure = 1.0  # the chance the draft so far is accepted, read to propose / to look ahead
        alternatives: list[Alternative] = []
        for i in range(k):
            assert logits is not None
            if processor is not None:
                logits = processor(context, logits, out.tokens)
            if params.greedy:
                tok, conf = top_prob(logits)
            else:
                q = probs(logits, params)
                tok = sample(q, rng)
                conf = float(q.max())
            before = reach
            chance = budget.accept_chance(conf, i) if budget is not None else conf
            if budget is not None:
                reach *= chance
                sure *= budget.sure_chance(conf, i)
            if conf < self.p_min:
                break
            if budget is not None and reach < budget.floor_at(i):
                break  # not worth even its verify row
            if self.tree_width > 0:
                alt = second_choice(logits, tok, conf, i, before, chance, None if params.greedy else q, rng)
                if alt is not None:
                    alternatives.append(alt)
            out.tokens.append(tok)
            out.confidence.append(conf)
            if out.q is not None:
                out.q.append(q)
            if i == k - 1 or self._model.is_eog(tok):
                break
            if budget is not None and not budget.looks_ahead(sure, i + 1):
                break  # the next position is not worth a draft decode
            logits = self._model.decode([tok], [0])[0]
            out.decodes += 1
        if alternatives:
            pick_side(out, alternatives, self.tree_width, budget)
        out.seconds = time.perf_counter() - start
        return out

    def lag(self, context: Sequence[int]) -> int:
        return len(context) - common_prefix_len(self._model.tokens, context)

    def prepare(self, context: Sequence[int]) -> None:
        sync_cache(self._model, context, logits_row_last=False)

    def settle(self, context: Sequence[int]) -> None:
        keep = common_prefix_len(self._model.tokens, context)
        if keep < len(self._model.tokens):
            self._model.truncate(keep)

    def reset(self) -> None:
        self._model.truncate(0)


@dataclass(frozen=True, slots=True)
class Alternative:
    """A draft position's second candidate, a possible side node of a token tree (decoding/tree.py):
    `value` is the chance it is the accepted token there (the draft so far accepted, its own token
    rejected, and this one the target's), which is what its verify row buys."""

    position: int
    token: int
    value: float
    q: np.ndarray | None = None


def second_choice(
    logits: np.ndarray,
    first: int,
    conf: float,
    position: int,
    reach: float,
    chance: float,
    q: np.ndarray | None,
    rng: np.random.Generator,
) -> Alternative | None:
    """The runner-up after `first` (drawn with confidence `conf`) at a draft position reached with
    chance `reach`, where `first` is accepted with `chance`. Greedy: the second-best logit. Sampling:
    a draw from q without `first` (what multi-candidate rejection sampling expects of a sibling).
    Its chance of being the target's token when `first` is not: its share of the draft's remaining
    mass (greedy, from `conf` = 1/Z: no second pass over the vocabulary's exponentials)."""
    if q is not None:
        rest = q.copy()
        rest[first] = 0.0
        mass = float(rest.sum())
        if mass <= 0.0:
            return None
        token = sample(rest / mass, rng)
        share = float(rest[token]) / mass
        return Alternative(position, token, reach * (1.0 - chance) * share, q)
    if len(logits) < 2 or conf >= 1.0:
        return None
    pair = np.argpartition(logits, len(logits) - 2)[-2:]
    token = int(max((int(t) for t in pair if t != first), key=lambda t: float(logits[t])))
    gap = float(logits[token]) - float(logits[first])
    if not np.isfinite(gap):
        return None
    # softmax shares: the runner-up's exp(gap)/Z of the 1 - 1/Z left after `first`
    share = min(1.0, float(np.exp(gap)) * conf / (1.0 - conf))
    return Alternative(position, token, reach * (1.0 - chance) * share)


def pick_side(
    out: Proposal, alternatives: Sequence[Alternative], width: int, budget: DraftBudget | None
) -> None:
    """Add the most valuable alternatives to `out` as side nodes, at most `width`, each only while
    its chance of being the accepted token is worth its verify row (the budget's floor for the row
    it would take: past the chain, so the rows of a deeper batch); without a budget, the `width`
    least sure positions."""
    ranked = sorted((a for a in alternatives if a.position < len(out.tokens)), key=lambda a: -a.value)
    chosen: list[Alternative] = []
    for alt in ranked[:width]:
        if budget is not None and alt.value < budget.floor_at(len(out.tokens) + len(chosen)):
            break
        chosen.append(alt)
    for alt in sorted(chosen, key=lambda a: a.position):
        out.side.append((alt.position, alt.token))
        if alt.q is not None:
            out.side_q.append(alt.q)


class HeadDrafter(ModelDrafter):
    """A drafter that reads the target's hidden states: its multi-token-prediction (NextN) head, Gemma
    4's assistant, or an EAGLE-3 head. It runs step by step like a draft model (llama/mtp.py and
    llama/eagle3.py give it the Model protocol) and is priced the same way, but its tokens are shown
    as the model's own (Source.MTP): trained with the target on its hidden states, it is right more
    often than a separate small model of the family."""

    source = Source.MTP
    prior = (4.0, 2.0)
