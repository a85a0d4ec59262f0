"""The speculative loop under a constraint (decoding/constraint.py), on fake numpy models and a
pure-Python token automaton: the output is the constrained target's whatever the drafter proposes,
and the constraint advances exactly with the committed tokens."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specchat.decoding.constraint import CANDIDATES, Walk
from specchat.decoding.drafters import ModelDrafter, Proposal
from specchat.decoding.events import Done, Notice, Source, Token
from specchat.decoding.loop import FixedK, Settings, generate
from specchat.decoding.ngram import NgramDrafter
from specchat.decoding.sampling import SamplingParams, probs

from .fakes import FakeModel, NoisyBatchModel, TokenAutomaton, constrained_greedy

PROMPT = [1, 2, 3, 4]


class OracleDrafter:
    """Proposes the reference output itself: every draft is right (a greedy-only test drafter)."""

    name = "oracle"
    source = Source.DRAFT
    model = None
    per_pass = False
    pass_share = 0.0
    prior = (1.0, 1.0)
    route_priors: dict[str, tuple[float, float]] = {}  # noqa: RUF012 (a protocol attribute, never changed)
    p_min = None

    def __init__(self, prompt: Sequence[int], reference: Sequence[int]) -> None:
        self.prompt, self.reference = list(prompt), list(reference)

    def route(self, context: Sequence[int]) -> str | None:
        return "oracle"

    def propose(self, context, k, params, rng, *, budget=None, processor=None) -> Proposal:  # type: ignore[no-untyped-def]
        at = len(context) - len(self.prompt)
        return Proposal(tokens=self.reference[at : at + k])

    def lag(self, context: Sequence[int]) -> int:
        return 0

    def prepare(self, context: Sequence[int]) -> None:
        return None

    def settle(self, context: Sequence[int]) -> None:
        return None

    def reset(self) -> None:
        return None


GREEDY = SamplingParams()


def run(target, auto, drafters=(), *, k=4, n=40, params=GREEDY, seed=0, **extra):
    events = list(
        generate(
            target,
            PROMPT,
            drafters=list(drafters),
            planner=FixedK(k),
            settings=Settings(max_tokens=n, params=params, **extra),
            rng=np.random.default_rng(seed),
            constraint=auto,
        )
    )
    done = events[-1]
    assert isinstance(done, Done)
    return [e.id for e in events if isinstance(e, Token)], done.stats, events


def drafter(kind: str, target: FakeModel, ref: list[int]):
    if kind == "right":
        return OracleDrafter(PROMPT, ref)
    if kind == "wrong":  # its argmax is never the unconstrained target's
        return ModelDrafter(FakeModel(n_vocab=target.n_vocab, table=-target.table), p_min=0.0)
    if kind == "model":  # an unconstrained copy of the target: right only where the argmax is allowed
        return ModelDrafter(FakeModel(n_vocab=target.n_vocab, table=target.table), p_min=0.0)
    return NgramDrafter(min_n=1)


@pytest.mark.parametrize("vocab", [16, 64, 600])  # 600: both candidate levels before a full mask
@pytest.mark.parametrize("kind", ["none", "right", "wrong", "model", "ngram"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_constrained_greedy_is_the_constrained_target_whatever_the_drafter(vocab, kind, seed):
    target = FakeModel(seed=seed, n_vocab=vocab, sharpness=2.0)
    auto = TokenAutomaton.random(vocab, seed=seed, n_states=4, width=5)
    ref = constrained_greedy(target, PROMPT, 40, auto)
    toks, stats, _ = run(target, auto, [] if kind == "none" else [drafter(kind, target, ref)], k=4)
    assert toks == ref
    assert auto.accepted == toks  # the state advanced with exactly the committed tokens
    assert list(target.tokens) == PROMPT + toks[:-1]
    if kind == "right":
        assert stats.acceptance_rate == 1.0 and stats.target_passes == 8
    if kind == "wrong":
        assert stats.drafted > 0
    assert stats.accepted <= stats.drafted


def test_cheap_path_checks_a_few_tokens_not_the_vocabulary():
    vocab = 4096
    target = FakeModel(seed=5, n_vocab=vocab, sharpness=2.0)
    # each state allows a random tenth of the vocabulary: the argmax is allowed a tenth of the time,
    # else one of the 16 next-best is most of the time, else one of the 256 next-best
    auto = TokenAutomaton.random(vocab, seed=5, n_states=3, width=400)
    ref = constrained_greedy(target, PROMPT, 30, auto)
    auto = auto.fresh()
    toks, _, _ = run(target, auto, [drafter("model", target, ref)], k=4, n=30)
    assert toks == ref
    assert auto.largest == CANDIDATES[1] < vocab  # never a full mask of the vocabulary here
    assert auto.checks < 30 * 5 * 80  # rows walked x a few candidates each, on average


@pytest.mark.parametrize("vocab", [8, 64])
def test_tie_margin_under_a_constraint_keeps_one_token_output_and_rechecks_advance_nothing(vocab):
    eps = 0.3
    rechecked = 0
    for seed in range(8):
        target = NoisyBatchModel(eps, seed=seed, n_vocab=vocab, sharpness=1.0)
        auto = TokenAutomaton.random(vocab, seed=seed, n_states=3, width=max(3, vocab // 3))
        ref = constrained_greedy(target, PROMPT, 50, auto)
        draft = ModelDrafter(FakeModel(n_vocab=vocab, table=target.table), p_min=0.0)
        toks, stats, _ = run(target, auto, [draft], n=50, tie_margin=2 * eps)
        assert toks == ref
        assert auto.accepted == toks
        rechecked += stats.rechecked
    assert rechecked > 0


def test_the_gap_reported_is_never_above_the_gap_among_allowed_tokens():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.choice([8, 40, 700]))
        row = (rng.standard_normal(n) * 3).astype(np.float32)
        row[rng.integers(n)] = row.max()  # exact ties too
        allowed = rng.random(n) < rng.choice([0.02, 0.3, 0.9])
        allowed[rng.integers(n)] = True
        auto = TokenAutomaton({0: {int(t): 0 for t in np.flatnonzero(allowed)}}, set(), ())
        walk = Walk(auto, n, lambda _t: False)
        masked = np.where(allowed, row, -np.inf)
        best = int(np.argmax(masked))
        others = np.delete(masked, best)
        runner = others.max() if others.size else -np.inf
        true_gap = float(masked[best] - runner) if np.isfinite(runner) else math.inf
        for margin in (0.0, 0.5, 5.0):
            got, gap = walk.greedy(row, margin, measure=True)
            assert got == best, trial
            assert gap <= true_gap + 1e-6
            assert (gap < margin) == (true_gap < margin)  # a near-tie is reported exactly when there is one
        assert walk.greedy(row, 0.0, measure=False)[0] == best


def test_an_answer_ends_where_the_constraint_allows_only_end_of_generation():
    vocab, eog = 10, 9
    target = FakeModel(seed=3, n_vocab=vocab, eog=[eog])
    # 0 -> 1 -> 2 -> 3 (accepting, nothing else): the answer is three tokens, whatever the model likes
    auto = TokenAutomaton({0: {5: 1, 6: 1}, 1: {2: 2, 7: 2}, 2: {1: 3, 3: 3}, 3: {}}, {3}, [eog])
    draft = ModelDrafter(FakeModel(n_vocab=vocab, table=target.table), p_min=0.0)
    toks, stats, _ = run(target, auto, [draft], k=4)
    assert len(toks) == 3 and auto.state == 3
    assert stats.stop_reason == "eog"
    assert stats.generated_tokens == 4  # the end-of-generation token is committed, not shown


def test_a_grammar_that_allows_nothing_stops_with_a_notice():
    target = FakeModel(seed=3, n_vocab=10)
    auto = TokenAutomaton({0: {5: 1}, 1: {}}, set(), [])
    toks, stats, events = run(target, auto, [], k=0)
    assert toks == [5]
    assert stats.stop_reason == "grammar"
    assert any(isinstance(e, Notice) and "grammar" in e.message for e in events)


def test_logprobs_are_those_of_the_constrained_distribution():
    vocab = 12
    target = FakeModel(seed=4, n_vocab=vocab, sharpness=2.0)
    auto = TokenAutomaton.random(vocab, seed=4, n_states=3, width=4)
    ref_auto = auto.fresh()
    draft = ModelDrafter(FakeModel(n_vocab=vocab, table=target.table), p_min=0.0)
    _, _, events = run(target, auto, [draft], n=20, logprobs=5, exact_rows=8)
    ctx = list(PROMPT)
    for tok in (e for e in events if isinstance(e, Token)):
        row = target.logits_after(ctx).astype(np.float64)
        ok = ref_auto.allowed(np.arange(vocab))
        z = np.log(np.exp(row[ok] - row[ok].max()).sum()) + row[ok].max()
        assert tok.logprob is not None
        assert tok.logprob.logprob == pytest.approx(row[tok.id] - z, abs=1e-4)
        assert sum(math.exp(lp) for _, lp in tok.logprob.top) == pytest.approx(1.0, abs=1e-4)  # 4 allowed
        assert all(ok[t] for t, _ in tok.logprob.top)
        ctx.append(tok.id)
        ref_auto.accept(tok.id)


def test_constrained_speculative_sampling_matches_the_constrained_target_distribution():
    """Joint distribution of the first two tokens over many seeded runs, with a draft that often
    proposes forbidden tokens: equal to the target's restricted to what the automaton allows."""
    vocab = 5
    target = FakeModel(seed=11, n_vocab=vocab, sharpness=1.0)
    draft = FakeModel(seed=12, n_vocab=vocab, sharpness=1.0)
    moves = {0: {0: 1, 2: 2, 3: 1}, 1: {1: 0, 4: 0}, 2: {0: 0, 1: 0, 3: 0}}
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)

    def p(ctx, state):
        row = target.logits_after(ctx).astype(np.float64)
        ok = np.array([t in moves[state] for t in range(vocab)])
        w = np.where(ok, np.exp(row - row.max()), 0.0)
        return w / w.sum()

    exact = np.zeros((vocab, vocab))
    p1 = p(PROMPT, 0)
    for a, b in itertools.product(range(vocab), repeat=2):
        if a in moves[0]:
            exact[a, b] = p1[a] * p([*PROMPT, a], moves[0][a])[b]
    counts = np.zeros((vocab, vocab))
    rng = np.random.default_rng(5)
    drafter_ = ModelDrafter(draft, p_min=0.0)
    n_runs = 5000
    for _ in range(n_runs):
        toks = [
            e.id
            for e in generate(
                target,
                PROMPT,
                drafters=[drafter_],
                planner=FixedK(2),
                settings=Settings(max_tokens=2, params=params),
                rng=rng,
                constraint=TokenAutomaton(moves, set(), ()),
            )
            if isinstance(e, Token)
        ]
        counts[toks[0], toks[1]] += 1
    tv = 0.5 * np.abs(counts.ravel() / n_runs - exact.ravel()).sum()
    assert counts[exact == 0].sum() == 0  # never a forbidden token
    assert tv < 0.04, tv  # sampling noise alone: ~0.02
    assert draft.decode_calls


@pytest.mark.parametrize("top_k", [0, 1, 5, 40])
def test_sampling_under_top_k_checks_candidates_only_and_gives_the_full_masks_distribution(top_k):
    rng = np.random.default_rng(top_k)
    params = SamplingParams(temperature=0.8, top_k=top_k, top_p=0.9)
    for _ in range(50):
        n = 2000
        row = (rng.standard_normal(n) * 3).astype(np.float32)
        allowed = rng.random(n) < rng.choice([0.01, 0.2, 0.9])
        auto = TokenAutomaton({0: {int(t): 0 for t in np.flatnonzero(allowed)}}, set(), ())
        want = probs(np.where(allowed, row, -np.inf).astype(np.float32), params)
        got = Walk(auto, n, lambda _t: False).probs(row, params)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
        assert (auto.largest < n) == (top_k > 0 and allowed[np.argsort(-row)[:256]].sum() >= top_k)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafts_past_an_accepted_end_of_generation_neither_advance_the_state_nor_break_logprobs(temperature):
    vocab, eog = 10, 9
    target = FakeModel(seed=3, n_vocab=vocab, eog=[eog], sharpness=2.0)
    auto = TokenAutomaton({0: {5: 1}, 1: {2: 2}, 2: {}}, {2}, [eog])  # "5 2", then only the end
    ref = constrained_greedy(target, PROMPT, 10, auto)
    assert ref == [5, 2, eog]
    oracle = OracleDrafter(PROMPT, [*ref, 4, 4, 4])  # drafts on past the end
    params = SamplingParams(temperature=temperature, top_k=0, top_p=1.0)
    toks, stats, events = run(target, auto, [oracle], k=6, params=params, logprobs=2)
    assert toks == [5, 2] and auto.accepted == [5, 2]
    assert stats.stop_reason == "eog"
    assert all(e.logprob is not None for e in events if isinstance(e, Token))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    vocab=st.sampled_from([6, 20, 300]),
    k=st.integers(1, 8),
    width=st.integers(1, 6),
    draft_seed=st.integers(0, 3),
)
def test_property_constrained_greedy_is_exact_and_the_state_follows_the_output(
    seed, vocab, k, width, draft_seed
):
    eog = vocab - 1
    target = FakeModel(seed=seed, n_vocab=vocab, sharpness=2.0, eog=[eog])
    auto = TokenAutomaton.random(vocab, seed=seed, n_states=3, width=min(width, vocab - 1), eog=[eog])
    ref = constrained_greedy(target, PROMPT, 30, auto)
    draft = FakeModel(seed=draft_seed, n_vocab=vocab, table=target.table if draft_seed == 0 else None)
    toks, _, _ = run(target, auto, [ModelDrafter(draft, p_min=0.0)], k=k, n=30)
    assert toks == [t for t in ref if t != eog]
    assert auto.accepted == toks
