"""The prompt cache on the real default pair (slow; skipped without it): two ~1,100-token
conversations alternated through `specchat serve`'s stack, as an agent and its sub-agent do."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from specchat.models import loader
from tests.serving import client, health, serving

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def code(index: int, chars: int = 4200) -> str:
    text = "\n".join(f.read_text() for f in sorted((ROOT / "specchat" / "decoding").glob("*.py")))
    start = index * chars
    return text[start : start + chars]


def conversation(index: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a senior Python reviewer. Answer briefly."},
        {"role": "user", "content": f"```python\n{code(index)}\n```\nWhat does this code do?"},
    ]


@contextmanager
def engine(target: Path, drafts: tuple[str, ...]) -> Iterator[loader.LoadedEngine]:
    loaded = loader.load(loader.LoadConfig(target=str(target), drafts=drafts, ctx_size=4096))
    try:
        yield loader.LoadedEngine(loaded)
    finally:
        loaded.close()


def alternate(url: str) -> list[tuple[int, int, float, str]]:
    """A, B, A + follow-up, B + follow-up: (cached, prompt tokens, seconds, text) of each turn."""
    c = client(url)
    c.timeout = 600

    def ask(messages: list[dict[str, str]]) -> tuple[int, int, float, str]:
        t0 = time.perf_counter()
        r = c.chat.completions.create(model="qwen", messages=messages, max_tokens=24, temperature=0)
        wall = time.perf_counter() - t0
        return (
            r.usage.prompt_tokens_details.cached_tokens,
            r.usage.prompt_tokens,
            wall,
            r.choices[0].message.content,
        )

    a, b = conversation(0), conversation(1)
    ra, rb = ask(a), ask(b)
    ra2 = ask([*a, {"role": "assistant", "content": ra[3]}, {"role": "user", "content": "Any bug?"}])
    rb2 = ask([*b, {"role": "assistant", "content": rb[3]}, {"role": "user", "content": "How to test it?"}])
    return [ra, rb, ra2, rb2]


def test_alternated_conversations_are_restored_and_exact(real_pair):
    target, draft = real_pair
    with engine(target, (str(draft), "ngram")) as spec, serving(spec, k=None, cache_bytes=1 << 30) as url:
        drafted = alternate(url)
        status = health(url)["prompt_cache"]
    assert drafted[0][1] > 900  # ~1k-token conversations
    for cached, prompt, wall, _ in drafted[2:]:
        assert cached >= 0.95 * prompt, (cached, prompt)
        assert wall < 0.35 * drafted[0][2], (wall, drafted[0][2])  # seconds, not a whole re-prefill
    assert status["hits"] == 2
    with engine(target, ()) as plain, serving(plain, k=None, cache_bytes=1 << 30) as url:
        alone = alternate(url)
    assert [t for *_, t in drafted] == [t for *_, t in alone]
