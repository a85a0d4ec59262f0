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

`MtpHead` is a `decoding.model.Model` (llama/head.py's CachedHead: entries made from the target's
hidden states are confirmed, from its own provisional), so `decoding.drafters.ModelDrafter` drives it
like any draft model and the planner prices it the same way (its per-token cost, its catching up on
the context).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import EngineError
from .engine import LlamaModel, load_model_file
from .head import CachedHead, Head, model_meta, nextn_calls
from .lib import llama_cpp


class MtpHead(CachedHead):
    """The NextN head of `target` (loaded with `LoadOptions.load_mtp`), with its own K/V: the entry of
    the token at p pairs it with the target's hidden state at p - 1 (llama/head.py)."""

    def __init__(self, target: LlamaModel, *, verbose: bool = False) -> None:
        if target.n_nextn <= 0:
            raise EngineError(f"{target.name} has no multi-token-prediction (NextN) layers")
        super().__init__(
            target,
            target.raw_model,
            ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP,
            ctx_other=False,
            width=int(llama_cpp.llama_model_n_embd_out(target.raw_model)),
            what="MTP",
            verbose=verbose,
        )
        nextn_calls().llama_set_embeddings_nextn(target.raw_context, True, False)  # every row
        self.name = "mtp"
        self.path: Path = target.path  # calibration keys its costs by the file, like a draft model's


class AssistantHead(Head):
    """Gemma 4's MTP assistant (`mtp-gemma-4-*.gguf`, architecture gemma4-assistant): a small model of
    its own file that reads the target's K/V (its layers have queries only) and embeds tokens with the
    target's table. It keeps no cache, so there is nothing to catch up on: every draft step runs at the
    position after the target's cache, from the target's last hidden state and then from its own
    (llama.cpp's draft-mtp does the same for shared-memory drafters)."""

    def __init__(self, target: LlamaModel, path: Path, *, verbose: bool = False) -> None:
        model = load_model_file(path, target.gpu_layers, verbose=verbose)
        if model is None:
            raise EngineError(
                f"llama.cpp could not load the MTP assistant {path}",
                "check that it is the assistant GGUF of this model; --verbose shows why",
            )
        self._model = model
        arch = model_meta(model, "general.architecture")
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
            super().__init__(
                target,
                model,
                ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP,
                ctx_other=True,
                width=int(widths[1]),
                what="MTP",
                verbose=verbose,
            )
        except EngineError:
            llama_cpp.llama_model_free(model)
            self._model = None
            raise
        nextn_calls().llama_set_embeddings_nextn(target.raw_context, True, False)  # every row
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
        self._target_h.drop_before(pos - 1)  # only the latest state is ever read
        return out

    def truncate(self, n: int) -> None:
        """A new draft starts from the target's state again."""
        self._step_h = None

    def close(self) -> None:
        super().close()
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None
