"""The prompt cache through `specchat serve` on the tiny GGUF pair: llama.cpp's own state copies
(save_state / restore_state), cached tokens reported as OpenAI does, /health, memory bounded, and
the same text with and without drafting for the same sequence of requests."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import psutil
import pytest

from tests.serving import client, health, loaded_engine, serving

SYSTEM = {"role": "system", "content": "You are a careful assistant who answers in short sentences. " * 4}


def conversation(topic: str) -> list[dict[str, str]]:
    """A conversation of some length: the shared system prompt, then a long user message of its own."""
    return [SYSTEM, {"role": "user", "content": f"Tell me about {topic}. " + f"{topic} matters. " * 20}]


def turn(c, messages: list[dict[str, str]], n: int = 10):  # type: ignore[no-untyped-def]
    return c.chat.completions.create(model="tiny", messages=messages, max_tokens=n, temperature=0)


def follow_up(messages: list[dict[str, str]], reply, text: str) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    return [
        *messages,
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": text},
    ]


def alternate(url: str) -> list[tuple[int, int, str]]:
    """Turns A, B, A + follow-up, B + follow-up: (cached, prompt tokens, text) of each."""
    c = client(url)
    a, b = conversation("rivers"), conversation("mountains")
    ra, rb = turn(c, a), turn(c, b)
    ra2 = turn(c, follow_up(a, ra, "And then?"))
    rb2 = turn(c, follow_up(b, rb, "Why?"))
    return [
        (r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens, r.choices[0].message.content)
        for r in (ra, rb, ra2, rb2)
    ]


def test_alternated_conversations_come_back_from_the_cache(tiny_engine):
    with serving(tiny_engine, cache_bytes=64 << 20) as url:
        turns = alternate(url)
        status = health(url)["prompt_cache"]
    for (_, before, _), (cached, prompt, _) in zip(turns[:2], turns[2:], strict=True):
        assert cached >= before  # each follow-up: all of its conversation's first turn restored
        assert cached >= 0.9 * prompt  # only the answer's end and the new message are decoded
    assert turns[1][0] < 0.5 * turns[1][1]  # B's first turn shares only the system prompt with A
    assert status["hits"] == 2 and status["conversations"] >= 1
    assert 0 < status["bytes"] <= status["budget_bytes"]


def test_delete_prompt_cache_forgets_the_saved_conversations(tiny_engine):
    with serving(tiny_engine, cache_bytes=64 << 20) as url:
        c = client(url)
        for topic in ("rivers", "mountains"):
            turn(c, conversation(topic))
        assert health(url)["prompt_cache"]["conversations"] == 1  # rivers, put aside for mountains
        root = url.removesuffix("/v1")
        r = httpx.delete(f"{root}/prompt_cache", timeout=10)
        assert r.status_code == 200
        assert r.json()["cleared"]["conversations"] == 1 and r.json()["prompt_cache"]["conversations"] == 0
        back = turn(c, conversation("rivers"))  # decoded again, and the server keeps serving
        assert back.usage.prompt_tokens_details.cached_tokens < 0.5 * back.usage.prompt_tokens
    with serving(tiny_engine) as url:  # a server without a prompt cache
        r = httpx.delete(url.removesuffix("/v1") + "/prompt_cache", timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_without_the_cache_follow_ups_decode_their_whole_prompt(tiny_engine):
    with serving(tiny_engine, cache_bytes=0) as url:
        turns = alternate(url)
        assert health(url)["prompt_cache"]["enabled"] is False
    assert all(cached < 0.5 * prompt for cached, prompt, _ in turns[2:])


@pytest.mark.parametrize("draft_window", [None, 16])
def test_drafting_writes_what_the_target_alone_writes_cache_hits_included(tiny_pair, draft_window):
    """With the default window (longer than these conversations) and with one far shorter, whose
    cuts the saved and restored draft caches carry."""
    target, draft = tiny_pair
    drafts = (str(draft), "ngram")
    with (
        loaded_engine(target, drafts, draft_window=draft_window) as spec,
        serving(spec, cache_bytes=64 << 20) as url,
    ):
        drafted = alternate(url)
    with loaded_engine(target) as plain, serving(plain, cache_bytes=64 << 20, k=None) as url:
        alone = alternate(url)
    assert [t for _, _, t in drafted] == [t for _, _, t in alone]
    assert [c for c, _, _ in drafted] == [c for c, _, _ in alone]


def test_a_cache_too_small_for_one_conversation_still_serves(tiny_engine):
    with serving(tiny_engine, cache_bytes=1 << 10) as url:
        turns = alternate(url)
        status = health(url)["prompt_cache"]
    assert all(text for _, _, text in turns)
    assert status["conversations"] == 0 and status["too_big"] >= 1


def test_many_conversations_stay_within_the_budget(tiny_engine):
    """Fill and evict: 24 conversations through a cache with room for a few; RSS stays bounded."""
    process = psutil.Process(os.getpid())
    with serving(tiny_engine, cache_bytes=2 << 20) as url:
        c = client(url)
        turn(c, conversation("warm-up"))
        rss = [process.memory_info().rss]
        for i in range(24):
            turn(c, conversation(f"topic number {i}"), n=4)
            rss.append(process.memory_info().rss)
        status = health(url)["prompt_cache"]
    assert status["bytes"] <= status["budget_bytes"]
    assert status["evicted"] > 0 and status["conversations"] >= 1
    # every saved copy beyond the budget was freed: growth stays near the budget, not 24 copies
    assert max(rss) - rss[0] < (2 << 20) + (48 << 20)


@pytest.mark.parametrize("flag", ["-1", "x"])
def test_cache_ram_flag_is_checked(flag: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from specchat.cli import app

    result = CliRunner().invoke(app, ["serve", str(tmp_path / "none.gguf"), "--cache-ram", flag])
    assert result.exit_code != 0
    assert "Traceback" not in result.output


@pytest.mark.parametrize("layout", ["qwen35", "lfm2"])
def test_hybrid_targets_come_back_from_the_cache_and_write_what_they_write_alone(
    layout: str, qwen35_pair: tuple[Path, Path], lfm2_pair: tuple[Path, Path]
) -> None:
    """A recurrent state cannot be cut at any prefix, so the copies carry the states kept at the
    prompts' ends (llama/rollback.py): follow-ups of alternated conversations on a hybrid target are
    served from the cache as on an attention model, and drafting changes no token."""
    target, draft = qwen35_pair if layout == "qwen35" else lfm2_pair
    with loaded_engine(target, (str(draft), "ngram")) as spec, serving(spec, cache_bytes=64 << 20) as url:
        drafted = alternate(url)
    with loaded_engine(target) as plain, serving(plain, cache_bytes=64 << 20, k=None) as url:
        alone = alternate(url)
    for (_, before, _), (cached, prompt, _) in zip(drafted[:2], drafted[2:], strict=True):
        assert cached >= before and cached >= 0.9 * prompt
    assert [t for _, _, t in drafted] == [t for _, _, t in alone]
    assert [c for c, _, _ in drafted] == [c for c, _, _ in alone]
