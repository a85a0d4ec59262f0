"""Stop strings: the answer ends just before the first one, which is never sent.

Text arrives token by token, and a stop string can span tokens, so text that might be the beginning of
a stop string is held back until the next tokens show whether it is; only then is it sent (or dropped
with the rest). Each piece keeps the source of the token it came from, so the client can still colour
what it gets; a TokenGate holds each token's logprobs back with its text.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

Piece = tuple[str, str]  # (text, source)
T = TypeVar("T")


class StopFilter:
    """Feed pieces as they come; get back the pieces safe to send now. `stopped` once a stop string
    was seen: everything from it on is dropped, and generation should end."""

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self.stops = tuple(s for s in stops if s)
        self.stopped = False
        self._held: list[Piece] = []

    def feed(self, pieces: Sequence[Piece]) -> list[Piece]:
        if self.stopped:
            return []
        self._held.extend(p for p in pieces if p[0])
        if not self.stops:
            return self._take(sum(len(t) for t, _ in self._held))
        text = "".join(t for t, _ in self._held)
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out = self._take(cut)
            self._held = []
            return out
        return self._take(len(text) - self._partial(text))

    def flush(self) -> list[Piece]:
        """At the end of generation: what was held back was no stop string after all."""
        return [] if self.stopped else self._take(sum(len(t) for t, _ in self._held))

    def _partial(self, text: str) -> int:
        """Length of the longest end of `text` that is the start of some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _take(self, n: int) -> list[Piece]:
        return take_pieces(self._held, n)


def take_pieces(held: list[Piece], n: int) -> list[Piece]:
    """Remove and return the first n characters of `held` (splitting a piece if needed): how a
    filter that holds text back (stop strings here, tool-call markers in toolcalls.py) lets it go."""
    out: list[Piece] = []
    while n > 0 and held:
        text, source = held[0]
        if len(text) <= n:
            out.append(held.pop(0))
            n -= len(text)
        else:
            out.append((text[:n], source))
            held[0] = (text[n:], source)
            n = 0
    return out


class TokenGate(Generic[T]):
    """Per-token records (logprobs) released in step with the text a StopFilter lets through.

    A token's record goes out once all its text has been sent, so a client never gets logprobs for
    text it has not seen (held back as a possible stop string) or will never see (cut by one). A
    token with no text of its own (the first bytes of a character the next token completes) goes out
    once that character has.
    """

    def __init__(self) -> None:
        self._waiting: deque[tuple[int, int, T]] = deque()  # (start, end) characters, record
        self.fed = 0  # characters of all tokens added: where the next token's text starts
        self._sent = 0

    def add(self, length: int, record: T) -> None:
        """The next token: `length` characters of text, and its record."""
        self._waiting.append((self.fed, self.fed + length, record))
        self.fed += length

    def release(self, sent: int) -> list[T]:
        """`sent` more characters went out: the records now due."""
        self._sent += sent
        out: list[T] = []
        while self._waiting and self._waiting[0][0] < self._sent and self._waiting[0][1] <= self._sent:
            out.append(self._waiting.popleft()[2])
        return out

    def finish(self, *, stopped: bool) -> list[T]:
        """At the end: after a stop string, the records of tokens whose text was partly sent (the
        one the cut fell in); otherwise every record left."""
        out: list[T] = []
        while self._waiting and (not stopped or self._waiting[0][0] < self._sent):
            out.append(self._waiting.popleft()[2])
        self._waiting.clear()
        return out
