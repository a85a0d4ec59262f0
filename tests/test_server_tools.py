"""Tool calls through `specchat serve` and the official `openai` client: a scripted fake model that
answers with a given text (so the parsing, the shapes and the streaming are pinned down), the tiny
GGUF model with Qwen2.5's real chat template (so rendering with `tools` is the template's own), and the
tiny pair's plain ChatML template (tools described in the system message; required refused)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from specchat.decoding.loop import FixedK
from specchat.models import loader

from .fakes import FakeModel
from .serving import client, serving
from .tiny_models import write_tiny_llama

QWEN25 = (Path(__file__).parent / "qwen25_template.jinja").read_text()
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
END, EOG = 256, 257


class ScriptedModel(FakeModel):
    """Bytes as tokens: after the prompt's END token it writes `script` (then EOG), whatever the
    prompt says, so a test decides what the model answers."""

    def __init__(self) -> None:
        super().__init__(258, eog=[EOG], order=1)
        self.script = b""

    def logits_after(self, context: Sequence[int]) -> Any:
        k = len(context) - 1 - max(i for i, t in enumerate(context) if t == END)
        row = self.table[0] * 0.0
        row[self.script[k] if k < len(self.script) else EOG] = 10.0
        return row

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if token < 256 else b""


class ScriptedBackend:
    """server.worker.Backend over a ScriptedModel; records what each render was handed."""

    def __init__(self, template: str | None) -> None:
        self.target = ScriptedModel()
        self.drafters: list[object] = []
        self.tie_margin = 0.0
        self.exact_rows = 0
        self.strict = False
        self.template = template
        self.rendered: list[tuple[list[dict[str, Any]], object]] = []
        self.constrained: list[object] = []

    def render(
        self, messages: Sequence[dict[str, Any]], tools: object = None, template_kwargs: object = None
    ) -> tuple[list[int], str | None]:
        self.rendered.append((list(messages), tools))
        return [*json.dumps(messages).encode()[:200], END], None

    def render_text(self, text: str) -> tuple[list[int], str | None]:
        return [*text.encode(), END], None

    def planner(self, k: int | None, *, seed: int | None = None) -> FixedK:
        return FixedK(0)

    def constraint(self, spec: object) -> None:
        """Records the grammar asked for and enforces nothing (the script decides the answer)."""
        self.constrained.append(spec)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        return list(text.encode())

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(t for t in tokens if t < 256).decode()

    def tokenizer_facts(self) -> dict[str, object]:
        return {"chat_template": self.template, "n_vocab": 258, "n_ctx": 4096}


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedBackend, str]]:
    backend = ScriptedBackend("{% for tool in tools %}{{ tool }}{% endfor %}")  # a template with tools
    with serving(backend, max_tokens=200) as url:
        yield backend, url


def ask(url: str, script: str, backend: ScriptedBackend, **kw: Any) -> Any:
    backend.target.script = script.encode()
    return client(url).chat.completions.create(model="tiny", messages=kw.pop("messages", ASK), **kw)


def test_a_call_is_parsed_into_message_tool_calls(scripted):
    backend, url = scripted
    reply = ask(url, CALL, backend, tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    messages, tools = backend.rendered[-1]
    assert tools == [WEATHER] and messages == ASK  # the template got the tools, the chat unchanged


def test_text_beside_a_call_and_undeclared_names(scripted):
    backend, url = scripted
    reply = ask(url, "Checking.\n" + CALL, backend, tools=[WEATHER])
    assert reply.choices[0].message.content == "Checking." and len(reply.choices[0].message.tool_calls) == 1
    other = ask(url, CALL.replace("get_weather", "rm_rf"), backend, tools=[WEATHER])
    assert other.choices[0].message.tool_calls is None and other.choices[0].finish_reason == "stop"
    assert other.choices[0].message.content == CALL.replace("get_weather", "rm_rf")
    plain = ask(url, CALL, backend)  # no tools offered: the text is text
    assert plain.choices[0].message.content == CALL and plain.choices[0].message.tool_calls is None


def test_tool_choice_none_offers_nothing_and_named_demands_the_call(scripted):
    backend, url = scripted
    none = ask(url, CALL, backend, tools=[WEATHER], tool_choice="none")
    assert none.choices[0].message.tool_calls is None and backend.rendered[-1][1] is None
    named = {"type": "function", "function": {"name": "get_weather"}}
    forced = ask(url, CALL, backend, tools=[WEATHER], tool_choice=named)
    assert forced.choices[0].message.tool_calls[0].function.name == "get_weather"
    messages, _ = backend.rendered[-1]
    assert messages[0]["role"] == "system" and "get_weather" in messages[0]["content"]
    grammar = backend.constrained[-1]  # the answer is constrained to a call (tools.tool_grammar)
    assert grammar.param == "tool_choice" and grammar.schema["anyOf"][0]["properties"]["name"] == {
        "const": "get_weather"
    }
    required = ask(url, "I will not.", backend, tools=[WEATHER], tool_choice="required")
    assert required.choices[0].message.content == "I will not."  # the script ignores the grammar


def test_a_streamed_call_comes_as_openai_streams_it(scripted):
    backend, url = scripted
    plain = ask(url, "Sure.\n" + CALL, backend, tools=[WEATHER])
    chunks = list(ask(url, "Sure.\n" + CALL, backend, tools=[WEATHER], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == plain.choices[0].message.content == "Sure."
    fragments = [
        tc
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for tc in c.choices[0].delta.tool_calls
    ]
    assert fragments[0].id.startswith("call_") and fragments[0].function.name == "get_weather"
    assert fragments[0].type == "function" and all(f.index == 0 for f in fragments)
    args = "".join(f.function.arguments or "" for f in fragments)
    assert json.loads(args) == {"city": "Paris"}
    assert not any("tool_call" in (c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_two_calls_and_the_round_trip(scripted):
    backend, url = scripted
    two = CALL + "\n" + CALL.replace("Paris", "Rome")
    reply = ask(url, two, backend, tools=[WEATHER])
    calls = reply.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    assert len({c.id for c in calls}) == 2
    single = ask(url, two, backend, tools=[WEATHER], parallel_tool_calls=False)
    assert len(single.choices[0].message.tool_calls) == 1
    # the client sends the call back with its result: the template gets arguments as an object
    history = [
        *ASK,
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": "22 C"},
        {"role": "tool", "tool_call_id": calls[1].id, "content": "18 C"},
    ]
    answer = ask(url, "Paris 22 C, Rome 18 C.", backend, tools=[WEATHER], messages=history)
    assert answer.choices[0].message.content == "Paris 22 C, Rome 18 C."
    messages, _ = backend.rendered[-1]
    assert messages[1]["content"] == "" and messages[1]["tool_calls"][0]["function"]["arguments"] == {
        "city": "Paris"
    }
    assert messages[2] == {"role": "tool", "content": "22 C", "tool_call_id": calls[0].id}


def test_bad_tool_fields_are_a_400_and_the_server_keeps_serving(scripted):
    backend, url = scripted
    r = httpx.post(
        f"{url}/chat/completions", json={"messages": ASK, "tools": [{"type": "function"}]}, timeout=10
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0]"
    with pytest.raises(openai.BadRequestError) as info:
        ask(
            url,
            CALL,
            backend,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert info.value.body["param"] == "tool_choice"  # type: ignore[index]
    assert ask(url, "fine", backend).choices[0].message.content == "fine"


def test_a_template_without_tools_gets_them_described_and_refuses_required():
    backend = ScriptedBackend("{% for m in messages %}{{ m.content }}{% endfor %}")
    with serving(backend, max_tokens=200) as url:
        reply = ask(url, '{"name": "get_weather", "parameters": {"city": "Paris"}}', backend, tools=[WEATHER])
        assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
        messages, tools = backend.rendered[-1]
        assert tools is None and messages[0]["role"] == "system"
        assert '"name": "get_weather"' in messages[0]["content"] and "<tool_call>" in messages[0]["content"]
        with pytest.raises(openai.BadRequestError) as info:
            ask(url, CALL, backend, tools=[WEATHER], tool_choice="required")
        assert info.value.body["param"] == "tool_choice"  # type: ignore[index]
        chunks = list(ask(url, CALL, backend, tools=[WEATHER], stream=True))  # still serving, streams too
        assert any(c.choices and c.choices[0].delta.tool_calls for c in chunks)


# --- the real template, on a tiny GGUF ------------------------------------------------------------------


def test_qwen25_template_renders_tools_and_calls(tmp_path):
    model = write_tiny_llama(tmp_path / "qwen-template.gguf", seed=1, chat_template=QWEN25, n_ctx_train=2048)
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
    ]
    loaded = loader.load(loader.LoadConfig(target=str(model), ctx_size=2048, threads=1))
    try:
        engine = loader.LoadedEngine(loaded)
        text = engine.detokenize(engine.render(history, tools=[WEATHER])[0])
        plain = engine.detokenize(engine.render(ASK)[0])
    finally:
        loaded.close()
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n22 C\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n") and "<tools>" not in plain


def test_a_named_tool_choice_is_enforced_by_the_grammar(tmp_path):
    """A random tiny model with Qwen2.5's template, constrained: whatever it would write, the answer
    is a call of the named function with arguments its schema allows, streamed or not."""
    model = write_tiny_llama(tmp_path / "qwen-template.gguf", seed=1, chat_template=QWEN25, n_ctx_train=2048)
    city = {"type": "string", "enum": ["Paris", "Rome"]}
    params = {
        "type": "object",
        "properties": {"city": city},
        "required": ["city"],
        "additionalProperties": False,
    }
    tool = {**WEATHER, "function": {**WEATHER["function"], "parameters": params}}
    loaded = loader.load(loader.LoadConfig(target=str(model), ctx_size=2048, threads=1))
    try:
        with serving(loader.LoadedEngine(loaded), max_tokens=64) as url:
            named = {"type": "function", "function": {"name": "get_weather"}}
            args = {"model": "tiny", "messages": ASK, "tools": [tool], "tool_choice": named, "temperature": 0}
            reply = client(url).chat.completions.create(**args)
            chunks = list(client(url).chat.completions.create(**args, stream=True))
    finally:
        loaded.close()
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in (
        "Paris",
        "Rome",
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    frags = [
        t
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for t in c.choices[0].delta.tool_calls
    ]
    assert "".join(f.function.arguments or "" for f in frags) == call.function.arguments


def test_tools_on_the_tiny_pair_answer_without_error(tiny_url):
    """The tiny pair's ChatML template knows no tools: they are described, the random answer is text,
    and tool_choice required is a clear 400."""
    c = client(tiny_url)
    reply = c.chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER], max_tokens=8, temperature=0
    )
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.tool_calls is None
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(
            model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=8
        )
    chunks = list(
        c.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=8, stream=True)
    )
    assert chunks[-1].choices[0].finish_reason == "length"
