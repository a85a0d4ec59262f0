"""Constrained output: verifying drafts against the target *restricted by a grammar*, exactly.

A `Constraint` says which tokens may come next after the tokens it has accepted, and advances with
each committed token. The loop (verification.judge) decides every verify row under the constraint's state
after the tokens decided before it in the round, through a `Walk`:

* greedy: the largest logit among allowed tokens (ties: the lowest id, as unconstrained greedy).
  Cheap first: the unconstrained argmax is usually allowed, and then it is the answer (one check);
  otherwise the next-best candidates are checked in logit order, and only when none of them is
  allowed is the whole vocabulary masked. The top-2 gap the tie margin needs is the gap to the best
  *other allowed* token, or a lower bound of it (the gap to the best other token, or to the edge of
  the candidates checked): never larger than the true gap, so a near-tie is never missed;
* sampling: the full mask (disallowed logits -> -inf) before `sampling.probs`, so the min(1, p/q)
  test and the residual both use the constrained p and the output is exact in distribution.

Drafters and the planner know nothing of this: a draft the constraint forbids has p = 0 and is
rejected like any other wrong draft. The state advances only with tokens actually decided (every
decided token is committed); a near-tie that decides nothing advances nothing. An end-of-generation
token is never passed to `accept` (the answer ends there). `GrammarSpec` is what a request asks for;
engines compile it into a Constraint (specchat/llama/grammar.py for llama.cpp's GBNF grammars).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from .sampling import SamplingParams, greedy_gap, probs

#: How many next-best candidates are checked (one batched check each) before masking everything.
CANDIDATES = (16, 256)


class Constraint(Protocol):
    """Which tokens may come next, after the tokens accepted so far."""

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        """For each token id in `tokens` (int32 array), whether it may come next (bool array)."""
        ...

    def accept(self, token: int) -> None:
        """Advance past `token`, which `allowed` allows and which is not end-of-generation."""
        ...

    def close(self) -> None:
        """Free what the state holds (native grammar state); the caller closes it after the answer."""
        ...


class CompiledGrammar(Protocol):
    """A request's grammar, compiled once (Backend.constraint); each answer walks a fresh state."""

    def start(self) -> Constraint:
        """A state at the grammar's start."""
        ...

    def close(self) -> None: ...


class DeadEnd(Exception):
    """The constraint allows no token at all (a grammar no token sequence can continue)."""


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """What a request asks the output to match; the engine compiles it (once per request).

    `kind`: "gbnf" (`text` is a GBNF grammar), "json_schema" (`schema` is a JSON schema) or
    "json_object" (any JSON object). `param`: the request field it came from, named in errors."""

    kind: Literal["gbnf", "json_schema", "json_object"]
    text: str = ""
    schema: Mapping[str, Any] | None = None
    param: str = "grammar"


@dataclass(slots=True)
class Walk:
    """One answer's decisions under `constraint` (see the module docstring). `keep_rows`: remember
    each decided row's masked logits (`rows`), for logprobs of the constrained distribution."""

    constraint: Constraint
    n_vocab: int
    is_eog: Callable[[int], bool]
    keep_rows: bool = False
    rows: list[np.ndarray] = field(default_factory=list)
    ended: bool = False  # an end-of-generation token was decided: nothing after it is committed

    def start_round(self) -> None:
        self.rows.clear()

    def greedy(self, row: np.ndarray, margin: float, measure: bool) -> tuple[int, float]:
        """The allowed token with the largest logit, and its gap to the next allowed one (or a lower
        bound of that gap; inf when not `measure`d)."""
        if self.ended:
            return self._after_end(row, measure)
        if self.keep_rows:  # the masked row is needed anyway: decide on it
            masked = self.masked(row)
            return greedy_gap(masked) if measure else (int(np.argmax(masked)), math.inf)
        top = int(np.argmax(row))
        if self._allows(top):
            if not measure:
                return top, math.inf
            _, gap = greedy_gap(row)  # to the best other token, allowed or not: a lower bound
            if gap >= margin:
                return top, gap
        n = row.shape[0]
        for size in CANDIDATES:
            if size >= n:
                break
            kth = float(np.partition(row, n - size)[n - size])
            ids = np.flatnonzero(row >= kth)  # all ties at the edge too, so ids order ties right
            ids = ids[np.lexsort((ids, -row[ids]))]  # best first; equal logits: the lower id
            ok = ids[self.constraint.allowed(ids.astype(np.int32))]
            if ok.size == 0:
                continue
            best = int(ok[0])
            # the next allowed token is either in ok, or outside the candidates (logit < kth)
            gap = float(row[best] - row[ok[1]]) if ok.size > 1 else float(row[best] - kth)
            if not measure:
                return best, math.inf
            if ok.size > 1 or gap >= margin:
                return best, gap
        masked = self.masked(row, keep=False)
        return greedy_gap(masked) if measure else (int(np.argmax(masked)), math.inf)

    def probs(self, row: np.ndarray, params: SamplingParams) -> np.ndarray:
        """The constrained distribution sampled from: `sampling.probs` of the masked row.

        With top-k (k > 0) only the k best allowed tokens can be sampled, and when the candidates
        checked first hold k allowed ones, those are the k best (every token left out has a lower
        logit than every candidate): then only the candidates are checked, not the vocabulary."""
        if self.ended:
            self._after_end(row, False)
            return probs(row, params)
        k, n = params.top_k, row.shape[0]
        size = max(CANDIDATES[-1], 4 * k)
        if k > 0 and size < n:
            kth = float(np.partition(row, n - size)[n - size])
            ids = np.flatnonzero(row >= kth)
            ok = ids[self.constraint.allowed(ids.astype(np.int32))]
            if ok.size >= k:
                out = np.full(n, -np.inf, dtype=np.float32)
                out[ok] = row[ok]
                if self.keep_rows:
                    self.rows.append(out)
                return probs(out, params)
        return probs(self.masked(row), params)

    def masked(self, row: np.ndarray, *, keep: bool = True) -> np.ndarray:
        """`row` with every disallowed logit at -inf (DeadEnd when nothing is allowed)."""
        ok = self.constraint.allowed(np.arange(row.shape[0], dtype=np.int32))
        if not ok.any():
            raise DeadEnd("the grammar allows no next token")
        out = np.where(ok, row, np.float32(-np.inf)).astype(np.float32, copy=False)
        if keep and self.keep_rows:
            self.rows.append(out)
        return out

    def decided(self, token: int) -> None:
        """`token` was decided by the row just walked (it will be committed): advance past it."""
        if self.ended:
            return
        if self.is_eog(token):
            self.ended = True  # the answer ends here; the rest of the round is discarded
            return
        self.constraint.accept(token)

    def _after_end(self, row: np.ndarray, measure: bool) -> tuple[int, float]:
        """A row after an end-of-generation token in the same round: decided as without a constraint
        (what it decides is never committed), its row kept so rows still line up with tokens."""
        if self.keep_rows:
            self.rows.append(row)
        return greedy_gap(row) if measure else (int(np.argmax(row)), math.inf)

    def _allows(self, token: int) -> bool:
        return bool(self.constraint.allowed(np.array([token], dtype=np.int32))[0])
