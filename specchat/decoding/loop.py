"""The speculative decoding loop. Pure Python/numpy over the `Model` protocol; prints nothing.

Each round:
  1. the planner picks a drafter and a draft length k (k = 0: plain decoding this round);
  2. the drafter proposes up to k tokens d1..dk after the committed context;
  3. the target decodes [last, d1..dk] in ONE batch, giving k+1 logits rows (each adjusted by the
     settings' logits processors for the answer so far plus the drafts before it: processors.py);
  4. drafts are checked in order (argmax at temperature 0, the min(1, p/q) rule when sampling); the
     first rejection is replaced by the target's own token (a correction); if all pass, the target's
     last row gives one more token (a bonus);
  5. the target's cache is cut back to the committed tokens; draft caches catch up lazily.

Invariants, checked by the tests after every round and after early close: the target cache holds
exactly committed[:-1] (the last committed token is the next round's first input) and each draft
cache holds a prefix of committed. So the output is the target's own, and stopping anywhere leaves
the caches reusable (the chat reuses them across turns).
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .constraint import Constraint, DeadEnd, Walk
from .drafters import DraftBudget, Drafter, Proposal
from .events import Done, DrafterStats, Event, Notice, Round, RouteStats, Source, Stats, Token
from .logprobs import TokenLogprob, token_logprob
from .model import Model, common_prefix_len, sync_cache
from .processors import AnswerProcessor, LogitsProcessor, ProcessedRows, for_params
from .sampling import SamplingParams, align, greedy, greedy_gap, probs, sample, verify
from .settings import MAX_TOKENS


@dataclass(frozen=True, slots=True)
class Plan:
    """One round's choice, and what the planner chose it from. The loop hands it back to the planner
    that made it (draft_budget, then observe), so a planner keeps nothing from one of those calls to
    the next: a round cut short, or a planner shared by several answers, cannot leave a stale choice
    behind for another round to read."""

    #: index into the drafters; None: no draft this round (plain decoding)
    drafter: int | None = None
    #: draft tokens at most (a drafter that knows its confidence may stop sooner)
    k: int = 0
    #: what a cost-model planner expected of this choice (FixedK leaves them empty): tokens per second,
    #: the verify curve V(1), V(2).. it priced batches with, the draft length that speed was computed
    #: for (`k` may be deeper: a draft model stops itself), and the drafter's acceptance by depth
    speed: float = 0.0
    verify: tuple[float, ...] = ()
    planned_k: int = 0
    rates: tuple[float, ...] = ()


#: a round without a draft: planned so, or not planned at all (a near-tie's one-token re-check)
NO_DRAFT = Plan()


class Planner(Protocol):
    """Per round: which drafter and how many tokens (plan), where a drafter that knows its confidence
    should stop (draft_budget), and what came of it (observe); the Plan travels through all three.

    `routes[i]` is drafter i's `route()` for this round: the kind of context it is in, or None when it
    has nothing to propose (so it must not be chosen)."""

    def plan(self, max_k: int, routes: Sequence[str | None], lags: Sequence[int] = ()) -> Plan:
        """`lags[i]`: context tokens drafter i must catch up on first (Drafter.lag)."""
        ...

    def draft_budget(self, plan: Plan) -> DraftBudget | None:
        """For this plan's draft: where a drafter that knows its confidence should stop
        (Drafter.propose's `budget`); None: at k or its own cut-off (p_min)."""
        ...

    def observe(self, rnd: Round, plan: Plan, budget: DraftBudget | None = None) -> None:
        """The round `plan` chose (NO_DRAFT: no draft ran) happened as `rnd` says, drafted under
        `budget` (what draft_budget gave it)."""
        ...

    def begin_answer(self, lags: Sequence[int], max_new: int) -> list[bool]:
        """An answer starts; per drafter, whether to give it the prompt now (`lags[i]`: tokens it
        must process first, `max_new`: the answer's token limit). One that never pays, or whose
        prefill would cost more than it is expected to save over the answer (a long prompt for a
        short answer), is left behind: its prefill is then not paid at all."""
        ...

    def observe_prefill(self, drafter: int, tokens: int, seconds: float) -> None:
        """Drafter i processed `tokens` of prompt in `seconds` (priced into the next begin_answer)."""
        ...


@dataclass(slots=True)
class FixedK:
    """Always draft k tokens (a drafter's confidence stop may end a round sooner), with the first
    drafter, in the order given, that has something to propose this round: `--draft ngram --draft
    MODEL -k 4` copies where the context repeats and runs the model elsewhere."""

    k: int

    def plan(self, max_k: int, routes: Sequence[str | None], lags: Sequence[int] = ()) -> Plan:
        k = min(self.k, max_k)
        which = next((i for i, route in enumerate(routes) if route is not None), None)
        return Plan(which, k) if k > 0 and which is not None else NO_DRAFT

    def draft_budget(self, plan: Plan) -> DraftBudget | None:
        return None  # -k N drafts N unless the drafter's own confidence cut-off (p_min) stops it

    def observe(self, rnd: Round, plan: Plan, budget: DraftBudget | None = None) -> None:
        return None

    def begin_answer(self, lags: Sequence[int], max_new: int) -> list[bool]:
        # -k N: the user chose to draft, and any drafter may be the first with a proposal in a round
        return [self.k > 0] * len(lags)

    def observe_prefill(self, drafter: int, tokens: int, seconds: float) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Settings:
    """`tie_margin` (greedy only): a batched verify row decides a token only when its top-2 logit gap
    exceeds this; a nearer tie is re-evaluated next round as plain decoding does it, one token alone.
    Backends round batched and one-token evaluation differently (calibration.tie_margin measures how
    much), so without it a near-tie could go the other way than in the target's own decoding."""

    max_tokens: int = MAX_TOKENS
    params: SamplingParams = field(default_factory=SamplingParams)
    tie_margin: float = 0.0
    #: verify batches of up to this many rows are bit-identical to one-token decoding (measured:
    #: calibration.exact_batch), so their rows need no margin; 0 = none known
    exact_rows: int = 0
    #: greedy output equal to one-token decoding token for token, even where batched K/V left in
    #: the cache by a non-exact batch could tip a near-tie: decisions on such a cache use the margin
    #: too, and a near-tie there first re-decodes the drifted span in exact batches (see generate)
    strict: bool = False
    #: report each token's target log-probability and this many alternatives (Token.logprob);
    #: None (the default) computes nothing. Greedy, verify batches then stay within `exact_rows`
    #: (none beyond one row when it is 0): rows of a bigger batch differ from one-token decoding's
    #: on a CPU (another GEMM kernel), and the logprobs are the model's own, equal to plain
    #: decoding's; the tokens are the same either way
    logprobs: int | None = None
    #: logits processors of the caller's own, applied after those the sampling settings ask for
    #: (penalties, logit bias: processors.for_params) to every row a token is decided from
    processors: tuple[LogitsProcessor, ...] = ()


@dataclass(slots=True)
class Tally:
    """Running totals. Callers may pass their own to read partial stats after an interrupt."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0
    generated: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    drafted_by_pos: list[int] = field(default_factory=list)
    accepted_by_pos: list[int] = field(default_factory=list)
    k_history: list[int] = field(default_factory=list)
    drafters: dict[str, DrafterStats] = field(default_factory=dict)
    rechecked: int = 0
    repaired: int = 0
    routes: dict[tuple[str, str | None], RouteStats] = field(default_factory=dict)

    def add_round(self, rnd: Round) -> None:
        self.passes += 1
        self.rechecked += rnd.recheck
        self.repaired += rnd.repaired
        self.drafted += rnd.drafted
        self.accepted += rnd.accepted
        self.k_history.append(rnd.k)
        while len(self.drafted_by_pos) < rnd.drafted:
            self.drafted_by_pos.append(0)
            self.accepted_by_pos.append(0)
        for i in range(rnd.drafted):
            self.drafted_by_pos[i] += 1
            self.accepted_by_pos[i] += i < rnd.accepted
        if rnd.drafter is not None:
            name, route = rnd.drafter, rnd.route
            one = DrafterStats(
                name, rounds=1, drafted=rnd.drafted, accepted=rnd.accepted, seconds=rnd.draft_seconds
            )
            self.drafters[name] = self.drafters.get(name, DrafterStats(name)) + one
            on_route = RouteStats(
                name, route, rounds=1, drafted=rnd.drafted, accepted=rnd.accepted, rechecked=int(rnd.recheck)
            )
            self.routes[name, route] = self.routes.get((name, route), RouteStats(name, route)) + on_route

    def snapshot(self, stop_reason: str) -> Stats:
        return Stats(
            prompt_tokens=self.prompt_tokens,
            prefill_tokens=self.prefill_tokens,
            generated_tokens=self.generated,
            prefill_seconds=self.prefill_seconds,
            decode_seconds=self.decode_seconds,
            drafted=self.drafted,
            accepted=self.accepted,
            target_passes=self.passes,
            stop_reason=stop_reason,
            accepted_by_position=tuple(self.accepted_by_pos),
            drafted_by_position=tuple(self.drafted_by_pos),
            drafters=tuple(self.drafters.values()),
            k_history=tuple(self.k_history),
            rechecked=self.rechecked,
            repaired=self.repaired,
            routes=tuple(self.routes.values()),
        )


class Detokenizer:
    """Incremental UTF-8 text: bytes of a character split across tokens are held back until whole."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def piece(self, token: int) -> str:
        return self._dec.decode(self._model.token_bytes(token))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


def generate(
    target: Model,
    prompt: Sequence[int],
    *,
    drafters: Sequence[Drafter] = (),
    planner: Planner | None = None,
    settings: Settings = Settings(),
    rng: np.random.Generator | None = None,
    tally: Tally | None = None,
    constraint: Constraint | None = None,
) -> Iterator[Event]:
    """Generate after `prompt`, yielding Token, Round and Notice events, and Done last.

    The target's cache may already hold part of the prompt (chat turns): only the difference is
    decoded. Closing the generator early still leaves all caches consistent (see module docstring).
    `constraint` (fresh, at the answer's start): every token is the constrained target's
    (decoding/constraint.py); it advances with the committed tokens and is spent afterwards.
    """
    if not prompt:
        raise ValueError("the prompt must contain at least one token")
    rng = rng if rng is not None else np.random.default_rng()
    planner = planner if planner is not None else FixedK(4 if drafters else 0)
    tally = tally if tally is not None else Tally()
    params = settings.params
    detok = Detokenizer(target)
    committed = list(prompt)
    n_prompt = len(prompt)
    processor = for_params(params, settings.processors)  # None: no setting needs the answer so far
    answer = AnswerProcessor(processor, n_prompt) if processor is not None else None
    margin = settings.tie_margin if params.greedy else 0.0
    recheck = False  # the last round stopped at a near-tie: evaluate the next token alone
    # first committed position whose K/V a non-exact batch wrote (None: the cache is what one-token
    # decoding would hold). Such K/V differ from one-token ones in the last bits, and so do the
    # logits of every later row, a single token included: see the repair below
    drift_from: int | None = None
    # greedy logprobs: drafts per round at most, so every verify batch is bit-identical (Settings)
    exact_cap = max(0, settings.exact_rows - 1) if settings.logprobs is not None and params.greedy else None
    tally.prompt_tokens = n_prompt
    walk = (
        Walk(constraint, target.n_vocab, target.is_eog, keep_rows=settings.logprobs is not None)
        if constraint is not None
        else None
    )

    t0 = time.perf_counter()
    tally.prefill_tokens = len(prompt) - 1 - common_prefix_len(target.tokens, prompt[:-1])
    stop = "interrupted"
    try:
        sync_cache(target, prompt[:-1], logits_row_last=False)
        lags = [d.lag(prompt[:-1]) for d in drafters]
        chosen = planner.begin_answer(lags, settings.max_tokens)
        for i, d in enumerate(drafters):  # drafts process the prompt now, not billed to decoding
            if chosen[i]:
                t_prep = time.perf_counter()
                d.prepare(prompt[:-1])
                planner.observe_prefill(i, lags[i], time.perf_counter() - t_prep)
        t_decode = time.perf_counter()
        tally.prefill_seconds = t_decode - t0
        while True:
            remaining = settings.max_tokens - (len(committed) - n_prompt)
            if remaining <= 0:
                stop = "max_tokens"
                break
            room = target.n_ctx - len(committed) + 1  # positions left for this round's batch
            if room <= 0:
                stop = "context_full"
                yield Notice(
                    f"context window full ({target.n_ctx} tokens): the answer was cut here; "
                    "raise --ctx-size for longer output"
                )
                break
            max_k = min(remaining - 1, room - 1)
            if exact_cap is not None:
                max_k = min(max_k, exact_cap)
            routes = [d.route(committed) for d in drafters] if drafters and not recheck else []
            lags = [d.lag(committed) for d in drafters] if routes else []
            plan = planner.plan(max_k, routes, lags) if routes else NO_DRAFT
            if plan.drafter is None or plan.k <= 0:
                plan = NO_DRAFT
            which, k = plan.drafter, plan.k
            drafter = drafters[which] if which is not None else None
            budget = planner.draft_budget(plan) if drafter is not None else None
            proposal = (
                drafter.propose(committed, k, params, rng, budget=budget, processor=answer)
                if drafter is not None
                else Proposal()
            )
            del proposal.tokens[max_k:]
            n_draft = len(proposal.tokens)
            t_verify = time.perf_counter()
            rows: np.ndarray | ProcessedRows = target.decode(
                [committed[-1], *proposal.tokens], range(n_draft + 1)
            )
            if answer is not None:  # row i as plain decoding would see it: the answer so far + d1..d_i
                rows = answer.rows(rows, committed, proposal.tokens)
            # a one-token batch is evaluated exactly as plain decoding does, and so is one within the
            # measured exact batch size: no margin needed there -- unless earlier batches left K/V
            # in the cache that one-token decoding would not have written
            exact = n_draft == 0 or n_draft + 1 <= settings.exact_rows
            m = margin if (not exact or (settings.strict and drift_from is not None)) else 0.0
            # the top-2 gaps of the rows walked: how tie-prone this text is, for the planner
            gaps: list[float] | None = [] if margin > 0.0 else None
            try:
                new, n_ok, judged = _verify(rows, proposal, params, rng, target.n_vocab, m, gaps, walk)
            except DeadEnd:
                stop = "grammar"
                yield Notice("the grammar allows no further token: the answer was cut here")
                break
            lps, lp_seconds = None, 0.0
            if settings.logprobs is not None:
                # new[i] was decided by rows[i]: read them before truncate (a recurrent cache
                # re-decodes there, overwriting them); not part of the round's cost for the planner.
                # Under a constraint: the constrained distribution, from the masked rows
                t_lp = time.perf_counter()
                lps = _logprobs(walk.rows if walk is not None else rows, new, params, settings.logprobs)
                lp_seconds = time.perf_counter() - t_lp
            recheck = len(new) == n_ok  # stopped at a near-tie: no target token was decided
            gap_rows = len(gaps) if gaps is not None else 0
            near = sum(g < margin for g in gaps) if gaps is not None else 0
            # the cache holds committed[:-1] + [last] + drafts; afterwards it must hold the new
            # committed[:-1]: committed + accepted drafts, minus one when no target token followed them
            start, keep = len(committed) - 1, len(committed) + n_ok - recheck
            target.truncate(keep)
            drifted = 0
            if settings.strict and not exact and margin > 0.0 and keep > start:
                drifted = keep - start
                drift_from = start if drift_from is None else min(drift_from, start)
            if drift_from is not None and drift_from >= keep:
                drift_from = None
            verified = time.perf_counter()  # the round's cost ends here, before the consumer runs
            ended = False
            emitted = 0
            for i, tok in enumerate(new):
                committed.append(tok)
                tally.generated += 1
                emitted += 1
                if target.is_eog(tok):
                    ended = True
                    break
                lp = lps[i] if lps is not None else None
                if i < n_ok:
                    assert drafter is not None
                    yield Token(tok, detok.piece(tok), drafter.source, drafter.name, lp)
                else:
                    yield Token(tok, detok.piece(tok), _target_source(judged, n_ok), None, lp)
            now = time.perf_counter()
            repaired, repair_s = 0, 0.0
            if recheck and drift_from is not None and settings.strict:
                # a near-tie on a drifted cache: the one-token re-check would still see batched K/V,
                # so first rewrite them as one-token decoding does (exact-size batches are
                # bit-identical to it), then the next round decides this position exactly
                repaired = len(committed) - 1 - drift_from
                _repair(target, committed, drift_from, max(1, settings.exact_rows))
                drift_from = None
                repair_s = time.perf_counter() - now
            rnd = Round(
                drafter=drafter.name if drafter is not None else None,
                k=k if drafter is not None else 0,
                drafted=judged,
                accepted=n_ok,
                emitted=emitted,
                # what the planner learns V(n) from: not the time the consumer spent on the tokens
                # (rendering 16 accepted tokens would make a 17-row batch look dearer than it is)
                seconds=verified - t_verify - lp_seconds + proposal.seconds,
                draft_seconds=proposal.seconds,
                recheck=recheck,
                route=routes[which] if drafter is not None and which is not None else None,
                proposed=n_draft,
                catch_up_seconds=proposal.catch_up_seconds,
                draft_decodes=proposal.decodes,
                confidence=tuple(proposal.confidence[:judged]),
                margin_rows=(judged + (not recheck)) if m > 0.0 else 0,
                gap_rows=gap_rows,
                near_ties=near,
                drifted=drifted,
                repaired=repaired,
                repair_seconds=repair_s,
            )
            now += repair_s
            tally.decode_seconds = now - t_decode
            tally.add_round(rnd)
            planner.observe(rnd, plan, budget)
            yield rnd
            if ended:
                stop = "eog"
                break
    finally:
        # whatever happened (EOG inside accepted drafts, early close, Ctrl-C mid-decode), leave the
        # target cache holding committed[:-1] at most and each draft cache a prefix of committed
        keep = min(len(committed) - 1, common_prefix_len(target.tokens, committed))
        if len(target.tokens) > keep:
            target.truncate(keep)
        for d in drafters:
            d.settle(committed)
    tail = detok.flush()
    if tail:
        yield Notice(f"output ended inside a multi-byte character: {tail!r}")
    yield Done(tally.snapshot(stop))


def _repair(target: Model, committed: Sequence[int], start: int, rows: int) -> None:
    """Re-decode committed[start:-1] in batches of at most `rows` (the exact batch size), so the
    target cache holds exactly the K/V one-token decoding writes."""
    target.truncate(start)
    end = len(committed) - 1
    for i in range(start, end, rows):
        target.decode(committed[i : min(i + rows, end)], [])


def _logprobs(
    rows: np.ndarray | ProcessedRows | Sequence[np.ndarray],
    new: Sequence[int],
    params: SamplingParams,
    n_top: int,
) -> list[TokenLogprob]:
    """Each committed token's log-probability under the target row that decided it (never a
    draft's), as decided: processed (processors.py) and, under a constraint, masked. Row i decided
    new[i] (see _verify)."""
    return [token_logprob(rows[i], tok, params, n_top) for i, tok in enumerate(new)]


def _target_source(n_draft: int, n_ok: int) -> Source:
    if n_draft == 0:
        return Source.TARGET
    return Source.BONUS if n_ok == n_draft else Source.CORRECTION


def _verify(
    rows: np.ndarray | ProcessedRows,
    proposal: Proposal,
    params: SamplingParams,
    rng: np.random.Generator,
    n_vocab: int,
    margin: float = 0.0,
    gaps: list[float] | None = None,
    walk: Walk | None = None,
) -> tuple[list[int], int, int]:
    """Walk the drafts against the target rows.

    Returns (tokens to commit, drafts kept, drafts judged). With a greedy `margin`, a row whose top-2
    gap is below it decides nothing: the walk stops before it, committing only the drafts accepted so
    far (possibly nothing), and the caller re-evaluates that position one token alone. When `gaps`
    is given (greedy), the top-2 gap of every row walked is appended to it, computed once. With a
    `walk`, each row is decided under the constraint as left by the tokens decided before it, and
    each decided token advances it (decoding/constraint.py).
    """
    out: list[int] = []
    measure = gaps is not None or margin > 0.0
    if walk is not None:
        walk.start_round()

    def pick(row: np.ndarray) -> tuple[int, float]:
        if walk is not None:
            return walk.greedy(row, margin, measure)
        return greedy_gap(row) if measure else (greedy(row), float("inf"))

    def decide(token: int) -> None:
        out.append(token)
        if walk is not None:
            walk.decided(token)

    for i, tok in enumerate(proposal.tokens):
        if params.greedy:
            best, gap = pick(rows[i])
            if gaps is not None:
                gaps.append(gap)
            if gap < margin:
                return out, i, i
            decide(best)
            if best != tok:
                return out, i, i + 1
            continue
        p = walk.probs(rows[i], params) if walk is not None else probs(rows[i], params)
        if proposal.q is not None:
            q = align(proposal.q[i], n_vocab)
        else:  # a deterministic drafter (n-gram): q is one-hot at its token
            q = np.zeros(n_vocab)
            if tok < n_vocab:
                q[tok] = 1.0
        ok, tok2 = verify(p, q, tok, rng)
        decide(tok2)
        if not ok:
            return out, i, i + 1
    n = len(proposal.tokens)
    last = rows[n]
    if params.greedy:
        best, gap = pick(last)
        if gaps is not None:
            gaps.append(gap)
        if gap < margin:
            return out, n, n
        decide(best)
    else:
        decide(sample(walk.probs(last, params) if walk is not None else probs(last, params), rng))
    return out, n, n
