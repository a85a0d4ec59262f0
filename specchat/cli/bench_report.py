"""`specchat bench`'s report: the tables, the bar chart, the audit and the prediction, drawn with Rich.

Apart from the command (`cli/bench.py`, which measures and then hands the `BenchResult` here) because
drawing is its own concern: every function takes the finished result and returns Rich renderables,
with no loading, measuring or printing of progress, so a saved `--json` result could be drawn again.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..bench.results import saved_ratio

if TYPE_CHECKING:
    from ..bench.run import BenchResult

BAR_WIDTH = 36
_EIGHTHS = " ▏▎▍▌▋▊▉"


def _speed_style(x: float | None) -> str:
    if x is None:
        return "dim"
    return "green" if x >= 1.0 else ("yellow" if x >= 0.97 else "red")


def _x(x: float | None) -> Text:
    """A speedup cell, formatted from the figure `--save` writes (`saved_ratio`), so that a table and
    the saved JSON never disagree in the last digit (0.66498 rounds to 0.66, but its saved 0.665 to 0.67)."""
    saved = saved_ratio(x)
    if saved is None:
        return Text("–", style="dim")
    return Text(f"{saved:.2f}×", style=_speed_style(x))


def _positions(rates: tuple[float, ...], n: int = 6) -> str:
    return " ".join(f"{r * 100:.0f}" for r in rates[:n]) + ("%" if rates else "–")


def header(result: BenchResult) -> Text:
    """One line: what was compared, how many times, on what."""
    machine = result.meta.get("machine", {}) if isinstance(result.meta.get("machine"), dict) else {}
    target = os.path.basename(str(result.meta.get("target", "target")))
    parts = [
        f"target {target}",
        f"drafters {', '.join(result.drafters) or '–'}",
        f"{len(result.prompts)} prompts × {len(result.configs)} configs × {result.repeats} runs, interleaved",
        f"max {result.max_tokens} tokens, greedy",
    ]
    if machine:
        parts.append(f"{machine.get('cpu_count')} CPUs, {machine.get('threads')} threads")
        parts.append("GPU offload" if machine.get("gpu_offload") else "CPU only")
    lines = [" · ".join(parts)]
    if result.meta.get("placement"):
        lines.append(f"target split: {result.meta['placement']}")
    cost = result.meta.get("cost_model")
    lines += [str(line) for line in cost] if isinstance(cost, list) else []
    return Text("\n".join(lines), style="dim")


def summary_table(result: BenchResult) -> Table:
    """Every configuration across all prompts: the table to read first."""
    t = Table(title="Decode speed by configuration (medians of each prompt's runs)", title_justify="left")
    t.add_column("config", no_wrap=True)
    t.add_column("tok/s", justify="right")
    t.add_column("speedup", justify="right")
    t.add_column("worst", justify="right")
    t.add_column("vs best k", justify="right")
    t.add_column("accept", justify="right")
    t.add_column("tok/pass", justify="right")
    t.add_column("mean k", justify="right")
    t.add_column("accept by position", no_wrap=True)
    for cfg, s in zip(result.configs, result.summaries, strict=True):
        plain = cfg.plain
        t.add_row(
            Text(cfg.name, style="bold" if cfg.auto else ""),
            f"{s.median_tokens_per_second:.1f}",
            _x(None if plain else s.geomean_speedup),
            Text("–", style="dim") if plain else Text.assemble(_x(s.worst_speedup), f" {s.worst_prompt}"),
            _x(s.worst_vs_best_fixed) if cfg.auto else Text("–", style="dim"),
            "–" if plain else f"{s.acceptance_rate:.0%}",
            f"{s.tokens_per_pass:.2f}",
            "–" if plain else f"{s.mean_k:.2f}",
            "–" if plain else _positions(s.acceptance_by_position),
        )
    t.caption = (
        "speedup: geometric mean over prompts of (tok/s ÷ plain tok/s), same run · worst: lowest prompt · "
        "vs best k: auto ÷ the best of plain and fixed k in hindsight, worst prompt"
    )
    return t


def prompt_table(result: BenchResult) -> Table:
    """Per prompt: plain tokens/s, and every other configuration's speedup over it."""
    t = Table(title="Per prompt: plain tok/s, then speedup vs plain", title_justify="left")
    t.add_column("config", no_wrap=True)
    for p in result.prompts:
        t.add_column(p.name, justify="right")
    for cfg in result.configs:
        cells = [result.cell(p.name, cfg.name) for p in result.prompts]
        if cfg.plain:
            t.add_row(cfg.name, *(f"{c.tokens_per_second:.1f}" for c in cells), end_section=True)
        else:
            t.add_row(cfg.name, *(_x(c.speedup) for c in cells))
    return t


def reference_table(result: BenchResult) -> Table | Text:
    """llama.cpp's own modes on the same prompts (--llama-cpp): speedup vs plain from the same run,
    and how specchat's auto configurations compare with the best of them on each prompt."""
    if not result.references:
        return Text("")
    names = list(dict.fromkeys(r.name for r in result.references))
    t = Table(
        title="llama.cpp on the same prompts (speedup vs specchat plain, same run)", title_justify="left"
    )
    t.add_column("config", no_wrap=True)
    for p in result.prompts:
        t.add_column(p.name, justify="right")
    refs = {(r.prompt, r.name): r for r in result.references}
    for name in names:
        t.add_row(name, *(_x(refs[(p.name, name)].speedup) for p in result.prompts))
    best = {p.name: max(refs[(p.name, n)].tokens_per_second for n in names) for p in result.prompts}
    for cfg in result.configs:
        if cfg.auto:
            cells = [result.cell(p.name, cfg.name) for p in result.prompts]
            t.add_row(
                f"{cfg.name} vs best llama.cpp",
                *(_x(c.tokens_per_second / best[p.name] if best[p.name] > 0 else None)
                  for c, p in zip(cells, result.prompts, strict=True)),
            )  # fmt: skip
    return t


def bar(value: float, scale: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of `value / scale * width` cells, in eighths of a cell."""
    eighths = max(0, round(value / scale * width * 8)) if scale > 0 else 0
    full, part = divmod(min(eighths, width * 8), 8)
    return "█" * full + (_EIGHTHS[part] if part else "")


def speedup_chart(result: BenchResult, width: int = BAR_WIDTH) -> Text:
    """Bars of geometric-mean speedup per configuration; ┊ marks plain decoding (1.00×)."""
    rows = [
        (c.name, 1.0 if c.plain else s.geomean_speedup, s)
        for c, s in zip(result.configs, result.summaries, strict=True)
    ]
    scale = max([1.0, *(v for _, v, _ in rows)]) * 1.05
    one = min(width - 1, round(1.0 / scale * width))
    name_w = max(len(n) for n, _, _ in rows)
    out = Text("Speedup vs plain decoding (geometric mean over prompts; ┊ = 1.00×)\n", style="bold")
    for name, value, s in rows:
        b = bar(value, scale, width)
        pad = "".join("┊" if i == one else " " for i in range(len(b), width))
        out.append(f"{name:<{name_w}} ")
        out.append(b, style="dim" if name == result.configs[0].name and value == 1.0 else _speed_style(value))
        out.append(pad, style="dim")
        out.append(f" {value:.2f}×")
        if s.worst_prompt and name != "plain":
            out.append(f"  worst {s.worst_speedup:.2f}× ({s.worst_prompt})", style="dim")
        out.append("\n")
    return out


def audit_text(result: BenchResult) -> Text:
    """The exactness audit: verdict, worst gap, failures, and where outputs part from plain decoding."""
    out = Text()
    if not result.audits:
        return Text("exactness audit skipped (--no-audit)\n", style="dim")
    verdict = ("PASS", "bold green") if result.audit_ok else ("FAIL", "bold red")
    out.append("Exactness audit: ", style="bold")
    out.append(verdict[0], style=verdict[1])
    out.append(
        f" — {len(result.audits)} distinct greedy output(s) teacher-forced one token at a time; every token "
        f"must be the target's argmax within {result.tolerance} logits (ties); worst gap "
        f"{result.worst_gap:.4f}\n"
    )
    for a in result.audits:
        for f in a.failures:
            out.append(
                f"  ✗ {a.prompt} [{', '.join(a.configs)}] token {f.index}: {f.token} but the target prefers "
                f"{f.argmax} by {f.gap:.3f}\n",
                style="red",
            )
    if not result.divergences:
        out.append("Every speculative output equals plain decoding token for token.\n", style="green")
    for d in result.divergences:
        kind = "a tie" if d.tie else "NOT a tie"
        gap = "?" if d.gap is None else f"{d.gap:.4f}"
        out.append(
            f"  {d.prompt} · {d.config}: differs from plain at token {d.index} (logit gap {gap}: {kind})\n",
            style="yellow" if d.tie else "red",
        )
    return out


def prediction_table(result: BenchResult) -> Group | Text:
    """What the measured acceptance would give on GPU-like hardware. Labelled a prediction throughout."""
    if not result.predictions:
        return Text("No prediction: no drafts were measured.\n", style="dim")
    t = Table(
        title="PREDICTION (not measured): GPU/Metal, where a verify batch costs what one token costs",
        title_justify="left",
        title_style="bold yellow",
    )
    t.add_column("drafter", no_wrap=True)
    t.add_column("measured in", no_wrap=True)
    t.add_column("draft/target cost", justify="right")
    t.add_column("accept by position", no_wrap=True)
    t.add_column("best k", justify="right")
    t.add_column("predicted speedup", justify="right")
    lines = Text(style="dim")
    for p in result.predictions:
        t.add_row(
            p.drafter,
            p.source_config,
            f"{p.cost_ratio:.2f}",
            _positions(p.acceptance_by_position),
            str(p.best_k),
            _x(p.speedup),
        )
        per = " · ".join(f"{name} {x:.2f}× (k={k})" for name, k, x in p.by_prompt)
        lines.append(f"predicted per prompt, {p.drafter}: {per}\n")
    t.caption = (
        "E(k) = 1 + Σ acceptance by position up to k, for a round costing k·(draft/target cost) + 1 target "
        "tokens; the cost ratio is this machine's, and a GPU's own ratio changes the figure"
    )
    return Group(t, lines)


def render_report(result: BenchResult, console: Console) -> None:
    """The whole human-readable report."""
    console.print(
        Group(
            header(result),
            Text(""),
            summary_table(result),
            Text(""),
            prompt_table(result),
            Text(""),
            reference_table(result),
            speedup_chart(result),
            audit_text(result),
            prediction_table(result),
        )
    )
