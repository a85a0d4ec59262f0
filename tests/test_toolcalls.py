"""Tool calls as text: the parsers of every format the server reads (server/toolcalls.py), the streaming
hold-back, and the request side (server/tools.py): fields, messages, prompts, the call schema."""

from __future__ import annotations

import json

import pytest

from specchat.server.api import ApiError, Defaults, parse_request
from specchat.server.toolcalls import ToolStream, parse_tool_calls
from specchat.server.tools import ToolSpec, call_schema, parse_tools, prepare, tool_grammar

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
SPEC = ToolSpec((WEATHER, TIME))


def calls(text: str, spec: ToolSpec = SPEC) -> tuple[str | None, list[tuple[str, dict]]]:  # type: ignore[type-arg]
    content, found = parse_tool_calls(text, spec)
    return content, [(c.name, json.loads(c.arguments)) for c in found]


PARIS = ("get_weather", {"city": "Paris"})


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # Qwen2.5 / Hermes
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', [PARIS]),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}', [PARIS]),  # no closing tag
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
            [PARIS, ("get_time", {})],
        ),
        # Llama 3.x
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', [PARIS]),
        ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', [PARIS]),
        (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
            '{"name": "get_time", "parameters": {}}',
            [PARIS, ("get_time", {})],
        ),
        # Gemma 3's tool_code, and fenced JSON
        ('```tool_code\nprint(get_weather(city="Paris"))\n```', [PARIS]),
        ('```tool_code\nget_weather(city="Paris")\n```', [PARIS]),
        ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', [PARIS]),
        ('```\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n```', [PARIS]),
        # small models' deviations
        ('  {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', [PARIS]),  # args as a string
        (
            '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time"}]',
            [PARIS, ("get_time", {})],
        ),
        (
            '{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
            [PARIS],
        ),
        ('{{"name": "get_weather", "arguments": {"city": "Paris"}}}', [PARIS]),  # Qwen2.5 template's braces
        ('<tool_call>\n{{"name": "get_weather", "arguments": {"city": "Paris"}}}\n</tool_call>', [PARIS]),
    ],
)
def test_every_format_gives_the_calls(text, want):
    content, found = calls(text)
    assert found == want and content is None


@pytest.mark.parametrize(
    "text",
    [
        "The weather is fine.",
        '{"name": "delete_everything", "arguments": {}}',  # not a declared tool
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
        '{"answer": 42}',  # JSON, but no call
        "```python\nget_weather(city='Paris')\n```",  # code, not a call
        "```tool_code\nimport os\n```",
        "<tool_call>not json</tool_call>",
        '{"name": "get_weather", "arguments": [1]}',  # arguments not an object
        "Use a < b and `x` here",
    ],
)
def test_what_is_not_a_declared_call_is_text(text):
    content, found = calls(text)
    assert found == [] and content == text


def test_text_around_calls_is_content():
    text = 'Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    content, found = calls(text)
    assert found == [PARIS] and content == "Let me look."


def test_named_choice_and_parallel_off_limit_the_calls():
    two = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    assert calls(two, ToolSpec((WEATHER, TIME), parallel=False))[1] == [PARIS]
    only_time = ToolSpec((WEATHER, TIME), "named", "get_time")
    content, found = calls(two, only_time)
    assert found == [("get_time", {})]  # a block calling another function is text
    assert content == '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_streaming_holds_back_only_what_may_be_a_call():
    text = 'Sure.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
    stream = ToolStream(SPEC)
    sent = []
    found_at = None
    for i in range(0, len(text), 3):  # three characters at a time
        sent += stream.feed([(text[i : i + 3], "draft")])
        if stream.calls and found_at is None:
            found_at = i
    sent += stream.flush()
    assert "".join(t for t, _ in sent) == "Sure.\n"  # the newline after the call is dropped with it
    assert all(src == "draft" for _, src in sent)
    assert found_at is not None and found_at >= text.index("</tool_call>") - 3  # found once complete
    assert [c.name for c in stream.calls] == ["get_weather"]


def test_streaming_plain_text_is_not_delayed():
    stream = ToolStream(SPEC)
    assert stream.feed([("Hello wor", "target")]) == [("Hello wor", "target")]
    assert stream.feed([("ld <", "target")]) == [("ld ", "target")]  # '<' may open <tool_call>
    assert "".join(t for t, _ in stream.feed([("b> x", "target")])) == "<b> x"
    assert stream.flush() == []


def test_streaming_a_python_code_block_flows():
    stream = ToolStream(SPEC)
    out = stream.feed([("Here:\n```python\ndef f():\n", "t")])
    assert "".join(t for t, _ in out) == "Here:\n```python\ndef f():\n"


def test_streaming_a_json_answer_waits_for_its_end():
    stream = ToolStream(SPEC)
    assert stream.feed([('{"name": "get_weather", ', "t")]) == []
    assert stream.feed([('"arguments": {"city": "Paris"}}', "t")]) == []
    assert [c.name for c in stream.take_new()[0:1] for c in [c[1]]] == ["get_weather"]
    assert stream.flush() == []


# --- the request side --------------------------------------------------------------------------------------


def test_parse_tools_and_choice():
    spec = parse_tools(
        {"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    )
    assert spec is not None and spec.choice == "named" and spec.names == ("get_time",)
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}) is None
    assert parse_tools({}) is None
    req = parse_tools({"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False})
    assert req is not None and req.choice == "required" and not req.parallel


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_bad_tool_fields_name_the_field(body, param):
    with pytest.raises(ApiError) as info:
        parse_tools(body)
    assert info.value.param == param and info.value.status == 400


def test_tool_messages_are_checked_and_arguments_parsed():
    body = {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
        ],
        "tools": [WEATHER],
    }
    req = parse_request("chat", body, Defaults(max_tokens=8))
    assert req.messages[1]["content"] == "" and req.messages[1]["tool_calls"][0]["function"]["arguments"] == {
        "city": "Paris"
    }
    assert req.messages[2]["tool_call_id"] == "call_1" and req.tools is not None
    bad = {
        **body,
        "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}],
    }
    with pytest.raises(ApiError) as info:
        parse_request("chat", bad, Defaults(max_tokens=8))
    assert info.value.param == "messages[0].tool_calls[0].function.arguments"


def test_prepare_for_a_template_with_and_without_tools():
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "22 C"},
        {"role": "tool", "tool_call_id": "d", "content": "sunny"},
    ]
    out, tools = prepare(messages, SPEC, "{% for tool in tools %}{{ tool }}{% endfor %}")
    assert tools == [WEATHER, TIME] and out == messages
    out, tools = prepare(messages, SPEC, "{{ messages }}")  # no tools in the template: described as text
    assert tools is None and out[0]["role"] == "system" and "get_weather" in out[0]["content"]
    assert (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in out[2]["content"]
    )
    assert out[3] == {
        "role": "user",
        "content": "<tool_response>\n22 C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>",
    }
    with pytest.raises(ApiError) as info:
        prepare(messages, ToolSpec((WEATHER,), "required"), "{{ messages }}")
    assert info.value.param == "tool_choice"
    out, _ = prepare(messages, ToolSpec((WEATHER,), "named", "get_weather"), "{{ tools }}")
    assert out[0]["role"] == "system" and "get_weather" in out[0]["content"]


def test_call_schema():
    named = call_schema(ToolSpec((WEATHER, TIME), "named", "get_time", parallel=False))
    assert named["properties"]["name"] == {"const": "get_time"} and named["required"] == ["name", "arguments"]
    one, many = call_schema(ToolSpec((WEATHER, TIME), "required"))["anyOf"]  # a call, or an array of them
    assert len(one["anyOf"]) == 2 and many == {"type": "array", "items": one, "minItems": 1}
    assert one["anyOf"][0]["properties"]["arguments"] == WEATHER["function"]["parameters"]
    bounded = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 9}}}}}  # fmt: skip
    loose = call_schema(ToolSpec((bounded,), "required", parallel=False))
    assert loose["properties"]["arguments"]["properties"]["n"] == {"type": "integer"}  # bounds: the tool's
    assert tool_grammar(ToolSpec((WEATHER,), "auto")) is None
    spec = tool_grammar(ToolSpec((WEATHER,), "named", "get_weather"))
    assert spec is not None and spec.kind == "json_schema" and spec.param == "tool_choice"
