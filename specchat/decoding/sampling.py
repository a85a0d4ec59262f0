"""Sampling and exact speculative verification, numpy only.

The verification rule is the one from Leviathan et al. (2023) and Chen et al. (2023): a draft token x
drawn from q is kept with probability min(1, p(x)/q(x)); otherwise a token is drawn from
normalize(max(0, p - q)). Whatever q is, the kept-or-replaced token is distributed exactly as p. At
temperature 0 both p and q are one-hot at the argmax, so the rule reduces to "accept iff the draft
token is the target's argmax".

Randomness always comes from a `numpy.random.Generator` passed in, so runs repeat under `--seed`.
`SamplingParams`, the settings' table, lives in `settings.py` (no numpy, for the CLI's start-up) and is
imported from here too.
"""

from __future__ import annotations

import numpy as np

from .settings import SamplingParams


def greedy(logits: np.ndarray) -> int:
    """Index of the largest logit (ties: the lowest id, as llama.cpp's greedy sampler does)."""
    return int(np.argmax(logits))


def greedy_gap(logits: np.ndarray) -> tuple[int, float]:
    """The greedy token (sampling.greedy's argmax) and its logit gap to the second-best token: how
    close this choice is to a tie. (Two max passes around the argmax rather than np.partition, which
    sorts part of a 152k vocabulary: every row of a 16-49 row verify batch is checked, so this is
    on the loop's path; and the argmax is found once for both.)"""
    i = int(np.argmax(logits))
    if logits.shape[0] < 2:
        return i, float("inf")
    left = logits[:i].max() if i > 0 else -np.inf
    right = logits[i + 1 :].max() if i + 1 < logits.shape[0] else -np.inf
    return i, float(logits[i] - max(left, right))


def top_prob(logits: np.ndarray) -> tuple[int, float]:
    """The argmax token and its softmax probability at temperature 1: the draft's confidence."""
    top = int(np.argmax(logits))
    m = float(logits[top])
    z = float(np.exp(logits - m, dtype=np.float32).sum(dtype=np.float64))
    return top, 1.0 / z


def probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution actually sampled from: softmax(logits / T) restricted by top-k, then top-p,
    then min-p (see `support`).

    Returned dense (float64, len = vocab) so target and draft distributions can be compared entry by
    entry. Applied identically to p (target) and q (draft), which exact verification requires.
    """
    n = logits.shape[0]
    out = np.zeros(n, dtype=np.float64)
    if params.greedy:
        out[greedy(logits)] = 1.0
        return out
    idx, w = support(logits, params)
    out[idx] = w
    return out


def support(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The tokens `probs` gives a non-zero probability (temperature > 0) and those probabilities,
    without the dense vocab-sized array: what logprobs report, computed exactly as sampling does.

    min-p keeps the tokens at least `min_p` times as likely as the likeliest (llama.cpp's rule), and
    comes after top-p as in llama.cpp's sampler chain: the ratio does not depend on renormalising, so
    it is the intersection of both filters. It is taken on the tempered distribution, as top-p is
    here (and as vLLM and transformers do); llama.cpp takes both before the temperature, which is the
    same at temperature 1.
    """
    n = logits.shape[0]
    if 0 < params.top_k < n:
        idx = np.argpartition(logits, n - params.top_k)[n - params.top_k :]
    else:
        idx = np.arange(n)
    z = logits[idx].astype(np.float64) / params.temperature
    z -= z.max()
    w = np.exp(z)
    w /= w.sum()
    if params.top_p < 1.0:
        order = np.argsort(-w, kind="stable")
        cum = np.cumsum(w[order])
        keep = int(np.searchsorted(cum, params.top_p, side="left")) + 1
        chosen = order[:keep]
        idx, w = idx[chosen], w[chosen]
        w = w / w.sum()
    if params.min_p > 0.0:
        kept = w >= params.min_p * w.max()
        if not kept.all():
            idx, w = idx[kept], w[kept]
            w = w / w.sum()
    return idx, w


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from distribution p (inverse CDF; robust to rounding at the top end)."""
    cum = np.cumsum(p)
    u = rng.random() * cum[-1]
    return int(min(np.searchsorted(cum, u, side="right"), len(p) - 1))


def verify(p: np.ndarray, q: np.ndarray, x: int, rng: np.random.Generator) -> tuple[bool, int]:
    """Speculative-sampling test of draft token x ~ q against target distribution p.

    Returns (True, x) when x is kept, else (False, y) with y ~ normalize(max(0, p - q)). p and q must
    have the same length; an x outside p's support (e.g. beyond the target vocab) is never kept.
    """
    px = float(p[x]) if x < len(p) else 0.0
    qx = float(q[x]) if x < len(q) else 0.0
    if qx > 0.0 and px >= qx:
        return True, x
    if qx > 0.0 and rng.random() < px / qx:
        return True, x
    residual = np.maximum(p - q, 0.0)
    if residual.sum() <= 0.0:  # p == q up to rounding: the residual is empty, sample from p itself
        residual = p
    return False, sample(residual, rng)


def align(q: np.ndarray, n: int) -> np.ndarray:
    """Draft distribution over the target's vocab size: cut ids the target lacks, pad missing ones."""
    if len(q) == n:
        return q
    if len(q) > n:
        return q[:n]
    return np.concatenate([q, np.zeros(n - len(q), dtype=q.dtype)])
