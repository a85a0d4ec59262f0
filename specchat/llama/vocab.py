"""A model's tokenizer: text to tokens and back, the facts drafts and targets must share (the pair check),
token texts and attributes, and a vocab-only load of a GGUF (no weights read, milliseconds)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFileError
from .lib import llama_cpp
from .log import quiet_stderr, set_verbose


@dataclass(frozen=True, slots=True)
class VocabFacts:
    """What the pair check compares between draft and target."""

    vocab_type: int
    n_vocab: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool


class VocabQueries:
    """The tokenizer's side of a model, shared by a full model and a vocab-only load."""

    _vocab: object
    _n_vocab: int
    #: each token's bytes once llama.cpp produced them (the loop asks for every token it shows)
    _piece_cache: dict[int, bytes]

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (part of a UTF-8 character, for byte-level vocabularies)."""
        cached = self._piece_cache.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        piece = buf.raw[:n]
        self._piece_cache[token] = piece
        return piece

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        arr = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        return list(arr[:n])

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def vocab_facts(self) -> VocabFacts:
        v = self._vocab
        return VocabFacts(
            vocab_type=int(llama_cpp.llama_vocab_type(v)),
            n_vocab=self._n_vocab,
            bos=int(llama_cpp.llama_vocab_bos(v)),
            eos=int(llama_cpp.llama_vocab_eos(v)),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(v)),
            add_eos=bool(llama_cpp.llama_vocab_get_add_eos(v)),
        )

    def token_text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_control(self, token: int) -> bool:
        """Control/special tokens (chat markers, unused slots): a mismatch there is only a warning."""
        attr = int(llama_cpp.llama_vocab_get_attr(self._vocab, token))
        special = (
            llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
            | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
            | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
            | llama_cpp.LLAMA_TOKEN_ATTR_UNUSED
        )
        return bool(attr & special)


class LlamaVocab(VocabQueries):
    """Only a GGUF's tokenizer (llama.cpp's vocab_only load: no weights read, milliseconds), for checking
    that a draft and a target agree on token ids without loading either model."""

    def __init__(self, path: Path, name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        set_verbose(False)
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.vocab_only = True
        with quiet_stderr(True):
            model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not model:
            raise ModelFileError(f"llama.cpp could not read the tokenizer of {self.path}")
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self._piece_cache = {}

    def close(self) -> None:
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> LlamaVocab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
