"""N-gram prompt-lookup drafter."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specchat.decoding.events import Source, Token
from specchat.decoding.loop import FixedK, Settings, generate
from specchat.decoding.ngram import NgramDrafter
from specchat.decoding.sampling import SamplingParams

from .fakes import FakeModel, plain_greedy

G = SamplingParams()
RNG = np.random.default_rng(0)


def test_proposes_continuation_of_longest_recent_match():
    d = NgramDrafter(max_n=3)
    ctx = [5, 6, 7, 8, 9, 1, 2, 6, 7, 3, 4, 6, 7]
    # last 2 tokens (6, 7) occurred at 1..2 and 7..8; the most recent earlier one is followed by 3, 4
    assert d.propose(ctx, 3, G, RNG).tokens == [3, 4, 6]
    # with a 3-gram match available it wins over the shorter one
    ctx2 = [1, 2, 3, 9, 9, 5, 2, 3, 8, 1, 2, 3]
    assert d.propose(ctx2, 2, G, RNG).tokens == [9, 9]


def test_no_match_proposes_nothing_and_context_change_reindexes():
    d = NgramDrafter(min_n=1)
    assert d.propose([1, 2, 3, 4], 4, G, RNG).tokens == []
    assert d.propose([7, 8, 7], 2, G, RNG).tokens == [8, 7]
    assert d.propose([1, 2, 1], 2, G, RNG).tokens == [2, 1]  # a different context, not an extension
    # by default a single shared token is too weak a match to draft from
    assert NgramDrafter().propose([7, 8, 7], 2, G, RNG).tokens == []
    assert NgramDrafter().propose([7, 8, 9, 7, 8], 2, G, RNG).tokens == [9, 7]


@settings(max_examples=80, deadline=None)
@given(ctx=st.lists(st.integers(0, 5), min_size=1, max_size=60), k=st.integers(1, 8))
def test_property_proposal_is_a_real_earlier_continuation(ctx, k):
    d = NgramDrafter(max_n=4)
    tokens = d.propose(ctx, k, G, RNG).tokens
    assert len(tokens) <= k
    if tokens:
        # the proposal copies on from right after an earlier occurrence of the context's last tokens;
        # a copy that reaches the present rolls on through its own drafts (ctx + tokens)
        n = len(ctx)
        ext = [*ctx, *tokens]
        found = any(ext[end : end + len(tokens)] == tokens and ctx[end - 1] == ctx[-1] for end in range(1, n))
        assert found
        assert len(tokens) == k  # once matched, a copy ends only at k


def test_a_copy_that_reaches_the_present_rolls_on_through_its_drafts():
    """A repeating pattern (a list of similar lines) drafts as far as asked, like llama.cpp's ngram-mod,
    instead of stopping where the latest occurrence's continuation meets the end of the context."""
    d = NgramDrafter()
    ctx = [1, 2, 3, 1, 2, 3, 1, 2]
    assert d.propose(ctx, 7, G, RNG).tokens == [3, 1, 2, 3, 1, 2, 3]


def test_the_occurrence_agreeing_furthest_back_is_copied():
    """In an edit the model's own output repeats short phrases of the file; the occurrence whose
    preceding tokens agree longest (the line being copied) wins over the most recent one."""
    d = NgramDrafter(max_n=2)
    source = [10, 11, 12, 5, 6, 40, 41]  # the file: ... 10 11 12 [5 6] 40 41
    output = [90, 5, 6, 70, 71, 10, 11, 12, 5, 6]  # output used [5 6] once before, now copies the file
    end, length = d.match([*source, *output])
    assert end == 5 and length == 5
    assert d.propose([*source, *output], 2, G, RNG).tokens == [40, 41]


def cycle_target(vocab: int = 6) -> FakeModel:
    """A target whose greedy output cycles 0, 1, ..., vocab-1, 0, ...: n-gram lookup's best case."""
    table = np.full((997, vocab), -5.0, dtype=np.float32)
    target = FakeModel(n_vocab=vocab, table=table, order=1)
    for t in range(vocab):
        target.table[hash((t,)) % 997][(t + 1) % vocab] = 5.0
    return target


def test_loop_with_ngram_is_exact_and_labelled():
    # a target that repeats a cycle: prompt lookup should draft it perfectly after one period
    target = cycle_target()
    prompt = [0, 1, 2, 3, 4, 5, 0]
    events = list(
        generate(
            target, prompt, drafters=[NgramDrafter()], planner=FixedK(4), settings=Settings(max_tokens=30)
        )
    )
    toks = [e for e in events if isinstance(e, Token)]
    assert [t.id for t in toks] == plain_greedy(target, prompt, 30)
    assert sum(t.source is Source.NGRAM for t in toks) >= 20
    assert events[-1].stats.acceptance_rate == 1.0


def test_route_names_the_match_length_class():
    d = NgramDrafter()
    assert d.route([1, 2, 3, 4]) is None  # nothing repeats: nothing to propose, the round is plain
    assert d.route([7, 8, 9, 7, 8]) == "match 2+"
    line = list(range(10, 30))  # a 20-token line copied again: the match runs 16+ tokens back
    assert d.route([*line, 1, *line[:18]]) == "match 16+"
    assert d.propose([*line, 1, *line[:18]], 3, G, RNG).tokens == [*line[18:20], 1]
    # the measured length counts tokens before the longest indexed n-gram that agree too
    ctx = [5, 1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3, 4, 5, 6]
    end, length = d.match(ctx)
    assert end == 7 and length == 6
    assert d.route(ctx) == "match 4+"


@settings(max_examples=60, deadline=None)
@given(ctx=st.lists(st.integers(0, 3), min_size=2, max_size=80))
def test_property_match_length_is_real(ctx):
    """The reported match really is that long, and is the longest suffix the index can see."""
    end, length = NgramDrafter().match(ctx)
    if end is None:
        assert length == 0
        return
    n = len(ctx)
    assert length >= 2 and end - length >= 0
    assert ctx[end - length : end] == ctx[n - length :]
    assert end <= n - 1


def test_stats_keep_per_route_figures():
    target = cycle_target()
    events = list(
        generate(target, [0, 1, 2, 3, 4, 5, 0], drafters=[NgramDrafter()], planner=FixedK(4),
                 settings=Settings(max_tokens=30))
    )  # fmt: skip
    stats = events[-1].stats
    assert stats.routes and all(r.drafter == "ngram" for r in stats.routes)
    assert sum(r.drafted for r in stats.routes) == stats.drafted
    assert sum(r.accepted for r in stats.routes) == stats.accepted
    doc = stats.to_dict()["routes"]
    assert {r["route"] for r in doc} == {r.route for r in stats.routes}
