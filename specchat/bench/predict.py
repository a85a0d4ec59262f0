"""The speedup predicted for flat-verify hardware (GPU, Metal: V(n) = V(1)) from this run's measured
per-position acceptance and draft/target cost ratio. A prediction, never mixed with measurements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..decoding.planner import best_k, expected_tokens
from .results import Cell, rates, sum_positions
from .suite import Config


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted speedup of one drafter where V(n) = V(1) (GPU/Metal). Not a measurement.

    From the measured per-position acceptance r_j (share of drafts at position j that were accepted)
    the conditional rates are α_j = r_j / r_(j-1), so E(k) = 1 + Σ_{j<k} r_j tokens per round, at a cost
    of k·c + 1 target-token times, c = draft seconds per drafted token ÷ plain seconds per token (both
    measured in this run). `decoding.planner.best_k` picks k on that flat verify curve.
    """

    drafter: str
    source_config: str
    cost_ratio: float
    acceptance_by_position: tuple[float, ...]
    best_k: int
    speedup: float
    speedup_by_k: tuple[float, ...]
    by_prompt: tuple[tuple[str, int, float], ...]  # (prompt, best k, predicted speedup)

    def to_dict(self) -> dict[str, Any]:
        return {
            "drafter": self.drafter,
            "source_config": self.source_config,
            "cost_ratio": round(self.cost_ratio, 4),
            "acceptance_by_position": [round(v, 4) for v in self.acceptance_by_position],
            "best_k": self.best_k,
            "predicted_speedup": round(self.speedup, 4),
            "predicted_speedup_by_k": [round(v, 4) for v in self.speedup_by_k],
            "by_prompt": [
                {"prompt": p, "best_k": k, "predicted_speedup": round(s, 4)} for p, k, s in self.by_prompt
            ],
        }


def conditional_rates(by_position: Sequence[float]) -> list[float]:
    """Per-position acceptance shares r_j -> conditional rates α_j with Π_{i≤j} α_i = r_j (clipped)."""
    out: list[float] = []
    prev = 1.0
    for r in by_position:
        out.append(min(1.0, r / prev) if prev > 0 else 0.0)
        prev = r
    return out


def predict_flat(by_position: Sequence[float], cost_ratio: float) -> tuple[int, float, tuple[float, ...]]:
    """(best k, its predicted speedup, speedup for k = 0..K) when a verify batch costs one token."""
    alphas = conditional_rates(by_position)
    flat = [1.0] * (len(alphas) + 1)
    k, speed = best_k(alphas, flat, cost_ratio)
    curve = tuple(expected_tokens(alphas[:j]) / (j * cost_ratio + 1.0) for j in range(len(alphas) + 1))
    return k, speed, curve


def _prediction(
    drafter: str, cfg: Config, cells: Sequence[Cell], plain_cells: Sequence[Cell]
) -> Prediction | None:
    drafted = sum(c.drafted for c in cells)
    plain_tokens = sum(c.generated_total for c in plain_cells)
    plain_seconds = sum(c.decode_seconds_total for c in plain_cells)
    if not drafted or not plain_tokens or plain_seconds <= 0:
        return None
    per_token = plain_seconds / plain_tokens
    ratio = (sum(c.draft_seconds for c in cells) / drafted) / per_token
    pooled = rates(
        sum_positions([c.accepted_by_position for c in cells]),
        sum_positions([c.drafted_by_position for c in cells]),
    )
    k, speed, curve = predict_flat(pooled, ratio)
    per_prompt = []
    for c in cells:
        if c.drafted:
            pk, ps, _ = predict_flat(c.acceptance_by_position, ratio)
            per_prompt.append((c.prompt, pk, ps))
    return Prediction(drafter, cfg.name, ratio, pooled, k, speed, curve, tuple(per_prompt))


def predict_drafters(
    configs: Sequence[Config], cells: Sequence[Cell], labels: Sequence[str]
) -> tuple[Prediction, ...]:
    """One prediction per drafter, from its deepest fixed-k configuration (else its auto one)."""
    plain_cfg = next(c for c in configs if c.plain)
    plain_cells = [c for c in cells if c.config == plain_cfg.name]
    out: list[Prediction] = []
    for i, label in enumerate(labels):
        alone = [c for c in configs if c.drafters == (i,)]
        fixed = [c for c in alone if c.k is not None]
        source = max(fixed, key=lambda c: c.k or 0) if fixed else (alone[0] if alone else None)
        if source is None:
            continue
        pred = _prediction(label, source, [c for c in cells if c.config == source.name], plain_cells)
        if pred is not None:
            out.append(pred)
    return tuple(out)
