"""Taking a recurrent or hybrid model's cache back to an earlier token (Qwen3.5 and later, Qwen3-Next,
LFM2, Granite 4, Nemotron-H, Jamba, Falcon-H1, Mamba).

Why this is its own problem: speculative decoding keeps only the accepted part of every verify batch.
An attention cache drops the rest with `llama_memory_seq_rm`; a recurrent state (Gated DeltaNet, a
short convolution, Mamba's SSM) is one running summary with no per-token history, so it cannot.
Rebuilding it from the whole context costs a prompt's prefill per rejected draft, and a prompt-size
batch does not round like one-token decoding, so it would also break greedy exactness.

llama.cpp offers two ways back, and this module uses both, each where it is cheapest:

* **snapshots** (`llama_context_params.n_rs_seq` = R): every decode keeps the state after each of
  its last R + 1 tokens, so `seq_rm` can step back up to R tokens for free. The trap: the snapshots
  are those of the LAST decode call only, and a step back is single-use until the next decode; a
  `seq_rm` that reaches further returns true all the same and leaves a wrong state.
  `Rollback.can_step_back` is the one guard against that, and every step back goes through it.
* **checkpoints**: a copy of the recurrent part of the state (`llama_state_seq_get_data_ext` with
  `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`: the attention cache can still drop any suffix by itself),
  taken before a batch that may need to be undone further than the snapshots reach. Going back
  restores it, drops the attention cache past it, and leaves the tokens between it and the cut
  *pending*: they are decoded at the front of the next batch, so a rejection costs rows of the next
  verify batch rather than a pass of its own (llama-server's checkpoint mode replays them the same
  way). The patched CPU build computes every row of a batch exactly as one-token decoding does, and
  the recurrent ops step token by token, so a replayed state is the state plain decoding holds.

Checkpoints also mark the points a conversation comes back to: the start and the end of each prompt
(`ANCHOR_TOKENS`), so a chat or an agent whose next turn re-renders the last answer differently (a
template that drops earlier reasoning) goes back to the end of the last prompt, not to the start.

The policy lives here, llama.cpp's calls in `engine.LlamaModel`; what a rollback costs is not decided
here but measured by calibration and the live rounds, and priced by the planner like any other cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

#: snapshots a target keeps (LoadOptions.snapshots): most verify batches the planner sends are this
#: short or shorter, and each snapshot costs one copy of the recurrent state in memory
TARGET_SNAPSHOTS = 4
#: a decode of at least this many tokens is a prompt (or a prompt's chunk): the state after it is kept
#: as an anchor, a point a later turn of the conversation is likely to come back to
ANCHOR_TOKENS = 64
#: anchors kept at most (the oldest go first): each is one copy of the recurrent state (150 MB on a
#: 27B Qwen3.6), and a conversation comes back to the end of its last prompt or the one before
MAX_ANCHORS = 2
#: pending tokens are replayed in front of the next batch while the whole stays within this many rows
#: (the patched build's batches are bit-identical to one-token decoding up to 49 rows); a longer
#: replay is decoded first in chunks of this size
REPLAY_ROWS = 32
#: states kept after a draft model's one-token steps at most (one per drafted token: the planner's
#: deepest draft, DEPTH_CAP, decodes one fewer)
MAX_STEPS = 16
#: a cache keeps its state after every drafting step only where one copy of it is at most this share
#: of the model's weights: a copy then costs a small fraction of a decode (which reads them all), and
#: the steps kept at most a quarter of the weights in memory. LFM2's short convolutions (80 KB for
#: a 350M draft) always qualify; so do the Gated DeltaNet states of Qwen3.5-class drafts (~1/100)
STEP_SHARE = 1 / 64


@dataclass(slots=True)
class Checkpoint:
    """The recurrent part of the cache after `pos` tokens (uint8 bytes as llama.cpp wrote them)."""

    pos: int
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(slots=True)
class Rollback:
    """Where a recurrent cache can go back to, and the tokens a rollback left to replay.

    `snapshots`: llama.cpp's n_rs_seq for this context (0: checkpoints only). `save` copies the
    recurrent state out (a Checkpoint at the current length), `restore` puts one back; both are the
    engine's, so this class stays free of llama.cpp and is tested with a fake."""

    snapshots: int
    save: Callable[[int], Checkpoint]
    restore: Callable[[Checkpoint], bool]
    #: whether a checkpoint may keep the state after each one-token step that follows it (STEP_SHARE)
    cheap_steps: bool = False
    #: tokens in the last decode call (the snapshots cover at most these), and whether a step back
    #: has been taken since it (a second one before the next decode is refused by llama.cpp)
    last_decode: int = 0
    stepped: bool = False
    #: the checkpoint taken before the latest batch that snapshots could not undo
    working: Checkpoint | None = None
    anchors: list[Checkpoint] = field(default_factory=list)
    #: the states after each one-token decode since the working checkpoint (a draft model drafting
    #: token by token, `cheap_steps`): going back to any of them replays nothing, where the working
    #: checkpoint alone replays every draft the target accepted. `stepping` while they are kept
    steps: list[Checkpoint] = field(default_factory=list)
    stepping: bool = False

    # --- decoding ---------------------------------------------------------------------------------
    def wants_checkpoint(self, n_new: int) -> bool:
        """Before decoding `n_new` tokens: whether the state before them must be kept, because the
        snapshots could not take the batch back far enough (they reach n_new - 1 tokens back at
        most, and `snapshots` at most). One-token decodes never ask: the loop keeps the token a
        one-row round decides, and a draft model stepping token by token calls `checkpoint` itself,
        once, before its steps."""
        return n_new >= 2 and n_new - 1 > self.snapshots

    def decoded(self, n_batch: int, end: int) -> None:
        """A decode of `n_batch` tokens ended at `end` tokens: fresh snapshots, and an anchor after a
        prompt-size batch."""
        self.last_decode = n_batch
        self.stepped = False
        if self.stepping:
            if n_batch == 1 and len(self.steps) < MAX_STEPS:
                self.steps.append(self.save(end))
            else:  # a batch or too many steps: the ones kept stay valid, no more are added
                self.stepping = False
        if n_batch >= ANCHOR_TOKENS:
            self.anchor(end)

    def anchor(self, pos: int) -> None:
        """Keep the state after `pos` tokens as a point to come back to."""
        if any(a.pos == pos for a in self.anchors):
            return
        self.anchors.append(self.save(pos))
        self.anchors.sort(key=lambda a: a.pos)
        while len(self.anchors) > MAX_ANCHORS:
            del self.anchors[0]

    def checkpoint(self, pos: int, *, steps: bool = False) -> None:
        """Keep the state after `pos` tokens as the working checkpoint (the caller flushed pending);
        with `steps` (and `cheap_steps`), also the state after each one-token decode that follows,
        until a batch is decoded or the cache is cut."""
        self.steps = []
        self.stepping = steps and self.cheap_steps
        if self.working is not None and self.working.pos == pos:
            return
        self.working = self.save(pos)

    # --- going back -------------------------------------------------------------------------------
    def can_step_back(self, held: int, n: int) -> bool:
        """Whether llama.cpp's snapshots can take a cache holding `held` tokens back to `n`: within
        the snapshot count, once per decode, and within the last decode call -- whose snapshots are
        the states AFTER each of its tokens, so the state before its first token is not among them
        (a verify batch whose every row is taken back goes back through its checkpoint)."""
        back = held - n
        return 0 < back <= min(self.snapshots, self.last_decode - 1) and not self.stepped

    def stepped_back(self, back: int, n: int | None = None) -> None:
        """llama.cpp's snapshots took the cache `back` tokens back, to `n`: step states past it go."""
        self.stepped = True
        self.last_decode -= back
        self.stepping = False
        if n is not None:
            self.steps = [c for c in self.steps if c.pos <= n]

    def best_checkpoint(self, n: int) -> Checkpoint | None:
        """The latest checkpoint at or before `n` tokens."""
        found = [c for c in (self.working, *self.steps, *self.anchors) if c is not None and c.pos <= n]
        return max(found, key=lambda c: c.pos) if found else None

    def go_back(self, n: int) -> int:
        """Take the cache back to `n` tokens through a checkpoint: restore the latest one at or before
        n. Returns the position llama.cpp's cache now holds, the tokens from there to n to be replayed
        (0: no checkpoint, or llama.cpp refused it: the cache must be cleared and everything
        replays). Checkpoints past n are dropped."""
        if self.working is not None and self.working.pos > n:
            self.working = None
        self.steps = [c for c in self.steps if c.pos <= n]
        self.stepping = False
        self.anchors = [a for a in self.anchors if a.pos <= n]
        self.stepped = True  # no snapshot step back until the next decode
        self.last_decode = 0
        ckpt = self.best_checkpoint(n)
        return ckpt.pos if ckpt is not None and self.restore(ckpt) else 0

    def forget(self) -> None:
        """The cache was cleared or replaced: nothing to go back to."""
        self.working = None
        self.steps = []
        self.stepping = False
        self.anchors = []
        self.last_decode = 0
        self.stepped = True

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in (self.working, *self.steps, *self.anchors) if c is not None)


def replay_chunks(
    pending: Sequence[int], n_new: int, *, alone: bool = False, rows: int = REPLAY_ROWS
) -> tuple[list[list[int]], int]:
    """How to decode `pending` tokens before `n_new` new ones: the chunks to decode first on their own,
    and how many pending tokens go in front of the new batch. Replayed rows ride in the new batch
    while the whole stays within `rows` (unless `alone`: everything pending first); the rest goes
    first, in chunks of at most `rows`, so no batch of a replay is wider than the patched build's
    bit-exact batches."""
    pending = list(pending)
    front = len(pending) if not alone and len(pending) + n_new <= rows else 0
    head = pending[: len(pending) - front]
    return [head[i : i + rows] for i in range(0, len(head), rows)], front
