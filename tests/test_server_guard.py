"""What a hostile web page or a careless client can send `specchat serve`: foreign Host and Origin
headers, bodies that are not JSON or too large, constraints that ask for unbounded work, hang-ups.

The checks themselves (server/guard.py, decoding/bounds.py) are tested directly, then through a
server on the tiny pair: headers, keys, chunked bodies, hang-ups. The requests that once crashed or
stalled a server, and the fuzzing, are test_server_fuzz.py.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from specchat.decoding.bounds import Limits, TooLarge, check_gbnf_bounds, check_schema_bounds
from specchat.errors import BadInput
from specchat.server.api import MAX_DEPTH, ApiError, Defaults, json_depth, parse_json, parse_request
from specchat.server.guard import HostPolicy, default_max_body, parse_allowed, split_host

from .serving import client, health, serving, wait_until
from .test_server import FakeBackend

HELLO = [{"role": "user", "content": "Tell me a story about a cat"}]
DEFAULTS = Defaults(max_tokens=8)


# --- the checks, directly ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("LOCALHOST.", ("localhost", None)),
        ("[::1]:8080", ("::1", 8080)),
        ("[::1]", ("::1", None)),
        ("evil.example:80", ("evil.example", 80)),
        ("[evil]:80", None),
        ("[::1]x", None),
        ("host:port", None),
        ("", None),
    ],
)
def test_host_headers_are_split_like_a_browser_writes_them(header, expected):
    assert split_host(header) == expected


def test_the_host_policy_answers_its_own_names_and_the_given_ones_only():
    own = HostPolicy("127.0.0.1")
    assert all(own.host_ok(n) for n in ("localhost", "127.0.0.1", "::1"))
    assert not own.host_ok("evil.example") and not own.host_ok("10.0.0.5")
    lan = HostPolicy("0.0.0.0", parse_allowed(["studio.lan", "*.home.arpa"]), frozenset({"192.168.1.5"}))
    assert lan.host_ok("192.168.1.5") and lan.host_ok("studio.lan") and lan.host_ok("mac.home.arpa")
    assert not lan.host_ok("192.168.1.6") and not lan.host_ok("home.arpa.evil.example")
    assert HostPolicy("127.0.0.1", ("*",)).host_ok("anything.example")


def test_an_origin_is_served_only_from_the_servers_own_page_or_a_given_name():
    policy = HostPolicy("127.0.0.1", parse_allowed(["studio.lan"]))
    assert policy.origin_ok("http://127.0.0.1:8080", "127.0.0.1:8080")
    assert policy.origin_ok("http://localhost", "localhost:80")
    assert not policy.origin_ok("http://127.0.0.1:9999", "127.0.0.1:8080")  # another local page
    assert not policy.origin_ok("http://evil.example", "127.0.0.1:8080")
    assert not policy.origin_ok("null", "127.0.0.1:8080")
    assert policy.origin_ok("https://studio.lan", "127.0.0.1:8080")


def test_allowed_hosts_are_checked_on_the_command_line():
    assert parse_allowed(["Studio.LAN.", "[::1]", "*"]) == ("studio.lan", "::1", "*")
    for bad in ("", "http://x", "a b", "ev*il"):
        with pytest.raises(BadInput):
            parse_allowed([bad])


def test_the_default_body_limit_holds_the_whole_context():
    assert default_max_body(512) == 5 << 20
    assert default_max_body(32768) == 5 << 20
    assert default_max_body(131072) == 8 << 20
    long_prompt = json.dumps({"messages": [{"role": "user", "content": "é " * 131072}]})
    assert len(long_prompt.encode()) < default_max_body(131072)  # even \\u-escaped: json.dumps' default


def test_json_depth_is_measured_without_recursing():
    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [{"b": []}]}) == 4
    deep: object = []
    for _ in range(100_000):
        deep = [deep]
    assert json_depth(deep) == MAX_DEPTH + 1  # stops walking past the limit


def test_schema_bounds_name_the_keyword_the_place_and_the_limit():
    with pytest.raises(TooLarge) as exc:
        check_schema_bounds({"type": "object", "properties": {"s": {"type": "string", "maxLength": 1e9}}})
    assert "maxLength" in exc.value.message and "2,000,000" in exc.value.message
    assert exc.value.where == "properties.s"
    for schema in (
        {"type": "array", "minItems": 100_000_000},
        {"enum": list(range(100_000))},
        {"type": "object", "properties": {f"p{i}": {} for i in range(5000)}},
        {"type": "string", "pattern": "^a{1,100000}$"},
        {"type": "string", "pattern": "x" * 100_000},
        {"type": "string", "minLength": 5, "maxLength": 3},
    ):
        with pytest.raises(TooLarge):
            check_schema_bounds(schema)
    nested: dict = {"type": "string"}
    for _ in range(100):
        nested = {"type": "array", "items": nested}
    with pytest.raises(TooLarge, match="nests deeper"):
        check_schema_bounds(nested)


def test_schema_bounds_leave_real_tool_schemas_alone():
    tool = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "file to edit", "maxLength": 4096},
            "code": {
                "type": "string",
                "description": "a VBA module, as an Excel MCP server asks",
                "maxLength": 200_000,
            },
            "edits": {
                "type": "array",
                "maxItems": 100,
                "items": {
                    "type": "object",
                    "properties": {"old": {"type": "string"}, "new": {"type": "string"}},
                    "required": ["old", "new"],
                },
            },
            "mode": {"enum": ["replace", "append", "insert"]},
            "id": {"type": "string", "pattern": "^[a-z]{3}-[0-9]{1,8}$"},
        },
        "required": ["path", "edits"],
    }
    check_schema_bounds(tool)


def test_gbnf_bounds_count_nesting_repetitions_and_expansion_without_recursing():
    check_gbnf_bounds('root ::= "(" root ")" | "x"  # (((( in a comment, and in "((((" strings')
    check_gbnf_bounds('root ::= [(] item{0,50} [)]\nitem ::= ("a" | "b")+')
    with pytest.raises(TooLarge, match="groups deep"):
        check_gbnf_bounds("root ::= " + "(" * 20_000 + '"x"' + ")" * 20_000)
    with pytest.raises(TooLarge, match="repeats"):  # llama.cpp would quietly drop the bound past 2,000
        check_gbnf_bounds('root ::= "x"{0,2001}')
    with pytest.raises(TooLarge, match="reversed"):  # llama.cpp would count 3 - 5 down as unsigned
        check_gbnf_bounds('root ::= "x"{5,3}')
    with pytest.raises(TooLarge, match="expands"):  # {2000} writes the 1,000-character string out
        check_gbnf_bounds(f'root ::= "{"y" * 1000}"{{2000}}')
    with pytest.raises(TooLarge, match="characters"):
        check_gbnf_bounds("root ::= " + '"x" ' * 2_000_000)
    small = Limits(grammar_depth=3)
    check_gbnf_bounds('root ::= ((("x")))', small)
    with pytest.raises(TooLarge):
        check_gbnf_bounds('root ::= (((("x"))))', small)


def test_bodies_parse_only_within_the_depth_and_seeds_within_range():
    with pytest.raises(ApiError, match="nests deeper"):
        parse_json(b'{"a": ' + b"[" * 1000 + b"]" * 1000 + b"}")
    with pytest.raises(ApiError, match="nests deeper"):
        parse_json(b'{"a": ' + b"[" * 200 + b"]" * 200 + b"}")
    assert parse_json(b'{"a": ' + b"[" * 150 + b"]" * 150 + b"}")  # a tool schema's depth, ten times over
    body = {"prompt": "x"}
    assert parse_request("completion", {**body, "seed": -1}, DEFAULTS).seed is None  # llama-server's random
    assert parse_request("completion", {**body, "seed": 2**64 - 1}, DEFAULTS).seed == 2**64 - 1
    for bad in (-2, 2**64, 1.5, "7"):
        with pytest.raises(ApiError) as exc:
            parse_request("completion", {**body, "seed": bad}, DEFAULTS)
        assert exc.value.param == "seed" and exc.value.status == 400


def test_every_constraint_a_request_carries_is_bounded_before_it_is_queued():
    huge = {"type": "string", "maxLength": 1_000_000_000}
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": huge}}},
    }
    cases = [
        ({"json_schema": huge}, "json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": huge}}},
            "response_format",
        ),
        ({"response_format": {"type": "json_object", "schema": huge}}, "response_format"),
        ({"grammar": "root ::= " + "(" * 20_000 + '"x"' + ")" * 20_000}, "grammar"),
        ({"tools": [tool], "tool_choice": "required"}, "tool_choice"),
        ({"json_schema": {"type": "string", "maxLength": "long"}}, "json_schema"),  # the meta-schema
    ]
    for extra, param in cases:
        started = time.monotonic()
        with pytest.raises(ApiError) as exc:
            parse_request("chat", {"messages": HELLO, **extra}, DEFAULTS)
        assert exc.value.status == 400 and exc.value.param == param, extra
        assert "\n" not in exc.value.message and time.monotonic() - started < 1.0


# --- through a server on the tiny pair (the table of reproductions: test_server_fuzz.py) -------------------


def _root(url: str) -> str:
    return url.removesuffix("/v1")


def _post(url: str, path: str, body: object, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{_root(url)}{path}",
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        timeout=60,
    )


def _refused(r: httpx.Response, status: int, code: str | None = None) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert "\n" not in error["message"]
    if code is not None:
        assert error["code"] == code
    return error["message"]


CHAT = {"messages": HELLO, "max_tokens": 2}


def test_a_foreign_host_gets_403_even_with_the_api_key(tiny_engine):
    with serving(tiny_engine, api_key="s3cret") as url:
        auth = {"Authorization": "Bearer s3cret"}
        r = _post(url, "/v1/chat/completions", CHAT, Host="evil.example", **auth)
        assert "--allowed-host evil.example" in _refused(r, 403, "host_not_allowed")
        for own in ("localhost:1234", "127.0.0.1", "[::1]:80"):
            assert _post(url, "/v1/chat/completions", CHAT, Host=own, **auth).status_code == 200
        assert health(url)["status"] == "ok"


def test_a_cross_site_simple_request_is_refused(tiny_url):
    r = httpx.post(
        f"{_root(tiny_url)}/v1/chat/completions",
        content=json.dumps(CHAT),
        headers={"Origin": "http://evil.example", "Content-Type": "text/plain"},
        timeout=30,
    )
    _refused(r, 403, "origin_not_allowed")
    r = httpx.post(f"{_root(tiny_url)}/v1/chat/completions", content=json.dumps(CHAT), timeout=30)
    assert "Content-Type: application/json" in _refused(r, 415)
    own = _root(tiny_url)  # the page's own origin is served
    assert _post(tiny_url, "/v1/chat/completions", CHAT, Origin=own).status_code == 200


def test_a_chunked_body_over_the_limit_is_413_once_it_passes_it(tiny_url):
    def chunks():  # no Content-Length: refused once the running count passes the limit
        for _ in range(160):  # 10 MiB
            yield b" " * (1 << 16)

    r = httpx.post(
        f"{tiny_url}/chat/completions",
        content=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    _refused(r, 413)
    assert httpx.post(f"{_root(tiny_url)}/tokenize", json={"content": "hi"}, timeout=10).status_code == 200


def test_seed_minus_one_is_llama_servers_random_seed(tiny_url):
    ok = client(tiny_url).chat.completions.create(model="tiny", messages=HELLO, max_tokens=2, seed=-1)
    assert ok.usage.completion_tokens == 2


def test_a_client_hanging_up_a_non_streamed_request_stops_every_answer_within_a_round():
    backend = FakeBackend(delay=0.01)
    with serving(backend) as url:
        body = {"prompt": "abc", "max_tokens": 2000, "n": 8}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/completions", json=body, timeout=0.5)
        left = time.monotonic()
        wait_until(lambda: not health(url)["busy"], timeout=5)
        assert time.monotonic() - left < 1.0  # a round is ~10 ms here; the 8 answers ~160 s
        decodes = len(backend.target.decode_calls)
        assert decodes < 150
        time.sleep(0.1)
        assert len(backend.target.decode_calls) == decodes


def test_a_hang_up_while_queued_drops_the_request_before_it_starts():
    backend = FakeBackend()
    with serving(backend) as url:
        backend.target.gate.clear()  # the first request waits inside decode
        first = threading.Thread(
            target=lambda: httpx.post(f"{url}/completions", json={"prompt": "a", "max_tokens": 2}, timeout=30)
        )
        first.start()
        wait_until(lambda: health(url)["busy"])
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/completions", json={"prompt": "b", "max_tokens": 2}, timeout=0.3)
        calls = len(backend.target.decode_calls)
        backend.target.gate.set()
        first.join(30)
        wait_until(lambda: not health(url)["busy"] and health(url)["waiting"] == 0)
        assert len(backend.target.decode_calls) - calls < 10  # the second never generated
