"""The tables of a run: one Cell per (prompt, configuration), one Summary per configuration."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .audit import first_difference
from .measure import Measurement
from .suite import Config

#: decimals a speedup (a ratio to plain decoding) keeps in the saved JSON; the report draws its cells
#: from the same rounded figure, so a table and `--save` never disagree in the last digit shown
RATIO_DECIMALS = 4


def saved_ratio(x: float | None) -> float | None:
    """A speedup as `--save` writes it (and the report shows it): rounded to RATIO_DECIMALS."""
    return None if x is None else round(x, RATIO_DECIMALS)


def rates(accepted: Sequence[int], drafted: Sequence[int]) -> tuple[float, ...]:
    return tuple(a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=False))


def sum_positions(rows: Sequence[Sequence[int]]) -> list[int]:
    out: list[int] = []
    for row in rows:
        if len(row) > len(out):
            out += [0] * (len(row) - len(out))
        for i, v in enumerate(row):
            out[i] += v
    return out


def geomean(values: Sequence[float]) -> float:
    """Geometric mean: the right average of ratios (a 2× and a 0.5× average to 1×)."""
    vals = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else 0.0


@dataclass(frozen=True, slots=True)
class Cell:
    """One (prompt, configuration): medians over repeats for speed, pooled counts for acceptance."""

    prompt: str
    config: str
    runs_tokens_per_second: tuple[float, ...]
    tokens_per_second: float  # median over repeats
    decode_seconds: float  # median over repeats
    generated_tokens: int  # median over repeats
    decode_seconds_total: float
    speedup: float | None  # tokens_per_second / plain's, same prompt, same run
    drafted: int
    accepted: int
    target_passes: int
    generated_total: int
    k_total: int
    draft_seconds: float
    drafted_by_position: tuple[int, ...]
    accepted_by_position: tuple[int, ...]
    matches_plain: bool | None  # None for plain itself
    first_divergence: int | None
    vs_best_fixed: float | None = None  # auto only: tok/s ÷ the best of plain and fixed k of its drafters
    best_fixed: str | None = None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.generated_total / self.target_passes if self.target_passes else 0.0

    @property
    def mean_k(self) -> float:
        return self.k_total / self.target_passes if self.target_passes else 0.0

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        return rates(self.accepted_by_position, self.drafted_by_position)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "config": self.config,
            "tokens_per_second": round(self.tokens_per_second, 3),
            "runs_tokens_per_second": [round(v, 3) for v in self.runs_tokens_per_second],
            "decode_seconds": round(self.decode_seconds, 6),
            "generated_tokens": self.generated_tokens,
            "speedup": saved_ratio(self.speedup),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_pass": round(self.tokens_per_pass, 4),
            "mean_k": round(self.mean_k, 3),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "target_passes": self.target_passes,
            "acceptance_by_position": [round(r, 4) for r in self.acceptance_by_position],
            "drafted_by_position": list(self.drafted_by_position),
            "matches_plain": self.matches_plain,
            "first_divergence": self.first_divergence,
            "vs_best_fixed": saved_ratio(self.vs_best_fixed),
            "best_fixed": self.best_fixed,
        }


def make_cell(
    prompt: str, cfg: Config, runs: Sequence[Measurement], plain_tokens: tuple[int, ...] | None
) -> Cell:
    speeds = tuple(m.stats.tokens_per_second for m in runs)
    diffs = [first_difference(m.tokens, plain_tokens) for m in runs] if plain_tokens is not None else []
    found = [d for d in diffs if d is not None]
    return Cell(
        prompt=prompt,
        config=cfg.name,
        runs_tokens_per_second=speeds,
        tokens_per_second=statistics.median(speeds),
        decode_seconds=statistics.median(m.stats.decode_seconds for m in runs),
        generated_tokens=int(statistics.median(m.stats.generated_tokens for m in runs)),
        decode_seconds_total=sum(m.stats.decode_seconds for m in runs),
        speedup=None,
        drafted=sum(m.stats.drafted for m in runs),
        accepted=sum(m.stats.accepted for m in runs),
        target_passes=sum(m.stats.target_passes for m in runs),
        generated_total=sum(m.stats.generated_tokens for m in runs),
        k_total=sum(sum(m.stats.k_history) for m in runs),
        draft_seconds=sum(d.seconds for m in runs for d in m.stats.drafters),
        drafted_by_position=tuple(sum_positions([m.stats.drafted_by_position for m in runs])),
        accepted_by_position=tuple(sum_positions([m.stats.accepted_by_position for m in runs])),
        matches_plain=None if cfg.plain or plain_tokens is None else not found,
        first_divergence=min(found) if found else None,
    )


@dataclass(frozen=True, slots=True)
class Summary:
    """One configuration across all prompts."""

    config: str
    geomean_speedup: float
    worst_speedup: float
    worst_prompt: str
    median_tokens_per_second: float
    acceptance_rate: float
    tokens_per_pass: float
    mean_k: float
    acceptance_by_position: tuple[float, ...]
    worst_vs_best_fixed: float | None
    geomean_vs_best_fixed: float | None

    def to_dict(self) -> dict[str, Any]:
        def r(v: float | None, n: int = RATIO_DECIMALS) -> float | None:
            return None if v is None else round(v, n)

        return {
            "config": self.config,
            "geomean_speedup": r(self.geomean_speedup),
            "worst_speedup": r(self.worst_speedup),
            "worst_prompt": self.worst_prompt,
            "median_tokens_per_second": r(self.median_tokens_per_second, 3),
            "acceptance_rate": r(self.acceptance_rate),
            "tokens_per_pass": r(self.tokens_per_pass),
            "mean_k": r(self.mean_k, 3),
            "acceptance_by_position": [round(v, 4) for v in self.acceptance_by_position],
            "worst_vs_best_fixed": r(self.worst_vs_best_fixed),
            "geomean_vs_best_fixed": r(self.geomean_vs_best_fixed),
        }


def summarize(cfg: Config, cells: Sequence[Cell]) -> Summary:
    speedups = [(c.speedup, c.prompt) for c in cells if c.speedup is not None]
    worst = min(speedups) if speedups else (0.0, "")
    passes = sum(c.target_passes for c in cells)
    vs = [c.vs_best_fixed for c in cells if c.vs_best_fixed is not None]
    return Summary(
        config=cfg.name,
        geomean_speedup=geomean([s for s, _ in speedups]),
        worst_speedup=worst[0],
        worst_prompt=worst[1],
        median_tokens_per_second=statistics.median(c.tokens_per_second for c in cells) if cells else 0.0,
        acceptance_rate=(sum(c.accepted for c in cells) / max(1, sum(c.drafted for c in cells))),
        tokens_per_pass=sum(c.generated_total for c in cells) / passes if passes else 0.0,
        mean_k=sum(c.k_total for c in cells) / passes if passes else 0.0,
        acceptance_by_position=rates(
            sum_positions([c.accepted_by_position for c in cells]),
            sum_positions([c.drafted_by_position for c in cells]),
        ),
        worst_vs_best_fixed=min(vs) if vs else None,
        geomean_vs_best_fixed=geomean(vs) if vs else None,
    )
