"""Token trees: several drafted continuations verified in one target batch.

A chain proposal d1..dk is one path; where the drafter was unsure, its second candidate is a likely
correction, and a tree puts those alternatives in the same verify batch, so a rejected chain token
can still be followed by an accepted alternative instead of the target's correction alone.

Shape. A tree batch is `[last, n1, n2, ...]`: node 0 is the round's first input (the last committed
token), every other node has a parent earlier in the list (`parents[0] == -1`). The main chain comes
first (`parents[i] == i - 1` for i < chain length): it is the proposal's own `tokens`, so everything
that reads a proposal as a chain (the planner's statistics, the round record) still reads it. The
side nodes follow in an order where a parent precedes its children: a draft model's runner-up is one
node beside a chain token; prompt lookup's other occurrences give whole branches (lookup_tree.py).

Branches. Each leaf is one branch; llama.cpp gives every node the sequence ids of the branches through
it, so its attention sees the committed context and its own ancestors only (engine.decode_tree). The
main chain's leaf is branch 0, the cache's own sequence.

Judging (greedy): walk down from the root; at each node the target's row picks the next token; a child
holding it is accepted and the walk goes on from there, else the picked token ends the round as the
correction (or, at a leaf, the bonus). So the committed tokens are exactly what the target's argmax
gives, one row at a time: the output equals plain decoding's. Sampling: multi-candidate rejection
sampling (SpecInfer): the children are tried in order, child c accepted with probability
min(1, p(c)/q(c)), else p becomes norm(max(p - q, 0)) and q loses c's mass (renormalised) before the
next child; when none is accepted a token is drawn from the p left. The output is distributed as the
target's own (tests/test_tree.py checks it statistically).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from .drafters import Proposal
from .sampling import SamplingParams, align, greedy_gap, probs, sample
from .settings import TREE_BRANCHES

__all__ = [
    "TREE_BRANCHES",
    "TreeModel",
    "TreeShape",
    "TreeVerdict",
    "fit_side",
    "judge_tree",
    "tree_batch",
    "tree_model",
    "verify_tree",
]


@dataclass(frozen=True, slots=True)
class TreeShape:
    """The parent of every node of a tree batch (node 0, the root, has -1), with what the engine and
    the judge derive from it, computed once."""

    parents: tuple[int, ...]
    #: nodes 0..chain-1 are the main chain (root included)
    chain: int = field(init=False)
    depth: tuple[int, ...] = field(init=False)
    children: tuple[tuple[int, ...], ...] = field(init=False)
    #: per node, the branches (leaf order: the main chain's leaf is branch 0) whose path holds it
    branches: tuple[tuple[int, ...], ...] = field(init=False)
    #: how many branches there are (leaves)
    n_branches: int = field(init=False)

    def __post_init__(self) -> None:
        parents = self.parents
        if not parents or parents[0] != -1:
            raise ValueError("a tree's first node is its root (parent -1)")
        for i, p in enumerate(parents[1:], start=1):
            if not 0 <= p < i:
                raise ValueError(f"node {i}'s parent {p} does not come before it")
        chain = 1
        while chain < len(parents) and parents[chain] == chain - 1:
            chain += 1
        depth = [0] * len(parents)
        kids: list[list[int]] = [[] for _ in parents]
        for i, p in enumerate(parents[1:], start=1):
            depth[i] = depth[p] + 1
            kids[p].append(i)
        leaves = [chain - 1] + [i for i in range(chain, len(parents)) if not kids[i]]
        through: list[list[int]] = [[] for _ in parents]
        for b, leaf in enumerate(leaves):
            node = leaf
            while node >= 0:
                through[node].append(b)
                node = parents[node]
        object.__setattr__(self, "chain", chain)
        object.__setattr__(self, "depth", tuple(depth))
        object.__setattr__(self, "children", tuple(tuple(k) for k in kids))
        object.__setattr__(self, "branches", tuple(tuple(sorted(t)) for t in through))
        object.__setattr__(self, "n_branches", len(leaves))

    @classmethod
    def of_chain(cls, n: int) -> TreeShape:
        """A chain of n nodes (root included)."""
        return cls(tuple(range(-1, n - 1)))

    def __len__(self) -> int:
        return len(self.parents)

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root down to `node`, both included."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


@runtime_checkable
class TreeModel(Protocol):
    """What a target needs beyond `decoding.model.Model` to verify trees (engine.LlamaModel)."""

    @property
    def tree_branches(self) -> int:
        """Side branches a tree batch may have besides the main chain (0: chains only)."""
        ...

    def decode_tree(self, tokens: Sequence[int], shape: TreeShape, logits_rows: Sequence[int]) -> np.ndarray:
        """Decode a tree batch (`tokens[i]` at node i) after the cache; the rows asked for. Until
        `keep_path`, `tokens` (the Model's) holds the context plus the main chain."""
        ...

    def keep_path(self, shape: TreeShape, path: Sequence[int]) -> None:
        """After a tree batch: keep the nodes of `path` (root first) and drop every other branch, so
        the cache holds the context plus the path's tokens, as if the path had been decoded alone."""
        ...


def tree_batch(
    root: int,
    chain: Sequence[int],
    side: Sequence[tuple[int, int]],
    side_parent: Sequence[int] = (),
) -> tuple[list[int], TreeShape]:
    """The batch of a round whose draft is `chain` with `side` nodes after `root`, the last committed
    token. Proposal.side: (position, token), a sibling of chain[position]; or, where `side_parent`
    names an earlier side node, that node's child (a branch of several tokens)."""
    tokens = [root, *chain]
    parents = list(range(-1, len(chain)))
    first_side = len(tokens)
    for i, (position, token) in enumerate(side):
        parent = side_parent[i] if side_parent else -1
        tokens.append(token)
        # node `position` holds chain[position - 1] (the root at 0); side node j is node first_side + j
        parents.append(position if parent < 0 else first_side + parent)
    return tokens, TreeShape(tuple(parents))


def tree_model(model: object) -> TreeModel | None:
    """`model` as a tree verifier, or None where it verifies chains only."""
    return model if isinstance(model, TreeModel) and model.tree_branches > 0 else None


@dataclass(slots=True)
class TreeVerdict:
    """A tree walk's outcome: the committed tokens (accepted node tokens, then the target's own
    token unless a near-tie stopped the walk), the accepted nodes (root excluded), and the nodes
    whose rows were judged (the tree's "drafted" count for the round)."""

    new: list[int]
    path: list[int]
    judged: int


def judge_tree(
    rows: np.ndarray,
    tokens: Sequence[int],
    shape: TreeShape,
    params: SamplingParams,
    rng: np.random.Generator,
    n_vocab: int,
    q: Sequence[np.ndarray | None] | None = None,
    margin: float = 0.0,
    gaps: list[float] | None = None,
) -> TreeVerdict:
    """Walk the tree against the target's rows (row i: the distribution after node i's path).

    `q[i]`: the distribution node i's token was drawn from (sampling; None or missing: one-hot at the
    token, a deterministic draft). Greedy with a `margin`: a row whose top-2 gap is below it decides
    nothing and the walk stops there, as verification.judge does."""
    new: list[int] = []
    path: list[int] = []
    node, judged = 0, 0
    while True:
        kids = shape.children[node]
        row = rows[node]
        judged += len(kids)
        if params.greedy:
            best, gap = (
                greedy_gap(row) if (gaps is not None or margin > 0.0) else (int(np.argmax(row)), np.inf)
            )
            if gaps is not None:
                gaps.append(float(gap))
            if gap < margin:
                return TreeVerdict(new, path, judged)
            nxt = next((c for c in kids if tokens[c] == best), None)
            new.append(int(best))
            if nxt is None:
                return TreeVerdict(new, path, judged)
        else:
            p = probs(row, params)
            nxt, drawn = _multi_candidate(p, kids, tokens, q, n_vocab, rng)
            new.append(drawn)
            if nxt is None:
                return TreeVerdict(new, path, judged)
        path.append(nxt)
        node = nxt


def _multi_candidate(
    p: np.ndarray,
    kids: Sequence[int],
    tokens: Sequence[int],
    q: Sequence[np.ndarray | None] | None,
    n_vocab: int,
    rng: np.random.Generator,
) -> tuple[int | None, int]:
    """SpecInfer's multi-candidate rejection sampling over `kids` (tried in order): (the accepted
    child or None, the token committed). Children drafted from the same distribution share it: after
    a rejection q loses the rejected token's mass, since the next child was drawn without it."""
    p = p.astype(np.float64, copy=True)
    shared: np.ndarray | None = None
    for c in kids:
        tok = tokens[c]
        qc = q[c] if q is not None and c < len(q) else None
        if qc is not None:
            qd = align(qc, n_vocab).astype(np.float64) if shared is None else shared
        else:
            qd = np.zeros(n_vocab)
            if tok < n_vocab:
                qd[tok] = 1.0
        pt = p[tok] if tok < n_vocab else 0.0
        qt = qd[tok] if tok < n_vocab else 0.0
        if qt > 0.0 and rng.random() < min(1.0, pt / qt):
            return c, int(tok)
        resid = np.maximum(p - qd, 0.0)
        total = resid.sum()
        p = resid / total if total > 0.0 else p
        if qc is not None:
            left = qd.copy()
            if tok < n_vocab:
                left[tok] = 0.0
            mass = left.sum()
            shared = left / mass if mass > 0.0 else left
    return None, sample(p, rng)


@dataclass(slots=True)
class TreeRound:
    """verify_tree's outcome: the committed tokens and accepted nodes (TreeVerdict), how many of
    those are the main chain's, the chain drafts judged (accepted, and the one rejected there), and
    whether a side node stood beside the chain token the target turned down."""

    new: list[int]
    path: list[int]
    on_chain: int
    judged: int
    tried: bool = False


def verify_tree(
    target: TreeModel,
    root: int,
    proposal: Proposal,
    params: SamplingParams,
    rng: np.random.Generator,
    margin: float = 0.0,
    gaps: list[float] | None = None,
) -> TreeRound:
    """One tree round on the target: the batch of `root` (the last committed token), the proposal's
    chain and side nodes, walked (judge_tree); the target then keeps the accepted path alone."""
    tokens, shape = tree_batch(root, proposal.tokens, proposal.side, proposal.side_parent)
    rows = target.decode_tree(tokens, shape, range(len(tokens)))
    q = None if proposal.q is None else [None, *proposal.q, *proposal.side_q]
    walked = judge_tree(rows, tokens, shape, params, rng, len(rows[0]), q, margin, gaps)
    target.keep_path(shape, [0, *walked.path])
    on_chain = 0
    while on_chain < len(walked.path) and walked.path[on_chain] == on_chain + 1:
        on_chain += 1
    stopped_on_chain = len(walked.new) == len(walked.path) == on_chain  # a near-tie on the chain
    rejected = on_chain < len(proposal.tokens) and not stopped_on_chain
    parents = proposal.side_parent or [-1] * len(proposal.side)
    beside = (pos for (pos, _), parent in zip(proposal.side, parents, strict=True) if parent < 0)
    tried = rejected and on_chain in beside
    return TreeRound(walked.new, walked.path, on_chain, on_chain + rejected, tried)


def fit_side(proposal: Proposal, room: int) -> None:
    """Keep the side nodes whose chain position survived the round's cut and whose parent was kept,
    in at most `room` side branches (the target's side sequences: a branch is a leaf, so a side
    node's first child takes none; none: the round is a chain)."""
    parents = proposal.side_parent or [-1] * len(proposal.side)
    kept: dict[int, int] = {}  # a kept node's index in `side` -> its index after the cut
    with_child: set[int] = set()  # kept nodes that are no longer leaves
    leaves = 0
    for i, (position, _) in enumerate(proposal.side):
        parent = parents[i]
        # a sibling of a chain token that is still there, or the child of a node kept
        if not (position < len(proposal.tokens) if parent < 0 else parent in kept):
            continue
        # a first child continues its parent's branch; any other node opens one
        opens = parent < 0 or parent in with_child
        if opens and leaves >= room:
            continue
        leaves += opens
        if parent >= 0:
            with_child.add(parent)
        kept[i] = len(kept)
    order = list(kept)  # in `side` order, as they were kept
    proposal.side = [proposal.side[i] for i in order]
    if proposal.side_parent:
        proposal.side_parent = [kept[parents[i]] if parents[i] >= 0 else -1 for i in order]
    if proposal.side_q:
        proposal.side_q = [proposal.side_q[i] for i in order]
