"""Stop strings: the answer ends just before the first one, which is never sent.

Text arrives token by token, and a stop string can span tokens, so text that might be the beginning of
a stop string is held back until the next tokens show whether it is; only then is it sent (or dropped
with the rest). Each piece keeps the source of the token it came from, so the client can still colour
what it gets.
"""

from __future__ import annotations

from collections.abc import Sequence

Piece = tuple[str, str]  # (text, source)


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
        """The first n characters of the held pieces (splitting one if needed)."""
        out: list[Piece] = []
        while n > 0 and self._held:
            text, source = self._held[0]
            if len(text) <= n:
                out.append(self._held.pop(0))
                n -= len(text)
            else:
                out.append((text[:n], source))
                self._held[0] = (text[n:], source)
                n = 0
        return out
