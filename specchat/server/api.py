"""The OpenAI wire format: what a request may say, and what responses, stream chunks and errors look like.

Pure functions over dicts, no HTTP and no models, so every rule here is tested directly. Requests are
checked field by field and a bad one becomes an `ApiError` (HTTP 400 with OpenAI's error object,
naming the field in `param`); fields this server does not use are ignored, as OpenAI-compatible
servers do, because clients send many (`model`, `user`, `logprobs`, `tools`, ...).

Beyond OpenAI's fields, every response and each choice's last stream chunk carry `speculative` (the
loop's `Stats.to_dict()`: drafted, accepted, acceptance_rate, target_passes, tokens_per_pass,
k_history, per-drafter figures...), and every content chunk carries `pieces`: its text split by the
token each piece came from, with that token's source (draft, ngram, correction, bonus, target), so a
client can colour them as `specchat run` does, and `progress`: the answer's running figures (tokens,
acceptance, tokens per target pass, tok/s) for a live display. One request field is specchat's own:
`speculative: false` decodes that request with the target alone (to compare with drafting).

`logprobs` come from the target's own rows (loop.Settings.logprobs, specchat/decoding/logprobs.py) in
OpenAI's two shapes: chat's `content[]` of {token, logprob, bytes, top_logprobs}, and completions'
`tokens` / `token_logprobs` / `top_logprobs` / `text_offset` (with `echo`, the prompt's tokens first:
server/echo.py). With `n` > 1 the answers are generated one after the other on the same prompt (whose
cache they share); each choice has its own index, finish_reason and `speculative`, and the top-level
figures are their totals.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from ..decoding.constraint import GrammarSpec
from ..decoding.events import DrafterStats, RouteStats, Stats
from ..decoding.logprobs import MAX_TOP, TokenLogprob
from ..decoding.settings import SETTINGS, SamplingParams, SettingError
from .formats import BadFormat, grammar_spec
from .stops import Piece

if TYPE_CHECKING:
    from ..decoding.loop import Tally
    from .tools import ToolSpec

Kind = Literal["chat", "completion"]

#: Roles a chat message may have. `developer` is OpenAI's newer name for `system`.
ROLES = ("system", "user", "assistant", "tool", "developer")
MAX_STOPS = 16
#: The most answers one request may ask for (`n`): they are generated one after the other.
MAX_N = 8
#: What a log-probability of minus infinity is sent as (JSON has no -inf; OpenAI uses this value).
NO_PROBABILITY = -9999.0


class ApiError(Exception):
    """A request the server will not serve, as OpenAI reports it: HTTP status + error object."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True, slots=True)
class Defaults:
    """What a request gets for a field it leaves out: the `specchat serve` command-line settings."""

    max_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    system: str | None = None


@dataclass(frozen=True, slots=True)
class GenRequest:
    """One validated generation request, chat or plain completion."""

    kind: Kind
    max_tokens: int
    params: SamplingParams  # the sampling settings sent, the rest from Defaults.params
    seed: int | None
    messages: tuple[dict[str, Any], ...] = ()  # chat (tool calls and results: server/tools.py)
    prompt: str = ""  # completion: the first prompt when it is text
    #: completion: every prompt (text, or token ids decoded as given: prompts.py), answered in order
    prompts: tuple[str | tuple[int, ...], ...] = ()
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    #: alternatives per token when logprobs were asked for (0: the chosen token's only); None: not asked
    logprobs: int | None = None
    echo: bool = False  # completion: the prompt is returned before the answer
    draft: bool = True  # the `speculative` request field: false decodes with the target alone
    #: the output must match this (response_format / json_schema / grammar: server/formats.py)
    grammar: GrammarSpec | None = None
    tools: ToolSpec | None = None  # chat: the tools offered (None: none, or tool_choice none)

    @property
    def choices(self) -> int:
        """Answers in all: n per prompt (prompt i's answer j has index i*n+j)."""
        return self.n * max(1, len(self.prompts))


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why not."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(
            f"the request body is not valid JSON ({exc}); send a JSON object with "
            "Content-Type: application/json",
            code="invalid_json",
        ) from None
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, not {_kind(body)}", code="invalid_json")
    return body


def parse_request(kind: Kind, body: Mapping[str, Any], defaults: Defaults) -> GenRequest:
    """Validate the fields of a /v1/chat/completions or /v1/completions body."""
    from .prompts import check_choices, parse_prompts
    from .tools import parse_tools, tool_grammar

    prompts: tuple[str | tuple[int, ...], ...] = ()
    tools = None
    if kind == "chat":
        messages = _messages(body.get("messages"), defaults.system)
        prompt = ""
        tools = parse_tools(body)
    else:
        messages = ()
        prompts = parse_prompts(body.get("prompt"))
        prompt = prompts[0] if isinstance(prompts[0], str) else ""
    n = _int(body, "n", lo=1, hi=MAX_N)
    check_choices(max(1, len(prompts)), n or 1)
    echo = kind == "completion" and _bool(body, "echo")
    least = 0 if echo else 1  # OpenAI: max_tokens 0 with echo scores the prompt and generates nothing
    max_tokens = _int(body, "max_completion_tokens", lo=least)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", lo=least)
    params = _sampling(body, defaults.params)
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(f"stream_options must be an object, not {_kind(options)}", param="stream_options")
    include_usage = bool(options) and _bool(options, "include_usage", param="stream_options.include_usage")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise ApiError(f"seed must be an integer, not {_kind(seed)}", param="seed")
    if body.get("speculative") is not None and not isinstance(body.get("speculative"), bool):
        raise ApiError(
            "speculative must be true or false (false: decode with the target alone)", param="speculative"
        )
    try:
        grammar = grammar_spec(body)
    except BadFormat as exc:
        raise ApiError(exc.message, param=exc.param) from None
    if grammar is None and tools is not None:  # tool_choice required / named: the answer is a call
        grammar = tool_grammar(tools)
    return GenRequest(
        kind=kind,
        messages=messages,
        prompt=prompt,
        prompts=prompts,
        max_tokens=max_tokens if max_tokens is not None else defaults.max_tokens,
        params=params,
        seed=seed if seed is not None else defaults.seed,
        stop=_stops(body.get("stop")),
        stream=bool(stream),
        include_usage=bool(include_usage),
        n=n if n is not None else 1,
        logprobs=_logprobs(kind, body),
        echo=echo,
        draft=body.get("speculative") is not False,
        grammar=grammar,
        tools=tools,
    )


def _logprobs(kind: Kind, body: Mapping[str, Any]) -> int | None:
    """How many alternatives per token the request wants, or None for no logprobs at all.

    Chat: `logprobs: true` plus `top_logprobs` 0..20 (which needs `logprobs: true`, as OpenAI
    requires); completions: `logprobs: N`, N in 0..20 (OpenAI's legacy endpoint allows 5).
    """
    if kind == "completion":
        return _int(body, "logprobs", lo=0, hi=MAX_TOP)
    wanted = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", lo=0, hi=MAX_TOP)
    if top is not None and not wanted:
        raise ApiError("top_logprobs needs logprobs: true", param="top_logprobs")
    return (top or 0) if wanted else None


# --- responses -------------------------------------------------------------------------------------------


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
    if len(stats) == 1:
        return stats[0]
    drafters: dict[str, DrafterStats] = {}
    for d in (d for s in stats for d in s.drafters):
        o = drafters.get(d.name, DrafterStats(d.name))
        drafters[d.name] = DrafterStats(
            d.name, o.rounds + d.rounds, o.drafted + d.drafted, o.accepted + d.accepted, o.seconds + d.seconds
        )
    routes: dict[tuple[str, str | None], RouteStats] = {}
    for r in (r for s in stats for r in s.routes):
        o = routes.get((r.drafter, r.route), RouteStats(r.drafter, r.route))
        routes[(r.drafter, r.route)] = RouteStats(
            r.drafter,
            r.route,
            o.rounds + r.rounds,
            o.drafted + r.drafted,
            o.accepted + r.accepted,
            o.rechecked + r.rechecked,
        )
    reasons = {s.stop_reason for s in stats}
    return Stats(
        prompt_tokens=stats[0].prompt_tokens,
        prefill_tokens=sum(s.prefill_tokens for s in stats),
        generated_tokens=sum(s.generated_tokens for s in stats),
        prefill_seconds=sum(s.prefill_seconds for s in stats),
        decode_seconds=sum(s.decode_seconds for s in stats),
        drafted=sum(s.drafted for s in stats),
        accepted=sum(s.accepted for s in stats),
        target_passes=sum(s.target_passes for s in stats),
        stop_reason=reasons.pop() if len(reasons) == 1 else "mixed",
        accepted_by_position=_add(s.accepted_by_position for s in stats),
        drafted_by_position=_add(s.drafted_by_position for s in stats),
        drafters=tuple(drafters.values()),
        k_history=tuple(k for s in stats for k in s.k_history),
        rechecked=sum(s.rechecked for s in stats),
        routes=tuple(routes.values()),
        repaired=sum(s.repaired for s in stats),
    )


def _add(rows: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
    """Element-wise sum of per-position counts of different lengths."""
    out: list[int] = []
    for row in rows:
        out.extend([0] * (len(row) - len(out)))
        for i, v in enumerate(row):
            out[i] += v
    return tuple(out)


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


# --- field checks ----------------------------------------------------------------------------------------


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}.get(
        type(value), "an object"
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(body: Mapping[str, Any], name: str, *, lo: int | None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value):
        raise ApiError(f"{name} must be an integer, not {_kind(value)}", param=name)
    if lo is not None and value < lo:
        raise ApiError(f"{name} must be >= {lo} (got {value})", param=name)
    if hi is not None and value > hi:
        raise ApiError(f"{name} must be at most {hi} (got {value})", param=name)
    return int(value)


def _sampling(body: Mapping[str, Any], defaults: SamplingParams) -> SamplingParams:
    """The sampling settings (decoding/settings.py's table) the body sends, over `defaults`: each
    field's JSON type checked here, its range (NaN and infinities included: Python's JSON reads them)
    by `SamplingParams` itself, a 400 naming the field."""
    given: dict[str, int | float] = {}
    for s in SETTINGS:
        if s.type is int:
            value = _int(body, s.name, lo=None)
        else:
            value = body.get(s.name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ApiError(f"{s.name} must be a number, not {_kind(value)}", param=s.name)
        if value is not None:
            given[s.name] = s.type(value)
    try:
        return replace(defaults, **given)
    except SettingError as exc:
        raise ApiError(exc.line(exc.setting.name), param=exc.setting.name) from None


def _bool(body: Mapping[str, Any], name: str, *, param: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"{param or name} must be true or false, not {_kind(value)}", param=param or name)
    return value


def _stops(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ApiError("stop must be a string or an array of strings", param="stop")
    if len(items) > MAX_STOPS:
        raise ApiError(f"stop takes at most {MAX_STOPS} strings (got {len(items)})", param="stop")
    return tuple(dict.fromkeys(s for s in items if s))


def _messages(value: object, system: str | None) -> tuple[dict[str, Any], ...]:
    if value is None:
        raise ApiError("messages is required: an array of {role, content} objects", param="messages")
    if not isinstance(value, list) or not value:
        raise ApiError("messages must be a non-empty array of {role, content} objects", param="messages")
    from .tools import message_fields

    out: list[dict[str, Any]] = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(f"{where} must be an object with role and content", param=where)
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(
                f"{where}.role must be one of {', '.join(ROLES)} (got {role!r})", param=f"{where}.role"
            )
        role = "system" if role == "developer" else role
        out.append({"role": role, "content": _content(m, where), **message_fields(m, where)})
    if system and not any(m["role"] == "system" for m in out):
        out.insert(0, {"role": "system", "content": system})
    return tuple(out)


def _content(message: Mapping[str, Any], where: str) -> str:
    """A message's text: a string, or an array of text parts (joined), or null (an empty turn)."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ApiError(
                    f"{where}.content[{j}] must be a text part ({{type: text, text: ...}}); this server "
                    "takes text only",
                    param=f"{where}.content",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(f"{where}.content must be a string or an array of text parts", param=f"{where}.content")
