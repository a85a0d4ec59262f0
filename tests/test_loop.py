"""The speculative loop against fake numpy models: exactness, provenance, cache invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specchat.decoding import loop
from specchat.decoding.calibration import Costs
from specchat.decoding.drafters import ModelDrafter
from specchat.decoding.events import Done, Round, Source, Token
from specchat.decoding.loop import FixedK, Settings, generate
from specchat.decoding.planner import AutoPlanner
from specchat.decoding.sampling import SamplingParams, greedy_gap

from .fakes import DriftModel, FakeModel, NoisyBatchModel, plain_greedy

PROMPT = [1, 2, 3, 4]


GREEDY = SamplingParams()


def run(target, draft=None, *, k=4, n=40, p_min=0.0, params=GREEDY, seed=0):
    drafter = ModelDrafter(draft, p_min=p_min) if draft is not None else None
    events = list(
        generate(
            target,
            PROMPT,
            drafters=[drafter] if drafter else [],
            planner=FixedK(k),
            settings=Settings(max_tokens=n, params=params),
            rng=np.random.default_rng(seed),
        )
    )
    tokens = [e for e in events if isinstance(e, Token)]
    rounds = [e for e in events if isinstance(e, Round)]
    done = events[-1]
    assert isinstance(done, Done)
    return tokens, rounds, done.stats


def check_caches(target, draft, committed):
    assert list(target.tokens) == committed[:-1]
    if draft is not None:
        assert list(draft.tokens) == committed[: len(draft.tokens)]


def test_identical_draft_accepts_everything():
    target = FakeModel(seed=1)
    draft = FakeModel(seed=1, table=target.table)
    tokens, rounds, stats = run(target, draft, k=4, n=40)
    assert [t.id for t in tokens] == plain_greedy(target, PROMPT, 40)
    assert stats.acceptance_rate == 1.0
    assert all(r.accepted == r.drafted == 4 for r in rounds)
    # every round: 4 accepted drafts then a bonus token from the target
    assert [t.source for t in tokens[:5]] == [Source.DRAFT] * 4 + [Source.BONUS]
    assert stats.target_passes == 8
    check_caches(target, draft, PROMPT + [t.id for t in tokens])


def test_always_wrong_draft_gives_one_correction_per_round():
    target = FakeModel(seed=1)
    # a draft whose argmax is never the target's: negate the target's table
    draft = FakeModel(seed=1, table=-target.table)
    tokens, rounds, stats = run(target, draft, k=3, n=20)
    assert [t.id for t in tokens] == plain_greedy(target, PROMPT, 20)
    assert stats.accepted == 0
    # the last round has room for no draft (max_tokens reached), so its token is plain target output
    assert all(t.source is Source.CORRECTION for t in tokens[:-1])
    assert tokens[-1].source is Source.TARGET
    assert all(r.emitted == 1 for r in rounds)
    assert stats.target_passes == 20


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("draft_seed", [1, 2, 7])
def test_greedy_output_equals_plain_greedy(k, draft_seed):
    target = FakeModel(seed=1, n_vocab=8, sharpness=2.0)
    draft = FakeModel(seed=draft_seed, n_vocab=8, sharpness=2.0)
    tokens, _rounds, stats = run(target, draft, k=k, n=50)
    assert [t.id for t in tokens] == plain_greedy(target, PROMPT, 50)
    assert stats.generated_tokens == 50
    check_caches(target, draft, PROMPT + [t.id for t in tokens])


def test_plain_decoding_without_draft():
    target = FakeModel(seed=3)
    tokens, _rounds, stats = run(target, None, n=12)
    assert [t.id for t in tokens] == plain_greedy(target, PROMPT, 12)
    assert all(t.source is Source.TARGET for t in tokens)
    assert stats.drafted == 0 and stats.target_passes == 12
    assert all(call == (1, 1) for call in target.decode_calls[1:])


def test_verify_is_one_decode_call_per_round():
    target = FakeModel(seed=1)
    draft = FakeModel(seed=1, table=target.table)
    run(target, draft, k=4, n=20)
    verify_calls = target.decode_calls[1:]  # first call is the prefill
    assert all(n_tok == n_rows == 5 for n_tok, n_rows in verify_calls)


def test_draft_cache_is_reused_between_rounds():
    target = FakeModel(seed=1)
    draft = FakeModel(seed=1, table=target.table)
    run(target, draft, k=4, n=40)
    # prefill once, then per round: catch up (<= 2 tokens) + k-1 single-token steps; never a refill
    prefill, *rest = draft.decode_calls
    assert prefill[0] == len(PROMPT) - 1
    assert max(n for n, _ in rest) <= 2


def test_eog_stops_and_is_not_emitted():
    target = FakeModel(seed=1, n_vocab=8)
    ref = plain_greedy(target, PROMPT, 30)
    eog = ref[5]
    target = FakeModel(seed=1, n_vocab=8, eog=[eog])
    draft = FakeModel(seed=1, n_vocab=8, table=target.table)
    tokens, _, stats = run(target, draft, k=4, n=30)
    first = ref.index(eog)
    assert [t.id for t in tokens] == ref[:first]
    assert stats.stop_reason == "eog"
    committed = PROMPT + ref[: first + 1]
    check_caches(target, draft, committed)


def test_context_full_stops_with_notice():
    from specchat.decoding.events import Notice

    target = FakeModel(seed=1, n_ctx=20)
    draft = FakeModel(seed=1, table=target.table, n_ctx=20)
    drafter = ModelDrafter(draft, p_min=0.0)
    events = list(
        generate(target, PROMPT, drafters=[drafter], planner=FixedK(4), settings=Settings(max_tokens=100))
    )
    notices = [e for e in events if isinstance(e, Notice)]
    done = events[-1]
    assert done.stats.stop_reason == "context_full"
    assert "--ctx-size" in notices[0].message
    assert len(target.tokens) <= 20


def test_early_close_leaves_caches_consistent():
    target = FakeModel(seed=1)
    draft = FakeModel(seed=2)
    gen = generate(
        target,
        PROMPT,
        drafters=[ModelDrafter(draft, p_min=0.0)],
        planner=FixedK(5),
        settings=Settings(max_tokens=100),
    )
    got = []
    for ev in gen:
        if isinstance(ev, Token):
            got.append(ev.id)
            if len(got) == 7:
                break
    gen.close()
    # tokens of the current round beyond the 7th are committed but not yet seen by the consumer:
    # the caches must describe a prefix-consistent committed sequence that starts with what was seen
    t, d = list(target.tokens), list(draft.tokens)
    assert t[: len(PROMPT) + 6] == PROMPT + got[:6]
    assert d[: len(t)] == t[: len(d)]
    assert len(d) <= len(t) + 1


def test_max_tokens_respected_exactly():
    target = FakeModel(seed=1)
    draft = FakeModel(seed=1, table=target.table)
    for n in (1, 2, 5, 7):
        target._tokens.clear()
        draft._tokens.clear()
        tokens, _, stats = run(target, draft, k=4, n=n)
        assert len(tokens) == n == stats.generated_tokens


def test_p_min_stops_drafting():
    target = FakeModel(seed=1, sharpness=0.1)  # flat distributions: draft is never confident
    draft = FakeModel(seed=1, table=target.table)
    _, rounds, stats = run(target, draft, k=4, n=10, p_min=0.9)
    assert stats.drafted == 0
    assert all(r.drafted == 0 for r in rounds)


@settings(max_examples=40, deadline=None)
@given(
    seed_t=st.integers(0, 50),
    seed_d=st.integers(0, 50),
    k=st.integers(1, 6),
    vocab=st.integers(2, 12),
    n=st.integers(1, 30),
)
def test_property_greedy_exact_and_caches_consistent(seed_t, seed_d, k, vocab, n):
    target = FakeModel(seed=seed_t, n_vocab=vocab)
    draft = FakeModel(seed=seed_d, n_vocab=vocab)
    tokens, rounds, stats = run(target, draft, k=k, n=n)
    assert [t.id for t in tokens] == plain_greedy(target, PROMPT, n)
    assert stats.accepted <= stats.drafted
    assert sum(r.emitted for r in rounds) == len(tokens)
    assert all(r.emitted == r.accepted + 1 or r is rounds[-1] for r in rounds)
    check_caches(target, draft, PROMPT + [t.id for t in tokens])


def test_draft_with_larger_vocab_never_accepts_out_of_range_ids():
    target = FakeModel(seed=1, n_vocab=6)
    big = np.full((997, 9), -10.0, dtype=np.float32)
    big[:, 8] = 10.0  # the draft always proposes id 8, which the target does not have
    draft = FakeModel(n_vocab=9, table=big)
    for params in (SamplingParams(), SamplingParams(temperature=1.0, top_k=0, top_p=1.0)):
        target._tokens.clear()
        draft._tokens.clear()
        tokens, _, stats = run(target, draft, k=3, n=15, params=params)
        assert stats.accepted == 0
        assert all(t.id < 6 for t in tokens)


def test_tie_margin_keeps_greedy_output_equal_to_one_token_decoding():
    eps = 0.3
    diverged = rechecked = accepted = 0
    for seed in range(12):
        target = NoisyBatchModel(eps, seed=seed, n_vocab=8, sharpness=2.0)
        draft = FakeModel(seed=seed, n_vocab=8, table=target.table)
        ref = plain_greedy(target, PROMPT, 60)
        events = list(
            generate(
                target,
                PROMPT,
                drafters=[ModelDrafter(draft, p_min=0.0)],
                planner=FixedK(4),
                settings=Settings(max_tokens=60, tie_margin=2 * eps),
            )
        )
        toks = [e.id for e in events if isinstance(e, Token)]
        assert toks == ref
        stats = events[-1].stats
        rechecked += stats.rechecked
        accepted += stats.accepted
        check_caches(target, draft, PROMPT + toks)
        # the same run without the margin parts ways with one-token decoding at some near-tie
        target._tokens.clear()
        draft._tokens.clear()
        plain = [
            e.id
            for e in generate(
                target,
                PROMPT,
                drafters=[ModelDrafter(draft, p_min=0.0)],
                planner=FixedK(4),
                settings=Settings(max_tokens=60),
            )
            if isinstance(e, Token)
        ]
        diverged += plain != ref
    assert rechecked > 0 and accepted > 100  # near-ties were re-checked, drafting still did its work
    assert diverged > 0  # the noise is real: the margin is what keeps the output exact


def test_a_drafter_the_planner_cannot_use_is_not_given_the_prompt():
    """With -k auto on hardware where a draft model never pays, the draft does no prefill at all."""
    target, draft = FakeModel(n_vocab=16), FakeModel(n_vocab=16)
    drafter = ModelDrafter(draft, p_min=0.0)
    out = list(
        generate(target, [1, 2, 3, 4], drafters=[drafter], planner=FixedK(0), settings=Settings(max_tokens=5))
    )
    assert isinstance(out[-1], Done)
    assert draft.decode_calls == []


def test_a_draft_left_behind_on_a_long_prompt_costs_nothing_and_changes_nothing():
    """-k auto, an agent's turn: a long prompt, a short answer. The draft model is not given the
    prompt (its prefill would cost more than it could save), drafts nothing, and the answer is
    the target's own; a short prompt has it prefilled and drafting as before."""
    target, draft = FakeModel(n_vocab=16), FakeModel(n_vocab=16)
    v = [0.01 * (1 + 0.05 * i) for i in range(9)]
    costs = Costs(list(v), [0.1 * v[0]], catch_up=[0.5 * v[0]])
    # learn_costs off: fakes run in microseconds
    planner = AutoPlanner(costs, [(3.0, 2.0)], model_free=[False], learn_costs=False)
    long_prompt = [int(t) for t in np.random.default_rng(1).integers(0, 16, 400)]
    drafter = ModelDrafter(draft, p_min=0.0)
    reference = FakeModel(n_vocab=16)

    def answer(prompt: list[int], n: int) -> list:
        events = list(
            generate(target, prompt, drafters=[drafter], planner=planner, settings=Settings(max_tokens=n))
        )
        assert [e.id for e in events if isinstance(e, Token)] == plain_greedy(reference, prompt, n)
        return events

    events = answer(long_prompt, 8)
    assert draft.decode_calls == []
    assert all(r.drafter is None for r in events if isinstance(r, Round))
    events = answer(PROMPT, 40)
    assert draft.decode_calls and any(r.drafter is not None for r in events if isinstance(r, Round))


def test_batches_within_the_exact_size_need_no_margin():
    """Settings.exact_rows: rows of a batch that small are bit-identical to one-token decoding."""
    target = NoisyBatchModel(0.3, seed=1, n_vocab=8, sharpness=2.0)
    draft = FakeModel(seed=1, n_vocab=8, table=target.table)
    events = list(
        generate(
            target,
            PROMPT,
            drafters=[ModelDrafter(draft, p_min=0.0)],
            planner=FixedK(2),
            settings=Settings(max_tokens=40, tie_margin=100.0, exact_rows=3),
        )
    )
    assert events[-1].stats.rechecked == 0 and events[-1].stats.accepted > 0


def test_near_ties_on_a_cache_written_by_inexact_batches_are_decided_after_an_exact_repair():
    """Verifying beyond the bit-exact batch leaves K/V that one-token decoding would not
    write; later rows, single tokens included, then round differently too. A near-tie there is only
    decided after the drifted span is re-decoded in exact batches."""
    eps = 0.3
    repaired = diverged = 0
    for seed in range(12):
        target = DriftModel(eps, 3, seed=seed, n_vocab=8, sharpness=2.0)
        draft = FakeModel(seed=seed, n_vocab=8, table=target.table)
        ref = plain_greedy(target, PROMPT, 60)
        events = list(
            generate(target, PROMPT, drafters=[ModelDrafter(draft, p_min=0.0)], planner=FixedK(6),
                     settings=Settings(max_tokens=60, tie_margin=2 * eps, exact_rows=3, strict=True))
        )  # fmt: skip
        toks = [e.id for e in events if isinstance(e, Token)]
        assert toks == ref
        repaired += events[-1].stats.repaired
        check_caches(target, draft, PROMPT + toks)
        target.truncate(0)
        draft.truncate(0)
        # the default (not --strict): the margin guards non-exact rows only, so drift can tip a near-tie
        loose = [e.id for e in generate(target, PROMPT, drafters=[ModelDrafter(draft, p_min=0.0)],
                                        planner=FixedK(6),
                                        settings=Settings(max_tokens=60, tie_margin=2 * eps, exact_rows=3))
                 if isinstance(e, Token)]  # fmt: skip
        diverged += loose != ref
    assert repaired > 0  # repairs happened, and the output still is one-token decoding's
    assert diverged > 0  # without the margin the drift is real


def test_rounds_report_how_tie_prone_the_text_is_plain_rounds_included():
    target = NoisyBatchModel(0.3, seed=2, n_vocab=8, sharpness=1.0)
    draft = FakeModel(seed=2, n_vocab=8, table=target.table)
    events = list(
        generate(target, PROMPT, drafters=[ModelDrafter(draft, p_min=0.0)], planner=FixedK(0),
                 settings=Settings(max_tokens=40, tie_margin=1.0, exact_rows=3))
    )  # fmt: skip
    rounds = [e for e in events if isinstance(e, Round)]
    assert sum(r.gap_rows for r in rounds) == 40  # one decided row per plain round
    gaps = [greedy_gap(target.logits_after(PROMPT + [e.id for e in events if isinstance(e, Token)][:i]))[1]
            for i in range(40)]  # fmt: skip
    assert sum(r.near_ties for r in rounds) == sum(g < 1.0 for g in gaps) > 0


def test_round_time_excludes_what_the_consumer_does_with_the_tokens(monkeypatch):
    """The planner learns V(n) from Round.seconds: a slow terminal rendering 16 accepted tokens must
    not make a 17-row verify batch look dearer than it is. On a clock of the test's own: a decode
    takes 1 ms of it, the consumer 1 s per token."""
    clock = [0.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock[0])

    class Timed(FakeModel):
        def decode(self, tokens, logits_rows):
            clock[0] += 0.001
            return super().decode(tokens, logits_rows)

    target = Timed(seed=3, n_vocab=16)
    draft = Timed(seed=3, n_vocab=16, table=target.table)
    rounds = []
    for ev in generate(target, PROMPT, drafters=[ModelDrafter(draft, p_min=0.0)], planner=FixedK(4),
                       settings=Settings(max_tokens=20)):  # fmt: skip
        if isinstance(ev, Token):
            clock[0] += 1.0  # the consumer's work
        elif isinstance(ev, Round):
            rounds.append(ev)
    assert max(r.emitted for r in rounds) > 1
    assert all(0.0 < r.seconds < 0.1 for r in rounds), [r.seconds for r in rounds]


class ReplayingModel(FakeModel):
    """A target that, like a recurrent one back from a checkpoint, reports having decoded tokens in
    front of every other batch (engine.LlamaModel.replayed)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.replayed = 0
        self.reported: list[int] = []

    def decode(self, tokens, logits_rows):
        self.replayed = 2 * (len(self.decode_calls) % 2)
        self.reported.append(self.replayed)
        return super().decode(tokens, logits_rows)


def test_each_round_records_the_tokens_its_verify_batch_replayed():
    target = ReplayingModel(seed=4)
    draft = FakeModel(seed=5)
    tokens, rounds, _ = run(target, draft, k=3, n=24)
    reported = list(target.reported)
    assert [t.id for t in tokens] == plain_greedy(target, PROMPT, 24)
    assert [r.replayed for r in rounds] == reported[1:]  # the prompt's prefill comes first
    assert any(r.replayed for r in rounds) and not all(r.replayed for r in rounds)


def test_common_prefix_len_equals_the_token_by_token_walk():
    from specchat.decoding.model import PREFIX_BLOCK, common_prefix_len

    rng = np.random.default_rng(3)
    for _ in range(300):
        a = [int(t) for t in rng.integers(0, 3, int(rng.integers(0, 3 * PREFIX_BLOCK)))]
        cut = int(rng.integers(0, len(a) + 1))
        b = a[:cut] + [int(t) for t in rng.integers(0, 3, int(rng.integers(0, 40)))]
        want = 0
        while want < min(len(a), len(b)) and a[want] == b[want]:
            want += 1
        assert common_prefix_len(a, b) == common_prefix_len(tuple(b), a) == want
