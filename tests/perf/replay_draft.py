"""The draft model in replay_planner.py: teacher-forced once, then replayed as a drafter.

Greedy and bit-exact, a draft model's k tokens from position i are known from one pass over the
recorded answer: at every position its argmax and confidence given the *true* prefix. A draft is right
up to its first difference from the answer, and nothing after that is kept; so which tokens a round
accepts is exact. What is not known is how the draft would have gone on after its first wrong token
(it would be conditioned on that token, not on the answer): its confidence there, which decides where
a p-min cut-off or auto's budget stops it and so how long the batch is, is taken to be the confidence
it had at the same position on the true path. Only the cost of such rounds depends on that.

Also here: the hindsight bound over both drafters (the draft model and n-gram lookup).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specchat.decoding.drafters import (
    Alternative,
    DraftBudget,
    Proposal,
    pick_side,
    second_choice,
)
from specchat.decoding.events import Source
from specchat.decoding.model import common_prefix_len
from specchat.decoding.ngram import NgramDrafter
from specchat.decoding.processors import AnswerProcessor
from specchat.decoding.sampling import SamplingParams, top_prob

#: seconds of Python per round (planner + verify), measured with cProfile (as replay_planner's)
ROUND_OVERHEAD = 0.0006


def billed(verify: Sequence[float]) -> list[float]:
    """The verify curve as a replayed round is billed, each batch plus the loop's ROUND_OVERHEAD:
    what a live planner measures a round at, so the replayed planner is given it too."""
    return [c + ROUND_OVERHEAD for c in verify]


@dataclass(slots=True)
class DraftTrace:
    """Per output position i: whether the draft's greedy token given the true prefix is output[i],
    and its confidence (top probability) there; and for token trees, whether its second choice is
    output[i] and that choice's share of the mass left after the first (drafters.second_choice).
    Traces recorded before trees have no second choices (empty): their trees never hit."""

    right: list[bool]
    conf: list[float]
    second_right: list[bool] = field(default_factory=list)
    second_share: list[float] = field(default_factory=list)


def teacher_force_draft(
    draft_path: str, cases: dict[str, tuple[list[int], list[int], list[float]]]
) -> dict[str, DraftTrace]:
    """One batched pass of the draft model over each recorded answer (prompt + output)."""
    from pathlib import Path

    from specchat.llama.engine import LlamaModel, LoadOptions

    out: dict[str, DraftTrace] = {}
    with LlamaModel(Path(draft_path), LoadOptions(n_ctx=4096)) as m:
        for name, (prompt, output, _gaps) in cases.items():
            m.truncate(0)
            m.decode(prompt[:-1], [])
            trace = DraftTrace([], [])
            seq = [prompt[-1], *output[:-1]]
            for start in range(0, len(seq), 64):  # 64 rows of logits at a time (151k floats each)
                rows = m.decode(seq[start : start + 64], range(len(seq[start : start + 64])))
                for j, row in enumerate(rows):
                    row = np.asarray(row)
                    tok, c = top_prob(row)
                    alt = second_choice(row, tok, c, 0, 1.0, 0.0, None, np.random.default_rng(0))
                    trace.right.append(tok == output[start + j])
                    trace.conf.append(c)
                    trace.second_right.append(alt is not None and alt.token == output[start + j])
                    trace.second_share.append(alt.value if alt is not None else 0.0)
            out[name] = trace
    return out


@dataclass(slots=True)
class ReplayDraftModel:
    """A draft model that proposes what the teacher-forced pass says it would: the answer's token
    while its greedy choice was right, then a wrong token, then (after a miss) tokens that are never
    kept. Stops as ModelDrafter does: at k, below `p_min`, or where the budget's chance runs out.
    Its `seconds` are simulated as ModelDrafter spends them: one batch over the tokens it lags by
    (which also gives its first draft's distribution), priced `draft` x batch[lag - 1] (the
    hardware's batch curve as multiples of one token), then one `draft` decode per draft after
    which it went on (none after the k-th). The loop bills them to the round."""

    n_prompt: int
    output: list[int]
    trace: DraftTrace
    n_vocab: int
    p_min: float
    draft: float
    batch: Sequence[float]
    name: str = "draft"
    source: Source = Source.DRAFT
    #: side nodes a round's token tree may have, as ModelDrafter.tree_width
    tree_width: int = 0
    _cache: list[int] = field(default_factory=list)

    def route(self, context: Sequence[int]) -> str | None:
        return "model"

    def lag(self, context: Sequence[int]) -> int:
        return len(context) - common_prefix_len(self._cache, context)

    def prepare(self, context: Sequence[int]) -> None:
        self._cache = list(context)

    def settle(self, context: Sequence[int]) -> None:
        del self._cache[common_prefix_len(self._cache, context) :]

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        budget: DraftBudget | None = None,
        processor: AnswerProcessor | None = None,
    ) -> Proposal:
        lag = self.lag(context)
        i = len(context) - self.n_prompt  # the output position of the first draft
        out = Proposal()
        reach, sure, on_track, decodes = 1.0, 1.0, True, 0
        alternatives: list[Alternative] = []
        for j in range(k):
            p = i + j
            if p >= len(self.output):
                break
            if j > 0:
                decodes += 1  # the previous draft decoded, for this one's distribution
            conf = self.trace.conf[p]
            before = reach
            chance = budget.accept_chance(conf, j) if budget is not None else conf
            if budget is not None:
                reach *= chance
                sure *= budget.sure_chance(conf, j)
            if conf < self.p_min:
                break
            if budget is not None and reach < budget.floor_at(j):
                break  # as ModelDrafter: not worth its verify row
            right = on_track and self.trace.right[p]
            if self.tree_width > 0 and p < len(self.trace.second_share):
                # the second choice is the answer's token only on the true path, where the first missed
                hit = on_track and not right and self.trace.second_right[p]
                token = self.output[p] if hit else (self.output[p] + 2) % self.n_vocab
                value = before * (1.0 - chance) * self.trace.second_share[p]
                alternatives.append(Alternative(j, token, value))
            out.tokens.append(self.output[p] if right else (self.output[p] + 1) % self.n_vocab)
            out.confidence.append(conf)
            on_track = right
            if budget is not None and not budget.looks_ahead(sure, j + 1):
                break  # as ModelDrafter: the next position is not worth a draft decode
        if alternatives:
            pick_side(out, alternatives, self.tree_width, budget)
        # its cache now holds the context and every draft but the last (ModelDrafter decodes those)
        self._cache = [*context, *out.tokens[:-1]]
        if lag > 0:
            out.catch_up_seconds = self.draft * self.batch[min(lag, len(self.batch)) - 1]
        out.seconds = out.catch_up_seconds + decodes * self.draft
        out.decodes = decodes
        return out


def hindsight_seconds(
    prompt: list[int],
    output: list[int],
    gaps: list[float],
    verify: list[float],
    margin: float,
    exact_n: int,
    *,
    trace: DraftTrace | None = None,
    draft: float = 0.0,
    ngram: bool = True,
) -> float:
    """The fastest schedule of rounds any planner could choose knowing the answer, in seconds.

    best[i][r]: seconds to finish from output position i; r = 1 when a near-tie stopped the round
    before, so this round may only verify an exact batch (the loop re-checks that position as
    one-token decoding does). A round from i drafts k tokens with the n-gram drafter (its proposal
    there) or the draft model (right while the teacher-forced pass was, k drafted tokens billed);
    it walks its rows: an inexact batch stops at a row whose top-2 gap is within the margin
    (committing the drafts before it), a wrong draft gives the target's correction, k right drafts
    give k + 1 tokens. A draft model's catching up after other rounds is not billed, so the bound
    is, if anything, too high."""
    n_out, k_top = len(output), len(verify) - 1
    props: list[list[bool]] = []
    if ngram:
        drafter = NgramDrafter()
        for i in range(n_out):
            ctx = prompt + output[:i]
            p = drafter.propose(ctx, k_top, None, None).tokens if drafter.route(ctx) else []  # type: ignore[arg-type]
            props.append([t == output[i + j] for j, t in enumerate(p) if i + j < n_out])
    v = billed(verify)
    best = [[0.0, 0.0] for _ in range(n_out + 1)]

    def walk(i: int, k: int, hits: Sequence[bool], after_tie: int, cost: float) -> float | None:
        inexact = k + 1 > exact_n
        if after_tie and inexact:
            return None
        j = 0
        while True:
            if inexact and gaps[i + j] < margin:
                return cost + best[i + j][1]
            if j == k or not hits[j]:
                return cost + best[min(n_out, i + j + 1)][0]
            j += 1

    for i in range(n_out - 1, -1, -1):
        for after_tie in (1, 0):  # best[i][1] first: a tie on row 0 hands position i to it
            here = v[0] + best[i + 1][0]
            sources: list[tuple[list[bool], float]] = []
            if ngram and props[i]:
                sources.append((props[i], 0.0))
            if trace is not None:
                run = 0
                while i + run < n_out and trace.right[i + run] and run < k_top:
                    run += 1
                sources.append(([True] * run + [False], draft))
            for hits, per in sources:
                # past its first wrong draft a longer draft only costs more: stop there
                top = min(len(hits), k_top, n_out - i - 1)
                if False in hits:
                    top = min(top, hits.index(False) + 1)
                for k in range(1, top + 1):
                    t = walk(i, k, hits, after_tie, v[k] + k * per)
                    if t is not None:
                        here = min(here, t)
            best[i][after_tie] = here
    return best[0][0]
