"""A draft model's attention window: the context's first few tokens and its most recent ones.

Why: a one-token decode reads every cached key and value, so a draft model's steps grow dearer with
the context while its weights, what a short context pays for, stay the same. Small drafts keep about
as many keys and values per token as their targets (an LFM2-350M exactly as many as the LFM2-1.2B,
a Qwen2.5-0.5B nearly half of the 1.5B's), so at a few thousand tokens the draft's attention is a
large part of every drafted token, and a round of k draft steps pays it k times where the target's
verify batch pays it once.
A draft only proposes: the target checks every token, so what the draft attends to changes how
often it is right, never the output.

What is kept is StreamingLLM's cache (Xiao et al., 2023, "attention sinks": the first tokens, which
softmax attention leans on whatever they hold, and a window of the latest), the draft cache MagicDec
(Chen et al., 2024) uses for long-context speculative decoding. The kept cells keep the positions they
were computed at (no RoPE shift), and new tokens go on from the end, so the draft sees what it would
have seen with its cache cut, at the distances it was trained on. In llama.cpp the dropped cells are
freed for the next tokens and masked out of attention, which the patched CPU kernel skips a block at
a time; what the window saves is measured in docs/performance.md.

Only draft models get one (never a target, whose every row must be the plain model's; nor a head or
block drafter, which reads the target's own states). n-gram lookup still sees the whole context, so
a long-range copy is drafted there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: the context's first tokens a window keeps (StreamingLLM's four attention sinks)
SINKS = 4
#: the window moves this many tokens at once: a cut is a walk over every cell, and between cuts the
#: draft attends to at most this many tokens more than the window
STEP = 64


@dataclass(slots=True)
class AttentionWindow:
    """Which cached positions a model drops: [SINKS, cut) once the context passes SINKS + keep.

    Pure bookkeeping (engine.LlamaModel makes the llama.cpp call), so the policy is testable alone."""

    keep: int
    sinks: int = SINKS
    step: int = STEP
    #: positions in [sinks, cut) are gone from the cache (cut == sinks: none are)
    cut: int = field(init=False)

    def __post_init__(self) -> None:
        self.cut = self.sinks

    def slide(self, held: int) -> int | None:
        """After a decode that left `held` positions: the new cut when the window moved by a step or
        more (the caller drops [sinks, cut)), else None."""
        want = held - self.keep
        if want - self.cut < self.step:
            return None
        self.cut = want
        return want

    def reach(self, n: int) -> int:
        """Where a cut back to `n` positions can land: `n`, or the sinks where `n` falls in the dropped
        range (the cache holds nothing just before `n` there, and llama.cpp takes a next token only
        at the position after the last one it holds; the caller then catches up from the sinks)."""
        return self.sinks if self.sinks < n <= self.cut else n

    def truncated(self, n: int) -> None:
        """The cache was cut back to `n` positions: what it drops later starts again from there."""
        self.cut = min(self.cut, max(n, self.sinks))

    def forget(self, cut: int = 0) -> None:
        """The cache was cleared, or replaced by a saved one whose window had dropped [sinks, cut)."""
        self.cut = max(cut, self.sinks)
