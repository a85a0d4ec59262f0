"""Following a copy and learning the edits an answer makes to it (decoding/copying.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specchat.decoding.copying import GUESS_AFTER, RELEARN_AFTER, RESYNC_RUN, CopyFollower
from specchat.decoding.events import Token
from specchat.decoding.loop import FixedK, Settings, generate
from specchat.decoding.ngram import NgramDrafter
from specchat.decoding.sampling import SamplingParams

from .fakes import FakeModel, plain_greedy

G = SamplingParams()
RNG = np.random.default_rng(0)

#: a source "file" where the name 50 occurs three times between distinct tokens
SOURCE = [1, 2, 3, 50, 4, 5, 6, 7, 50, 8, 9, 10, 11, 50, 12, 13, 14, 15]
#: the answer: the same file with 50 renamed to 60
ANSWER = [60 if t == 50 else t for t in SOURCE]
SEP = [99, 98]  # between the prompt's file and the answer


def walk(d: NgramDrafter, prompt: list[int], answer: list[int], k: int = 8) -> list[list[int]]:
    """What the drafter proposes at every position of `answer`, one committed token at a time (as
    plain rounds would commit them)."""
    out = []
    for i in range(len(answer)):
        ctx = prompt + answer[:i]
        out.append(d.propose(ctx, k, G, RNG).tokens if d.route(ctx) is not None else [])
    return out


def test_a_rename_is_learned_and_drafted_where_the_source_repeats_it():
    d = NgramDrafter()
    prompt = SOURCE + SEP
    drafts = walk(d, prompt, ANSWER)
    # after the answer's first `60 4 5` the lookup finds its place again and learns 50 -> 60
    assert [(r.source, r.output) for r in d._copy.rules] == [((50,), (60,))]
    # before the second occurrence (answer position 7 writes 7, then 60) the draft already renames
    assert drafts[7][:3] == [7, 60, 8]
    # and before the third, having been right once
    assert drafts[12][:3] == [11, 60, 12]
    assert d._copy.rules[0].score >= 1


def test_without_edit_learning_the_old_name_is_drafted():
    d = NgramDrafter(learn_edits=False)
    drafts = walk(d, SOURCE + SEP, ANSWER)
    assert drafts[7][:3] == [7, 50, 8]
    assert d._copy.rules == []


def test_follow_false_is_a_fresh_lookup_every_round():
    a, b = NgramDrafter(follow=False), NgramDrafter(learn_edits=False)
    answer = SOURCE[:12]  # a pure copy: following and looking up agree
    assert walk(a, SOURCE + SEP, answer) == walk(b, SOURCE + SEP, answer)


def test_a_rule_that_drafts_a_wrong_token_is_dropped_and_the_plain_copy_followed():
    # the answer renames the first occurrence only: the rule learned there is wrong at the second
    answer = [*SOURCE[:3], 60, *SOURCE[4:]]
    d = NgramDrafter()
    drafts = walk(d, SOURCE + SEP, answer)
    assert drafts[7][:2] == [7, 60]  # the rule's guess
    assert d._copy.rules == []  # wrong once with no success before: dropped
    # the plain copy was followed on at the unwanted rule: the next drafts copy the source again
    assert drafts[9][:3] == SOURCE[9:12]


def test_a_dropped_rule_is_learned_again_only_after_more_sightings():
    f = CopyFollower()
    f._learn((50,), (60,))
    f.rules[0].score = -2
    f._prune()
    assert f.rules == []
    for _ in range(RELEARN_AFTER - 1):
        f._learn((50,), (60,))
        assert f.rules == []
    f._learn((50,), (60,))
    assert [(r.source, r.output) for r in f.rules] == [((50,), (60,))]


def test_a_new_context_starts_over():
    f = CopyFollower()
    ctx = [1, 2, 3, 4, 1, 2]
    f.start(ctx, 2, 2)
    assert f.draft(ctx, 2) == [3, 4]
    assert f.follow([7, 7, 7, 7, 7, 7, 7]) is None  # not an extension of what was followed
    assert f.draft([7, 7, 7, 7, 7, 7, 7], 2) == []


#: a file long enough that its copy has held for GUESS_AFTER tokens before the edit at EDIT
LONG = list(range(1, 41))
EDIT = GUESS_AFTER + 4


def routes_and_drafts(d: NgramDrafter, prompt: list[int], answer: list[int], k: int = 6):
    out = []
    for i in range(len(answer)):
        ctx = prompt + answer[:i]
        route = d.route(ctx)
        out.append((route, d.propose(ctx, k, G, RNG).tokens if route is not None else []))
    return out


def test_after_a_one_token_edit_the_copy_goes_on_from_the_next_source_token():
    answer = [*LONG[:EDIT], 77, *LONG[EDIT + 1 :]]  # one token replaced, once: nothing to learn from
    seen = routes_and_drafts(NgramDrafter(), LONG + SEP, answer)
    # right after the edit no n-gram of the new text is in the source; the guess drafts on after it
    route, draft = seen[EDIT + 1]
    assert route == "resync" and draft == LONG[EDIT + 1 : EDIT + 7]
    # one agreeing token confirms it: the copy holds (a short run again) and the edit is a rule
    route, draft = seen[EDIT + 2]
    assert route == f"match {RESYNC_RUN}+" and draft == LONG[EDIT + 2 : EDIT + 8]
    d = NgramDrafter()
    routes_and_drafts(d, LONG + SEP, answer[: EDIT + 3])
    assert [(r.source, r.output) for r in d._copy.rules] == [((LONG[EDIT],), (77,))]
    # without the guess those rounds had nothing to draft
    plain = routes_and_drafts(NgramDrafter(resync=False), LONG + SEP, answer)
    assert plain[EDIT + 1] == (None, []) and plain[EDIT + 2] == (None, [])


def test_a_wrong_guess_gives_way_to_the_lookup():
    # two tokens inserted, not one replaced: the guess is dropped at the second and nothing learned
    answer = [*LONG[:EDIT], 77, 78, *LONG[EDIT:]]
    d = NgramDrafter()
    seen = routes_and_drafts(d, LONG + SEP, answer)
    assert seen[EDIT + 1][0] == "resync"
    assert seen[EDIT + 2] == (None, [])  # 77 78: no guess twice, no n-gram match
    assert d._copy.rules == []
    # once two source tokens are written again the lookup finds the copy and it is followed
    route, draft = seen[EDIT + 4]
    assert route is not None and draft == LONG[EDIT + 2 : EDIT + 8]


def test_a_short_match_that_parts_is_no_copy_to_guess_on():
    answer = [*LONG[: GUESS_AFTER - 4], 77, *LONG[GUESS_AFTER - 3 :]]
    seen = routes_and_drafts(NgramDrafter(), LONG + SEP, answer)
    assert seen[GUESS_AFTER - 3] == (None, [])


class RenameTarget(FakeModel):
    """A target whose greedy continuation of SOURCE + SEP is ANSWER (the rename), keyed by the last
    two tokens; a random row elsewhere."""

    def __init__(self) -> None:
        super().__init__(128, seed=5)
        seq = SOURCE + SEP + ANSWER + [0]
        self.next = {
            tuple(seq[i - 1 : i + 1]): seq[i + 1] for i in range(len(SOURCE) + len(SEP) - 1, len(seq) - 1)
        }

    def logits_after(self, context):  # type: ignore[no-untyped-def]
        nxt = self.next.get(tuple(context[-2:]))
        if nxt is None:
            return super().logits_after(context)
        row = np.zeros(self.n_vocab, dtype=np.float32)
        row[nxt] = 5.0
        return row


@settings(max_examples=40, deadline=None)
@given(ctx=st.lists(st.integers(0, 4), min_size=2, max_size=70), k=st.integers(1, 10))
def test_property_drafts_follow_an_earlier_copy_or_nothing(ctx, k):
    """Whatever was learned, a draft has at most k tokens, and with no rules it is a real earlier
    continuation (the copy rolls on through its own drafts at the present)."""
    d = NgramDrafter(max_n=4)
    for i in range(2, len(ctx)):  # grow the context one token at a time, as decoding does
        d.route(ctx[:i])
    tokens = d.propose(ctx, k, G, RNG).tokens
    assert len(tokens) <= k
    if tokens and not d._copy.rules:
        ext = [*ctx, *tokens]
        assert any(ext[s : s + len(tokens)] == tokens for s in range(len(ctx)))


def test_the_loop_with_edit_learning_is_exact_and_drafts_the_rename():
    """Drafts only ever change speed: with the follower and its rules, greedy output is plain's; and
    on a rename the learned rule makes the drafts longer than a plain copy's."""
    prompt = SOURCE + SEP
    n = len(ANSWER)
    accepted = {}
    for learn in (True, False):
        for k in (1, 3, 8):
            target = RenameTarget()
            assert plain_greedy(target, prompt, n) == ANSWER
            events = list(
                generate(target, prompt, drafters=[NgramDrafter(learn_edits=learn)], planner=FixedK(k),
                         settings=Settings(max_tokens=n))
            )  # fmt: skip
            assert [e.id for e in events if isinstance(e, Token)] == ANSWER
            accepted[learn, k] = events[-1].stats.accepted
    assert accepted[True, 8] > accepted[False, 8]
    # the random-row case: any target, any k
    target = FakeModel(40, seed=3)
    other = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]
    for k in (1, 3, 8):
        events = list(
            generate(
                target, other, drafters=[NgramDrafter()], planner=FixedK(k), settings=Settings(max_tokens=60)
            )
        )
        assert [e.id for e in events if isinstance(e, Token)] == plain_greedy(target, other, 60)
