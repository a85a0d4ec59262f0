"""Hostile and malformed requests against a real server: the reproductions of every request that once
crashed or stalled `specchat serve`, then generated bodies (hypothesis) for every field of both
generation endpoints and the tokenizer's.

What must hold for each: the answer is a 200 or a 4xx whose JSON error is one line, never a 5xx;
the process lives (the server runs in this process: a crash in llama.cpp ends the test run) and
/health answers after it. The default run uses the tiny pair and a bounded number of examples
(SPECCHAT_FUZZ_EXAMPLES, default 150, the same bodies each run) so the suite stays quick; `make
stress` runs many more, freshly drawn, and the same tests against the real default pair (marker
`slow`; SPECCHAT_FUZZ_REAL_EXAMPLES).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .serving import loaded_engine, serving

EXAMPLES = int(os.environ.get("SPECCHAT_FUZZ_EXAMPLES", "150"))
#: the real pair generates ~100x slower than the tiny one: fewer examples reach the same minutes
REAL_EXAMPLES = int(os.environ.get("SPECCHAT_FUZZ_REAL_EXAMPLES", "60"))
HELLO = [{"role": "user", "content": "Tell me a story about a cat"}]
CHAT = {"messages": HELLO, "max_tokens": 2}
JSON = {"Content-Type": "application/json"}


@pytest.fixture(
    scope="module", params=["tiny", pytest.param("real", marks=pytest.mark.slow)], ids=["tiny", "real"]
)
def server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A server on the tiny pair, or (slow) on the real default pair as `serve` loads it."""
    if request.param == "tiny":
        pair: tuple[Path, Path] = request.getfixturevalue("tiny_pair")
    else:
        pair = request.getfixturevalue("real_pair")
    target, draft = pair
    with loaded_engine(target, (str(draft), "ngram")) as engine, serving(engine, max_tokens=8) as url:
        yield url.removesuffix("/v1")


def _alive(url: str) -> None:
    r = httpx.get(f"{url}/health", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok"


def _check(r: httpx.Response) -> None:
    """200, or a 4xx with OpenAI's error object in one line."""
    assert r.status_code < 500, f"{r.status_code}: {r.text[:500]}"
    if r.status_code >= 400:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert "\n" not in error["message"] and "Traceback" not in error["message"]


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def _schema(schema: object) -> dict[str, object]:
    return {**CHAT, "json_schema": schema}


def _tool(parameters: object) -> dict[str, object]:
    function = {"name": "f", "parameters": parameters}
    return {**CHAT, "tools": [{"type": "function", "function": function}], "tool_choice": "required"}


#: (id, path, body: JSON-able or raw bytes, extra headers, expected status). Each of these once
#: crashed the server, filled the machine's memory, held the model thread for a minute, or was
#: served to a page it should not have been.
REPRODUCTIONS: list[tuple[str, str, object, dict[str, str], int]] = [
    ("foreign-host", "/v1/chat/completions", CHAT, {"Host": "evil.example"}, 403),
    (
        "cross-site-text-plain",
        "/v1/chat/completions",
        CHAT,
        {"Origin": "http://evil.example", "Content-Type": "text/plain"},
        403,
    ),
    ("text-plain-no-origin", "/v1/chat/completions", CHAT, {"Content-Type": "text/plain"}, 415),
    (
        "grammar-20000-deep",
        "/v1/chat/completions",
        {**CHAT, "grammar": "root ::= " + "(" * 20_000 + '"x"' + ")" * 20_000},
        {},
        400,
    ),
    ("schema-maxLength-1e9", "/v1/chat/completions", _schema({"type": "string", "maxLength": 1e9}), {}, 400),
    (
        "schema-minItems-1e8",
        "/v1/chat/completions",
        _schema({"type": "array", "items": {"type": "integer"}, "minItems": 100_000_000}),
        {},
        400,
    ),
    (
        "schema-enum-100000",
        "/v1/chat/completions",
        _schema({"enum": [f"v{i}" for i in range(100_000)]}),
        {},
        400,
    ),
    (
        "response-format-maxLength",
        "/v1/chat/completions",
        {
            **CHAT,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": 10**9}},
            },
        },
        {},
        400,
    ),
    (
        "tool-parameters-maxLength",
        "/v1/chat/completions",
        _tool({"type": "object", "properties": {"a": {"type": "string", "maxLength": 10**9}}}),
        {},
        400,
    ),
    (
        "message-55.7MB",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x" * 55_700_000}]},
        {},
        413,
    ),
    ("json-1000-deep", "/v1/chat/completions", b'{"messages": ' + _deep(1000) + b"}", {}, 400),
    ("seed-minus-one-bad", "/v1/chat/completions", {**CHAT, "seed": -2}, {}, 400),
    ("completion-seed-huge", "/v1/completions", {"prompt": "x", "max_tokens": 2, "seed": 2**70}, {}, 400),
    ("tokenize-deep", "/tokenize", b'{"content": ' + _deep(5000) + b"}", {}, 400),
    (
        "schema-not-a-schema",
        "/v1/chat/completions",
        _schema({"type": "string", "maxLength": "long"}),
        {},
        400,
    ),
    (
        "schema-ref-loop",
        "/v1/chat/completions",
        _schema({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}),
        {},
        400,
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "headers", "status"), [r[1:] for r in REPRODUCTIONS], ids=[r[0] for r in REPRODUCTIONS]
)
def test_reproduction_is_a_quick_4xx_and_the_server_lives(server_url, path, body, headers, status):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    started = time.monotonic()
    r = httpx.post(f"{server_url}{path}", content=raw, headers={**JSON, **headers}, timeout=120)
    took = time.monotonic() - started
    _check(r)
    assert r.status_code == status, r.text[:300]
    assert took < 10, f"{took:.1f} s"
    _alive(server_url)


# --- generated bodies -----------------------------------------------------------------------------------

_odd_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ["", "\x00", "\ud800", "\U0001f600" * 50, "<|im_end|>", "{{ x }}", "\u202e\u0301", "%s%n"]
    ),
)
_number = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 2, 8, 9, 20, 21, 2**31, 2**63, 1e308, -0.0, 0.5]),
)
_scalar = st.one_of(st.none(), st.booleans(), _number, _odd_text)
_json = st.recursive(
    _scalar,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_odd_text, kids, max_size=4),
    max_leaves=12,
)
_small_count = st.integers(min_value=0, max_value=4)
_schema_value = st.one_of(
    _json,
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(
                ["string", "integer", "number", "object", "array", "boolean", "null", "bogus"]
            ),
            "maxLength": _number,
            "minLength": _number,
            "maxItems": _number,
            "minItems": _number,
            "enum": st.lists(_scalar, max_size=6),
            "pattern": st.sampled_from(["^a{1,3}$", "^[a-z]+$", "^(", "^a{99999}$", "^.*$", "x"]),
            "properties": st.dictionaries(_odd_text, _json, max_size=3),
            "items": _json,
            "required": _json,
            "$ref": st.sampled_from(["#/$defs/x", "#", "http://example.com/s.json", "#/nope"]),
        },
    ),
)
_message = st.one_of(
    _json,
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "bogus"])},
        optional={
            "content": st.one_of(_odd_text, _json),
            "tool_calls": _json,
            "tool_call_id": _json,
            "name": _json,
        },
    ),
)
_tool_value = st.one_of(
    _json,
    st.builds(
        lambda name, params: {"type": "function", "function": {"name": name, "parameters": params}},
        _odd_text,
        _schema_value,
    ),
)
_fields = {
    "messages": st.one_of(_json, st.lists(_message, min_size=1, max_size=3)),
    "prompt": st.one_of(_odd_text, st.lists(st.integers(-5, 200_000), max_size=8), _json),
    "max_tokens": st.one_of(_small_count, _number, _json),
    "max_completion_tokens": st.one_of(_small_count, _json),
    "n": st.one_of(st.integers(-1, 10), _json),
    "temperature": _number,
    "top_p": _number,
    "top_k": _number,
    "min_p": _number,
    "presence_penalty": _number,
    "frequency_penalty": _number,
    "repeat_penalty": _number,
    "seed": st.one_of(_number, _json),
    "stop": st.one_of(_odd_text, st.lists(_odd_text, max_size=20), _json),
    "stream": st.one_of(st.booleans(), _json),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": _scalar}), _json),
    "logprobs": st.one_of(st.booleans(), st.integers(-1, 25), _json),
    "top_logprobs": st.one_of(st.integers(-1, 25), _json),
    "echo": st.one_of(st.booleans(), _json),
    "logit_bias": st.one_of(
        st.dictionaries(st.one_of(st.integers(-5, 10**6).map(str), _odd_text), _number, max_size=4), _json
    ),
    "speculative": _scalar,
    "response_format": st.one_of(
        _json,
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "json_object", "json_schema", "bogus"])},
            optional={
                "json_schema": st.fixed_dictionaries(
                    {}, optional={"name": _scalar, "schema": _schema_value, "strict": _scalar}
                ),
                "schema": _schema_value,
            },
        ),
    ),
    "json_schema": _schema_value,
    "grammar": st.one_of(
        _odd_text,
        st.sampled_from(
            ['root ::= "a"', "root ::= (", 'root ::= "x"{0,3}', "root ::= root", "root ::= [a-", "x ::= y"]
        ),
    ),
    "tools": st.one_of(_json, st.lists(_tool_value, max_size=3)),
    "tool_choice": st.one_of(
        st.sampled_from(["auto", "none", "required", "bogus"]),
        _json,
        st.builds(lambda n: {"type": "function", "function": {"name": n}}, _odd_text),
    ),
    "content": st.one_of(_odd_text, _json),
    "tokens": st.one_of(st.lists(st.integers(-5, 200_000), max_size=8), _json),
    "add_special": _scalar,
    "with_pieces": _scalar,
}
_body = st.fixed_dictionaries({}, optional=_fields)
_paths = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/tokenize", "/v1/detokenize"])
_headers = st.one_of(
    st.just(JSON),
    st.sampled_from(
        [
            {"Content-Type": "application/json; charset=utf-8"},
            {"Content-Type": "application/json", "Origin": "http://evil.example"},
            {"Content-Type": "application/json", "Host": "localhost"},
            {"Content-Type": "text/plain"},
            {},
        ]
    ),
)
_one_field = st.sampled_from(sorted(_fields)).flatmap(lambda k: _fields[k].map(lambda v: {k: v}))
#: a valid request with one field generated: most reach the worker (prompt, sampling, grammar)
_near_valid = st.builds(
    lambda base, extra: {**base, **extra},
    st.sampled_from([CHAT, {"prompt": "def f(x):", "max_tokens": 2}, {"content": "hello"}]),
    _one_field,
)
_raw = st.one_of(
    _near_valid.map(lambda b: json.dumps(b, allow_nan=True).encode("utf-8", "surrogatepass")),
    _body.map(lambda b: json.dumps(b, allow_nan=True).encode("utf-8", "surrogatepass")),
    _json.map(lambda b: json.dumps(b, allow_nan=True).encode("utf-8", "surrogatepass")),
    st.binary(max_size=64),
    st.integers(1, 5000).map(_deep),
)


def test_generated_requests_get_a_200_or_a_one_line_4xx(request, server_url):
    real = "real" in request.node.callspec.id
    seen: Counter[int] = Counter()

    @settings(
        max_examples=REAL_EXAMPLES if real else EXAMPLES,
        deadline=None,
        derandomize=os.environ.get("SPECCHAT_FUZZ_RANDOM") is None,  # the default suite: the same bodies
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(path=_paths, raw=_raw, headers=_headers)
    def one(path: str, raw: bytes, headers: dict[str, str]) -> None:
        r = httpx.post(f"{server_url}{path}", content=raw, headers=headers, timeout=300)
        _check(r)
        _alive(server_url)
        seen[r.status_code // 100] += 1

    one()
    assert seen[2] and seen[4], (
        f"only {dict(seen)}: the generated bodies must reach generation and refusal alike"
    )
