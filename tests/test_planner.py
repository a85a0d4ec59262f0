"""Cost-model auto-tuning: the decision rule, online learning, calibration and its cache."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from specchat.decoding.calibration import Costs, calibrate, measure_verify
from specchat.decoding.events import Round
from specchat.decoding.loop import NO_DRAFT, Plan
from specchat.decoding.planner import AutoPlanner, best_k, expected_tokens

from .fakes import FakeModel

# measured on the 2-core CI machine for the default pair: V(1..9) in seconds
CPU_V = [0.035, 0.051, 0.065, 0.077, 0.095, 0.114, 0.138, 0.162, 0.180]
GPU_V = [0.010] * 9  # a verify batch costs what one token costs


def round_value(rates: list[float], tie: float) -> tuple[float, float]:
    """The per-k definition best_k accumulates in one pass: (expected tokens, expected probability
    of a near-tie stop) for one round whose rows each fall within the tie margin with probability
    `tie`.

    Every row reached and not tied yields one token (an accepted draft, a correction or the bonus);
    a tied row yields nothing and hands its position to a one-token round. So with β = 1 − tie the
    round is a walk with acceptance β·α_i, and E = β · expected_tokens(β·α)."""
    if tie <= 0.0:
        return expected_tokens(rates), 0.0
    beta = 1.0 - tie
    reach, e, p_tie = 1.0, 0.0, 0.0
    for r in [*rates, 0.0]:  # the last row (bonus) is reached like the others, then the walk ends
        p_tie += reach * tie
        e += reach * beta
        reach *= beta * r
    return e, p_tie


def replay_rows(rates: list[float], free_back: int | None) -> float:
    """Expected tokens a recurrent target replays after a round of len(rates) drafts, by enumerating
    the rejections: exactly `a` accepted (then the next one rejected) cuts the batch back k - a
    tokens; past `free_back` (its snapshots) it goes back to the state before the batch, and the
    a + 1 tokens kept are decoded again."""
    if free_back is None:
        return 0.0
    k, out = len(rates), 0.0
    for a in range(k):
        p = float(np.prod(rates[:a])) * (1.0 - rates[a])
        if k - a > free_back:
            out += p * (a + 1)
    return out


def test_best_k_in_one_pass_equals_round_value_per_k():
    """best_k accumulates every prefix's round_value in one pass; it must choose exactly what the
    per-k definition (round_value of each prefix, priced as its docstring says) chooses."""

    def by_definition(rates, v, draft_cost, *, tie, exact_n, overhead, drift_cost, free_back):
        best, best_speed = 0, 1.0 / v[0]
        for k in range(1, len(rates) + 1):
            inexact = k + 1 > exact_n
            e, p_tie = round_value(rates[:k], tie if inexact else 0.0)
            drift = e * drift_cost if inexact else 0.0
            replay = replay_rows(rates[:k], free_back) * (v[k] - v[0]) / k
            speed = (e + p_tie) / (overhead + k * draft_cost + v[k] + p_tie * v[0] + drift + replay)
            if speed > best_speed:
                best, best_speed = k, speed
        return best, best_speed

    rng = np.random.default_rng(7)
    for case in range(2000):
        n = int(rng.integers(1, 49))
        rates = [1.0] * n if case % 3 == 0 else list(rng.uniform(0.0, 1.0, n))
        v = list(np.cumsum(rng.uniform(0.001, 0.03, n + 1)))
        kw = {
            "tie": float(rng.uniform(0.0, 0.6)) if case % 2 else 0.0,
            "exact_n": int(rng.integers(0, 6)),
            "overhead": float(rng.uniform(0.0, 0.05)) if case % 5 else 0.0,
            "drift_cost": float(rng.uniform(0.0, 0.01)) if case % 4 else 0.0,
            "free_back": int(rng.integers(0, 17)) if case % 7 else None,
        }
        draft_cost = float(rng.uniform(0.0, 0.02))
        assert best_k(rates, v, draft_cost, **kw) == by_definition(rates, v, draft_cost, **kw), kw


def test_expected_tokens_matches_geometric_formula():
    a = 0.7
    for k in range(6):
        assert expected_tokens([a] * k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))


def test_draft_model_never_pays_on_this_cpu_even_if_always_right():
    k, _ = best_k([1.0] * 8, CPU_V, draft_cost=0.6 * CPU_V[0])
    assert k == 0


def test_free_drafts_pay_on_cpu_when_often_right_and_gpu_drafts_go_deep():
    k_cpu, speed = best_k([0.8] * 8, CPU_V, draft_cost=0.0)
    assert k_cpu > 0 and speed > 1 / CPU_V[0]
    k_low, _ = best_k([0.3] * 8, CPU_V, draft_cost=0.0)
    assert k_low == 0
    k_gpu, _ = best_k([0.8] * 8, GPU_V, draft_cost=0.1 * GPU_V[0])
    assert k_gpu >= 4


def choice(plan: Plan) -> tuple[int | None, int]:
    """A plan's (drafter, k), without what the planner chose them from."""
    return plan.drafter, plan.k


def simulate(planner: AutoPlanner, accept_prob: list[float], rounds: int, seed: int = 0) -> list[tuple]:
    """Feed the planner rounds whose drafts are accepted with the given per-drafter probability."""
    rng = np.random.default_rng(seed)
    choices = []
    for _ in range(rounds):
        plan = planner.plan(100, ["any"] * len(accept_prob))
        which, k = choice(plan)
        choices.append((which, k))
        if which is None:
            planner.observe(Round(None, 0, 0, 0, 1, CPU_V[0]), plan)
            continue
        acc = 0
        while acc < k and rng.random() < accept_prob[which]:
            acc += 1
        planner.observe(Round("d", k, k, acc, acc + 1, planner.costs.v(k + 1), route="any"), plan)
    return choices


def test_planner_stops_drafting_with_a_useless_drafter():
    planner = AutoPlanner(
        Costs(list(CPU_V), [0.0]), [(1.0, 1.0)], model_free=[True], rng=np.random.default_rng(1)
    )
    choices = simulate(planner, [0.05], 300)
    late = choices[100:]
    assert sum(k > 0 for _, k in late) / len(late) < 0.1


def test_planner_drafts_with_a_good_free_drafter_and_prefers_the_better_one():
    planner = AutoPlanner(
        Costs(list(CPU_V), [0.0, 0.0]),
        [(1.0, 1.0), (1.0, 1.0)],
        model_free=[True, True],
        rng=np.random.default_rng(2),
    )
    choices = simulate(planner, [0.3, 0.9], 300)
    late = choices[100:]
    assert sum(w == 1 for w, _ in late) / len(late) > 0.8
    assert np.mean([k for _, k in late]) >= 2


def test_acceptance_is_learned_per_route_so_one_drafter_drafts_deep_only_where_it_is_right():
    """Routing by context: the n-gram drafter's long matches are right, its short ones are not."""
    planner = AutoPlanner(
        Costs(list(CPU_V), [0.0]), [(1.0, 1.0)], model_free=[True], rng=np.random.default_rng(4)
    )
    rng = np.random.default_rng(5)
    late: dict[str, list[int]] = {"match 16+": [], "match 2+": []}
    for i in range(600):
        route = "match 16+" if i % 2 else "match 2+"
        plan = planner.plan(100, [route])
        which, k = choice(plan)
        if i >= 200:
            late[route].append(k)
        if which is None:
            planner.observe(Round(None, 0, 0, 0, 1, CPU_V[0]), plan)
            continue
        p = 0.95 if route == "match 16+" else 0.15
        acc = 0
        while acc < k and rng.random() < p:
            acc += 1
        judged = min(acc + 1, k)
        planner.observe(Round("ngram", k, judged, acc, acc + 1, CPU_V[k], route=route, proposed=k), plan)
    assert np.mean(late["match 16+"]) >= 2
    assert np.mean([k > 0 for k in late["match 2+"]]) < 0.1


def test_a_drafter_with_nothing_to_propose_is_not_chosen():
    planner = AutoPlanner(Costs(list(GPU_V), [0.0, 0.0]), [(50.0, 1.0), (50.0, 1.0)], model_free=[True, True])
    assert choice(planner.plan(8, [None, None])) == (None, 0)
    assert planner.plan(8, [None, "model"]).drafter == 1


def test_verify_cost_is_learned_for_the_batch_that_ran_not_the_drafts_judged():
    costs = Costs(list(CPU_V), [0.0])
    planner = AutoPlanner(costs, [(1.0, 1.0)], model_free=[True])
    v2 = costs.verify[1]
    # 5 drafts sent (a batch of 6), the first rejected: the 6-row batch's time must not land on V(2)
    planner.observe(Round("ngram", 5, 1, 0, 1, 0.3, route="match 2+", proposed=5), Plan(0, 5))
    assert costs.verify[1] == v2
    assert costs.verify[5] > CPU_V[5]


def test_replay_after_a_rollback_is_booked_to_the_batch_that_ran_it():
    """A recurrent target decodes the tokens its last rollback kept in front of the next batch: a
    one-draft round carrying 3 of them ran a 5-row batch, and its time must not make V(2) look dear."""
    costs = Costs(list(CPU_V), [0.0])
    planner = AutoPlanner(costs, [(1.0, 1.0)], model_free=[True])
    v2 = costs.verify[1]
    planner.observe(Round("ngram", 1, 1, 1, 2, 0.4, route="match 2+", proposed=1, replayed=3), Plan(0, 1))
    assert costs.verify[1] == v2
    assert costs.verify[4] > CPU_V[4]


def test_drafts_past_the_targets_free_rollback_are_priced_with_their_replay():
    """On a flat curve (a GPU) a free drafter right 70% of the time drafts deep on an attention
    target; on a recurrent one whose snapshots undo 4 tokens, an early rejection in a deep batch
    replays what it kept, so the planner drafts less deep and expects less -- and exactly as on an
    attention target while the batch stays within the snapshots."""
    v = [0.010 + 0.0005 * i for i in range(17)]
    rates = [0.7] * 16
    k_any, speed_any = best_k(rates, v, draft_cost=0.0)
    k_rec, speed_rec = best_k(rates, v, draft_cost=0.0, free_back=4)
    assert k_any > 4 and k_rec < k_any and speed_rec < speed_any
    assert best_k(rates[:4], v[:5], draft_cost=0.0, free_back=4) == best_k(rates[:4], v[:5], draft_cost=0.0)
    assert best_k([1.0] * 16, v, draft_cost=0.0, free_back=0) == best_k([1.0] * 16, v, draft_cost=0.0)


def test_draft_model_is_never_tried_where_it_cannot_pay():
    planner = AutoPlanner(
        Costs(list(CPU_V), [0.6 * CPU_V[0]]), [(3.0, 2.0)], model_free=[False], rng=np.random.default_rng(3)
    )
    assert not planner.can_pay(0)
    assert all(k == 0 for _, k in simulate(planner, [0.95], 50))


def test_measure_verify_times_every_size_and_restores_the_cache():
    # (no ordering is asserted: the curve is not smoothed, since real kernels switch by batch size and
    # a larger batch can cost less; the fake's microsecond timings are noise in any case)
    m = FakeModel(n_vocab=32)
    m.decode([1, 2, 3], [])
    v = measure_verify(m, 5, reps=2)
    assert len(v) == 5 and all(t > 0 for t in v)
    assert list(m.tokens) == [1, 2, 3]


def test_calibration_is_cached(tmp_path, monkeypatch):
    from specchat.decoding import calibration

    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path))
    t, d = FakeModel(n_vocab=32), FakeModel(n_vocab=32)
    c1 = calibrate(t, [d, None], k_max=4)
    assert len(c1.verify) == 5 and c1.draft[1] == 0.0
    calls = len(t.decode_calls), len(d.decode_calls)
    # The quick live check still runs, but its verdict is pinned: the fake model decodes in
    # microseconds, and on a loaded CI machine the first calibration alone can come out slower than
    # the check (a genuine "busier then" that test_a_cached_curve_measured_on_a_busy_machine covers).
    checked: list[bool] = []
    real_check = calibration.cached_curve_is_stale

    def check_once(model, cached):
        checked.append(real_check(model, cached))
        return False

    monkeypatch.setattr(calibration, "cached_curve_is_stale", check_once)
    c2 = calibrate(t, [d, None], k_max=4)
    assert len(checked) == 1
    # only the quick live check of the cached curve ran (a filler, then V(1) and V(4): warm-up + 3 each)
    assert len(t.decode_calls) - calls[0] <= 9 and len(d.decode_calls) == calls[1]
    assert c2.verify == c1.verify
    assert (tmp_path / "calibration.json").exists()


def test_catching_up_is_timed_as_it_is_decoded_with_the_last_rows_logits_alone(tmp_path, monkeypatch):
    """A catch-up (and a prompt's prefill) asks llama.cpp for the last row's logits only; timed with
    every row's, a draft whose output layer outweighs its body was priced at many times its prefill."""
    from specchat.decoding.calibration import CATCH_UP_BATCH, measure_catch_up

    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path))
    d = FakeModel(n_vocab=32)
    d.decode([1, 2, 3], [])
    assert measure_catch_up(d) > 0 and list(d.tokens) == [1, 2, 3]
    batches = [(n, rows) for n, rows in d.decode_calls if n == CATCH_UP_BATCH]
    assert batches and all(rows == 1 for _, rows in batches)
    t = FakeModel(n_vocab=32)
    costs = calibrate(t, [d, None], k_max=4)
    assert costs.catch_up[0] > 0 and costs.catch_up[1] == 0.0


def test_a_cached_curve_measured_on_a_busy_machine_is_measured_again(tmp_path, monkeypatch):
    """V(2..9) cached at 3-4x their idle cost kept auto from drafting until the file was
    deleted. A quick live V(1)/V(4) that runs well below the cached curve re-measures it."""
    from specchat.decoding import calibration

    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path))
    # the idle machine's timings, fixed: measured live, a hiccup during the test read as a busy curve
    monkeypatch.setattr(
        calibration, "time_verify", lambda model, n, **kw: ([1e-5 * (i + 1) for i in range(n)], 0.05)
    )
    t = FakeModel(n_vocab=32)
    calibrate(t, [None], k_max=4)
    cache = json.loads((tmp_path / "calibration.json").read_text())
    key = next(k for k in cache if k.startswith("verify:"))
    cache[key] = [1.0] * 5  # seconds: far slower than the fake model's microseconds
    (tmp_path / "calibration.json").write_text(json.dumps(cache))
    costs = calibrate(t, [None], k_max=4)
    assert costs.verify[0] < 0.1 and any("busier machine" in n for n in costs.notes)
    assert json.loads((tmp_path / "calibration.json").read_text())[key][0] < 0.1
    assert calibration.cached_curve_is_stale(t, costs.verify) is False


def test_a_cached_curve_inflated_only_past_four_rows_is_measured_again(tmp_path, monkeypatch):
    """A disturbance can spare the small batches: an F16 target's curve cached with V(1) and V(4) as
    idle but V(5..9) at twice their idle cost priced every draft of 4 or more out, and live rounds
    never time a size the planner never chooses. The live check looks at V(8) too."""
    from specchat.decoding import calibration

    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path))
    idle = [0.01 * (1 + 0.25 * i) for i in range(10)]
    monkeypatch.setattr(calibration, "time_verify", lambda model, n, **kw: (idle[:n], 0.05))
    t = FakeModel(n_vocab=32)
    calibrate(t, [None], k_max=9)
    cache = json.loads((tmp_path / "calibration.json").read_text())
    key = next(k for k in cache if k.startswith("verify:"))
    cache[key] = idle[:4] + [2 * v for v in idle[4:]]
    (tmp_path / "calibration.json").write_text(json.dumps(cache))
    costs = calibrate(t, [None], k_max=9)
    assert costs.verify == idle and any("busier machine" in n for n in costs.notes)
    assert json.loads((tmp_path / "calibration.json").read_text())[key] == idle


def test_a_disturbed_calibration_is_repeated_and_never_cached(tmp_path, monkeypatch):
    from specchat.decoding import calibration

    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path))
    spreads = iter([0.9, 0.6, 0.7])
    monkeypatch.setattr(
        calibration, "time_verify", lambda model, n, **kw: ([0.01 * (i + 1) for i in range(n)], next(spreads))
    )
    costs = calibrate(FakeModel(n_vocab=32), [None], k_max=4)
    assert costs.verify[0] == 0.01
    assert sum("timings disturbed" in n for n in costs.notes) == 3 and "this run only" in costs.notes[-1]
    cache = json.loads((tmp_path / "calibration.json").read_text())
    assert not any(k.startswith("verify:") for k in cache)  # the next run measures again


def test_a_seeded_run_plans_from_the_same_curve_as_the_seeded_run_before_it(tmp_path, monkeypatch):
    """With --seed the planner's choices decide how the sampler's random stream is consumed, so two
    seeded runs must plan from the same numbers: a curve measured on a busy machine is cached anyway
    and a cached one is not re-measured (CI once saw two `--seed 7` runs of the tiny pair differ: the
    first run's noisy curve was not cached and the second measured its own)."""
    from specchat.decoding import calibration

    monkeypatch.setenv("SPECCHAT_HOME", str(tmp_path))
    spreads = iter([0.9, 0.6, 0.7])
    monkeypatch.setattr(
        calibration, "time_verify", lambda model, n, **kw: ([0.01 * (i + 1) for i in range(n)], next(spreads))
    )
    first = calibrate(FakeModel(n_vocab=32), [None], k_max=4, repeatable=True)
    cache = json.loads((tmp_path / "calibration.json").read_text())
    assert [v for k, v in cache.items() if k.startswith("verify:")] == [first.verify]
    monkeypatch.setattr(calibration, "cached_curve_is_stale", lambda model, cached: True)
    again = calibrate(FakeModel(n_vocab=32), [None], k_max=4, repeatable=True)
    assert again.verify == first.verify and not any("busier machine" in n for n in again.notes)
    quiet = iter([0.8, 0.05])
    monkeypatch.setattr(calibration, "time_verify", lambda model, n, **kw: ([0.02] * n, next(quiet)))
    assert calibrate(FakeModel(n_vocab=32), [None], k_max=4).verify == [0.02] * 5


def test_time_verify_keeps_a_kernel_dip_and_interpolates_between_sizes():
    """With repacked weights llama.cpp's CPU GEMM makes a batch of 4 cheaper than a batch of 3; a
    monotone smoothing would hide exactly the region where long drafts pay."""
    from specchat.decoding import calibration

    class Dip(FakeModel):
        def decode(self, tokens, logits_rows):
            time.sleep({1: 0.002, 2: 0.004, 3: 0.006}.get(len(tokens), 0.003 + 0.0001 * len(tokens)))
            return super().decode(tokens, logits_rows)

    v, _spread = calibration.time_verify(Dip(n_vocab=16), 20, reps=2, sizes=(1, 2, 3, 4, 8, 16, 20))
    assert len(v) == 20
    assert v[3] < v[2]  # V(4) < V(3), as measured
    assert v[7] <= v[11] <= v[15]  # V(12) interpolated between V(8) and V(16)


class BatchSensitiveModel(FakeModel):
    """Like a backend that switches matmul kernels at `switch` rows: bigger batches round differently."""

    def __init__(self, switch: int, **kw):
        super().__init__(**kw)
        self.switch = switch

    def decode(self, tokens, logits_rows):
        out = super().decode(tokens, logits_rows)
        return out + np.float32(1e-3) if len(tokens) >= self.switch else out


def test_exact_batch_finds_the_kernel_switch():
    from specchat.decoding.calibration import exact_batch

    assert exact_batch(FakeModel(n_vocab=16), 9) == 9
    m = BatchSensitiveModel(4, n_vocab=16)
    m.decode([1, 2], [])
    assert exact_batch(m, 9) == 3
    assert list(m.tokens) == [1, 2]


def test_a_build_shown_invariant_is_trusted_at_every_verify_width_once_the_target_confirms_it():
    from specchat.decoding.calibration import K_MAX, exact_rows

    exact = FakeModel(n_vocab=16)
    assert exact_rows(exact, verified=K_MAX + 1, use_cache=False) == K_MAX + 1
    # without the build's proof the row-by-row probe stops at EXACT_PROBE, as before
    assert exact_rows(exact, verified=0, use_cache=False) == 16


def test_a_target_that_parts_at_a_kernel_switch_overrules_the_builds_probe():
    """A proof from the probe models is confirmed on the loaded target (its own weights, threads and
    backend): one that parts at 9 rows (say a GPU offload, or a kernel the probe did not reach) keeps
    the row-by-row limit."""
    from specchat.decoding.calibration import K_MAX, exact_rows

    parts_at_9 = BatchSensitiveModel(9, n_vocab=16)
    assert exact_rows(parts_at_9, verified=K_MAX + 1, use_cache=False) == 8
    # parting between two checked widths (at 40) still shows at the next one (49): row by row again
    assert exact_rows(BatchSensitiveModel(40, n_vocab=16), verified=K_MAX + 1, use_cache=False) == 16


# the issue-11 machine's llama-bench curve for the target (pp-n t/s: 10.5, 15.7, 17.5, 30.4, ..., 35.4)
PP_TPS = [10.5, 15.7, 17.5, 30.4, 30.8, 31.1, 33.0, 35.4, 35.6]
REPACK_V = [n / tps for n, tps in enumerate(PP_TPS, start=1)]


def test_planner_verifies_beyond_the_exact_batch_where_the_cheap_kernel_pays():
    """Auto mode used to cap batches at the bit-exact size (3 rows): the cheap repacked region (4+)
    was thrown away. With the tie margin pricing the re-checks, long copies get long drafts."""
    costs = Costs(list(REPACK_V), [0.0], exact_n=3)
    planner = AutoPlanner(costs, [(50.0, 1.0)], model_free=[True], rng=np.random.default_rng(0))
    ks = [k for _, k in simulate(planner, [0.97], 60)]
    assert np.mean(ks[20:]) >= 4


def test_tie_risk_is_priced_into_batches_beyond_the_exact_size():
    rates = [0.95] * 8
    k_free, _ = best_k(rates, REPACK_V, 0.0, tie=0.0, exact_n=3)
    k_ties, _ = best_k(rates, REPACK_V, 0.0, tie=0.5, exact_n=3)
    assert k_free >= 3
    assert k_ties <= 2  # half the rows re-checked: only the exact batch pays
    # within the exact batch ties cost nothing: same choice either way
    assert best_k(rates[:2], REPACK_V, 0.0, tie=0.5, exact_n=3)[0] == best_k(rates[:2], REPACK_V, 0.0)[0]


def test_tie_rate_follows_the_recent_share_of_near_ties_in_every_round():
    """Prose has near-ties on a third to a half of its tokens, copied code on almost none; the rate
    is learned from every decided row, plain rounds included, and follows the text within ~30 tokens."""
    planner = AutoPlanner(Costs(list(REPACK_V), [0.0], exact_n=3), [(50.0, 1.0)], model_free=[True])
    for _ in range(40):  # prose: plain rounds, every other token a near-tie
        planner.observe(Round(None, 0, 0, 0, 1, REPACK_V[0], gap_rows=1, near_ties=_ % 2), NO_DRAFT)
    assert planner.tie_rate > 0.35
    k_prose = best_k([0.9] * 8, REPACK_V, 0.0, tie=planner.tie_rate, exact_n=3)[0]
    for _ in range(60):  # then a copy: long accepted drafts, no near-ties
        planner.observe(
            Round("ngram", 8, 8, 8, 9, REPACK_V[8], route="r", proposed=8, gap_rows=9), Plan(0, 8)
        )
    assert planner.tie_rate < 0.02
    assert k_prose <= 2 < best_k([0.9] * 8, REPACK_V, 0.0, tie=planner.tie_rate, exact_n=3)[0]


def test_drift_cost_is_learned_from_repairs_and_keeps_batches_exact_where_near_ties_are_common():
    """Tokens a non-exact batch leaves in the cache cost a re-decode when a near-tie follows; where
    that keeps happening (prose), the planner stays within the bit-exact batch; where it never does
    (a long copy), the cost fades and long batches pay."""
    rates = [0.97] * 8
    costs = Costs(list(REPACK_V), [0.0], exact_n=3)
    busy = AutoPlanner(costs, [(50.0, 1.0)], model_free=[True], explore=False, strict=True)
    for _ in range(40):  # every drifted token is re-decoded at ~V(3)/3 a token
        busy.observe(Round("ngram", 8, 8, 8, 9, REPACK_V[8], route="r", proposed=8, drifted=9,
                           repaired=9, repair_seconds=9 * REPACK_V[2] / 3), Plan(0, 8))  # fmt: skip
    quiet = AutoPlanner(costs, [(50.0, 1.0)], model_free=[True], explore=False, strict=True)
    for _ in range(40):  # no near-ties: nothing is ever re-decoded
        quiet.observe(Round("ngram", 8, 8, 8, 9, REPACK_V[8], route="r", proposed=8, drifted=9), Plan(0, 8))
    assert busy.drift_cost > 10 * quiet.drift_cost
    v = quiet._verify_curve(8)
    k_busy = best_k(rates, v, 0.0, exact_n=3, drift_cost=busy.drift_cost)[0]
    k_quiet = best_k(rates, v, 0.0, exact_n=3, drift_cost=quiet.drift_cost)[0]
    assert k_busy <= 2 < k_quiet


def test_live_rounds_rescale_the_sizes_they_have_not_run():
    """A curve calibrated on a quieter machine: once the live one-token time is known, unseen batch
    sizes follow it, and a size seen often enough uses its own measurement."""
    planner = AutoPlanner(Costs(list(CPU_V), [0.0]), [(1.0, 1.0)], model_free=[True])
    for _ in range(5):
        planner.observe(Round(None, 0, 0, 0, 1, 2 * CPU_V[0]), NO_DRAFT)
    curve = planner._verify_curve(8)
    assert curve[0] == pytest.approx(2 * CPU_V[0])
    assert curve[4] == pytest.approx(2 * CPU_V[4])
    for _ in range(5):
        planner.observe(Round("ngram", 4, 4, 4, 5, 0.5, route="r", proposed=4), Plan(0, 4))
    assert planner._verify_curve(8)[4] == pytest.approx(0.5)


def test_explain_says_why_auto_never_drafts():
    cpu = AutoPlanner(Costs(list(CPU_V), [0.6 * CPU_V[0]]), [(3.0, 2.0)], model_free=[False])
    assert "cannot beat plain decoding" in (cpu.explain(["draft"]) or "")
    gpu = AutoPlanner(Costs(list(GPU_V), [0.1 * GPU_V[0]]), [(3.0, 2.0)], model_free=[False])
    assert gpu.explain(["draft"]) is None


def test_low_draft_acceptance_suggests_a_same_family_draft():
    from specchat.decoding.advice import acceptance_advice
    from specchat.decoding.events import DrafterStats, Stats

    def stats(drafted: int, accepted: int, name: str = "smol.gguf") -> Stats:
        per = (DrafterStats(name, 9, drafted, accepted),)
        return Stats(0, 0, 0, 0.0, 1.0, drafted, accepted, 1, "eog", drafters=per)

    line = acceptance_advice(stats(100, 30), ["smol.gguf"], "qwen2.5-coder-1.5b")
    assert line is not None and "30%" in line and "specchat models --drafts-for qwen2.5-coder-1.5b" in line
    assert acceptance_advice(stats(100, 70), ["smol.gguf"], "t") is None  # a good draft: nothing to say
    assert acceptance_advice(stats(10, 0), ["smol.gguf"], "t") is None  # too few drafts to judge
    assert acceptance_advice(stats(100, 10, "ngram"), ["smol.gguf"], "t") is None  # n-gram: not a model


def test_route_priors_let_long_copies_draft_deep_from_the_first_rounds():
    """Before, every route started at 50% acceptance and auto needed ~40 rounds to trust a long copy."""
    from specchat.decoding.ngram import NGRAM_ROUTE_PRIORS

    # V(1..16) of the default target on the 2-core EPYC this was written on (calibration, seconds)
    here = [0.0241, 0.0448, 0.0614, 0.0734, 0.0921, 0.1035, 0.1209, 0.1211, 0.1348]
    here += [0.1348 + (0.1525 - 0.1348) * i / 3 for i in (1, 2, 3)]  # V(10..12)
    here += [0.1525 + (0.1417 - 0.1525) * i / 4 for i in (1, 2, 3, 4)]  # V(13..16): the 16-row dip
    costs = Costs(here, [0.0], exact_n=3)
    planner = AutoPlanner(
        costs, [(1.0, 1.0)], model_free=[True], route_priors=[NGRAM_ROUTE_PRIORS], explore=False
    )
    assert planner.plan(15, ["match 16+"]).k >= 2
    assert choice(planner.plan(15, ["match 2+"])) == (None, 0)
    assert (
        AutoPlanner(costs, [(1.0, 1.0)], model_free=[True], explore=False).plan(15, ["match 16+"]).drafter
        is None
    )


def test_a_depth_without_evidence_is_not_less_likely_than_the_one_before():
    """One early rejection at depth 2 must not cap every later draft: depths with (almost) no
    observations of their own borrow the rate of the depth before; observed depths keep theirs."""
    from specchat.decoding.acceptance import Acceptance

    acc = Acceptance(1.0, 1.0)
    for _ in range(20):
        acc.observe(2, 2)  # depths 0-1 always right
    acc.observe(3, 2)  # one rejection at depth 2
    rates = acc.rates(8, None)
    assert rates[3] >= rates[2] and rates[7] >= rates[2]  # beyond: no evidence, borrowed
    assert rates[2] < rates[1]  # depth 2 has its own (bad) evidence and keeps it


def test_a_strict_planner_keeps_to_the_exact_batch_from_its_first_round():
    """Under --strict a drifted token is assumed re-decoded (within a long answer some near-tie nearly
    always follows), so even a route that is always right is verified within the bit-exact batch on
    a CPU; without --strict the same planner verifies it in long batches."""
    costs = Costs(list(REPACK_V), [0.0], exact_n=3)
    strict = AutoPlanner(costs, [(50.0, 1.0)], model_free=[True], explore=False, strict=True)
    loose = AutoPlanner(
        Costs(list(REPACK_V), [0.0], exact_n=3), [(50.0, 1.0)], model_free=[True], explore=False
    )
    assert choice(strict.plan(100, ["match 16+"])) == (0, 2)
    assert loose.plan(100, ["match 16+"]).k > 2


# the F16 stand-in for a big target: a batch of 4 costs 1.85 tokens, the curve stays flat
BIG_V = [0.055 * x for x in (1.0, 1.3, 1.6, 1.85, 1.95, 2.05, 2.15, 2.25, 2.35)]


def simulate_draft_model(
    planner: AutoPlanner, v: list[float], accept: float, rounds: int, *, n_gram: bool = False, seed: int = 0
) -> list[tuple[int | None, int]]:
    """Rounds of a draft model as the loop runs it: the planner picks (drafter, k), the draft runs
    until k or its budget's floor (confidences drawn around `accept`, each token right with its
    confidence's chance), and what was judged is observed. With `n_gram`, drafter 1 is an n-gram
    route that is right 30% of the time. Returns (drafter, tokens drafted) per round."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rounds):
        plan = planner.plan(100, ["model", "match 2+"] if n_gram else ["model"])
        which, k = choice(plan)
        if which is None:
            planner.observe(Round(None, 0, 0, 0, 1, v[0]), plan)
            out.append((None, 0))
            continue
        if which == 1:  # the n-gram route: k copied tokens, each right 30% of the time
            acc = 0
            while acc < k and rng.random() < 0.3:
                acc += 1
            judged = min(k, acc + 1)
            planner.observe(Round("ngram", k, judged, acc, acc + 1, v[k], route="match 2+", proposed=k), plan)
            out.append((1, k))
            continue
        budget, reach, confs = planner.draft_budget(plan), 1.0, []
        while len(confs) < k:
            conf = float(np.clip(rng.normal(accept, 0.08), 0.05, 1.0))
            reach *= budget.accept_chance(conf, len(confs)) if budget else conf
            if budget is not None and reach < budget.floor:
                break
            confs.append(conf)
        acc = 0
        while acc < len(confs) and rng.random() < confs[acc]:
            acc += 1
        judged = min(len(confs), acc + 1)
        n = len(confs)
        planner.observe(
            Round("draft", k, judged, acc, acc + 1, v[min(n, len(v) - 1)] + n * planner.costs.draft[0],
                  draft_seconds=n * planner.costs.draft[0], route="model", proposed=n,
                  confidence=tuple(confs[:judged])),
            plan,
            budget,
        )  # fmt: skip
        out.append((0, n))
    return out


def test_a_cheap_draft_that_is_usually_right_drafts_deep_on_a_flat_curve():
    """c = 0.27 of a target token, V(4) = 1.85 V(1), drafts right ~95% of the time: the
    planner must draft deep (a fixed -k 8 made 5.8 tokens a pass there, auto had made 2-3)."""
    v = BIG_V + [BIG_V[-1] + 0.1 * BIG_V[0] * i for i in range(1, 41)]
    planner = AutoPlanner(
        Costs(list(v), [0.27 * v[0]]), [(3.0, 2.0)], model_free=[False], rng=np.random.default_rng(3)
    )
    late = simulate_draft_model(planner, v, 0.95, 200)[50:]
    drafted = [n for which, n in late if which == 0]
    assert len(drafted) / len(late) > 0.9
    assert np.mean(drafted) >= 6, np.mean(drafted)


def test_the_draft_model_keeps_its_rounds_from_an_n_gram_route_that_keeps_failing():
    v = BIG_V + [BIG_V[-1] + 0.1 * BIG_V[0] * i for i in range(1, 41)]
    planner = AutoPlanner(
        Costs(list(v), [0.27 * v[0], 0.0]),
        [(3.0, 2.0), (1.0, 1.0)],
        model_free=[False, True],
        rng=np.random.default_rng(4),
    )
    late = simulate_draft_model(planner, v, 0.95, 200, n_gram=True)[50:]
    assert sum(which == 0 for which, _ in late) / len(late) > 0.8


def test_a_dear_draft_on_this_cpu_stays_idle():
    """The default pair on a 2-core CPU: a draft token costs 0.6 of a target token and batches are
    dear, so even a draft that is always right never drafts (today's default-pair behaviour)."""
    planner = AutoPlanner(
        Costs(list(CPU_V), [0.6 * CPU_V[0]]), [(3.0, 2.0)], model_free=[False], rng=np.random.default_rng(5)
    )
    rounds = simulate_draft_model(planner, CPU_V, 0.99, 100)
    assert all(which is None for which, _ in rounds)
    assert planner.begin_answer([0], 256) == [False]


def test_an_agents_long_prompt_leaves_a_dear_draft_behind_and_a_chat_turn_does_not():
    """Default pair on a 2-core CPU: catching the draft up costs ~0.15 of a target token per token.
    2,700 prompt tokens (an aider turn) would cost more than the draft saves in an answer; the
    few new tokens of a chat turn are always worth it (the draft stays able to draft)."""
    v0 = CPU_V[0]
    planner = AutoPlanner(
        Costs(list(CPU_V), [0.3 * v0], catch_up=[0.15 * v0]), [(3.0, 2.0)], model_free=[False]
    )
    assert planner.begin_answer([2700], 256) == [False]
    note = planner.explain(["draft-0.5b"])
    assert (
        note is not None
        and "draft-0.5b was not given the 2700-token prompt" in note
        and "-k N forces drafting" in note
    )
    assert planner.begin_answer([20], 256) == [True]
    assert planner.explain(["draft-0.5b"]) is None
    assert planner.begin_answer([0], 256) == [True]


def test_a_cheap_draft_for_a_dear_target_is_given_even_a_long_prompt():
    v0 = BIG_V[0]  # the 70B-with-a-1B regime: prefill of the draft ~0.005 of a target token
    planner = AutoPlanner(
        Costs(list(BIG_V), [0.05 * v0], catch_up=[0.005 * v0]), [(3.0, 2.0)], model_free=[False]
    )
    assert planner.begin_answer([2700], 256) == [True]
    model_free = AutoPlanner(Costs(list(BIG_V), [0.0], catch_up=[0.0]), [(3.0, 2.0)], model_free=[True])
    assert model_free.begin_answer([0], 256) == [True]  # n-grams: nothing to prefill


def test_short_answers_seen_make_a_long_prefill_not_worth_it():
    """The expected saving counts the answer's likely length: its limit, or what recent answers ran."""
    v0 = BIG_V[0]
    planner = AutoPlanner(
        Costs(list(BIG_V), [0.1 * v0], catch_up=[0.05 * v0]), [(3.0, 2.0)], model_free=[False]
    )
    assert planner.begin_answer([400], 256) == [True]  # costs 20 tokens' time, saves ~23
    assert planner.begin_answer([400], 4) == [False]  # a 4-token limit saves too little
    for _ in range(8):  # eight answers of 10 tokens each
        planner.begin_answer([0], 256)
        planner.observe(Round(None, 0, 0, 0, 10, v0), NO_DRAFT)
    assert planner.begin_answer([400], 256) == [False]
    assert planner.answer_tokens < 30


def test_a_timed_prefill_replaces_the_calibrated_catch_up_price():
    v0 = BIG_V[0]
    planner = AutoPlanner(
        Costs(list(BIG_V), [0.1 * v0], catch_up=[0.2 * v0]), [(3.0, 2.0)], model_free=[False]
    )
    assert planner.begin_answer([600], 256) == [False]  # priced at 0.2 of a token per token
    planner.observe_prefill(0, 1000, 1000 * 0.02 * v0)  # a long prompt ran at 0.02
    assert planner.prefill_cost[0] == pytest.approx(0.02 * v0)
    assert planner.begin_answer([600], 256) == [True]
    planner.observe_prefill(0, 10, 10.0)  # too short a sample to learn from
    assert planner.prefill_cost[0] == pytest.approx(0.02 * v0)
    seeded = AutoPlanner(
        Costs(list(BIG_V), [0.1 * v0], catch_up=[0.2 * v0]),
        [(3.0, 2.0)],
        model_free=[False],
        learn_costs=False,
    )
    seeded.observe_prefill(0, 1000, 1000 * 0.02 * v0)  # a seeded request's choices never follow timing
    assert seeded.prefill_cost[0] == pytest.approx(0.2 * v0)


def test_acceptance_estimates_forget_the_prior_and_reach_the_measured_rate():
    planner = AutoPlanner(
        Costs(list(BIG_V), [0.0]), [(3.0, 2.0)], model_free=[True], rng=np.random.default_rng(6)
    )
    for _ in range(150):  # 98 of 100 drafts of 4 accepted
        planner.observe(Round("d", 4, 4, 4, 5, BIG_V[4], route="r", proposed=4), Plan(0, 4))
    rates = planner.acceptance(0, "r").rates(4, None)
    assert min(rates) > 0.97, rates  # a prior kept at full weight held it near 0.93


def test_the_draft_budget_learns_how_often_unsure_draft_tokens_are_right():
    planner = AutoPlanner(
        Costs(list(BIG_V), [0.27 * BIG_V[0]]), [(3.0, 2.0)], model_free=[False], rng=np.random.default_rng(7)
    )
    for _ in range(100):  # tokens the draft gives only 0.45 are always right
        planner.observe(
            Round("d", 2, 2, 2, 3, BIG_V[2], route="model", proposed=2, confidence=(0.45, 0.45)), Plan(0, 2)
        )
    budget = planner.draft_budget(planner.plan(16, ["model"]))
    assert budget is not None and min(budget.accept_chance(0.45, i) for i in (0, 1, 5)) > 0.85
    assert 0.0 < budget.floor <= 0.9


def test_a_model_free_drafters_timing_does_not_make_it_a_draft_model():
    """An n-gram proposal takes microseconds, which are not learned as a cost: it stays 0, and the
    drafter's k is the planned one (only a draft model, which stops itself, is handed the depth
    where a perfect draft stops paying)."""
    planner = AutoPlanner(Costs(list(CPU_V), [0.0]), [(1.0, 1.0)], model_free=[True], explore=False)
    for _ in range(5):
        planner.observe(
            Round("ngram", 2, 2, 1, 2, CPU_V[2], draft_seconds=2e-5, route="r", proposed=2), Plan(0, 2)
        )
    assert planner.costs.draft == [0.0]
    which, k = choice(planner.plan(8, ["r"]))
    rates = planner.acceptance(0, "r").rates(8, None)
    assert (which, k) == ((0, best_k(rates, planner._verify_curve(8), 0.0)[0]) if k else (None, 0))
    assert k < best_k([1.0] * 8, planner._verify_curve(8), 0.0)[0]


def test_a_computed_draft_token_is_proposed_when_its_verify_row_pays_and_no_decode_looks_past_it():
    """A token whose distribution the drafter has computed costs only its verify row from then on: it
    is proposed at the row's price (`floors`). Looking at the next position costs a draft decode too,
    so the drafter does that only while the chance so far, times what a token there usually is
    accepted at, pays both (`ahead`, `expect`). (Priced together, the first token of a round was
    declined after its catch-up decode was paid -- 65 of 255 draft rounds on scratch code under a CUDA
    curve with a 0.3x draft, replayed -- and a drafter decoded one position too many every round,
    the one whose token it then declined: 12 of an MTP head's 41 ms a round.)"""
    from specchat.decoding.drafters import DraftBudget, ModelDrafter
    from specchat.decoding.sampling import SamplingParams

    model = FakeModel(n_vocab=16, seed=3, sharpness=0.5)  # flat logits: every token unsure
    drafter = ModelDrafter(model, p_min=0.0)
    ctx = [1, 2, 3]
    rng = np.random.default_rng(0)
    strict = DraftBudget(floor=0.9, chance=((0.5,),))  # every token's chance 0.5: below the floor
    assert drafter.propose(ctx, 8, SamplingParams(), rng, budget=strict).tokens == []
    calls = len(model.decode_calls)
    cheap_row = DraftBudget(floor=0.9, chance=((0.5,),), floors=(0.4,), ahead=(0.9, 0.9), expect=(1.0, 1.0))
    out = drafter.propose(ctx, 8, SamplingParams(), rng, budget=cheap_row)
    assert len(out.tokens) == 1 and out.confidence
    # one decode, the catch-up that gave the first token's distribution; none for the token itself
    assert model.decode_calls[calls:] == [(1, 1)]
    calls = len(model.decode_calls)
    worth_a_look = DraftBudget(floor=0.2, chance=((0.5,),), ahead=(0.2, 0.4), expect=(1.0, 0.9))
    out = drafter.propose(ctx, 8, SamplingParams(), rng, budget=worth_a_look)
    assert len(out.tokens) == 2  # 0.5 x 0.9 >= 0.4: looked at; 0.25 >= 0.2: proposed
    assert DraftBudget(floor=0.3).ahead_at(2) == 0.3  # nothing given: the propose floor decides
    calls = len(model.decode_calls)
    hopeful = DraftBudget(floor=0.2, chance=((0.9,),), sure=((0.3,),), ahead=(0.2, 0.4), expect=(1.0, 1.0))
    out = drafter.propose(ctx, 8, SamplingParams(), rng, budget=hopeful)
    # a hopeful reading proposes the computed token, but the draft decode past it is decided at the
    # bins' means: 0.3 < 0.4
    assert len(out.tokens) == 1 and model.decode_calls[calls:] == [(1, 1)]


def test_the_first_draft_position_learns_its_own_confidence_curve():
    """A head drafts its first token from the target's own state and the rest from its guesses: the
    same confidence is worth more there (Gemma 4's assistant: unsure first tokens right 13 times in
    15, unsure later ones 16 in 32), so the first position keeps a curve of its own."""
    planner = AutoPlanner(
        Costs(list(BIG_V), [0.2 * BIG_V[0]]), [(4.0, 2.0)], model_free=[False], explore=False
    )
    for _ in range(60):  # unsure first tokens always right, the unsure second ones never
        planner.observe(
            Round("d", 2, 2, 1, 2, BIG_V[2], route="model", proposed=2, confidence=(0.05, 0.05)), Plan(0, 2)
        )
    budget = planner.draft_budget(planner.plan(16, ["model"]))
    assert budget is not None
    assert budget.accept_chance(0.05, 0) > 0.9 and budget.accept_chance(0.05, 1) < 0.1
    assert budget.accept_chance(0.05, 7) == budget.accept_chance(0.05, 1)  # every later position


def test_the_draft_budget_proposes_on_a_draw_but_looks_ahead_at_the_means():
    """A bin read at a posterior draw above its mean may have a token proposed (a verify row); the
    draft decode for the next position is decided at the mean, so exploring costs no decodes."""
    planner = AutoPlanner(
        Costs(list(BIG_V), [0.3 * BIG_V[0]]), [(9.0, 1.0)], model_free=[False], rng=np.random.default_rng(5)
    )
    for _ in range(3):  # a thin bin: its draws spread well above its mean
        planner.confidence[0].observe((0.35,), 0)
    means = planner.confidence[0].chances(None)
    above = 0
    for _ in range(20):
        budget = planner.draft_budget(planner.plan(16, ["model"]))
        assert budget is not None and budget.sure == means
        pairs = zip(budget.chance[0], budget.sure[0], strict=True)
        assert all(c >= m for c, m in pairs)
        assert budget.sure_chance(0.35, 0) == means[0][3]
        above += budget.accept_chance(0.35, 0) > means[0][3]
    assert above > 0  # the proposing side does explore


def test_the_planner_prices_a_token_by_its_row_a_look_ahead_by_its_decode_too_and_keeps_tries_out():
    v0 = BIG_V[0]
    c = 0.3 * v0
    planner = AutoPlanner(
        Costs(list(BIG_V), [c]), [(9.0, 1.0)], model_free=[False], rng=np.random.default_rng(1)
    )
    unsure = 0.05  # a first token proposed at its row's price only: a one-row try
    for _ in range(12):  # tokens drafted this unsure were seldom right (the confidence curve learns it)
        planner.confidence[0].observe((unsure,), 0)
    plan = planner.plan(16, ["model"])
    assert plan.drafter == 0
    budget = planner.draft_budget(plan)
    assert budget is not None
    speed = plan.speed
    assert budget.floor_at(0) == pytest.approx(speed * (BIG_V[1] - BIG_V[0]))  # its own row
    assert budget.ahead_at(0) == pytest.approx(min(0.9, speed * (c + BIG_V[1] - BIG_V[0])))
    assert budget.floor_at(0) < budget.ahead_at(0)  # proposing a computed token costs no decode
    assert budget.expect and all(0.0 < e <= 1.0 for e in budget.expect)  # the planned depth's rates
    before = list(planner.acceptance(0, "model").a), list(planner.acceptance(0, "model").b)
    assert budget.accept_chance(unsure, 0) < budget.ahead_at(0)
    planner.observe(
        Round("d", 1, 1, 0, 1, BIG_V[1], route="model", proposed=1, confidence=(unsure,)), plan, budget
    )
    after = planner.acceptance(0, "model")
    assert (after.a, after.b) == before  # the per-depth rates plan() chooses by are not pulled down
    plan = planner.plan(16, ["model"])
    budget = planner.draft_budget(plan)
    planner.observe(
        Round("d", 3, 3, 1, 2, BIG_V[3], route="model", proposed=3, confidence=(0.95,) * 3), plan, budget
    )
    counted = planner.acceptance(0, "model")
    assert (counted.a, counted.b) != before  # an ordinary draft round is counted as before


def test_a_draft_model_left_behind_by_n_gram_rounds_is_still_chosen_while_the_answer_has_far_to_go():
    """Catching up is paid once and serves the rounds after, so it is spread over what remains of
    the answer, not charged to one round: charged whole, 30 tokens of n-gram rounds (1.5 tokens' time
    to catch up) made the draft model look worse than plain decoding for the rest of the answer."""
    v0 = BIG_V[0]
    costs = Costs(list(BIG_V), [0.1 * v0, 0.0], catch_up=[0.05 * v0, 0.0])
    planner = AutoPlanner(costs, [(3.0, 2.0), (1.0, 1.0)], model_free=[False, True], explore=False)
    assert planner.begin_answer([0, 0], 400) == [True, True]
    assert planner.plan(8, ["model", None], [1, 0]).drafter == 0  # caught up: it pays at its prior
    planner.observe(Round("ngram", 4, 4, 4, 60, BIG_V[4], route="match 8+", proposed=4), Plan(1, 4))
    assert planner.plan(8, ["model", None], [30, 0]).drafter == 0  # ~200 tokens to go
    for _ in range(3):  # near the end of the answer the catch-up no longer pays for itself
        planner.observe(Round("ngram", 4, 4, 4, 60, BIG_V[4], route="match 8+", proposed=4), Plan(1, 4))
    assert choice(planner.plan(8, ["model", None], [30, 0])) == (None, 0)
    # a prompt judged not worth giving it over the whole answer is not caught up on mid-answer either
    assert planner.begin_answer([50_000, 0], 400) == [False, True]
    assert choice(planner.plan(8, ["model", None], [50_000, 0])) == (None, 0)


def test_deep_draft_positions_are_priced_at_their_own_rows_where_the_curve_steepens():
    """The budget priced every drafted token at the planned draft's average verify row; where the
    curve steepens past a few rows (M2 Ultra: rows 5-16 at 0.19 of a token against 0.14 for the
    first three) deep tokens were underpriced. Each position's floor follows the curve's slope
    from it, and is never below the average-row floor (where the curve flattens it stays there)."""
    from specchat.decoding.drafters import DraftBudget

    v0 = 0.0142
    steep_late = [v0 * x for x in (1.0, 1.11, 1.26, 1.41, 1.60, 1.79, 1.97, 2.16, 2.35, 2.54)]
    planner = AutoPlanner(Costs(steep_late, [0.24 * v0]), [(9.0, 1.0)], model_free=[False], explore=False)
    plan = planner.plan(8, ["model"])
    assert plan.drafter == 0
    budget = planner.draft_budget(plan)
    assert budget is not None and len(budget.floors) == 8
    assert all(f >= budget.floor for f in budget.floors[1:])  # the first: its own row (cheapest)
    assert budget.floor_at(5) > budget.floor  # rows 6-9 at 0.19 each: dearer than the average
    assert budget.floor_at(50) == budget.floor  # past the curve the planner has: the floor
    flat_late = [v0 * x for x in (1.0, 1.17, 1.33, 1.50, 1.58, 1.67, 1.75, 1.84, 1.92, 2.0)]
    planner = AutoPlanner(Costs(flat_late, [0.14 * v0]), [(9.0, 1.0)], model_free=[False], explore=False)
    budget = planner.draft_budget(planner.plan(8, ["model"]))
    assert budget is not None and all(f == pytest.approx(budget.floor) for f in budget.floors[3:])
    assert DraftBudget(floor=0.5, floors=(0.5, 0.7)).floor_at(1) == 0.7
    # the draft model stops where its position's floor says, not the round's
    from specchat.decoding.drafters import ModelDrafter
    from specchat.decoding.sampling import SamplingParams

    drafter = ModelDrafter(FakeModel(n_vocab=16, seed=3), p_min=0.0)
    # chances so far: 0.9, 0.81, 0.73
    each = DraftBudget(floor=0.0, chance=((0.9,),), floors=(0.0, 0.0, 0.8), ahead=(0.0,) * 4)
    out = drafter.propose([1, 2, 3], 8, SamplingParams(), np.random.default_rng(0), budget=each)
    assert len(out.tokens) == 2


def test_a_draft_models_step_cost_is_learned_per_decode_not_per_proposed_token():
    """The first token of a round comes with the catch-up decode; the draft decodes after it are
    what a further token costs. Divided by the tokens proposed, an MTP head's 28 ms step was learned
    as 6.6 ms within one answer of mostly one-token drafts, and deep drafts looked cheap."""
    step = 0.028
    planner = AutoPlanner(Costs(list(BIG_V), [step]), [(4.0, 2.0)], model_free=[False], explore=False)
    for _ in range(40):  # one-token drafts: the catch-up paid for the only token, no decode after it
        planner.observe(
            Round("mtp", 1, 1, 1, 2, BIG_V[1] + step, draft_seconds=step + 1e-4, route="model",
                  proposed=1, catch_up_seconds=step, draft_decodes=0),
            Plan(0, 1),
        )  # fmt: skip
    assert planner.costs.draft[0] == pytest.approx(step)
    for _ in range(40):  # three-token drafts: two decodes after the catch-up
        planner.observe(
            Round("mtp", 3, 3, 3, 4, BIG_V[3] + 3 * step, draft_seconds=3 * step, route="model",
                  proposed=3, catch_up_seconds=step, draft_decodes=2),
            Plan(0, 3),
        )  # fmt: skip
    assert planner.costs.draft[0] == pytest.approx(step, rel=0.01)


def test_a_model_drafter_counts_its_decodes_after_the_catch_up():
    from specchat.decoding.drafters import ModelDrafter
    from specchat.decoding.sampling import SamplingParams

    drafter = ModelDrafter(FakeModel(n_vocab=16, seed=3), p_min=0.0)
    out = drafter.propose([1, 2, 3], 4, SamplingParams(), np.random.default_rng(0))
    assert len(out.tokens) == 4 and out.decodes == 3  # the last proposed token is never decoded


STEEP_V = [0.010 + 0.005 * i for i in range(9)]  # a CPU-like verify curve: each row half a token


def _block_planner(share: float, v: list[float] = STEEP_V, **kw) -> AutoPlanner:
    """A planner for one block drafter accepted ~80% of the time, every batch exact (no ties)."""
    return AutoPlanner(
        Costs(list(v), [0.0], exact_n=len(v)),
        [(20.0, 5.0)],
        model_free=[True],
        per_pass=[True],
        pass_share=[share],
        route_priors=[{"any": (20.0, 5.0)}],
        explore=False,
        **kw,
    )


def test_a_block_drafters_pass_is_priced_by_its_share_before_any_is_timed():
    """A block's pass of k + 1 rows is priced at share x V(k+1) from the first round: a drafter with
    a fraction of the target's weights per row drafts, one with half of them does not on a steep
    curve (every block row is nearly as dear as the target's), and on a flat curve it does: there
    the pass is close to a fixed cost, which a deeper block spreads."""
    assert _block_planner(0.0).plan(8, ["any"]).k > 0
    assert _block_planner(0.1).plan(8, ["any"]).k > 0
    assert _block_planner(0.5).plan(8, ["any"]).drafter is None
    flat = [0.010 + 0.0002 * i for i in range(9)]
    assert _block_planner(0.5, flat).plan(8, ["any"]).k >= _block_planner(0.5).plan(8, ["any"]).k


def test_a_block_drafters_pass_is_learned_from_its_rounds():
    """The share is learned as the pass's time over the verify batch of its rows: the first pass
    (llama.cpp building the block's graph) is not counted, catching up is not part of it, and a
    drafter priced free before it was timed stops drafting once its passes show it cannot pay."""
    planner = _block_planner(0.0)
    assert planner.plan(8, ["any"]).k > 0
    first = Round("block", 2, 2, 2, 3, 1.0, draft_seconds=1.0, draft_decodes=3)
    planner.observe(first, planner.plan(8, ["any"]))
    assert planner.pass_scale == [0.0]
    for _ in range(3):  # passes of 3 rows at 0.6 x V(3), a catch-up of one target token apart
        pass_s = 0.6 * STEEP_V[2]
        catch_up = STEEP_V[0]
        rnd = Round("block", 2, 2, 2, 3, STEEP_V[2] + pass_s + catch_up,
                    draft_seconds=pass_s + catch_up, catch_up_seconds=catch_up, draft_decodes=3)  # fmt: skip
        planner.observe(rnd, planner.plan(8, ["any"]))
    assert planner.pass_scale[0] == pytest.approx(0.6)
    assert planner.plan(8, ["any"]).drafter is None


def test_a_block_drafters_share_from_its_file_counts_as_one_of_its_timed_passes():
    """With a share read from the files, the first timed pass is averaged with it rather than taking
    its place (one dear pass alone would price the blocks out for rounds); the passes after it move
    the mean as any further term does. Without one (share 0) the first timed pass sets the scale."""
    flat = [0.010 + 0.0002 * i for i in range(9)]  # where blocks pay at every share tried here
    planner = _block_planner(0.5, flat)

    def timed_pass(share: float) -> Round:
        pass_s = share * flat[2]
        return Round("block", 2, 2, 2, 3, flat[2] + pass_s, draft_seconds=pass_s, draft_decodes=3)

    planner.observe(timed_pass(0.4), planner.plan(8, ["any"]))  # builds the graph: not counted
    assert planner.pass_scale == [0.5]
    planner.observe(timed_pass(0.9), planner.plan(8, ["any"]))
    assert planner.pass_scale[0] == pytest.approx(0.7)
    planner.observe(timed_pass(0.7), planner.plan(8, ["any"]))
    assert planner.pass_scale[0] == pytest.approx(0.7)
    unknown = _block_planner(0.0, flat)
    for share in (0.4, 0.9):
        unknown.observe(timed_pass(share), unknown.plan(8, ["any"]))
    assert unknown.pass_scale[0] == pytest.approx(0.9)


def test_a_block_drafter_is_budgeted_like_a_draft_model():
    """Its rows are computed when it reads them (no draft cost), so it gets the floors a draft model
    gets: they stop its block and price its side nodes."""
    planner = _block_planner(0.1)
    plan = planner.plan(8, ["any"])
    budget = planner.draft_budget(plan)
    assert budget is not None and budget.floor_at(0) > 0


def test_a_lookup_is_budgeted_for_its_branches_and_still_learns_its_routes():
    """An n-gram lookup gets the rows' prices and the route's rates (what its tree branches are
    priced with), no confidence bins and no decode to price; its rounds still teach the route's
    acceptance from every token drafted, as without a budget."""
    lookup = AutoPlanner(Costs(list(STEEP_V), [0.0], exact_n=9), [(20.0, 5.0)], model_free=[True])
    plan = lookup.plan(8, ["any"])
    budget = lookup.draft_budget(plan)
    assert budget is not None and budget.chance == () and budget.sure == ()
    assert budget.floor_at(1) > 0 and budget.ahead == budget.floors and budget.expect == plan.rates
    before = lookup.acceptance(0, "any").rates(1, None)[0]
    for _ in range(6):
        lookup.observe(Round("any", plan.k, plan.k, 0, 1, STEEP_V[plan.k], route="any"), plan, budget)
    assert lookup.acceptance(0, "any").rates(1, None)[0] < before - 0.1


def test_a_seeded_planner_does_not_learn_a_block_pass():
    """Under a seed the planner's choices must not follow timing: the pass keeps its prior."""
    planner = _block_planner(0.1, learn_costs=False)
    for _ in range(3):
        planner.observe(
            Round("block", 2, 2, 2, 3, 1.0, draft_seconds=0.5, draft_decodes=3), planner.plan(8, ["any"])
        )
    assert planner.pass_scale == [0.1]


def test_an_answers_first_round_is_not_timed():
    """The first round after a prompt runs while llama.cpp (and a split target's workers) rebuild the
    graph and buffers the prompt's batches replaced: 1.9 s against 40 ms on a split. Timed, it set
    V(1) at many times its cost, a one-token draft looked far cheaper than plain decoding, and the
    planner drafted one token a round for the rest of the answer, never timing V(1) again."""
    planner = AutoPlanner(Costs(list(CPU_V), [0.0], exact_n=len(CPU_V)), [(20.0, 5.0)], model_free=[True])
    for answer in range(2):
        planner.begin_answer([0], 128)
        planner.observe(Round(None, 0, 0, 0, 1, 50 * CPU_V[0]), NO_DRAFT)  # the warm-up round
        assert planner.seen[0] == answer and planner.costs.verify[0] == pytest.approx(CPU_V[0])
        planner.observe(Round(None, 0, 0, 0, 1, CPU_V[0]), NO_DRAFT)
        assert planner.seen[0] == answer + 1
    slow_once = AutoPlanner(Costs(list(CPU_V), [0.0], exact_n=len(CPU_V)), [(20.0, 5.0)], model_free=[True])
    slow_once.begin_answer([0], 128)
    for seconds in (50 * CPU_V[0], CPU_V[0], CPU_V[0], CPU_V[0]):
        slow_once.observe(Round(None, 0, 0, 0, 1, seconds), NO_DRAFT)
    curve = slow_once._verify_curve(4)
    assert curve[0] == pytest.approx(CPU_V[0]) and curve[1] > curve[0]
