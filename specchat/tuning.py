"""Cost-model auto-tuning: per round, draft only as far as it pays — or not at all.

Speculation pays only when a verify batch of n tokens costs the target little more than one token
and the draft is cheap and often right. On a laptop GPU / Apple Silicon V(n) ≈ V(1) and drafting
wins; on a 2-core CPU V(6) ≈ 3.3·V(1) and a draft model loses. So we measure instead of guessing:

* Calibration (once per model file + hardware + settings, cached on disk): the target's verify cost
  V(n) for n = 1..k_max+1, and each draft model's cost per drafted token.
* Exactness (same cache): the largest verify batch whose logits are bit-identical to one-token
  decoding; auto mode drafts no further than that, so greedy output is the target's own bit for bit.
* Online: per drafter, the conditional acceptance rate at each draft position (P(draft i accepted |
  drafts before it accepted)), as decayed Beta counts so it follows the text's character; measured
  round times refine V(n) and the draft cost as generation goes.
* Each round, for each drafter and each k in 0..k_max, expected tokens per second
      E(k) / (cost_draft(k) + V(k+1)),   E(k) = 1 + Σ_{j≤k} Π_{i≤j} α_i
  (E reduces to (1 − α^(k+1))/(1 − α) when all α_i are equal; per-position rates are better because
  acceptance falls with depth). k = 0 is plain decoding at 1/V(1). The α_i are drawn from their Beta
  posteriors (Thompson sampling), so a drafter that starts doing well gets tried again, while one that
  cannot win even if always right (checked with α = 1) is never tried on this hardware.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .events import Round
from .model import Model

K_MAX = 8
DECAY = 0.97  # per observed round: ~33 rounds of memory
EMA = 0.1  # weight of a new timing measurement


@dataclass(slots=True)
class Costs:
    """Seconds: verify[n-1] = V(n) for n = 1..len(verify); draft[i] = drafter i's cost per drafted token."""

    verify: list[float]
    draft: list[float]
    #: largest verify batch whose logits are bit-identical to one-token decoding (0 = not measured)
    exact_n: int = 0

    def v(self, n: int) -> float:
        if n <= len(self.verify):
            return self.verify[n - 1]
        # beyond what was measured: extend linearly with the last measured step
        last = self.verify[-1]
        step = last - self.verify[-2] if len(self.verify) > 1 else last
        return last + step * (n - len(self.verify))


@dataclass(slots=True)
class _Acceptance:
    """Decayed Beta counts of conditional acceptance per draft position."""

    prior_a: float
    prior_b: float
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)

    def observe(self, drafted: int, accepted: int) -> None:
        for i in range(len(self.a)):
            self.a[i] *= DECAY
            self.b[i] *= DECAY
        while len(self.a) < drafted:
            self.a.append(0.0)
            self.b.append(0.0)
        for i in range(accepted):
            self.a[i] += 1.0
        if accepted < drafted:
            self.b[accepted] += 1.0

    def rates(self, k: int, rng: np.random.Generator | None) -> list[float]:
        out = []
        for i in range(k):
            j = min(i, len(self.a) - 1)
            a = self.prior_a + (self.a[j] if j >= 0 else 0.0)
            b = self.prior_b + (self.b[j] if j >= 0 else 0.0)
            out.append(float(rng.beta(a, b)) if rng is not None else a / (a + b))
        return out


def expected_tokens(rates: Sequence[float]) -> float:
    """Tokens a round yields with these conditional acceptance rates: the accepted prefix + 1."""
    total, run = 1.0, 1.0
    for r in rates:
        run *= r
        total += run
    return total


def best_k(rates: Sequence[float], v: list[float], draft_cost: float) -> tuple[int, float]:
    """(k, tokens/second) maximising E(k)/(k·draft_cost + V(k+1)); k = 0 is plain decoding."""
    best, best_speed = 0, 1.0 / v[0]
    for k in range(1, len(rates) + 1):
        speed = expected_tokens(rates[:k]) / (k * draft_cost + v[k])
        if speed > best_speed:
            best, best_speed = k, speed
    return best, best_speed


class AutoPlanner:
    """Chooses (drafter, k) per round from measured costs and online acceptance.

    Acceptance is tracked per drafter *and route* (the drafter's class for this round's context, e.g.
    how long the n-gram match is), each route starting from its drafter's prior: that is the routing
    by context -- the same drafter is trusted with long drafts where it has been right and left idle
    where it has not, and among several drafters each round goes to the one whose route pays best.
    """

    def __init__(
        self,
        costs: Costs,
        priors: Sequence[tuple[float, float]],
        *,
        k_max: int = K_MAX,
        rng: np.random.Generator | None = None,
        explore: bool = True,
        learn_costs: bool = True,
    ) -> None:
        self.costs = costs
        # keep verify batches where they are bit-identical to one-token decoding, when some are
        self.k_max = min(k_max, costs.exact_n - 1) if costs.exact_n >= 2 else k_max
        self.priors = list(priors)
        self.acc: dict[tuple[int, str | None], _Acceptance] = {}
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.explore = explore
        self.learn_costs = learn_costs  # off under --seed: timing noise must not change the choices
        self.last_choice: tuple[int | None, int] = (None, 0)

    def acceptance(self, drafter: int, route: str | None) -> _Acceptance:
        """The decayed acceptance counts of one drafter on one route (created from its prior)."""
        key = (drafter, route)
        found = self.acc.get(key)
        if found is None:
            found = self.acc[key] = _Acceptance(*self.priors[drafter])
        return found

    def _verify_curve(self, k_max: int) -> list[float]:
        return [self.costs.v(n) for n in range(1, k_max + 2)]

    def can_pay(self, drafter: int) -> bool:
        """Whether this drafter could beat plain decoding even if every draft were accepted."""
        v = self._verify_curve(self.k_max)
        k, _ = best_k([1.0] * self.k_max, v, self.costs.draft[drafter])
        return k > 0

    def may_use(self, drafter: int) -> bool:
        return self.can_pay(drafter)

    def explain(self, names: Sequence[str]) -> str | None:
        """Why auto mode is not drafting at all, when no drafter could ever pay on this hardware."""
        if any(self.can_pay(i) for i in range(len(self.priors))):
            return None
        v1, v4 = self.costs.v(1), self.costs.v(4)
        return (
            f"-k auto: drafting with {', '.join(names)} cannot beat plain decoding on this hardware "
            f"(a verify batch of 4 costs {v4 / v1:.1f}x one token), so it decoded plainly; "
            "-k N forces drafting"
        )

    def plan(self, max_k: int, routes: Sequence[str | None]) -> tuple[int | None, int]:
        k_cap = min(self.k_max, max_k)
        self.last_choice = (None, 0)
        if k_cap <= 0:
            return self.last_choice
        v = self._verify_curve(k_cap)
        best_speed = 1.0 / v[0]
        for i, route in enumerate(routes):
            if route is None or not self.can_pay(i):
                continue
            rates = self.acceptance(i, route).rates(k_cap, self.rng if self.explore else None)
            k, speed = best_k(rates, v, self.costs.draft[i])
            if k > 0 and speed > best_speed:
                self.last_choice, best_speed = (i, k), speed
        return self.last_choice

    def observe(self, rnd: Round, drafter: int | None) -> None:
        proposed = rnd.drafted if rnd.proposed is None else rnd.proposed
        n = proposed + 1  # the verify batch: a rejection early in it does not make it cheaper
        verify_s = rnd.seconds - rnd.draft_seconds
        if self.learn_costs and n <= len(self.costs.verify) and verify_s > 0:
            self.costs.verify[n - 1] += EMA * (verify_s - self.costs.verify[n - 1])
        if drafter is None:
            return
        self.acceptance(drafter, rnd.route).observe(rnd.drafted, rnd.accepted)
        if self.learn_costs and proposed > 0 and rnd.draft_seconds > 0:
            per = rnd.draft_seconds / proposed
            self.costs.draft[drafter] += EMA * (per - self.costs.draft[drafter])


# --- calibration ------------------------------------------------------------------------------------


def _median_time(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_verify(model: Model, n_max: int, *, reps: int = 3, filler: int = 16) -> list[float]:
    """V(n) for n = 1..n_max: seconds to decode n tokens with logits for all n rows."""
    base = list(model.tokens)
    probe = [t % model.n_vocab for t in range(100, 100 + filler + n_max)]
    if not base:
        model.decode(probe[:filler], [])
    start = len(model.tokens)
    out = []
    for n in range(1, n_max + 1):
        toks = probe[filler : filler + n]

        def step(toks: list[int] = toks) -> None:
            model.decode(toks, list(range(len(toks))))
            model.truncate(start)

        step()  # warm-up: first use of a batch size allocates buffers
        out.append(_median_time(step, reps))
    model.truncate(len(base))
    # a longer batch never costs less than a shorter one; smooth out timer noise
    for i in range(1, len(out)):
        out[i] = max(out[i], out[i - 1])
    return out


def exact_batch(model: Model, n_max: int, *, filler: int = 16) -> int:
    """Largest n <= n_max for which decoding n tokens in one batch gives exactly the logits of decoding
    them one at a time. Backends switch matmul kernels by batch size (llama.cpp's CPU backend: at 4
    rows with repacked weights, at 8 without), and only below the switch is greedy speculation
    bit-for-bit the target's own one-token output. Returns 1 when no batch is exact (most GPUs)."""
    base = list(model.tokens)
    probe = [t % model.n_vocab for t in range(200, 200 + filler + n_max)]
    if not base:
        model.decode(probe[:filler], [])
    start = len(model.tokens)
    toks = probe[filler : filler + n_max]
    singles = np.stack([np.array(model.decode([t], [0])[0], copy=True) for t in toks])
    model.truncate(start)
    exact = 1
    for n in range(2, n_max + 1):
        rows = np.array(model.decode(toks[:n], list(range(n))), copy=True)
        model.truncate(start)
        if not np.array_equal(rows, singles[:n]):
            break
        exact = n
    model.truncate(len(base))
    return exact


def batch_noise(model: Model, *, contexts: Sequence[int] = (300, 600), n: int = 4) -> float:
    """Largest |batched − one-token| logit difference, over verify batches of n rows after contexts of
    the given lengths. Zero where the backend is bit-exact; on llama.cpp's multi-threaded CPU backend
    it is not once the KV cache reaches 512 cells (its flash attention splits the KV across threads
    for a single query row only), and GPUs use other kernels for batches than for one row.

    Leaves the cache empty: call it right after loading."""
    model.truncate(0)
    lengths = sorted({max(1, min(c, model.n_ctx - n - 1)) for c in contexts})
    probe = [(i * 7919) % max(1, model.n_vocab - 16) + 8 for i in range(lengths[-1] + n)]
    worst = 0.0
    for length in lengths:
        model.decode(probe[len(model.tokens) : length], [])
        nxt = probe[length : length + n]
        singles = np.stack([np.array(model.decode([t], [0])[0], copy=True) for t in nxt])
        model.truncate(length)
        rows = np.array(model.decode(nxt, list(range(n))), copy=True)
        model.truncate(length)
        worst = max(worst, float(np.abs(rows - singles).max()))
    model.truncate(0)
    return worst


def exact_rows(target: Model, *, k_max: int = K_MAX, backend: str = "", use_cache: bool = True) -> int:
    """`exact_batch` for this target, from the calibration cache when measured before."""
    return _cached(  # type: ignore[no-any-return]
        "exact:" + _key(target, f"{backend}:{k_max}"),
        lambda v: isinstance(v, int),
        lambda: exact_batch(target, k_max + 1),
        use_cache,
    )


def tie_margin(target: Model, *, backend: str = "", use_cache: bool = True) -> float:
    """The greedy tie margin for `Settings.tie_margin`: a top-2 gap that batched-vs-one-token rounding
    cannot overturn. Each logit moves by at most the measured noise, so a gap moves by at most twice
    that. Measured once per model file and machine, like the costs."""
    noise = _cached(
        "noise:" + _key(target, backend),
        lambda v: isinstance(v, float),
        lambda: batch_noise(target),
        use_cache,
    )
    return 2.0 * float(noise)


def measure_draft(model: Model, *, reps: int = 5) -> float:
    """Seconds per drafted token: one single-token decode with one logits row."""
    v = measure_verify(model, 1, reps=reps)
    return v[0]


def _cache_file() -> Path:
    home = os.environ.get("SPECCHAT_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specchat"
    )
    return Path(home) / "calibration.json"


def _read_cache(path: Path) -> dict[str, object]:
    """The calibration file's measurements; a missing or damaged file just means measuring again."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, cache: dict[str, object]) -> None:
    """Replace the calibration file atomically; a read-only cache only costs a re-measurement."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(path)
    except OSError:
        pass


def _cached(key: str, valid: Callable[[object], bool], measure: Callable[[], object], use_cache: bool) -> Any:
    """One calibration measurement: from the on-disk cache when a valid value is there, else measured
    now (and stored, unless use_cache is off)."""
    path = _cache_file()
    cache = _read_cache(path) if use_cache else {}
    value = cache.get(key)
    if not valid(value):
        value = measure()
        if use_cache:
            cache[key] = value
            _write_cache(path, cache)
    return value


def _key(model: object, extra: str) -> str:
    """Identity of a measurement: file (path, size, mtime), threads, offload, build, machine."""
    path = getattr(model, "path", None)
    parts = [extra, platform.machine(), platform.processor(), str(os.cpu_count())]
    if path is not None:
        st = Path(path).stat()
        parts += [str(Path(path).resolve()), str(st.st_size), str(int(st.st_mtime))]
    parts += [str(getattr(model, name, "")) for name in ("threads", "gpu_layers", "repack", "type_v")]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def calibrate(
    target: Model,
    draft_models: Sequence[Model | None],
    *,
    k_max: int = K_MAX,
    backend: str = "",
    use_cache: bool = True,
) -> Costs:
    """Measured costs, from the on-disk cache when the same files/hardware were measured before."""
    n = k_max + 1
    verify = _cached(
        "verify:" + _key(target, f"{backend}:{k_max}"),
        lambda v: isinstance(v, list) and len(v) == n,
        lambda: measure_verify(target, n),
        use_cache,
    )
    exact_n = exact_rows(target, k_max=k_max, backend=backend, use_cache=use_cache)
    draft: list[float] = []
    for dm in draft_models:
        if dm is None:  # a model-free drafter: its cost is measured online and is ~0
            draft.append(0.0)
            continue
        draft.append(
            _cached(
                "draft:" + _key(dm, backend),
                lambda v: isinstance(v, float),
                lambda dm=dm: measure_draft(dm),
                use_cache,
            )
        )
    return Costs(verify=[float(x) for x in verify], draft=draft, exact_n=exact_n)


def make_planner(loaded: object, k: int | None, *, seed: int | None = None):  # type: ignore[no-untyped-def]
    """FixedK for `-k N`, the cost-model AutoPlanner for `-k auto`.

    With a seed, the planner's choices must not depend on timing (they decide how the sampler's random
    stream is consumed), so costs stay at their cached calibration and exploration uses the seed.
    """
    from .drafters import ModelDrafter
    from .engine import backend_info
    from .speculative import FixedK

    drafters = getattr(loaded, "drafters", [])
    if k is not None or not drafters:
        return FixedK(k if k is not None else 0)
    models = [d.model if isinstance(d, ModelDrafter) else None for d in drafters]
    costs = calibrate(loaded.target, models, backend=str(backend_info().get("system_info", "")))  # type: ignore[attr-defined]
    priors = [(3.0, 2.0) if m is not None else (1.0, 1.0) for m in models]
    return AutoPlanner(costs, priors, rng=np.random.default_rng(seed), learn_costs=seed is None)
