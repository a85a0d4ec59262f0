"""The prompt cache's policy (decoding/prompt_cache.py) over fake models: what is put aside, what is
restored, what is evicted, and that generation after a restore is what it would have been."""

from __future__ import annotations

import numpy as np

from specchat.decoding.drafters import ModelDrafter
from specchat.decoding.events import Token
from specchat.decoding.loop import FixedK, Settings, generate
from specchat.decoding.prompt_cache import MIN_TOKENS, PromptCache
from tests.fakes import BYTES_PER_TOKEN, FakeModel


def conversation(seed: int, n: int, *, system: int = 6) -> list[int]:
    """A prompt: a shared 'system prompt' of `system` tokens, then `n` tokens of its own."""
    rng = np.random.default_rng(seed)
    return [1] * system + [int(t) for t in rng.integers(2, 16, n)]


def answer(
    target: FakeModel, prompt: list[int], *, drafter: FakeModel | None = None, n: int = 12
) -> list[int]:
    drafters = [ModelDrafter(drafter, p_min=0.0)] if drafter is not None else []
    events = generate(
        target,
        prompt,
        drafters=drafters,
        planner=FixedK(3 if drafters else 0),
        settings=Settings(max_tokens=n),
    )
    return [ev.id for ev in events if isinstance(ev, Token)]


def test_alternating_conversations_restore_their_prefix() -> None:
    target = FakeModel(seed=1)
    cache = PromptCache(target, budget_bytes=10**9)
    a, b = conversation(1, 200), conversation(2, 200)
    for prompt in (a, b):
        cache.prepare(prompt)
        prompt.extend(answer(target, prompt))  # the conversation goes on with its answer
    a_next, b_next = [*a, 3, 4, 5], [*b, 5, 4, 3]
    got = cache.prepare(a_next)
    assert got.saved  # b was put aside before a took its place
    assert got.restored >= len(a) - 1  # a came back: all but its last token (never decoded)
    assert len(a_next) - 1 - got.restored < 0.05 * len(a_next)
    assert cache.prepare(b_next).restored >= len(b) - 1
    assert cache.status()["hits"] == 2


def test_a_follow_up_of_the_live_conversation_needs_nothing() -> None:
    target = FakeModel(seed=1)
    cache = PromptCache(target, budget_bytes=10**9)
    a = conversation(1, 100)
    cache.prepare(a)
    a.extend(answer(target, a))
    got = cache.prepare([*a, 7, 8])
    assert (got.saved, got.restored) == (False, 0)
    assert got.kept == len(target.tokens)
    assert target.restored == []


def test_restored_generation_equals_uncached() -> None:
    """A conversation that comes back from the cache answers exactly as one that never left."""
    a, b = conversation(3, 80), conversation(4, 80)
    cached_target = FakeModel(seed=2)
    cache = PromptCache(cached_target, budget_bytes=10**9)
    for prompt in (a, b):
        cache.prepare(prompt)
        answer(cached_target, prompt)
    follow = [*a, 9, 9]
    assert cache.prepare(follow).restored > 0
    fresh = FakeModel(seed=2)
    assert answer(cached_target, follow) == answer(fresh, follow)


def test_draft_caches_come_back_with_the_target() -> None:
    target, draft = FakeModel(seed=1), FakeModel(seed=1)  # an always-right draft: it drafts every round
    cache = PromptCache(target, [draft], budget_bytes=10**9)
    a, b = conversation(5, 120), conversation(6, 120)
    for prompt in (a, b):
        cache.prepare(prompt)
        prompt.extend(answer(target, prompt, drafter=draft))
    got = cache.prepare([*a, 2, 2])
    assert got.restored > 0
    assert draft.restored and draft.restored[-1] >= len(a) - 12  # the draft's own copy, at its own length
    assert cache.status()["draft_bytes"] > 0


def test_least_recently_used_goes_first_and_memory_stays_bounded() -> None:
    target = FakeModel(seed=1)
    budget = 3 * 110 * BYTES_PER_TOKEN  # room for three 100-token conversations
    cache = PromptCache(target, budget_bytes=budget)
    prompts = [conversation(10 + i, 100) for i in range(12)]
    for prompt in prompts:
        cache.prepare(prompt)
        answer(target, prompt, n=4)
        assert cache.used_bytes <= budget
    status = cache.status()
    assert status["conversations"] == 3
    assert status["evicted"] == 11 - 3
    # the oldest are gone, the newest saved ones are there
    assert cache.prepare([*prompts[0], 1]).restored == 0
    assert cache.prepare([*prompts[10], 1]).restored > 0


def test_a_cache_too_small_for_one_conversation_is_no_cache() -> None:
    target = FakeModel(seed=1)
    cache = PromptCache(target, budget_bytes=10 * BYTES_PER_TOKEN)
    a, b = conversation(1, 100), conversation(2, 100)
    for prompt in (a, b, [*a, 3]):
        got = cache.prepare(prompt)
        assert got.restored == 0
        answer(target, prompt, n=4)
    assert cache.status()["conversations"] == 0
    assert cache.status()["too_big"] >= 2


def test_off_does_nothing() -> None:
    target = FakeModel(seed=1)
    cache = PromptCache(target, budget_bytes=0)
    a = conversation(1, 100)
    cache.prepare(a)
    answer(target, a)
    got = cache.prepare(conversation(2, 100))
    assert (got.saved, got.restored) == (False, 0)
    assert cache.status()["enabled"] is False


def test_short_differences_are_decoded_not_copied() -> None:
    """Restoring copies a whole saved cache: for a few tokens decoding is cheaper."""
    target = FakeModel(seed=1)
    cache = PromptCache(target, budget_bytes=10**9)
    a = conversation(1, 100)
    cache.prepare(a)
    answer(target, a, n=4)
    # a prompt sharing all but the last few tokens of what the cache holds: nothing is saved
    got = cache.prepare([*a[: len(a) - MIN_TOKENS + 8], 15])  # the cache holds a and 3 answer tokens
    assert not got.saved


def test_extended_conversations_replace_their_earlier_copy() -> None:
    target = FakeModel(seed=1)
    cache = PromptCache(target, budget_bytes=10**9)
    a, b = conversation(1, 100), conversation(2, 100)
    for prompt in (a, b, [*a, 4, 4, 4], b, [*a, 4, 4, 4, 5]):
        cache.prepare(prompt)
        prompt_answer = answer(target, prompt, n=40)
        prompt.extend(prompt_answer)
    # one copy per conversation, however many turns each had
    assert cache.status()["conversations"] <= 2
