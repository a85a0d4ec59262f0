"""Following a copy, and the edits it makes on the way (for the n-gram drafter).

An answer that edits its input copies long stretches of it and changes a few places, often the same
way each time: a rename writes `load_settings` wherever the source had `load_cfg`, a type pass adds
`: str` after the same parameter names. Prompt lookup alone copies the old text at every such place
and loses the rest of its draft there, and after each change it must find its place again from the
last few tokens, where a short match may well pick another spot with the same tokens.

`CopyFollower` keeps a cursor into the text being copied and checks it against every committed
token, so the copy is followed for as long as the answer keeps to it, whichever drafter (or plain
decoding) produced the tokens. Where the answer leaves the copy and a later lookup finds its place
again a few tokens on, the source tokens it skipped and the tokens it wrote instead are learned as an
edit rule (`source -> output`), applied to later drafts wherever the source repeats it. A rule that
drafts a wrong token loses its place at once unless it has been right before; where a rule's text
was not wanted here, the plain copy is followed instead. Rules are exact token sequences, so a rule
only ever changes what is drafted: the target still decides every token.

Where the answer first parts from the copy, the follower does not wait for a lookup to find its place
again: it guesses that the token written replaced the source token (the commonest edit: a rename, a
changed literal) and drafts the source from the next token on, as the route "resync". Without the
guess the rounds after each first-seen edit were plain decoding (no n-gram of the new text occurs in
the source yet), and a fresh lookup then restarted from a short match, whose drafts are kept short.
One committed token that agrees confirms the guess (learned as an edit rule, as a lookup would); one
that does not drops it and the lookup takes over as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: An edit is learned only between nearby places: at most this many source tokens replaced...
MAX_SOURCE = 8
#: ...by at most this many output tokens (a rename, a type annotation, an added argument).
MAX_OUTPUT = 12
#: Edit rules kept (most recently learned first).
MAX_RULES = 16
#: The copy run a confirmed "resync" guess goes on with, at most (see CopyFollower.follow): a copy
#: that held for many tokens, parted for one and agrees again is still the same copy, but the
#: planner should see some fresh evidence first, not the whole run before the edit
RESYNC_RUN = 8
#: A guess is made only where the copy had held for at least this many tokens: a short accidental
#: match that parts is no copy being edited
GUESS_AFTER = 12
#: A rule's score: +1 each time its output was accepted whole, -2 each time it drafted a wrong token;
#: at this score or below it is dropped (so a new rule goes at its first mistake).
DROP_AT = -2
#: A dropped rule is learned again only after this many more sightings of the same edit (an edit the
#: answer makes at some places only, e.g. f-strings for some string literals, would otherwise be
#: relearned and dropped again at every other literal, each time costing a failed draft).
RELEARN_AFTER = 2


@dataclass(slots=True)
class Rule:
    """Where the source has `source`, the answer writes `output`."""

    source: tuple[int, ...]
    output: tuple[int, ...]
    score: int = 0


@dataclass(slots=True)
class _Cursor:
    #: context tokens accounted for, and the last of them (to notice a context that changed)
    n: int
    last: int
    #: the next source index to copy from, and output tokens of a rule still to come before it
    src: int
    queue: tuple[int, ...] = ()
    rule: Rule | None = None
    #: tokens followed in a row (the match that started the copy included)
    run: int = 0
    #: the last committed token was taken to replace the source token before `src` (a guess that
    #: the next committed token confirms or drops), and the run before it
    guess: bool = False
    held: int = 0


class CopyFollower:
    """A cursor into the text being copied, checked token by token, and the edits learned so far."""

    def __init__(self, *, learn: bool = True, resync: bool = True) -> None:
        self.learn = learn
        self.resync = resync
        self.rules: list[Rule] = []
        #: sightings of dropped rules' edits since they were dropped
        self._dropped: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        self._cur: _Cursor | None = None
        #: (source index, output index) where the copy last broke, for learning the edit made there
        self._break: tuple[int, int] | None = None

    def _step(
        self, seq: Sequence[int], src: int, queue: tuple[int, ...], rule: Rule | None, limit: int
    ) -> tuple[int, int, tuple[int, ...], Rule | None] | None:
        """The next copied token and the state after it: (token, src, queue, rule that produced it)."""
        if queue:
            return queue[0], src, queue[1:], rule
        for _ in range(MAX_RULES + 1):  # a deletion rule (empty output) moves on to the next place
            if src >= limit:
                return None
            for r in self.rules:
                if tuple(seq[src : src + len(r.source)]) == r.source:
                    if not r.output:
                        src += len(r.source)
                        break
                    return r.output[0], src + len(r.source), r.output[1:], r
            else:
                return int(seq[src]), src + 1, (), None
        return None

    def follow(self, context: Sequence[int]) -> tuple[int, int] | None:
        """Move the cursor over the tokens committed since the last call; (source index, tokens
        followed in a row) if the copy still holds at the end of `context`, else None."""
        cur = self._cur
        if cur is None:
            return None
        if len(context) < cur.n or int(context[cur.n - 1]) != cur.last:
            self._cur = None  # another context (a new answer): start over
            return None
        while cur.n < len(context):
            got = int(context[cur.n])
            step = self._step(context, cur.src, cur.queue, cur.rule, len(context))
            if step is not None and step[0] != got and step[3] is not None and not cur.queue:
                # the rule's text was not wanted here: does the plain copy go on instead?
                step[3].score += DROP_AT
                plain = int(context[cur.src])
                step = (plain, cur.src + 1, (), None) if plain == got else step
                self._prune()
            if step is None or step[0] != got:
                if cur.queue and cur.rule is not None:
                    cur.rule.score += DROP_AT
                    self._prune()
                guess = self.resync and step is not None and step[3] is None and cur.run >= GUESS_AFTER
                if guess and not cur.guess and not cur.queue:
                    # guess: `got` replaced the source token; the copy goes on after it
                    self._break = (cur.src, cur.n)
                    cur.src, cur.n, cur.last = cur.src + 1, cur.n + 1, got
                    cur.held, cur.run, cur.guess, cur.rule = cur.run, 0, True, None
                    continue
                if not cur.guess:  # after a failed guess the break where the copy parted stays
                    self._break = (cur.src, cur.n) if not cur.queue else None
                self._cur = None
                return None
            if cur.guess:  # confirmed: the edit made at the break is a rule, as a lookup would learn
                self._confirm(context)
                cur.guess, cur.run = False, min(cur.held, RESYNC_RUN)
            _, cur.src, queue, rule = step
            if rule is not None and not queue:
                rule.score += 1
            cur.queue, cur.rule = queue, rule
            cur.n += 1
            cur.last = got
            cur.run += 1
        return cur.src, cur.run

    @property
    def guessing(self) -> bool:
        """Whether the copy is held only by an unconfirmed "resync" guess (its drafts are a route
        of their own: right far less often than a copy that has held)."""
        return self._cur is not None and self._cur.guess

    def _confirm(self, context: Sequence[int]) -> None:
        if self._break is not None and self.learn:
            bs, bo = self._break
            self._learn_edit((int(context[bs]),), (int(context[bo]),))
        self._break = None

    def start(self, context: Sequence[int], end: int, length: int) -> None:
        """Follow the copy that a lookup found: context[end:] continues context, whose last `length`
        tokens agree with those before `end`. If the copy broke a few tokens before, what the
        answer wrote in place of the source tokens it skipped is learned as an edit."""
        n = len(context)
        if self.learn and self._break is not None:
            bs, bo = self._break
            s_end, o_end = end - length, n - length
            if bs <= s_end <= bs + MAX_SOURCE and bo <= o_end <= bo + MAX_OUTPUT:
                self._learn_edit(
                    tuple(int(t) for t in context[bs:s_end]), tuple(int(t) for t in context[bo:o_end])
                )
        self._break = None
        self._cur = _Cursor(n=n, last=int(context[-1]), src=end, run=length)

    def draft(self, context: Sequence[int], k: int) -> list[int]:
        """Up to k tokens of the followed copy after `context`, edit rules applied. Where the source
        reaches the present (the answer repeats what it just wrote), the copy goes on through the
        drafted tokens themselves."""
        cur = self._cur
        if cur is None or cur.n != len(context):
            return []
        seq = list(context)
        src, queue, rule = cur.src, cur.queue, cur.rule
        out: list[int] = []
        while len(out) < k:
            step = self._step(seq, src, queue, rule, len(seq))
            if step is None:
                break
            tok, src, queue, rule = step
            out.append(tok)
            seq.append(tok)
        return out

    def _learn_edit(self, source: tuple[int, ...], output: tuple[int, ...]) -> None:
        """An edit seen where the copy parted: a rule unless it changes nothing or its source has one."""
        if source and source != output and all(r.source != source for r in self.rules):
            self._learn(source, output)

    def _learn(self, source: tuple[int, ...], output: tuple[int, ...]) -> None:
        key = (source, output)
        if key in self._dropped:
            self._dropped[key] += 1
            if self._dropped[key] < RELEARN_AFTER:
                return
            del self._dropped[key]
        self.rules.insert(0, Rule(source, output))
        del self.rules[MAX_RULES:]

    def _prune(self) -> None:
        for r in self.rules:
            if r.score <= DROP_AT:
                self._dropped[(r.source, r.output)] = 0
        self.rules = [r for r in self.rules if r.score > DROP_AT]
