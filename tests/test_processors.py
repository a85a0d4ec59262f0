"""Settings that need the answer so far (presence_penalty, frequency_penalty, logit_bias and a caller's
own logits processor): they do what OpenAI's API says they do, and speculative decoding with them is
still exact: greedy output equals plain decoding with the same settings token for token, sampling has
the processed target's distribution, and logprobs report the processed rows."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from specchat.cli import app
from specchat.decoding.drafters import ModelDrafter
from specchat.decoding.events import Done, Token
from specchat.decoding.loop import FixedK, Settings, generate
from specchat.decoding.ngram import NgramDrafter
from specchat.decoding.processors import AnswerProcessor, LogitBias, Penalties, for_params
from specchat.decoding.sampling import SamplingParams, probs

from .fakes import FakeModel

PROMPT = [1, 2, 3, 4]
runner = CliRunner()


def openai_row(logits: np.ndarray, generated: list[int], params: SamplingParams) -> np.ndarray:
    """OpenAI's definitions, written out independently of processors.py: logit -= presence *
    [count > 0] + frequency * count over the tokens generated so far, then the bias added."""
    row = logits.astype(np.float64)
    for token, count in Counter(generated).items():
        row[token] -= params.presence_penalty * (count > 0) + params.frequency_penalty * count
    for token, bias in params.logit_bias:
        row[token] += bias
    return row


def reference_greedy(model: FakeModel, params: SamplingParams, n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(openai_row(model.logits_after([*PROMPT, *out]), out, params))))
    return out


GREEDY = SamplingParams()


def decode(target, drafters=(), *, k=4, n=30, params=GREEDY, seed=0, **extra):
    target.truncate(0)
    events = list(
        generate(target, PROMPT, drafters=list(drafters), planner=FixedK(k if drafters else 0),
                 settings=Settings(max_tokens=n, params=params, **extra), rng=np.random.default_rng(seed))
    )  # fmt: skip
    assert isinstance(events[-1], Done)
    return [e for e in events if isinstance(e, Token)], events[-1].stats


def flat(values: list[float], n_vocab: int = 8) -> FakeModel:
    """A model whose logits are `values` after every context: what it repeats is plain to see."""
    row = np.array(values + [-5.0] * (n_vocab - len(values)), dtype=np.float32)
    return FakeModel(n_vocab=n_vocab, table=np.tile(row, (997, 1)))


# --- the processors themselves ----------------------------------------------------------------------------


def test_penalties_and_bias_follow_openais_definitions_and_never_change_the_row():
    row = np.arange(6, dtype=np.float32)
    seen = row.copy()
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=1.5, logit_bias={1: -100, 5: 2.5})
    processor = for_params(params)
    assert processor is not None
    out = processor([3, 3, 0, 3], row)
    assert out.dtype == np.float32 and np.array_equal(row, seen)  # a new row, the old one untouched
    assert out == pytest.approx(openai_row(row, [3, 3, 0, 3], params))
    assert out.tolist() == [-2.0, -99.0, 2.0, -2.0, 4.0, 7.5]
    assert Penalties(0.5, 1.0)([], row) is row and LogitBias(((9, 1.0),))([], row) is row  # nothing to do
    assert for_params(SamplingParams()) is None  # the default settings cost nothing
    assert Penalties(1.0)([7, 2], row)[2] == 1.0  # an id past the row (a draft's vocabulary) is skipped


def test_the_answer_processor_counts_only_the_answer_and_the_drafts_before_each_row():
    seen: list[list[int]] = []

    def spy(generated, row):
        seen.append(list(generated))
        return row

    answer = AnswerProcessor(spy, start=3)
    answer([9, 9, 9, 4, 5], np.zeros(2), [6])
    rows = answer.rows(np.zeros((3, 2)), [9, 9, 9, 4], [7, 8])
    rows[2], rows[0], rows[2]  # each row processed once, when first read
    assert seen == [[4, 5, 6], [4, 7, 8], [4]]


# --- what each setting does, as OpenAI's API does it --------------------------------------------------------


def test_frequency_penalty_makes_a_repeated_token_rarer_and_presence_penalty_brings_new_ones():
    model = flat([5.0, 4.0, 3.0, 2.0])  # plain greedy: token 0 forever
    plain = [t.id for t in decode(model, n=12)[0]]
    assert plain == [0] * 12
    for params in (SamplingParams(frequency_penalty=1.0), SamplingParams(presence_penalty=1.5)):
        out = [t.id for t in decode(model, n=12, params=params)[0]]
        assert out == reference_greedy(model, params, 12)
        assert out.count(0) < 12 and len(set(out)) > 1
    # logits 5, 4, 3: the second 0 ties with 1 at 4 (the lower id wins), the third is 3 against 4, ...
    frequency = SamplingParams(frequency_penalty=1.0)
    assert [t.id for t in decode(model, n=6, params=frequency)[0]] == [0, 0, 1, 0, 1, 2]


def test_a_bias_of_100_forces_a_token_and_of_minus_100_bans_it():
    model = FakeModel(seed=4, n_vocab=16)
    plain = [t.id for t in decode(model)[0]]
    common = Counter(plain).most_common(1)[0][0]
    banned = [t.id for t in decode(model, params=SamplingParams(logit_bias={common: -100}))[0]]
    assert common not in banned
    rare = next(t for t in range(16) if t not in plain)
    forced = [t.id for t in decode(model, params=SamplingParams(logit_bias={rare: 100}))[0]]
    assert forced == [rare] * 30
    hot = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, logit_bias={rare: 100})
    assert {t.id for t in decode(model, params=hot, seed=3)[0]} == {rare}  # sampling too


# --- exactness -------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    seed_t=st.integers(0, 50),
    seed_d=st.integers(0, 50),
    k=st.integers(1, 6),
    presence=st.sampled_from([0.0, 0.5, -0.5, 2.0]),
    frequency=st.sampled_from([0.0, 0.25, 1.0, -1.0]),
    bias=st.dictionaries(st.integers(0, 11), st.sampled_from([-100.0, -3.0, 2.0, 100.0]), max_size=2),
)
def test_greedy_with_any_settings_equals_plain_decoding_with_them(
    seed_t, seed_d, k, presence, frequency, bias
):
    params = SamplingParams(presence_penalty=presence, frequency_penalty=frequency, logit_bias=bias)
    target = FakeModel(seed=seed_t, n_vocab=12, order=1)
    draft = FakeModel(seed=seed_d, n_vocab=12, order=1)
    plain, _ = decode(target, params=params, n=25)
    assert [t.id for t in plain] == reference_greedy(target, params, 25)
    for drafters in (
        [ModelDrafter(draft, p_min=0.0)],
        [NgramDrafter(min_n=1)],
        [NgramDrafter(), ModelDrafter(draft, p_min=0.0)],
    ):
        fast, _ = decode(target, drafters, k=k, params=params, n=25)
        assert [t.id for t in fast] == [t.id for t in plain]
        assert list(target.tokens) == PROMPT + [t.id for t in fast][:-1]


def test_a_draft_model_drafts_from_the_processed_rows():
    """A forced token is drafted by the draft model too (all its drafts accepted); its q when sampling
    is the processed distribution it drew from."""
    target = FakeModel(seed=2, n_vocab=16)
    draft = FakeModel(seed=9, n_vocab=16)  # another model: it agrees with the target by chance only
    forced = SamplingParams(logit_bias={5: 100})
    tokens, stats = decode(target, [ModelDrafter(draft, p_min=0.0)], params=forced)
    assert [t.id for t in tokens] == [5] * 30 and stats.drafted > 0 and stats.accepted == stats.drafted

    hot = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, frequency_penalty=1.0, logit_bias={3: 2.0})
    answer = AnswerProcessor(for_params(hot), start=len(PROMPT))  # type: ignore[arg-type]
    context = [*PROMPT, 3, 3, 7]
    draft.truncate(0)
    out = ModelDrafter(draft, p_min=0.0).propose(context, 3, hot, np.random.default_rng(1), processor=answer)
    assert len(out.tokens) == 3 and out.q is not None
    for i, q in enumerate(out.q):
        drafted = out.tokens[:i]
        row = answer(context, draft.logits_after([*context, *drafted]), drafted)
        assert q == pytest.approx(probs(row, hot))


def test_sampling_with_penalties_keeps_the_processed_targets_distribution():
    """The joint distribution of the first two tokens over many seeded runs is the processed target's:
    the second token's row is penalised for the first, and the draft (another model) for its own."""
    vocab = 4
    target = FakeModel(seed=11, n_vocab=vocab, sharpness=1.0)
    draft = FakeModel(seed=12, n_vocab=vocab, sharpness=1.0)
    params = SamplingParams(
        temperature=1.0, top_k=0, top_p=1.0, frequency_penalty=1.5, presence_penalty=0.5, logit_bias={2: 1.0}
    )
    exact = np.zeros((vocab, vocab))
    p1 = probs(openai_row(target.logits_after(PROMPT), [], params), params)
    for a, b in itertools.product(range(vocab), repeat=2):
        exact[a, b] = p1[a] * probs(openai_row(target.logits_after([*PROMPT, a]), [a], params), params)[b]
    counts = np.zeros((vocab, vocab))
    rng = np.random.default_rng(5)
    drafter = ModelDrafter(draft, p_min=0.0)
    for _ in range(6000):
        toks = [
            e.id
            for e in generate(target, PROMPT, drafters=[drafter], planner=FixedK(2),
                              settings=Settings(max_tokens=2, params=params), rng=rng)
            if isinstance(e, Token)
        ]  # fmt: skip
        counts[toks[0], toks[1]] += 1
    tv = 0.5 * np.abs(counts.ravel() / counts.sum() - exact.ravel()).sum()
    assert tv < 0.04, tv  # 16 cells, 6000 draws: sampling noise alone gives about 0.02
    assert drafter.model.decode_calls  # the draft was used


def test_logprobs_report_the_processed_rows_the_same_with_drafts_as_without():
    target = FakeModel(seed=6, n_vocab=16)
    draft = FakeModel(seed=6, n_vocab=16, table=target.table)
    params = SamplingParams(frequency_penalty=0.75, logit_bias={4: -100, 9: 1.5})
    exact = {"logprobs": 3, "exact_rows": 8}  # fake batches are exact: greedy logprobs may draft
    plain, _ = decode(target, params=params, n=20, **exact)
    fast, stats = decode(target, [ModelDrafter(draft, p_min=0.0)], params=params, n=20, **exact)
    assert stats.accepted > 0 and [t.id for t in fast] == [t.id for t in plain]
    assert [t.logprob for t in fast] == [t.logprob for t in plain]
    generated: list[int] = []
    for t in plain:
        row = openai_row(target.logits_after([*PROMPT, *generated]), generated, params)
        ref = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
        assert t.logprob is not None and t.logprob.logprob == pytest.approx(ref[t.id], abs=1e-4)
        assert 4 not in [tok for tok, _ in t.logprob.top]  # banned: never among the likeliest
        generated.append(t.id)


def test_a_callers_own_processor_runs_after_the_settings_on_every_row():
    def even_only(generated, row):
        out = row.copy()
        out[1::2] = -1e9
        return out

    target = FakeModel(seed=8, n_vocab=16)
    draft = FakeModel(seed=8, n_vocab=16, table=target.table)
    plain, _ = decode(target, n=20, processors=(even_only,))
    fast, _ = decode(target, [ModelDrafter(draft, p_min=0.0)], n=20, processors=(even_only,))
    assert [t.id for t in fast] == [t.id for t in plain] and all(t.id % 2 == 0 for t in plain)


# --- through `run` and `serve`, on the tiny models -------------------------------------------------------


def run_json(target, *args: str, drafted: bool = False) -> list[int]:
    """The answer's tokens (`drafted`: checking the drafts were used)."""
    base = ["run", str(target), "-p", "Once upon a time", "-n", "32", "--json", "--threads", "1"]
    res = runner.invoke(app, [*base, "--ctx-size", "256", *args])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert not drafted or doc["stats"]["accepted"] > 0
    return doc["tokens"]


def test_run_takes_the_settings_and_drafting_with_them_equals_no_draft(tiny_pair):
    target, draft = tiny_pair
    plain = run_json(target, "--no-draft")
    common = Counter(plain).most_common(1)[0][0]
    for settings_ in (
        ["--frequency-penalty", "1.5"],
        ["--presence-penalty", "2", "--logit-bias", f"{plain[0]}=-3"],
        ["--logit-bias", f"{common}=-100"],
    ):
        alone = run_json(target, "--no-draft", *settings_)
        assert alone != plain
        for k in ("auto", "3"):  # the default planner, and one that drafts every round
            drafts = ["--draft", str(draft), "--draft", "ngram", "-k", k]
            assert run_json(target, *drafts, *settings_, drafted=k != "auto") == alone
    assert common not in run_json(target, "--no-draft", "--logit-bias", f"{common}=-100")
    penalised = run_json(target, "--no-draft", "--frequency-penalty", "2")
    assert penalised.count(common) < plain.count(common)
    forced = run_json(target, "--draft", str(draft), "--logit-bias", f"{plain[-1]}=100")
    assert forced == [plain[-1]] * 32


def test_a_bias_on_a_token_the_model_lacks_is_one_line(tiny_target):
    res = runner.invoke(app, ["run", str(tiny_target), "-p", "hi", "--logit-bias", "99999999=1"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --logit-bias names token 99999999, beyond")


def test_serve_takes_the_fields_and_drafting_with_them_equals_the_target_alone(tiny_url):
    accepted: list[int] = []

    def tokens(**fields: object) -> list[str]:
        body = {"prompt": "Once upon a time", "max_tokens": 24, "logprobs": 0, **fields}
        r = httpx.post(f"{tiny_url}/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        accepted.append(r.json()["speculative"]["accepted"])
        return r.json()["choices"][0]["logprobs"]["tokens"]

    plain = tokens(speculative=False)
    for fields in ({"frequency_penalty": 1.5}, {"presence_penalty": 2.0, "logit_bias": {"100": 5}}):
        alone = tokens(speculative=False, **fields)
        assert alone != plain and tokens(**fields) == alone
        assert accepted[-1] > 0  # the drafts were used (the server drafts 3 a round here)
    ids = httpx.post(
        f"{tiny_url.removesuffix('/v1')}/tokenize", json={"content": plain[0]}, timeout=10
    ).json()
    forced = tokens(logit_bias={str(ids["tokens"][0]): 100})
    assert set(forced) == {plain[0]}
    r = httpx.post(f"{tiny_url}/completions", json={"prompt": "x", "logit_bias": {"99999999": 1}}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"
    assert "beyond the vocabulary" in r.json()["error"]["message"]
    assert (
        httpx.post(f"{tiny_url}/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30).status_code
        == 200
    )
