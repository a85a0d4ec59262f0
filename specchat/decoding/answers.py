"""A store of earlier answers, drafted from wherever the current answer repeats one (`--draft answers`).

Agents and editors send near-identical requests and get near-identical answers: the same tool-call
JSON, the same file edited once more, the same refusal. Prompt lookup (the n-gram drafter) cannot draft
those, since the text being repeated is not in the prompt but in an answer the server gave earlier.
This drafter remembers the tokens of the answers it has seen (the last MAX_ANSWERS, at most
MAX_STORED tokens in all, the oldest forgotten first) and, when the last tokens of the current context
(prompt and answer so far) agree with a place in a remembered answer, proposes what followed there.

Each answer is kept with the LEAD_IN prompt tokens before it, so a repeated request is drafted from
its answer's first token: the prompt's end (the user's last words, then the chat template's turn for
the assistant) is where the remembered answer began. Only answer tokens are ever proposed.

The lookup is the n-gram drafter's rule (ngram.py): the place whose preceding tokens agree with
the context furthest back wins, measured up to MATCH_HORIZON tokens, the most recent on a tie, and no
match shorter than `min_n` proposes anything; the route is the match's length class (`match_route`),
so the planner learns per match length, as for the n-gram drafter. Its index is not reused: the
n-gram drafter keeps 7 entries per token of one growing context (a Python object each) and has no
way to forget; this store keeps one flat array (8 bytes a token) and compares it whole with numpy,
once per round (`route` and `propose` share it), which stays well under a millisecond at the full
bound, and an answer is forgotten by rebuilding the array when one is learned.

How it knows where an answer starts: the loop hands `prepare` the prompt less its last token (that
token is the first round's input), so the answer starts one token past it; when the planner does not
prepare this drafter, the first `route` call of the answer sees the prompt itself. `settle`, called
once at the end of every answer however it ended, is where the answer is learned.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

from .drafters import DraftBudget, Proposal
from .events import Source
from .ngram import MATCH_HORIZON, MATCH_ROUTES, NGRAM_ROUTE_PRIORS, match_route
from .processors import AnswerProcessor
from .sampling import SamplingParams

#: Answers remembered at most (the oldest is forgotten first)
MAX_ANSWERS = 64
#: Tokens remembered at most over all answers, lead-ins included (a longer answer keeps its start)
MAX_STORED = 65_536
#: Prompt tokens kept before each answer: enough for a match to reach the longest route (16+) on the
#: first round of a repeated request, and to tell apart requests whose last few tokens are the same
#: chat template
LEAD_IN = MATCH_HORIZON
#: Between remembered texts in the flat array: no token equals it, so no match runs across two
_SEP = -1

#: The n-gram drafter's priors for the same match-length routes. They were measured on copies within
#: one context, not on remembered answers; they say the same thing here (a long agreement with earlier
#: text is likely to continue), and the planner's evidence on each route outweighs them as it comes.
ANSWER_ROUTE_PRIORS: dict[str, tuple[float, float]] = {
    match_route(lo): NGRAM_ROUTE_PRIORS[match_route(lo)] for lo in MATCH_ROUTES
}


class AnswersDrafter:
    """Model-free drafting from a bounded store of earlier answers (see the module docstring)."""

    source = Source.NGRAM  # a lookup in earlier text: shown as the n-gram drafter's tokens are
    model = None
    per_pass = False
    pass_share = 0.0
    prior = (1.0, 1.0)
    route_priors: Mapping[str, tuple[float, float]] = MappingProxyType(ANSWER_ROUTE_PRIORS)
    p_min = None  # a lookup has no confidence; the planner's per-route statistics judge it

    def __init__(
        self,
        *,
        max_answers: int = MAX_ANSWERS,
        max_stored: int = MAX_STORED,
        min_n: int = MATCH_ROUTES[0],
        name: str = "answers",
    ) -> None:
        if max_answers < 1 or max_stored < 1 or min_n < 1:
            raise ValueError("max_answers, max_stored and min_n must be positive")
        self.name = name
        self.max_answers = max_answers
        self.max_stored = max_stored
        self.min_n = min_n
        self.reset()

    def reset(self) -> None:
        """Forget every answer (the bench calls this between measurements)."""
        #: each remembered text (lead-in + answer) and how many of its tokens are the lead-in
        self._texts: deque[tuple[np.ndarray, int]] = deque()
        self._stored = 0
        #: where the current answer starts in the context (None: not known yet)
        self._start: int | None = None
        #: the last lookup, keyed by the store's version and the context's last tokens (all a lookup
        #: reads), so a round's `propose` does not repeat its `route`'s
        self._version = 0
        self._last: tuple[tuple[int, tuple[int, ...]], tuple[int | None, int]] | None = None
        self._rebuild()

    @property
    def answers(self) -> int:
        """Answers remembered now."""
        return len(self._texts)

    @property
    def stored(self) -> int:
        """Tokens remembered now, lead-ins included (at most `max_stored`)."""
        return self._stored

    # --- learning -------------------------------------------------------------------------------
    def prepare(self, context: Sequence[int]) -> None:
        """`context` is the prompt less its last token (loop.generate): the answer starts after it."""
        self._start = len(context) + 1

    def settle(self, context: Sequence[int]) -> None:
        """Remember the answer that ended with `context` (its part past the prompt), if any."""
        start, self._start = self._start, None
        if start is None or start >= len(context):
            return
        lead = max(0, start - LEAD_IN)
        text = np.asarray(context[lead : lead + self.max_stored], dtype=np.int64)
        if len(text) > start - lead:  # a bound smaller than the lead-in leaves no answer to keep
            self._remember(text, start - lead)

    def _remember(self, text: np.ndarray, lead: int) -> None:
        """Add one text (the newest), dropping an identical one and then the oldest beyond the bounds."""
        for i, (old, old_lead) in enumerate(self._texts):
            if old_lead == lead and np.array_equal(old, text):
                del self._texts[i]  # the same answer again: keep one copy, now the newest
                self._stored -= len(old)
                break
        self._texts.append((text, lead))
        self._stored += len(text)
        while len(self._texts) > self.max_answers or self._stored > self.max_stored:
            old, _ = self._texts.popleft()
            self._stored -= len(old)
        self._rebuild()

    def _rebuild(self) -> None:
        """The flat array of every remembered text, each after a separator, and the positions where
        a continuation may start (the answers' tokens, never a lead-in's)."""
        parts: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        at = 0
        for text, lead in self._texts:
            parts += [np.array([_SEP], dtype=np.int64), text]
            starts.append(np.arange(at + 1 + lead, at + 1 + len(text)))
            at += 1 + len(text)
        parts.append(np.array([_SEP], dtype=np.int64))
        self._flat = np.concatenate(parts)
        self._starts = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
        #: the token before each start, compared first (most candidates fail there)
        self._before = self._flat[self._starts - 1]
        self._version += 1

    # --- drafting -------------------------------------------------------------------------------
    def match(self, context: Sequence[int]) -> tuple[int | None, int]:
        """(where in the store the continuation starts, how many tokens agree) for the remembered
        place that agrees with the end of `context` furthest back (up to MATCH_HORIZON; the most
        recent on a tie), or (None, 0) when none agrees for `min_n` tokens."""
        key = (self._version, tuple(int(t) for t in context[-MATCH_HORIZON:]))
        if self._last is None or self._last[0] != key:
            self._last = (key, self._lookup(context))
        return self._last[1]

    def _lookup(self, context: Sequence[int]) -> tuple[int | None, int]:
        n_ctx = len(context)
        if n_ctx < self.min_n or not len(self._starts):
            return None, 0
        cand = self._starts[self._before == context[-1]]
        length = 1
        while len(cand) and length < min(MATCH_HORIZON, n_ctx):
            # separators never equal a token, so a candidate that survives never reaches index 0
            keep = cand[self._flat[cand - length - 1] == context[-length - 1]]
            if not len(keep):
                break
            cand, length = keep, length + 1
        if not len(cand) or length < self.min_n:
            return None, 0
        return int(cand[-1]), length  # positions ascend with recency: the last is the newest

    def route(self, context: Sequence[int]) -> str | None:
        if self._start is None:  # not given the prompt (Planner.begin_answer): the prompt is `context`
            self._start = len(context)
        end, length = self.match(context)
        return match_route(length) if end is not None else None

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
        """What followed the match in the remembered answer, up to k tokens or that answer's end."""
        start = time.perf_counter()
        out = Proposal()
        end, _ = self.match(context) if k > 0 else (None, 0)
        if end is not None:
            span = self._flat[end : end + k]
            stop = np.flatnonzero(span == _SEP)
            out.tokens = [int(t) for t in span[: stop[0] if len(stop) else len(span)]]
        out.seconds = time.perf_counter() - start
        return out

    def lag(self, context: Sequence[int]) -> int:
        return 0
