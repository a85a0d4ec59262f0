"""Slow: the protocol agents and harnesses speak, on the real default pair (Qwen2.5-Coder 1.5B target,
0.5B draft) through the official `openai` client: a tool-call round trip (the call parsed, the same
when streamed, the result sent back and used), and the tokenizer endpoints against the prompt arrays
lm-eval sends. Skipped when the pair is absent (`specchat pull qwen2.5-coder-1.5b --with-draft`)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from specchat.models import loader

from .serving import serve_here

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]


def test_tool_call_round_trip_and_tokenizer_on_the_real_pair(real_pair):
    target, draft = (str(p) for p in real_pair)
    loaded = loader.load(loader.LoadConfig(target=target, drafts=(draft, "ngram"), ctx_size=2048))

    def drive(url: str) -> None:
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        args = {"model": "qwen", "tools": [WEATHER], "temperature": 0, "max_tokens": 96}
        reply = c.chat.completions.create(messages=QUESTION, **args)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message.content
        [call] = choice.message.tool_calls
        assert call.id.startswith("call_") and call.function.name == "get_weather"
        assert json.loads(call.function.arguments)["city"].lower() == "paris"

        chunks = list(c.chat.completions.create(messages=QUESTION, stream=True, **args))
        frags = [
            t
            for ch in chunks
            if ch.choices and ch.choices[0].delta.tool_calls
            for t in ch.choices[0].delta.tool_calls
        ]
        assert frags[0].function.name == "get_weather" and frags[0].id.startswith("call_")
        assert json.loads("".join(f.function.arguments or "" for f in frags)) == json.loads(
            call.function.arguments
        )
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"

        # a named tool_choice: the grammar makes the answer a call even to a question that needs none
        named = {"type": "function", "function": {"name": "get_weather"}}
        hello = [{"role": "user", "content": "Say hello."}]
        forced = c.chat.completions.create(messages=hello, **{**args, "tool_choice": named})
        assert forced.choices[0].finish_reason == "tool_calls"
        assert forced.choices[0].message.tool_calls[0].function.name == "get_weather"
        assert isinstance(json.loads(forced.choices[0].message.tool_calls[0].function.arguments)["city"], str)

        result = {"city": "Paris", "temperature_c": 17, "sky": "light rain"}
        history = [
            *QUESTION,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
        ]
        # the 1.5B model calls again while tools are offered; tool_choice none lets it answer
        answer = c.chat.completions.create(messages=history, **{**args, "tool_choice": "none"})
        text = answer.choices[0].message.content or ""
        assert answer.choices[0].finish_reason == "stop" and "17" in text, text
        assert answer.usage.prompt_tokens_details.cached_tokens > 0  # the conversation's prefix was kept

        base = url.removesuffix("/v1")
        info = httpx.get(f"{base}/tokenizer_info", timeout=30).json()
        assert info["eos_token"] == "<|im_end|>" and info["max_model_len"] == 2048
        ids = httpx.post(
            f"{base}/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}
        ).json()
        assert (
            httpx.post(f"{base}/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"] == "Hello world"
        )
        scored = httpx.post(
            f"{url}/completions",
            json={"prompt": [ids["tokens"], ids["tokens"][:1]], "echo": True, "logprobs": 1, "max_tokens": 0},
            timeout=600,
        ).json()
        assert [len(ch["logprobs"]["token_logprobs"]) for ch in scored["choices"]] == [len(ids["tokens"]), 1]

    try:
        serve_here(loader.LoadedEngine(loaded), drive, model="qwen")
    finally:
        loaded.close()
