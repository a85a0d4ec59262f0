"""Token trees (decoding/tree.py): the engine's one-batch tree verify, the tree walk, and the loop's
output with tree rounds against plain decoding's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specchat.decoding.tree import TreeShape

from .tiny_models import write_tiny_llama

#: root, a three-token main chain, a sibling of its first token, a sibling of its second with a child
SHAPE = TreeShape((-1, 0, 1, 2, 0, 1, 5))
TOKENS = [0, 50, 51, 52, 60, 61, 62]


def test_shape_branches_and_paths():
    assert SHAPE.chain == 4
    assert SHAPE.n_branches == 3
    assert SHAPE.depth == (0, 1, 2, 3, 1, 2, 3)
    # a node's first branch runs through it, and its ancestors carry every branch it does
    for node, branches in enumerate(SHAPE.branches):
        parent = SHAPE.parents[node]
        if parent >= 0:
            assert set(branches) <= set(SHAPE.branches[parent])
    assert SHAPE.path_to(6) == [0, 1, 5, 6]
    assert TreeShape.of_chain(3).n_branches == 1
    with pytest.raises(ValueError):
        TreeShape((-1, 2, 0))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tree") / "t.gguf", seed=1)


def _one_token_rows(path: Path, context: list[int], steps: list[int]) -> np.ndarray:
    """The logits after each of `steps`, decoded one token at a time after `context`."""
    from specchat.llama.engine import LlamaModel, LoadOptions

    with LlamaModel(path, LoadOptions(n_ctx=256, gpu_layers=0)) as ref:
        ref.decode(context, [])
        return np.stack([ref.decode([t], [0])[0].copy() for t in steps])


def test_tree_rows_equal_one_token_decoding_and_keep_path_leaves_the_path(tiny_gguf: Path):
    from specchat.llama.engine import LlamaModel, LoadOptions

    context = list(range(10, 39))
    tokens = [39, *TOKENS[1:]]
    with LlamaModel(tiny_gguf, LoadOptions(n_ctx=256, gpu_layers=0, tree_branches=4)) as model:
        model.decode(context, [])
        rows = model.decode_tree(tokens, SHAPE, range(len(tokens))).copy()
        for node in range(len(tokens)):
            steps = [tokens[j] for j in SHAPE.path_to(node)]
            assert np.array_equal(rows[node], _one_token_rows(tiny_gguf, context, steps)[-1]), node
        # the path through the side branch: its nodes are left to decode in front of the next batch
        model.keep_path(SHAPE, [0, 1, 5, 6])
        assert list(model.tokens) == [*context, 39, 50, 61, 62]
        after = model.decode([70, 71], [0, 1]).copy()
        want = _one_token_rows(tiny_gguf, context, [39, 50, 61, 62, 70, 71])[-2:]
        assert np.array_equal(after, want)
        # and along the main chain, cut back as a chain round is
        model.truncate(len(context))
        model.decode_tree(tokens, SHAPE, [0])
        model.keep_path(SHAPE, [0, 1, 2])
        model.truncate(len(context) + 2)
        assert list(model.tokens) == [*context, 39, 50]
        nxt = model.decode([51], [0]).copy()
        assert np.array_equal(nxt[0], _one_token_rows(tiny_gguf, context, [39, 50, 51])[-1])


def test_a_tree_wider_than_the_context_allows_is_refused(tiny_gguf: Path):
    from specchat.errors import EngineError
    from specchat.llama.engine import LlamaModel, LoadOptions

    with LlamaModel(tiny_gguf, LoadOptions(n_ctx=256, gpu_layers=0, tree_branches=1)) as model:
        model.decode([1, 2, 3], [])
        with pytest.raises(EngineError):
            model.decode_tree(TOKENS, SHAPE, [0])
        assert list(model.tokens) == [1, 2, 3]


# --- the loop with tree rounds (fake models) ----------------------------------------------------------


def _generate(target, drafter, *, n, params, seed, k=4):
    from specchat.decoding.events import Done, Round, Token
    from specchat.decoding.loop import FixedK, Settings, generate

    events = list(
        generate(
            target,
            [1, 2, 3, 4],
            drafters=[drafter],
            planner=FixedK(k),
            settings=Settings(max_tokens=n, params=params),
            rng=np.random.default_rng(seed),
        )
    )
    done = events[-1]
    assert isinstance(done, Done)
    return (
        [e for e in events if isinstance(e, Token)],
        [e for e in events if isinstance(e, Round)],
        done.stats,
    )


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_greedy_tree_rounds_give_plain_decodings_tokens(seed: int):
    from specchat.decoding.drafters import ModelDrafter
    from specchat.decoding.sampling import SamplingParams

    from .fakes import FakeModel, plain_greedy

    target = FakeModel(seed=seed, n_vocab=16, tree_branches=4, sharpness=1.5)
    # the target's rows plus noise: the draft's first choice is often right, and where it is not
    # the target's token is often its second
    table = target.table + np.random.default_rng(seed + 100).standard_normal(target.table.shape) * 1.0
    draft = FakeModel(seed=seed, n_vocab=16, table=table)
    drafter = ModelDrafter(draft, p_min=0.0, tree_width=3)
    tokens, rounds, stats = _generate(target, drafter, n=80, params=SamplingParams(), seed=seed)
    assert [t.id for t in tokens] == plain_greedy(target, [1, 2, 3, 4], 80)
    assert target.tree_calls, "no round verified a tree"
    assert sum(r.side_accepted for r in rounds) > 0, "no side node was ever accepted"
    assert sum(r.side_nodes for r in rounds) > sum(r.side_accepted for r in rounds)
    assert stats.generated_tokens == 80
    # the cache holds exactly what was committed but the last token
    assert list(target.tokens) == [1, 2, 3, 4, *[t.id for t in tokens]][:-1]


def test_a_target_without_tree_room_gets_chains():
    from specchat.decoding.drafters import ModelDrafter
    from specchat.decoding.sampling import SamplingParams

    from .fakes import FakeModel, plain_greedy

    target = FakeModel(seed=2, n_vocab=16)
    draft = FakeModel(seed=9, n_vocab=16)
    tokens, rounds, _ = _generate(
        target, ModelDrafter(draft, p_min=0.0, tree_width=3), n=30, params=SamplingParams(), seed=0
    )
    assert [t.id for t in tokens] == plain_greedy(target, [1, 2, 3, 4], 30)
    assert not target.tree_calls and all(r.side_nodes == 0 for r in rounds)


def test_tree_sampling_matches_target_distribution():
    """The joint distribution of the first two tokens, over many seeded runs whose rounds are trees
    (a draft deliberately different from the target, two side nodes per round), equals the target's:
    multi-candidate rejection sampling keeps the output exact in distribution."""

    from specchat.decoding.drafters import ModelDrafter
    from specchat.decoding.sampling import SamplingParams

    from .fakes import FakeModel, first_two

    vocab = 4
    target = FakeModel(seed=11, n_vocab=vocab, sharpness=1.0, tree_branches=4)
    draft = FakeModel(seed=12, n_vocab=vocab, sharpness=1.0)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    prompt = [1, 2, 3, 4]
    exact = first_two(target, prompt, params)
    counts = np.zeros((vocab, vocab))
    rng = np.random.default_rng(5)
    drafter = ModelDrafter(draft, p_min=0.0, tree_width=2)
    side_accepted = 0
    for _ in range(6000):
        tokens, rounds, _ = _generate(target, drafter, n=2, params=params, seed=int(rng.integers(2**31)), k=2)
        counts[tokens[0].id, tokens[1].id] += 1
        side_accepted += sum(r.side_accepted for r in rounds)
    tv = 0.5 * float(np.abs(counts.ravel() / counts.sum() - exact.ravel()).sum())
    # 16 cells, 6000 draws: sampling noise alone gives TV around 0.02; a biased rule gives far more
    assert tv < 0.04, tv
    assert len(target.tree_calls) >= 6000 and side_accepted > 300


def test_multi_candidate_rule_alone_is_exact():
    """One tree level, many draws: the committed token is distributed as p, whatever q is."""
    from specchat.decoding.sampling import SamplingParams, sample
    from specchat.decoding.tree import TreeShape, judge_tree

    rng = np.random.default_rng(0)
    p = np.array([0.45, 0.25, 0.2, 0.1, 0.0])
    q = np.array([0.1, 0.5, 0.0, 0.2, 0.2])
    logits = np.log(np.maximum(p, 1e-300))
    shape = TreeShape((-1, 0, 0, 0))
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    counts = np.zeros(5)
    for _ in range(40_000):
        first = sample(q, rng)
        rest = q.copy()
        rest[first] = 0.0
        second = sample(rest / rest.sum(), rng)
        rest[second] = 0.0
        third = sample(rest / rest.sum(), rng)
        tokens = [0, first, second, third]
        rows = np.stack([logits] * 4)
        verdict = judge_tree(rows, tokens, shape, params, rng, 5, [None, q, q, q])
        counts[verdict.new[0]] += 1
    assert counts[4] == 0
    assert 0.5 * float(np.abs(counts / counts.sum() - p).sum()) < 0.015


def test_side_nodes_go_where_they_are_worth_their_verify_row():
    from specchat.decoding.drafters import Alternative, DraftBudget, Proposal, pick_side

    alts = [
        Alternative(0, 7, 0.05),
        Alternative(1, 8, 0.30),
        Alternative(2, 9, 0.20),
        Alternative(3, 5, 0.12),
    ]
    # no budget (-k N): the `width` most valuable, in position order
    fixed = Proposal(tokens=[1, 2, 3, 4])
    pick_side(fixed, alts, 2, None)
    assert fixed.side == [(1, 8), (2, 9)]
    # a flat verify curve prices a row low: every alternative worth more than it goes in
    cheap = Proposal(tokens=[1, 2, 3, 4])
    pick_side(cheap, alts, 4, DraftBudget(floor=0.1))
    assert cheap.side == [(1, 8), (2, 9), (3, 5)]
    # a steep one (a CPU): only the alternative likeliest to be the target's token, or none
    dear = Proposal(tokens=[1, 2, 3, 4])
    pick_side(dear, alts, 4, DraftBudget(floor=0.25))
    assert dear.side == [(1, 8)]
    none = Proposal(tokens=[1, 2, 3, 4])
    pick_side(none, alts, 4, DraftBudget(floor=0.5))
    assert none.side == []


def test_the_second_choice_is_the_runner_up_with_its_share_of_the_rest():
    from specchat.decoding.drafters import second_choice

    logits = np.log(np.array([0.6, 0.1, 0.25, 0.05])) + 3.0
    alt = second_choice(logits, 0, 0.6, 3, 0.5, 0.8, None, np.random.default_rng(0))
    assert alt is not None and alt.token == 2 and alt.position == 3
    # reached with 0.5, first rejected with 0.2, then 0.25 of the 0.4 left
    assert alt.value == pytest.approx(0.5 * 0.2 * 0.25 / 0.4)


@pytest.mark.parametrize("stop_after", [1, 5, 17])
def test_tree_rounds_leave_the_caches_consistent_at_an_end_of_generation_and_an_early_close(stop_after: int):
    from specchat.decoding.drafters import ModelDrafter
    from specchat.decoding.events import Token
    from specchat.decoding.loop import FixedK, Settings, generate
    from specchat.decoding.model import common_prefix_len
    from specchat.decoding.sampling import SamplingParams

    from .fakes import FakeModel, plain_greedy

    target = FakeModel(seed=7, n_vocab=16, tree_branches=4, sharpness=1.5, eog=(3,))
    table = target.table + np.random.default_rng(8).standard_normal(target.table.shape)
    draft = FakeModel(seed=7, n_vocab=16, table=table, eog=(3,))
    drafter = ModelDrafter(draft, p_min=0.0, tree_width=3)
    prompt = [1, 2, 4, 5]
    events = generate(
        target,
        prompt,
        drafters=[drafter],
        planner=FixedK(4),
        settings=Settings(max_tokens=60, params=SamplingParams()),
    )
    got = []
    for ev in events:
        if isinstance(ev, Token):
            got.append(ev.id)
            if len(got) == stop_after:
                events.close()
                break
    want = plain_greedy(target, prompt, 60)
    assert got == want[: len(got)]
    ended = len(got) < stop_after  # an end-of-generation token, committed but not yielded
    committed = [*prompt, *got, *([3] if ended else [])]
    assert len(target.tokens) <= len(committed) - 1
    assert common_prefix_len(target.tokens, committed) == len(target.tokens)
    assert common_prefix_len(draft.tokens, committed) == len(draft.tokens)
    # the next answer starts from what the caches hold, as a chat turn does
    more = [e.id for e in generate(target, [*committed, 6], drafters=[drafter], planner=FixedK(4),
                                   settings=Settings(max_tokens=20)) if isinstance(e, Token)]  # fmt: skip
    assert more == [t for t in plain_greedy(target, [*committed, 6], 20) if not target.is_eog(t)]
