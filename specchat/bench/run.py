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

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..decoding.drafters import Drafter
from ..decoding.events import Done, Stats, Token
from ..decoding.loop import FixedK, Planner, Settings, generate
from ..decoding.model import Model
from ..decoding.planner import best_k, expected_tokens
from ..decoding.sampling import SamplingParams
from ..errors import BadInput

SCHEMA = "specchat.bench/1"
TIE_TOLERANCE = 0.05  # logits; see the module docstring
DEFAULT_KS = (1, 2, 3, 5)
WARMUP_TOKENS = 8
PREDICTION_LABEL = (
    "PREDICTION, not a measurement: speedup where a verify batch costs what one token costs (GPU/Metal), "
    "from this run's per-position acceptance and draft/target cost ratio"
)


# --- prompts ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchPrompt:
    """One benchmark prompt. `category` groups prompts whose answers behave alike for drafting."""

    name: str
    category: str
    text: str
    #: a whole conversation (multi-turn revisions: "now add type hints and return it again"); when
    #: given it is what the chat template renders, and `text` is its last user message
    messages: tuple[tuple[str, str], ...] = ()

    def conversation(self) -> list[dict[str, str]]:
        """The messages the chat template renders for this prompt."""
        if self.messages:
            return [{"role": r, "content": c} for r, c in self.messages]
        return [{"role": "user", "content": self.text}]


_RENAME_CODE = '''def calc(lst, tax_rate=0.2):
    """Return the total price of the order, tax included."""
    subtotal = 0
    for entry in lst:
        subtotal += entry["price"] * entry["qty"]
    if not lst:
        return 0
    return round(subtotal * (1 + tax_rate), 2)


def describe(lst):
    total = calc(lst)
    names = ", ".join(entry["name"] for entry in lst)
    return f"{len(lst)} items ({names}): {total}"


def cheapest(lst):
    return min(lst, key=lambda entry: entry["price"])["name"]
'''

_TYPES_CODE = """class Inventory:
    def __init__(self, items):
        self.items = dict(items)

    def add(self, name, count=1):
        self.items[name] = self.items.get(name, 0) + count
        return self.items[name]

    def remove(self, name, count=1):
        left = self.items.get(name, 0) - count
        if left < 0:
            raise ValueError(f"only {self.items.get(name, 0)} {name} left")
        self.items[name] = left
        return left

    def most_common(self, n):
        return sorted(self.items.items(), key=lambda kv: kv[1], reverse=True)[:n]


def merge(a, b):
    out = Inventory(a.items)
    for name, count in b.items.items():
        out.add(name, count)
    return out
"""

#: The built-in suite: one or two prompts per kind of answer. Code edits copy most of their input, which
#: is where model-free n-gram drafts shine; chat and creative text are where they cannot.
SUITE: tuple[BenchPrompt, ...] = (
    BenchPrompt(
        "code",
        "code",
        "Write a Python function `merge_intervals(intervals)` that merges overlapping intervals given as "
        "(start, end) tuples. Include a docstring and two usage examples.",
    ),
    BenchPrompt(
        "edit-rename",
        "edit",
        "Rename the function `calc` to `order_total` and the parameter `lst` to `items` everywhere in this "
        f"code. Reply with the complete updated code only.\n\n```python\n{_RENAME_CODE}```",
    ),
    BenchPrompt(
        "edit-types",
        "edit",
        "Add type hints to every function and method in this code. Reply with the complete code only."
        f"\n\n```python\n{_TYPES_CODE}```",
    ),
    BenchPrompt(
        "chat",
        "chat",
        "What is the difference between a process and a thread? Answer in a few short paragraphs.",
    ),
    BenchPrompt(
        "creative",
        "creative",
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    ),
    BenchPrompt(
        "json",
        "structured",
        "Return a JSON array of four fictional employees. Each has the fields id, name, email, department "
        "and skills (a list of strings). Output only the JSON.",
    ),
    BenchPrompt(
        "french",
        "non-english",
        "Explique en quelques paragraphes, en français, comment fonctionne la photosynthèse.",
    ),
)


def _messages(value: object, where: str) -> tuple[tuple[str, str], ...]:
    """A prompt line's "messages", checked: (role, content) pairs ending with a user message."""
    if value is None:
        return ()
    ok = (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict)
            and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), str)
            for m in value
        )
    )
    if not ok or value[-1]["role"] != "user":  # type: ignore[index]
        raise BadInput(
            f'{where}: "messages" must be a list of {{"role": system|user|assistant, "content": ...}} '
            "objects ending with a user message"
        )
    return tuple((m["role"], m["content"]) for m in value)  # type: ignore[union-attr]


def load_prompts(path: Path) -> list[BenchPrompt]:
    """Prompts from a JSONL file: one {"name": ..., "prompt": ..., "category"?: ...} object per line,
    or {"name": ..., "messages": [{"role": ..., "content": ...}, ...]} for a multi-turn conversation.

    Any problem is one BadInput naming the file and line, so a typo costs seconds, not a model load.
    """
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise BadInput(f"no such prompts file: {path}", "give a JSONL file of {name, prompt} lines") from None
    except IsADirectoryError:
        raise BadInput(f"{path} is a directory, not a prompts file") from None
    except OSError as exc:
        raise BadInput(f"cannot read prompts file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path} is not UTF-8 text", "give a JSONL file of {name, prompt} lines") from None
    out: list[BenchPrompt] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise BadInput(f"{where}: not valid JSON ({exc.args[0] if exc.args else exc})") from None
        if not isinstance(obj, dict):
            raise BadInput(f'{where}: expected an object like {{"name": ..., "prompt": ...}}')
        name, prompt, category = obj.get("name"), obj.get("prompt"), obj.get("category", "custom")
        messages = _messages(obj.get("messages"), where)
        if messages and prompt is None:
            prompt = next(c for r, c in reversed(messages) if r == "user")
        if not isinstance(name, str) or not name.strip():
            raise BadInput(f'{where}: "name" must be a non-empty string')
        if not isinstance(prompt, str) or not prompt.strip():
            raise BadInput(f'{where}: "prompt" must be a non-empty string')
        if not isinstance(category, str):
            raise BadInput(f'{where}: "category" must be a string')
        if name in seen:
            raise BadInput(f"{where}: duplicate prompt name {name!r}")
        seen.add(name)
        out.append(BenchPrompt(name, category, prompt, messages))
    if not out:
        raise BadInput(f"no prompts in {path}", 'each line needs {"name": ..., "prompt": ...}')
    return out


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """A prompt as the target's tokens (chat template applied by the caller)."""

    name: str
    category: str
    tokens: tuple[int, ...]


# --- configurations --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Config:
    """One way of decoding: which drafters (indices into the bench's drafter list) and how many tokens.

    `drafters == ()` is plain decoding; `k is None` is the cost-model planner (`-k auto`).
    """

    name: str
    drafters: tuple[int, ...] = ()
    k: int | None = 0
    #: decode as `--strict` does (greedy output equal to plain token for token): the exact mode's
    #: cost is measured next to the default's in the same run
    strict: bool = False

    @property
    def plain(self) -> bool:
        return not self.drafters

    @property
    def auto(self) -> bool:
        return bool(self.drafters) and self.k is None


def drafter_labels(names: Sequence[str]) -> list[str]:
    """Short, unique labels for drafters: file stems for paths, names otherwise."""
    labels: list[str] = []
    for name in names:
        label = Path(name).stem if name.lower().endswith(".gguf") else name
        base, n = label, 2
        while label in labels:
            label, n = f"{base}#{n}", n + 1
        labels.append(label)
    return labels


def default_configs(drafter_names: Sequence[str], ks: Sequence[int] = DEFAULT_KS) -> list[Config]:
    """Plain; each drafter alone at each fixed k and in auto; all drafters in auto when there are
    several; and that last auto again under `--strict`.

    Fixed k per drafter is what "the best fixed k in hindsight" is chosen from, so the auto planner can
    be judged against it on every prompt. The strict run shows, in the same run and audit, what
    token-for-token equality with plain decoding costs on this machine.
    """
    labels = drafter_labels(drafter_names)
    out = [Config("plain")]
    for i, label in enumerate(labels):
        out += [Config(f"{label} k={k}", (i,), k) for k in ks]
        out.append(Config(f"{label} auto", (i,), None))
    if len(labels) > 1:
        out.append(Config("auto (all)", tuple(range(len(labels))), None))
    if labels:
        last = out[-1]
        out.append(Config(f"{last.name} --strict", last.drafters, None, strict=True))
    return out


def parse_ks(text: str) -> tuple[int, ...]:
    """`--ks 1,2,3,5` -> (1, 2, 3, 5); an empty string means no fixed-k configurations."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            k = int(part)
        except ValueError:
            raise BadInput(f"--ks must be comma-separated numbers like 1,2,3,5 (got {text!r})") from None
        if not 1 <= k <= 64:
            raise BadInput(f"--ks values must be between 1 and 64 (got {k})")
        out.add(k)
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class _Pair:
    """The shape `tuning.make_planner` reads: a target and the drafters the planner chooses among."""

    target: Model
    drafters: list[Drafter]
    strict: bool = False
    backend: str = ""


def planner_factory(
    target: Model, drafters: Sequence[Drafter], *, strict: bool = False, backend: str = ""
) -> Callable[[Config], Planner]:
    """Fresh planners per generation, built exactly as `specchat run` builds them.

    Auto planners come from `tuning.make_planner` (calibrated costs, cached on disk after the first
    call), so the benchmark measures what users get; a fresh one per generation keeps what it learns
    about one prompt from leaking into the next measurement.
    """
    from ..decoding.planner import make_planner

    def make(cfg: Config) -> Planner:
        if cfg.plain:
            return FixedK(0)
        if cfg.k is not None:
            return FixedK(cfg.k)
        pair = _Pair(target, [drafters[i] for i in cfg.drafters], strict or cfg.strict, backend)
        return make_planner(pair, None)  # type: ignore[no-any-return]

    return make


# --- measurement -----------------------------------------------------------------------------------------


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
        model = getattr(d, "model", None)
        if model is not None:
            model.truncate(0)


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


# --- exactness audit -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuditFailure:
    """A token that is not the target's argmax by more than the tie tolerance."""

    index: int
    token: int
    argmax: int
    gap: float


@dataclass(frozen=True, slots=True)
class Audit:
    """Teacher-forced check of one distinct greedy output (shared by every config that produced it)."""

    prompt: str
    configs: tuple[str, ...]
    n_tokens: int
    worst_gap: float
    worst_index: int | None
    failures: tuple[AuditFailure, ...]
    gaps: tuple[float, ...] = field(repr=False)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "configs": list(self.configs),
            "tokens": self.n_tokens,
            "worst_gap": round(self.worst_gap, 6),
            "worst_index": self.worst_index,
            "ok": self.ok,
            "failures": [
                {"index": f.index, "token": f.token, "argmax": f.argmax, "gap": round(f.gap, 6)}
                for f in self.failures
            ],
        }


def teacher_force(target: Model, prompt: Sequence[int], output: Sequence[int]) -> list[tuple[float, int]]:
    """For each output token: (max logit − its logit, argmax), decoding one token at a time.

    One token per decode is how plain decoding runs, so this is the target's own reference answer at
    every position, whatever batch sizes the speculative run verified with.
    """
    if not prompt:
        raise ValueError("the prompt must contain at least one token")
    target.truncate(0)
    try:
        if len(prompt) > 1:
            target.decode(list(prompt[:-1]), [])
        out: list[tuple[float, int]] = []
        inputs = [prompt[-1], *output[:-1]]
        for tok_in, tok_out in zip(inputs, output, strict=True):
            row = target.decode([int(tok_in)], [0])[0]  # a view the next decode overwrites: use it now
            top = int(np.argmax(row))
            out.append((float(row[top]) - float(row[int(tok_out)]), top))
        return out
    finally:
        target.truncate(0)


def audit_output(
    target: Model,
    prompt: PreparedPrompt,
    output: Sequence[int],
    configs: Sequence[str],
    *,
    tolerance: float = TIE_TOLERANCE,
) -> Audit:
    """Check that every token of a greedy `output` is the target's argmax within `tolerance`."""
    forced = teacher_force(target, prompt.tokens, output)
    gaps = tuple(g for g, _ in forced)
    failures = tuple(
        AuditFailure(i, int(output[i]), top, gap) for i, (gap, top) in enumerate(forced) if gap > tolerance
    )
    worst_index = max(range(len(gaps)), key=gaps.__getitem__) if gaps else None
    return Audit(
        prompt=prompt.name,
        configs=tuple(configs),
        n_tokens=len(output),
        worst_gap=gaps[worst_index] if worst_index is not None else 0.0,
        worst_index=worst_index,
        failures=failures,
        gaps=gaps,
    )


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a speculative greedy output first differs from the plain greedy output of the same prompt.

    `gap` is how far the speculative token's logit is below the target's maximum at that position
    (teacher-forced); `tie` is whether that is within the tolerance, i.e. an expected near-tie swap.
    """

    prompt: str
    config: str
    index: int
    token: int | None
    plain_token: int | None
    gap: float | None
    tie: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "config": self.config,
            "index": self.index,
            "token": self.token,
            "plain_token": self.plain_token,
            "gap": None if self.gap is None else round(self.gap, 6),
            "tie": self.tie,
        }


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where the sequences differ (the shorter length if one is a prefix), else None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# --- results ---------------------------------------------------------------------------------------------


def _rates(accepted: Sequence[int], drafted: Sequence[int]) -> tuple[float, ...]:
    return tuple(a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=False))


def _sum_positions(rows: Sequence[Sequence[int]]) -> list[int]:
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
        return _rates(self.accepted_by_position, self.drafted_by_position)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "config": self.config,
            "tokens_per_second": round(self.tokens_per_second, 3),
            "runs_tokens_per_second": [round(v, 3) for v in self.runs_tokens_per_second],
            "decode_seconds": round(self.decode_seconds, 6),
            "generated_tokens": self.generated_tokens,
            "speedup": None if self.speedup is None else round(self.speedup, 4),
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
            "vs_best_fixed": None if self.vs_best_fixed is None else round(self.vs_best_fixed, 4),
            "best_fixed": self.best_fixed,
        }


def _cell(
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
        drafted_by_position=tuple(_sum_positions([m.stats.drafted_by_position for m in runs])),
        accepted_by_position=tuple(_sum_positions([m.stats.accepted_by_position for m in runs])),
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
        def r(v: float | None, n: int = 4) -> float | None:
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


def _summary(cfg: Config, cells: Sequence[Cell]) -> Summary:
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
        acceptance_by_position=_rates(
            _sum_positions([c.accepted_by_position for c in cells]),
            _sum_positions([c.drafted_by_position for c in cells]),
        ),
        worst_vs_best_fixed=min(vs) if vs else None,
        geomean_vs_best_fixed=geomean(vs) if vs else None,
    )


# --- prediction for flat-verify hardware ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted speedup of one drafter where V(n) = V(1) (GPU/Metal). Not a measurement.

    From the measured per-position acceptance r_j (share of drafts at position j that were accepted)
    the conditional rates are α_j = r_j / r_(j-1), so E(k) = 1 + Σ_{j<k} r_j tokens per round, at a cost
    of k·c + 1 target-token times, c = draft seconds per drafted token ÷ plain seconds per token (both
    measured in this run). `tuning.best_k` picks k on that flat verify curve.
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
    pooled = _rates(
        _sum_positions([c.accepted_by_position for c in cells]),
        _sum_positions([c.drafted_by_position for c in cells]),
    )
    k, speed, curve = predict_flat(pooled, ratio)
    per_prompt = []
    for c in cells:
        if c.drafted:
            pk, ps, _ = predict_flat(c.acceptance_by_position, ratio)
            per_prompt.append((c.prompt, pk, ps))
    return Prediction(drafter, cfg.name, ratio, pooled, k, speed, curve, tuple(per_prompt))


# --- the whole run ---------------------------------------------------------------------------------------


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
            "speedup": None if self.speedup is None else round(self.speedup, 4),
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
    make = planner_for or planner_factory(target, drafters, strict=strict, backend=backend)
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
        row = {c.name: _cell(prompt.name, c, by_cfg[c.name], plain_tokens) for c in configs}
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
            divergences += _divergences(prompt, configs, measurements, found)
            done += 1
    report(total, total, "done")

    summaries = tuple(_summary(c, [x for x in cells if x.config == c.name]) for c in configs)
    predictions = _predictions(configs, cells, labels)
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


def _divergences(
    prompt: PreparedPrompt,
    configs: Sequence[Config],
    measurements: Sequence[Measurement],
    audits: dict[tuple[int, ...], Audit],
) -> list[Divergence]:
    """For each speculative config, the earliest point where any of its outputs parts from plain's."""
    plain_cfg = next(c for c in configs if c.plain)
    mine = [m for m in measurements if m.prompt == prompt.name]
    plain = next(m.tokens for m in mine if m.config == plain_cfg.name)
    out: list[Divergence] = []
    for cfg in configs:
        if cfg.plain:
            continue
        first: tuple[int, tuple[int, ...]] | None = None
        for m in mine:
            if m.config != cfg.name:
                continue
            i = first_difference(m.tokens, plain)
            if i is not None and (first is None or i < first[0]):
                first = (i, m.tokens)
        if first is None:
            continue
        i, toks = first
        gaps = audits[toks].gaps if toks in audits else ()
        gap = gaps[i] if i < len(gaps) else None
        out.append(
            Divergence(
                prompt=prompt.name,
                config=cfg.name,
                index=i,
                token=toks[i] if i < len(toks) else None,
                plain_token=plain[i] if i < len(plain) else None,
                gap=gap,
                tie=gap is not None and gap <= TIE_TOLERANCE,
            )
        )
    return out


def _predictions(
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


# --- llama-server export ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerModel:
    """Where llama-server finds a model: a local path, or a Hub repo (+ file or quant) it downloads."""

    path: str | None = None
    repo: str | None = None
    file: str | None = None
    quant: str | None = None
    label: str = ""

    def args(self, *, draft: bool) -> list[str]:
        if self.path is not None:
            return ["-md" if draft else "-m", self.path]
        repo = f"{self.repo}:{self.quant}" if self.quant else str(self.repo)
        if draft:  # llama-server's draft Hub option takes REPO[:QUANT] only
            return ["-hfd", repo]
        return ["-hf", str(self.repo), "-hff", self.file] if self.file else ["-hf", repo]


def llama_server_command(
    target: ServerModel,
    drafts: Sequence[ServerModel],
    *,
    ngram: bool = False,
    draft_max: int,
    draft_min: int = 0,
    p_min: float,
    gpu_layers: int | None,
    draft_gpu_layers: int | None,
    ctx_size: int,
    threads: int | None = None,
) -> tuple[list[str], list[str]]:
    """The `llama-server` argv equivalent to these settings, and notes on what does not carry over.

    llama-server takes one draft model and has no cost model: it drafts up to --draft-max tokens every
    round (stopping early below --draft-p-min confidence). The notes say so rather than pretend that
    `-k auto` or the n-gram drafter carry over. GPU layers default to 99 (all), as specchat offloads
    everything by default when the build can.
    """
    notes: list[str] = []
    argv = ["llama-server", *target.args(draft=False)]
    if drafts:
        argv += drafts[0].args(draft=True)
        argv += ["--draft-max", str(draft_max), "--draft-min", str(draft_min), "--draft-p-min", f"{p_min:g}"]
        if len(drafts) > 1:
            left = ", ".join(d.label or str(d.path or d.repo) for d in drafts[1:])
            notes.append(f"llama-server takes one draft model: the first is used, {left} left out")
    argv += ["-ngl", str(_layers(gpu_layers))]
    if drafts:
        argv += ["-ngld", str(_layers(draft_gpu_layers if draft_gpu_layers is not None else gpu_layers))]
    argv += ["-c", str(ctx_size)]
    if threads is not None:
        argv += ["-t", str(threads)]
    if ngram:
        notes.append(
            "the n-gram drafter is left out (recent llama-server builds offer --spec-type ngram-simple)"
        )
    if drafts:
        notes.append(
            f"llama-server has no cost model: it drafts up to {draft_max} tokens every round, which can be "
            "slower than plain decoding on CPUs; `specchat bench` measures whether it pays here"
        )
    return argv, notes


def _layers(n: int | None) -> int:
    return 99 if n is None or n < 0 else n
