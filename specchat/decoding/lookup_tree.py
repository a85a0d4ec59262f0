"""Token-tree branches for prompt lookup: where earlier occurrences of the context's last tokens went
on differently from the drafted copy, the continuations it did not take, as side branches.

A lookup drafts what followed one earlier occurrence (the one that agrees furthest back). Text that
repeats a pattern with variations (a run of similar calls, a table, the same key with other values)
has several occurrences, and at the position where one of them parts from the draft, its token is a
likely correction and what followed it a likely continuation. Copies are free to draft, so a branch
costs only its verify rows, and each of its nodes goes into the tree while its chance of being
accepted pays for its row (DraftBudget.floor_at, the row it would take):

* the first node of a branch parting at draft position j: the chance the draft gets there (the
  planner's per-depth rates for this route, DraftBudget.expect), times the chance the drafted token
  there is rejected, times the chance that a branch then holds the target's token (learned by the
  planner from the rounds that tried one, DraftBudget.branch), times the alternative's share of the
  occurrences that part there;
* each later node: its parent's chance times the route's rate at its depth.

Greedy, the target's own tokens decide the walk (tree.judge_tree), so the output is plain
decoding's; sampling, a copied token is a one-hot draft, which multi-candidate rejection sampling
accepts with the target's own probability: exact in distribution either way.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .drafters import DraftBudget, Proposal

__all__ = ["BRANCH_TOKENS", "SIDE_ROWS", "Branch", "add_branches", "branches"]

#: Tokens a branch copies at most from where it parts from the draft.
BRANCH_TOKENS = 8
#: Side nodes a lookup's tree may have at most: a bound on the work of building it; the budget's
#: floors stop it far earlier on a steep verify curve.
SIDE_ROWS = 24


@dataclass(slots=True)
class Branch:
    """A continuation parting from the draft at `position` (a sibling of draft[position]), with the
    chance its first token is accepted and how many occurrences part there with it."""

    position: int
    tokens: list[int]
    value: float
    votes: int = 1


def _rate(budget: DraftBudget, i: int) -> float:
    rates = budget.expect
    return rates[min(i, len(rates) - 1)] if rates else 0.5


def branches(
    context: Sequence[int], ends: Sequence[int], draft: Sequence[int], budget: DraftBudget, depth: int
) -> list[Branch]:
    """The branches the occurrences ending at `ends` (most relevant first: for each first token the
    first of them gives its continuation) offer against `draft`, each at most `depth` tokens long,
    valued as the module says."""
    n_ctx = len(context)
    found: dict[tuple[int, int], Branch] = {}
    parted = [0] * len(draft)  # occurrences parting from the draft at each position
    for end in ends:
        j = 0
        while j < len(draft) and end + j < n_ctx and context[end + j] == draft[j]:
            j += 1
        if j >= len(draft) or end + j >= n_ctx:
            continue  # agrees with the whole draft, or runs into the present
        parted[j] += 1
        key = (j, int(context[end + j]))
        if key in found:
            found[key].votes += 1
        else:
            found[key] = Branch(j, [int(t) for t in context[end + j : min(n_ctx, end + j + depth)]], 0.0)
    reach = [1.0]
    for i in range(len(draft)):
        reach.append(reach[-1] * _rate(budget, i))
    for b in found.values():
        share = budget.branch * b.votes / parted[b.position]
        b.value = reach[b.position] * (1.0 - _rate(budget, b.position)) * share
    return sorted(found.values(), key=lambda b: -b.value)


def add_branches(out: Proposal, offered: Sequence[Branch], width: int, budget: DraftBudget) -> None:
    """Put the most valuable nodes of the `offered` branches into `out` as side nodes, in at most
    `width` branches, each while its chance of being accepted is worth the verify row it would take:
    the most valuable node first, so a deep branch of a likely alternative wins over a second, less
    likely one. Each branch's nodes go in one after another (a parent before its children)."""
    heap = [(-b.value, i, 0) for i, b in enumerate(offered)]
    heapq.heapify(heap)
    opened: list[int] = []
    used = [0] * len(offered)  # per branch, how many of its tokens went in
    rows = 0
    while heap and rows < SIDE_ROWS:
        neg, i, d = heapq.heappop(heap)
        value, b = -neg, offered[i]
        if value < budget.floor_at(len(out.tokens) + rows):
            break  # every node left is worth less
        if d == 0:
            if len(opened) >= width:
                continue
            opened.append(i)
        used[i], rows = d + 1, rows + 1
        if d + 1 < len(b.tokens):
            heapq.heappush(heap, (-(value * _rate(budget, b.position + d + 1)), i, d + 1))
    parents = out.side_parent or [-1] * len(out.side)
    for i in sorted(opened, key=lambda i: offered[i].position):
        for d, token in enumerate(offered[i].tokens[: used[i]]):
            parents.append(-1 if d == 0 else len(out.side) - 1)
            out.side.append((offered[i].position + d, token))
    out.side_parent = parents
