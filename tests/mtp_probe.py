"""Run an MTP drafter beside its target the way llama.cpp's draft-mtp does (common/speculative.cpp),
one step at a time, to measure how often its first proposal is the target's next greedy token.

Two kinds of drafter: a Qwen3.5 NextN block (the target's own file loaded with `load_mtp`, run in a
second context of type MTP that keeps its own K/V for the block and is fed every accepted token with
the target's hidden state before it), and a Gemma 4 assistant (its own file, its context created with
the target's as `ctx_other`: it reads the target's K/V and keeps none). Both get, at position k, the
token x_k and the target's final hidden state h_{k-1} (the one that predicted x_k), and propose x_{k+1}.

specchat's engine does not drive MTP contexts, so this uses llama-cpp-python's low-level API directly
(the extended batch carries a token and an embedding row per entry), plus the two llama-ext.h
functions it does not bind, looked up in the loaded library.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

LLAMA_CONTEXT_TYPE_MTP = 1
LLAMA_PROCESS_TYPE_DECODE = 1


def _symbol(name: str, mangled: str) -> ctypes._CFuncPtr:
    """A libllama function by its C name, or by its C++ one: llama-ext.h declares them without
    extern "C", so this build exports them mangled."""
    lib = llama_cpp.llama_cpp._lib
    for candidate in (name, mangled):
        if hasattr(lib, candidate):
            return getattr(lib, candidate)
    raise RuntimeError(f"this llama.cpp build does not export {name}")


def _ext() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]:
    """llama_set_embeddings_nextn and llama_get_embeddings_nextn_ith (llama-ext.h)."""
    set_nextn = _symbol("llama_set_embeddings_nextn", "_Z26llama_set_embeddings_nextnP13llama_contextbb")
    set_nextn.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
    set_nextn.restype = None
    get_ith = _symbol("llama_get_embeddings_nextn_ith", "_Z30llama_get_embeddings_nextn_ithP13llama_contexti")
    get_ith.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    get_ith.restype = ctypes.POINTER(ctypes.c_float)
    return set_nextn, get_ith


class _Ctx:
    """One llama context and an extended batch for it."""

    def __init__(
        self, model: ctypes.c_void_p, n_ctx: int, *, mtp: bool = False, other: _Ctx | None = None
    ) -> None:
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, n_ctx, n_ctx, 1
        p.n_threads = p.n_threads_batch = 1
        if mtp:
            p.ctx_type = LLAMA_CONTEXT_TYPE_MTP
        if other is not None:
            p.ctx_other = other.ctx
        self.ctx = llama_cpp.llama_init_from_model(model, p)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create the context")
        self.batch = llama_cpp.llama_batch_ext_init(self.ctx)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))

    def process(
        self, tokens: Sequence[int], pos0: int, *, h: np.ndarray | None = None, outputs: Sequence[int] = ()
    ) -> None:
        """Decode `tokens` at positions pos0.. (each with its row of `h` as embedding, if given)."""
        b = self.batch
        llama_cpp.llama_batch_ext_clear(b)
        keep = h if h is None else np.ascontiguousarray(h, dtype=np.float32)
        for i, token in enumerate(tokens):
            idx = llama_cpp.llama_batch_ext_add_token(b, 0, int(token))
            pos = (llama_cpp.llama_pos * 4)(*([pos0 + i] * 4))
            llama_cpp.llama_batch_ext_set_pos(b, idx, pos)
            if keep is not None:
                row = keep[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                llama_cpp.llama_batch_ext_set_embd_token(b, idx, llama_cpp.llama_embd(row, 1, keep.shape[1]))
            if i in outputs:
                llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)
        rc = llama_cpp.llama_process(self.ctx, LLAMA_PROCESS_TYPE_DECODE, b)
        if rc != 0:
            raise RuntimeError(f"llama_process failed with {rc}")

    def argmax(self, i: int) -> int:
        row = llama_cpp.llama_get_logits_ith(self.ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(row, shape=(self.n_vocab,))))

    def close(self) -> None:
        llama_cpp.llama_batch_ext_free(self.batch)
        llama_cpp.llama_free(self.ctx)


def _load(path: Path, *, load_mtp: bool = False) -> ctypes.c_void_p:
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.load_mtp = load_mtp
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return model


def mtp_agreement(
    target: Path, prompt: Sequence[int], n: int, *, assistant: Path | None = None, n_ctx: int = 512
) -> tuple[float, list[int]]:
    """Greedy-decode `n` tokens of `target` after `prompt`; before each one is decoded, ask the MTP
    drafter (the target's NextN block, or `assistant`) for the token after it. Returns the share of
    proposals equal to the target's token, and the target's tokens."""
    set_nextn, get_ith = _ext()
    t_model = _load(target, load_mtp=assistant is None)
    d_model = _load(assistant) if assistant is not None else None
    tgt = _Ctx(t_model, n_ctx)
    dft = _Ctx(d_model or t_model, n_ctx, mtp=True, other=tgt if assistant is not None else None)
    try:
        set_nextn(tgt.ctx, True, False)
        set_nextn(dft.ctx, True, True)
        width = int(llama_cpp.llama_model_n_embd_out(t_model))

        def hidden(k: int) -> np.ndarray:
            return np.ctypeslib.as_array(get_ith(tgt.ctx, k), shape=(width,)).copy()

        tgt.process(prompt, 0, outputs=[len(prompt) - 1])
        h = np.stack([hidden(k) for k in range(len(prompt))])
        if assistant is None:  # the NextN block's own K/V: every prompt token with the h before it
            h_prev = np.vstack([np.zeros((1, width), np.float32), h[:-1]])
            dft.process(prompt, 0, h=h_prev)
        token, h_last = tgt.argmax(len(prompt) - 1), h[-1]
        out: list[int] = []
        hits = 0
        for k in range(len(prompt), len(prompt) + n):
            out.append(token)
            dft.process([token], k, h=h_last[None], outputs=[0])
            guess = dft.argmax(0)
            tgt.process([token], k, outputs=[0])
            token, h_last = tgt.argmax(0), hidden(0)
            hits += guess == token
        return hits / n, out
    finally:
        dft.close()
        tgt.close()
        for m in (d_model, t_model):
            if m is not None:
                llama_cpp.llama_model_free(m)
