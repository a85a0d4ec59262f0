"""What every drafter that reads the target's hidden states shares: the MTP head and Gemma 4's
assistant (llama/mtp.py), and an EAGLE-3 head (llama/eagle3.py).

Each runs a second llama.cpp context beside the target's, fed through the extended batch API
(`llama_batch_ext_*` + `llama_process`): every entry is a token together with a row of hidden state
(`llama_batch_ext_set_embd_token`). The rows come from the target, which hands them over after every
decode through its `on_decoded` hook, before its next decode overwrites them: what a row is depends on
the drafter (the target's last hidden state for MTP, three of its layers' inputs fused by the head's
encoder for EAGLE-3), so each drafter fills `_target_h` in its own way.

`CachedHead` is the part of the MTP head and the EAGLE-3 head that keeps its own K/V: one entry per
token of the text, made from the target's state at the token before where the target holds the same
text (confirmed), else from the head's own state after the entry before (a draft step: provisional).
`tokens` lists only the confirmed entries, so a round's drafts are re-read with the target's states
once it has verified them (llama.cpp does the same), and entries the target's rollback invalidated are
never reused. Where the target holds the text but its state for a position is gone (it restored a
saved cache, or the head left more than MAX_PENDING_STATES unread), the entry is made without it and
still confirmed: its drafts are the poorer for it, and re-reading would not bring the state back.
Both are `decoding.model.Model`s, so `decoding.drafters.ModelDrafter` drives them like any draft
model and the planner prices them the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from ..decoding.model import common_prefix_len
from ..errors import EngineError
from .engine import LlamaModel
from .lib import llama_cpp
from .log import quiet_stderr

#: the target's hidden states kept for a head that has not read them yet, at most (a head the planner
#: leaves idle through a long prompt reads the ones it has; older positions get none: its drafts are
#: the poorer for it, never wrong)
MAX_PENDING_STATES = 8192


class PendingRows(dict[int, np.ndarray]):
    """The target's rows (hidden states, layer inputs) by position, kept until a drafter reads them.

    Positions only ever go up between cut-backs, so insertion order is position order: dropping the
    stale rows after a cut, the oldest past the cap, or those already read costs only what goes,
    not a pass over every row kept (a drafter the planner leaves idle keeps up to
    MAX_PENDING_STATES of them, and the target adds a row every token)."""

    def put(self, base: int, rows: np.ndarray) -> None:
        """The target decoded len(rows) tokens from `base`: any rows from `base` on are stale."""
        self.drop_from(base)
        for i in range(len(rows)):
            self[base + i] = rows[i]
        while len(self) > MAX_PENDING_STATES:
            del self[next(iter(self))]

    def drop_from(self, pos: int) -> None:
        while self and next(reversed(self)) >= pos:
            self.popitem()  # the last inserted: the highest position

    def drop_before(self, pos: int) -> None:
        while self and (first := next(iter(self))) < pos:
            del self[first]


def nextn_calls() -> ModuleType:
    """llama-cpp-python's bindings of llama.cpp's staging NextN calls (mangled C++ symbols)."""
    from llama_cpp import llama_cpp_ext

    return llama_cpp_ext


def model_meta(model: object, key: str) -> str | None:
    """A metadata value of a llama.cpp model handle, as text (None where the file has no such key)."""
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", errors="replace") if n >= 0 else None


class Head:
    """A context on `model` (the target's own weights, or a drafter file's) that takes a token and a
    hidden-state row of `width` floats per entry, the target's states as it decodes, and one reusable
    extended batch. `ctx_type` is llama.cpp's (MTP, or DEFAULT for an EAGLE-3 head); `ctx_other`
    builds the context on the target's (a drafter that reads its K/V or borrows its weights); `what`
    names the drafter in messages."""

    def __init__(
        self,
        target: LlamaModel,
        model: object,
        *,
        ctx_type: int,
        ctx_other: bool,
        width: int,
        what: str,
        verbose: bool,
    ) -> None:
        self.target = target
        self.threads = target.threads
        self.gpu_layers = target.gpu_layers
        self._what = what
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = target.n_ctx
        cparams.n_batch = target.n_batch
        cparams.n_ubatch = min(512, target.n_batch)
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = target.threads
        cparams.ctx_type = ctx_type
        cparams.n_rs_seq = 0
        if ctx_other:
            cparams.ctx_other = target.raw_context
        with quiet_stderr(not verbose):
            ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            raise EngineError(
                f"llama.cpp could not create the {what} context of {target.name}",
                "--verbose shows llama.cpp's log; --no-draft decodes without it",
            )
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self._n_embd = width
        self._n_batch = int(llama_cpp.llama_n_batch(ctx))
        self._n_ubatch = int(llama_cpp.llama_n_ubatch(ctx))
        ext = nextn_calls()
        ext.llama_set_embeddings_nextn(ctx, True, True)  # the head's own state after each output row
        self._get_h = ext.llama_get_embeddings_nextn
        self._get_h_ith = ext.llama_get_embeddings_nextn_ith
        self._batch = llama_cpp.llama_batch_ext_init(ctx)
        #: the target's hidden state after each position it decoded and the head has not read yet
        self._target_h = PendingRows()
        self._zero = np.zeros(self._n_embd, dtype=np.float32)
        target.on_decoded = self._target_decoded

    # --- the target's side ------------------------------------------------------------------------
    def _target_decoded(self, base: int, count: int) -> None:
        """The target decoded `count` tokens from position `base`: keep their states (every state from
        `base` on that an earlier decode left is stale now)."""
        self._target_h.drop_from(base)
        rows = self._target_rows(count)
        if rows is not None:
            self._target_h.put(base, rows)

    def _target_rows(self, count: int) -> np.ndarray | None:
        """The state rows of the target's last decode (`count` tokens): its last hidden state."""
        ptr = self._get_h(self.target.raw_context)
        if not ptr:
            return None
        return np.ctypeslib.as_array(ptr, shape=(count, self._n_embd)).copy()

    def _target_state(self, pos: int, agree: int) -> np.ndarray | None:
        """The target's state after position `pos`, where the target holds the same tokens as the
        head up to it (`agree`: how far they agree)."""
        if pos < agree:
            return self._target_h.get(pos)
        return None

    # --- Model protocol (the parts every drafter shares) -----------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.target.n_vocab

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx

    def checkpoint(self) -> None:
        """Nothing to keep: the head's cache is attention only."""

    def is_eog(self, token: int) -> bool:
        return self.target.is_eog(token)

    def token_bytes(self, token: int) -> bytes:
        return self.target.token_bytes(token)

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_ext_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            if self.target.on_decoded == self._target_decoded:
                self.target.on_decoded = None
            llama_cpp.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to free into
            self.close()

    def _add(self, token: int, pos: int, h: np.ndarray, output: bool, keep: list[np.ndarray]) -> int:
        """One entry of the batch: the token at `pos` with the hidden-state row `h` (kept alive in
        `keep` until llama_process has read it). Its index in the batch."""
        b = self._batch
        idx = int(llama_cpp.llama_batch_ext_add_token(b, 0, int(token)))
        if idx < 0:
            raise EngineError(f"llama.cpp refused token {token} in the {self._what} drafter's batch ({idx})")
        pos_buf = (llama_cpp.llama_pos * 4)(pos)
        llama_cpp.llama_batch_ext_set_pos(b, idx, pos_buf)
        row = np.ascontiguousarray(h, dtype=np.float32)
        keep.append(row)
        embd = llama_cpp.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self._n_embd)
        if not llama_cpp.llama_batch_ext_set_embd_token(b, idx, embd):
            raise EngineError(f"llama.cpp refused the {self._what} drafter's hidden-state input")
        if output:
            llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)
        return idx

    def _outputs(self, rows: Sequence[tuple[int, int]], out: np.ndarray) -> dict[int, np.ndarray]:
        """Copy the logits of each (batch index, out row) into `out`; the drafter's own hidden state
        after each, by batch index."""
        own: dict[int, np.ndarray] = {}
        for idx, j in rows:
            logits = llama_cpp.llama_get_logits_ith(self._ctx, idx)
            out[j] = np.ctypeslib.as_array(logits, shape=(self.n_vocab,))
            h_ptr = self._get_h_ith(self._ctx, idx)
            if h_ptr:
                own[idx] = np.ctypeslib.as_array(h_ptr, shape=(self._n_embd,)).copy()
        return own

    def _check_open(self) -> None:
        if self._ctx is None:
            raise EngineError(
                f"the {self._what} drafter was already closed", "this is a bug in specchat; please report it"
            )


class CachedHead(Head):
    """A head with K/V of its own: one entry per token, confirmed or provisional (see the module
    docstring). The entry of the token at position q sits at K/V position q - `shift` and pairs it
    with the state after q - 1: an MTP head (shift 0) pairs token 0 with zeros, an EAGLE-3 head
    (shift 1) keeps no entry for it, as llama.cpp's drafters do."""

    shift = 0
    #: the head's graph computes every row of a batch and llama.cpp hands out its first n_outputs as
    #: the outputs (llama.cpp's eagle3 graph selects no output rows): each batch then has at most one
    #: output row, its first
    outputs_first = False

    def __init__(
        self,
        target: LlamaModel,
        model: object,
        *,
        ctx_type: int,
        ctx_other: bool,
        width: int,
        what: str,
        verbose: bool,
    ) -> None:
        super().__init__(
            target, model, ctx_type=ctx_type, ctx_other=ctx_other, width=width, what=what, verbose=verbose
        )
        #: the tokens the head has entries for (position order), how many of them were made from the
        #: target's states, and the head's own state after each output row, by token position
        self._entries: list[int] = []
        self._confirmed = 0
        self._own_h: dict[int, np.ndarray] = {}

    @property
    def tokens(self) -> Sequence[int]:
        """The entries made from the target's states: what later rounds can build on."""
        return self._entries[: self._confirmed]

    def decode(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        """Add entries for `tokens` at the next positions; each pairs its token with the target's
        state at the position before where the target holds the same text, else with the head's own
        (a draft step), which makes it provisional. A row asked for a token without an entry (an
        EAGLE-3 head's first token) predicts nothing: all its logits are equal."""
        self._check_open()
        start = len(self._entries)
        if start + len(tokens) > self.n_ctx:
            raise EngineError(
                f"{start + len(tokens)} tokens do not fit the {self._what} drafter's context of {self.n_ctx}"
            )
        agree = common_prefix_len(self.target.tokens, [*self._entries, *tokens])
        want = list(logits_rows)
        out = np.zeros((len(want), self.n_vocab), dtype=np.float32)
        for lo, hi in self._spans(len(tokens), want):
            self._decode_chunk(tokens, lo, hi, start, agree, want, out)
        return out

    def _spans(self, n: int, want: Sequence[int]) -> list[tuple[int, int]]:
        """The batches `n` tokens go in: n_batch at most, and where the graph hands out its first rows
        (`outputs_first`), a new one at each row asked for."""
        cuts = set(range(0, n, self._n_batch))
        if self.outputs_first:
            cuts |= {r for r in want if 0 <= r < n}
        return list(itertools.pairwise([*sorted(cuts), n]))

    def _decode_chunk(
        self,
        tokens: Sequence[int],
        lo: int,
        hi: int,
        start: int,
        agree: int,
        want: list[int],
        out: np.ndarray,
    ) -> None:
        llama_cpp.llama_batch_ext_clear(self._batch)
        keep: list[np.ndarray] = []
        outputs = {r for r in want if lo <= r < hi}
        index: dict[int, int] = {}  # batch index of each token's entry, by row
        for i in range(lo, hi):
            q = start + i
            h = self._zero if q == 0 else self._target_state(q - 1, agree)
            # confirmed where the target holds the same text: made from its state, or made without
            # one that is gone for good (a restored cache, MAX_PENDING_STATES): re-reading won't help
            if self._confirmed == q and q - 1 < agree:
                self._confirmed = q + 1
            if q < self.shift:
                continue
            own = h if h is not None else self._own_h.get(q - 1, self._zero)
            index[i] = self._add(tokens[i], q - self.shift, own, i in outputs, keep)
        if index:
            rc = llama_cpp.llama_process(self._ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, self._batch)
            if rc != 0:
                llama_cpp.llama_memory_seq_rm(self._mem, 0, max(0, start + lo - self.shift), -1)
                self._confirmed = min(self._confirmed, start + lo)
                raise EngineError(f"llama.cpp's {self._what} decode failed with code {rc}")
        self._entries.extend(int(t) for t in tokens[lo:hi])
        rows = [(index[r], j) for j, r in enumerate(want) if r in index]
        by_index = {idx: start + i for i, idx in index.items()}
        for idx, h in self._outputs(rows, out).items():
            self._own_h[by_index[idx]] = h
        # what no later entry needs: the target's states before the last confirmed entry
        self._target_h.drop_before(self._confirmed - 1)

    def truncate(self, n: int) -> None:
        if n >= len(self._entries) or self._ctx is None:
            return
        # the head's K/V are attention: any cut
        llama_cpp.llama_memory_seq_rm(self._mem, 0, max(0, n - self.shift), -1)
        del self._entries[n:]
        self._confirmed = min(self._confirmed, n)
        for pos in [p for p in self._own_h if p >= n]:
            del self._own_h[pos]
