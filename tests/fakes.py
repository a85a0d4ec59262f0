"""FakeModel: a deterministic numpy 'language model' implementing specchat.decoding.model.Model.

Its logits depend only on the last `order` tokens (seeded hash -> random table row), so the loop's
behaviour can be pinned down exactly and compared with plain greedy decoding, without llama.cpp.
Every decode/truncate is recorded so tests can count passes and check cache positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from specchat.decoding.sampling import SamplingParams


class FakeModel:
    def __init__(
        self,
        n_vocab: int = 16,
        *,
        seed: int = 0,
        n_ctx: int = 4096,
        eog: Sequence[int] = (),
        sharpness: float = 4.0,
        name: str = "fake",
        table: np.ndarray | None = None,
        order: int = 2,
        tree_branches: int = 0,
    ) -> None:
        self.name = name
        #: side branches a token-tree batch may have (decoding/tree.TreeModel; 0: chains only)
        self.tree_branches = tree_branches
        self.tree_calls: list[int] = []  # nodes per decode_tree
        self._tree: tuple[int, list[int]] | None = None  # (root position, tree tokens) until keep_path
        self._n_vocab = n_vocab
        self._n_ctx = n_ctx
        self._tokens: list[int] = []
        self._eog = set(eog)
        self.order = order
        rng = np.random.default_rng(seed)
        self.table = (
            table
            if table is not None
            else (rng.standard_normal((997, n_vocab)) * sharpness).astype(np.float32)
        )
        self.decode_calls: list[tuple[int, int]] = []  # (n_tokens, n_logit_rows)
        self.truncate_calls: list[int] = []
        self.restored: list[int] = []  # lengths of the states restored (the prompt cache's), in order

    # --- protocol -------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def tokens(self) -> Sequence[int]:
        return tuple(self._tokens)

    def logits_after(self, context: Sequence[int]) -> np.ndarray:
        """Logits for the token following `context` (a pure function of the last `order` tokens)."""
        key = hash(tuple(context[-self.order :])) % len(self.table)
        return self.table[key]

    def decode(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        if len(self._tokens) + len(tokens) > self._n_ctx:
            raise RuntimeError("fake context overflow")
        base = len(self._tokens)
        self._tokens.extend(int(t) for t in tokens)
        self.decode_calls.append((len(tokens), len(logits_rows)))
        rows = [self.logits_after(self._tokens[: base + r + 1]) for r in logits_rows]
        return np.array(rows, dtype=np.float32).reshape(len(rows), self._n_vocab)

    def truncate(self, n: int) -> None:
        self.truncate_calls.append(n)
        del self._tokens[n:]

    # --- token trees (decoding/tree.TreeModel) ---------------------------------------------------
    def decode_tree(self, tokens, shape, logits_rows) -> np.ndarray:
        if shape.n_branches - 1 > self.tree_branches:
            raise RuntimeError("fake tree wider than its branches")
        root = len(self._tokens)
        self.tree_calls.append(len(tokens))
        self.decode_calls.append((len(tokens), len(logits_rows)))
        rows = [
            self.logits_after([*self._tokens, *(tokens[j] for j in shape.path_to(r))]) for r in logits_rows
        ]
        self._tokens.extend(int(t) for t in tokens[: shape.chain])
        self._tree = (root, list(tokens))
        return np.array(rows, dtype=np.float32).reshape(len(rows), self._n_vocab)

    def keep_path(self, shape, path) -> None:
        assert self._tree is not None, "keep_path without a tree batch"
        root, tokens = self._tree
        self._tree = None
        self._tokens[root:] = [tokens[j] for j in path]

    def checkpoint(self) -> None:
        """Nothing to keep: a fake cache drops any suffix."""

    def is_eog(self, token: int) -> bool:
        return token in self._eog

    def token_bytes(self, token: int) -> bytes:
        return f"<{token}>".encode()

    # --- prompt cache (decoding/prompt_cache.Stateful) ---------------------------------------------
    def save_state(self) -> FakeState:
        return FakeState(tuple(self._tokens), BYTES_PER_TOKEN * len(self._tokens))

    def restore_state(self, state: FakeState) -> bool:
        self.restored.append(len(state.tokens))
        self._tokens = list(state.tokens)
        return True


#: What a fake cache "costs" per token in the prompt cache's accounting
BYTES_PER_TOKEN = 1000


@dataclass(frozen=True)
class FakeState:
    tokens: tuple[int, ...]
    nbytes: int


def first_two(model: FakeModel, prompt: Sequence[int], params: SamplingParams) -> np.ndarray:
    """The target's own joint distribution of the first two sampled tokens after `prompt`: what a
    distribution test compares an exact speculative sampler's draws with."""
    from specchat.decoding.sampling import probs

    vocab = model.n_vocab
    p1 = probs(model.logits_after(prompt), params)
    return np.array(
        [
            [p1[a] * probs(model.logits_after([*prompt, a]), params)[b] for b in range(vocab)]
            for a in range(vocab)
        ]
    )


def plain_greedy(model: FakeModel, prompt: Sequence[int], n: int) -> list[int]:
    """Reference: greedy decoding straight from the model's pure logits function."""
    ctx = list(prompt)
    out: list[int] = []
    for _ in range(n):
        tok = int(np.argmax(model.logits_after(ctx)))
        out.append(tok)
        ctx.append(tok)
        if model.is_eog(tok):
            break
    return out


class NoisyBatchModel(FakeModel):
    """A backend whose batched rows round differently from one-token rows (like llama.cpp's CPU
    flash attention, which splits the KV cache across threads only for a single query row)."""

    def __init__(self, eps: float, **kw):
        super().__init__(**kw)
        self.eps = eps

    def decode(self, tokens, logits_rows):
        out = super().decode(tokens, logits_rows)
        if len(tokens) > 1:
            base = len(self._tokens) - len(tokens)
            for j, r in enumerate(logits_rows):
                seed = hash(tuple(self._tokens[: base + r + 1])) % 2**32
                out[j] += (
                    np.random.default_rng(seed).uniform(-self.eps, self.eps, self.n_vocab).astype(np.float32)
                )
        return out


class DriftModel(FakeModel):
    """Like llama.cpp's repacked CPU weights: batches over `exact` rows round differently (±eps), and
    so does every later row, one token alone included, once such a batch's K/V are in the cache."""

    def __init__(self, eps: float, exact: int, **kw):
        super().__init__(**kw)
        self.eps, self.exact = eps, exact
        self.written_by_batch: list[bool] = []

    def decode(self, tokens, logits_rows):
        base = len(self._tokens)
        drifted_before = any(self.written_by_batch)
        out = super().decode(tokens, logits_rows)
        inexact = len(tokens) > self.exact
        self.written_by_batch.extend([inexact] * len(tokens))
        if inexact or drifted_before:
            for j, r in enumerate(logits_rows):
                seed = (hash(tuple(self._tokens[: base + r + 1])) + 7 * sum(self.written_by_batch)) % 2**32
                out[j] += (
                    np.random.default_rng(seed).uniform(-self.eps, self.eps, self.n_vocab).astype(np.float32)
                )
        return out

    def truncate(self, n):
        super().truncate(n)
        del self.written_by_batch[n:]


class TokenAutomaton:
    """A pure-Python `decoding.constraint.Constraint`: a deterministic automaton over token ids.

    `moves[state]` maps each token allowed there to the next state; in an `accepting` state the
    `eog` tokens are allowed too (the output may end). Random ones (`random`) let tests prove the
    loop's constrained output equals the constrained target's, whatever the drafter proposes."""

    def __init__(self, moves: dict[int, dict[int, int]], accepting: set[int], eog: Sequence[int]) -> None:
        self.moves = moves
        self.accepting = accepting
        self.eog = set(eog)
        self.state = 0
        self.accepted: list[int] = []
        self.checks = 0  # how many tokens were checked, in all calls
        self.largest = 0  # the most tokens one call checked (a full mask: the vocabulary)

    @classmethod
    def random(
        cls, n_vocab: int, *, seed: int, n_states: int = 5, width: int = 4, eog: Sequence[int] = ()
    ) -> TokenAutomaton:
        rng = np.random.default_rng(seed)
        ordinary = [t for t in range(n_vocab) if t not in set(eog)]
        moves = {
            s: {int(t): int(rng.integers(n_states)) for t in rng.choice(ordinary, width, replace=False)}
            for s in range(n_states)
        }
        return cls(moves, {n_states - 1}, eog)

    def allows(self, token: int) -> bool:
        return token in self.moves[self.state] or (self.state in self.accepting and token in self.eog)

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        self.checks += len(tokens)
        self.largest = max(self.largest, len(tokens))
        return np.array([self.allows(int(t)) for t in tokens], dtype=bool)

    def accept(self, token: int) -> None:
        assert token in self.moves[self.state], f"token {token} is not allowed in state {self.state}"
        self.accepted.append(token)
        self.state = self.moves[self.state][token]

    def close(self) -> None:
        return None

    def start(self) -> TokenAutomaton:  # as a CompiledGrammar: each answer walks its own state
        return self.fresh()

    def fresh(self) -> TokenAutomaton:
        return TokenAutomaton(self.moves, self.accepting, sorted(self.eog))


def constrained_greedy(
    model: FakeModel, prompt: Sequence[int], n: int, automaton: TokenAutomaton
) -> list[int]:
    """Reference: greedy decoding of the model's logits restricted to what `automaton` allows."""
    auto = automaton.fresh()
    ctx = list(prompt)
    out: list[int] = []
    for _ in range(n):
        row = model.logits_after(ctx).copy()
        ok = auto.allowed(np.arange(model.n_vocab))
        row[~ok] = -np.inf
        tok = int(np.argmax(row))
        out.append(tok)
        ctx.append(tok)
        if model.is_eog(tok):
            break
        auto.accept(tok)
    return out
