"""One timed generation from empty caches, and the planners `specchat run` would build for it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..decoding.calibration import trees_exact
from ..decoding.drafters import Drafter
from ..decoding.events import Done, Stats, Token
from ..decoding.loop import FixedK, Planner, Settings, generate
from ..decoding.model import Model
from ..decoding.sampling import SamplingParams
from .suite import Config


@dataclass(frozen=True, slots=True)
class _Pair:
    """What `decoding.planner.make_planner` reads: a target and the drafters the planner chooses among."""

    target: Model
    drafters: list[Drafter]
    strict: bool = False
    backend: str = ""
    verified_rows: int = 0


def planner_factory(
    target: Model, drafters: Sequence[Drafter], *, strict: bool = False, backend: str = "", verified: int = 0
) -> Callable[[Config], Planner]:
    """Fresh planners per generation, built exactly as `specchat run` builds them.

    Auto planners come from `decoding.planner.make_planner` (calibrated costs, cached on disk after the first
    call), so the benchmark measures what users get; a fresh one per generation keeps what it learns
    about one prompt from leaking into the next measurement.
    """
    from ..decoding.planner import make_planner

    def make(cfg: Config) -> Planner:
        if cfg.plain:
            return FixedK(0)
        if cfg.k is not None:
            return FixedK(cfg.k)
        pair = _Pair(target, [drafters[i] for i in cfg.drafters], strict or cfg.strict, backend, verified)
        return make_planner(pair, None)

    return make


@dataclass(frozen=True, slots=True)
class Measurement:
    """One timed generation."""

    prompt: str
    config: str
    repeat: int
    tokens: tuple[int, ...]
    stats: Stats


def _reset(target: Model, drafters: Sequence[Drafter]) -> None:
    """Empty every cache, so each generation pays for its own prompt and nothing is reused."""
    target.truncate(0)
    for d in drafters:
        d.reset()  # a draft model's cache, and whatever a model-free drafter learned from the text


def generate_once(
    target: Model,
    drafters: Sequence[Drafter],
    cfg: Config,
    tokens: Sequence[int],
    planner: Planner,
    max_tokens: int,
    tie_margin: float = 0.0,
    exact_rows: int = 0,
    strict: bool = False,
) -> tuple[tuple[int, ...], Stats]:
    """One greedy generation from empty caches: (output tokens, stats)."""
    _reset(target, drafters)
    out: list[int] = []
    stats: Stats | None = None
    events = generate(
        target,
        list(tokens),
        drafters=[drafters[i] for i in cfg.drafters],
        planner=planner,
        settings=Settings(
            max_tokens=max_tokens,
            params=SamplingParams(temperature=0.0),
            tie_margin=tie_margin,
            exact_rows=exact_rows,
            exact_trees=trees_exact(exact_rows),
            strict=strict or cfg.strict,
        ),
        rng=np.random.default_rng(0),
    )
    for ev in events:
        if isinstance(ev, Token):
            out.append(ev.id)
        elif isinstance(ev, Done):
            stats = ev.stats
    assert stats is not None  # generate always ends with Done
    return tuple(out), stats
