"""The replay tools in tests/perf (replay_draft, replay_curves, replay_hardware): model-free checks.

The replayed figures in docs/performance.md are only as good as these pieces: a replayed draft must
keep exactly the tokens a real one would, no policy may beat the hindsight bound, and every curve
must name its source."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

PERF = Path(__file__).resolve().parent / "perf"
sys.path.insert(0, str(PERF))

from replay_curves import CURVES_DIR, extend, published  # noqa: E402
from replay_draft import DraftTrace, ReplayDraftModel  # noqa: E402
from replay_hardware import FIXED_K, Replayer  # noqa: E402

from specchat.decoding.drafters import DraftBudget  # noqa: E402
from specchat.decoding.loop import FixedK  # noqa: E402
from specchat.decoding.sampling import SamplingParams  # noqa: E402


def _case(seed: int = 0) -> tuple[tuple[list[int], list[int], list[float]], DraftTrace]:
    rnd = random.Random(seed)
    prompt = [rnd.randrange(50, 400) for _ in range(200)]
    output = prompt[40:90] + [rnd.randrange(50, 400) for _ in range(60)]  # a copy, then new text
    trace = DraftTrace([rnd.random() < 0.75 for _ in output], [rnd.random() for _ in output])
    return (prompt, output, [1e9] * len(output)), trace


def test_a_replayed_draft_is_right_up_to_its_first_miss_and_wrong_after() -> None:
    output = [10, 11, 12, 13, 14]
    trace = DraftTrace([True, True, False, True, True], [0.9, 0.8, 0.7, 0.95, 0.6])
    batch = [1.0, 1.2, 1.4]
    d = ReplayDraftModel(3, output, trace, 100, 0.0, draft=0.5, batch=batch)
    d.prepare([1, 2])
    p = d.propose([1, 2, 3], 5, SamplingParams(), np.random.default_rng(0))
    assert p.tokens[:2] == [10, 11] and p.tokens[2] != 12
    assert all(t != o for t, o in zip(p.tokens[3:], output[3:], strict=True))  # nothing after a miss is kept
    assert p.confidence == trace.conf
    # billed as ModelDrafter spends it: a batch over the one token it lags by (giving the first
    # draft's distribution), then a decode after each draft but the k-th
    assert p.catch_up_seconds == pytest.approx(0.5 * 1.0) and p.seconds == pytest.approx(0.5 + 4 * 0.5)
    # p-min and the budget stop it as ModelDrafter would
    d2 = ReplayDraftModel(3, output, trace, 100, 0.75, draft=0.5, batch=batch)
    d2.prepare([1])
    stopped = d2.propose([1, 2, 3], 5, SamplingParams(), np.random.default_rng(0))
    assert stopped.tokens == [10, 11] and stopped.seconds == pytest.approx(0.5 * 1.2 + 2 * 0.5)
    budget = DraftBudget(floor=0.6)
    assert len(d.propose([1, 2, 3], 5, SamplingParams(), np.random.default_rng(0), budget=budget).tokens) == 2


def test_its_lag_follows_the_cache_a_real_draft_model_keeps() -> None:
    output = list(range(10, 20))
    d = ReplayDraftModel(2, output, DraftTrace([True] * 10, [0.9] * 10), 100, 0.0, 0.5, [1.0])
    d.prepare([1])
    assert d.lag([1, 2]) == 1
    d.propose([1, 2], 3, SamplingParams(), np.random.default_rng(0))  # cache: context + 2 drafts
    assert d.lag([1, 2, 10, 11, 12, 13]) == 2  # all accepted + the bonus: the last draft and the bonus


@pytest.mark.parametrize("curve", published(), ids=lambda c: c.name)
def test_no_policy_beats_the_hindsight_bound(curve) -> None:  # type: ignore[no-untyped-def]
    case, trace = _case()
    r = Replayer(case, trace, 0.0, 49)
    bound = r.bound(curve, case[0], case[1])
    assert r.auto(curve, 0) <= bound * 1.0001
    for k in FIXED_K:
        assert r.run(curve, FixedK(k), [r.draft(curve, 0.0)], margin=False) <= bound * 1.0001


def test_every_curve_file_names_its_sources_and_is_increasing() -> None:
    for path in CURVES_DIR.glob("*.json"):
        doc = json.loads(path.read_text())
        assert doc["sources"] and doc["notes"], path
    for c in published():
        assert all(b >= a * 0.99 for a, b in zip(c.verify, c.verify[1:], strict=False)), c.name
        assert c.draft > 0 and c.catch_up > 0


def test_extend_interpolates_and_continues_the_upper_slope() -> None:
    v = extend({1: 1.0, 4: 2.5, 8: 3.0}, 12)
    assert v[:4] == pytest.approx([1.0, 1.5, 2.0, 2.5])
    assert v[8] == pytest.approx(3.0 + 0.5 / 4)  # V(9): the slope from 4 to 8


def test_the_replayed_draft_stops_after_a_first_token_below_the_floor_as_model_drafter_does() -> None:
    output = [10, 11, 12, 13]
    trace = DraftTrace([True] * 4, [0.3, 0.9, 0.9, 0.9])
    d = ReplayDraftModel(3, output, trace, 100, 0.0, draft=0.5, batch=[1.0, 1.2])
    d.prepare([1, 2])
    ctx = [1, 2, 3]
    assert (
        d.propose(ctx, 4, SamplingParams(), np.random.default_rng(0), budget=DraftBudget(floor=0.5)).tokens
        == []
    )
    one = d.propose(
        ctx,
        4,
        SamplingParams(),
        np.random.default_rng(0),
        budget=DraftBudget(floor=0.5, floors=(0.2,), ahead=(0.5, 0.5)),
    )
    assert one.tokens == [10]
    assert one.seconds == pytest.approx(one.catch_up_seconds)  # no decode after it, as ModelDrafter


def test_replayed_trees_commit_the_answer_and_lift_auto_where_rows_are_cheap() -> None:
    """A draft whose runner-up is the answer's token wherever its first choice misses: replayed with
    token trees under a flat (GPU) curve, auto yields at least what chains do, and the replayed
    target's committed text is the answer's whichever branch each round took."""
    rnd = random.Random(3)
    prompt = [rnd.randrange(50, 400) for _ in range(40)]
    output = [rnd.randrange(50, 400) for _ in range(120)]
    right = [rnd.random() < 0.6 for _ in output]
    trace = DraftTrace(right, [0.5] * len(output), [not r for r in right], [0.9] * len(output))
    curve = next(c for c in published() if c.verify[15] / c.verify[0] < 3.0)
    r = Replayer((prompt, output, [1e9] * len(output)), trace, 0.0, 49)
    chains = r.auto(curve, 0)
    trees = r.auto(curve, 0, tree_width=4)
    assert trees > chains * 1.02
    # and a replayed draft proposes side nodes only on the true path, each the answer's token there
    d = r.draft(curve, 0.0, tree_width=4)
    d.prepare(r.p)
    p = d.propose(r.p, 6, SamplingParams(), np.random.default_rng(0))
    for position, token in p.side:
        hit = all(right[:position]) and not right[position]
        assert (token == r.o[position]) == hit
