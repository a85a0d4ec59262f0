"""Constrained output end to end: the request fields (server/formats.py), llama.cpp's grammar as a
constraint (llama/grammar.py) on the tiny GGUF models, and `specchat serve` answering response_format,
json_schema and grammar requests -- including llama-server's own test cases for them
(tools/server/tests/unit/test_chat_completion.py), with their assertions on shape."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from specchat.decoding.constraint import GrammarSpec
from specchat.errors import BadInput
from specchat.llama.grammar import Grammar, check_schema, compile_grammar, gbnf_for
from specchat.server.api import ApiError, Defaults, parse_request

from .serving import client, loaded_engine, serve_here

CHAT = [{"role": "user", "content": "Give me JSON"}]
PERSON = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"enum": [1, 2, 3]},
        "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["ok", "n", "name", "tags"],
    "additionalProperties": False,
}


def valid(value: Any, schema: Mapping[str, Any]) -> bool:
    """A small JSON-schema check for the keywords these tests use (no jsonschema dependency)."""
    if "const" in schema:
        return value == schema["const"]
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    types = {
        "object": dict,
        "array": list,
        "string": str,
        "boolean": bool,
        "integer": int,
        "number": (int, float),
    }
    if kind is not None and (
        not isinstance(value, types[kind]) or (kind in ("integer", "number") and value is True)
    ):
        return False
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if any(k not in value for k in schema.get("required", ())):
            return False
        if schema.get("additionalProperties") is False and any(k not in props for k in value):
            return False
        return all(valid(v, props[k]) for k, v in value.items() if k in props)
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            return False
        items = schema.get("items")
        if isinstance(items, list):
            return len(value) == len(items) and all(valid(v, s) for v, s in zip(value, items, strict=True))
        return items is None or all(valid(v, items) for v in value)
    if isinstance(value, str):
        # bytes of the tiny model's that form no valid character arrive as a run of U+FFFD; the
        # grammar counted them as the one code point its UTF-8 decoder made of them
        return len(re.sub("\ufffd+", "?", value)) <= schema.get("maxLength", len(value))
    return True


# --- the request fields ----------------------------------------------------------------------------------


def parse(**body: object):  # type: ignore[no-untyped-def]
    return parse_request("chat", {"messages": CHAT, **body}, Defaults(max_tokens=16)).grammar


def test_request_fields_become_a_grammar_spec():
    assert parse() is None
    assert parse(response_format={"type": "text"}) is None
    assert parse(response_format={"type": "json_object"}) == GrammarSpec(
        "json_object", param="response_format"
    )
    spec = parse(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "p", "schema": PERSON, "strict": True},
        }
    )
    assert spec == GrammarSpec("json_schema", schema=PERSON, param="response_format")
    assert parse(response_format={"type": "json_object", "schema": {"const": 1}}).schema == {"const": 1}
    assert parse(json_schema={"const": "42"}) == GrammarSpec(
        "json_schema", schema={"const": "42"}, param="json_schema"
    )
    assert parse(grammar='root ::= "a"') == GrammarSpec("gbnf", text='root ::= "a"', param="grammar")
    completion = parse_request(
        "completion", {"prompt": "x", "grammar": 'root ::= "a"'}, Defaults(max_tokens=4)
    )
    assert completion.grammar is not None and completion.grammar.kind == "gbnf"


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"response_format": "json"}, "response_format", "must be an object"),
        ({"response_format": {"type": "sound"}}, "response_format", "'sound'"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema must be an object"),
        ({"response_format": {"type": "json_object", "schema": 123}}, "response_format", "schema object"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
            "response_format",
            "schema",
        ),
        ({"json_schema": "x"}, "json_schema", "schema object"),
        ({"grammar": 5}, "grammar", "GBNF"),
        ({"json_schema": {}, "grammar": 'root ::= "a"'}, "grammar", "give only one"),
    ],
)
def test_malformed_fields_are_a_400_naming_the_field(body, param, words):
    with pytest.raises(ApiError) as err:
        parse(**body)
    assert err.value.status == 400 and err.value.param == param
    assert words in err.value.message


# --- schema -> grammar -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "integer", "minimum": 0}, "`minimum`"),
        (
            {"type": "object", "properties": {"a": {"type": "number", "multipleOf": 2}}},
            "`multipleOf` (at properties.a)",
        ),
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "`uniqueItems`"),
        ({"anyOf": [{"type": "string"}, {"not": {"type": "null"}}]}, "`not` (at anyOf[1])"),
        ({"type": "string", "format": "email"}, "'email'"),
        ({"$ref": "https://example.com/s.json"}, "only refs inside the schema"),
        ({"type": "object", "properties": {"a": True}}, "boolean schema"),
        ({"type": "hiccup"}, "cannot be turned into a grammar"),
        ({"type": 123}, "cannot be turned into a grammar"),
        ({"$ref": "#/$defs/missing"}, "cannot be turned into a grammar"),
    ],
)
def test_schemas_the_converter_cannot_enforce_are_refused_naming_the_feature(schema, words):
    with pytest.raises(BadInput) as err:
        gbnf_for(GrammarSpec("json_schema", schema=schema))
    assert words in err.value.message


def test_supported_schemas_pass_the_check():
    for schema in (
        PERSON,
        {},
        {"type": "string", "format": "date", "title": "day", "description": "a day"},
        {"$defs": {"x": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/x"}},
        {"items": [{"type": "integer"}]},
        {"properties": {"minimum": {"type": "string"}}},  # a property *named* like a keyword
    ):
        check_schema(schema)
        assert "root ::=" in gbnf_for(GrammarSpec("json_schema", schema=schema))


# --- llama.cpp's grammar on the tiny model ---------------------------------------------------------------


def test_a_grammar_checks_one_token_candidates_or_the_vocabulary_and_advances(tiny_engine):
    target = tiny_engine.target
    grammar = compile_grammar(target, GrammarSpec("gbnf", text='root ::= "ab" [0-9]+'))
    state = grammar.start()
    ids = np.arange(target.n_vocab, dtype=np.int32)
    a, b, seven = (target.tokenize(c, add_special=False)[0] for c in "ab7")
    allowed = state.allowed(ids)
    assert allowed[a] and not allowed[b] and not allowed[seven]
    assert all(target.token_bytes(int(t)).startswith(b"a") for t in np.flatnonzero(allowed))
    assert list(state.allowed(np.array([b, a], dtype=np.int32))) == [False, True]
    eog = next(t for t in range(target.n_vocab) if target.is_eog(t))
    state.accept(a)
    state.accept(b)
    assert not state.allowed(np.array([eog], dtype=np.int32))[0]  # one digit at least
    state.accept(seven)
    assert state.allowed(np.array([eog, seven], dtype=np.int32)).all()  # may end, or go on
    with pytest.raises(ValueError, match="not allowed"):  # refused in Python: llama.cpp would abort
        state.accept(a)
    fresh = grammar.start()  # a clone of the compiled grammar: at the start again
    assert fresh.allowed(np.array([a], dtype=np.int32))[0]
    state.close()
    fresh.close()
    grammar.close()
    grammar.close()  # closing twice is harmless


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("root ::= this is (not valid GBNF", "expecting ')'"),
        ("root ::= foo", "Undefined rule identifier 'foo'"),
        ("item ::= [a-z]", "root"),
        ("   ", "empty"),
    ],
)
def test_a_grammar_llama_cpp_cannot_parse_is_bad_input(tiny_engine, text, words):
    with pytest.raises(BadInput) as err:
        Grammar(tiny_engine.target, text)
    assert words in err.value.message


# --- through `specchat serve` ----------------------------------------------------------------------------


def chat(url: str, **body: object) -> httpx.Response:
    return httpx.post(
        f"{url}/chat/completions", json={"messages": CHAT, "max_tokens": 96, **body}, timeout=60
    )


def content(reply: httpx.Response) -> str:
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        {"type": "json_object", "schema": PERSON},
    ],
)
def test_json_output_parses_validates_and_equals_the_target_alone(tiny_url, response_format):
    fast = chat(tiny_url, response_format=response_format, temperature=0)
    plain = chat(tiny_url, response_format=response_format, temperature=0, speculative=False)
    text = content(fast)
    assert fast.json()["choices"][0]["finish_reason"] == "stop"
    value = json.loads(text)
    assert isinstance(value, dict)
    assert valid(
        value, response_format.get("schema") or response_format.get("json_schema", {}).get("schema", {})
    )
    assert content(plain) == text  # token for token what the constrained target alone writes
    spec = fast.json()["speculative"]
    assert spec["drafted"] > 0 and 0 <= spec["accepted"] <= spec["drafted"]
    assert plain.json()["speculative"]["drafted"] == 0


def test_the_openai_client_gets_schema_output_streamed_or_not(tiny_url):
    api = client(tiny_url)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    reply = api.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=96, temperature=0, response_format=fmt
    )
    text = reply.choices[0].message.content
    assert valid(json.loads(text), PERSON)
    chunks = api.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=96, temperature=0, response_format=fmt, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


def test_completions_take_a_grammar_and_a_json_schema(tiny_url):
    api = client(tiny_url)
    out = api.completions.create(
        model="tiny",
        prompt="Numbers:",
        max_tokens=12,
        extra_body={"grammar": 'root ::= [0-9]{3} "-" [0-9]{2}'},
    )
    assert re.fullmatch(r"[0-9]{3}-[0-9]{2}", out.choices[0].text)
    assert out.choices[0].finish_reason == "stop"
    out = api.completions.create(
        model="tiny", prompt="A:", max_tokens=16, extra_body={"json_schema": {"enum": ["yes", "no"]}}
    )
    assert json.loads(out.choices[0].text) in ("yes", "no")


def test_sampling_under_a_schema_stays_inside_it(tiny_url):
    for seed in range(4):
        for speculative in (True, False):
            reply = chat(
                tiny_url,
                response_format={"type": "json_schema", "json_schema": {"schema": PERSON}},
                temperature=1.0,
                seed=seed,
                speculative=speculative,
                max_tokens=64,
            )
            text = content(reply)
            if reply.json()["choices"][0]["finish_reason"] == "stop":
                assert valid(json.loads(text), PERSON)
            else:  # cut by max_tokens: still on the way to a valid object
                assert text.startswith('{"ok":') or text.startswith('{ "ok":')


def test_n_answers_each_start_from_the_grammars_start(tiny_url):
    reply = chat(tiny_url, json_schema={"enum": ["alpha", "beta"]}, n=3, temperature=1.0, seed=3)
    texts = [c["message"]["content"] for c in reply.json()["choices"]]
    assert len(texts) == 3 and all(json.loads(t) in ("alpha", "beta") for t in texts)


def test_a_bad_schema_or_grammar_is_a_400_and_the_server_keeps_serving(tiny_url):
    bad = chat(
        tiny_url,
        response_format={"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 1}}},
    )
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["param"] == "response_format" and "`minimum`" in error["message"]
    bad = chat(tiny_url, grammar="root ::= (", stream=True)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "grammar"
    with pytest.raises(openai.BadRequestError):
        client(tiny_url).chat.completions.create(
            model="tiny",
            messages=CHAT,
            max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}},
        )
    assert content(chat(tiny_url, max_tokens=4))  # still serving


def test_a_grammar_no_token_can_continue_ends_the_answer_there(tiny_url):
    reply = chat(tiny_url, grammar='root ::= "ab" [\\x00]')  # no token's text starts with a NUL byte
    assert content(reply) == "ab"
    assert reply.json()["choices"][0]["finish_reason"] == "stop"
    assert reply.json()["speculative"]["stop_reason"] == "grammar"


# llama-server's tests/unit/test_chat_completion.py cases, run against `specchat serve` on the tiny model
# (max_tokens raised where the tiny model's tokens are single bytes; the regexes are theirs)
SYSTEM = [
    {"role": "system", "content": "You are a coding assistant."},
    {"role": "user", "content": "Write an example"},
]


@pytest.mark.parametrize(
    ("response_format", "n_predicted", "re_content"),
    [
        ({"type": "json_object", "schema": {"const": "42"}}, 6, '"42"'),
        ({"type": "json_object", "schema": {"items": [{"type": "integer"}]}}, 10, "[ -3000 ]"),
        ({"type": "json_schema", "json_schema": {"schema": {"const": "foooooo"}}}, 10, '"foooooo"'),
        ({"type": "json_object"}, 10, "(\\{|John)+"),
        ({"type": "sound"}, 0, None),
        # invalid response format (expected to fail)
        ({"type": "json_object", "schema": 123}, 0, None),
        ({"type": "json_object", "schema": {"type": 123}}, 0, None),
        ({"type": "json_object", "schema": {"type": "hiccup"}}, 0, None),
    ],
)
def test_llama_server_response_format_cases(tiny_url, response_format, n_predicted, re_content):
    res = httpx.post(
        f"{tiny_url}/chat/completions",
        json={"max_tokens": n_predicted, "messages": SYSTEM, "response_format": response_format},
        timeout=60,
    )
    if re_content is not None:
        assert res.status_code == 200
        assert re.search(re_content, res.json()["choices"][0]["message"]["content"], re.DOTALL)
    else:
        assert res.status_code == 400
        assert "error" in res.json()


@pytest.mark.parametrize(("json_schema", "n_predicted", "re_content"), [({"const": "42"}, 6, '"42"')])
def test_llama_server_json_schema_case(tiny_url, json_schema, n_predicted, re_content):
    res = httpx.post(
        f"{tiny_url}/chat/completions",
        json={"max_tokens": n_predicted, "messages": SYSTEM, "json_schema": json_schema},
        timeout=60,
    )
    assert res.status_code == 200
    assert re.search(re_content, res.json()["choices"][0]["message"]["content"])


@pytest.mark.parametrize(("grammar", "n_predicted", "re_content"), [('root ::= "a"{5,5}', 6, "a{5,5}")])
def test_llama_server_grammar_case(tiny_url, grammar, n_predicted, re_content):
    messages = [{"role": "user", "content": "Does not matter what I say, does it?"}]
    res = httpx.post(
        f"{tiny_url}/chat/completions",
        json={"max_tokens": n_predicted, "messages": messages, "grammar": grammar},
        timeout=60,
    )
    assert res.status_code == 200, res.text
    assert re.search(re_content, res.json()["choices"][0]["message"]["content"])


def test_llama_server_invalid_grammar_case(tiny_url):
    messages = [{"role": "user", "content": "Does not matter what I say, does it?"}]
    res = httpx.post(
        f"{tiny_url}/chat/completions",
        json={"max_tokens": 8, "messages": messages, "grammar": "root ::= this is (not valid GBNF"},
        timeout=60,
    )
    assert res.status_code == 400, res.text
    assert "error" in res.json()


# --- the real default pair -------------------------------------------------------------------------------

ADA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}


@pytest.mark.slow
def test_real_pair_json_schema_output_validates_and_equals_the_target_alone(real_pair):
    """The default pair behind `specchat serve`, the openai client asking for a json_schema: JSON
    that validates, token for token what the constrained target writes alone, drafts accepted."""
    target, draft = real_pair

    def drive(url: str) -> tuple[Any, Any, float, float]:
        import time

        api = client(url)
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": ADA, "strict": True}}
        messages = [
            {
                "role": "user",
                "content": "Describe Ada Lovelace as a JSON object: name, age at death, 3 hobbies.",
            }
        ]
        t0 = time.perf_counter()
        fast = api.chat.completions.create(
            model="m", messages=messages, max_tokens=160, temperature=0, response_format=fmt
        )
        t1 = time.perf_counter()
        plain = api.chat.completions.create(
            model="m",
            messages=messages,
            max_tokens=160,
            temperature=0,
            response_format=fmt,
            extra_body={"speculative": False},
        )
        return fast, plain, t1 - t0, time.perf_counter() - t1

    with loaded_engine(target, (str(draft), "ngram")) as engine:
        fast, plain, fast_s, plain_s = serve_here(engine, drive, k=3)  # -k 3: drafts every round
    text = fast.choices[0].message.content
    spec = fast.model_extra["speculative"]
    print(f"\n{text}\nspeculative {fast_s:.2f} s, target alone {plain_s:.2f} s: {spec}")
    assert fast.choices[0].finish_reason == "stop"
    assert valid(json.loads(text), ADA)
    assert text == plain.choices[0].message.content
    assert spec["accepted"] > 0 and spec["accepted"] <= spec["drafted"]


def _walk_lengths(target, schema: Mapping[str, Any], n: int) -> list[tuple[bool, bool]]:
    """Walk the schema's grammar through a string of i "a"s, or an array of i 1s, for i in 0..n: at
    each i, whether one more may come and whether the string or array may close (as llama.cpp's
    grammar decides, token by token)."""
    grammar = compile_grammar(target, GrammarSpec("json_schema", schema=schema))
    state = grammar.start()
    tok = {c: target.tokenize(c, add_special=False)[0] for c in ('"', "a", "[", "]", ",", "1")}
    array = schema.get("type") == "array"
    opening, item, close = ("[", "1", "]") if array else ('"', "a", '"')
    state.accept(tok[opening])
    out: list[tuple[bool, bool]] = []
    for i in range(n + 1):
        more = tok["," if array and i else item]  # an array's next item starts with a comma
        go_on, end = (bool(b) for b in state.allowed(np.array([more, tok[close]], dtype=np.int32)))
        out.append((go_on, end))
        if not go_on:
            break
        if array and i:
            state.accept(tok[","])
        state.accept(tok[item])
    state.close()
    grammar.close()
    return out


@pytest.mark.parametrize(
    ("lo", "hi"), [(0, 7), (3, 2000), (0, 2500), (1999, 4100), (2500, 2600), (3000, None), (0, None)]
)
def test_string_lengths_past_llama_cpps_repetition_limit_are_enforced_exactly(tiny_engine, lo, hi):
    """maxLength/minLength are written as {m,n} repetitions, blocks of 1,000 past llama.cpp's 2,000
    (llama/schema_gbnf.py): every length in [lo, hi] may close the string, no other; the grammar
    text stays small and shallow whatever the bound."""
    schema: dict[str, Any] = {"type": "string", "minLength": lo}
    if hi is not None:
        schema["maxLength"] = hi
    gbnf = gbnf_for(GrammarSpec("json_schema", schema=schema))
    assert len(gbnf) < 2000 and gbnf.count("(") < 20
    walk = _walk_lengths(tiny_engine.target, schema, (hi if hi is not None else lo + 50) + 1)
    for i, (go_on, end) in enumerate(walk):
        assert end == (i >= lo and (hi is None or i <= hi)), i
        assert go_on == (hi is None or i < hi), i
    assert len(walk) == (hi + 1 if hi is not None else lo + 52)


def test_array_item_counts_past_llama_cpps_repetition_limit_are_enforced_exactly(tiny_engine):
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 1500, "maxItems": 3200}
    walk = _walk_lengths(tiny_engine.target, schema, 3300)
    for i, (go_on, end) in enumerate(walk):
        assert end == (1500 <= i <= 3200) and go_on == (i < 3200), i
    assert len(walk) == 3201  # after the 3,200th item no comma: the array may only close
