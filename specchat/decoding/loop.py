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

A draft model's round may be a token tree (decoding/tree.py): its runner-ups at unsure positions as
side nodes of the same batch; the walk then follows the target's tokens down the tree.

Invariants, checked by the tests after every round and after early close: the target cache holds
exactly committed[:-1] (the last committed token is the next round's first input) and each draft
cache holds a prefix of committed. So the output is the target's own, and stopping anywhere leaves
the caches reusable (the chat reuses them across turns).
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .constraint import Constraint, DeadEnd, Walk
from .drafters import DraftBudget, Drafter, Proposal
from .events import Done, Event, Notice, Round, Source, Token
from .logprobs import TokenLogprob, token_logprob
from .model import Model, common_prefix_len, sync_cache
from .processors import AnswerProcessor, LogitsProcessor, ProcessedRows, for_params
from .sampling import SamplingParams
from .settings import MAX_TOKENS
from .tally import Tally
from .tree import TreeModel, fit_side, tree_model, verify_tree
from .verification import judge


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
    #: token-tree batches within `exact_rows` are bit-identical too (calibration.trees_exact: the
    #: build's probe showed it); otherwise every tree row is judged with the margin
    exact_trees: bool = False
    #: greedy output equal to one-token decoding token for token, even where batched K/V left in
    #: the cache by a non-exact batch could tip a near-tie: decisions on such a cache use the margin
    #: too, and a near-tie there first re-decodes the drifted span in exact batches (_Answer.repair)
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
    answer = _Answer(
        target,
        prompt,
        drafters,
        planner if planner is not None else FixedK(4 if drafters else 0),
        settings,
        rng if rng is not None else np.random.default_rng(),
        tally if tally is not None else Tally(),
        constraint,
    )
    try:
        answer.prefill()
        while True:
            stop = answer.out_of_room()
            if stop is not None:
                if stop == "context_full":
                    yield Notice(
                        f"context window full ({target.n_ctx} tokens): the answer was cut here; "
                        "raise --ctx-size for longer output"
                    )
                break
            draft = answer.draft()
            try:
                verdict = answer.verify(draft)
            except DeadEnd:
                stop = "grammar"
                yield Notice("the grammar allows no further token: the answer was cut here")
                break
            emitted, ended = yield from answer.commit(draft, verdict)
            rnd = answer.close_round(draft, verdict, emitted)
            yield rnd
            if ended:
                stop = "eog"
                break
    finally:
        answer.settle()
    tail = answer.detok.flush()
    if tail:
        yield Notice(f"output ended inside a multi-byte character: {tail!r}")
    yield Done(answer.tally.snapshot(stop))


@dataclass(frozen=True, slots=True)
class _Draft:
    """A round's drafting: the plan, the drafter it named (None: plain decoding), the route that drafter
    reported, the budget it drafted under and its proposal (cut to the round's room)."""

    plan: Plan
    drafter: Drafter | None = None
    route: str | None = None
    budget: DraftBudget | None = None
    proposal: Proposal = field(default_factory=Proposal)


@dataclass(frozen=True, slots=True)
class _Verdict:
    """What the target's batch decided this round: `new` to commit (its first `accepted` are drafts),
    after judging `judged` drafts with `margin` (0: every row trusted); the top-2 gaps seen (`gap_rows`
    rows, `near_ties` of them within the tie margin); tokens left in the cache with batched K/V
    (`drifted`); the logprobs asked for; and `seconds`, what the planner learns V(n) from: the batch,
    the walk and the cut-back, not the logprobs (computed for the caller, not for speculation)."""

    new: list[int]
    accepted: int
    judged: int
    margin: float
    gap_rows: int
    near_ties: int
    drifted: int
    logprobs: list[TokenLogprob] | None
    seconds: float
    #: a tree round's side nodes, and how many of the `accepted` drafts were side nodes
    side: int = 0
    side_accepted: int = 0
    side_tried: bool = False
    #: tokens an earlier rollback left that the target decoded in front of this round's batch
    replayed: int = 0

    @property
    def recheck(self) -> bool:
        """Stopped at a near-tie: no target token was decided, and the next round evaluates that
        position one token alone."""
        return len(self.new) == self.accepted


class _Answer:
    """One answer's decoding state, shared by generate's steps: the committed tokens, whether the
    next round is a near-tie's re-check, and where batched K/V begin in the target cache."""

    def __init__(
        self,
        target: Model,
        prompt: Sequence[int],
        drafters: Sequence[Drafter],
        planner: Planner,
        settings: Settings,
        rng: np.random.Generator,
        tally: Tally,
        constraint: Constraint | None,
    ) -> None:
        self.target, self.prompt, self.drafters, self.planner = target, prompt, drafters, planner
        self.settings, self.params, self.rng, self.tally = settings, settings.params, rng, tally
        self.detok = Detokenizer(target)
        self.committed = list(prompt)
        processor = for_params(self.params, settings.processors)  # None: no setting needs the answer so far
        self.processor = AnswerProcessor(processor, len(prompt)) if processor is not None else None
        self.margin = settings.tie_margin if self.params.greedy else 0.0
        self.recheck = False  # the last round stopped at a near-tie: evaluate the next token alone
        #: first committed position whose K/V a non-exact batch wrote (None: the cache is what
        #: one-token decoding would hold). Such K/V differ from one-token ones in the last bits, and
        #: so do the logits of every later row, a single token included: see repair
        self.drift_from: int | None = None
        #: greedy logprobs: drafts per round at most, so every verify batch is bit-identical (Settings)
        logprobs = settings.logprobs is not None
        self.exact_cap = max(0, settings.exact_rows - 1) if logprobs and self.params.greedy else None
        self.walk = (
            Walk(constraint, target.n_vocab, target.is_eog, keep_rows=logprobs)
            if constraint is not None
            else None
        )
        tally.prompt_tokens = len(prompt)
        self.t_decode = 0.0
        #: side nodes a round's token tree may have: none where rows are adjusted per path (the
        #: processors, a constraint) or logprobs are asked for, which read a round as a chain
        plain = processor is None and self.walk is None and not logprobs
        self.tree: TreeModel | None = tree_model(target) if plain else None

    def prefill(self) -> None:
        """Bring the target cache to the prompt (all but its last token, the first round's input),
        and give the prompt to the drafters the planner chose: their prefill counts as prefill, not
        as decoding."""
        t0 = time.perf_counter()
        context = self.prompt[:-1]
        self.tally.prefill_tokens = len(context) - common_prefix_len(self.target.tokens, context)
        sync_cache(self.target, context, logits_row_last=False)
        lags = [d.lag(context) for d in self.drafters]
        chosen = self.planner.begin_answer(lags, self.settings.max_tokens)
        for i, d in enumerate(self.drafters):
            if chosen[i]:
                t_prep = time.perf_counter()
                d.prepare(context)
                self.planner.observe_prefill(i, lags[i], time.perf_counter() - t_prep)
        self.t_decode = time.perf_counter()
        self.tally.prefill_seconds = self.t_decode - t0

    def _remaining(self) -> int:
        return self.settings.max_tokens - (len(self.committed) - len(self.prompt))

    def _room(self) -> int:
        return self.target.n_ctx - len(self.committed) + 1  # positions left for this round's batch

    def out_of_room(self) -> str | None:
        """Why the answer stops before another round ("max_tokens", "context_full"), or None."""
        if self._remaining() <= 0:
            return "max_tokens"
        return "context_full" if self._room() <= 0 else None

    def draft(self) -> _Draft:
        """Plan the round and have the chosen drafter propose: nothing after a near-tie (its
        re-check decides one token alone), at most what the answer and the context have room for."""
        max_k = min(self._remaining() - 1, self._room() - 1)
        if self.exact_cap is not None:
            max_k = min(max_k, self.exact_cap)
        context = self.committed
        routes = [d.route(context) for d in self.drafters] if self.drafters and not self.recheck else []
        lags = [d.lag(context) for d in self.drafters] if routes else []
        plan = self.planner.plan(max_k, routes, lags) if routes else NO_DRAFT
        if plan.drafter is None or plan.k <= 0:
            return _Draft(NO_DRAFT)
        drafter = self.drafters[plan.drafter]
        budget = self.planner.draft_budget(plan)
        proposal = drafter.propose(
            context, plan.k, self.params, self.rng, budget=budget, processor=self.processor
        )
        del proposal.tokens[max_k:]
        if proposal.side:
            fit_side(proposal, self.tree.tree_branches if self.tree is not None else 0)
        return _Draft(plan, drafter, routes[plan.drafter], budget, proposal)

    def verify(self, draft: _Draft) -> _Verdict:
        """The target decodes [last, d1..dk] in one batch; the drafts are judged against its rows
        (verification.judge), and its cache is cut back to the new committed[:-1]. Raises DeadEnd when a
        constraint allows no token."""
        if draft.proposal.side and self.tree is not None:
            return self._verify_tree(draft, self.tree)
        drafts, settings = draft.proposal.tokens, self.settings
        t_verify = time.perf_counter()
        batch = self.target.decode([self.committed[-1], *drafts], range(len(drafts) + 1))
        # a recurrent target that went back through a checkpoint last round decodes the tokens it
        # kept in front of this batch: their rows are part of this round's time
        replayed = int(getattr(self.target, "replayed", 0))
        # row i as plain decoding would see it: the answer so far + d1..d_i
        rows: np.ndarray | ProcessedRows = (
            batch if self.processor is None else self.processor.rows(batch, self.committed, drafts)
        )
        # a one-token batch is evaluated exactly as plain decoding does, and so is one within the
        # measured exact batch size: no margin needed there -- unless earlier batches left K/V
        # in the cache that one-token decoding would not have written
        exact = not drafts or len(drafts) + 1 <= settings.exact_rows
        margin = self.margin if (not exact or (settings.strict and self.drift_from is not None)) else 0.0
        # the top-2 gaps of the rows walked: how tie-prone this text is, for the planner
        gaps: list[float] | None = [] if self.margin > 0.0 else None
        new, n_ok, judged = judge(
            rows, draft.proposal, self.params, self.rng, self.target.n_vocab, margin, gaps, self.walk
        )
        lps, lp_seconds = None, 0.0
        if settings.logprobs is not None:
            # new[i] was decided by rows[i]: read them before truncate (a recurrent cache
            # re-decodes there, overwriting them). Under a constraint: the constrained
            # distribution, from the masked rows
            t_lp = time.perf_counter()
            lps = _logprobs(
                self.walk.rows if self.walk is not None else rows, new, self.params, settings.logprobs
            )
            lp_seconds = time.perf_counter() - t_lp
        self.recheck = len(new) == n_ok
        gap_rows = len(gaps) if gaps is not None else 0
        near_ties = sum(g < self.margin for g in gaps) if gaps is not None else 0
        drifted = self._cut_back(n_ok, batched=not exact)
        return _Verdict(
            new=new,
            accepted=n_ok,
            judged=judged,
            margin=margin,
            gap_rows=gap_rows,
            near_ties=near_ties,
            drifted=drifted,
            logprobs=lps,
            replayed=replayed,
            # the round's cost ends here, before the consumer runs: rendering 16 accepted tokens
            # would make a 17-row batch look dearer than it is
            seconds=time.perf_counter() - t_verify - lp_seconds,
        )

    def _verify_tree(self, draft: _Draft, target: TreeModel) -> _Verdict:
        """verify for a token tree (tree.verify_tree), then the cut-back as after a chain."""
        t_verify = time.perf_counter()
        rows = 1 + len(draft.proposal.tokens) + len(draft.proposal.side)
        exact = self.settings.exact_trees and rows <= self.settings.exact_rows
        strict = self.settings.strict and self.drift_from is not None
        margin = self.margin if (not exact or strict) else 0.0
        gaps: list[float] | None = [] if self.margin > 0.0 else None
        done = verify_tree(target, self.committed[-1], draft.proposal, self.params, self.rng, margin, gaps)
        self.recheck = len(done.new) == len(done.path)
        drifted = self._cut_back(len(done.path), batched=not exact)
        return _Verdict(
            new=done.new,
            accepted=len(done.path),
            judged=done.judged,
            margin=margin,
            gap_rows=len(gaps) if gaps is not None else 0,
            near_ties=sum(g < self.margin for g in gaps) if gaps is not None else 0,
            drifted=drifted,
            logprobs=None,
            seconds=time.perf_counter() - t_verify,
            side=len(draft.proposal.side),
            side_accepted=len(done.path) - done.on_chain,
            side_tried=done.tried,
        )

    def _cut_back(self, n_ok: int, *, batched: bool) -> int:
        """Truncate the target cache, which holds committed[:-1] + [last] + drafts, to the new
        committed[:-1]: committed + accepted drafts, minus one when no target token followed them.
        Returns the tokens whose K/V a batch beyond the exact size left there (tracked under --strict)."""
        start, keep = len(self.committed) - 1, len(self.committed) + n_ok - self.recheck
        self.target.truncate(keep)
        drifted = 0
        if self.settings.strict and batched and self.margin > 0.0 and keep > start:
            drifted = keep - start
            self.drift_from = start if self.drift_from is None else min(self.drift_from, start)
        if self.drift_from is not None and self.drift_from >= keep:
            self.drift_from = None
        return drifted

    def commit(self, draft: _Draft, verdict: _Verdict) -> Generator[Token, None, tuple[int, bool]]:
        """Commit the decided tokens one by one, yielding each (a consumer that stops mid-round has
        what it saw committed); returns (tokens committed, whether one ended the answer)."""
        emitted = 0
        for i, tok in enumerate(verdict.new):
            self.committed.append(tok)
            self.tally.generated += 1
            emitted += 1
            if self.target.is_eog(tok):
                return emitted, True
            lp = verdict.logprobs[i] if verdict.logprobs is not None else None
            if i < verdict.accepted:
                assert draft.drafter is not None
                yield Token(tok, self.detok.piece(tok), draft.drafter.source, draft.drafter.name, lp)
            else:
                chain_ok = verdict.accepted - verdict.side_accepted
                source = Source.BONUS if verdict.side_accepted else _target_source(verdict.judged, chain_ok)
                yield Token(tok, self.detok.piece(tok), source, None, lp)
        return emitted, False

    def repair(self) -> tuple[int, float]:
        """A near-tie on a drifted cache (--strict): the one-token re-check would still see batched
        K/V, so first rewrite them as one-token decoding does (exact-size batches are bit-identical
        to it), then the next round decides this position exactly. Returns (tokens re-decoded, seconds)."""
        if not (self.recheck and self.drift_from is not None and self.settings.strict):
            return 0, 0.0
        t = time.perf_counter()
        repaired = len(self.committed) - 1 - self.drift_from
        _repair(self.target, self.committed, self.drift_from, max(1, self.settings.exact_rows))
        self.drift_from = None
        return repaired, time.perf_counter() - t

    def close_round(self, draft: _Draft, verdict: _Verdict, emitted: int) -> Round:
        """Repair if needed, then record the round: in the tally, and for the planner that planned it."""
        now = time.perf_counter()
        repaired, repair_seconds = self.repair()
        rnd = _record(draft, verdict, emitted, repaired, repair_seconds)
        self.tally.decode_seconds = now + repair_seconds - self.t_decode
        self.tally.add_round(rnd)
        self.planner.observe(rnd, draft.plan, draft.budget)
        return rnd

    def settle(self) -> None:
        """However the answer ended (EOG inside accepted drafts, early close, Ctrl-C mid-decode), leave
        the target cache holding committed[:-1] at most and each draft cache a prefix of committed."""
        keep = min(len(self.committed) - 1, common_prefix_len(self.target.tokens, self.committed))
        if len(self.target.tokens) > keep:
            self.target.truncate(keep)
        for d in self.drafters:
            d.settle(self.committed)


def _record(draft: _Draft, verdict: _Verdict, emitted: int, repaired: int, repair_seconds: float) -> Round:
    """The round's record, the one place a Round is built."""
    proposal = draft.proposal
    return Round(
        drafter=draft.drafter.name if draft.drafter is not None else None,
        k=draft.plan.k,
        drafted=verdict.judged,
        accepted=verdict.accepted - verdict.side_accepted,
        emitted=emitted,
        seconds=verdict.seconds + proposal.seconds,
        draft_seconds=proposal.seconds,
        recheck=verdict.recheck,
        route=draft.route,
        proposed=len(proposal.tokens) + verdict.side,
        catch_up_seconds=proposal.catch_up_seconds,
        draft_decodes=proposal.decodes,
        confidence=tuple(proposal.confidence[: verdict.judged]),
        margin_rows=(verdict.judged + (not verdict.recheck)) if verdict.margin > 0.0 else 0,
        gap_rows=verdict.gap_rows,
        near_ties=verdict.near_ties,
        drifted=verdict.drifted,
        repaired=repaired,
        repair_seconds=repair_seconds,
        side_nodes=verdict.side,
        side_accepted=verdict.side_accepted,
        side_tried=verdict.side_tried,
        replayed=verdict.replayed,
    )


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
    new[i] (see verification.judge)."""
    return [token_logprob(rows[i], tok, params, n_top) for i, tok in enumerate(new)]


def _target_source(n_draft: int, n_ok: int) -> Source:
    if n_draft == 0:
        return Source.TARGET
    return Source.BONUS if n_ok == n_draft else Source.CORRECTION
