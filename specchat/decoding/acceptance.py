"""What the planner knows of each drafter's acceptance: decayed Beta counts per draft depth and route
(Acceptance), and per bin of draft confidence and class of draft position (ConfidenceCurve,
ConfidenceByDepth: what DraftBudget.chance reads).

Apart from the planner because it is statistics, not planning: how evidence is counted, forgotten and
read (a damped Thompson draw on the log-odds), tested on its own."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DECAY = 0.97  # per observed round: ~33 rounds of memory
#: exploration: how many posterior standard deviations one unit of the round's normal draw moves
#: every depth's acceptance (_Acceptance.rates); 1.0 would be Thompson sampling's own spread
EXPLORE_SPREAD = 0.5
#: decayed observations below which a draft depth borrows the rate of the depth before it
THIN_EVIDENCE = 1.0
#: DraftBudget.chance: bins of draft confidence, the strength of each bin's prior (at its centre),
#: and its decay per judged token (~50 tokens of memory per bin)
CONFIDENCE_BINS = 10
CONFIDENCE_PRIOR = 2.0
CONFIDENCE_DECAY = 0.98
#: draft positions with a confidence curve of their own (ConfidenceByDepth): the first, then the rest
CONFIDENCE_DEPTHS = 2


@dataclass(slots=True)
class Acceptance:
    """Decayed Beta counts of conditional acceptance per draft position.

    Each depth starts from the prior as pseudo-counts, which are forgotten like evidence: every round
    that reaches a depth decays its counts by DECAY before adding its own outcome, so after ~33
    rounds the estimate is the recent acceptance itself. (A prior kept at full weight forever pulls
    every estimate towards its mean: with the draft model's Beta(3, 2) a draft right 98% of the time
    would be rated 0.93 at each depth, 0.56 for eight in a row instead of 0.85, and auto would draft
    far shallower than pays on a big target.) Depths a round does not reach keep what they knew."""

    prior_a: float
    prior_b: float
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    #: decayed number of rounds that reached each depth (the prior not counted)
    seen: list[float] = field(default_factory=list)

    def observe(self, drafted: int, accepted: int) -> None:
        while len(self.a) < drafted:
            self.a.append(self.prior_a)
            self.b.append(self.prior_b)
            self.seen.append(0.0)
        for i in range(drafted):
            self.a[i] *= DECAY
            self.b[i] *= DECAY
            self.seen[i] = self.seen[i] * DECAY + 1.0
        for i in range(accepted):
            self.a[i] += 1.0
        if accepted < drafted:
            self.b[accepted] += 1.0

    def rates(self, k: int, rng: np.random.Generator | None) -> list[float]:
        """Conditional acceptance at draft positions 0..k-1 (drawn from the posteriors with `rng`).

        A depth never reached borrows the counts of the deepest one that was; from position 2 on, a
        depth with almost no evidence of its own (under one decayed observation) takes at least the
        rate of the depth before it: a copy that survived that far is no likelier to stop now
        (n-gram drafts are accepted more often the deeper they are), and without this one early
        rejection at depth 2 would cap every later draft at 2 tokens, the planner never drafting
        deep enough to learn otherwise.

        Exploring, every depth is read at one shared quantile of its posterior (one normal draw
        per round, EXPLORE_SPREAD of a standard deviation per unit), not drawn independently: with
        independent draws and the rule above, the rate at depth i was the largest of ~i draws, so
        a route with little evidence looked near-certain 15 tokens deep and was tried there: a
        16-row batch, which costs several tokens' time on a CPU, for one or two tokens.

        The draw moves the log-odds, not the rate: read linearly and clipped at 1.0, one draw in
        twenty made a route with the 0.9 prior of an 8-token match certain at every depth, and the
        planner would verify 48 drafts at once even where each row of a batch costs most of a
        token (a steep curve such as Apple Silicon's)."""
        out = []
        z = EXPLORE_SPREAD * float(rng.standard_normal()) if rng is not None else 0.0
        for i in range(k):
            j = min(i, len(self.a) - 1)
            a = self.a[j] if j >= 0 else self.prior_a
            b = self.b[j] if j >= 0 else self.prior_b
            mean = a / (a + b)
            r = mean
            if z != 0.0 and 0.0 < mean < 1.0:
                # on the log-odds scale: the same spread near an even chance, but a draw never
                # reads a route as certain (one clipped at 1.0 made every depth look free)
                sd = 1.0 / math.sqrt(mean * (1.0 - mean) * (a + b + 1.0))
                r = 1.0 / (1.0 + math.exp(-(math.log(mean / (1.0 - mean)) + z * sd)))
            seen = self.seen[i] if i < len(self.seen) else 0.0
            if i >= 2 and seen < THIN_EVIDENCE:
                r = max(r, out[-1])
            out.append(r)
        return out


@dataclass(slots=True)
class ConfidenceCurve:
    """Decayed Beta counts of acceptance per bin of draft confidence (DraftBudget.chance).

    Each bin starts from a weak prior at its own centre (the confidence taken at its word) and
    forgets it as tokens of that confidence are judged, as _Acceptance does per depth."""

    bins: int = CONFIDENCE_BINS
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    #: no bin starts below this: the drafter's prior acceptance
    start: float = 0.0

    def __post_init__(self) -> None:
        if not self.a:
            mids = [max(self.start, (i + 0.5) / self.bins) for i in range(self.bins)]
            self.a = [CONFIDENCE_PRIOR * m for m in mids]
            self.b = [CONFIDENCE_PRIOR * (1.0 - m) for m in mids]

    def observe_one(self, confidence: float, passed: bool) -> None:
        """One judged draft token (ConfidenceByDepth.observe says which curve it belongs to)."""
        i = min(self.bins - 1, int(confidence * self.bins))
        self.a[i] = self.a[i] * CONFIDENCE_DECAY + passed
        self.b[i] = self.b[i] * CONFIDENCE_DECAY + (not passed)

    def chances(self, rng: np.random.Generator | None = None) -> tuple[float, ...]:
        """The acceptance of a token drafted at each bin's confidence: the posterior means, or with
        `rng` each bin's mean or one draw from its posterior, whichever is higher (an optimistic
        Thompson draw).

        Why draw: a bin is learned only from tokens that were drafted, and a token is drafted only
        where its bin's chance clears the draft budget's floor. Read at their means, bins whose prior
        (the confidence taken at its word) sits below the floor were never tried, so a drafter that
        is right far more often than its confidence says when unsure stayed unsure for good: an MTP
        head whose first tokens at a confidence of 0.1-0.4 were accepted over half the time drafted
        in 20 of 64 rounds. A draw tries such a bin now and then, at the price of one verify row
        when it is wrong. Never below the mean, though: a draw under it stopped drafts a bin had
        earned (a Gemma 4 assistant right two times in three at depth 3 drafted that deep in half
        the rounds a fixed -k 3 did, 45 verify passes for 128 tokens where 38 did). Only proposing
        reads a draw; a draft decode is decided at the means (DraftBudget.sure)."""
        means = tuple(a / (a + b) for a, b in zip(self.a, self.b, strict=True))
        if rng is None:
            return means
        draws = (float(rng.beta(max(a, 1e-3), max(b, 1e-3))) for a, b in zip(self.a, self.b, strict=True))
        return tuple(max(m, d) for m, d in zip(means, draws, strict=True))


@dataclass(slots=True)
class ConfidenceByDepth:
    """A drafter's confidence curves: one for the first draft position, one for every later one.

    Why apart: the first token of a round is drafted from the verified context (a head reads the
    target's own hidden state there), every later one from the drafter's own guesses, and the same
    confidence means different things in the two (an unsure first token of Gemma 4's assistant is
    usually right, an unsure later one about as often wrong); pooled in one bin, the planner would
    stop after first tokens that were worth drafting on from. Each curve holds tokens whose
    predecessors in the draft were all accepted, so a draft's chances multiply."""

    start: float = 0.0
    curves: list[ConfidenceCurve] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.curves:
            self.curves = [ConfidenceCurve(start=self.start) for _ in range(CONFIDENCE_DEPTHS)]

    def observe(self, confidence: Sequence[float], accepted: int) -> None:
        """`confidence`: the judged draft tokens' confidences in order; the first `accepted` passed."""
        last = len(self.curves) - 1
        for j, conf in enumerate(confidence):
            self.curves[min(j, last)].observe_one(conf, j < accepted)

    def chances(self, rng: np.random.Generator | None = None) -> tuple[tuple[float, ...], ...]:
        """Per draft position class, ConfidenceCurve.chances."""
        return tuple(c.chances(rng) for c in self.curves)
