"""A round's verdict: the drafts walked against the target's rows of one verify batch.

Greedy, a draft passes where it is the row's argmax; sampling, by the min(1, p/q) rule against the
distribution q it was drawn from, which keeps the output distributed as the target's own. The first
rejection is replaced by the target's token (a correction); if every draft passes, the last row gives
one more (a bonus). A row whose top-2 gap is within the tie margin decides nothing (loop.Settings).
"""

from __future__ import annotations

import numpy as np

from .constraint import Walk
from .drafters import Proposal
from .processors import ProcessedRows
from .sampling import SamplingParams, align, greedy, greedy_gap, probs, sample, verify


def judge(
    rows: np.ndarray | ProcessedRows,
    proposal: Proposal,
    params: SamplingParams,
    rng: np.random.Generator,
    n_vocab: int,
    margin: float = 0.0,
    gaps: list[float] | None = None,
    walk: Walk | None = None,
) -> tuple[list[int], int, int]:
    """Walk the drafts against the target rows: row i decides the token after d1..d_i.

    Returns (tokens to commit, drafts kept, drafts judged). With a greedy `margin`, a row whose top-2
    gap is below it decides nothing: the walk stops before it, committing only the drafts accepted so
    far (possibly nothing), and the caller re-evaluates that position one token alone. When `gaps`
    is given (greedy), the top-2 gap of every row walked is appended to it, computed once. With a
    `walk`, each row is decided under the constraint as left by the tokens decided before it, and
    each decided token advances it (decoding/constraint.py).
    """
    out: list[int] = []
    measure = gaps is not None or margin > 0.0
    if walk is not None:
        walk.start_round()

    def pick(row: np.ndarray) -> tuple[int, float]:
        if walk is not None:
            return walk.greedy(row, margin, measure)
        return greedy_gap(row) if measure else (greedy(row), float("inf"))

    def decide(token: int) -> None:
        out.append(token)
        if walk is not None:
            walk.decided(token)

    for i, tok in enumerate(proposal.tokens):
        if params.greedy:
            best, gap = pick(rows[i])
            if gaps is not None:
                gaps.append(gap)
            if gap < margin:
                return out, i, i
            decide(best)
            if best != tok:
                return out, i, i + 1
            continue
        p = walk.probs(rows[i], params) if walk is not None else probs(rows[i], params)
        if proposal.q is not None:
            q = align(proposal.q[i], n_vocab)
        else:  # a deterministic drafter (n-gram): q is one-hot at its token
            q = np.zeros(n_vocab)
            if tok < n_vocab:
                q[tok] = 1.0
        ok, tok2 = verify(p, q, tok, rng)
        decide(tok2)
        if not ok:
            return out, i, i + 1
    n = len(proposal.tokens)
    last = rows[n]
    if params.greedy:
        best, gap = pick(last)
        if gaps is not None:
            gaps.append(gap)
        if gap < margin:
            return out, n, n
        decide(best)
    else:
        decide(sample(walk.probs(last, params) if walk is not None else probs(last, params), rng))
    return out, n, n
