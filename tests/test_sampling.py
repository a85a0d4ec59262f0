"""Sampling filters and the exactness of speculative sampling (temperature > 0)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from specchat.decoding.drafters import ModelDrafter
from specchat.decoding.events import Token
from specchat.decoding.loop import FixedK, Settings, generate
from specchat.decoding.sampling import SamplingParams, probs, sample, top_prob, verify

from .fakes import FakeModel


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def test_probs_temperature_topk_topp():
    logits = np.array([3.0, 2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    p = probs(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0))
    np.testing.assert_allclose(p, softmax(logits.astype(np.float64)), rtol=1e-6)
    p2 = probs(logits, SamplingParams(temperature=1.0, top_k=2, top_p=1.0))
    assert np.count_nonzero(p2) == 2 and p2[0] > p2[1] > 0
    p3 = probs(logits, SamplingParams(temperature=1.0, top_k=0, top_p=0.5))
    assert np.count_nonzero(p3) == 1  # the top token alone already has > 0.5 of the mass
    cold = probs(logits, SamplingParams(temperature=0.1, top_k=0, top_p=1.0))
    assert cold[0] > 0.99
    greedy = probs(logits, SamplingParams(temperature=0.0))
    assert greedy.tolist() == [1.0, 0, 0, 0, 0]


def test_min_p_drops_the_tail_and_leaves_greedy_alone():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05])).astype(np.float32)
    plain = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    assert np.count_nonzero(probs(logits, plain)) == 4
    cut = probs(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2))  # below 0.1 goes
    assert cut[3] == 0.0 and cut.sum() == pytest.approx(1.0)
    assert cut[:3] == pytest.approx(np.array([0.5, 0.3, 0.15]) / 0.95, rel=1e-5)
    hot = probs(logits, SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.2))
    assert np.count_nonzero(hot) == 4  # taken after the temperature: flatter, so nothing is below 0.2x
    top = probs(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.99))
    assert top.tolist() == [1.0, 0.0, 0.0, 0.0]  # the likeliest token always stays
    for min_p in (0.0, 0.5, 0.99):  # greedy: the argmax whatever min-p says
        assert probs(logits, SamplingParams(temperature=0.0, min_p=min_p)).tolist() == [1.0, 0, 0, 0]


def test_top_prob_is_softmax_max():
    logits = np.array([0.5, 2.0, -1.0], dtype=np.float32)
    tok, p = top_prob(logits)
    assert tok == 1
    assert p == pytest.approx(softmax(logits.astype(np.float64))[1], rel=1e-5)


def test_params_reject_bad_values_only():
    assert SamplingParams(temperature=0.0).greedy
    with pytest.raises(ValueError, match="--top-p"):
        SamplingParams(temperature=1.5, top_p=2.0)  # out of range even where greedy would ignore it
    with pytest.raises(ValueError, match="--temp"):
        SamplingParams(temperature=-1)


def total_variation(counts: np.ndarray, p: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts / counts.sum() - p).sum())


def test_verify_output_is_distributed_as_p():
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.2, 0.2, 0.1, 0.0])
    q = np.array([0.1, 0.6, 0.0, 0.1, 0.2])  # q puts mass where p has none, and misses id 2
    counts = np.zeros(5)
    for _ in range(40_000):
        x = sample(q, rng)
        _, y = verify(p, q, x, rng)
        counts[y] += 1
    assert counts[4] == 0  # never a token the target gives zero probability
    assert total_variation(counts, p) < 0.015


@settings(max_examples=60, deadline=None)
@given(
    p=arrays(np.float64, 6, elements=st.floats(0, 1)),
    q=arrays(np.float64, 6, elements=st.floats(0, 1)),
    seed=st.integers(0, 2**32 - 1),
)
def test_verify_property_never_emits_zero_probability_tokens(p, q, seed):
    if p.sum() <= 0 or q.sum() <= 0:
        return
    p, q = p / p.sum(), q / q.sum()
    rng = np.random.default_rng(seed)
    x = sample(q, rng)
    ok, y = verify(p, q, x, rng)
    assert 0 <= y < 6
    assert p[y] > 0
    if ok:
        assert y == x


@pytest.mark.parametrize("min_p", [0.0, 0.3])
def test_speculative_sampling_matches_target_distribution(min_p):
    """Joint distribution of the first two tokens over many seeded runs equals the target's (with
    min-p: the target's filtered distribution, which the draft's q goes through too)."""
    vocab = 4
    target = FakeModel(seed=11, n_vocab=vocab, sharpness=1.0)
    draft = FakeModel(seed=12, n_vocab=vocab, sharpness=1.0)  # deliberately different
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=min_p)
    prompt = [1, 2, 3]
    exact = np.zeros((vocab, vocab))
    p1 = probs(target.logits_after(prompt), params)
    if min_p == 0.0:
        assert p1 == pytest.approx(softmax(target.logits_after(prompt).astype(np.float64)))
    else:
        assert 0 < np.count_nonzero(p1) < vocab  # the filter removed something here
    for a, b in itertools.product(range(vocab), repeat=2):
        exact[a, b] = p1[a] * probs(target.logits_after([*prompt, a]), params)[b]
    counts = np.zeros((vocab, vocab))
    rng = np.random.default_rng(5)
    drafter = ModelDrafter(draft, p_min=0.0)
    n_runs = 6000
    for _ in range(n_runs):
        toks = [
            e.id
            for e in generate(
                target,
                prompt,
                drafters=[drafter] if drafter else [],
                planner=FixedK(2),
                settings=Settings(max_tokens=2, params=params),
                rng=rng,
            )
            if isinstance(e, Token)
        ]
        counts[toks[0], toks[1]] += 1
    tv = total_variation(counts.ravel(), exact.ravel())
    # 16 cells, 6000 draws: sampling noise alone gives TV around 0.02; a biased rule gives far more
    assert tv < 0.04, tv
    # and the draft really was used (otherwise this would only test plain sampling)
    assert drafter.model.decode_calls
