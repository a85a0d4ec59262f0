"""Token-tree verify batches on a llama.cpp context (decoding/tree.py): `LlamaModel`'s decode_tree
and keep_path, kept apart from the chain decoding in engine.py.

A tree batch is one llama_decode whose tokens carry several sequence ids: the branches through
each node, in a context made with one unified KV cache for `1 + tree_branches` sequences
(LoadOptions.tree_branches). What the methods read of the model is declared below; engine.py's
LlamaModel provides it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..decoding.tree import TreeShape
from ..errors import ContextFull, EngineError
from .devices import ggml_lib
from .lib import llama_cpp
from .rpc import failed_worker


class TreeBatches:
    """decode_tree / keep_path for a LlamaModel (decoding.tree.TreeModel)."""

    name: str
    tree_branches: int
    _ctx: Any
    _mem: Any
    _batch: Any
    _n_ctx: int
    _n_batch: int
    _tokens: list[int]
    _held: int
    _workers: tuple[str, ...]
    #: the last tree batch's side sequences and tokens, until keep_path
    _tree: tuple[int, tuple[int, ...]]
    #: what reads the target's rows after a decode (a head, a block drafter): base position, rows
    on_decoded: Callable[[int, int], None] | None

    def _decode_failed(self, base: int) -> None: ...
    def _check_workers(self) -> None: ...
    def _logits_view(self, n_rows: int) -> np.ndarray: ...

    def decode_tree(self, tokens: Sequence[int], shape: TreeShape, logits_rows: Sequence[int]) -> np.ndarray:
        """Decode a token tree after the cache in ONE llama_decode; the rows asked for, in order.

        Every node carries the sequence ids of the branches through it (TreeShape.branches), branch
        0 being the cache's own sequence, and each side branch first gets the committed context
        (llama_memory_seq_cp: in a unified cache the cells are shared, nothing is copied). llama.cpp
        masks a query by its FIRST sequence id and a cell by all of its own: a node's first id is a
        branch through it, which every ancestor carries too, so each node attends to the context and
        its own ancestors only. Tokens a previous keep_path left pending go in front, as the root's
        ancestors (then they carry every branch). Until keep_path, `tokens` holds the context plus
        the main chain."""
        if len(tokens) != len(shape):
            raise ValueError("one token per tree node")
        side = shape.n_branches - 1
        if side > self.tree_branches:
            raise EngineError(
                f"a tree of {shape.n_branches} branches needs {side} side sequences; "
                f"{self.name}'s context has {self.tree_branches}",
                "this is a bug in specchat; please report it",
            )
        if self._ctx is None:
            raise EngineError(
                f"{self.name} was already closed", "this is a bug in specchat; please report it"
            )
        pending = self._tokens[self._held :]
        front = len(pending)
        n = front + len(tokens)
        if (
            len(self._tokens) + shape.chain > self._n_ctx
            or len(self._tokens) + max(shape.depth) + 1 > self._n_ctx
        ):
            raise ContextFull(
                f"{len(self._tokens) + len(tokens)} tokens do not fit in the context window of {self._n_ctx}",
                "raise --ctx-size or shorten the prompt",
            )
        if n > self._n_batch:
            raise EngineError(f"a tree batch of {n} tokens exceeds n_batch {self._n_batch}")
        base = self._held
        for s in range(1, side + 1):
            llama_cpp.llama_memory_seq_cp(self._mem, 0, s, -1, -1)
        b = self._batch
        outputs = {front + r for r in logits_rows}
        every = list(range(side + 1))
        for i in range(n):
            node = i - front
            b.token[i] = pending[i] if node < 0 else tokens[node]
            b.pos[i] = base + i if node < 0 else base + front + shape.depth[node]
            seqs = every if node < 0 else shape.branches[node]
            b.n_seq_id[i] = len(seqs)
            for j, s in enumerate(seqs):
                b.seq_id[i][j] = s
            b.logits[i] = i in outputs
        b.n_tokens = n
        rc = llama_cpp.llama_decode(self._ctx, b)
        if self._workers and failed_worker(ggml_lib(), self._workers) is not None:
            self._drop_side(side)
            self._decode_failed(base)  # this pass's outputs came from a worker that was gone
            self._check_workers()
        if rc != 0:
            self._drop_side(side)
            self._decode_failed(base)
            raise EngineError(
                f"llama.cpp could not decode a tree of {len(tokens)} tokens (code {rc})",
                "run with --tree-width 0; --verbose shows llama.cpp's log",
            )
        self._tree = (side, tuple(int(t) for t in tokens))
        self._tokens[self._held :] = [*pending, *(int(t) for t in tokens[: shape.chain])]
        self._held = base + front + shape.chain
        if self.on_decoded is not None:
            # the pending tokens and the main chain come first in the batch, in position order: their
            # rows are what a chain decode of them gives (a side node accepted later is decoded again)
            self.on_decoded(base, front + shape.chain)
        view = self._logits_view(len(outputs))
        want = sorted(outputs)
        order = [want.index(front + r) for r in logits_rows]
        return view if order == list(range(len(order))) else view[order]

    def keep_path(self, shape: TreeShape, path: Sequence[int]) -> None:
        """After decode_tree: keep `path`'s nodes (the root first) and drop every other one. The main
        chain's part stays where it was decoded; nodes of a side branch are dropped too and left
        pending, decoded in front of the next batch: in the cache they sit after the main chain's
        rejected cells, and the next tokens would fill those holes before them, so attention would
        visit the cells out of position order and round differently from one-token decoding."""
        side, tokens = self._tree
        self._drop_side(side)
        self._tree = (0, ())
        on_chain = 0
        while on_chain < len(path) and path[on_chain] == on_chain:
            on_chain += 1
        root = self._held - shape.chain  # the cache position of node 0
        keep = root + on_chain
        if not llama_cpp.llama_memory_seq_rm(self._mem, 0, keep, -1):
            raise EngineError(f"llama.cpp could not cut {self.name}'s cache back to {keep} tokens")
        del self._tokens[keep:]
        self._held = keep
        self._tokens.extend(int(tokens[node]) for node in path[on_chain:])

    def _drop_side(self, side: int) -> None:
        for s in range(1, side + 1):
            llama_cpp.llama_memory_seq_rm(self._mem, s, -1, -1)
