"""Prompt lookup: the n-gram drafter, and the match-length routes the lookup drafters share.

Model-free and free to run: it proposes what followed an earlier occurrence of the context's last
tokens, which is right surprisingly often wherever an answer copies its input (edits, refactors,
rewrites, revisions, summaries). `answers.py` looks up earlier answers the same way and shares the
routes and their priors defined here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

from .copying import CopyFollower
from .drafters import DraftBudget, Proposal
from .events import Source
from .lookup_tree import BRANCH_TOKENS, add_branches, branches
from .model import common_prefix_len
from .processors import AnswerProcessor
from .sampling import SamplingParams

#: Match-length classes for routing (lower bounds, in tokens). How long the context's suffix matches
#: earlier text is the strongest predictor of whether the continuation repeats too: on the benchmark's
#: edit prompts a 2-3 token match ran on for 3+ tokens 19-37% of the time, a 16+ token match 75-95%.
MATCH_ROUTES: tuple[int, ...] = (2, 4, 8, 16)
#: How far back a match is measured: beyond this every match is simply "long".
MATCH_HORIZON = 32


def match_route(length: int) -> str:
    """The route of a match of `length` tokens (at least MATCH_ROUTES[0]): its length class, which
    the planner keeps acceptance for. Shared by the drafters that look up earlier text, so their
    routes have the same names as the priors measured for them (NGRAM_ROUTE_PRIORS)."""
    return f"match {max(r for r in MATCH_ROUTES if r <= length)}+"


#: While the copy follower holds only a guess after an edit (copying.py), a fresh lookup takes over
#: only with a match at least this long
RESYNC_OVER = 4

#: Earlier occurrences of an n-gram kept as candidate copy sources (the most recent ones).
CANDIDATES = 8
#: Prior conditional acceptance per match-length route, as Beta(a, b) of strength 4: on the bench's
#: edit prompts a 2-3 token match ran on for 3+ tokens 19-37% of the time, a 16+ token one 75-95%.
#: Without them auto mode needs ~40 rounds of a 200-token answer to learn that long copies pay.
#: The first drafted token, at every position of 22 recorded answers (copying or not): right 53% after
#: a 2-3 token match, 79% after 4-7, 91% after 8-15 and 98% after 16+ (2,238 positions), hence 0.9 and
#: 0.96 for the long routes. "resync" (the copy follower's guess after an edit, copying.py) starts at
#: an even chance: nothing says which way such a guess goes before it is tried.
NGRAM_ROUTE_PRIORS: dict[str, tuple[float, float]] = {
    "resync": (2.0, 2.0),
    "match 2+": (1.4, 2.6),
    "match 4+": (2.4, 1.6),
    "match 8+": (4.5, 0.5),
    "match 16+": (4.8, 0.2),
}


class NgramDrafter:
    """Model-free drafting by prompt lookup: find an earlier occurrence of the context's last n tokens
    (longest n first, up to `max_n`) and propose what followed it then.

    Free to run, and right surprisingly often wherever the answer copies its input: code edits,
    refactors, whole-file rewrites, chat revisions, summaries. An index from each n-gram to its
    latest end positions is extended incrementally, so a lookup costs O(max_n · CANDIDATES) whatever
    the context length. Among the occurrences of the longest n-gram, the one whose preceding tokens
    agree with the context furthest back wins (the most recent on a tie): in an edit the model's own
    output repeats short phrases of the file, and the longest agreement is the place being copied.

    Each round's match is measured (how many tokens before it agree too, up to MATCH_HORIZON) and
    reported as its route, so the auto planner learns acceptance per match length: long matches in
    copied code get long drafts, short accidental ones get none.

    Matches shorter than `min_n` propose nothing: after a single shared token the continuation is
    right too rarely to pay for the longer verify batch (on the benchmark suite a 1-token match was
    accepted 4-76% of the time). An empty proposal costs nothing: the round is then plain decoding.

    Once a lookup has found the place being copied, the copy is followed from there (copying.py)
    for as long as the committed tokens keep to it, instead of being looked up again each round,
    and edits the answer makes on the way (a rename) are learned and drafted where the source
    repeats them (`follow=False`: a fresh lookup every round, as before). Where other occurrences
    part from the copy, their continuations can go in as a token tree's branches (lookup_tree.py).
    """

    source = Source.NGRAM
    model = None
    per_pass = False
    pass_share = 0.0
    prior = (1.0, 1.0)
    route_priors: Mapping[str, tuple[float, float]] = MappingProxyType(NGRAM_ROUTE_PRIORS)
    p_min = None  # a lookup has no confidence; the planner's per-route statistics judge it

    def __init__(
        self,
        max_n: int = 8,
        min_n: int = 2,
        name: str = "ngram",
        *,
        follow: bool = True,
        learn_edits: bool = True,
        resync: bool = True,
        tree_width: int = 0,
    ) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"min_n and max_n must satisfy 1 <= min_n <= max_n (got {min_n} and {max_n})")
        self.name = name
        self.max_n = max_n
        self.min_n = min_n
        self.follow = follow
        self.learn_edits = learn_edits
        self.resync = resync
        #: side branches a round's tree may have at most (decoding/lookup_tree.py; 0: chains only)
        self.tree_width = tree_width
        self._seen: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in range(min_n, max_n + 1)}
        self._copy = CopyFollower(learn=learn_edits, resync=resync)

    def reset(self) -> None:
        self._seen = []
        self._index = {n: {} for n in self._index}
        self._copy = CopyFollower(learn=self.learn_edits, resync=self.resync)

    def _sync(self, context: Sequence[int]) -> None:
        """Index every n-gram that ends before the context's last token."""
        if common_prefix_len(self._seen, context) < len(self._seen):  # context changed: re-index
            self.reset()
        seen = self._seen
        for pos in range(len(seen), len(context) - 1):
            seen.append(int(context[pos]))
            for n, index in self._index.items():
                if pos + 1 >= n:
                    ends = index.setdefault(tuple(seen[pos + 1 - n : pos + 1]), [])
                    ends.append(pos + 1)
                    if len(ends) > CANDIDATES:
                        del ends[0]

    def match(self, context: Sequence[int]) -> tuple[int | None, int]:
        """(where the continuation starts, how many tokens match) for the context's last tokens: the
        followed copy while the answer keeps to it (how many tokens it has followed in a row, up to
        MATCH_HORIZON), else a fresh lookup, which the copy then follows."""
        self._sync(context)
        held = self._copy.follow(context) if self.follow else None
        if held is not None and not self._copy.guessing:
            return held[0], min(held[1], MATCH_HORIZON)
        end, length = self._lookup(context)
        if held is not None and (end is None or length < RESYNC_OVER):
            return held[0], 0  # the follower's guess after an edit (route "resync")
        if end is not None and self.follow:
            self._copy.start(context, end, length)
        return end, length

    def _ends(self, context: Sequence[int]) -> tuple[int, list[int]]:
        """The context's longest suffix n-gram seen before: (n, where its recent occurrences end)."""
        n_ctx = len(context)
        for n in range(min(self.max_n, n_ctx - 1), self.min_n - 1, -1):
            ends = self._index[n].get(tuple(context[n_ctx - n :]))
            if ends:
                return n, ends
        return 0, []

    def _lookup(self, context: Sequence[int]) -> tuple[int | None, int]:
        """The earlier occurrence of the context's longest suffix n-gram that agrees furthest back."""
        n_ctx = len(context)
        n, ends = self._ends(context)
        best, best_len = None, -1
        for end in reversed(ends):  # most recent first: it wins ties
            length = n
            while (
                length < MATCH_HORIZON
                and end - length - 1 >= 0
                and context[end - length - 1] == context[n_ctx - length - 1]
            ):
                length += 1
            if length > best_len:
                best, best_len = end, length
        return (best, best_len) if ends else (None, 0)

    def route(self, context: Sequence[int]) -> str | None:
        end, length = self.match(context)
        if end is None:
            return None
        if length < MATCH_ROUTES[0]:
            return "resync"
        return match_route(length)

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
        """Copy on from the match for up to k tokens, rolling past the end of the context.

        When the copied span reaches the present (the text repeats something it wrote a moment
        ago, e.g. a list of similar lines), the copy goes on through the drafted tokens themselves,
        as llama.cpp's ngram-mod does by looking up its own drafts: a draft ends only at k, and the
        planner picks k from how far such copies have been right on this route.
        """
        start = time.perf_counter()
        end, _ = self.match(context)
        out = Proposal()
        if end is not None and k > 0 and self.follow:
            out.tokens = self._copy.draft(context, k)  # the followed copy, edits applied
        elif end is not None and k > 0:
            n_ctx = len(context)
            span = [int(t) for t in context[end : end + k]]
            while len(span) < k:  # the source caught up with the present: continue from the drafts
                src = end + len(span)
                span.append(span[src - n_ctx] if src >= n_ctx else int(context[src]))
            out.tokens = span
        if out.tokens and self.tree_width > 0 and budget is not None:
            # other occurrences that part from the copy: side branches where their rows pay
            _, ends = self._ends(context)
            offered = branches(context, ends[::-1], out.tokens, budget, BRANCH_TOKENS)
            add_branches(out, offered, self.tree_width, budget)
        out.seconds = time.perf_counter() - start
        return out

    def lag(self, context: Sequence[int]) -> int:
        return 0

    def prepare(self, context: Sequence[int]) -> None:
        self._sync(context)

    def settle(self, context: Sequence[int]) -> None:
        return None
