"""The OpenAI wire format: what a request may say, and what responses, stream chunks and errors look like.

Pure functions over dicts, no HTTP and no models, so every rule here is tested directly. Requests are
checked field by field and a bad one becomes an `ApiError` (HTTP 400 with OpenAI's error object,
naming the field in `param`); fields this server does not use are ignored, as OpenAI-compatible
servers do, because clients send many (`model`, `user`, `logprobs`, `tools`, ...).

Beyond OpenAI's fields, every response and the last stream chunk carry `speculative` (the loop's
`Stats.to_dict()`: drafted, accepted, acceptance_rate, target_passes, tokens_per_pass, k_history,
per-drafter figures...), and every content chunk carries `pieces`: its text split by the token each
piece came from, with that token's source (draft, ngram, correction, bonus, target), so a client can
colour them as `specchat run` does.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..events import Stats
from .stops import Piece

Kind = Literal["chat", "completion"]

#: Roles a chat message may have. `developer` is OpenAI's newer name for `system`.
ROLES = ("system", "user", "assistant", "tool", "developer")
MAX_STOPS = 16


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
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    seed: int | None = None
    system: str | None = None


@dataclass(frozen=True, slots=True)
class GenRequest:
    """One validated generation request, chat or plain completion."""

    kind: Kind
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    messages: tuple[dict[str, str], ...] = ()  # chat
    prompt: str = ""  # completion
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False


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
    if kind == "chat":
        messages = _messages(body.get("messages"), defaults.system)
        prompt = ""
    else:
        messages = ()
        prompt = _prompt(body.get("prompt"))
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise ApiError("only n=1 is supported (one answer per request)", param="n")
    max_tokens = _int(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", lo=1)
    temperature = _number(body, "temperature", lo=0.0)
    top_p = _number(body, "top_p", lo=0.0, lo_open=True, hi=1.0)
    top_k = _int(body, "top_k", lo=0)
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(f"stream_options must be an object, not {_kind(options)}", param="stream_options")
    include_usage = bool(options) and _bool(options, "include_usage", param="stream_options.include_usage")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise ApiError(f"seed must be an integer, not {_kind(seed)}", param="seed")
    return GenRequest(
        kind=kind,
        messages=messages,
        prompt=prompt,
        max_tokens=max_tokens if max_tokens is not None else defaults.max_tokens,
        temperature=temperature if temperature is not None else defaults.temperature,
        top_k=top_k if top_k is not None else defaults.top_k,
        top_p=top_p if top_p is not None else defaults.top_p,
        seed=seed if seed is not None else defaults.seed,
        stop=_stops(body.get("stop")),
        stream=bool(stream),
        include_usage=bool(include_usage),
    )


# --- responses -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """Identity of one response, shared by all its chunks."""

    kind: Kind
    model: str
    id: str
    created: int

    @classmethod
    def new(cls, kind: Kind, model: str) -> Reply:
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        return cls(kind, model, f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time()))

    def _head(self, *, chunk: bool) -> dict[str, object]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def body(self, text: str, finish_reason: str, stats: Stats, cached: int) -> dict[str, object]:
        """The whole (not streamed) response."""
        if self.kind == "chat":
            choice: dict[str, object] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {
            **self._head(chunk=False),
            "choices": [choice],
            "usage": usage(stats, cached),
            "speculative": speculative(stats),
        }

    def chunk(
        self, pieces: Sequence[Piece] = (), *, first: bool = False, finish_reason: str | None = None
    ) -> dict[str, object]:
        """One stream chunk: text (with its `pieces`), the opening role, or the finish reason."""
        text = "".join(t for t, _ in pieces)
        if self.kind == "chat":
            delta: dict[str, object] = {}
            if first:
                delta["role"] = "assistant"
            if pieces or first:
                delta["content"] = text
            choice: dict[str, object] = {"index": 0, "delta": delta, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish_reason
        out = {**self._head(chunk=True), "choices": [choice]}
        if pieces:
            out["pieces"] = [{"text": t, "source": s} for t, s in pieces]
        return out

    def final_chunk(self, finish_reason: str, stats: Stats, cached: int) -> dict[str, object]:
        """The chunk that ends the answer; it carries usage and `speculative` whatever the client asked."""
        return {**self.chunk(finish_reason=finish_reason), **self.usage_chunk(stats, cached, choices=False)}

    def usage_chunk(self, stats: Stats, cached: int, *, choices: bool = True) -> dict[str, object]:
        """OpenAI's `stream_options.include_usage` chunk: no choices, the usage (and `speculative`)."""
        out: dict[str, object] = {**self._head(chunk=True)} if choices else {}
        if choices:
            out["choices"] = []
        out["usage"] = usage(stats, cached)
        out["speculative"] = speculative(stats)
        return out


def usage(stats: Stats, cached: int) -> dict[str, object]:
    """OpenAI's usage object; `cached_tokens` are the prompt tokens found in the KV cache."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def speculative(stats: Stats) -> dict[str, object]:
    """What the speculative loop did for this answer (the same figures as `specchat run --json`)."""
    return stats.to_dict()


def finish_reason(stop_reason: str, *, stopped_by_string: bool) -> str:
    """OpenAI's finish_reason: `stop` at the model's end or a stop string, otherwise `length` (token
    limit, full context, or an answer cut short by the server shutting down)."""
    return "stop" if stopped_by_string or stop_reason == "eog" else "length"


# --- field checks ----------------------------------------------------------------------------------------


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}.get(
        type(value), "an object"
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(body: Mapping[str, Any], name: str, *, lo: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value):
        raise ApiError(f"{name} must be an integer, not {_kind(value)}", param=name)
    if value < lo:
        raise ApiError(f"{name} must be >= {lo} (got {value})", param=name)
    return int(value)


def _number(
    body: Mapping[str, Any], name: str, *, lo: float, lo_open: bool = False, hi: float | None = None
) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError(f"{name} must be a number, not {_kind(value)}", param=name)
    low = value <= lo if lo_open else value < lo
    if low or (hi is not None and value > hi):
        span = f"in ({lo:g}, {hi:g}]" if lo_open and hi is not None else f">= {lo:g}"
        raise ApiError(f"{name} must be {span} (got {value})", param=name)
    return float(value)


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


def _prompt(value: object) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value is None:
        raise ApiError("prompt is required: the text to continue", param="prompt")
    if not isinstance(value, str):
        raise ApiError(
            f"prompt must be a string (one prompt per request), not {_kind(value)}", param="prompt"
        )
    if not value:
        raise ApiError("prompt is empty", param="prompt")
    return value


def _messages(value: object, system: str | None) -> tuple[dict[str, str], ...]:
    if value is None:
        raise ApiError("messages is required: an array of {role, content} objects", param="messages")
    if not isinstance(value, list) or not value:
        raise ApiError("messages must be a non-empty array of {role, content} objects", param="messages")
    out: list[dict[str, str]] = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(f"{where} must be an object with role and content", param=where)
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(
                f"{where}.role must be one of {', '.join(ROLES)} (got {role!r})", param=f"{where}.role"
            )
        out.append({"role": "system" if role == "developer" else role, "content": _content(m, where)})
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
