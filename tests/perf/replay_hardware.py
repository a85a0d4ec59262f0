"""replay_planner.py --hardware: every policy under every cost curve, over the recorded answers.

Per curve (replay_curves.py: published llama-bench figures for other hardware, and this machine's
measured ones) and per answer, simulated speed-ups over plain decoding for:

* auto: specchat's default run (`--draft MODEL --draft ngram`, `-k auto`): AutoPlanner over both
  drafters, averaged over seeds (its exploration is random);
* specchat's best fixed k: `-k N` (the first drafter, the draft model, at its default p-min 0.75),
  and n-gram lookup alone at `-k N`, whichever N and drafter does best on this curve over all answers;
* llama.cpp's defaults: `llama-server --spec-type draft-simple` (draft n-max 3, n-min 0, p-min 0);
* llama.cpp's best fixed setting: the (n-max, p-min) that does best on this curve over all answers;
* the best fixed setting per answer: of all the fixed settings above, the best for each answer,
  as if a user knew in advance which one suits it;
* the hindsight bound over both drafters (replay_draft.hindsight_seconds): the best draft length and
  drafter for every round, knowing where each draft would fail.

llama.cpp's draft-simple is replayed through the same loop as a fixed draft length with its p-min
cut-off, its batches trusted without a tie margin (the most favourable reading of it). The "best"
settings are chosen knowing every answer, so they are bounds for a fixed setting, not settings a
user could know in advance. Cells are geometric means over a prompt set. A curve that carries its own
tie margin and exact batch size (one measured by tests/perf/device/run_device.py) replays with them.
"""

from __future__ import annotations

import math
import multiprocessing
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from replay_curves import Curve
from replay_draft import ROUND_OVERHEAD, DraftTrace, ReplayDraftModel, billed, hindsight_seconds

from specchat.decoding.calibration import Costs, trees_exact
from specchat.decoding.drafters import ModelDrafter
from specchat.decoding.events import Done, Round
from specchat.decoding.loop import FixedK, Planner, Settings, generate
from specchat.decoding.ngram import NGRAM_ROUTE_PRIORS, NgramDrafter
from specchat.decoding.settings import AUTO_TREE_WIDTH

#: draft lengths tried for the fixed settings, and llama.cpp's p-min values
FIXED_K = (1, 2, 3, 4, 6, 8, 12, 16)
LLAMA_P_MIN = (0.0, 0.5, 0.75, 0.9)
SPECCHAT_P_MIN = 0.75  # specchat's default cut-off under -k N, greedy (drafters.default_p_min)

Case = tuple[list[int], list[int], list[float]]


def geomean(xs: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")


class Replayer:
    """Runs one policy over one recorded answer under one curve and returns plain time / its time."""

    def __init__(self, case: Case, trace: DraftTrace, margin: float, exact_n: int) -> None:
        from replay_planner import Replay  # the stand-in target (replay_planner imports this module lazily)

        prompt, output, gaps = case
        ids = {t: i for i, t in enumerate(sorted({*prompt, *output, 0}))}
        self.p, self.o = [ids[t] for t in prompt], [ids[t] for t in output]
        self.gaps, self.vocab, self.trace = gaps, len(ids) + 1, trace
        self.margin, self.exact_n = margin, exact_n
        self._replay = Replay

    def draft(self, curve: Curve, p_min: float, tree_width: int = 0) -> ReplayDraftModel:
        batch = [x / curve.verify[0] for x in curve.verify]
        return ReplayDraftModel(len(self.p), self.o, self.trace, self.vocab, p_min, curve.draft, batch,
                                tree_width=tree_width)  # fmt: skip

    def run(self, curve: Curve, planner: Planner, drafters: list, *, margin: bool = True) -> float:  # type: ignore[type-arg]
        spent, made = 0.0, 0
        settings = Settings(max_tokens=len(self.o), tie_margin=self.margin if margin else 0.0,
                            exact_rows=self.exact_n, exact_trees=trees_exact(self.exact_n))  # fmt: skip
        bill = billed(curve.verify)
        target = self._replay(self.p, self.o, self.gaps, self.vocab)
        for ev in generate(target, self.p, drafters=drafters, planner=planner, settings=settings):
            if isinstance(ev, Round):
                spent += bill[min((ev.proposed or 0) + 1, len(bill)) - 1] + ev.draft_seconds
            elif isinstance(ev, Done):
                made = ev.stats.generated_tokens
        return made * bill[0] / spent

    def auto(
        self, curve: Curve, seed: int, tune: Callable[[object], None] | None = None, *, tree_width: int = 0
    ) -> float:
        """specchat's default: AutoPlanner over the draft model and n-gram lookup (as make_planner);
        `tree_width` > 0: rounds may be token trees of that many side branches (the draft model's
        runners-up, n-gram lookup's other occurrences), as a live run's under -k auto."""
        from specchat.decoding.planner import AutoPlanner

        # the curve as a live planner learns it (billed): told the bare curve it thinks rounds
        # cheaper than they are, which matters where a token takes a few ms (a GPU)
        costs = Costs(billed(curve.verify), [curve.draft, 0.0],
                      exact_n=self.exact_n, catch_up=[curve.catch_up, 0.0])  # fmt: skip
        planner = AutoPlanner(costs, [ModelDrafter.prior, NgramDrafter.prior], model_free=[False, True],
                              route_priors=[ModelDrafter.route_priors, NGRAM_ROUTE_PRIORS],
                              rng=np.random.default_rng(seed), learn_costs=False)  # fmt: skip
        if tune is not None:
            tune(planner)
        drafters = [self.draft(curve, 0.0, tree_width), NgramDrafter(tree_width=tree_width)]
        return self.run(curve, planner, drafters)

    def bound(self, curve: Curve, prompt: list[int], output: list[int]) -> float:
        best = hindsight_seconds(prompt, output, self.gaps, curve.verify, self.margin, self.exact_n,
                                 trace=self.trace, draft=curve.draft)  # fmt: skip
        return len(output) * (curve.verify[0] + ROUND_OVERHEAD) / best


def evaluate_case(
    case: Case, trace: DraftTrace, curve: Curve, margin: float, exact_n: int, *, seeds: int
) -> dict[str, float]:
    """{policy: speed-up} for one answer under one curve; fixed settings keyed 'spec k3 draft',
    'llama n3 p0.5'. A curve measured with its own tie margin and exact batch size replays with them."""
    if curve.exact_n is not None:
        margin, exact_n = curve.margin or 0.0, curve.exact_n
    r = Replayer(case, trace, margin, exact_n)
    res: dict[str, float] = {"auto": statistics.fmean(r.auto(curve, s) for s in range(seeds))}
    res["auto tree"] = statistics.fmean(r.auto(curve, s, tree_width=AUTO_TREE_WIDTH) for s in range(seeds))
    for k in FIXED_K:
        res[f"spec k{k} draft"] = r.run(curve, FixedK(k), [r.draft(curve, SPECCHAT_P_MIN), NgramDrafter()])
        res[f"spec k{k} ngram"] = r.run(curve, FixedK(k), [NgramDrafter()])
        for pm in LLAMA_P_MIN:
            res[f"llama n{k} p{pm:g}"] = r.run(curve, FixedK(k), [r.draft(curve, pm)], margin=False)
    res["bound"] = r.bound(curve, case[0], case[1])
    res["per answer"] = max(v for k, v in res.items() if k.startswith(("spec ", "llama ")))
    return res


#: what forked workers read (set before the pool starts: nothing big is pickled per task)
_SHARED: tuple[dict[str, Case], dict[str, DraftTrace], list[Curve], float, int, int] | None = None


def _evaluate_shared(task: tuple[int, str]) -> tuple[int, str, dict[str, float]]:
    assert _SHARED is not None
    cases, traces, curves, margin, exact_n, seeds = _SHARED
    i, name = task
    return i, name, evaluate_case(cases[name], traces[name], curves[i], margin, exact_n, seeds=seeds)


def evaluate_all(
    cases: dict[str, Case],
    traces: dict[str, DraftTrace],
    curves: list[Curve],
    margin: float,
    exact_n: int,
    *,
    seeds: int,
    jobs: int = 1,
) -> Iterator[dict[str, dict[str, float]]]:
    """{policy: {answer: speed-up}} per curve, in order, as each is done; `jobs` > 1 replays the
    answers in that many forked processes (each replay is single-threaded Python)."""

    def collect(done: Iterable[tuple[int, str, dict[str, float]]]) -> dict[str, dict[str, float]]:
        res: dict[str, dict[str, float]] = {}
        for _i, name, per in sorted(done, key=lambda d: list(cases).index(d[1])):
            for policy, value in per.items():
                res.setdefault(policy, {})[name] = value
        return res

    if jobs <= 1 or len(cases) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        for curve in curves:
            yield collect((0, n, evaluate_case(c, traces[n], curve, margin, exact_n, seeds=seeds))
                          for n, c in cases.items())  # fmt: skip
        return
    global _SHARED
    _SHARED = (cases, traces, curves, margin, exact_n, seeds)
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            for i in range(len(curves)):
                yield collect(pool.map(_evaluate_shared, [(i, n) for n in cases]))
    finally:
        _SHARED = None


def evaluate(
    cases: dict[str, Case],
    traces: dict[str, DraftTrace],
    curve: Curve,
    margin: float,
    exact_n: int,
    *,
    seeds: int,
) -> dict[str, dict[str, float]]:
    """{policy: {answer: speed-up}} for one curve (evaluate_case over every answer)."""
    return next(evaluate_all(cases, traces, [curve], margin, exact_n, seeds=seeds))


def best_of(res: dict[str, dict[str, float]], prefix: str) -> str:
    """The fixed setting with this prefix whose geomean over every answer is highest."""
    keys = [k for k in res if k.startswith(prefix)]
    return max(keys, key=lambda k: geomean(list(res[k].values())))


def report(
    cases: dict[str, Case],
    traces: dict[str, DraftTrace],
    sets: dict[str, list[str]],
    curves: list[Curve],
    margin: float,
    exact_n: int,
    *,
    seeds: int,
    jobs: int = 1,
) -> str:
    """Print one markdown table (a row per curve) and per-set detail under it; return the table."""
    head = ("| curve | shape | auto | auto, token trees | trees / chains | best fixed k (specchat) | "
            "llama.cpp default (n3 p0) | llama.cpp best fixed | best fixed per answer | hindsight | "
            "auto / hindsight |")  # fmt: skip
    rows, detail = [head, "|" + "---|" * 11], []
    for curve, res in zip(curves, evaluate_all(cases, traces, curves, margin, exact_n, seeds=seeds,
                                                jobs=jobs), strict=True):  # fmt: skip
        spec, llama = best_of(res, "spec "), best_of(res, "llama ")

        def g(policy: str, names: Sequence[str], res: dict[str, dict[str, float]] = res) -> float:
            return geomean([res[policy][n] for n in names])

        every = list(cases)
        cells = [
            curve.name,
            curve.shape(),
            f"{g('auto', every):.3f}x",
            f"{g('auto tree', every):.3f}x",
            f"{g('auto tree', every) / g('auto', every):.3f}",
            f"{g(spec, every):.3f}x ({spec[5:]})",
            f"{g('llama n3 p0', every):.3f}x",
            f"{g(llama, every):.3f}x ({llama[6:]})",
            f"{g('per answer', every):.3f}x",
            f"{g('bound', every):.3f}x",
            f"{g('auto', every) / g('bound', every):.3f}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
        for set_name, names in sets.items():
            worst = min(names, key=lambda n: res["auto"][n] / res["bound"][n])
            parts = [
                f"auto {g('auto', names):.3f}x",
                f"auto with trees {g('auto tree', names):.3f}x",
                f"{spec[5:]} {g(spec, names):.3f}x",
                f"llama n3 p0 {g('llama n3 p0', names):.3f}x",
                f"{llama[6:]} {g(llama, names):.3f}x",
                f"best fixed per answer {g('per answer', names):.3f}x",
                f"bound {g('bound', names):.3f}x",
                f"auto/bound {g('auto', names) / g('bound', names):.3f}",
                f"worst answer {worst} {res['auto'][worst] / res['bound'][worst]:.3f}",
            ]
            per = ", ".join(f"{n} {res['auto'][n]:.2f}/{res['bound'][n]:.2f}" for n in names)
            detail.append(f"  {curve.name} / {set_name}: " + ", ".join(parts) + f"; per answer {per}")
        print(rows[-1], flush=True)
    print("\n" + "\n".join(rows))
    print("\nper prompt set (geomeans; per answer: auto / bound):\n" + "\n".join(detail))
    return "\n".join(rows)
