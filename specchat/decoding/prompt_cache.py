"""Conversations put aside and restored: the server's prompt cache across conversations.

Why: a model's KV cache holds one token sequence. An agent alternates conversations (the agent and
its sub-agent, a chat and its summariser, two editor tabs), so each request's prompt shares only the
system prompt with what the cache holds, and without a copy a conversation would be decoded from
scratch on every turn (llama-server restores it from its host-memory prompt cache). Here, before a
request would overwrite the cache, the conversation it holds is copied to host memory (`save_state`:
a memory copy, milliseconds); a request whose prompt shares a longer prefix with a saved conversation
than with the cache restores that one first, and decodes only the rest. Least recently used
conversations go first when the budget is full.

What is saved: the target's cache and each draft model's (which can lag, or hold nothing when the
planner never drafts with it). The n-gram drafter rebuilds its index from the prompt itself
(milliseconds) and the planner's statistics are about the machine and the drafters, not about one
conversation, so neither needs anything here.

Exactness: the restored K/V are the bits that were computed, so a restored conversation decodes
exactly as if it had stayed in the cache. Which conversation is kept is decided on the target's
copies alone (the budget counts their bytes; each draft copy rides with its target copy and adds
its model's share on top), so `--no-draft`, which loads no draft model, keeps and evicts the same
conversations as speculative serving and writes the same tokens for the same requests.

This module is policy only: the models do the copying (engine.LlamaModel.save_state). It runs on
the one model thread; `status` may be read from another (the HTTP side), hence the lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .model import common_prefix_len

#: A conversation is put aside only when a request would discard at least this many of its tokens,
#: and restored only when that saves decoding at least this many (below it, copying costs about what
#: decoding would: a restore copies the whole saved cache, ~30 kB a token on a 1.5B target).
MIN_TOKENS = 32


class State(Protocol):
    """A saved cache: the tokens it holds and its size in host memory."""

    @property
    def tokens(self) -> Sequence[int]: ...

    @property
    def nbytes(self) -> int: ...


class Stateful(Protocol):
    """A model whose cache can be copied out and back (engine.LlamaModel; tests' fakes)."""

    @property
    def tokens(self) -> Sequence[int]: ...

    def save_state(self) -> Any: ...

    def restore_state(self, state: Any) -> bool: ...


@dataclass(slots=True)
class Entry:
    """One saved conversation: the target's copy and each draft model's (None: it held nothing)."""

    target: State
    drafts: tuple[State | None, ...]
    used: int  # recency stamp: the least recently used entry is evicted first

    @property
    def tokens(self) -> Sequence[int]:
        return self.target.tokens

    @property
    def draft_bytes(self) -> int:
        return sum(d.nbytes for d in self.drafts if d is not None)


@dataclass(frozen=True, slots=True)
class Prepared:
    """What `prepare` did for one prompt: the prompt tokens the cache already held (`kept`), those
    restored from a saved conversation (`restored`, 0: none), and whether the conversation the cache
    held was saved first."""

    kept: int
    restored: int = 0
    saved: bool = False
    seconds: float = 0.0


class PromptCache:
    """Saved conversations of `target` (and its `drafts`) within `budget_bytes` of target copies."""

    def __init__(
        self,
        target: Stateful,
        drafts: Sequence[Stateful] = (),
        *,
        budget_bytes: int,
        min_tokens: int = MIN_TOKENS,
    ) -> None:
        self.target = target
        self.drafts = tuple(drafts)
        self.budget_bytes = max(0, int(budget_bytes))
        self.min_tokens = min_tokens
        self._entries: list[Entry] = []
        self._clock = 0
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "saved": 0, "evicted": 0, "too_big": 0}
        self._seconds = {"save": 0.0, "restore": 0.0}

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    @property
    def used_bytes(self) -> int:
        return sum(e.target.nbytes for e in self._entries)

    def prepare(self, prompt: Sequence[int], *, restore: bool = True) -> Prepared:
        """Before generating after `prompt`: put aside the conversation the cache holds if this
        prompt would discard much of it, and restore a saved one that shares more of the prompt.
        `restore=False` only saves (a request that re-reads its whole prompt anyway)."""
        kept = common_prefix_len(self.target.tokens, prompt)
        if not self.enabled:
            return Prepared(kept)
        start = time.perf_counter()
        saved = False
        if len(self.target.tokens) - kept >= self.min_tokens:
            saved = self._save_live()  # first: saving may evict, and the choice below sees the result
        best: Entry | None = None
        best_len = kept
        if restore:
            for entry in self._entries:
                n = common_prefix_len(entry.tokens, prompt)
                if n > best_len:
                    best, best_len = entry, n
        restored = 0
        if best is not None and best_len - kept >= self.min_tokens:
            restored = best_len if self._restore(best) else 0
        with self._lock:
            self._counts["hits" if restored else "misses"] += 1
        return Prepared(kept, restored, saved, time.perf_counter() - start)

    def _save_live(self) -> bool:
        """Copy the caches out as a new entry (unless a saved one already covers them)."""
        tokens = self.target.tokens
        for entry in self._entries:
            if common_prefix_len(entry.tokens, tokens) == len(tokens):  # covered (it is as long or longer)
                entry.used = self._tick()
                return False
        t0 = time.perf_counter()
        target = self.target.save_state()
        if target.nbytes > self.budget_bytes:
            with self._lock:
                self._counts["too_big"] += 1  # a cache too small for one conversation: no cache, no error
            return False
        drafts = tuple(d.save_state() if d.tokens else None for d in self.drafts)
        entry = Entry(target, drafts, self._tick())
        with self._lock:
            # entries this one extends are subsumed: any prompt they match, it matches as far
            self._entries = [e for e in self._entries if common_prefix_len(e.tokens, tokens) < len(e.tokens)]
            self._entries.append(entry)
            while self.used_bytes > self.budget_bytes:
                self._entries.remove(min(self._entries, key=lambda e: e.used))
                self._counts["evicted"] += 1
            self._counts["saved"] += 1
            self._seconds["save"] += time.perf_counter() - t0
        return True

    def _restore(self, entry: Entry) -> bool:
        """Load `entry` into the models; it leaves the cache (the models hold it now, and it is saved
        again, updated, when the next conversation takes its place)."""
        t0 = time.perf_counter()
        with self._lock:
            self._entries.remove(entry)
        ok = self.target.restore_state(entry.target)
        for model, state in zip(self.drafts, entry.drafts, strict=True):
            if state is not None and ok:
                model.restore_state(state)  # a refused draft copy only costs the draft a prefill
        with self._lock:
            self._seconds["restore"] += time.perf_counter() - t0
        return ok

    def clear(self) -> dict[str, int]:
        """Forget every saved conversation (what the models' caches hold now stays: a generation may
        be using it). For a cold measurement, or to give the memory back; returns what was freed."""
        with self._lock:
            freed = {"conversations": len(self._entries), "bytes": self.used_bytes}
            self._entries = []
        return freed

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def status(self) -> dict[str, object]:
        """How full the cache is, for /health and the log (safe to call from another thread)."""
        with self._lock:
            entries = list(self._entries)
            counts = dict(self._counts)
            seconds = dict(self._seconds)
        return {
            "enabled": self.enabled,
            "conversations": len(entries),
            "tokens": sum(len(e.tokens) for e in entries),
            "bytes": sum(e.target.nbytes for e in entries),
            "draft_bytes": sum(e.draft_bytes for e in entries),
            "budget_bytes": self.budget_bytes,
            **counts,
            "save_seconds": round(seconds["save"], 4),
            "restore_seconds": round(seconds["restore"], 4),
        }

    def summary(self) -> str:
        """One line for the server's log: how full the cache is."""
        with self._lock:
            count, used = len(self._entries), self.used_bytes
        mib = 1 << 20
        return f"{count} saved, {used / mib:.0f} of {self.budget_bytes / mib:.0f} MiB"
