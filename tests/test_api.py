"""The Python API (`specchat.load`, `generate`, `stream`): the answers `specchat run` gives, on the
tiny models, and an import that loads nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from typer.testing import CliRunner

import specchat
from specchat.cli import app
from specchat.errors import ModelNotFound

runner = CliRunner()
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def model(tiny_pair) -> Iterator[specchat.LoadedModel]:
    target, draft = tiny_pair
    # -k 3: drafts every round (auto may find drafting never pays on models this small)
    with specchat.load(str(target), draft=[str(draft), "ngram"], k=3, threads=1, ctx_size=256) as loaded:
        yield loaded


def run_tokens(target, *args: str) -> list[int]:
    base = ["run", str(target), "-p", PROMPT, "-n", "24", "--json", "--threads", "1", "--ctx-size", "256"]
    res = runner.invoke(app, [*base, *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["tokens"]


def test_importing_the_api_loads_nothing_heavy():
    code = (
        "import sys, specchat; specchat.load, specchat.generate, specchat.stream; "
        "print([m for m in ('llama_cpp', 'numpy', 'huggingface_hub', 'typer', 'rich') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_generate_gives_what_run_gives_with_drafts_and_without(model, tiny_pair):
    target, draft = tiny_pair
    answer = specchat.generate(model, PROMPT, max_tokens=24)
    assert list(answer.tokens) == run_tokens(target, "--no-draft")
    assert list(answer.tokens) == run_tokens(target, "--draft", str(draft), "--draft", "ngram", "-k", "3")
    assert str(answer) == answer.text and answer.text
    assert answer.stats.generated_tokens == 24 and answer.stats.drafted > 0
    assert {"draft", "correction", "bonus"} & set(answer.sources)
    alone = specchat.generate(model, PROMPT, max_tokens=24, draft=False)
    assert alone.tokens == answer.tokens and set(alone.sources) == {"target"}
    assert model.drafters == (str(draft), "ngram") and model.target == str(target)


def test_stream_yields_the_pieces_with_their_sources_then_the_stats(model):
    whole = specchat.generate(model, PROMPT, max_tokens=16)
    answer = specchat.stream(model, PROMPT, max_tokens=16)
    pieces = list(answer)
    assert "".join(p.text for p in pieces) == whole.text
    assert tuple(p.source for p in pieces) == whole.sources and tuple(p.token for p in pieces) == whole.tokens
    assert answer.stats is not None and answer.stats.generated_tokens == 16


def test_a_stream_stopped_early_leaves_the_models_ready_for_the_next_answer(model):
    whole = specchat.generate(model, PROMPT, max_tokens=20)
    with specchat.stream(model, PROMPT, max_tokens=20) as answer:
        first = [next(answer) for _ in range(3)]
    assert answer.stats is not None and answer.stats.stop_reason == "interrupted"
    assert [p.token for p in first] == list(whole.tokens[:3])
    started = specchat.stream(model, "Something else", max_tokens=20)
    next(started)  # left open: the next answer stops it first
    assert specchat.generate(model, PROMPT, max_tokens=20).tokens == whole.tokens


def test_sampling_settings_per_answer_and_seeded_answers_repeat(model):
    plain = specchat.generate(model, PROMPT, max_tokens=12)
    forced = specchat.generate(model, PROMPT, max_tokens=12, logit_bias={plain.tokens[0]: 100})
    assert set(forced.tokens) == {plain.tokens[0]}
    hot = {"temperature": 0.9, "top_k": 0, "top_p": 1.0, "seed": 4}
    once = specchat.generate(model, PROMPT, max_tokens=12, **hot)
    assert specchat.generate(model, PROMPT, max_tokens=12, **hot).tokens == once.tokens != plain.tokens
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    by_messages = specchat.generate(model, chat, max_tokens=8)
    assert by_messages.tokens == specchat.generate(model, PROMPT, system="Be brief.", max_tokens=8).tokens


def test_a_processor_of_your_own_keeps_the_answer_the_targets(model):
    def even_only(generated, row):
        out = row.copy()
        out[1::2] = -np.inf
        return out

    fast = specchat.generate(model, PROMPT, max_tokens=16, logits_processors=[even_only])
    alone = specchat.generate(model, PROMPT, max_tokens=16, logits_processors=[even_only], draft=False)
    assert fast.tokens == alone.tokens and all(t % 2 == 0 for t in fast.tokens)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"temperature": -1}, "temperature must be >= 0 (got -1)"),
        ({"top_p": 2.0}, "top_p must be in (0, 1]"),
        ({"temprature": 0.5}, "unknown setting 'temprature'"),
        ({"logit_bias": {99999999: 1}}, "logit_bias names token 99999999, beyond the vocabulary"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
    ],
)
def test_bad_settings_are_a_value_error_naming_the_keyword(model, kwargs, says):
    with pytest.raises(ValueError) as info:
        specchat.generate(model, PROMPT, **kwargs)
    assert says in str(info.value)


def test_load_checks_its_own_settings_before_anything_loads(tiny_target):
    for kwargs, says in (
        ({"k": 65}, "k must be a number of draft tokens in 0..64"),
        ({"ctx_size": 8}, "ctx_size must be >= 16"),
        ({"top_k": -1}, "top_k must be >= 0"),
    ):
        with pytest.raises(ValueError) as info:
            specchat.load(str(tiny_target), **kwargs)
        assert says in str(info.value)
    with pytest.raises(ModelNotFound):
        specchat.load("no-such-model.gguf")
