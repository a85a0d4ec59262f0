"""What the planner tells a user: a draft model's acceptance too low to pay (acceptance_advice), and
the cost model it plans with (calibration_report, for `--verbose`). Apart from planner.py, which
decides; this only reads what it learned."""

from __future__ import annotations

from collections.abc import Sequence

from .events import Stats
from .loop import Planner
from .planner import AutoPlanner

#: a draft model accepted less often than this is a poor match for its target
LOW_ACCEPTANCE = 0.4


def acceptance_advice(
    stats: Stats, model_drafters: Sequence[str], target: str, *, min_drafted: int = 24
) -> str | None:
    """One line for the user when a draft model's acceptance stays low: a draft of another family
    or generation agrees with the target too rarely to ever pay, and a same-family one usually
    does far better (llama.cpp's users see the same: acceptance, not draft speed, decides)."""
    for d in stats.drafters:
        if d.name in model_drafters and d.drafted >= min_drafted and d.acceptance_rate < LOW_ACCEPTANCE:
            return (
                f"the draft {d.name} agreed with the target on only {d.acceptance_rate:.0%} of its tokens; "
                f"a same-family draft usually does much better: specchat models --drafts-for {target}"
            )
    return None


def calibration_report(planner: Planner) -> list[str]:
    """What `--verbose` says about the cost model: what calibration had to do, and the verify curve
    it plans with (as multiples of one token), so a user can see why auto drafts as far as it does."""
    if not isinstance(planner, AutoPlanner):
        return []
    costs = planner.costs
    v1 = costs.v(1)
    sizes = [n for n in (2, 3, 4, 8, 16, 32, 49) if n <= len(costs.verify)]
    curve = ", ".join(f"V({n}) {costs.v(n) / v1:.2f}x" for n in sizes)
    lines = [
        *costs.notes,
        f"cost model: V(1) {v1 * 1000:.1f} ms, {curve}; bit-exact up to {costs.exact_n} rows",
    ]
    drafts = [f"{c / v1:.2f}x" for c, free in zip(costs.draft, planner.model_free, strict=True) if not free]
    if drafts:
        lines.append(f"cost model: a draft-model token costs {', '.join(drafts)} of a target token")
    return lines
