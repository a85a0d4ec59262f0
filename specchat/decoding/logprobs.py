"""Log-probabilities of committed tokens, from the target row that decided each one. Numpy only.

Every token the speculative loop commits was decided by one target logits row (an accepted draft's
verify row, a correction's, the bonus row, or a plain decoding row), so the target's log-probabilities
for it and its best alternatives cost one pass over a row that is already computed; the draft's rows
are never used. Which distribution is reported:

* temperature 0: the model's own distribution, log_softmax(logits) (greedy decoding picks its top, so
  the chosen token is always first in `top`);
* temperature > 0: the distribution the token was sampled from, after temperature, top-k and top-p
  (`sampling.support`, the same code that samples), as OpenAI reports. Tokens those filters removed
  have probability 0 and are not listed, so `top` may be shorter than asked.
* under a constraint (a grammar: decoding/constraint.py) the same, of the constrained distribution:
  the loop passes the masked rows (forbidden tokens at -inf), which are never listed.

The loop computes these only when asked (`loop.Settings.logprobs`): a few passes over the
row (maximum, normaliser, candidates), right after the decode that wrote the row, while it is still
in cache: a small part of a token's time (docs/performance.md, "What logprobs cost").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .sampling import SamplingParams, support

#: The most alternatives a caller may ask for (OpenAI's limit for `top_logprobs`).
MAX_TOP = 20


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A committed token's log-probability and the `len(top)` likeliest tokens at its position,
    as (token id, log-probability), likeliest first (ties: lower id first)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(row: np.ndarray, token: int, params: SamplingParams, n_top: int) -> TokenLogprob:
    """`token`'s log-probability under the target row that decided it, with the `n_top` best."""
    if not 0 <= n_top <= MAX_TOP:
        raise ValueError(f"n_top must be in 0..{MAX_TOP} (got {n_top})")
    if params.greedy:
        return _raw(row, token, n_top)
    return _sampled(row, token, params, n_top)


def _raw(row: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """log_softmax(row) at `token` and its n_top largest entries."""
    m = float(row.max())
    lse = m + math.log(float(np.exp(row - m, dtype=np.float32).sum(dtype=np.float64)))
    chosen = float(row[token]) - lse
    if n_top == 0:
        return TokenLogprob(chosen)
    idx = _top_ids(row, m, min(n_top, row.shape[0]))
    vals = row[idx]
    order = np.lexsort((idx, -vals))  # best first; equal logits: the lower id, as greedy picks
    return TokenLogprob(chosen, tuple((int(idx[j]), float(vals[j]) - lse) for j in order))


def _top_ids(row: np.ndarray, m: float, need: int) -> np.ndarray:
    """Ids of the `need` largest logits (`m` the largest), of equal ones the lowest.

    First every logit within some distance of the maximum: one comparison pass, cheaper than
    np.argpartition over a 152k vocabulary, and a model's logits are peaked, so one or two passes
    find enough. Only when many are that close (near-flat rows) is the kth value found by partition.
    """
    width = 4.0
    while True:
        idx = np.flatnonzero(row >= m - width)  # ascending ids
        if idx.size >= need:
            break
        if width > 1e30:  # every finite logit is in; the rest are -inf (tokens a constraint forbids)
            need = idx.size
            break
        width *= 4.0
    if idx.size == need:
        return idx
    vals = row[idx]
    kth = vals[np.argpartition(vals, idx.size - need)[idx.size - need]]  # the need-th largest value
    above = np.flatnonzero(vals > kth)
    ties = np.flatnonzero(vals == kth)[: need - above.size]  # the lowest ids among equal logits
    return idx[np.concatenate([above, ties])]


def _sampled(row: np.ndarray, token: int, params: SamplingParams, n_top: int) -> TokenLogprob:
    """log of the sampled-from distribution (temperature, top-k, top-p) at `token` and its best."""
    idx, w = support(row, params)
    where = np.flatnonzero(idx == token)
    # a committed token always has p > 0 (sampling and verification draw from p's support); -inf
    # would only mean a caller passed a token this row did not decide
    chosen = math.log(float(w[where[0]])) if where.size and w[where[0]] > 0.0 else -math.inf
    if n_top == 0:
        return TokenLogprob(chosen)
    order = np.lexsort((idx, -w))[:n_top]
    # w can underflow to 0 far down a vocabulary with no top-k: such a token cannot be sampled
    top = tuple((int(idx[j]), math.log(float(w[j]))) for j in order if w[j] > 0.0)
    return TokenLogprob(chosen, top)
