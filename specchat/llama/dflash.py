"""A DFlash block drafter (llama.cpp arch `dflash`, converted with `convert_hf_to_gguf.py
--target-model-dir`): a small stack of layers that proposes a whole block of tokens in one pass.

Why a block drafter: a draft model or a head pays one pass per drafted token; a DFlash drafter pays
one for up to block_size - 1 of them, because it denoises a block at once (its input is the last
committed token, the anchor, followed by mask tokens, with attention that is not causal). It still
reads the target: its K/V cache holds, for every committed position, the target's inputs of the
layers the file names (`target_layers`), fused by the drafter's `fc` and injected as K/V rows.

How it runs (llama.cpp's `draft-dflash`, common/speculative.cpp, driven from Python): the target's
context also returns those layers' inputs for every token it decodes (`llama_set/get_embeddings_
layer_inp`, bound in llama/eagle3.py), kept by position until the drafter injects them (an embedding
batch through `llama_process`: the drafter's graph projects them into its cache). To draft after the
committed context c_0..c_{n-1}, the cache holds rows for positions 0..n-2 (what the target has
decoded), the block [c_{n-1}, mask, ..., mask] is decoded at positions n-1.. with every row as an
output, row i's logits are the guess for the token at n-1+i, and the block's own K/V are removed
again. Rows injected for text the target has since taken back are removed before the next block;
rollback is attention only.

DSpark (llama.cpp's `draft-dspark`) is the same architecture with a Markov head (`markov_w1`,
`markov_w2`): inside the graph each position's logits are biased by the token argmax chose at the
position before, so later positions decay less. Its files say where the block starts
(`dflash.sample_from_anchor`, true where absent): anchor-first, the block is [last token, mask x
(n - 1)] and row i guesses the token at n + i (up to block_size tokens a pass); with a bonus anchor
it is read as DFlash's. A DSpark file with a confidence head (`dflash.has_confidence_head`,
`conf_proj`) also estimates, per position, the chance its token is accepted (llama.cpp hands it out
as the first value of each row of the NextN embeddings, as `draft-dspark` reads it): `confidence`
holds the last block's, and the drafter stops a block on it.

DFlash2 (`dflash.selector_top_k`, `selector_*` tensors, run by `--draft dflash` as llama.cpp's
`draft-dflash` runs it) adds dynamic convolutions inside the drafter and a path selector: the block's
pass also writes a lattice (each position's top-k candidates and the scores of every transition from
the candidates before), handed out as the rows' NextN embeddings; `lattice` holds the last block's,
and decoding/block.py walks it. Its drafts are tokens without a distribution of their own.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..decoding.model import common_prefix_len
from ..errors import EngineError, IncompatiblePair, ModelFileError
from .eagle3 import layer_input_calls, tapped_layers
from .engine import LlamaModel, load_model_file
from .head import PendingRows, model_meta, nextn_calls
from .lib import llama_cpp
from .log import quiet_stderr

#: the architecture llama.cpp gives DFlash (and DSpark) drafter files
DFLASH_ARCH = "dflash"
#: the block size llama.cpp assumes where a file names none (common/speculative.cpp)
DEFAULT_BLOCK_SIZE = 16
#: the tensor of DFlash2's path selector
SELECTOR_TENSOR = "selector_hidden.weight"
#: the tensor of DSpark's Markov head (`--draft dspark`)
MARKOV_TENSOR = "markov_w1.weight"


class DFlashBlock:
    """The DFlash drafter in `path`, drafting for `target`: `block(context, n)` gives the logits of
    the n tokens after `context`. Everything llama.cpp would assert on is checked first. `dspark`:
    the file is a DSpark drafter (a Markov head), read with its block layout."""

    def __init__(
        self, target: LlamaModel, path: Path, *, dspark: bool = False, verbose: bool = False
    ) -> None:
        self.target = target
        self.path = Path(path)
        self.name = "dspark" if dspark else "dflash"
        calls = layer_input_calls("a DFlash drafter")
        model = load_model_file(self.path, target.gpu_layers, verbose=verbose)
        if model is None:
            raise ModelFileError(
                f"llama.cpp could not load the DFlash drafter {self.path}",
                "check that it is a DFlash GGUF (convert_hf_to_gguf.py --target-model-dir); "
                "--verbose shows why",
            )
        self._model = model
        self._calls = calls
        self._ctx: object | None = None
        self._batch: object | None = None
        #: the confidence head's estimates for the last block's positions (None: no head)
        self.confidence: np.ndarray | None = None
        #: DFlash2: the selector's lattice rows of the last block's positions (None: no selector)
        self.lattice: np.ndarray | None = None
        try:
            self._layers = _checked_layers(calls, model, target, self.path)
            self.block_size = _block_size(model)
            #: anchor-first (DSpark's default): row 0 of a block is already a guess
            self.anchor_first = dspark and model_meta(model, f"{DFLASH_ARCH}.sample_from_anchor") != "false"
            #: the most tokens one block proposes
            self.max_drafts = self.block_size if self.anchor_first else self.block_size - 1
            #: a DSpark confidence head: each position's estimated chance of acceptance comes with it
            self.has_confidence = dspark and model_meta(model, f"{DFLASH_ARCH}.has_confidence_head") == "true"
            #: DFlash2's path selector: candidates per position (0: no selector)
            self.selector_top_k = int(model_meta(model, f"{DFLASH_ARCH}.selector_top_k") or 0)
            self.mask = int(llama_cpp.llama_vocab_mask(llama_cpp.llama_model_get_vocab(model)))
            if not 0 <= self.mask < target.n_vocab:
                raise ModelFileError(
                    f"the DFlash drafter {self.path.name} has no mask token (tokenizer.ggml.mask_token_id)",
                    "convert the drafter again with a current convert_hf_to_gguf.py",
                )
            self._open(verbose)
        except BaseException:
            self.close()
            raise
        self._width = int(llama_cpp.llama_model_n_embd(target.raw_model))
        #: the drafter's own width: the length of each NextN row it hands out
        self._n_embd_dec = int(llama_cpp.llama_model_n_embd(self._model))
        for layer in self._layers:
            calls.set_layer_inp(target.raw_context, layer, True)
        #: the tokens whose target features are in the drafter's cache, at positions 0.. in order
        self._injected: list[int] = []
        #: the target's features (its inputs of the drafter's layers, side by side) by position, kept
        #: until injected
        self._features = PendingRows()
        target.on_decoded = self._target_decoded

    def _open(self, verbose: bool) -> None:
        target = self.target
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = target.n_ctx + self.block_size  # the block goes past the committed text
        cparams.n_batch = max(target.n_batch, self.block_size)
        cparams.n_ubatch = max(min(512, target.n_batch), self.block_size)  # a block is one pass
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = target.threads
        cparams.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_DEFAULT
        cparams.n_rs_seq = 0
        cparams.ctx_other = target.raw_context  # the drafter may borrow the target's embedding and head
        with quiet_stderr(not verbose):
            ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not ctx:
            raise EngineError(
                f"llama.cpp could not create the DFlash drafter's context for {target.name}",
                "--verbose shows llama.cpp's log; --no-draft decodes without it",
            )
        self._ctx = ctx
        llama_cpp.llama_set_causal_attn(ctx, False)  # a block attends both ways
        if self.has_confidence:  # the head's estimates come out as the NextN embeddings of the rows
            nextn_calls().llama_set_embeddings_nextn(ctx, True, True)
        elif self.selector_top_k:  # the lattice, one row per token of the block (not per output)
            nextn_calls().llama_set_embeddings_nextn(ctx, True, False)
        self._mem = llama_cpp.llama_get_memory(ctx)
        self._n_ubatch = int(llama_cpp.llama_n_ubatch(ctx))
        self._batch = llama_cpp.llama_batch_ext_init(ctx)

    # --- the target's side ------------------------------------------------------------------------
    def _target_decoded(self, base: int, count: int) -> None:
        """The target decoded `count` tokens from position `base`: keep their features (any from
        `base` on that an earlier decode left are stale now)."""
        self._features.drop_from(base)
        ctx, width = self.target.raw_context, self._width
        rows = np.empty((count, len(self._layers) * width), dtype=np.float32)
        for k, layer in enumerate(self._layers):
            ptr = self._calls.get_layer_inp(ctx, layer)
            if not ptr:
                return
            rows[:, k * width : (k + 1) * width] = np.ctypeslib.as_array(ptr, shape=(count, width))
        self._features.put(base, rows)

    # --- drafting ---------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.target.n_vocab

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx

    def is_eog(self, token: int) -> bool:
        return self.target.is_eog(token)

    @property
    def injected(self) -> Sequence[int]:
        """The text whose target features the drafter's cache holds."""
        return self._injected

    def sync(self, context: Sequence[int]) -> None:
        """Bring the cache to `context[:-1]`: drop rows of text taken back, inject the target's
        features for what it has decoded since. A position whose features are gone (a restored
        cache, more than MAX_PENDING_STATES unread) gets a row of zeros: its drafts are the poorer
        for it, never wrong, and re-reading would not bring the features back."""
        self._check_open()
        want = context[:-1]
        keep = common_prefix_len(self._injected, want)
        self.truncate(keep)
        end = min(len(want), common_prefix_len(self.target.tokens, want))
        for lo in range(keep, end, self._n_ubatch):
            self._inject(want, lo, min(end, lo + self._n_ubatch))
        self._features.drop_before(len(self._injected))

    def _inject(self, text: Sequence[int], lo: int, hi: int) -> None:
        b = self._batch
        llama_cpp.llama_batch_ext_clear(b)
        zero = np.zeros(len(self._layers) * self._width, dtype=np.float32)
        keep = []
        for pos in range(lo, hi):
            row = np.ascontiguousarray(self._features.get(pos, zero), dtype=np.float32)
            keep.append(row)
            embd = llama_cpp.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, row.size)
            idx = llama_cpp.llama_batch_ext_add_embd(b, 0, embd)
            if idx < 0:
                raise EngineError(f"llama.cpp refused the DFlash drafter's feature row ({idx})")
            llama_cpp.llama_batch_ext_set_pos(b, idx, (llama_cpp.llama_pos * 4)(pos, pos, pos, 0))
        rc = llama_cpp.llama_process(self._ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b)
        if rc != 0:
            llama_cpp.llama_memory_seq_rm(self._mem, 0, lo, -1)
            raise EngineError(f"llama.cpp's DFlash feature injection failed with code {rc}")
        self._injected.extend(int(t) for t in text[lo:hi])

    def block(self, context: Sequence[int], n: int) -> np.ndarray:
        """The drafter's logits for the `n` tokens after `context` (n <= max_drafts), one pass: the
        block [last token, mask x n] (anchor-first: mask x (n - 1)) after the cache is synced; the
        block leaves nothing behind. DFlash2 returns no logits (zeros): its drafts are `lattice`'s."""
        n = max(0, min(n, self.max_drafts))
        out = np.zeros((n, self.n_vocab), dtype=np.float32)
        if n == 0 or not context:
            return out
        self.sync(context)
        first = len(context) - 1
        b = self._batch
        llama_cpp.llama_batch_ext_clear(b)
        skip = 0 if self.anchor_first else 1  # the rows before the first guess
        for i in range(n + skip):
            token = int(context[-1]) if i == 0 else self.mask
            idx = int(llama_cpp.llama_batch_ext_add_token(b, 0, token))
            if idx < 0:
                raise EngineError(f"llama.cpp refused token {token} in the DFlash drafter's block ({idx})")
            llama_cpp.llama_batch_ext_set_pos(b, idx, (llama_cpp.llama_pos * 4)(first + i))
            # the graph selects no output rows: every row is one, so row i is the i-th output
            # (DFlash2's drafts come from its lattice: no logits wanted)
            llama_cpp.llama_batch_ext_set_output_logits(b, idx, not self.selector_top_k)
        rc = llama_cpp.llama_process(self._ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b)
        try:
            if rc != 0:
                raise EngineError(f"llama.cpp's DFlash block decode failed with code {rc}")
            if self.selector_top_k:
                used = self.selector_top_k * (self.selector_top_k + 1)
                self.lattice = self._nextn_rows(n + 1)[1:, :used].copy()  # row 0: the anchor's, empty
                return out
            for i in range(n):
                logits = llama_cpp.llama_get_logits_ith(self._ctx, i + skip)
                out[i] = np.ctypeslib.as_array(logits, shape=(self.n_vocab,))
            if self.has_confidence:
                self.confidence = self._nextn_rows(n + skip)[skip:, 0].copy()  # each row's first value
        finally:
            llama_cpp.llama_memory_seq_rm(self._mem, 0, first, -1)
        return out

    def _nextn_rows(self, count: int) -> np.ndarray:
        """The last block's NextN embedding rows (count, drafter width), where llama.cpp hands out a
        DSpark head's confidences and a DFlash2 selector's lattice: a view, valid until the next pass."""
        ptr = nextn_calls().llama_get_embeddings_nextn(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(count, self._n_embd_dec))

    def truncate(self, n: int) -> None:
        """Keep the rows of the first `n` injected tokens."""
        if n >= len(self._injected) or self._ctx is None:
            return
        llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1)
        del self._injected[n:]

    def _check_open(self) -> None:
        if self._ctx is None:
            raise EngineError(
                "the DFlash drafter was already closed", "this is a bug in specchat; please report it"
            )

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_ext_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            if self.target.raw_context:
                for layer in getattr(self, "_layers", ()):  # the target stops copying them out
                    self._calls.set_layer_inp(self.target.raw_context, layer, False)
            if self.target.on_decoded == self._target_decoded:
                self.target.on_decoded = None
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to free into
            self.close()


def _block_size(model: object) -> int:
    text = model_meta(model, f"{DFLASH_ARCH}.block_size")
    size = int(text) if text is not None and text.isdigit() else DEFAULT_BLOCK_SIZE
    return max(2, size)


def _checked_layers(calls: Any, model: object, target: LlamaModel, path: Path) -> tuple[int, ...]:
    """The target layers the drafter reads, once everything llama.cpp would assert on is checked:
    that it is a DFlash drafter, that the target's graph hands out layer inputs, and that the drafter
    was made for a target of this depth, width and vocabulary."""
    name = path.name
    arch = model_meta(model, "general.architecture")
    if arch != DFLASH_ARCH:
        raise ModelFileError(
            f"{name} is no DFlash drafter (architecture {arch})",
            "give the drafter's GGUF, converted with convert_hf_to_gguf.py --target-model-dir",
        )
    layers = tapped_layers(calls, model, target, name, "DFlash", "drafter")
    width = int(llama_cpp.llama_model_n_embd(target.raw_model))
    own = int(llama_cpp.llama_model_n_embd(model))
    n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
    if own != width or n_vocab != target.n_vocab:
        raise IncompatiblePair(
            f"the DFlash drafter {name} ({n_vocab} tokens, width {own}) does not fit {target.name} "
            f"({target.n_vocab} tokens, width {width})",
            "use the drafter converted for this model (--target-model-dir)",
        )
    return layers
