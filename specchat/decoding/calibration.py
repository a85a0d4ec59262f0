"""Calibration: what speculation costs on this machine, measured once and cached.

The target's verify cost V(n) (sizes 1-9, 12, 16, 24, 32, 49, interpolated between), each draft
model's cost per drafted token and per token of catching up, the largest verify batch that is
bit-identical to one-token decoding, and the batched-vs-one-token rounding noise that sets the
greedy tie margin. Cached per model file + threads + offload + build in
`store.home()/calibration.json`; a measurement disturbed by other load is repeated and never cached,
and a cached curve that a quick live check contradicts is measured again. planner.py plans with it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import store
from .model import Model

K_MAX = 48  # drafts per round at most: long copies (whole-file rewrites) pay up to ~48 on a CPU
#: verify batch sizes calibration measures; V(n) between them is interpolated (measuring all 49
#: would take a minute on a 2-core CPU). Every size is measured up to 9, where llama.cpp's CPU
#: backend switches kernels (4 rows with repacked weights, 8 without); beyond that its curve steps
#: (repacked GEMM in 4-row blocks: V(16) below both V(15) and V(17) on the default pair), which
#: interpolation smooths over: some accuracy past 9 rows traded for a calibration of seconds
VERIFY_SIZES: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 49)
#: batch size whose per-token cost prices a draft model's catching up (Drafter.lag)
CATCH_UP_BATCH = 16


@dataclass(slots=True)
class Costs:
    """Seconds: verify[n-1] = V(n) for n = 1..len(verify); draft[i] = drafter i's cost per drafted token."""

    verify: list[float]
    draft: list[float]
    #: largest verify batch whose logits are bit-identical to one-token decoding (0 = not measured)
    exact_n: int = 0
    #: what calibration had to do (re-measure a noisy run, refresh a stale cache): for --verbose
    notes: list[str] = field(default_factory=list)
    #: per drafter, seconds per token of catching its cache up in one batch (0: nothing to catch up)
    catch_up: list[float] = field(default_factory=list)

    def v(self, n: int) -> float:
        if n <= len(self.verify):
            return self.verify[n - 1]
        # beyond what was measured: extend linearly with the last measured step
        last = self.verify[-1]
        step = last - self.verify[-2] if len(self.verify) > 1 else last
        return last + step * (n - len(self.verify))


#: worst median/min ratio minus one among a calibration's timings above which the machine is taken
#: to be busy (a quiet machine's repeats agree within a few percent; another llama.cpp process on the
#: same cores spreads them by far more than this)
NOISY = 0.25
#: a cached curve this much slower than a quick live re-measurement was taken on a busy machine
STALE = 1.3


def _step_time(model: Model, toks: Sequence[int], start: int, last_only: bool = False) -> float:
    t = time.perf_counter()
    model.decode(toks, [len(toks) - 1] if last_only else list(range(len(toks))))
    elapsed = time.perf_counter() - t
    model.truncate(start)
    return elapsed


def _interpolate(points: dict[int, float], n_max: int) -> list[float]:
    """V(1..n_max) from the measured sizes, linear in between (and flat past the last one)."""
    sizes = sorted(points)
    out = []
    for n in range(1, n_max + 1):
        lo = max((s for s in sizes if s <= n), default=sizes[0])
        hi = min((s for s in sizes if s >= n), default=sizes[-1])
        if lo == hi:
            out.append(points[lo])
        else:
            f = (n - lo) / (hi - lo)
            out.append(points[lo] + f * (points[hi] - points[lo]))
    return out


def time_verify(
    model: Model,
    n_max: int,
    *,
    reps: int = 3,
    filler: int = 16,
    sizes: Sequence[int] = VERIFY_SIZES,
    last_only: bool = False,
) -> tuple[list[float], float]:
    """(V(1..n_max), spread): seconds to decode n tokens with logits for all n rows (`last_only`: for
    the last row alone, as a catch-up or a prompt is decoded).

    Sizes are measured in interleaved passes (ascending, then descending, ...) and each keeps its
    fastest time: a burst of load hits one pass of one size rather than a whole stretch of the curve,
    and the minimum is what the kernels cost on a quiet machine. `spread` (the worst median/min − 1)
    says how disturbed the measurement was. No smoothing: a bigger batch really can cost less than a
    smaller one where the backend switches to a faster kernel (llama.cpp's repacked CPU GEMM from 4
    rows), and that dip is exactly what the planner must see."""
    base = list(model.tokens)
    probe = [t % model.n_vocab for t in range(100, 100 + filler + n_max)]
    if not base:
        model.decode(probe[:filler], [])
    start = len(model.tokens)
    model.checkpoint()  # every size is taken back to `start` (a recurrent model keeps its state here)
    points = sorted({n for n in sizes if n <= n_max} | {1, n_max})
    times: dict[int, list[float]] = {n: [] for n in points}
    for n in points:  # warm-up: the first use of a batch size allocates buffers
        _step_time(model, probe[filler : filler + n], start, last_only)
    for r in range(reps):
        for n in points if r % 2 == 0 else reversed(points):
            times[n].append(_step_time(model, probe[filler : filler + n], start, last_only))
    model.truncate(len(base))
    best = {n: max(min(ts), 1e-9) for n, ts in times.items()}
    spread = max(statistics.median(ts) / best[n] - 1.0 for n, ts in times.items())
    return _interpolate(best, n_max), spread


def measure_verify(model: Model, n_max: int, *, reps: int = 3, filler: int = 16) -> list[float]:
    """V(n) for n = 1..n_max (see time_verify)."""
    return time_verify(model, n_max, reps=reps, filler=filler)[0]


def measure_verify_quietly(
    model: Model, n_max: int, notes: list[str], attempts: int = 3
) -> tuple[list[float], bool]:
    """(curve, trustworthy): measure again while the timings say the machine is busy.

    A curve measured under load would be cached and would keep auto mode from drafting on a quiet
    machine later; so a disturbed one is re-measured, and one that stays disturbed is used for this
    run only (not cached)."""
    best: tuple[list[float], float] | None = None
    for attempt in range(attempts):
        curve, spread = time_verify(model, n_max)
        if spread <= NOISY:
            return curve, True
        notes.append(
            f"calibration: verify timings disturbed (spread {spread:.0%}, attempt {attempt + 1}/{attempts}); "
            "is something else running?"
        )
        if best is None or spread < best[1]:
            best = (curve, spread)
    assert best is not None
    notes.append("calibration: the machine stayed busy; using the least disturbed curve for this run only")
    return best[0], False


#: batch sizes a cached curve is checked at (cached_curve_is_stale): one token, and two batches that
#: llama.cpp's CPU kernels run differently (4: the repacked K-quant GEMM's first size; 8: two float
#: verify tiles where AVX2 builds take them, past one where AVX512 builds do)
STALE_SIZES = (1, 4, 8)


def cached_curve_is_stale(model: Model, cached: Sequence[float]) -> bool:
    """Whether a cached verify curve was measured on a busier machine than this one is now: a quick
    live V(1), V(4) and V(8) (fastest of 3) run well below it. (The other way round -- the machine
    busy now -- is left to the live rounds, which rescale the curve as they go.)

    V(8) is checked as well because a disturbance can spare the small batches and inflate the larger
    ones: an F16 target's curve cached at V(5..9) of 3.5-4.4 one-token times (1.9-2.8 idle) passed a
    check of V(1) and V(4) alone, priced every draft of 4 or more out, and live rounds never measure
    a batch size the planner never chooses, so nothing corrected it."""
    sizes = [n for n in STALE_SIZES if n <= len(cached)]
    live, _ = time_verify(model, max(sizes), reps=3, sizes=sizes)
    # (a millisecond floor: timer noise on sub-millisecond decodes says nothing about load)
    return any(cached[n - 1] > STALE * live[n - 1] and cached[n - 1] - live[n - 1] > 1e-3 for n in sizes)


def exact_batch(model: Model, n_max: int, *, filler: int = 16, widths: Sequence[int] | None = None) -> int:
    """Largest n <= n_max for which decoding n tokens in one batch gives exactly the logits of decoding
    them one at a time. Backends switch matmul kernels by batch size (stock llama.cpp's CPU backend: at
    4 rows with repacked weights, at 8 without), and only below the switch is greedy speculation
    bit-for-bit the target's own one-token output. Returns 1 when no batch is exact (most GPUs).

    `widths` (ascending) checks only those batch sizes, up to the first that parts: a build whose
    invariance probe covered every size needs only a few on the real target to confirm it."""
    base = list(model.tokens)
    probe = [t % model.n_vocab for t in range(200, 200 + filler + n_max)]
    if not base:
        model.decode(probe[:filler], [])
    start = len(model.tokens)
    model.checkpoint()
    toks = probe[filler : filler + n_max]
    singles = np.stack([np.array(model.decode([t], [0])[0], copy=True) for t in toks])
    model.truncate(start)
    exact = 1
    for n in widths if widths is not None else range(2, n_max + 1):
        if n > n_max:
            break
        rows = np.array(model.decode(toks[:n], list(range(n))), copy=True)
        model.truncate(start)
        if not np.array_equal(rows, singles[:n]):
            break
        exact = n
    model.truncate(len(base))
    return exact


#: KV lengths the tie margin's noise is measured after (each clipped to the context): one on each
#: side of every kernel bucket llama.cpp's backends key on the KV length. Stock CPU flash attention
#: splits a single row's KV across threads from 512 cells (300 / 600); Metal's vec kernel takes its
#: lane split from a per-GPU table from 1,024 and again from 4,096 cells (ggml-metal-tuning.h), and
#: CUDA's flash attention changes kernels and splits from 4,096 cells (ggml-cuda/fattn.cu). Rounding
#: differences also grow with the cells summed, so the long lengths bound a long conversation too.
NOISE_CONTEXTS: tuple[int, ...] = (300, 600, 1024, 4096)


def noise_lengths(n_ctx: int, contexts: Sequence[int] = NOISE_CONTEXTS, batch: int = 16) -> list[int]:
    """The context lengths batch_noise decodes verify batches after: `contexts` clipped so that a batch
    of `batch` rows still fits in the context, each once, ascending."""
    return sorted({max(1, min(c, n_ctx - batch - 1)) for c in contexts})


def batch_noise(
    model: Model,
    *,
    contexts: Sequence[int] = NOISE_CONTEXTS,
    sizes: Sequence[int] = (4, 16),
    drift: int = 32,
) -> float:
    """Largest |batched − one-token| logit difference, over verify batches of the given sizes after
    contexts of the given lengths (NOISE_CONTEXTS: both sides of each backend's KV-length kernel
    buckets). Zero where the backend is bit-exact; on llama.cpp's CPU backend it is not from 4 rows
    with repacked weights (another GEMM kernel), nor once the KV cache reaches 512 cells (its flash
    attention splits the KV across threads for a single query row only), and GPUs use other kernels
    for batches than for one row, and other attention splits from 1,024 or 4,096 cells. Both a small
    and a long batch are measured, as auto mode verifies long copies in batches of up to 49 rows, and
    so is drift: rows decoded after `drift` tokens whose K/V a long batch wrote, against one-token
    decoding of everything.

    Cost: prefilling to the longest length (up to 4,096 tokens, in the backend's big batches) plus
    max(sizes) one-token decodes and one batch per size at each length; measured once per model, build
    and machine (tie_margin caches it). Leaves the cache empty: call it right after loading."""
    model.truncate(0)
    n = max(sizes)
    lengths = noise_lengths(model.n_ctx, contexts, n)
    probe = [(i * 7919) % max(1, model.n_vocab - 16) + 8 for i in range(lengths[-1] + n)]
    worst = 0.0
    for length in lengths:
        model.decode(probe[len(model.tokens) : length], [])
        model.checkpoint()
        nxt = probe[length : length + n]
        singles = np.stack([np.array(model.decode([t], [0])[0], copy=True) for t in nxt])
        model.truncate(length)
        for size in sizes:
            rows = np.array(model.decode(nxt[:size], list(range(size))), copy=True)
            model.truncate(length)
            worst = max(worst, float(np.abs(rows - singles[:size]).max()))
    if drift > 0 and lengths[0] + drift + n < model.n_ctx:
        length = lengths[0]
        model.truncate(length)
        model.checkpoint()
        more = [(i * 104729) % max(1, model.n_vocab - 16) + 8 for i in range(drift + n)]
        clean = np.stack([np.array(model.decode([t], [0])[0], copy=True) for t in more])[drift:]
        model.truncate(length)
        for i in range(0, drift, n):  # the same tokens, their K/V written by long batches
            model.decode(more[i : min(i + n, drift)], [])
        model.checkpoint()
        for size in sizes:
            rows = np.array(model.decode(more[drift : drift + size], list(range(size))), copy=True)
            model.truncate(length + drift)
            worst = max(worst, float(np.abs(rows - clean[:size]).max()))
        one = np.array(model.decode(more[drift : drift + 1], [0])[0], copy=True)  # a single row, drifted
        worst = max(worst, float(np.abs(one - clean[0]).max()))
    model.truncate(0)
    return worst


#: exactness is probed up to this batch size on a build whose invariance was not shown
EXACT_PROBE = 16
#: the batch sizes that confirm on the loaded target what the build's invariance probe showed: each
#: kernel switch stock llama.cpp has (4, 8, 64 rows; FA tiles at 64) and the largest verify batch
CONFIRM_WIDTHS = (2, 3, 4, 5, 7, 8, 9, 16, 17, 32, 33, K_MAX + 1)


def exact_rows(
    target: Model, *, k_max: int = K_MAX, backend: str = "", use_cache: bool = True, verified: int = 0
) -> int:
    """`exact_batch` for this target, from the calibration cache when measured before.

    `verified`: the installed build's batch-invariance probe (llama.invariance, run by make install)
    showed every batch of up to this many rows exact for every weight type. When that covers the
    largest verify batch (k_max + 1), the loaded target confirms it at CONFIRM_WIDTHS -- its own
    weights, threads and backend (a GPU offload parts here) -- and, exact at all of them, every verify
    batch is trusted: k_max + 1 is returned. Otherwise it is measured row by row up to EXACT_PROBE."""
    if verified >= k_max + 1:
        wide = _cached(
            "exact-wide:" + _key(target, f"{backend}:{k_max + 1}"),
            lambda v: isinstance(v, int),
            lambda: exact_batch(target, k_max + 1, widths=sorted({*CONFIRM_WIDTHS, k_max + 1})),
            use_cache,
        )
        if wide >= k_max + 1:
            return int(wide)
    return _cached(  # type: ignore[no-any-return]
        "exact:" + _key(target, f"{backend}:{min(k_max + 1, EXACT_PROBE)}"),
        lambda v: isinstance(v, int),
        lambda: exact_batch(target, min(k_max + 1, EXACT_PROBE)),
        use_cache,
    )


def trees_exact(exact: int) -> bool:
    """Whether token-tree batches (decoding/tree.py) round like one-token decoding, given what
    `exact_rows` returned: only beyond what it measures itself (EXACT_PROBE), where the build's
    probe showed every verify batch exact, token trees included (llama/invariance.py)."""
    return exact > EXACT_PROBE


def tie_margin(target: Model, *, backend: str = "", use_cache: bool = True) -> float:
    """The greedy tie margin for `Settings.tie_margin`: a top-2 gap that batched-vs-one-token rounding
    cannot overturn. Each logit moves by at most the measured noise, so a gap moves by at most twice
    that. Measured once per model file and machine, like the costs."""
    noise = _cached(
        "noise4:" + _key(target, backend),  # 4: measured past 1,024 and 4,096 cells too
        lambda v: isinstance(v, float),
        lambda: batch_noise(target),
        use_cache,
    )
    return 2.0 * float(noise)


def measure_catch_up(model: Model, *, reps: int = 2) -> float:
    """Seconds per token of catching a draft model up in one batch: CATCH_UP_BATCH tokens with the
    last row's logits alone, as a catch-up and a prompt's prefill decode them. (Timed with every row's
    logits, a draft with a large vocabulary and a small body -- a 2-layer draft over a 248,320-token
    vocabulary -- was priced at many times its real prefill, and auto left it without the prompt.)"""
    curve, _ = time_verify(model, CATCH_UP_BATCH, reps=reps, sizes=(CATCH_UP_BATCH,), last_only=True)
    return curve[-1] / CATCH_UP_BATCH


def measure_draft(model: Model, *, reps: int = 5) -> float:
    """Seconds per drafted token: one single-token decode with one logits row."""
    v = measure_verify(model, 1, reps=reps)
    return v[0]


def _cache_file() -> Path:
    return store.home() / "calibration.json"


def _cached(key: str, valid: Callable[[object], bool], measure: Callable[[], object], use_cache: bool) -> Any:
    """One calibration measurement: from the on-disk cache when a valid value is there, else measured
    now (and stored, unless use_cache is off)."""
    path = _cache_file()
    cache = store.read_json(path) if use_cache else {}
    value = cache.get(key)
    if not valid(value):
        value = measure()
        if use_cache:
            cache[key] = value
            store.write_json(path, cache)
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
    verified: int = 0,
    repeatable: bool = False,
) -> Costs:
    """Measured costs, from the on-disk cache when the same files/hardware were measured before.
    `verified`: rows the build's invariance probe showed exact (see exact_rows). `repeatable` (a
    seeded request, whose sampler's random stream the planner's choices consume): a cached curve is
    used as it is, not re-measured when it looks stale, and a curve measured now is cached even if the
    machine was busy, so the next seeded run plans from the same numbers."""
    n = k_max + 1
    notes: list[str] = []
    key = "verify:" + _key(target, f"{backend}:{k_max}")
    path = _cache_file()
    cache = store.read_json(path) if use_cache else {}
    verify = cache.get(key)
    cached = isinstance(verify, list) and len(verify) == n
    if cached and not repeatable and cached_curve_is_stale(target, verify):
        notes.append(
            "calibration: the cached verify costs were measured on a busier machine; measuring again"
        )
        cached = False
    if not cached:
        verify, trustworthy = measure_verify_quietly(target, n, notes)
        if use_cache and (trustworthy or repeatable):
            cache[key] = verify
            store.write_json(path, cache)
    exact_n = exact_rows(target, k_max=k_max, backend=backend, use_cache=use_cache, verified=verified)
    draft: list[float] = []
    catch_up: list[float] = []
    for dm in draft_models:
        if dm is None:  # a model-free drafter: its proposals cost the planner nothing (never learned)
            draft.append(0.0)
            catch_up.append(0.0)
            continue
        draft.append(
            _cached(
                "draft:" + _key(dm, backend),
                lambda v: isinstance(v, float),
                lambda dm=dm: measure_draft(dm),
                use_cache,
            )
        )
        catch_up.append(
            _cached(
                "catchup-last:" + _key(dm, backend),
                lambda v: isinstance(v, float),
                lambda dm=dm: measure_catch_up(dm),
                use_cache,
            )
        )
    return Costs(
        verify=[float(x) for x in verify], draft=draft, exact_n=exact_n, notes=notes, catch_up=catch_up
    )
