"""Token log-probabilities: the numbers (logprobs.py) and where the loop takes them from (the target
row that decided each token, never a draft's), against fake numpy models."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specchat.decoding import loop
from specchat.decoding.drafters import ModelDrafter
from specchat.decoding.events import Done, Source, Token
from specchat.decoding.logprobs import MAX_TOP, token_logprob
from specchat.decoding.loop import FixedK, Settings, generate
from specchat.decoding.sampling import SamplingParams, probs

from .fakes import DriftModel, FakeModel

GREEDY = SamplingParams()
PROMPT = [1, 2, 3, 4]


def log_softmax(row: np.ndarray) -> np.ndarray:
    z = row.astype(np.float64)
    return z - (z.max() + np.log(np.exp(z - z.max()).sum()))


def test_greedy_logprobs_are_log_softmax_with_the_chosen_token_first():
    row = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 3
    best = int(np.argmax(row))
    lp = token_logprob(row, best, GREEDY, 5)
    ref = log_softmax(row)
    assert lp.logprob == pytest.approx(ref[best], abs=1e-5)
    assert [t for t, _ in lp.top] == list(np.argsort(-ref)[:5])
    assert lp.top[0] == (best, lp.logprob)  # the same number, not merely close
    assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:], strict=False))
    other = int(np.argsort(-ref)[3])
    assert token_logprob(row, other, GREEDY, 0).logprob == pytest.approx(ref[other], abs=1e-5)
    assert token_logprob(row, best, GREEDY, 0).top == ()


def test_equal_logits_list_the_lower_id_first_as_greedy_picks_it():
    row = np.zeros(50, dtype=np.float32)
    row[[7, 3, 40]] = 2.0
    lp = token_logprob(row, 3, GREEDY, 3)
    assert [t for t, _ in lp.top] == [3, 7, 40]
    flat = np.zeros(5000, dtype=np.float32)  # every logit equal: the lowest ids
    assert [t for t, _ in token_logprob(flat, 0, GREEDY, 5).top] == [0, 1, 2, 3, 4]
    many = np.random.default_rng(2).standard_normal(5000).astype(np.float32)
    ties = np.sort(np.random.default_rng(3).choice(5000, 40, replace=False))
    many[ties] = 9.0  # 40 equal maxima, more than asked for
    lp = token_logprob(many, int(np.argmax(many)), GREEDY, 20)
    assert [t for t, _ in lp.top] == list(ties[:20]) and lp.top[0][0] == int(np.argmax(many))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95),
        SamplingParams(temperature=1.3, top_k=0, top_p=1.0),
        SamplingParams(temperature=1.0, top_k=3, top_p=1.0),
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.05),
    ],
)
def test_sampling_logprobs_are_of_the_distribution_sampled_from(params):
    row = np.random.default_rng(1).standard_normal(500).astype(np.float32) * 2
    p = probs(row, params)
    support = np.flatnonzero(p)
    tok = int(support[len(support) // 2])
    lp = token_logprob(row, tok, params, MAX_TOP)
    assert lp.logprob == pytest.approx(math.log(p[tok]), rel=1e-9)
    assert len(lp.top) == min(MAX_TOP, len(support))  # tokens the filters removed are not listed
    for t, v in lp.top:
        assert v == pytest.approx(math.log(p[t]), rel=1e-9)
    assert [t for t, _ in lp.top] == sorted(support, key=lambda t: (-p[t], t))[: len(lp.top)]


def test_asking_beyond_the_limit_is_refused():
    with pytest.raises(ValueError):
        token_logprob(np.zeros(8, dtype=np.float32), 0, GREEDY, MAX_TOP + 1)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    top_k=st.integers(0, 30),
    top_p=st.floats(0.05, 1.0),
    n_top=st.integers(0, MAX_TOP),
)
def test_the_chosen_tokens_entry_in_top_is_its_logprob(seed, temperature, top_k, top_p, n_top):
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(64) * 4).astype(np.float32)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    p = probs(row, params)
    tok = int(rng.choice(len(p), p=p))
    lp = token_logprob(row, tok, params, n_top)
    assert math.isfinite(lp.logprob) and lp.logprob <= 0.0
    assert len(lp.top) <= n_top
    for t, v in lp.top:
        if t == tok:
            assert v == lp.logprob
    if params.greedy and n_top:
        assert lp.top[0][0] == tok


# --- in the loop ---------------------------------------------------------------------------------------


def loop_tokens(target, draft=None, *, params=GREEDY, logprobs=5, k=4, n=40, seed=0, exact=8) -> list[Token]:
    """The Token events of a run; `exact`: verify batches this big are exact (FakeModel: any)."""
    drafters = [ModelDrafter(draft, p_min=0.0)] if draft is not None else []
    events = list(
        generate(
            target,
            PROMPT,
            drafters=drafters,
            planner=FixedK(k if drafters else 0),
            settings=Settings(max_tokens=n, params=params, logprobs=logprobs, exact_rows=exact),
            rng=np.random.default_rng(seed),
        )
    )
    assert isinstance(events[-1], Done)
    return [e for e in events if isinstance(e, Token)]


def test_logprobs_come_from_the_target_row_that_decided_each_token():
    target = FakeModel(seed=1, n_vocab=12, sharpness=2.0)
    draft = FakeModel(seed=2, n_vocab=12, sharpness=2.0)  # agrees sometimes, never has the same rows
    tokens = loop_tokens(target, draft, k=3)
    sources = {t.source for t in tokens}
    assert Source.DRAFT in sources and Source.CORRECTION in sources  # accepted, rejected and bonus rows
    context = list(PROMPT)
    for t in tokens:
        want = token_logprob(target.logits_after(context), t.id, GREEDY, 5)
        assert t.logprob == want
        assert t.logprob != token_logprob(draft.logits_after(context), t.id, GREEDY, 5)
        context.append(t.id)


def test_logprobs_are_the_same_with_and_without_drafting():
    target = FakeModel(seed=1, n_vocab=12, sharpness=2.0)
    draft = FakeModel(seed=1, n_vocab=12, table=target.table + 0.3)  # mostly right
    plain = loop_tokens(target)
    drafted = loop_tokens(target, draft, k=4)
    assert [t.id for t in drafted] == [t.id for t in plain]
    assert [t.logprob for t in drafted] == [t.logprob for t in plain]
    assert any(t.source is Source.DRAFT for t in drafted)


def test_greedy_logprobs_keep_verify_batches_exact_so_they_equal_plain_decoding():
    """Batches beyond the exact size round differently (DriftModel, like llama.cpp's CPU GEMM), so
    with logprobs asked for, greedy verification stays within it and the numbers are plain decoding's."""

    def drafted_run(logprobs: int | None, params: SamplingParams = GREEDY) -> tuple[list[Token], DriftModel]:
        target = DriftModel(0.01, 3, seed=1, n_vocab=12, sharpness=2.0)
        draft = FakeModel(seed=1, n_vocab=12, table=target.table + 0.3)  # mostly right
        events = generate(
            target,
            PROMPT,
            drafters=[ModelDrafter(draft, p_min=0.0)],
            planner=FixedK(4),
            settings=Settings(max_tokens=30, params=params, exact_rows=3, logprobs=logprobs),
            rng=np.random.default_rng(0),
        )
        return [e for e in events if isinstance(e, Token)], target

    plain_target = DriftModel(0.01, 3, seed=1, n_vocab=12, sharpness=2.0)
    plain = [
        e
        for e in generate(plain_target, PROMPT, settings=Settings(max_tokens=30, logprobs=5))
        if isinstance(e, Token)
    ]
    tokens, target = drafted_run(5)
    assert [t.id for t in tokens] == [t.id for t in plain]
    assert [t.logprob for t in tokens] == [t.logprob for t in plain]  # bit for bit
    assert any(t.source is Source.DRAFT for t in tokens)  # still speculating, 2 drafts a round
    assert max(n for n, _ in target.decode_calls[1:]) == 3  # [last, d1, d2]: the exact size
    _, uncapped = drafted_run(None)
    assert max(n for n, _ in uncapped.decode_calls[1:]) == 5  # without logprobs: k = 4 as planned
    _, sampled = drafted_run(5, SamplingParams(temperature=0.8))
    assert max(n for n, _ in sampled.decode_calls[1:]) == 5  # sampling reports the rows it sampled from


def test_sampled_tokens_have_a_finite_logprob_in_the_distribution_they_were_drawn_from():
    params = SamplingParams(temperature=0.9, top_k=6, top_p=0.9)
    target = FakeModel(seed=3, n_vocab=16, sharpness=1.5)
    draft = FakeModel(seed=4, n_vocab=16, sharpness=1.5)
    tokens = loop_tokens(target, draft, params=params, k=3, seed=11)
    context = list(PROMPT)
    for t in tokens:
        p = probs(target.logits_after(context), params)
        assert p[t.id] > 0 and t.logprob is not None
        assert t.logprob.logprob == pytest.approx(math.log(p[t.id]), rel=1e-9)
        context.append(t.id)


def test_without_logprobs_nothing_is_computed(monkeypatch):
    def refuse(*_args: object) -> None:
        raise AssertionError("logprobs computed though none were asked for")

    monkeypatch.setattr(loop, "token_logprob", refuse)
    target = FakeModel(seed=1, n_vocab=12)
    draft = FakeModel(seed=2, n_vocab=12)
    tokens = loop_tokens(target, draft, logprobs=None)
    assert tokens and all(t.logprob is None for t in tokens)
