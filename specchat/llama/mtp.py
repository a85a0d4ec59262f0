"""A target's own multi-token-prediction head (NextN: Qwen3.5/3.6/3.8, Qwen3-Next, GLM, MiMo, ...) as a
draft model.

Why a head rather than a separate draft model: it was trained with the target, reads the target's own
last hidden state, and costs one decoder layer plus the output projection per drafted token -- no
second tokenizer, no second prompt prefill through a whole model.

How it runs (llama.cpp's `draft-mtp`, common/speculative.cpp, driven from Python): the target's
context also returns its last hidden state for every token it decodes (`llama_set_embeddings_nextn`);
a second context on the same weights (`LLAMA_CONTEXT_TYPE_MTP`) holds the head's own K/V, one entry
per position p, made from the token at p and the target's hidden state at p - 1. To draft after the
committed context, the head reads the last committed token with the target's last hidden state,
predicts the next token, and feeds its own hidden state back for each further step (one head reused
step by step; a model with several NextN blocks chains them the same way through the first block).

`MtpHead` is a `decoding.model.Model`, so `decoding.drafters.ModelDrafter` drives it like any draft
model and the planner prices it the same way (its per-token cost, its catching up on the context).
Entries made from the head's own hidden states are provisional: `tokens` lists only those made from
the target's, so a round's drafts are re-read with the target's hidden states once it has verified
them (llama.cpp does the same), and entries the target's rollback invalidated are never reused.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..decoding.model import common_prefix_len
from ..errors import EngineError
from .engine import LlamaModel
from .lib import llama_cpp
from .log import quiet_stderr


def _ext() -> object:
    """llama-cpp-python's bindings of llama.cpp's staging NextN calls (mangled C++ symbols)."""
    from llama_cpp import llama_cpp_ext

    return llama_cpp_ext


#: the target's hidden states kept for a head that has not read them yet, at most (a head the planner
#: leaves idle through a long prompt reads the ones it has; older positions get none: its drafts are
#: the poorer for it, never wrong)
MAX_PENDING_STATES = 8192


def _meta(model: object, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", errors="replace") if n >= 0 else None


class _Head:
    """What both kinds of MTP drafter share: a context of type MTP on `model` (the target's own weights,
    or an assistant file's), the target's hidden state for every token the target decodes, and one
    reusable extended batch (a token and a hidden-state row per entry)."""

    def __init__(self, target: LlamaModel, model: object, *, shares_cache: bool, verbose: bool) -> None:
        self.target = target
        self.threads = target.threads
        self.gpu_layers = target.gpu_layers
        ext = _ext()
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = target.n_ctx
        cparams.n_batch = target.n_batch
        cparams.n_ubatch = min(512, target.n_batch)
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = target.threads
        cparams.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        cparams.n_rs_seq = 0
        if shares_cache:  # an assistant reads the target's K/V: its context is built on the target's
            cparams.ctx_other = target.raw_context
        with quiet_stderr(not verbose):
            ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            raise EngineError(
                f"llama.cpp could not create the MTP context of {target.name}",
                "--verbose shows llama.cpp's log; --no-draft decodes without it",
            )
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self._n_embd = int(llama_cpp.llama_model_n_embd_out(target.raw_model))
        self._n_batch = int(llama_cpp.llama_n_batch(ctx))
        ext.llama_set_embeddings_nextn(target.raw_context, True, False)  # every row, not only outputs
        ext.llama_set_embeddings_nextn(ctx, True, True)
        self._get_h = ext.llama_get_embeddings_nextn
        self._get_h_ith = ext.llama_get_embeddings_nextn_ith
        self._batch = llama_cpp.llama_batch_ext_init(ctx)
        #: the target's hidden state after each position it decoded and the head has not read yet
        self._target_h: dict[int, np.ndarray] = {}
        self._zero = np.zeros(self._n_embd, dtype=np.float32)
        target.on_decoded = self._target_decoded

    # --- the target's side ------------------------------------------------------------------------
    def _target_decoded(self, base: int, count: int) -> None:
        """The target decoded `count` tokens from position `base`: keep their hidden states (every
        state from `base` on that an earlier decode left is stale now)."""
        for pos in [p for p in self._target_h if p >= base]:
            del self._target_h[pos]
        ptr = self._get_h(self.target.raw_context)
        if not ptr:
            return
        rows = np.ctypeslib.as_array(ptr, shape=(count, self._n_embd)).copy()
        for i in range(count):
            self._target_h[base + i] = rows[i]
        while len(self._target_h) > MAX_PENDING_STATES:
            del self._target_h[min(self._target_h)]

    def _target_state(self, pos: int, agree: int) -> np.ndarray | None:
        """The target's hidden state after position `pos`, where the target holds the same tokens
        as the head up to it (`agree`: how far they agree)."""
        if pos < agree:
            return self._target_h.get(pos)
        return None

    # --- Model protocol (the parts both drafters share) ------------------------------------------
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

    def _add(self, token: int, pos: int, h: np.ndarray, output: bool, keep: list[np.ndarray]) -> None:
        """One entry of the batch: the token at `pos` with the hidden-state row `h` (kept alive in
        `keep` until llama_process has read it)."""
        b = self._batch
        idx = llama_cpp.llama_batch_ext_add_token(b, 0, int(token))
        pos_buf = (llama_cpp.llama_pos * 4)(pos)
        llama_cpp.llama_batch_ext_set_pos(b, idx, pos_buf)
        row = np.ascontiguousarray(h, dtype=np.float32)
        keep.append(row)
        embd = llama_cpp.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self._n_embd)
        if not llama_cpp.llama_batch_ext_set_embd_token(b, idx, embd):
            raise EngineError("llama.cpp refused the MTP drafter's hidden-state input")
        if output:
            llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)

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
                "the MTP drafter was already closed", "this is a bug in specchat; please report it"
            )


class MtpHead(_Head):
    """The NextN head of `target` (loaded with `LoadOptions.load_mtp`), with its own K/V."""

    def __init__(self, target: LlamaModel, *, verbose: bool = False) -> None:
        if target.n_nextn <= 0:
            raise EngineError(f"{target.name} has no multi-token-prediction (NextN) layers")
        super().__init__(target, target.raw_model, shares_cache=False, verbose=verbose)
        self.name = "mtp"
        self.path: Path = target.path  # calibration keys its costs by the file, like a draft model's
        #: the head's K/V entries (one token per position), how many of them were made from the
        #: target's hidden states, and the head's own hidden state after each output row
        self._entries: list[int] = []
        self._confirmed = 0
        self._own_h: dict[int, np.ndarray] = {}

    @property
    def tokens(self) -> Sequence[int]:
        """The entries made from the target's hidden states: what later rounds can build on."""
        return self._entries[: self._confirmed]

    def decode(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        """Add entries for `tokens` at the next positions; each pairs its token with the target's
        hidden state at the position before where the target holds the same text, else with the
        head's own (a draft step), which makes it provisional."""
        self._check_open()
        start = len(self._entries)
        if start + len(tokens) > self.n_ctx:
            raise EngineError(
                f"{start + len(tokens)} tokens do not fit the MTP head's context of {self.n_ctx}"
            )
        agree = common_prefix_len(self.target.tokens, [*self._entries, *tokens])
        want = list(logits_rows)
        out = np.empty((len(want), self.n_vocab), dtype=np.float32)
        for lo in range(0, len(tokens), self._n_batch):
            hi = min(len(tokens), lo + self._n_batch)
            self._decode_chunk(tokens, lo, hi, start, agree, want, out)
        return out

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
        for i in range(lo, hi):
            pos = start + i
            h = self._zero if pos == 0 else self._target_state(pos - 1, agree)
            if h is not None and self._confirmed == pos:
                self._confirmed = pos + 1
            self._add(
                tokens[i],
                pos,
                h if h is not None else self._own_h.get(pos - 1, self._zero),
                i in outputs,
                keep,
            )
        rc = llama_cpp.llama_process(self._ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        if rc != 0:
            llama_cpp.llama_memory_seq_rm(self._mem, 0, start + lo, -1)
            self._confirmed = min(self._confirmed, start + lo)
            raise EngineError(f"llama.cpp's MTP decode failed with code {rc}")
        self._entries.extend(int(t) for t in tokens[lo:hi])
        rows = [(r - lo, j) for j, r in enumerate(want) if lo <= r < hi]
        for idx, h in self._outputs(rows, out).items():
            self._own_h[start + lo + idx] = h
        # what no later entry needs: the target's states before the last confirmed entry
        for pos in [p for p in self._target_h if p < self._confirmed - 1]:
            del self._target_h[pos]

    def truncate(self, n: int) -> None:
        if n >= len(self._entries) or self._ctx is None:
            return
        llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1)  # the head's K/V are attention: any cut
        del self._entries[n:]
        self._confirmed = min(self._confirmed, n)
        for pos in [p for p in self._own_h if p >= n]:
            del self._own_h[pos]


class AssistantHead(_Head):
    """Gemma 4's MTP assistant (`mtp-gemma-4-*.gguf`, architecture gemma4-assistant): a small model of
    its own file that reads the target's K/V (its layers have queries only) and embeds tokens with the
    target's table. It keeps no cache, so there is nothing to catch up on: every draft step runs at the
    position after the target's cache, from the target's last hidden state and then from its own
    (llama.cpp's draft-mtp does the same for shared-memory drafters)."""

    def __init__(self, target: LlamaModel, path: Path, *, verbose: bool = False) -> None:
        mparams = llama_cpp.llama_model_default_params()
        gpu = target.gpu_layers
        mparams.n_gpu_layers = 2**31 - 1 if gpu < 0 else gpu
        with quiet_stderr(not verbose):
            model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise EngineError(
                f"llama.cpp could not load the MTP assistant {path}",
                "check that it is the assistant GGUF of this model; --verbose shows why",
            )
        self._model = model
        arch = _meta(model, "general.architecture")
        target_arch = target.meta("general.architecture")
        widths = (llama_cpp.llama_model_n_embd_out(model), llama_cpp.llama_model_n_embd_out(target.raw_model))
        if arch != "gemma4-assistant" or target_arch != "gemma4" or widths[0] != widths[1]:
            llama_cpp.llama_model_free(model)
            self._model = None
            raise EngineError(
                f"{Path(path).name} ({arch}) is no MTP assistant for {target.name} ({target_arch})",
                "an assistant drafts only for its own model: Gemma 4's mtp-gemma-4-*.gguf for gemma-4-*",
            )
        try:
            super().__init__(target, model, shares_cache=True, verbose=verbose)
        except EngineError:
            llama_cpp.llama_model_free(model)
            self._model = None
            raise
        self.name = "mtp"
        self.path = Path(path)
        #: the assistant's own hidden state after its last draft step (None: start from the target's)
        self._step_h: np.ndarray | None = None

    @property
    def tokens(self) -> Sequence[int]:
        """Its cache is the target's: whatever the target holds, the assistant can draft after."""
        return self.target.tokens

    def decode(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        """Draft steps at the position after the target's cache: the first from the target's hidden
        state there, each next from the assistant's own."""
        self._check_open()
        pos = len(self.target.tokens)
        want = list(logits_rows)
        out = np.empty((len(want), self.n_vocab), dtype=np.float32)
        for i, token in enumerate(tokens):
            h = self._step_h
            if h is None:
                h = self._target_h.get(pos - 1, self._zero) if pos > 0 else self._zero
            llama_cpp.llama_batch_ext_clear(self._batch)
            keep: list[np.ndarray] = []
            self._add(token, pos, h, True, keep)
            rc = llama_cpp.llama_process(self._ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, self._batch)
            if rc != 0:
                raise EngineError(f"llama.cpp's MTP assistant decode failed with code {rc}")
            row = np.empty((1, self.n_vocab), dtype=np.float32)
            self._step_h = self._outputs([(0, 0)], row).get(0)
            if i in want:
                out[want.index(i)] = row[0]
        for p in [p for p in self._target_h if p < pos - 1]:  # only the latest state is ever read
            del self._target_h[p]
        return out

    def truncate(self, n: int) -> None:
        """A new draft starts from the target's state again."""
        self._step_h = None

    def close(self) -> None:
        super().close()
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None
