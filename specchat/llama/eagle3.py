"""An EAGLE-3 head (llama.cpp arch `eagle3`, converted with `convert_hf_to_gguf.py --target-model-dir`)
as a draft model.

Why a head rather than a separate draft model: trained on one target's hidden states, it reads three of
the target's layers for every token and costs one decoder layer plus an output projection per drafted
token, and agrees with the target more often than a small model of the family.

How it runs (llama.cpp's `draft-eagle3`, common/speculative.cpp, driven from Python): the target's
context also returns the inputs of the three layers the head names (`target_layers`, written by the
converter) for every token it decodes (`llama_set/get_embeddings_layer_inp`); the head's encoder
(`llama_process(..., ENCODE)` on its own context) fuses each position's three rows into one row g_P of
the head's width. Its decoder holds K/V of its own, one entry per token: the token at P + 1 with g_P,
at position P (the first token has none). To draft after the committed context, the head reads the
last committed token with the target's g at the position before, predicts the next token, and feeds
its own pre-norm state back for each further step. Entries made from the target's g are confirmed,
from its own provisional; rollback is attention only (llama/head.py's CachedHead).

The calls it needs live in llama.cpp's staging header (src/llama-ext.h) with C++ linkage: this module
binds them by their exported (mangled) names, on first use, so a build without them fails only this
drafter, with one line saying so.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EngineError, IncompatiblePair, ModelFileError
from .engine import LlamaModel, load_model_file
from .head import CachedHead, model_meta
from .lib import llama_cpp

#: the architecture llama.cpp gives EAGLE-3 head files
EAGLE3_ARCH = "eagle3"
#: how many target layers an EAGLE-3 head reads (llama.cpp refuses any other count)
N_TARGET_LAYERS = 3
#: target architectures whose llama.cpp graph hands out every layer's input (`res->t_layer_inp[il]`
#: in src/models/*.cpp of the pinned build, one row of the model's width per token). Any other
#: architecture would abort inside llama.cpp's graph building when asked for them
LAYER_INPUT_ARCHS = frozenset(
    {
        "llama",
        "qwen3",
        "qwen3moe",
        "qwen3next",
        "qwen35",
        "qwen35moe",
        "gemma4",
        "gpt-oss",
        "lfm2",
        "minimax-01",
        "minimax-m2",
        "mimo2",
        "nemotron_h",
        "nemotron_h_moe",
        "bailingmoe3",
        "hunyuan_vl",
        "hunyuan-dense",
        "muse-glimmer",
        "nanbeige",
    }
)


@dataclass(frozen=True, slots=True)
class _Calls:
    """The staging calls an EAGLE-3 head needs beyond the NextN ones (llama/head.py binds those)."""

    set_layer_inp: Callable[[Any, int, bool], None]
    get_layer_inp: Callable[[Any, int], Any]
    target_layer_ids: Callable[[Any], Any]
    target_layer_ids_n: Callable[[Any], int]
    get_tok_embd: Callable[[Any, Any], int]


#: name, exported symbols (C, Itanium, MSVC), argument types, result type. The Itanium names are the
#: ones the pinned Linux build exports; the MSVC ones follow that scheme as llama-cpp-python's own
#: NextN bindings spell theirs, unchecked against a Windows build
_SIGNATURES: tuple[tuple[str, tuple[str, ...], list[Any], Any], ...] = (
    (
        "set_layer_inp",
        (
            "llama_set_embeddings_layer_inp",
            "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
            "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z",
        ),
        [llama_cpp.llama_context_p_ctypes, ctypes.c_uint32, ctypes.c_bool],
        None,
    ),
    (
        "get_layer_inp",
        (
            "llama_get_embeddings_layer_inp",
            "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
            "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z",
        ),
        [llama_cpp.llama_context_p_ctypes, ctypes.c_uint32],
        ctypes.POINTER(ctypes.c_float),
    ),
    (
        "target_layer_ids",
        (
            "llama_model_target_layer_ids",
            "_Z28llama_model_target_layer_idsPK11llama_model",
            "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z",
        ),
        [llama_cpp.llama_model_p_ctypes],
        ctypes.POINTER(ctypes.c_int32),
    ),
    (
        "target_layer_ids_n",
        (
            "llama_model_target_layer_ids_n",
            "_Z30llama_model_target_layer_ids_nPK11llama_model",
            "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z",
        ),
        [llama_cpp.llama_model_p_ctypes],
        ctypes.c_uint32,
    ),
    (
        "get_tok_embd",
        (
            "llama_model_get_tok_embd",
            "_Z24llama_model_get_tok_embdPK11llama_modelPf",
            "?llama_model_get_tok_embd@@YAIPEBUllama_model@@PEAM@Z",
        ),
        [llama_cpp.llama_model_p_ctypes, ctypes.POINTER(ctypes.c_float)],
        ctypes.c_uint32,
    ),
)


def layer_input_calls(what: str = "an EAGLE-3 head") -> _Calls:
    """The staging calls a drafter that reads the target's layer inputs needs (EAGLE-3, DFlash), from
    the loaded libllama by whichever of their names it exports; `what` names the drafter in the
    error where the build lacks one."""
    lib = llama_cpp.llama_cpp._lib
    bound: dict[str, Any] = {}
    for name, symbols, argtypes, restype in _SIGNATURES:
        func = next((getattr(lib, s) for s in symbols if hasattr(lib, s)), None)
        if func is None:
            raise EngineError(
                f"this llama.cpp build exports no {symbols[0]}, which {what} needs",
                "install the pinned llama-cpp-python (`make install`), or draft with another --draft",
            )
        func.argtypes = argtypes
        func.restype = restype
        bound[name] = func
    return _Calls(**bound)


class Eagle3Head(CachedHead):
    """The EAGLE-3 head in `path`, drafting for `target`. Checks that the head is one llama.cpp can
    run for this target before anything reaches llama.cpp's graph code, where a mismatch aborts the
    process: the header checks that need only the file (models/heads.py) come before the load."""

    shift = 1
    outputs_first = True

    def __init__(self, target: LlamaModel, path: Path, *, verbose: bool = False) -> None:
        calls = layer_input_calls()
        model = load_model_file(path, target.gpu_layers, verbose=verbose)
        if model is None:
            raise ModelFileError(
                f"llama.cpp could not load the EAGLE-3 head {path}",
                "check that it is an EAGLE-3 GGUF (convert_hf_to_gguf.py --target-model-dir); "
                "--verbose shows why",
            )
        self._model = model
        self._calls = calls
        self._n_embd_target = int(llama_cpp.llama_model_n_embd(target.raw_model))
        try:
            self._layers = _checked_layers(calls, model, target, Path(path))
            super().__init__(
                target,
                model,
                ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_DEFAULT,
                ctx_other=True,  # the head may embed and project with the target's tables
                width=int(llama_cpp.llama_model_n_embd(model)),
                what="EAGLE-3",
                verbose=verbose,
            )
        except BaseException:
            llama_cpp.llama_model_free(model)
            self._model = None
            raise
        for layer in self._layers:
            calls.set_layer_inp(target.raw_context, layer, True)
        self.name = "eagle3"
        self.path = Path(path)  # calibration keys its costs by the file, like a draft model's

    def _target_rows(self, count: int) -> np.ndarray | None:
        """The target's inputs of the head's three layers for each of the `count` tokens it decoded,
        through the head's encoder: one row g of the head's width per token."""
        ctx = self.target.raw_context
        width = self._n_embd_target
        features = np.empty((count, len(self._layers) * width), dtype=np.float32)
        for k, layer in enumerate(self._layers):
            ptr = self._calls.get_layer_inp(ctx, layer)
            if not ptr:
                return None
            features[:, k * width : (k + 1) * width] = np.ctypeslib.as_array(ptr, shape=(count, width))
        return np.concatenate(
            [self._encode(features[lo : lo + self._n_ubatch]) for lo in range(0, count, self._n_ubatch)]
        )

    def _encode(self, features: np.ndarray) -> np.ndarray:
        """One encoder pass (at most n_ubatch rows: llama.cpp encodes a batch in one piece)."""
        b = self._batch
        llama_cpp.llama_batch_ext_clear(b)
        # the encoder reads no positions, but the batch must continue the head's cache
        first = int(llama_cpp.llama_memory_seq_pos_max(self._mem, 0)) + 1
        rows = np.ascontiguousarray(features, dtype=np.float32)
        for i in range(len(rows)):
            row = rows[i]
            embd = llama_cpp.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, row.size)
            idx = llama_cpp.llama_batch_ext_add_embd(b, 0, embd)
            if idx < 0:
                raise EngineError(f"llama.cpp refused the EAGLE-3 encoder's input ({idx})")
            llama_cpp.llama_batch_ext_set_pos(b, idx, (llama_cpp.llama_pos * 4)(first + i))
            llama_cpp.llama_batch_ext_set_output_embd(b, idx, True)
        rc = llama_cpp.llama_process(self._ctx, llama_cpp.LLAMA_PROCESS_TYPE_ENCODE, b)
        ptr = self._get_h(self._ctx) if rc == 0 else None
        if not ptr:
            raise EngineError(f"llama.cpp's EAGLE-3 encoder failed with code {rc}")
        return np.ctypeslib.as_array(ptr, shape=(len(rows), self._n_embd)).copy()

    def close(self) -> None:
        calls = getattr(self, "_calls", None)
        if calls is not None and getattr(self, "_ctx", None) and self.target.raw_context:
            for layer in self._layers:  # the target stops copying them out
                calls.set_layer_inp(self.target.raw_context, layer, False)
        super().close()
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None


def tapped_layers(
    calls: _Calls,
    model: object,
    target: LlamaModel,
    name: str,
    kind: str,
    noun: str,
    count: int | None = None,
) -> tuple[int, ...]:
    """The target layers a drafter file (`name`, a `kind` `noun`: an EAGLE-3 head, a DFlash drafter)
    reads through llama.cpp's layer taps, shared by both: one line when the target's graph hands out
    no layer inputs, or when the layers (`count` of them, where the kind fixes it) are not all the
    target's."""
    reader = f"the {kind} {noun} {name}"
    target_arch = target.meta("general.architecture")
    if target_arch not in LAYER_INPUT_ARCHS:
        raise IncompatiblePair(
            f"llama.cpp hands out no layer inputs of {target_arch} models, which {reader} reads",
            f"{kind} runs on {', '.join(sorted(LAYER_INPUT_ARCHS))} targets; draft with another --draft",
        )
    n = int(calls.target_layer_ids_n(model))
    ptr = calls.target_layer_ids(model)
    layers = tuple(int(ptr[i]) for i in range(n)) if ptr else ()
    n_layer = target.n_layer
    wrong_count = not layers if count is None else len(layers) != count
    if wrong_count or not all(0 <= i < n_layer for i in layers):
        raise IncompatiblePair(
            f"{reader} reads target layers {list(layers)}, but {target.name} has "
            f"{n_layer} (llama.cpp gives the inputs of layers 0 to {n_layer - 1})",
            f"use the {noun} converted for this model (--target-model-dir)",
        )
    return layers


def _checked_layers(calls: _Calls, model: object, target: LlamaModel, path: Path) -> tuple[int, ...]:
    """The target layers the head reads, once everything llama.cpp would assert on is checked: that
    it is an EAGLE-3 head, that the target's graph hands out layer inputs, and that the head was made
    for a target of this depth, width and vocabulary."""
    name = path.name
    arch = model_meta(model, "general.architecture")
    if arch != EAGLE3_ARCH or int(llama_cpp.llama_model_n_layer(model)) != 1:
        raise ModelFileError(
            f"{name} is no EAGLE-3 head (architecture {arch})",
            "give the head's GGUF, converted with convert_hf_to_gguf.py --target-model-dir",
        )
    layers = tapped_layers(calls, model, target, name, "EAGLE-3", "head", N_TARGET_LAYERS)
    hidden = model_meta(model, f"{EAGLE3_ARCH}.target_hidden_size")
    width = int(llama_cpp.llama_model_n_embd(target.raw_model))
    if hidden is None or not hidden.isdigit() or int(hidden) != width:
        raise IncompatiblePair(
            f"the EAGLE-3 head {name} is for a target of width {hidden}, not {target.name}'s {width}",
            "use the head converted for this model (--target-model-dir)",
        )
    n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
    own_embd = int(calls.get_tok_embd(model, None)) > 0
    head_width = int(llama_cpp.llama_model_n_embd(model))
    if n_vocab != target.n_vocab or (not own_embd and head_width != width):
        raise IncompatiblePair(
            f"the EAGLE-3 head {name} ({n_vocab} tokens, width {head_width}) does not fit "
            f"{target.name} ({target.n_vocab} tokens, width {width})",
            "use the head converted for this model (--target-model-dir)",
        )
    return layers
