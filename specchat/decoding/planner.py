"""Cost-model auto-tuning: per round, draft only as far as it pays — or not at all.

Speculation pays only when a verify batch of n tokens costs the target little more than one token
and the drafts are cheap and often right. How much a batch costs varies by an order of magnitude
between machines (calibration.py measures it), so every round the planner maximises expected tokens
per second over the drafters and k in 0..K_MAX:

      E(k) / (catch-up + k·c_draft + V(k+1) + re-checks + drift),   E(k) = 1 + Σ_{j≤k} Π_{i≤j} α_i

* α_i: the conditional acceptance at draft position i, per drafter *and route* (the drafter's kind
  of context, e.g. how long the n-gram match is), as decayed Beta counts with per-route priors,
  read each round at one random quantile of their posteriors (a damped Thompson sampling) so a
  drafter that starts doing well is tried again.
* Rows of a batch beyond the bit-exact size decide a token only outside the tie margin: the recent
  share of near-ties (from every decided row) is priced in, and under --strict what drifted K/V cost
  in later repairs.
* A draft model idle while another drafter worked must catch up first: priced per token, and
  spread over the rounds it drafts after (CATCH_UP_SHARE), since one catch-up serves them all.
* Live rounds refine the verify curve and the draft cost as generation goes.

k = 0 is plain decoding; a drafter that could not win even if always right is never tried.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from .acceptance import Acceptance, ConfidenceByDepth
from .calibration import K_MAX, Costs, calibrate
from .drafters import DraftBudget, Drafter
from .events import Round
from .loop import NO_DRAFT, FixedK, Plan
from .model import Model
from .settings import MAX_TOKENS

EMA = 0.1  # weight of a new timing measurement
#: prior for the share of verify rows that fall within the tie margin (re-checked one token alone),
#: and its decay per row seen: ~30 tokens of memory, as the share swings within an answer between
#: prose (near-ties common) and copied code (almost none)
TIE_PRIOR = (0.5, 19.5)
#: Prior of a lookup's branch being taken where the copy is rejected beside it, of strength 4: 45 of
#: 108 such rounds over the 28 recorded answers (tests/perf/recorded), every branch offered tried
BRANCH_PRIOR = (1.7, 2.3)
TIE_DECAY = 0.97
#: strength (in tokens) of the prior on what drifted K/V cost later (AutoPlanner.drift_cost), and
#: the share of drifted tokens it assumes a near-tie will have re-decoded: all of them. A repair
#: re-decodes everything since the first drifted token, and within a long answer some near-tie
#: usually follows; a prior that assumed fewer let answers drift far and then pay long repairs, where
#: assuming all keeps a CPU within the bit-exact batch from the first round
DRIFT_PRIOR_TOKENS = 30.0
DRIFT_PRIOR_SHARE = 1.0
#: live rounds must have seen a batch size this often before their timing replaces calibration's
SEEN_ENOUGH = 3
#: a draft model's drafts per round at most (AutoPlanner.plan): past the depth where a perfect draft
#: stops paying the budget stops it, but on a flat curve that depth is 48, and the budget's price of
#: a token (the average verify cost per row of the planned draft) undercharges the rows of a deep
#: batch; a lower cap cut drafts a flat curve pays for. Where batches are dear a perfect draft stops
#: paying before this cap, which then never acts
DEPTH_CAP = 16
#: catching an idle draft model up is paid once and then serves every round it drafts after, so
#: plan() spreads what it is behind (beyond what any draft round leaves: STEADY_LAG) over this share of
#: the answer's expected remaining tokens, not over one round. Charged to one round, the catch-up
#: grew with every n-gram round and a draft model left idle early never drafted again. The whole
#: remaining answer overstates it: n-gram copies still take rounds after, and each leaves the draft
#: behind again
CATCH_UP_SHARE = 0.25
#: tokens a draft model is behind after a round it drafted: the target's correction, or its own last
#: proposal (never decoded) and the bonus token; always charged to the round (CATCH_UP_SHARE)
STEADY_LAG = 2
#: rows over which draft_budget reads the verify curve's slope at a draft position. Priced at the
#: planned draft's average row, deep tokens were underpriced where the curve steepens past its first
#: few rows. The floor is only ever raised: priced below the average row where the curve flattens,
#: drafts ran on and were slower, not faster
FLOOR_WINDOW = 4
#: a draft model's floor (AutoPlanner.draft_budget) at most: a draft the planner is this sure of
#: is always worth extending once it chose to draft
FLOOR_MAX = 0.9
#: tokens an answer is expected to run before any has been seen (the default answer limit), and the
#: weight of each finished answer in the running estimate (agents repeat the shape of their turns)
ANSWER_PRIOR = float(MAX_TOKENS)
ANSWER_EMA = 0.3
#: a draft model whose prompt prefill costs at most this many one-token times is always given the
#: prompt (a chat turn's few new tokens): cheap enough to keep it able to draft and be learned
CHEAP_PREFILL = 16.0
#: prompts shorter than this say little about a model's prefill speed per token
PREFILL_SAMPLE = 64


def expected_tokens(rates: Sequence[float]) -> float:
    """Tokens a round yields with these conditional acceptance rates: the accepted prefix + 1."""
    total, run = 1.0, 1.0
    for r in rates:
        run *= r
        total += run
    return total


def best_k(
    rates: Sequence[float],
    v: list[float],
    draft_cost: float,
    *,
    tie: float = 0.0,
    exact_n: int = 0,
    overhead: float = 0.0,
    drift_cost: float = 0.0,
    free_back: int | None = None,
    pass_scale: float = 0.0,
) -> tuple[int, float]:
    """(k, tokens/second) maximising E(k)/(k·draft_cost + V(k+1)); k = 0 is plain decoding.

    Batches beyond `exact_n` rows are not bit-identical to one-token decoding, so their rows decide
    a token only outside the tie margin: E(k) then counts a row's chance `tie` of stopping the round,
    and the cost counts the one-token round that re-checks it. `overhead` is a fixed cost of drafting
    at all this round (a draft model catching up on the tokens other drafters committed).
    `drift_cost` is the expected cost per token a non-exact batch leaves in the cache: its K/V
    are not what one-token decoding writes, so a later near-tie has them re-decoded exactly.
    `free_back`: on a recurrent target, how many of the batch's tokens its snapshots take back for free
    (None: any, an attention cache). A draft rejected further back than that, after `a` accepted
    tokens, goes back through the checkpoint before the batch and replays the a + 1 tokens kept in
    front of the next batch: E[a + 1; a < k - free_back] rows at this batch's average row cost
    (llama/rollback.py), charged to the k that risked them. `pass_scale`: a block drafter's pass for a
    draft of k costs pass_scale·V(k+1) (its k + 1 rows run the same kinds of matmul over its own,
    smaller, weights: near-free per row where the verify curve is flat, dear where it is steep)."""
    best, best_speed = 0, 1.0 / v[0]
    runs = [1.0]  # runs[a]: the chance the first a drafts are accepted
    replay = 0.0  # expected rows replayed after this round's rejection
    # A round's value, for every prefix in one pass (the planner runs this every round over up to
    # 48 depths). Each row reached and not tied yields one token (an accepted draft, a correction or
    # the bonus); a tied row yields nothing and hands its position to a one-token round: with
    # β = 1 − tie the round is a walk with acceptance β·α_i. (tests/test_planner.py keeps the per-k
    # definition, round_value, and checks this pass against it.)
    beta = 1.0 - tie
    total, run = 1.0, 1.0  # expected_tokens(rates[:k])
    walked, tied, reach = 0.0, 0.0, 1.0  # that walk over the k drafted rows
    for k in range(1, len(rates) + 1):
        r = rates[k - 1]
        run *= r
        total += run
        runs.append(run)
        a = k - 1 - free_back if free_back is not None else -1
        if a >= 0:  # a accepted, then a rejection k - a > free_back tokens back: a + 1 rows replay
            replay += runs[a] * (1.0 - rates[a]) * (a + 1)
        tied += reach * tie
        walked += reach * beta
        reach *= beta * r
        inexact = k + 1 > exact_n
        if inexact and tie > 0.0:
            e, p_tie = walked + reach * beta, tied + reach * tie  # + the row after the drafts
        else:
            e, p_tie = total, 0.0
        drift = e * drift_cost if inexact else 0.0
        rollback = replay * (v[k] - v[0]) / k if replay > 0.0 else 0.0
        block = pass_scale * v[k]
        speed = (e + p_tie) / (overhead + block + k * draft_cost + v[k] + p_tie * v[0] + drift + rollback)
        if speed > best_speed:
            best, best_speed = k, speed
    return best, best_speed


class AutoPlanner:
    """Chooses (drafter, k) per round from measured costs and online acceptance.

    Acceptance is tracked per drafter *and route* (the drafter's class for this round's context, e.g.
    how long the n-gram match is), each route starting from its drafter's prior: that is the routing
    by context -- the same drafter is trusted with long drafts where it has been right and left idle
    where it has not, and among several drafters each round goes to the one whose route pays best.

    Verify batches may exceed the bit-exact size (`Costs.exact_n`): their rows are then trusted only
    outside the tie margin, and the learned share of rows that fall inside it (re-checked one token
    alone) is priced into each choice. On llama.cpp's CPU backend this is what opens up the cheap
    region: with repacked weights a batch of 4-8 rows runs another, much faster kernel than 2-3.

    Live rounds refine the verify curve: a batch size seen SEEN_ENOUGH times uses its own measured
    time, and sizes not seen yet follow calibration scaled by how far the live one-token time has
    moved from it (a machine that got busier or quieter since calibration shifts the whole curve).

    `model_free[i]`: drafter i runs no model (Drafter.model is None): its proposals are free, its
    cost is never learned, and it drafts the planned k (a draft model is handed a deeper cap and
    stops itself, by the budget). `per_pass[i]`: drafter i pays one pass per round whatever it
    proposes (a block drafter), which computes a row per drafted token: a draft of k costs it
    `pass_scale[i]`·V(k+1), the target's batch of those rows scaled to the drafter's size. The scale
    starts at `pass_share[i]` (the drafter's weights per row over the target's: models/heads.py) and
    is learned from its rounds (not under a seed, whose choices must not follow timing). So where
    every block row computes a full output layer on a steep curve, a block drafter is priced as the
    dear drafter it is from its first round, and on a flat curve as the near-free one.
    """

    def __init__(
        self,
        costs: Costs,
        priors: Sequence[tuple[float, float]],
        *,
        model_free: Sequence[bool],
        per_pass: Sequence[bool] = (),
        pass_share: Sequence[float] = (),
        k_max: int = K_MAX,
        rng: np.random.Generator | None = None,
        explore: bool = True,
        learn_costs: bool = True,
        route_priors: Sequence[Mapping[str, tuple[float, float]]] = (),
        strict: bool = False,
        free_back: int | None = None,
    ) -> None:
        self.costs = costs
        #: tokens of a verify batch the target takes back for free (best_k; None: any)
        self.free_back = free_back
        self.model_free = list(model_free)
        self.per_pass = list(per_pass) or [False] * len(self.model_free)
        #: per drafter, a block pass over the verify batch of its rows (per_pass drafters; 0 for others)
        shares = list(pass_share) or [0.0] * len(self.model_free)
        self.pass_scale = [s if p else 0.0 for s, p in zip(shares, self.per_pass, strict=True)]
        self._passes_seen = [0] * len(self.model_free)
        self._pass_prior = [float(s > 0.0) for s in self.pass_scale]  # a share known: one pass's weight
        # per drafter, priors for the routes it knows something about (n-gram match lengths)
        self.route_priors = list(route_priors)
        self.calibrated = list(costs.verify)
        self.seen = [0] * len(costs.verify)
        self.k_max = min(k_max, len(costs.verify) - 1) if len(costs.verify) > 1 else k_max
        self.priors = list(priors)
        self.acc: dict[tuple[int, str | None], Acceptance] = {}
        self.ties = list(TIE_PRIOR)  # decayed counts: [rows within the margin, rows outside it]
        # decayed [repair seconds, drifted tokens]: what a token left with batched K/V costs later
        # under --strict. Prior: every one of them re-decoded at the exact batch's per-token cost
        # (nothing without --strict, or when the exact batch size was never measured)
        measured = strict and costs.exact_n >= 1 and bool(costs.verify)
        per = costs.v(costs.exact_n) / costs.exact_n if measured else 0.0
        self.drift = [DRIFT_PRIOR_TOKENS * per * DRIFT_PRIOR_SHARE, DRIFT_PRIOR_TOKENS]
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.explore = explore
        self.learn_costs = learn_costs  # off under --seed: timing noise must not change the choices
        #: per drafter, acceptance by draft confidence (only drafters that report one fill theirs)
        self.confidence = [ConfidenceByDepth(start=a / (a + b)) for a, b in self.priors]
        #: per drafter, how often a lookup's branch was taken where the copy was not (DraftBudget.branch)
        self.branches = [Acceptance(*BRANCH_PRIOR) for _ in self.priors]
        #: tokens an answer runs (running estimate), and the count of the one under way
        self.answer_tokens = ANSWER_PRIOR
        self._generated, self._answer_open = 0, False
        #: the answer's first round is still to come: its batch follows the prefill's (see observe)
        self._first_round = False
        self._expected_answer = ANSWER_PRIOR
        #: per drafter, seconds per token of processing a prompt (calibration's catching-up cost
        #: until a prefill has been timed)
        self.prefill_cost = list(costs.catch_up) + [0.0] * (len(self.priors) - len(costs.catch_up))
        self._prefill_seen = [False] * len(self.prefill_cost)
        #: (drafter, tokens behind) of the draft models the last answer left without the prompt
        self.left_behind: list[tuple[int, int]] = []

    def acceptance(self, drafter: int, route: str | None) -> Acceptance:
        """The decayed acceptance counts of one drafter on one route (created from its prior)."""
        key = (drafter, route)
        found = self.acc.get(key)
        if found is None:
            known = self.route_priors[drafter] if drafter < len(self.route_priors) else {}
            prior = known.get(route, self.priors[drafter]) if route is not None else self.priors[drafter]
            found = self.acc[key] = Acceptance(*prior)
        return found

    @property
    def tie_rate(self) -> float:
        return self.ties[0] / (self.ties[0] + self.ties[1])

    @property
    def drift_cost(self) -> float:
        """Seconds a token left with batched K/V costs later, on average (repairs / drifted)."""
        return self.drift[0] / self.drift[1] if self.drift[1] > 0 else 0.0

    def _verify_curve(self, k_max: int) -> list[float]:
        # how far the live machine has moved from calibration, over every size seen often enough
        ratios = [
            self.costs.verify[i] / self.calibrated[i]
            for i in range(len(self.seen))
            if self.seen[i] >= SEEN_ENOUGH and self.calibrated[i] > 0 and self.costs.verify[i] > 0
        ]
        scale = float(np.exp(np.mean(np.log(ratios)))) if ratios else 1.0
        out = []
        for n in range(1, k_max + 2):
            if n <= len(self.seen) and self.seen[n - 1] >= SEEN_ENOUGH:
                out.append(self.costs.verify[n - 1])
            elif n <= len(self.calibrated):
                out.append(self.calibrated[n - 1] * scale)
            else:
                out.append(self.costs.v(n) * scale)
        return out

    def can_pay(self, drafter: int, v: list[float] | None = None) -> bool:
        """Whether this drafter could beat plain decoding even if every draft were accepted
        (`v`: the verify curve up to k_max, when the caller has it already)."""
        v = self._verify_curve(self.k_max) if v is None else v
        return self._always_right_k(drafter, v) > 0

    def _best_k(
        self, drafter: int, rates: Sequence[float], v: list[float], overhead: float = 0.0
    ) -> tuple[int, float]:
        """best_k for drafter i on the curve `v` (V(1)..V(len(v))) at these acceptance rates, priced
        with what the planner knows now: the drafter's cost, the share of near-ties, the exact batch
        size and what drifted K/V cost."""
        return best_k(
            rates,
            v,
            self.costs.draft[drafter],
            tie=self.tie_rate,
            exact_n=self.costs.exact_n,
            overhead=overhead,
            drift_cost=self.drift_cost,
            free_back=self.free_back,
            pass_scale=self.pass_scale[drafter],
        )

    def _always_right_k(self, drafter: int, v: list[float], overhead: float = 0.0) -> int:
        """The best k for this drafter on the curve `v` if every draft were accepted: the depth past
        which even a perfect draft stops paying (0: it never pays)."""
        return self._best_k(drafter, [1.0] * (len(v) - 1), v, overhead)[0]

    def _catch_up_price(self, drafter: int) -> float:
        """Seconds drafter i spends catching up on one context token (0 for a model-free one)."""
        return self.costs.catch_up[drafter] if drafter < len(self.costs.catch_up) else 0.0

    def _catch_up_cost(self, drafter: int, lags: Sequence[int]) -> float:
        """Seconds drafter i spends catching up on the context before it can draft this round."""
        lag = lags[drafter] if drafter < len(lags) else 0
        return lag * self._catch_up_price(drafter)

    def begin_answer(self, lags: Sequence[int], max_new: int) -> list[bool]:
        """Give a drafter the prompt when it can pay at all and, for a draft model with prompt to
        catch up on, when what it is expected to save over the answer covers that prefill.

        Expected saving: the answer's expected length (its limit, or less where recent answers were
        shorter) times the time per token the drafter alone saves at its learned acceptance (vs
        plain decoding: generous to it where n-grams would have done the work anyway). An agent's
        long prompt with short answers leaves a dear draft behind, as its prefill would cost more
        than it earns; a short chat prompt, or a cheap draft for a dear target (a 1B draft, a 70B
        target), is prepared. A drafter left behind is not chosen this answer either: plan()
        spreads a catch-up over the answer, and this prompt was judged not worth it over the whole
        of it."""
        if self._answer_open:
            self.answer_tokens += ANSWER_EMA * (self._generated - self.answer_tokens)
        self._answer_open, self._generated = True, 0
        self._first_round = True
        full = self._verify_curve(self.k_max)
        expected = min(float(max_new), self.answer_tokens)
        self._expected_answer = expected
        out = []
        self.left_behind = []
        for i, lag in enumerate(lags):
            if not self.can_pay(i, full):
                out.append(False)
                continue
            cost = lag * self.prefill_cost[i] if i < len(self.prefill_cost) else 0.0
            out.append(cost <= CHEAP_PREFILL * full[0] or cost <= expected * self._saving(i, full))
            if not out[-1]:
                self.left_behind.append((i, lag))
        return out

    def _saving(self, drafter: int, v: list[float]) -> float:
        """Seconds per answer token drafter i saves over plain decoding at its best learned route."""
        learned = [acc for (d, _), acc in self.acc.items() if d == drafter]
        fastest = 1.0 / v[0]
        for acc in learned or [Acceptance(*self.priors[drafter])]:
            _, speed = self._best_k(drafter, acc.rates(self.k_max, None), v)
            fastest = max(fastest, speed)
        return v[0] - 1.0 / fastest

    def observe_prefill(self, drafter: int, tokens: int, seconds: float) -> None:
        # calibration prices catching up from a 16-token batch; a prompt's long batches run faster
        if not self.learn_costs or tokens < PREFILL_SAMPLE or drafter >= len(self.prefill_cost):
            return
        per = seconds / tokens
        first = not self._prefill_seen[drafter]
        self.prefill_cost[drafter] += (1.0 if first else EMA) * (per - self.prefill_cost[drafter])
        self._prefill_seen[drafter] = True

    def explain(self, names: Sequence[str]) -> str | None:
        """Why auto mode is not drafting at all, when no drafter could ever pay on this hardware, or
        why the last answer left a draft model without the prompt."""
        if any(self.can_pay(i) for i in range(len(self.priors))):
            if not self.left_behind:
                return None
            which = ", ".join(names[i] for i, _ in self.left_behind if i < len(names))
            behind = max(lag for _, lag in self.left_behind)
            return (
                f"-k auto: {which} was not given the {behind}-token prompt: prefilling it would cost "
                "more than it was expected to save in this answer; -k N forces drafting"
            )
        v1, v4 = self.costs.v(1), self.costs.v(4)
        return (
            f"-k auto: drafting with {', '.join(names)} cannot beat plain decoding on this hardware "
            f"(a verify batch of 4 costs {v4 / v1:.1f}x one token), so it decoded plainly; "
            "-k N forces drafting"
        )

    def plan(self, max_k: int, routes: Sequence[str | None], lags: Sequence[int] = ()) -> Plan:
        k_cap = min(self.k_max, max_k)
        if k_cap <= 0:
            return NO_DRAFT
        full = self._verify_curve(self.k_max)  # once per round: can_pay needs it all, the choice k_cap
        v = full[: k_cap + 1]
        which, k, best_speed = None, 0, 1.0 / v[0]
        best_rates: tuple[float, ...] = ()
        behind_prompt = {i for i, _ in self.left_behind}
        for i, route in enumerate(routes):
            if route is None or i in behind_prompt or not self.can_pay(i, full):
                continue
            rates = self.acceptance(i, route).rates(k_cap, self.rng if self.explore else None)
            behind = self._catch_up_cost(i, lags)
            # what it is behind even when it drafts every round
            steady = min(behind, STEADY_LAG * self._catch_up_price(i))
            k_i, speed = self._best_k(i, rates, v, overhead=steady)
            if k_i > 0 and behind > steady:
                # the rest is paid once and serves the rounds it drafts from then on (CATCH_UP_SHARE)
                horizon = max(1.0, CATCH_UP_SHARE * (self._expected_answer - self._generated))
                speed = horizon / (horizon / speed + behind - steady)
            if k_i > 0 and speed > best_speed:
                which, k, best_speed, best_rates = i, k_i, speed, tuple(rates)
        depth = k
        if which is not None and not self.model_free[which]:
            # A draft model stops itself where its next token stops paying (draft_budget), which its
            # confidence predicts far better than the depth does; so the planned k only chose this
            # drafter, and the cap is the depth where even a draft always right would stop paying
            # (at most DEPTH_CAP). Capped at the planned k, drafts stopped before depths they would
            # have passed, which were then never observed.
            perfect = self._always_right_k(which, v, overhead=self._catch_up_cost(which, lags))
            depth = max(k, min(perfect, DEPTH_CAP))
        return Plan(which, depth, speed=best_speed, verify=tuple(v), planned_k=k, rates=best_rates)

    def draft_budget(self, plan: Plan) -> DraftBudget | None:
        """Where a draft model should stop this round (DraftBudget). A token it has computed is
        proposed while the chance that its whole draft so far is accepted (its confidences,
        calibrated by what the verifier accepted, multiplied) is worth its verify row at the speed
        this round is planned for: the row's share of the longer batch, (V(k+1) - V(1))/k (or, deeper
        where the curve steepens, its own rows' slope: FLOOR_WINDOW; the first token, its own row).
        It looks at one more position only while that chance, times what a token there is usually
        accepted at, is worth the draft decode c as well. So a cheap draft on a flat verify curve
        runs on through a few unsure tokens (a 1B draft for a 70B target), and a dear one stops at
        the first. A block drafter has computed every row it reads (c is 0): its floors decide where
        its block stops and which runners-up become side nodes. A lookup (an n-gram copy) has no
        confidence to weigh and no decode to price: its budget holds the rows' prices and the route's
        rates alone, for the branches of its token trees (lookup_tree.py)."""
        which, k, v = plan.drafter, plan.planned_k, plan.verify
        if which is None or k <= 0 or not v:
            return None
        weighed = not self._lookup(which)  # a lookup: no confidence bins, no decode to price
        speed, c = plan.speed, (self.costs.draft[which] if weighed else 0.0)
        row = (v[k] - v[0]) / k  # the planned draft's average verify row
        # the first token's distribution comes with the catch-up decode the round pays anyway, so
        # proposing it costs only its own verify row (a draft model declining it had paid that
        # decode for nothing). A position deeper in the batch can cost more than the average row
        # (where the curve steepens): it is priced at its own, the curve's slope over the
        # FLOOR_WINDOW rows from it, never below the average
        rows = [v[1] - v[0]]  # k > 0, so v holds V(1) and V(2) at least
        for i in range(1, len(v) - 1):
            j = min(len(v) - 1, i + FLOOR_WINDOW)
            rows.append(max(row, (v[j] - v[i]) / (j - i)))
        return DraftBudget(
            floor=min(FLOOR_MAX, speed * row),
            chance=self.confidence[which].chances(self.rng if self.explore else None) if weighed else (),
            sure=self.confidence[which].chances(None) if weighed else (),
            floors=tuple(min(FLOOR_MAX, speed * r) for r in rows),
            ahead=tuple(min(FLOOR_MAX, speed * (c + r)) for r in rows),
            expect=plan.rates,
            branch=self.branches[which].rates(1, None)[0],
        )

    def observe(self, rnd: Round, plan: Plan, budget: DraftBudget | None = None) -> None:
        self._generated += rnd.emitted
        proposed = rnd.drafted if rnd.proposed is None else rnd.proposed
        # the verify batch: a rejection early in it does not make it cheaper, and tokens an earlier
        # rollback left in front of it are rows of it (best_k charges them to the round that risked
        # them; booked to this batch size they would make it look dearer than it is)
        n = proposed + 1 + rnd.replayed
        verify_s = rnd.seconds - rnd.draft_seconds
        # An answer's first round is not timed: after the prompt's batches llama.cpp builds the
        # round's graph and buffers again (and a split target's workers theirs: 1.9 s against 40 ms).
        # Taken as the first of a size, one such round set V(1) at 8x, a draft of 1 then looked
        # far cheaper than plain decoding, and no plain round came to correct it
        warm_up, self._first_round = self._first_round, False
        if self.learn_costs and n <= len(self.costs.verify) and verify_s > 0 and not warm_up:
            # a running mean over the first rounds of a size, then an EMA that follows the machine
            weight = max(EMA, 1.0 / (self.seen[n - 1] + 1))
            if self.seen[n - 1] == 0:
                self.costs.verify[n - 1] = verify_s
            self.costs.verify[n - 1] += weight * (verify_s - self.costs.verify[n - 1])
            self.seen[n - 1] += 1
        if rnd.gap_rows > 0:  # the recent share of rows within the tie margin, plain rounds included
            keep = TIE_DECAY**rnd.gap_rows
            within, outside = rnd.near_ties, rnd.gap_rows - rnd.near_ties
            self.ties = [self.ties[0] * keep + within, self.ties[1] * keep + outside]
        if rnd.drifted or rnd.repaired:
            self.drift = [self.drift[0] * 0.995 + rnd.repair_seconds, self.drift[1] * 0.995 + rnd.drifted]
        drafter = plan.drafter
        if drafter is None:
            return
        if budget is None or self._lookup(drafter):
            full = rnd.drafted
        else:
            full = _full_tokens(budget, rnd.confidence[: rnd.drafted])
        if full > 0:
            # tokens proposed below what a draft decode and their row cost together (a first token,
            # or one the drafter looked at and found less sure than usual) say how such tokens fare
            # (the confidence curve learns it), not what a draft round yields: counted per depth,
            # these cheap one-row tries pulled the rates plan() chooses a drafter by
            self.acceptance(drafter, rnd.route).observe(full, min(rnd.accepted, full))
        if rnd.confidence:
            self.confidence[drafter].observe(rnd.confidence, rnd.accepted)
        if rnd.side_tried:
            self.branches[drafter].observe(1, int(rnd.side_accepted > 0))
        drafting = rnd.draft_seconds - rnd.catch_up_seconds  # catching up is priced separately
        # only a draft model's cost is learned: a model-free drafter's proposals stay free (its
        # microseconds are bookkeeping, not a draft decode). It is learned per one-token decode: the
        # first token's distribution came with the catch-up, so dividing by the tokens proposed
        # would read a step as a fraction of its cost, and deep drafts would look cheap
        steps = proposed if rnd.draft_decodes is None else rnd.draft_decodes
        if self.learn_costs and steps > 0 and drafting > 0 and not self.model_free[drafter]:
            per = drafting / steps
            self.costs.draft[drafter] += EMA * (per - self.costs.draft[drafter])
        if self.learn_costs and drafting > 0 and self.per_pass[drafter]:
            self._learn_pass(drafter, drafting, rnd.draft_decodes or proposed + 1)

    def _lookup(self, drafter: int) -> bool:
        """Whether the drafter copies without a model (no confidence, nothing to decode)."""
        return self.model_free[drafter] and not self.per_pass[drafter]

    def _learn_pass(self, drafter: int, seconds: float, rows: int) -> None:
        """A block pass of `rows` rows took `seconds`: a running mean of its scale, the file's share one of
        its terms (one pass can read far above the rest, 0.93-0.99 of the target's batch where they settle
        at 0.7), then an EMA. The very first pass is not counted: it builds llama.cpp's graph."""
        seen = self._passes_seen[drafter]
        self._passes_seen[drafter] = seen + 1
        v = self._verify_curve(max(1, rows - 1))[-1]
        if seen > 0 and v > 0:
            scale, weight = self.pass_scale[drafter], max(EMA, 1.0 / (seen + self._pass_prior[drafter]))
            self.pass_scale[drafter] += weight * (seconds / v - scale)


def _full_tokens(budget: DraftBudget, confidence: Sequence[float]) -> int:
    """How many of a draft's first tokens were proposed at or above the price of a draft decode and a
    verify row (DraftBudget.ahead_at): the rest were cheap one-row tries."""
    reach = 1.0
    for i, conf in enumerate(confidence):
        reach *= budget.sure_chance(conf, i)
        if reach < budget.ahead_at(i):
            return i
    return len(confidence)


class LoadedModels(Protocol):
    """What make_planner reads of the models a run loaded (models.loader.Loaded, the bench's pair)."""

    @property
    def target(self) -> Model: ...

    @property
    def drafters(self) -> Sequence[Drafter]: ...

    @property
    def backend(self) -> str:
        """llama.cpp's system info and build ("" when unknown): keys the calibration cache."""
        ...

    @property
    def verified_rows(self) -> int:
        """What the build's invariance probe showed exact (calibration.exact_rows)."""
        ...

    @property
    def strict(self) -> bool: ...


def make_planner(loaded: LoadedModels, k: int | None, *, seed: int | None = None) -> FixedK | AutoPlanner:
    """FixedK for `-k N`, the cost-model AutoPlanner for `-k auto`.

    With a seed, the planner's choices must not depend on timing (they decide how the sampler's random
    stream is consumed), so costs stay at their cached calibration and exploration uses the seed.
    What each drafter declares (Drafter: its model, None for a model-free one, and its priors) is
    all the planner knows of it."""
    drafters = loaded.drafters
    if k is not None or not drafters:
        return FixedK(k if k is not None else 0)
    costs = calibrate(
        loaded.target,
        [d.model for d in drafters],
        backend=loaded.backend,
        verified=loaded.verified_rows,
        repeatable=seed is not None,
    )
    return AutoPlanner(
        costs,
        [d.prior for d in drafters],
        model_free=[d.model is None for d in drafters],
        per_pass=[d.per_pass for d in drafters],
        pass_share=[d.pass_share for d in drafters],
        rng=np.random.default_rng(seed),
        learn_costs=seed is None,
        route_priors=[d.route_priors for d in drafters],
        strict=loaded.strict,
        free_back=getattr(loaded.target, "rollback_reach", None),
    )
