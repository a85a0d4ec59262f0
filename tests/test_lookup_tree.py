"""Prompt lookup's token trees (decoding/lookup_tree.py): branches from other occurrences, what fits in
a round, and the loop's output with them against plain decoding's, greedy and sampling."""

from __future__ import annotations

import numpy as np
import pytest

from specchat.decoding.drafters import DraftBudget, Proposal
from specchat.decoding.lookup_tree import add_branches, branches
from specchat.decoding.ngram import NgramDrafter
from specchat.decoding.sampling import SamplingParams
from specchat.decoding.tree import fit_side, tree_batch

#: "1 2" three times before the present, followed by 7 8 9, 5 6 0 and 7 8 4: the copy follows the most
#: recent (7 8 4); 5 6 0 parts at the first token, 7 8 9 at the third
CONTEXT = [1, 2, 7, 8, 9, 3, 1, 2, 5, 6, 0, 3, 1, 2, 7, 8, 4, 3, 1, 2]
CHEAP = DraftBudget(floor=0.01, expect=(0.5,))


def test_other_occurrences_offer_the_branches_where_they_part():
    offered = branches(CONTEXT, [14, 8, 2], [7, 8, 4, 3], CHEAP, depth=3)
    assert {(b.position, tuple(b.tokens)) for b in offered} == {(0, (5, 6, 0)), (2, (9, 3, 1))}
    # the chance each is accepted: reached (0.5 a position), the copy rejected there (0.5), and its
    # share of the occurrences parting there (one of them, plus one for a token none had)
    assert [round(b.value, 4) for b in offered] == [0.25, 0.0625]


def test_branches_go_in_while_their_rows_pay():
    cheap = Proposal(tokens=[7, 8, 4, 3])
    add_branches(cheap, branches(CONTEXT, [14, 8, 2], cheap.tokens, CHEAP, 3), 4, CHEAP)
    # a deep branch of the likelier alternative, each node after its parent
    assert cheap.side == [(0, 5), (1, 6), (2, 0), (2, 9), (3, 3), (4, 1)]
    assert cheap.side_parent == [-1, 0, 1, -1, 3, 4]
    tokens, shape = tree_batch(10, cheap.tokens, cheap.side, cheap.side_parent)
    assert tokens == [10, 7, 8, 4, 3, 5, 6, 0, 9, 3, 1]
    assert shape.path_to(7) == [0, 5, 6, 7] and shape.path_to(10) == [0, 1, 2, 8, 9, 10]
    # dearer rows: only the nodes worth them (0.25, then 0.125 for its child)
    dear = Proposal(tokens=[7, 8, 4, 3])
    budget = DraftBudget(floor=0.1, expect=(0.5,))
    add_branches(dear, branches(CONTEXT, [14, 8, 2], dear.tokens, budget, 3), 4, budget)
    assert dear.side == [(0, 5), (1, 6)] and dear.side_parent == [-1, 0]
    # one branch at most: the likelier one, as deep as it pays
    narrow = Proposal(tokens=[7, 8, 4, 3])
    add_branches(narrow, branches(CONTEXT, [14, 8, 2], narrow.tokens, CHEAP, 3), 1, CHEAP)
    assert narrow.side == [(0, 5), (1, 6), (2, 0)]


def test_fit_side_keeps_whole_branches_within_the_room():
    def proposal() -> Proposal:
        side = [(0, 5), (1, 6), (2, 9), (3, 3)]
        return Proposal(tokens=[7, 8, 4, 3], side=side, side_parent=[-1, 0, -1, 2])

    cut = proposal()
    cut.tokens = cut.tokens[:2]  # the chain cut to two tokens: the branch at its third goes, child and all
    fit_side(cut, 4)
    assert cut.side == [(0, 5), (1, 6)] and cut.side_parent == [-1, 0]
    one = proposal()
    fit_side(one, 1)  # a child takes no side sequence of its own: the first branch stays whole
    assert one.side == [(0, 5), (1, 6)] and one.side_parent == [-1, 0]
    none = proposal()
    fit_side(none, 0)
    assert none.side == [] and none.side_parent == []
    # siblings of the same parent are two branches
    two = Proposal(tokens=[1, 2], side=[(0, 5), (1, 6), (1, 7)], side_parent=[-1, 0, 0])
    fit_side(two, 1)
    assert two.side == [(0, 5), (1, 6)]


def test_the_lookup_offers_branches_only_with_a_budget_and_a_width():
    d = NgramDrafter(max_n=2, tree_width=2)
    rng = np.random.default_rng(0)
    with_budget = d.propose(CONTEXT, 4, SamplingParams(), rng, budget=CHEAP)
    assert with_budget.tokens == [7, 8, 4, 3]
    assert with_budget.side[:3] == [(0, 5), (1, 6), (2, 0)] and with_budget.side_parent[:3] == [-1, 0, 1]
    assert not d.propose(CONTEXT, 4, SamplingParams(), rng).side  # -k N: chains
    chain_only = NgramDrafter(max_n=2).propose(CONTEXT, 4, SamplingParams(), rng, budget=CHEAP)
    assert chain_only.tokens == [7, 8, 4, 3] and not chain_only.side


class _Priced:
    """FixedK with a budget, as the auto planner gives a lookup one: every row worth a 0.02 chance."""

    def __init__(self, k: int) -> None:
        from specchat.decoding.loop import FixedK

        self._fixed = FixedK(k)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._fixed, name)

    def draft_budget(self, plan):  # type: ignore[no-untyped-def]
        return DraftBudget(floor=0.02, expect=(0.6,))


def _run(target, drafter, prompt, n, params, seed):  # type: ignore[no-untyped-def]
    from specchat.decoding.events import Done, Round, Token
    from specchat.decoding.loop import Settings, generate

    events = list(
        generate(
            target,
            prompt,
            drafters=[drafter],
            planner=_Priced(6),
            settings=Settings(max_tokens=n, params=params),
            rng=np.random.default_rng(seed),
        )
    )
    assert isinstance(events[-1], Done)
    return [e.id for e in events if isinstance(e, Token)], [e for e in events if isinstance(e, Round)]


def test_greedy_lookup_trees_give_plain_decodings_tokens():
    from .fakes import FakeModel, plain_greedy

    taken, deepest = 0, 0
    for seed in range(1, 9):
        # the next token depends on the last three: the same pair recurs with different continuations
        target = FakeModel(seed=seed, n_vocab=6, order=3, sharpness=3.0, tree_branches=4)
        prompt = [1, 2, 3, 4, 1, 2, 5, 4, 1, 2]
        drafter = NgramDrafter(max_n=2, tree_width=3)
        tokens, rounds = _run(target, drafter, prompt, 150, SamplingParams(), seed)
        assert tokens == plain_greedy(target, prompt, 150), seed
        taken += sum(r.side_accepted for r in rounds)
        deepest = max(deepest, *(r.side_accepted for r in rounds))
    assert taken > 0, "no branch was ever taken"
    assert deepest >= 2, "no branch was taken past its first token"


def test_lookup_tree_sampling_matches_target_distribution():
    """Copied tokens are one-hot drafts: the first two tokens over many seeded tree runs are
    distributed as the target's own."""

    from .fakes import FakeModel, first_two

    vocab = 3
    target = FakeModel(seed=21, n_vocab=vocab, order=3, sharpness=1.0, tree_branches=4)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    # "1 2" followed by 0, 1 and 2 before: every next token has a branch
    prompt = [1, 2, 0, 1, 1, 2, 1, 0, 1, 2, 2, 0, 1, 2]
    exact = first_two(target, prompt, params)
    counts = np.zeros((vocab, vocab))
    rng = np.random.default_rng(7)
    side_accepted = 0
    for _ in range(4000):
        drafter = NgramDrafter(max_n=2, tree_width=3, follow=False)
        tokens, rounds = _run(target, drafter, prompt, 2, params, int(rng.integers(2**31)))
        counts[tokens[0], tokens[1]] += 1
        side_accepted += sum(r.side_accepted for r in rounds)
    tv = 0.5 * float(np.abs(counts.ravel() / counts.sum() - exact.ravel()).sum())
    # 9 cells, 4000 draws: sampling noise alone gives TV around 0.02; a biased rule gives far more
    assert tv < 0.04, tv
    assert side_accepted > 200


def test_a_round_says_whether_a_branch_stood_where_the_copy_was_turned_down():
    from specchat.decoding.tree import verify_tree

    from .fakes import FakeModel

    target = FakeModel(seed=4, n_vocab=8, order=2, tree_branches=4)
    context = [1, 2, 3]
    target.decode(context[:-1], [])
    want = int(np.argmax(target.logits_after(context)))
    wrong, other = (want + 1) % 8, (want + 2) % 8
    rng = np.random.default_rng(0)
    beside = Proposal(tokens=[wrong, 5], side=[(0, want)], side_parent=[-1])
    done = verify_tree(target, context[-1], beside, SamplingParams(), rng)
    assert done.tried and done.path == [3] and done.on_chain == 0
    target.truncate(len(context) - 1)
    missed = Proposal(tokens=[wrong, 5], side=[(0, other)], side_parent=[-1])
    assert verify_tree(target, context[-1], missed, SamplingParams(), rng).tried
    target.truncate(len(context) - 1)
    elsewhere = Proposal(tokens=[wrong, 5], side=[(1, other)], side_parent=[-1])
    assert not verify_tree(target, context[-1], elsewhere, SamplingParams(), rng).tried


def test_the_planner_learns_how_often_a_lookups_branch_is_taken():
    from specchat.decoding.calibration import Costs
    from specchat.decoding.events import Round
    from specchat.decoding.planner import AutoPlanner

    planner = AutoPlanner(Costs([0.01 * (1 + 0.1 * n) for n in range(17)], [0.0], exact_n=9), [(2.0, 2.0)],
                          model_free=[True])  # fmt: skip
    plan = planner.plan(8, ["any"])
    budget = planner.draft_budget(plan)
    assert budget is not None and budget.branch == pytest.approx(0.425)
    for _ in range(10):
        rnd = Round("any", plan.k, plan.k, 0, 1, 0.02, route="any", side_nodes=1, side_tried=True)
        planner.observe(rnd, plan, budget)
    missed = planner.draft_budget(plan)
    assert missed is not None and missed.branch < 0.15
    # fewer branches are worth their rows once they are seldom taken
    offered = branches(CONTEXT, [14, 8, 2], [7, 8, 4, 3], missed, depth=3)
    assert all(b.value < 0.25 * 0.3 for b in offered)
