"""`specchat run` end to end through the CLI runner, on tiny real GGUF models."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specchat.cli import app

runner = CliRunner()


def invoke(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input)


def run_json(*args: str):
    res = invoke("run", *args, "--json", "--threads", "1", "--ctx-size", "256")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_json_schema_and_exactness(tiny_pair):
    target, draft = (str(p) for p in tiny_pair)
    doc = run_json(target, "--draft", draft, "-p", "Tell me a story", "-n", "24", "-k", "3")
    assert set(doc) >= {"text", "prompt_tokens", "tokens", "sources", "stats"}
    stats = doc["stats"]
    for key in (
        "generated_tokens",
        "prefill_seconds",
        "decode_seconds",
        "tokens_per_second",
        "drafted",
        "accepted",
        "acceptance_rate",
        "target_passes",
        "mean_accepted_per_pass",
    ):
        assert key in stats
    assert len(doc["tokens"]) == len(doc["sources"]) == stats["generated_tokens"] <= 24
    assert set(doc["sources"]) <= {"draft", "correction", "bonus", "target"}
    assert stats["tokens_per_second"] == pytest.approx(
        stats["generated_tokens"] / stats["decode_seconds"], rel=0.01
    )
    assert doc["sources"].count("draft") == stats["accepted"] > 0
    # greedy speculative output is exactly the target's plain greedy output
    plain = run_json(target, "--no-draft", "-p", "Tell me a story", "-n", "24")
    assert plain["tokens"] == doc["tokens"]
    assert plain["prompt_tokens"] == doc["prompt_tokens"]
    assert set(plain["sources"]) == {"target"} and plain["stats"]["drafted"] == 0


def test_prompt_from_stdin_and_plain_text_output(tiny_pair):
    target, draft = (str(p) for p in tiny_pair)
    res = invoke(
        "run", target, "--draft", draft, "-n", "8", "--threads", "1", "--ctx-size", "256", input="hi there\n"
    )
    assert res.exit_code == 0, res.output
    assert "tokens/target pass" in res.stderr
    assert "\x1b[" not in res.stdout  # not a terminal: no colour codes


def test_sampling_is_repeatable_with_seed(tiny_pair):
    target, draft = (str(p) for p in tiny_pair)
    args = (target, "--draft", draft, "-p", "Once", "-n", "16", "--temp", "0.8", "--seed", "7")
    assert run_json(*args)["tokens"] == run_json(*args)["tokens"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["-k", "-1"], "-k/--draft-tokens"),
        (["--temp", "-1"], "--temp"),
        (["--top-p", "2"], "--top-p"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--draft-p-min", "1.5"], "--draft-p-min"),
        (["--draft-window", "-1"], "--draft-window"),
    ],
)
def test_bad_numbers_give_one_line(tiny_target, extra, needle):
    res = invoke("run", str(tiny_target), "-p", "x", *extra)
    assert res.exit_code != 0
    assert needle in res.stderr
    assert "Traceback" not in res.output
    assert len(res.stderr.strip().splitlines()) == 1


def test_bad_files_and_pairs_give_one_line(
    tmp_path, tiny_target, not_a_gguf, tiny_truncated, tiny_incompatible
):
    cases = [
        ([str(tmp_path / "missing.gguf")], "missing.gguf"),
        ([str(not_a_gguf)], "not a GGUF"),
        ([str(tiny_truncated)], "truncated"),
        ([str(tiny_incompatible[0]), "--draft", str(tiny_incompatible[1])], "different tokenizers"),
    ]
    for args, needle in cases:
        res = invoke("run", *args, "-p", "hello", "--threads", "1", "--ctx-size", "256")
        assert res.exit_code != 0, args
        assert needle in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.output
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_prompt_longer_than_context(tiny_target):
    res = invoke("run", str(tiny_target), "--no-draft", "-p", "word " * 200, "--ctx-size", "64")
    assert res.exit_code != 0
    assert "--ctx-size" in res.stderr and "Traceback" not in res.output


def test_special_token_mismatch_only_warns(tiny_special_mismatch):
    target, draft = (str(p) for p in tiny_special_mismatch)
    res = invoke(
        "run", target, "--draft", draft, "-p", "hi", "-n", "5", "--threads", "1", "--ctx-size", "256"
    )
    assert res.exit_code == 0, res.output
    assert "warning:" in res.stderr and "control/special" in res.stderr


def test_help_teaches():
    res = invoke("run", "--help")
    assert res.exit_code == 0
    for opt in ("--draft", "--draft-tokens", "--temp", "--json", "--no-draft", "--ctx-size"):
        assert opt in res.stdout


def test_save_svg(tiny_pair, tmp_path):
    target, draft = (str(p) for p in tiny_pair)
    out = tmp_path / "run.svg"
    res = invoke("run", target, "--draft", draft, "-p", "hi", "-n", "12", "-k", "3", "--save-svg", str(out))
    assert res.exit_code == 0, res.output
    svg = out.read_text()
    assert svg.startswith("<svg") and "accepted&#160;from&#160;draft" in svg
