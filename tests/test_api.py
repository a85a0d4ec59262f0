"""The Python API (`specchat.load`, `generate`, `stream`): the answers `specchat run` gives, on the
tiny models, and an import that loads nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import specchat
from specchat.cli import app
from specchat.decoding.settings import SamplingParams
from specchat.errors import ModelNotFound
from tests.test_settings import TYPE_CASES, TYPE_IDS

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
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1 (got 0)"),
        ({"top_k": 2.5}, "top_k must be an integer >= 0 (got 2.5)"),
    ],
)
def test_bad_settings_are_a_value_error_naming_the_keyword(model, kwargs, says):
    with pytest.raises(ValueError) as info:
        specchat.generate(model, PROMPT, **kwargs)
    assert says in str(info.value)


def test_load_checks_its_own_settings_before_anything_loads(tiny_target):
    for kwargs, says in (
        ({"k": 65}, "k must be a number of draft tokens in 0..64"),
        ({"ctx_size": 8}, "ctx_size must be an integer >= 16 (got 8)"),
        ({"top_k": -1}, "top_k must be >= 0"),
    ):
        with pytest.raises(ValueError) as info:
            specchat.load(str(tiny_target), **kwargs)
        assert says in str(info.value)
    with pytest.raises(ModelNotFound):
        specchat.load("no-such-model.gguf")


# --- every keyword's type, checked at the call (nothing is loaded: the target does not exist) -----------


@pytest.mark.parametrize(("setting", "value"), TYPE_CASES, ids=TYPE_IDS)
def test_a_sampling_setting_of_the_wrong_type_is_a_value_error_naming_it_at_load_and_per_answer(
    setting, value
):
    """Over every entry of the settings table (a new setting is covered without a new test)."""
    with pytest.raises(ValueError) as info:
        specchat.load("no-such-model.gguf", **{setting.name: value})
    assert str(info.value).startswith(f"{setting.name} ") and "must" in str(info.value)
    with pytest.raises(ValueError) as info:
        specchat.stream(unloaded(), PROMPT, **{setting.name: value})
    assert str(info.value).startswith(f"{setting.name} ") and "must" in str(info.value)


def unloaded() -> specchat.LoadedModel:
    """A LoadedModel with no models behind it: `stream` checks every keyword before it touches them."""
    return specchat.LoadedModel(engine=None, params=SamplingParams(), k=None, p_min=None)  # type: ignore[arg-type]


TAKES_BOOL = "must be True or False"
TAKES_VARIABLES = "chat_template_kwargs must be an object mapping template variables to values"
LOAD_CASES = [
    ("target", [5, None, "", b"x.gguf"], "target must be a model: an alias, a .gguf path"),
    ("draft", [5, b"x", {"ngram": 1}], "draft must be a drafter"),
    ("draft", [[5], ["ngram", None]], "draft must be a model"),
    ("k", [2.5, 3.0, True, "3", 65, -1], "k must be a number of draft tokens in 0..64, or None for the cost"),
    ("ctx_size", [8, 4096.0, "4096", None, True], "ctx_size must be an integer >= 16"),
    ("gpu_layers", [1.5, "all", True], "gpu_layers must be a number of layers (negative: all), or None"),
    ("draft_gpu_layers", [1.5, "all", False], "draft_gpu_layers must be a number of layers"),
    ("threads", [0, 2.0, True, "2"], "threads must be an integer >= 1, or None for the physical cores"),
    ("p_min", [float("nan"), 1.5, -0.1, "0.5", True], "p_min must be a number in [0, 1], or None"),
    ("draft_window", [-1, 512.0, True, "512"], "draft_window must be a number of tokens (0: all) >= 0"),
    ("offline", ["no", 1, None], f"offline {TAKES_BOOL}"),
    ("force", ["yes", 0], f"force {TAKES_BOOL}"),
    ("strict", [None, 1.0], f"strict {TAKES_BOOL}"),
    ("verbose", ["false"], f"verbose {TAKES_BOOL}"),
    ("chat_template_kwargs", ["x", 5, [("enable_thinking", False)], True], TAKES_VARIABLES),
]
STREAM_CASES = [
    ("prompt", [5, None, [], b"hi", ["hi"], [{"role": 1, "content": "x"}], [{"content": "x"}]],
     "prompt must be a string or a non-empty sequence of"),
    ("system", [5, ["x"]], "system must be a string or None"),
    ("raw", ["yes", 1], f"raw {TAKES_BOOL}"),
    ("max_tokens", [0, 1.5, 8.0, True, "8", None], "max_tokens must be an integer >= 1"),
    ("seed", [-1, 1.5, True, "1"], "seed must be an integer >= 0, or None for a fresh draw"),
    ("draft", ["no", None], f"draft {TAKES_BOOL}"),
    ("chat_template_kwargs", ["enable_thinking=false", 0, [{"enable_thinking": False}]], TAKES_VARIABLES),
    ("logits_processors", [[1], "f", None, lambda ids, row: row], "logits_processors must be a sequence of"),
]  # fmt: skip


@pytest.mark.parametrize(("keyword", "values", "says"), LOAD_CASES, ids=[c[0] for c in LOAD_CASES])
def test_load_refuses_a_keyword_of_the_wrong_type_or_range_naming_it(keyword, values, says):
    for value in values:
        args = {"target": "no-such-model.gguf", keyword: value}
        with pytest.raises(ValueError) as info:
            specchat.load(**args)
        assert str(info.value).startswith(says), (value, str(info.value))
        assert f"(got {value!r})" in str(info.value) or keyword == "draft"


@pytest.mark.parametrize(("keyword", "values", "says"), STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_an_answer_refuses_a_keyword_of_the_wrong_type_or_range_naming_it(keyword, values, says):
    for value in values:
        for call in (specchat.stream, specchat.generate):
            args = {"prompt": PROMPT, keyword: value}
            with pytest.raises(ValueError) as info:
                call(unloaded(), **args)
            assert str(info.value).startswith(says), (value, str(info.value))


def test_an_answer_needs_the_model_load_returned():
    for model in (None, "qwen2.5-coder-1.5b"):
        with pytest.raises(ValueError, match=r"^model must be what specchat.load returned"):
            specchat.generate(model, PROMPT)  # type: ignore[arg-type]


def test_keywords_of_the_right_kind_pass_the_checks():
    """What the checks take: numpy integers where an integer goes, path objects for models, a tuple of
    drafters; the load then fails only because the model does not exist."""
    for kwargs in (
        {"k": np.int64(3), "ctx_size": np.int32(64), "p_min": np.float64(0.5), "top_k": np.int64(2)},
        {"draft": ("ngram",), "gpu_layers": -1, "draft_gpu_layers": 0, "threads": 1, "temperature": 1},
    ):
        with pytest.raises(ModelNotFound):
            specchat.load(Path("no-such-model.gguf"), **kwargs)  # type: ignore[arg-type]


def test_a_stock_llama_cpp_build_is_a_warning_at_load(tiny_target, monkeypatch):
    """What `run` prints before answering is a `warnings.warn` here: on a stock build, which build it
    is and how to get the patched one."""
    from specchat.llama import build, buildcheck

    stock = {"key": "stockbuild00", "version": build.PINNED, "libraries": []}
    monkeypatch.setattr(buildcheck, "build_identity", lambda: stock)
    with pytest.warns(UserWarning, match=r"^stock llama-cpp-python .*make install") as caught:
        loaded = specchat.load(str(tiny_target), draft=(), threads=1, ctx_size=128)
    with loaded:
        assert loaded.warnings[0].startswith("stock llama-cpp-python")
        assert loaded.warnings[0] in {str(w.message) for w in caught}
        assert len(specchat.generate(loaded, PROMPT, max_tokens=2).tokens) == 2
