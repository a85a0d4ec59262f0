"""`specchat bench`: measurement bookkeeping, exactness audit, prediction, export, prompts files, CLI.

Timing-sensitive logic runs on fake models driven by a virtual clock (each decode advances it by a
chosen cost), so speeds and speedups are exact consequences of the cost model rather than of machine
noise; the CLI runs end to end on the tiny real GGUF models.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from specchat.bench import measure, run, suite
from specchat.bench.audit import TIE_TOLERANCE, audit_output, first_difference
from specchat.bench.export import ServerModel, llama_server_command
from specchat.bench.measure import generate_once
from specchat.bench.predict import conditional_rates, predict_flat
from specchat.bench.run import run_bench
from specchat.bench.suite import SUITE, Config, PreparedPrompt, default_configs, load_prompts, parse_ks
from specchat.cli import app
from specchat.decoding.drafters import ModelDrafter
from specchat.decoding.loop import FixedK
from specchat.decoding.ngram import NgramDrafter
from specchat.decoding.planner import K_MAX
from specchat.errors import BadInput

from .fakes import DriftModel, FakeModel, plain_greedy

runner = CliRunner()


# --- fakes on a virtual clock ------------------------------------------------------------------------------


class Clock:
    """Virtual seconds: only model decodes advance it."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class TimedFake(FakeModel):
    """A FakeModel whose decode of n tokens costs `cost(n)` virtual seconds, and which records where each
    decode started (to check every generation begins from an empty cache)."""

    def __init__(self, clock: Clock, cost: Callable[[int], float], **kw) -> None:
        super().__init__(**kw)
        self.clock = clock
        self.cost = cost
        self.starts: list[tuple[int, int]] = []  # (cache length before, tokens decoded)

    def decode(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        self.clock.now += self.cost(len(tokens))
        self.starts.append((len(self.tokens), len(tokens)))
        return super().decode(tokens, logits_rows)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Make the loop, the drafters and calibration read the virtual clock."""
    c = Clock()
    fake_time = SimpleNamespace(perf_counter=c.perf_counter)
    for mod in ("specchat.decoding.loop", "specchat.decoding.drafters", "specchat.decoding.calibration"):
        monkeypatch.setattr(f"{mod}.time", fake_time)
    return c


def prompts(n: int = 2) -> list[PreparedPrompt]:
    return [PreparedPrompt(f"p{i}", "test", tuple(range(1 + i, 9 + i))) for i in range(n)]


def flat_gpu_pair(clock: Clock) -> tuple[TimedFake, list]:
    """A target whose verify batch costs what one token costs (GPU-like) and a perfect, cheap draft."""
    target = TimedFake(clock, lambda n: 1.0, n_vocab=16, seed=3, name="target")
    draft = TimedFake(clock, lambda n: 0.1, n_vocab=16, seed=3, name="draft", table=target.table)
    return target, [ModelDrafter(draft, p_min=0.0), NgramDrafter()]


# --- measurement -------------------------------------------------------------------------------------------


def test_speeds_and_speedups_are_computed_from_this_runs_measurements(clock):
    target, drafters = flat_gpu_pair(clock)
    configs = default_configs([d.name for d in drafters], ks=(1, 3))
    res = run_bench(target, drafters, prompts(), configs, max_tokens=40, repeats=3)

    assert {c.config for c in res.cells} == {c.name for c in configs}
    for cell in res.cells:
        runs = [m for m in res.measurements if m.prompt == cell.prompt and m.config == cell.config]
        assert len(runs) == 3
        assert cell.runs_tokens_per_second == tuple(
            m.stats.generated_tokens / m.stats.decode_seconds for m in runs
        )
        assert cell.tokens_per_second == pytest.approx(float(np.median(cell.runs_tokens_per_second)))
        plain = res.cell(cell.prompt, "plain")
        assert cell.speedup == pytest.approx(cell.tokens_per_second / plain.tokens_per_second)
        assert cell.generated_total == sum(m.stats.generated_tokens for m in runs)

    # on this virtual hardware the cost model fixes every speed: plain is one token per target pass,
    # and a perfect draft at k=3 gives 4 tokens per (3 draft steps + 1 verify)
    for p in res.prompts:
        assert res.cell(p.name, "plain").tokens_per_second == pytest.approx(1.0)
        assert res.cell(p.name, "draft k=3").speedup == pytest.approx(4 / (3 * 0.1 + 1.0))
        assert res.cell(p.name, "draft k=3").acceptance_rate == 1.0
        for auto_name, rivals in [
            ("draft auto", ["plain", "draft k=1", "draft k=3"]),
            ("auto (all)", ["plain", "draft k=1", "draft k=3", "ngram k=1", "ngram k=3"]),
        ]:
            auto = res.cell(p.name, auto_name)
            best = max(rivals, key=lambda name: res.cell(p.name, name).tokens_per_second)
            assert auto.best_fixed == best
            assert auto.vs_best_fixed == pytest.approx(
                auto.tokens_per_second / res.cell(p.name, best).tokens_per_second
            )

    summary = {s.config: s for s in res.summaries}
    cells = [res.cell(p.name, "ngram k=1") for p in res.prompts]
    assert summary["ngram k=1"].worst_speedup == min(c.speedup for c in cells)
    assert summary["ngram k=1"].geomean_speedup == pytest.approx(
        float(np.exp(np.mean([np.log(c.speedup) for c in cells])))
    )


def test_runs_are_interleaved_rotated_and_start_from_empty_caches(clock):
    target, drafters = flat_gpu_pair(clock)
    configs = default_configs([d.name for d in drafters], ks=(2,))
    ps = prompts(2)
    res = run_bench(target, drafters, ps, configs, max_tokens=10, repeats=3, audit=False)

    names = [c.name for c in configs]
    blocks = [res.measurements[i : i + len(names)] for i in range(0, len(res.measurements), len(names))]
    assert len(blocks) == len(ps) * 3
    firsts = []
    for block in blocks:
        assert sorted(m.config for m in block) == sorted(names)  # every config once per repeat
        assert len({(m.prompt, m.repeat) for m in block}) == 1
        firsts.append(block[0].config)
    assert firsts[:3] == names[:3]  # the order rotates by one each repeat

    # every generation (warm-ups included) prefilled its prompt into an empty target cache
    prefills = [s for s in target.starts if s[0] == 0]
    assert len(prefills) == len(configs) + len(res.measurements)
    assert {n for _, n in prefills} == {len(p.tokens) - 1 for p in ps}
    outputs = {m.tokens for m in res.measurements if m.prompt == "p0"}
    assert outputs == {tuple(plain_greedy(target, ps[0].tokens, 10))}


def test_prediction_on_flat_hardware_matches_what_is_measured(clock):
    target, drafters = flat_gpu_pair(clock)
    configs = default_configs([d.name for d in drafters], ks=(1, 3))
    res = run_bench(target, drafters, prompts(), configs, max_tokens=40, repeats=1)
    pred = {p.drafter: p for p in res.predictions}["draft"]
    assert pred.source_config == "draft k=3"  # the deepest fixed k
    assert pred.cost_ratio == pytest.approx(0.1)
    assert pred.acceptance_by_position == (1.0, 1.0, 1.0)
    assert pred.best_k == 3
    measured = [res.cell(p.name, "draft k=3").speedup for p in res.prompts]
    assert pred.speedup == pytest.approx(min(measured), rel=1e-6)
    assert pred.speedup_by_k[1] == pytest.approx(res.cell("p0", "draft k=1").speedup, rel=1e-6)
    assert "PREDICTION" in res.to_dict()["prediction"]["label"]


def test_predict_flat_follows_the_expected_tokens_formula():
    shares = [0.8, 0.6, 0.3]  # share of drafts accepted at each position
    alphas = conditional_rates(shares)
    for j in range(len(shares)):
        assert float(np.prod(alphas[: j + 1])) == pytest.approx(shares[j])
    k, speed, curve = predict_flat(shares, cost_ratio=0.2)
    for j, v in enumerate(curve):
        assert v == pytest.approx((1 + sum(shares[:j])) / (1 + 0.2 * j))
    assert curve[k] == pytest.approx(speed) == pytest.approx(max(curve))
    assert predict_flat(shares, cost_ratio=10.0)[0] == 0  # a draft dearer than the target never pays


# --- exactness audit ---------------------------------------------------------------------------------------


def test_audit_passes_real_greedy_output_and_catches_a_corrupted_token():
    target = FakeModel(n_vocab=16, seed=5)
    prompt = PreparedPrompt("p", "test", (1, 2, 3, 4))
    out = plain_greedy(target, prompt.tokens, 12)
    good = audit_output(target, prompt, out, ["plain"])
    assert good.ok and good.worst_gap == 0.0 and len(good.gaps) == len(out)

    bad_out = list(out)
    i = 5
    row = target.logits_after([*prompt.tokens, *out[:i]])
    bad_out[i] = int(np.argmin(row))
    bad = audit_output(target, prompt, bad_out, ["broken"])
    assert not bad.ok
    f = bad.failures[0]  # later tokens may fail too: they followed the original, not the corrupted, prefix
    assert f.index == i
    assert (f.token, f.argmax) == (bad_out[i], out[i])
    assert f.gap == pytest.approx(float(row.max() - row.min()))
    assert bad.gaps[:i] == good.gaps[:i] and target.tokens == ()  # the audit leaves the cache empty


class BatchNumericsFake(FakeModel):
    """Batched decodes (n > 1) nudge token 1's logit up by `bump`, as other matmul kernels might."""

    def __init__(self, bump: float, **kw) -> None:
        super().__init__(**kw)
        self.bump = bump

    def decode(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        rows = super().decode(tokens, logits_rows)
        if len(tokens) > 1 and len(rows):
            rows[:, 1] += self.bump
        return rows


def near_tie_table(delta: float) -> np.ndarray:
    """Token 0 always wins, token 1 trails it by exactly `delta`."""
    table = np.random.default_rng(0).standard_normal((997, 16)).astype(np.float32)
    table[:, 0] = 10.0
    table[:, 1] = 10.0 - delta
    return table


@pytest.mark.parametrize(
    ("delta", "bump", "tie"), [(TIE_TOLERANCE / 4, TIE_TOLERANCE / 2, True), (0.5, 1.0, False)]
)
def test_speculative_output_that_parts_from_plain_is_reported_as_tie_or_failure(delta, bump, tie):
    table = near_tie_table(delta)
    target = BatchNumericsFake(bump, n_vocab=16, table=table)
    draft = ModelDrafter(FakeModel(n_vocab=16, table=table, name="d"), p_min=0.0)
    configs = [Config("plain"), Config("d k=2", (0,), 2)]
    res = run_bench(target, [draft], prompts(1), configs, max_tokens=6, repeats=1, warmup=False)

    assert res.cell("p0", "d k=2").matches_plain is False
    [div] = res.divergences
    assert (div.config, div.index, div.plain_token, div.token) == ("d k=2", 0, 0, 1)
    assert div.gap == pytest.approx(delta, abs=1e-5)
    assert div.tie is tie
    assert res.audit_ok is tie
    doc = res.to_dict()["audit"]
    assert doc["ok"] is tie and doc["tolerance"] == TIE_TOLERANCE
    assert doc["divergences"][0]["index"] == 0


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_audit_on_tiny_gguf_passes_speculative_output_and_catches_corruption(tiny_pair):
    from specchat.llama.engine import LlamaModel, LoadOptions

    opts = LoadOptions(n_ctx=256, threads=1)
    with LlamaModel(tiny_pair[0], opts) as target, LlamaModel(tiny_pair[1], opts) as dm:
        tokens = tuple(target.tokenize("Once upon a time", add_special=True, parse_special=True))
        prompt = PreparedPrompt("story", "test", tokens)
        drafter = ModelDrafter(dm, p_min=0.0)
        out, stats = generate_once(target, [drafter], Config("d k=3", (0,), 3), tokens, FixedK(3), 24)
        assert stats.accepted > 0 and len(out) == 24
        good = audit_output(target, prompt, out, ["d k=3"])
        assert good.ok and good.worst_gap <= TIE_TOLERANCE

        corrupt = list(out)
        corrupt[3] = target.tokenize("<|im_start|>", add_special=False, parse_special=True)[0]
        bad = audit_output(target, prompt, corrupt, ["corrupt"])
        assert bad.failures[0].index == 3
        assert bad.failures[0].gap > 1.0  # control tokens are heavily penalised in the tiny models


# --- prompts, configurations, export -----------------------------------------------------------------------


def test_built_in_suite_spans_the_kinds_of_answer():
    kinds = {p.category for p in SUITE}
    assert {"code", "edit", "chat", "creative", "structured", "non-english"} <= kinds
    assert len({p.name for p in SUITE}) == len(SUITE)
    edits = [p for p in SUITE if p.category == "edit"]
    assert edits and all("```python\n" in p.text and "def " in p.text for p in edits)


def test_jsonl_prompts_file(tmp_path: Path):
    f = tmp_path / "p.jsonl"
    rows = [{"name": "a", "prompt": "hello"}, {"name": "b", "prompt": "déjà vu", "category": "fr"}]
    f.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n\n", encoding="utf-8")
    got = load_prompts(f)
    assert [(p.name, p.category, p.text) for p in got] == [("a", "custom", "hello"), ("b", "fr", "déjà vu")]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such prompts file"),
        ('{"name": "a", "prompt": "x"}\n{"name": "b", "prompt": ', ":2: not valid JSON"),
        ('{"name": "a"}\n', ':1: "prompt" must be'),
        ('["a", "b"]\n', ":1: expected an object"),
        ('{"name": "a", "prompt": "x"}\n{"name": "a", "prompt": "y"}\n', ":2: duplicate prompt name"),
        ("\n\n", "no prompts in"),
    ],
)
def test_bad_prompts_file_is_one_clear_error(tmp_path: Path, content, needle):
    f = tmp_path / "bad.jsonl"
    if content is not None:
        f.write_text(content)
    with pytest.raises(BadInput) as exc:
        load_prompts(f)
    assert needle in exc.value.message


def test_default_configs_and_ks():
    names = [c.name for c in default_configs(["/m/draft-0.5b.gguf", "ngram"], ks=(1, 3))]
    assert names == [
        "plain",
        "draft-0.5b k=1",
        "draft-0.5b k=3",
        "draft-0.5b auto",
        "ngram k=1",
        "ngram k=3",
        "ngram auto",
        "auto (all)",
        "auto (all) --strict",
    ]
    strict = [c for c in default_configs(["/m/draft-0.5b.gguf", "ngram"], ks=(1,)) if c.strict]
    assert [(c.drafters, c.k) for c in strict] == [((0, 1), None)]
    only_ngram = [c.name for c in default_configs(["ngram"], ks=())]
    assert only_ngram == ["plain", "ngram auto", "ngram auto --strict"]
    assert [c.name for c in default_configs([], ks=(1,))] == ["plain"]
    assert parse_ks("5, 1,2,2") == (1, 2, 5)
    assert parse_ks("") == ()
    for bad in ("1,x", "0", "65"):
        with pytest.raises(BadInput):
            parse_ks(bad)


def test_llama_server_command_content():
    argv, notes = llama_server_command(
        ServerModel(path="/m/t.gguf"),
        [ServerModel(path="/m/d.gguf")],
        ngram=True,
        draft_max=6,
        p_min=0.7,
        gpu_layers=None,
        draft_gpu_layers=12,
        ctx_size=2048,
        threads=4,
    )
    opts = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert argv[0] == "llama-server"
    assert opts["-m"] == "/m/t.gguf" and opts["-md"] == "/m/d.gguf"
    assert (opts["--draft-max"], opts["--draft-min"], opts["--draft-p-min"]) == ("6", "0", "0.7")
    assert (opts["-ngl"], opts["-ngld"], opts["-c"], opts["-t"]) == ("99", "12", "2048", "4")
    assert any("n-gram" in n for n in notes)

    hub, _ = llama_server_command(
        ServerModel(repo="org/T-GGUF", file="t-q4.gguf", quant="Q4_K_M"),
        [ServerModel(repo="org/D-GGUF", file="d-q4.gguf", quant="Q4_K_M")],
        draft_max=8,
        p_min=0.75,
        gpu_layers=0,
        draft_gpu_layers=None,
        ctx_size=4096,
    )
    assert hub[1:5] == ["-hf", "org/T-GGUF", "-hff", "t-q4.gguf"]
    assert hub[hub.index("-hfd") + 1] == "org/D-GGUF:Q4_K_M"
    assert hub[hub.index("-ngld") + 1] == "0"  # the draft follows the target's --gpu-layers
    plain, _ = llama_server_command(
        ServerModel(path="t"), [], draft_max=8, p_min=0.75, gpu_layers=0, draft_gpu_layers=None, ctx_size=512
    )
    assert "-md" not in plain and "--draft-max" not in plain and "-ngld" not in plain


# --- the command -------------------------------------------------------------------------------------------


def invoke(*args: str):
    return runner.invoke(app, ["bench", *args])


def write_prompts(tmp_path: Path) -> Path:
    f = tmp_path / "prompts.jsonl"
    f.write_text(
        json.dumps({"name": "story", "prompt": "Tell me a story"})
        + "\n"
        + json.dumps({"name": "copy", "prompt": "repeat: alpha beta gamma alpha beta gamma"})
        + "\n"
    )
    return f


def test_cli_json_schema(tiny_pair, tmp_path):
    target, draft = (str(p) for p in tiny_pair)
    res = invoke(
        target, "--draft", draft, "--draft", "ngram", "--prompts", str(write_prompts(tmp_path)),
        "--json", "-n", "12", "-r", "2", "--ks", "1,2", "-t", "1", "-c", "256",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == run.SCHEMA
    assert set(doc) >= {"target", "machine", "settings", "prompts", "configs", "results", "summary", "audit"}
    assert [p["name"] for p in doc["prompts"]] == ["story", "copy"]
    configs = [c["name"] for c in doc["configs"]]
    assert configs == [c.name for c in default_configs([draft, "ngram"], ks=(1, 2))]
    assert len(doc["results"]) == len(configs) * 2
    plain = {r["prompt"]: r for r in doc["results"] if r["config"] == "plain"}
    for r in doc["results"]:
        assert len(r["runs_tokens_per_second"]) == 2
        assert r["speedup"] == pytest.approx(
            r["tokens_per_second"] / plain[r["prompt"]]["tokens_per_second"], rel=1e-3
        )
        assert r["tokens_per_pass"] > 0 and 0 <= r["acceptance_rate"] <= 1
        assert len(r["acceptance_by_position"]) == len(r["drafted_by_position"])
    assert doc["audit"]["ok"] is True and doc["audit"]["worst_gap"] <= TIE_TOLERANCE
    assert {o["prompt"] for o in doc["audit"]["outputs"]} == {"story", "copy"}
    assert "PREDICTION" in doc["prediction"]["label"]
    assert {p["drafter"] for p in doc["prediction"]["drafters"]} <= {Path(draft).stem, "ngram"}
    assert {s["config"] for s in doc["summary"]} == set(configs)


def test_a_speedup_cell_shows_the_figure_that_save_writes():
    """0.66498 alone would print as 0.66, but --save keeps 0.665, which prints as 0.67: the table is
    formatted from the saved 4-decimal figure so the two never disagree (a CI run once caught it)."""
    from specchat.cli.bench_report import _x

    for x in (0.66498, 0.665, 1.23456, 0.99996, 2.0):
        assert _x(x).plain == f"{round(x, 4):.2f}×"
    assert _x(0.66498).plain == "0.67×"
    assert _x(None).plain == "–"


def test_cli_report_has_table_chart_audit_and_prediction(tiny_pair, tmp_path):
    target, draft = (str(p) for p in tiny_pair)
    saved = tmp_path / "bench.json"
    res = invoke(
        target, "--draft", draft, "--prompts", str(write_prompts(tmp_path)),
        "-n", "8", "-r", "1", "--ks", "2", "-t", "1", "-c", "256", "--save", str(saved),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(saved.read_text())  # --save keeps the data of the run the tables show
    assert doc["schema"] == run.SCHEMA and len(doc["results"]) == len(doc["configs"]) * 2
    out = res.stdout
    for r in doc["results"]:
        if r["speedup"] is not None and r["config"] != "plain":
            assert f"{r['speedup']:.2f}×" in out
    for needle in (
        "Decode speed by configuration",
        "Per prompt",
        "Speedup vs plain",
        "Exactness audit: PASS",
    ):
        assert needle in out
    assert "PREDICTION (not measured)" in out
    assert "█" in out and "×" in out
    stem = Path(draft).stem
    assert f"{stem} k=2" in out and f"{stem} auto" in out
    assert "\x1b[" not in out


def test_cli_built_in_suite_runs(tiny_target):
    res = invoke(
        str(tiny_target),
        "--draft",
        "ngram",
        "--json",
        "-n",
        "4",
        "-r",
        "1",
        "--ks",
        "1",
        "-t",
        "1",
        "-c",
        "1024",
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [p["name"] for p in doc["prompts"]] == [p.name for p in SUITE]
    assert doc["audit"]["ok"] is True


def test_cli_export_prints_llama_server_command_without_loading(tiny_pair, monkeypatch):
    import specchat.models.loader

    def no_load(*a, **k):
        raise AssertionError("--export must not load models")

    monkeypatch.setattr(specchat.models.loader, "load", no_load)
    target, draft = (str(p) for p in tiny_pair)
    res = invoke(
        target, "--draft", draft, "--draft", "ngram", "--export", "llama-server",
        "--gpu-layers", "0", "-c", "2048", "--draft-p-min", "0.6",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    argv = shlex.split(res.stdout.strip())
    assert res.stdout.count("\n") == 1 and argv[0] == "llama-server"
    opts = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert Path(opts["-m"]) == Path(target).resolve() and Path(opts["-md"]) == Path(draft).resolve()
    assert opts["--draft-max"] == str(K_MAX) and opts["--draft-p-min"] == "0.6"
    assert (opts["-ngl"], opts["-ngld"], opts["-c"]) == ("0", "0", "2048")
    assert "n-gram" in res.stderr


def test_cli_export_of_uncached_alias_uses_hub_options():
    from specchat.models.registry_toml import load_registry

    reg = load_registry()
    alias = next(a for a in reg.models if reg.recommended_draft(a))
    res = invoke(alias, "--export", "llama-server")  # default drafts: recommended model + ngram
    assert res.exit_code == 0, res.output
    argv = shlex.split(res.stdout)
    entry, dentry = reg.get(alias), reg.get(reg.recommended_draft(alias))
    assert argv[argv.index("-hf") + 1] == entry.repo and argv[argv.index("-hff") + 1] == entry.file
    assert argv[argv.index("-hfd") + 1] == f"{dentry.repo}:{dentry.quant}"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--prompts", "/nonexistent/prompts.jsonl"], "no such prompts file"),
        (["--export", "sglang"], "unknown --export format"),
        (["--ks", "1,two"], "--ks"),
        (["--repeats", "0"], "--repeats"),
        (["--save", "/nonexistent/dir/bench.json"], "--save"),
    ],
)
def test_cli_bad_input_is_one_line(tiny_target, args, needle):
    res = invoke(str(tiny_target), "--draft", "ngram", *args)
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]
    assert "Traceback" not in res.output


def test_help_documents_the_tie_tolerance():
    res = runner.invoke(app, ["bench", "--help"])
    assert res.exit_code == 0
    assert str(TIE_TOLERANCE) in res.stdout


def test_external_references_run_interleaved_and_are_reported_as_ratios_to_plain(clock):
    """`specchat bench --llama-cpp DIR`: llama.cpp's own modes measured in the same run, per prompt."""
    target, drafters = flat_gpu_pair(clock)
    configs = default_configs([d.name for d in drafters], ks=(1,))
    order: list[str] = []

    def ref(prompt: PreparedPrompt) -> tuple[float, float]:
        order.append(prompt.name)
        return 2.0, 0.9

    res = run_bench(target, drafters, prompts(), configs, max_tokens=10, repeats=2, audit=False,
                    references={"llama.cpp ngram-mod": ref})  # fmt: skip
    assert order == ["p0", "p0", "p1", "p1"]  # once per prompt and repeat, inside the interleaved loop
    names = {(r.prompt, r.name) for r in res.references}
    assert names == {("p0", "llama.cpp ngram-mod"), ("p1", "llama.cpp ngram-mod")}
    for r in res.references:
        plain = res.cell(r.prompt, "plain").tokens_per_second
        assert r.tokens_per_second == 2.0 and r.speedup == pytest.approx(2.0 / plain) and r.runs == (2.0, 2.0)
    assert res.to_dict()["references"][0]["name"] == "llama.cpp ngram-mod"


def test_prompts_file_takes_multi_turn_conversations(tmp_path):
    """Chat revisions ("now add type hints and return the whole class again") need the earlier turns."""
    from specchat.bench.suite import load_prompts

    f = tmp_path / "p.jsonl"
    turns = [
        {"role": "user", "content": "write a stack"},
        {"role": "assistant", "content": "class Stack: ..."},
        {"role": "user", "content": "now add type hints"},
    ]
    f.write_text(json.dumps({"name": "rev", "messages": turns}) + "\n")
    (p,) = load_prompts(f)
    assert p.text == "now add type hints" and p.conversation() == turns
    f.write_text(json.dumps({"name": "bad", "messages": turns[:2]}) + "\n")
    with pytest.raises(BadInput, match="ending with a user message"):
        load_prompts(f)


def test_the_strict_config_is_planned_and_decoded_as_strict(clock):
    """`auto (all) --strict` prices drift as `specchat run --strict` does, and decodes with its repairs:
    on a target whose long batches drift, its outputs are plain decoding's token for token."""
    target, drafters = flat_gpu_pair(clock)
    cfgs = {c.name: c for c in default_configs([d.name for d in drafters], ks=())}
    make = measure.planner_factory(target, drafters)
    assert make(cfgs["auto (all) --strict"]).drift[0] > 0  # type: ignore[attr-defined]
    assert make(cfgs["auto (all)"]).drift[0] == 0  # type: ignore[attr-defined]

    eps = 0.3
    drifting = DriftModel(eps, 3, seed=4, n_vocab=8, sharpness=2.0)
    draft = FakeModel(seed=4, n_vocab=8, table=drifting.table)
    configs = [suite.Config("plain"), suite.Config("loose", (0,), None),
               suite.Config("exact", (0,), None, strict=True)]  # fmt: skip
    # prompts of 4 tokens: their prefill (3 rows) is within the exact size, so plain decoding is clean
    short = [PreparedPrompt(f"p{i}", "test", (1 + i, 2, 3 + i, 4)) for i in range(6)]
    res = run_bench(
        drifting, [ModelDrafter(draft, p_min=0.0)], short, configs, max_tokens=60, repeats=1,
        planner_for=lambda c: FixedK(0 if c.plain else 6), warmup=False, audit=False,
        tie_margin=2 * eps, exact_rows=3,
    )  # fmt: skip
    out = {(m.prompt, m.config): m.tokens for m in res.measurements}
    names = [p.name for p in short]
    assert all(out[(n, "exact")] == out[(n, "plain")] for n in names)
    assert any(out[(n, "loose")] != out[(n, "plain")] for n in names)  # the drift is real
