"""The small protocol the speculative loop needs from a model.

`engine.LlamaModel` implements it on llama.cpp; `tests/fakes.py` implements it with numpy tables, which
is how the loop is tested without llama.cpp. Keeping this tiny is what keeps the loop readable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Model(Protocol):
    """A causal LM with a KV cache holding exactly `tokens` (positions 0..len-1)."""

    name: str

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def tokens(self) -> Sequence[int]:
        """The tokens whose keys/values are in the cache, in position order."""
        ...

    def decode(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        """Append `tokens` to the cache in one batch; return logits (len(logits_rows) x n_vocab) for
        the batch rows asked for (0 = first new token). The array may be a view that the next call
        overwrites: copy what must outlive it."""
        ...

    def truncate(self, n: int) -> None:
        """Drop cached positions >= n. Always possible; on a recurrent model it is cheapest within the
        last decode or back to the last `checkpoint` (engine.LlamaModel, llama/rollback.py)."""
        ...

    def checkpoint(self) -> None:
        """The caller may truncate back to the current length after several more decodes (a draft
        model drafting token by token, a calibration measuring from a base): keep what that needs.
        A no-op for caches that can drop any suffix (attention, the fakes)."""
        ...

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <|im_end|>, ...)."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes this token detokenizes to (may be part of a UTF-8 character)."""
        ...


#: tokens common_prefix_len compares at once (as lists, in C) before walking one block token by token
PREFIX_BLOCK = 1024


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix: how much of a cache can be kept for a new sequence.

    Called several times a round on the whole context (each drafter's cache, the n-gram index, the
    settle): blocks are compared as lists, and only the block where they part is walked token by
    token, so a 2,000-token context costs ~15 us a call rather than ~100 us."""
    n = min(len(a), len(b))
    i = 0
    while i < n:
        j = min(n, i + PREFIX_BLOCK)
        if list(a[i:j]) != list(b[i:j]):
            while a[i] == b[i]:
                i += 1
            return i
        i = j
    return n


def sync_cache(model: Model, wanted: Sequence[int], logits_row_last: bool) -> np.ndarray | None:
    """Make the model's cache hold exactly `wanted`, decoding only what differs from what it holds.

    With `logits_row_last`, returns the logits of the last token of `wanted`; if that token is already
    cached it is re-decoded (one token), since llama.cpp keeps no logits for old positions.
    """
    keep = common_prefix_len(model.tokens, wanted)
    if logits_row_last and keep == len(wanted) and keep > 0:
        keep -= 1
    # also when keep is all of `tokens`: a cache may hold provisional entries past them (an MTP
    # head's draft steps, llama/mtp.py), and a cut at or past the end is free for every other one
    model.truncate(keep)
    rest = wanted[keep:]
    if not rest:
        return None
    rows = [len(rest) - 1] if logits_row_last else []
    out = model.decode(rest, rows)
    return out[0] if logits_row_last else None
