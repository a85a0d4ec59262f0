"""Cost curves for replay_planner.py: what a verify batch and a draft token cost on some hardware.

Accepted tokens under greedy bit-exact verification do not depend on the hardware, only the cost
does, so a recorded answer can be replayed under any machine's curve. Curves come from two places:

* data files in tests/perf/curves/*.json, each built from published llama-bench figures (its
  `sources` name the threads, its `notes` say what was interpolated or assumed): `throughput` maps a
  batch size n to tokens/second at that batch (pp_n, or pp512 at microbatch n), so V(n) = n / t/s;
  or `relative` maps n to V(n)/V(1) with `v1_seconds`. The draft's cost is `draft_throughput` (its
  one-token speed on the same machine) or `draft_ratio` (a list: one curve per value, when a source
  gave no figure and the cost is bracketed instead). Optional, in a curve measured by specchat's
  own calibration (tests/perf/device/run_device.py writes one): `catch_up_ratio` (the draft's
  catch-up per token as a share of its one-token cost), `tie_margin` and `exact_n` (that backend's
  greedy tie margin and bit-exact batch size, used for its replay instead of the recorded target's).
* the verify curves this machine's calibration cached (`$SPECCHAT_HOME/calibration.json`), measured,
  with the draft cost docs/performance.md measured for the default pair on this CPU.

Sizes between the given ones are interpolated linearly in V; past the last one V grows at its slope
over the upper half of the given sizes: for most sources that prices long drafts pessimistically
(a GPU's batch stays nearly flat for longer), which the notes say.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specchat import store
from specchat.decoding.calibration import K_MAX

CURVES_DIR = Path(__file__).resolve().parent / "curves"
#: docs/performance.md ("The draft model on this CPU"): a 0.5B draft token costs 0.55-0.6 of a
#: 1.5B Q4_K_M target token on this 2-core VM; the middle of that range
CPU_DRAFT_RATIO = 0.575


@dataclass(frozen=True, slots=True)
class Curve:
    """V(1..K_MAX+1) in seconds, the draft model's seconds per drafted token and per caught-up token."""

    name: str
    verify: list[float]
    draft: float
    catch_up: float
    source: str
    #: the greedy tie margin and bit-exact batch size measured with this curve (None: the replay's own)
    margin: float | None = None
    exact_n: int | None = None

    def shape(self) -> str:
        """V(2), V(4), V(8), V(16) as multiples of one token, and the draft's cost likewise."""
        v = self.verify
        sizes = ", ".join(f"V({n}) {v[n - 1] / v[0]:.2f}" for n in (2, 4, 8, 16))
        own = "" if self.exact_n is None else f"; exact <= {self.exact_n}, margin {self.margin or 0.0:.3g}"
        return f"{sizes}; draft {self.draft / v[0]:.2f}{own}"


def extend(points: dict[int, float], n_max: int = K_MAX + 1) -> list[float]:
    """V(1..n_max) from V at some sizes: linear in between, growing by the last step beyond."""
    sizes = sorted(points)
    out = []
    for n in range(1, n_max + 1):
        if n in points:
            out.append(points[n])
        elif n > sizes[-1]:
            # the slope over the upper half of the given sizes, not the last step alone: a kernel
            # switch can make one step near zero (the M2 Ultra's V(8) - V(7)), and a curve extended
            # flat from there would price 40-token drafts at one token
            last = sizes[-1]
            prev = min((s for s in sizes if s >= last / 2 and s < last), default=None)
            step = (points[last] - points[prev]) / (last - prev) if prev is not None else points[last]
            out.append(points[last] + step * (n - last))
        else:
            lo = max(s for s in sizes if s < n)
            hi = min(s for s in sizes if s > n)
            f = (n - lo) / (hi - lo)
            out.append(points[lo] + f * (points[hi] - points[lo]))
    return out


def from_file(path: Path) -> list[Curve]:
    """The curve(s) of one data file: one per draft cost it gives."""
    doc = json.loads(path.read_text())
    if "throughput" in doc:
        points = {int(n): int(n) / float(tps) for n, tps in doc["throughput"].items()}
    else:
        v1 = float(doc["v1_seconds"])
        points = {int(n): v1 * float(r) for n, r in doc["relative"].items()}
    verify = extend(points)
    if "draft_throughput" in doc:
        ratios = [1.0 / float(doc["draft_throughput"]) / verify[0]]
        labels = [""]
    else:
        ratios = [float(r) for r in doc["draft_ratio"]]
        labels = [f", draft {r:g}x (assumed)" if len(ratios) > 1 else "" for r in ratios]
    src = "; ".join(doc["sources"])
    margin = float(doc["tie_margin"]) if "tie_margin" in doc else None
    exact_n = int(doc["exact_n"]) if "exact_n" in doc else None
    out = []
    share = float(doc["catch_up_ratio"]) if "catch_up_ratio" in doc else catch_up_share(verify)
    for r, lab in zip(ratios, labels, strict=True):
        d = r * verify[0]
        out.append(Curve(doc["name"] + lab, verify, d, d * share, src, margin, exact_n))
    return out


def from_paths(paths: list[Path]) -> list[Curve]:
    """The curves of some data files, a folder standing for every *.json in it (file-name order)."""
    return [c for p in paths for f in (sorted(p.glob("*.json")) if p.is_dir() else [p]) for c in from_file(f)]


def catch_up_share(verify: list[float]) -> float:
    """A draft model's catch-up per token, as a share of its one-token cost: calibration measures it
    in a 16-token batch, and no source gives a draft's batch curve, so the target's is taken for its
    shape (on this VM that gives 0.39-0.48, where calibration measured 0.39 for the draft itself)."""
    return verify[15] / 16 / verify[0]


def published() -> list[Curve]:
    """Every curve in tests/perf/curves/, in file-name order."""
    return [c for p in sorted(CURVES_DIR.glob("*.json")) for c in from_file(p)]


def measured_cpu(own: list[float] | None = None, *, cached: bool = True) -> list[Curve]:
    """This machine's calibrated verify curves (the own one first, then the others cached for a
    target of about the same one-token time, unless `cached` is off: then the own one alone, as a
    replay cache recorded it)."""
    curves: list[list[float]] = [own] if own else []
    cal = store.read_json(store.home() / "calibration.json") if cached else {}
    for k, v in sorted(cal.items()):
        if k.startswith("verify:") and isinstance(v, list) and len(v) == K_MAX + 1 and v not in curves:
            # another target's curve (the F16 stand-in's, a tiny test model's) is not this pair's:
            # its one-token time tells it apart, and the draft's cost below would be wrong for it
            if own and v[0] > 0 and not 0.5 <= own[0] / v[0] <= 2.0:
                continue
            curves.append(v)
    out = []
    for i, v in enumerate(curves):
        d = CPU_DRAFT_RATIO * v[0]
        out.append(Curve(f"this CPU, measured #{i + 1}", list(v), d, d * catch_up_share(v),
                         "calibration.json on this VM; draft cost docs/performance.md"))  # fmt: skip
    return out
