"""Loading and decoding models through llama-cpp-python's low-level ctypes API (the package's other
modules do the rest that talks to llama.cpp: `devices`, `vocab`, `grammar`, the heads, ...).

Why the low-level API and not `Llama.generate(draft_model=...)`: that hook takes no GGUF draft model,
reports no per-token provenance, and forces logits for every position. Here a decode asks for logits
only on the rows the loop needs, returns them as a zero-copy numpy view, and the cache is cut back with
`llama_memory_seq_rm`. One `llama_batch` is allocated per model and reused for every call.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..decoding.settings import CTX_SIZE
from ..errors import ContextFull, EngineError, ModelFileError
from .devices import ggml_lib, supports_gpu_offload
from .lib import llama_cpp
from .log import quiet_stderr, set_verbose
from .output_layer import local_output_overrides
from .rollback import STEP_SHARE, Checkpoint, Rollback, replay_chunks
from .rpc import failed_worker, worker_lost
from .rpc_wire import parse_endpoints, probe
from .tree_batch import TreeBatches
from .vocab import VocabQueries
from .window import AttentionWindow


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How to load one model. `gpu_layers=None` means all layers when the build can offload, else 0."""

    n_ctx: int = CTX_SIZE
    gpu_layers: int | None = None
    threads: int | None = None
    #: tokens per llama_decode call, and per compute pass (llama.cpp's n_batch and n_ubatch: its
    #: defaults, as llama-bench and llama-server use them). A long prompt in one call of 2048 runs
    #: its 512-token passes back to back, which prefills faster than one call per 512 tokens
    n_batch: int = 2048
    n_ubatch: int = 512
    verbose: bool = False
    #: llama.cpp's CPU "extra buffers" repack quantised weights for faster batched matmuls. On a
    #: stock build their GEMM (from 4 rows on x86) rounds differently from the one-token path; the
    #: patched build (patches/llama.cpp 0001, 0002) makes every verify width round alike, as its
    #: invariance probe shows. Every target loads with it on (loader.load: one target, one output);
    #: off only for the build self-check's reference evaluation (buildcheck).
    repack: bool = True
    #: ggml type of the V cache (None: llama.cpp's default, f16, and its fastest prompt processing).
    #: A CPU target on a build whose probe did not show f16 attention bit-exact gets bf16: stock
    #: llama.cpp splits the KV across threads for a single f16 row once the cache reaches 512 cells,
    #: so one-token decoding and batched verification part in the last bits (patch 0003 removes
    #: that split); with K and V of different types it runs one row exactly as it runs several.
    type_v: int | None = None
    #: on a recurrent or hybrid model, the states llama.cpp keeps after each of a decode's last tokens
    #: (its n_rs_seq), so a rejected draft of up to this many tokens is taken back for free
    #: (rollback.py); longer ones go back through a checkpoint. 0: checkpoints only (a draft model,
    #: which decodes one token at a time and checkpoints before its drafts). Ignored elsewhere
    snapshots: int = 0
    #: a draft model's attention window (window.py): the first tokens and this many recent ones stay
    #: in its cache, the rest is dropped as the context grows. 0: the whole context (every target)
    window: int = 0
    #: load the GGUF's multi-token-prediction (NextN) layers too, for an MTP drafter (llama/mtp.py);
    #: they are not part of the target's own forward pass, so its output is the same either way
    load_mtp: bool = False
    #: the ggml devices (handles) `gpu_layers` are offloaded to, llama.cpp's model param `devices`: a
    #: target split over RPC workers names theirs here (llama/rpc.py). None: llama.cpp's default
    #: list, this machine's own GPUs (workers are never in it, so drafts and heads stay local)
    devices: tuple[int, ...] | None = None
    #: the RPC workers (`HOST:PORT`) among `devices`: after every decode the model asks whether one
    #: stopped answering, and raises WorkerError naming it (its outputs are not the model's)
    workers: tuple[str, ...] = ()
    #: keep the output layer on this machine's CPU, in the buffer an unsplit load gives it, though
    #: `devices` take the layers before it (llama/output_layer.py): a target split over RPC workers
    #: then gets its logits here and only hidden states cross the network
    local_output: bool = False
    #: side branches a token-tree verify batch may have (decoding/tree.py): the context then holds
    #: that many more llama.cpp sequences in one unified KV cache (the branches share the committed
    #: cells, so the cache is no bigger). 0, and always on a recurrent or hybrid model: chains only
    tree_branches: int = 0


#: ggml_type value (ggml.h) for LoadOptions.type_v
GGML_TYPE_BF16 = 30


@dataclass(frozen=True, slots=True)
class SavedState:
    """A copy of one model's K/V cache (sequence 0) in host memory, and the tokens it holds.

    Why a copy of llama.cpp's own sequence state rather than the tokens to re-decode: restoring is a
    memory copy (~30 MB and a few milliseconds for a 1,000-token conversation on a 1.5B target) where
    re-decoding costs a prefill (seconds on a CPU); and the K/V come back bit for bit as they were
    computed, so a restored conversation continues exactly as if it had never been put aside.
    """

    tokens: tuple[int, ...]
    data: np.ndarray  # uint8, uninitialised before llama.cpp fills it (a zeroed buffer cost 2/3 of a save)
    #: a recurrent model's checkpoints within `tokens` (rollback.py): where a later turn can go back to
    anchors: tuple[Checkpoint, ...] = ()
    #: a draft model's window had dropped the positions from its sinks to this one (window.py; 0: none)
    dropped: int = 0

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes) + sum(a.nbytes for a in self.anchors)

    def pointer(self) -> ctypes._Pointer[ctypes.c_uint8]:
        return self.data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


def load_model_file(
    path: Path,
    gpu_layers: int,
    *,
    verbose: bool,
    repack: bool = True,
    load_mtp: bool = False,
    devices: tuple[int, ...] | None = None,
    local_output: bool = False,
) -> object | None:
    """A GGUF loaded by llama.cpp with `gpu_layers` offloaded (negative: all) to `devices` (None:
    llama.cpp's default list), repacked weights (`repack`, where the build has them) and its NextN
    layers (`load_mtp`), its output layer kept on this machine's CPU (`local_output`): a target, or a
    drafter's own file loaded with its target's offload so both sit on the same device. None where
    llama.cpp cannot load it; the caller says what the file was meant to be."""
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 2**31 - 1 if gpu_layers < 0 else gpu_layers
    if hasattr(mparams, "use_extra_bufts"):
        mparams.use_extra_bufts = repack
    mparams.load_mtp = load_mtp
    # a NULL-terminated array of device handles; llama.cpp copies the list while it loads
    listed = (ctypes.c_void_p * (len(devices) + 1))(*devices, None) if devices is not None else None
    if listed is not None:
        mparams.devices = ctypes.cast(listed, ctypes.c_void_p).value
    # read by llama.cpp only while it loads: `overrides` holds the array until the call returns
    overrides = local_output_overrides() if local_output else None
    if overrides is not None:
        mparams.tensor_buft_overrides = overrides.address
    with quiet_stderr(not verbose):
        return llama_cpp.llama_model_load_from_file(str(path).encode(), mparams) or None


class LlamaModel(TreeBatches, VocabQueries):
    """A loaded GGUF model with its own context (KV cache) and a reusable batch.

    Implements `specchat.decoding.model.Model`. `tokens` mirrors what the KV cache holds, so prefix reuse and
    truncation are simple list arithmetic in the callers.
    """

    def __init__(self, path: Path, opts: LoadOptions, name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        set_verbose(opts.verbose)
        llama_cpp.llama_backend_init()
        gpu_layers = opts.gpu_layers
        if gpu_layers is None:
            gpu_layers = -1 if supports_gpu_offload() else 0
        self.gpu_layers = gpu_layers
        self.repack = opts.repack
        self.type_v = opts.type_v
        model = load_model_file(
            self.path,
            gpu_layers,
            verbose=opts.verbose,
            repack=opts.repack,
            load_mtp=opts.load_mtp,
            devices=opts.devices,
            local_output=opts.local_output,
        )
        if model is None:
            if opts.workers:  # a worker that died while the weights were sent: name it
                for worker in parse_endpoints(",".join(opts.workers)):
                    probe(worker)
            raise ModelFileError(
                f"llama.cpp could not load {self.path}",
                "check that it is a complete GGUF file of a supported architecture; --verbose shows why",
            )
        self._model = model
        self._workers = opts.workers
        self._check_workers()  # one that died while the weights were sent
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = opts.n_ctx
        cparams.n_batch = min(opts.n_batch, opts.n_ctx)
        cparams.n_ubatch = min(opts.n_ubatch, opts.n_batch, opts.n_ctx)
        recurrent = bool(llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model))
        #: side branches a tree batch may have: a recurrent state cannot be forked per branch here
        self.tree_branches = 0 if recurrent else max(0, opts.tree_branches)
        cparams.n_seq_max = 1 + self.tree_branches
        if self.tree_branches:
            # one cache for all sequences: a branch's cells are the committed context's plus its own
            cparams.kv_unified = True
        threads = opts.threads or _physical_cores()
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        if opts.type_v is not None:
            cparams.type_v = opts.type_v
        self.recurrent = recurrent
        if self.recurrent:
            cparams.n_rs_seq = max(0, opts.snapshots)
        with quiet_stderr(not opts.verbose):
            ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            llama_cpp.llama_model_free(model)
            self._model = None
            raise EngineError(
                f"llama.cpp could not create a context of {opts.n_ctx} tokens for {self.path.name}",
                "try a smaller --ctx-size or fewer --gpu-layers",
            )
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        # llama.cpp may round the context up (to a multiple of 256); honour what the user asked for
        self._n_ctx = min(opts.n_ctx, int(llama_cpp.llama_n_ctx(ctx)))
        self._n_batch = int(llama_cpp.llama_n_batch(ctx))
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1 + self.tree_branches)
        #: what the cache holds, logically; llama.cpp holds the first `_held` of them, and the rest
        #: (after a recurrent model went back through a checkpoint) are replayed with the next decode
        self._tokens: list[int] = []
        self._held = 0
        #: the last tree batch's side sequences and tokens, until keep_path
        self._tree: tuple[int, tuple[int, ...]] = (0, ())
        self._rollback: Rollback | None = None
        #: pending tokens (left by a rollback) the last decode call decoded before the batch it was
        #: given: rows its time paid for beyond that batch, which the loop reports so the planner
        #: books them to the rollback, not to the batch size it asked for
        self.replayed = 0
        #: whether a rejected draft can be taken back without re-decoding the context: always on an
        #: attention cache; on a recurrent one where llama.cpp can copy its state out (rollback.py)
        self.can_roll_back = True
        if self.recurrent:
            snapshots = int(llama_cpp.llama_n_rs_seq(ctx))  # 0 where the architecture has none
            flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
            state = int(llama_cpp.llama_state_seq_get_size_ext(ctx, 0, flags))
            weights = int(llama_cpp.llama_model_size(model))
            self._rollback = Rollback(
                snapshots,
                self._save_recurrent,
                self._restore_recurrent,
                cheap_steps=0 < state <= STEP_SHARE * weights,
            )
            self.can_roll_back = state > 0
        #: called after every llama_decode with (first position, token count): an MTP head reads the
        #: target's hidden rows there, before the next decode overwrites them (llama/mtp.py)
        self.on_decoded: Callable[[int, int], None] | None = None
        self._window = AttentionWindow(opts.window) if opts.window > 0 else None
        self._piece_cache = {}
        self.threads = threads

    # --- Model protocol ---------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def tokens(self) -> Sequence[int]:
        return self._tokens

    def decode(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        """Append tokens at the next positions; one llama_decode per n_batch chunk (one in the loop).

        On a recurrent model, tokens a rollback left to replay go first: in front of this batch when
        both fit in a bit-exact batch (rollback.replay_chunks), else decoded before it; and where
        the snapshots could not undo this batch, the state before it is kept first."""
        n = len(tokens)
        if self._ctx is None:
            raise EngineError(
                f"{self.name} was already closed", "this is a bug in specchat; please report it"
            )
        if len(self._tokens) + n > self._n_ctx:
            raise ContextFull(
                f"{len(self._tokens) + n} tokens do not fit in the context window of {self._n_ctx}",
                "raise --ctx-size or shorten the prompt",
            )
        batch, front = list(tokens), 0
        rb = self._rollback
        self.replayed = 0
        if rb is not None and n > 0:
            wants = rb.wants_checkpoint(n)
            pending = self._tokens[self._held :]
            if pending:
                # the checkpoint must be where this batch starts: then everything pending goes first
                chunks, front = replay_chunks(pending, n, alone=wants)
                for chunk in chunks:
                    self._run(chunk, [])
                batch = pending[len(pending) - front :] + batch
                self.replayed = len(pending)
            if wants:
                rb.checkpoint(self._held)
        elif rb is None and self._held < len(self._tokens):
            # a tree's accepted side branch, left to decode here in position order (keep_path)
            pending = self._tokens[self._held :]
            batch, front = pending + batch, len(pending)
        out = self._run(batch, [r + front for r in logits_rows])
        w = self._window
        cut = w.slide(self._held) if w is not None else None
        if (
            w is not None
            and cut is not None
            and not llama_cpp.llama_memory_seq_rm(self._mem, 0, w.sinks, cut)
        ):
            self._window = None  # a cache that cannot drop a middle range keeps everything
        return out

    def _run(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        """Decode `tokens` from where llama.cpp's cache ends, in n_batch chunks."""
        n = len(tokens)
        want = sorted(set(logits_rows))
        out: np.ndarray | None = None
        start = 0
        while start < n:
            end = min(n, start + self._n_batch)
            rows = [r - start for r in want if start <= r < end]
            self._decode_chunk(tokens, start, end, rows)
            if rows:
                view = self._logits_view(len(rows))
                if end == n and len(want) == len(rows):
                    out = view
                else:  # rows spread over several chunks (long prompts only): copy them out
                    part = view.copy()
                    out = part if out is None else np.concatenate([out, part])
            start = end
        if out is None:
            return np.empty((0, self._n_vocab), dtype=np.float32)
        if list(want) != list(logits_rows):
            order = [want.index(r) for r in logits_rows]
            out = out[order]
        return out

    def _decode_chunk(self, tokens: Sequence[int], start: int, end: int, rows: Sequence[int]) -> None:
        b = self._batch
        base = self._held
        count = end - start
        outputs = set(rows)
        for i in range(count):
            b.token[i] = tokens[start + i]
            b.pos[i] = base + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i in outputs
        b.n_tokens = count
        rc = llama_cpp.llama_decode(self._ctx, b)
        if self._workers and failed_worker(ggml_lib(), self._workers) is not None:
            self._decode_failed(base)  # this pass's outputs came from a worker that was gone
            self._check_workers()
        if rc != 0:
            self._decode_failed(base)
            if rc == 1:
                raise ContextFull(
                    f"no KV cache slot for {count} tokens (context {self._n_ctx})",
                    "raise --ctx-size or shorten the prompt",
                )
            raise EngineError(
                f"llama.cpp decode failed with code {rc}",
                "try a smaller --ctx-size or fewer --gpu-layers; --verbose shows llama.cpp's log",
            )
        known = len(self._tokens) - base  # replayed tokens are in the list already
        self._tokens.extend(int(t) for t in tokens[start + known : end])
        self._held = base + count
        if self._rollback is not None:
            self._rollback.decoded(count, self._held)
        if self.on_decoded is not None:
            self.on_decoded(base, count)

    def _check_workers(self) -> None:
        """WorkerError naming the first RPC worker of this model that stopped answering."""
        lost = failed_worker(ggml_lib(), self._workers) if self._workers else None
        if lost is not None:
            raise worker_lost(lost)

    def _decode_failed(self, base: int) -> None:
        """The failed batch may have been partly stored: drop anything past what was held before it
        (a recurrent state that cannot drop it is cleared: consistent, and rebuilt on demand)."""
        if not llama_cpp.llama_memory_seq_rm(self._mem, 0, base, -1):
            self._clear()
            return
        del self._tokens[base:]
        self._held = base

    def _clear(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)
        self._tokens, self._held = [], 0
        if self._rollback is not None:
            self._rollback.forget()
        if self._window is not None:
            self._window.forget()

    def _logits_view(self, n_rows: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self._n_vocab))

    def truncate(self, n: int) -> None:
        """Drop cached positions >= n. An attention cache drops them; a recurrent state steps back
        through llama.cpp's snapshots where they reach, else goes back to a checkpoint and replays the
        rest with the next decode (rollback.py)."""
        if self._tree[0] and self._ctx is not None:  # a tree batch never settled: its branches go
            self._drop_side(self._tree[0])
            self._tree = (0, ())
        if n >= len(self._tokens) or self._ctx is None:  # closed: nothing left to cut (and no UAF)
            return
        if self._window is not None:
            n = self._window.reach(n)
            self._window.truncated(n)
        rb = self._rollback
        if rb is None and n >= self._held:  # only tokens still waiting to be decoded go
            del self._tokens[n:]
            return
        if rb is None:
            if not llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1):
                raise EngineError(f"llama.cpp could not cut {self.name}'s cache back to {n} tokens")
            del self._tokens[n:]
            self._held = len(self._tokens)
            return
        if n >= self._held:  # only tokens still waiting to be replayed go
            del self._tokens[n:]
            return
        if rb.can_step_back(self._held, n) and llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1):
            rb.stepped_back(self._held - n, n)
            self._held = n
        else:
            held = rb.go_back(n)
            if self._window is not None and self._window.reach(held) != held:
                held = 0  # a checkpoint older than the window's cut: the attention cache lacks its past
            # the attention part of a hybrid cache drops what lies past the checkpoint by itself
            if held == 0 or not llama_cpp.llama_memory_seq_rm(self._mem, 0, held, -1):
                llama_cpp.llama_memory_clear(self._mem, True)
                held = 0
            self._held = held
        del self._tokens[n:]

    def checkpoint(self) -> None:
        """The caller may take the cache back to its current length after several decodes (a draft
        model drafting token by token): on a recurrent model keep the state here, and where a copy
        of it is cheap (rollback.STEP_SHARE) the state after each one-token decode that follows as
        well, so a cut to any of them replays nothing; a no-op on an attention cache, which can drop
        any suffix."""
        rb = self._rollback
        if rb is None or self._ctx is None:
            return
        self._flush()
        rb.checkpoint(self._held, steps=True)

    def _flush(self) -> None:
        """Decode what a rollback (or a tree's side branch) left pending, in bit-exact chunks."""
        if self._rollback is None:
            if self._held < len(self._tokens):
                self._run(self._tokens[self._held :], [])
            return
        for chunk in replay_chunks(self._tokens[self._held :], 0, alone=True)[0]:
            self._run(chunk, [])

    @property
    def rollback_reach(self) -> int | None:
        """How many of a verify batch's tokens can be taken back for free: None on an attention cache
        (any suffix); on a recurrent one llama.cpp's snapshots (rollback.py). A batch cut back
        further goes back through its checkpoint, and the tokens kept replay with the next decode."""
        return self._rollback.snapshots if self._rollback is not None else None

    @property
    def rollback_bytes(self) -> int:
        """Host memory the recurrent checkpoints take (0 on an attention-only model)."""
        return self._rollback.nbytes if self._rollback is not None else 0

    def _save_recurrent(self, pos: int) -> Checkpoint:
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = int(llama_cpp.llama_state_seq_get_size_ext(self._ctx, 0, flags))
        data = np.empty(size, dtype=np.uint8)
        ptr = data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        written = int(llama_cpp.llama_state_seq_get_data_ext(self._ctx, ptr, size, 0, flags))  # type: ignore[arg-type]
        if written != size:
            raise EngineError(f"llama.cpp saved {written} of {size} bytes of {self.name}'s recurrent state")
        return Checkpoint(pos, data)

    def _restore_recurrent(self, ckpt: Checkpoint) -> bool:
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        ptr = ckpt.data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        return int(llama_cpp.llama_state_seq_set_data_ext(self._ctx, ptr, ckpt.nbytes, 0, flags)) > 0  # type: ignore[arg-type]

    # --- saving and restoring the cache (the server's prompt cache) ------------------------------
    def save_state(self) -> SavedState:
        """A host-memory copy of what the cache holds (PromptCache keeps these per conversation); a
        recurrent model's checkpoints come with it, so a restored conversation can go back as far."""
        if self._ctx is None:
            raise EngineError(
                f"{self.name} was already closed", "this is a bug in specchat; please report it"
            )
        self._flush()
        size = int(llama_cpp.llama_state_seq_get_size(self._ctx, 0))
        anchors = tuple(self._rollback.anchors) if self._rollback is not None else ()
        dropped = self._window.cut if self._window is not None else 0
        state = SavedState(tuple(self._tokens), np.empty(size, dtype=np.uint8), anchors, dropped)
        written = int(llama_cpp.llama_state_seq_get_data(self._ctx, state.pointer(), size, 0))  # type: ignore[arg-type]
        if written != size:
            raise EngineError(f"llama.cpp saved {written} of {size} bytes of {self.name}'s cache")
        return state

    def restore_state(self, state: SavedState) -> bool:
        """Make the cache hold `state` again. False when llama.cpp refuses it (then the cache is
        left empty, which is always consistent: the next decode starts from the beginning)."""
        if self._ctx is None:
            return False
        size = int(state.data.nbytes)
        done = int(llama_cpp.llama_state_seq_set_data(self._ctx, state.pointer(), size, 0))  # type: ignore[arg-type]
        if done == 0:
            self._clear()
            return False
        self._tokens = list(state.tokens)
        self._held = len(self._tokens)
        if self._window is not None:
            self._window.forget(state.dropped)
        if self._rollback is not None:
            self._rollback.forget()
            self._rollback.anchors = list(state.anchors)
        return True

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    @property
    def n_layer(self) -> int:
        return int(llama_cpp.llama_model_n_layer(self._model))

    @property
    def n_batch(self) -> int:
        return self._n_batch

    @property
    def raw_model(self) -> object:
        """llama.cpp's model handle, for another context on the same weights (llama/mtp.py)."""
        return self._model

    @property
    def raw_context(self) -> object:
        """llama.cpp's context handle, for a head that reads this model's outputs (llama/mtp.py)."""
        return self._ctx

    @property
    def n_nextn(self) -> int:
        """Multi-token-prediction (NextN) layers the GGUF carries (loaded only with load_mtp)."""
        return int(llama_cpp.llama_model_n_layer_nextn(self._model))

    def close(self) -> None:
        """Free native memory now rather than at garbage collection (models can be gigabytes)."""
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> LlamaModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1
