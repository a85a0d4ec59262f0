"""The OpenAI wire format's responses: whole responses, stream chunks, usage and logprobs.

Beyond OpenAI's fields, every response and each choice's last stream chunk carry `speculative` (the
loop's `Stats.to_dict()`: drafted, accepted, acceptance_rate, target_passes, tokens_per_pass,
k_history, per-drafter figures...), and every content chunk carries `pieces`: its text split by the
token each piece came from, with that token's source (draft, ngram, correction, bonus, target), so a
client can colour them as `specchat run` does, and `progress`: the answer's running figures (tokens,
acceptance, tokens per target pass, tok/s) for a live display.

`logprobs` come from the target's own rows (loop.Settings.logprobs, specchat/decoding/logprobs.py) in
OpenAI's two shapes: chat's `content[]` of {token, logprob, bytes, top_logprobs}, and completions'
`tokens` / `token_logprobs` / `top_logprobs` / `text_offset` (with `echo`, the prompt's tokens first:
server/echo.py). With `n` > 1 the answers are generated one after the other on the same prompt (whose
cache they share); each choice has its own index, finish_reason and `speculative`, and the top-level
figures are their totals.

Pure functions and frozen records over dicts, like the requests' side (`api.py`), tested directly.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..decoding.events import Stats, total
from ..decoding.logprobs import TokenLogprob
from .fields import Kind
from .stops import Piece

if TYPE_CHECKING:
    from ..decoding.loop import Tally

#: What a log-probability of minus infinity is sent as (JSON has no -inf; OpenAI uses this value).
NO_PROBABILITY = -9999.0


@dataclass(frozen=True, slots=True)
class LogprobEntry:
    """One sent token's log-probabilities in wire terms: its bytes and logprob, the alternatives' bytes
    and logprobs (likeliest first), and where its text starts in the choice's text (in characters).
    `logprob` is None only for an echoed prompt's first token, which nothing comes before."""

    token: bytes
    logprob: float | None
    top: tuple[tuple[bytes, float], ...]
    offset: int


def logprob_entry(
    token: int, lp: TokenLogprob, offset: int, token_bytes: Callable[[int], bytes]
) -> LogprobEntry:
    """A loop's TokenLogprob with token ids turned into bytes (`token_bytes`: the target's)."""
    return LogprobEntry(token_bytes(token), lp.logprob, tuple((token_bytes(t), v) for t, v in lp.top), offset)


@dataclass(frozen=True, slots=True)
class Progress:
    """An answer's running figures after a round, for a live display (the `progress` of a chunk)."""

    generated: int
    drafted: int
    accepted: int
    passes: int
    seconds: float

    @classmethod
    def of(cls, tally: Tally) -> Progress:
        return cls(tally.generated, tally.drafted, tally.accepted, tally.passes, tally.decode_seconds)

    def to_dict(self) -> dict[str, object]:
        return {
            "generated_tokens": self.generated,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
            "target_passes": self.passes,
            "tokens_per_pass": round(self.generated / self.passes, 4) if self.passes else 0.0,
            "decode_seconds": round(self.seconds, 6),
            "tokens_per_second": round(self.generated / self.seconds, 3) if self.seconds > 0 else 0.0,
        }


@dataclass(frozen=True, slots=True)
class Choice:
    """One finished answer of a request; `logprobs` is None when the request asked for none."""

    index: int
    text: str
    finish_reason: str
    stats: Stats
    logprobs: tuple[LogprobEntry, ...] | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """Identity of one response, shared by all its chunks. `echo`: the prompt text, for a completion
    request with `echo: true` (it comes before each choice's text), and with logprobs asked for, its
    tokens' entries (server/echo.py), which come before each choice's."""

    kind: Kind
    model: str
    id: str
    created: int
    echo: str = ""
    echo_logprobs: tuple[LogprobEntry, ...] = ()

    @classmethod
    def new(
        cls, kind: Kind, model: str, *, echo: str = "", echo_logprobs: tuple[LogprobEntry, ...] = ()
    ) -> Reply:
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        return cls(kind, model, f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time()), echo, echo_logprobs)

    def _head(self, *, chunk: bool) -> dict[str, object]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def body(self, choices: Sequence[Choice], cached: int) -> dict[str, object]:
        """The whole (not streamed) response; `cached`: the first answer's cached prompt tokens."""
        stats = [c.stats for c in choices]
        return {
            **self._head(chunk=False),
            "choices": [self._choice(c) for c in choices],
            "usage": usage(stats, cached),
            "speculative": speculative(combined(stats)),
        }

    def _choice(self, c: Choice) -> dict[str, object]:
        if self.kind == "chat":
            return {
                "index": c.index,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": None if c.logprobs is None else {"content": chat_logprobs(c.logprobs)},
                "finish_reason": c.finish_reason,
                "speculative": speculative(c.stats),
            }
        return {
            "index": c.index,
            "text": self.echo + c.text,
            "logprobs": None if c.logprobs is None else self._completion_logprobs(c.logprobs),
            "finish_reason": c.finish_reason,
            "speculative": speculative(c.stats),
        }

    def chunk(
        self,
        pieces: Sequence[Piece] = (),
        *,
        index: int = 0,
        first: bool = False,
        finish_reason: str | None = None,
        logprobs: Sequence[LogprobEntry] | None = None,
        progress: Progress | None = None,
    ) -> dict[str, object]:
        """One stream chunk of choice `index`: text (with its `pieces` and, when asked, logprobs), the
        opening one (chat: the role; a completion with echo: the prompt), or the finish reason."""
        text = "".join(t for t, _ in pieces)
        lp: object = None
        if self.kind == "chat":
            delta: dict[str, object] = {}
            if first:
                delta["role"] = "assistant"
            if pieces or first:
                delta["content"] = text
            if logprobs is not None:
                lp = {"content": chat_logprobs(logprobs)}
            choice: dict[str, object] = {"index": index, "delta": delta, "logprobs": lp}
        else:
            if logprobs is not None:
                lp = completion_logprobs(logprobs, len(self.echo))
            elif first and self.echo_logprobs:
                lp = completion_logprobs(self.echo_logprobs)
            choice = {"index": index, "text": self.echo + text if first else text, "logprobs": lp}
        choice["finish_reason"] = finish_reason
        out = {**self._head(chunk=True), "choices": [choice]}
        if pieces:
            out["pieces"] = [{"text": t, "source": s} for t, s in pieces]
        if progress is not None:
            out["progress"] = progress.to_dict()
        return out

    def _completion_logprobs(self, entries: Sequence[LogprobEntry]) -> dict[str, object]:
        """A whole choice's: the echoed prompt's tokens, then the answer's after the prompt's text."""
        out = completion_logprobs(entries, len(self.echo))
        if self.echo_logprobs:
            head = completion_logprobs(self.echo_logprobs)
            out = {key: [*head[key], *out[key]] for key in out}  # type: ignore[misc]
        return out

    def final_chunk(
        self, index: int, finish_reason: str, stats: Stats, *, totals: Sequence[Stats] = (), cached: int = 0
    ) -> dict[str, object]:
        """The chunk that ends choice `index`; it carries that answer's `speculative` whatever the
        client asked, and the last choice's also the request's usage (`totals`: every answer's)."""
        out = {**self.chunk(index=index, finish_reason=finish_reason), "speculative": speculative(stats)}
        if totals:
            out["usage"] = usage(totals, cached)
        return out

    def usage_chunk(self, stats: Sequence[Stats], cached: int) -> dict[str, object]:
        """OpenAI's `stream_options.include_usage` chunk: no choices, the usage (and `speculative`)."""
        return {
            **self._head(chunk=True),
            "choices": [],
            "usage": usage(stats, cached),
            "speculative": speculative(combined(stats)),
        }


def usage(stats: Sequence[Stats], cached: int, n: int | None = None) -> dict[str, object]:
    """OpenAI's usage object over a request's answers, `n` per prompt in index order (None: all of
    one prompt), each prompt counted once; `cached_tokens` are the prompt tokens the target did not
    decode (found in the KV cache, or restored by the prompt cache)."""
    prompt = sum(s.prompt_tokens for s in stats[:: n or max(1, len(stats))])
    completion = sum(s.generated_tokens for s in stats)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def speculative(stats: Stats) -> dict[str, object]:
    """What the speculative loop did for this answer (the same figures as `specchat run --json`)."""
    return stats.to_dict()


def combined(stats: Sequence[Stats]) -> Stats:
    """The totals of a request's answers (n > 1): counts and seconds add up over one prompt; the stop
    reason is theirs when they share it, else "mixed"."""
    return total(stats, one_prompt=True)


def chat_logprobs(entries: Sequence[LogprobEntry]) -> list[dict[str, object]]:
    """Chat's `logprobs.content`: per token its text, logprob, UTF-8 bytes and best alternatives."""
    return [
        {
            "token": _text(e.token),
            "logprob": _finite(e.logprob if e.logprob is not None else NO_PROBABILITY),
            "bytes": list(e.token),
            "top_logprobs": [{"token": _text(b), "logprob": _finite(v), "bytes": list(b)} for b, v in e.top],
        }
        for e in entries
    ]


def completion_logprobs(entries: Sequence[LogprobEntry], shift: int = 0) -> dict[str, object]:
    """The completions endpoint's parallel lists; `text_offset` counts characters of the returned
    text, so an echoed prompt (`shift` characters) comes first. Alternatives whose texts coincide
    (bytes of a split character) keep the likeliest."""
    tops: list[dict[str, float] | None] = []
    for e in entries:
        top: dict[str, float] = {}
        for b, v in e.top:
            top.setdefault(_text(b), _finite(v))
        tops.append(top if e.logprob is not None else None)
    return {
        "tokens": [_text(e.token) for e in entries],
        "token_logprobs": [None if e.logprob is None else _finite(e.logprob) for e in entries],
        "top_logprobs": tops,
        "text_offset": [e.offset + shift for e in entries],
    }


def _text(token: bytes) -> str:
    """A token's text; bytes of a character split across tokens show as U+FFFD (`bytes` has them)."""
    return token.decode("utf-8", errors="replace")


def _finite(logprob: float) -> float:
    return logprob if logprob > NO_PROBABILITY else NO_PROBABILITY


def finish_reason(stop_reason: str, *, stopped_by_string: bool) -> str:
    """OpenAI's finish_reason: `stop` at the model's end, a stop string or where the grammar allows
    nothing more, otherwise `length` (token limit, full context, or an answer cut short by the server
    shutting down)."""
    return "stop" if stopped_by_string or stop_reason in ("eog", "grammar") else "length"
