"""The OpenAI wire format's requests: what a request may say, and the errors it gets.

Pure functions over dicts, no HTTP and no models, so every rule here is tested directly. Requests are
checked field by field and a bad one becomes an `ApiError` (HTTP 400 with OpenAI's error object,
naming the field in `param`); fields this server does not use are ignored, as OpenAI-compatible
servers do, because clients send many (`model`, `user`, `logprobs`, `tools`, ...). The sampling
fields are decoding/settings.py's table, read by `_sampling`. One request field is specchat's own:
`speculative: false` decodes that request with the target alone (to compare with drafting).

What a response looks like (choices, stream chunks, usage, logprobs) is `responses.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..decoding.constraint import GrammarSpec
from ..decoding.logprobs import MAX_TOP
from ..decoding.settings import SETTINGS, SamplingParams, SettingError
from ..decoding.template_vars import TemplateVarsError, check_template_vars
from .fields import ApiError, Kind, bool_field, int_field, json_kind
from .formats import BadFormat, check_spec, grammar_spec

if TYPE_CHECKING:
    from .tools import ToolSpec

#: Roles a chat message may have. `developer` is OpenAI's newer name for `system`.
ROLES = ("system", "user", "assistant", "tool", "developer")
MAX_STOPS = 16
#: The deepest a request body's JSON may nest: a chat request carrying an agent's tool schemas nests
#: about fourteen levels, and this keeps ten times that; past it the body is refused before anything
#: walks it (parsers, converters and validators recurse).
MAX_DEPTH = 160
#: `seed`: llama-server's -1 (no seed: a random answer), or a value numpy's generators take.
SEED_RANGE = (-1, (1 << 64) - 1)
#: The most answers one request may ask for (`n`): they are generated one after the other.
MAX_N = 8


@dataclass(frozen=True, slots=True)
class Defaults:
    """What a request gets for a field it leaves out: the `specchat serve` command-line settings."""

    max_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    system: str | None = None
    #: the chat template's extra variables (--chat-template-kwargs): a request's own go over these
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)


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
    #: chat: the template's extra variables (`chat_template_kwargs` over the server's default ones)
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def choices(self) -> int:
        """Answers in all: n per prompt (prompt i's answer j has index i*n+j)."""
        return self.n * max(1, len(self.prompts))


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why not."""
    try:
        body = json.loads(raw)
    except RecursionError:  # CPython's parser recurses per level and gives up near 1,000
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(
            f"the request body is not valid JSON ({exc}); send a JSON object with "
            "Content-Type: application/json",
            code="invalid_json",
        ) from None
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, not {json_kind(body)}", code="invalid_json")
    if json_depth(body) > MAX_DEPTH:
        raise _too_deep()
    return body


def json_depth(value: object) -> int:
    """How deep a parsed JSON value nests (a scalar: 0), without recursing."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, depth + 1)
            if depth + 1 <= MAX_DEPTH:  # deeper is refused anyway: stop walking there
                stack.extend((v, depth + 1) for v in node)
    return deepest


def _too_deep() -> ApiError:
    return ApiError(f"the request body nests deeper than {MAX_DEPTH} levels", code="invalid_json")


def parse_request(kind: Kind, body: Mapping[str, Any], defaults: Defaults) -> GenRequest:
    """Validate the fields of a /v1/chat/completions or /v1/completions body."""
    from .prompts import check_choices, parse_prompts
    from .tools import parse_tools, tool_grammar

    prompts: tuple[str | tuple[int, ...], ...] = ()
    tools = None
    variables: Mapping[str, Any] = {}
    if kind == "chat":
        messages = _messages(body.get("messages"), defaults.system)
        prompt = ""
        tools = parse_tools(body)
        variables = _template_kwargs(body, defaults.template_kwargs)
    else:
        messages = ()
        prompts = parse_prompts(body.get("prompt"))
        prompt = prompts[0] if isinstance(prompts[0], str) else ""
    n = int_field(body, "n", lo=1, hi=MAX_N)
    check_choices(max(1, len(prompts)), n or 1)
    echo = kind == "completion" and bool_field(body, "echo")
    least = 0 if echo else 1  # OpenAI: max_tokens 0 with echo scores the prompt and generates nothing
    max_tokens = int_field(body, "max_completion_tokens", lo=least)
    if max_tokens is None:
        max_tokens = int_field(body, "max_tokens", lo=least)
    params = _sampling(body, defaults.params)
    stream = bool_field(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(f"stream_options must be an object, not {json_kind(options)}", param="stream_options")
    include_usage = bool(options) and bool_field(
        options, "include_usage", param="stream_options.include_usage"
    )
    seed = int_field(body, "seed", lo=SEED_RANGE[0], hi=SEED_RANGE[1])
    if seed == -1:  # llama-server's "no seed"
        seed = None
    if body.get("speculative") is not None and not isinstance(body.get("speculative"), bool):
        raise ApiError(
            "speculative must be true or false (false: decode with the target alone)", param="speculative"
        )
    try:
        grammar = grammar_spec(body)
        if grammar is None and tools is not None:  # tool_choice required / named: the answer is a call
            grammar = tool_grammar(tools)
        check_spec(grammar)
    except BadFormat as exc:
        raise ApiError(exc.message, param=exc.param) from None
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
        template_kwargs=variables,
    )


def _logprobs(kind: Kind, body: Mapping[str, Any]) -> int | None:
    """How many alternatives per token the request wants, or None for no logprobs at all.

    Chat: `logprobs: true` plus `top_logprobs` 0..20 (which needs `logprobs: true`, as OpenAI
    requires); completions: `logprobs: N`, N in 0..20 (OpenAI's legacy endpoint allows 5).
    """
    if kind == "completion":
        return int_field(body, "logprobs", lo=0, hi=MAX_TOP)
    wanted = bool_field(body, "logprobs")
    top = int_field(body, "top_logprobs", lo=0, hi=MAX_TOP)
    if top is not None and not wanted:
        raise ApiError("top_logprobs needs logprobs: true", param="top_logprobs")
    return (top or 0) if wanted else None


# --- field checks ----------------------------------------------------------------------------------------


def _sampling(body: Mapping[str, Any], defaults: SamplingParams) -> SamplingParams:
    """The sampling settings (decoding/settings.py's table) the body sends, over `defaults`: each
    field's JSON type checked here, its range (NaN and infinities included: Python's JSON reads them)
    by `SamplingParams` itself, a 400 naming the field."""
    given: dict[str, object] = {}
    for s in SETTINGS:
        if s.per_token:
            if body.get(s.name) is not None:
                given[s.name] = _token_map(s.name, body[s.name])
            continue
        if s.type is int:
            value = int_field(body, s.name, lo=None)
        else:
            value = body.get(s.name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ApiError(f"{s.name} must be a number, not {json_kind(value)}", param=s.name)
        if value is not None:
            given[s.name] = s.type(value)
    try:
        return replace(defaults, **given)  # type: ignore[arg-type]
    except SettingError as exc:
        raise ApiError(exc.line(exc.setting.name), param=exc.setting.name) from None


def _template_kwargs(body: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """`chat_template_kwargs` (an object of the chat template's extra variables, as llama-server
    takes it), each key over the server's --chat-template-kwargs; a 400 naming the field when it is
    not an object, sets a variable specchat sets itself, or gives `enable_thinking` a non-boolean."""
    value = body.get("chat_template_kwargs")
    if value is not None and not isinstance(value, dict):
        raise ApiError(
            f"chat_template_kwargs must be an object mapping template variables to values, such as "
            f'{{"enable_thinking": false}}, not {json_kind(value)}',
            param="chat_template_kwargs",
        )
    try:
        given = check_template_vars(value, "chat_template_kwargs")
    except TemplateVarsError as exc:
        raise ApiError(str(exc), param="chat_template_kwargs") from None
    return {**defaults, **given}


def _token_map(name: str, value: object) -> dict[int, float]:
    """A per-token field as OpenAI sends it, a JSON object from token ids (as strings) to numbers:
    its shape checked here, its ids and values by `SamplingParams` (and the ids against the
    vocabulary by the worker, which has one)."""
    if not isinstance(value, dict):
        raise ApiError(
            f"{name} must be an object mapping token ids to numbers, not {json_kind(value)}", param=name
        )
    out: dict[int, float] = {}
    for key, v in value.items():
        try:
            token = int(key)
        except ValueError:
            raise ApiError(f"{name} keys must be token ids (got {key!r})", param=name) from None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ApiError(f"{name} values must be numbers, not {json_kind(v)} (token {key})", param=name)
        out[token] = float(v)
    return out


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
