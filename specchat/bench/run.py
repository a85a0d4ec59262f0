"""`specchat bench`: plain vs speculative decoding measured side by side. Returns results, prints nothing.

How it measures, and why:

* Interleaved. For each prompt, each repeat runs every configuration once (the order rotated by one
  each repeat), so machine noise -- other processes, thermal throttling, a busy disk -- hits all
  configurations alike instead of whichever happened to run during the noisy minute. Reported speeds
  are medians over the repeats; speedups are ratios of those medians within the same run.
* Fair. Every generation starts from empty caches (`truncate(0)`) and the same prompt tokens, so prefix
  reuse never favours a configuration; the prompt's prefill is timed apart from decoding, and "tok/s"
  is decode tokens per decode second (`Stats.tokens_per_second`). A short untimed warm-up of every
  configuration first pays one-off costs (buffer allocation, cost-model calibration).
* Checked. Greedy speculative decoding must write exactly what the target alone writes. Every distinct
  output is teacher-forced through the target one token at a time (the way plain decoding runs) and
  each token must be the target's argmax. A token may lose to another by at most `TIE_TOLERANCE` in
  logits: a verify batch of n tokens uses other matrix kernels than a batch of one, so two near-tied
  logits can swap order between them -- a tie, not an error. Outputs that differ from plain decoding
  are reported with where they part.
* Honest about hardware. On this CPU a verify batch of n tokens costs far more than one token; on
  GPUs and Apple Silicon it costs about the same. The measured per-position acceptance and the
  draft/target cost ratio predict the speedup on such hardware -- labelled a prediction, never mixed
  with measurements.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..decoding.drafters import Drafter
from ..decoding.loop import Planner
from ..decoding.model import Model
from ..errors import BadInput
from .audit import TIE_TOLERANCE, Audit, Divergence, audit_output, find_divergences
from .measure import Measurement, generate_once, planner_factory
from .predict import Prediction, predict_drafters
from .results import Cell, Summary, make_cell, saved_ratio, summarize
from .suite import Config, PreparedPrompt, drafter_labels

SCHEMA = "specchat.bench/1"


WARMUP_TOKENS = 8


PREDICTION_LABEL = (
    "PREDICTION, not a measurement: speedup where a verify batch costs what one token costs (GPU/Metal), "
    "from this run's per-position acceptance and draft/target cost ratio"
)


@dataclass(frozen=True, slots=True)
class RefCell:
    """An external reference (llama.cpp's own speculative mode) on one prompt, measured in the same
    interleaved run: median decode speed and its ratio to specchat's plain decoding."""

    prompt: str
    name: str
    tokens_per_second: float
    speedup: float | None
    acceptance_rate: float
    runs: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "name": self.name,
            "tokens_per_second": round(self.tokens_per_second, 3),
            "speedup": saved_ratio(self.speedup),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "runs": [round(r, 3) for r in self.runs],
        }


#: an external reference run on one prompt -> (decode tok/s, acceptance rate)
Reference = Callable[["PreparedPrompt"], tuple[float, float]]


@dataclass(frozen=True, slots=True)
class BenchResult:
    """Everything one `specchat bench` run measured, checked and predicted."""

    prompts: tuple[PreparedPrompt, ...]
    configs: tuple[Config, ...]
    drafters: tuple[str, ...]
    max_tokens: int
    repeats: int
    cells: tuple[Cell, ...]
    summaries: tuple[Summary, ...]
    audits: tuple[Audit, ...]
    divergences: tuple[Divergence, ...]
    predictions: tuple[Prediction, ...]
    measurements: tuple[Measurement, ...] = field(repr=False)
    meta: dict[str, Any] = field(default_factory=dict)
    tolerance: float = TIE_TOLERANCE
    references: tuple[RefCell, ...] = ()

    @property
    def audit_ok(self) -> bool:
        return all(a.ok for a in self.audits)

    @property
    def worst_gap(self) -> float:
        return max((a.worst_gap for a in self.audits), default=0.0)

    def cell(self, prompt: str, config: str) -> Cell:
        for c in self.cells:
            if c.prompt == prompt and c.config == config:
                return c
        raise KeyError((prompt, config))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready document (schema `specchat.bench/1`)."""
        return {
            "schema": SCHEMA,
            **self.meta,
            "settings": {
                "max_tokens": self.max_tokens,
                "repeats": self.repeats,
                "temperature": 0.0,
                "order": "interleaved: per prompt, per repeat, every config once (rotated); medians",
            },
            "drafters": list(self.drafters),
            "prompts": [
                {"name": p.name, "category": p.category, "prompt_tokens": len(p.tokens)} for p in self.prompts
            ],
            "configs": [
                {
                    "name": c.name,
                    "drafters": [self.drafters[i] for i in c.drafters],
                    "k": "auto" if c.auto else (c.k or 0),
                    "strict": c.strict,
                }
                for c in self.configs
            ],
            "results": [c.to_dict() for c in self.cells],
            "summary": [s.to_dict() for s in self.summaries],
            "audit": {
                "tolerance": self.tolerance,
                "method": "teacher-forced one token at a time; each token is the argmax within tolerance",
                "ok": self.audit_ok,
                "worst_gap": round(self.worst_gap, 6),
                "outputs": [a.to_dict() for a in self.audits],
                "divergences": [d.to_dict() for d in self.divergences],
            },
            "prediction": {
                "label": PREDICTION_LABEL,
                "drafters": [p.to_dict() for p in self.predictions],
            },
            "references": [r.to_dict() for r in self.references],
        }


ProgressFn = Callable[[int, int, str], None]


def run_bench(
    target: Model,
    drafters: Sequence[Drafter],
    prompts: Sequence[PreparedPrompt],
    configs: Sequence[Config],
    *,
    max_tokens: int = 128,
    repeats: int = 3,
    planner_for: Callable[[Config], Planner] | None = None,
    progress: ProgressFn | None = None,
    warmup: bool = True,
    audit: bool = True,
    meta: dict[str, Any] | None = None,
    tie_margin: float = 0.0,
    exact_rows: int = 0,
    references: dict[str, Reference] | None = None,
    strict: bool = False,
    backend: str = "",
    verified: int = 0,
) -> BenchResult:
    """Measure every configuration on every prompt, interleaved; audit; predict. Prints nothing.

    `progress(done, total, label)` is called before each step (generations, then audits).
    `references` (name -> run on a prompt) are external programs measured in the same interleaved
    order, right after specchat's configurations of each repeat.
    """
    references = dict(references or {})
    if not prompts:
        raise BadInput("no prompts to benchmark")
    if not any(c.plain for c in configs):
        raise ValueError("the configurations must include plain decoding: speedups are relative to it")
    if repeats < 1 or max_tokens < 1:
        raise ValueError("repeats and max_tokens must be >= 1")
    make = planner_for or planner_factory(target, drafters, strict=strict, backend=backend, verified=verified)
    labels = drafter_labels([d.name for d in drafters])
    report = progress or (lambda _d, _t, _l: None)
    n_gen = len(prompts) * (len(configs) + len(references)) * repeats
    total = (len(configs) if warmup else 0) + n_gen + (len(prompts) * 2 if audit else 0)
    done = 0

    if warmup:
        first = prompts[0]
        for cfg in configs:
            report(done, total, f"warm-up · {cfg.name}")
            generate_once(
                target,
                drafters,
                cfg,
                first.tokens,
                make(cfg),
                min(WARMUP_TOKENS, max_tokens),
                tie_margin,
                exact_rows,
                strict,
            )
            done += 1

    measurements: list[Measurement] = []
    ref_runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for prompt in prompts:
        for rep in range(repeats):
            shift = rep % len(configs)  # rotate, so no config always runs first (or right after another)
            for cfg in [*configs[shift:], *configs[:shift]]:
                report(done, total, f"{prompt.name} · {cfg.name} · run {rep + 1}/{repeats}")
                planner = make(cfg)  # built outside the timed loop
                out, stats = generate_once(
                    target, drafters, cfg, prompt.tokens, planner, max_tokens, tie_margin, exact_rows, strict
                )
                measurements.append(Measurement(prompt.name, cfg.name, rep, out, stats))
                done += 1
            for name, ref in references.items():
                report(done, total, f"{prompt.name} · {name} · run {rep + 1}/{repeats}")
                ref_runs.setdefault((prompt.name, name), []).append(ref(prompt))
                done += 1

    cells: list[Cell] = []
    ref_cells: list[RefCell] = []
    for prompt in prompts:
        by_cfg = {
            c.name: [m for m in measurements if m.prompt == prompt.name and m.config == c.name]
            for c in configs
        }
        plain_cfg = next(c for c in configs if c.plain)
        plain_tokens = by_cfg[plain_cfg.name][0].tokens
        row = {c.name: make_cell(prompt.name, c, by_cfg[c.name], plain_tokens) for c in configs}
        base = row[plain_cfg.name].tokens_per_second
        for c in configs:
            cell = row[c.name]
            speedup = cell.tokens_per_second / base if base > 0 else None
            vs, best_name = None, None
            if c.auto:
                # hindsight: plain, or any fixed k of any drafter this auto config could choose from
                usable = set(c.drafters)
                rivals = [plain_cfg, *(o for o in configs if o.k is not None and set(o.drafters) <= usable)]
                best = max(rivals, key=lambda o: row[o.name].tokens_per_second)
                best_speed = row[best.name].tokens_per_second
                vs, best_name = (cell.tokens_per_second / best_speed if best_speed > 0 else None), best.name
            row[c.name] = replace(cell, speedup=speedup, vs_best_fixed=vs, best_fixed=best_name)
        cells += row.values()
        for name in references:
            runs = ref_runs[(prompt.name, name)]
            tps = statistics.median(r[0] for r in runs)
            ref_cells.append(
                RefCell(
                    prompt.name,
                    name,
                    tps,
                    tps / base if base > 0 else None,
                    runs[-1][1],
                    tuple(r[0] for r in runs),
                )
            )

    audits: list[Audit] = []
    divergences: list[Divergence] = []
    if audit:
        for prompt in prompts:
            report(done, total, f"audit · {prompt.name}")
            outputs: dict[tuple[int, ...], list[str]] = {}
            for m in measurements:
                if m.prompt == prompt.name:
                    names = outputs.setdefault(m.tokens, [])
                    if m.config not in names:
                        names.append(m.config)
            found = {out: audit_output(target, prompt, out, names) for out, names in outputs.items()}
            audits += found.values()
            done += 1
            report(done, total, f"compare · {prompt.name}")
            divergences += find_divergences(prompt, configs, measurements, found)
            done += 1
    report(total, total, "done")

    summaries = tuple(summarize(c, [x for x in cells if x.config == c.name]) for c in configs)
    predictions = predict_drafters(configs, cells, labels)
    return BenchResult(
        prompts=tuple(prompts),
        configs=tuple(configs),
        drafters=tuple(labels),
        max_tokens=max_tokens,
        repeats=repeats,
        cells=tuple(cells),
        summaries=summaries,
        audits=tuple(audits),
        divergences=tuple(divergences),
        predictions=predictions,
        measurements=tuple(measurements),
        meta=dict(meta or {}),
        references=tuple(ref_cells),
    )
