"""The store of earlier answers (`--draft answers`): exact whatever it proposes, drafts a repeated
answer from the store, forgets on reset and keeps to its bounds."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from specchat.cli import app
from specchat.decoding import registry
from specchat.decoding.answers import LEAD_IN, AnswersDrafter
from specchat.decoding.events import Done, Round, Source, Token
from specchat.decoding.loop import FixedK, Settings, generate
from specchat.decoding.sampling import SamplingParams

from .fakes import FakeModel, plain_greedy
from .serving import client, loaded_engine, serving

G = SamplingParams()
RNG = np.random.default_rng(0)


def answer(target: FakeModel, drafter: AnswersDrafter, prompt: list[int], *, k: int = 4, n: int = 40):
    """One greedy answer through the loop: (its tokens, the tokens the drafter had accepted, rounds)."""
    target.truncate(0)
    events = list(
        generate(target, prompt, drafters=[drafter], planner=FixedK(k), settings=Settings(max_tokens=n))
    )
    assert isinstance(events[-1], Done)
    tokens = [e for e in events if isinstance(e, Token)]
    drafted = [t for t in tokens if t.drafter == drafter.name]
    assert all(t.source is Source.NGRAM for t in drafted)
    assert list(target.tokens) == [*prompt, *(t.id for t in tokens)][: len(target.tokens)]
    return [t.id for t in tokens], len(drafted), [e for e in events if isinstance(e, Round)]


def remember(d: AnswersDrafter, prompt: list[int], reply: list[int]) -> None:
    """What the loop does around one answer: prepare with the prompt less its last token, settle."""
    d.prepare(prompt[:-1])
    d.settle([*prompt, *reply])


def test_the_registry_builds_it_and_the_help_names_it():
    d = registry.make("answers")
    assert isinstance(d, AnswersDrafter) and d.name == "answers"
    assert d.model is None and d.p_min is None and d.lag([1, 2]) == 0
    assert "`answers`" in registry.described()


def test_the_same_prompt_again_is_drafted_from_the_first_answer():
    target = FakeModel(n_vocab=64, seed=3)
    d = AnswersDrafter()
    prompt = [5, 9, 14, 2, 33, 7]
    first, drafted, _ = answer(target, d, prompt)
    assert first == plain_greedy(target, prompt, 40)
    assert drafted == 0 and d.answers == 1  # nothing remembered yet; now the answer is
    again, drafted, rounds = answer(target, d, prompt)
    assert again == first
    # every round but the last drafts 4 tokens and all are accepted (the 5th is the target's bonus)
    assert drafted >= 0.75 * len(again)
    assert {r.route for r in rounds if r.drafter} <= set(d.route_priors)
    assert d.answers == 1  # the same answer is kept once


def test_an_answer_learned_while_the_planner_never_used_it_is_still_remembered():
    """With FixedK(0) the drafter is not prepared: the first round's route() sees the prompt."""
    target = FakeModel(n_vocab=64, seed=4)
    d = AnswersDrafter()
    prompt = [8, 1, 30, 12]
    list(generate(target, prompt, drafters=[d], planner=FixedK(0), settings=Settings(max_tokens=30)))
    _, drafted, _ = answer(target, d, prompt, n=30)
    assert drafted >= 20


@settings(max_examples=40, deadline=None)
@given(
    stored=st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=30), max_size=6),
    prompt=st.lists(st.integers(0, 7), min_size=1, max_size=12),
    k=st.integers(1, 6),
    seed=st.integers(0, 5),
)
def test_property_greedy_output_is_plain_decoding_whatever_it_proposes(stored, prompt, k, seed):
    target = FakeModel(n_vocab=8, seed=seed, sharpness=2.0)
    d = AnswersDrafter()
    for i, reply in enumerate(stored):  # answers of other prompts, mostly wrong here
        remember(d, [i % 8, *prompt[: i % 3]], reply)
    tokens, _, _ = answer(target, d, prompt, k=k, n=30)
    assert tokens == plain_greedy(target, prompt, 30)


def test_only_answer_tokens_are_proposed_never_the_prompt_before_them():
    d = AnswersDrafter()
    prompt = list(range(100, 110))
    remember(d, prompt, [50, 51, 52])
    assert d.propose([7, 103, 104], 3, G, RNG).tokens == []  # agrees inside the lead-in only
    assert d.propose([7, 108, 109], 5, G, RNG).tokens == [50, 51, 52]  # ends at the answer's end
    assert d.propose([1, 109, 50], 2, G, RNG).tokens == [51, 52]
    assert d.route([1, 109, 50]) == "match 2+"
    assert d.route([*prompt, 50]) == "match 8+"  # agreement counts back through the lead-in
    assert d.propose([9, 50], 2, G, RNG).tokens == []  # one token agreeing is too little


def test_the_place_agreeing_furthest_back_wins_then_the_newest():
    d = AnswersDrafter()
    remember(d, [1, 2], [10, 11, 12, 20])
    remember(d, [3, 4], [90, 11, 12, 30])
    remember(d, [5, 6], [91, 11, 12, 40])
    assert d.propose([10, 11, 12], 1, G, RNG).tokens == [20]  # 3 tokens agree there, 2 elsewhere
    assert d.propose([77, 11, 12], 1, G, RNG).tokens == [40]  # a tie: the newest answer


def test_reset_forgets_everything():
    target = FakeModel(n_vocab=64, seed=5)
    d = AnswersDrafter()
    prompt = [3, 1, 4, 1, 5]
    answer(target, d, prompt)
    d.reset()
    assert d.answers == 0 and d.stored == 0
    _, drafted, _ = answer(target, d, prompt)
    assert drafted == 0


def test_the_bounds_hold_oldest_out_first():
    d = AnswersDrafter(max_answers=3, max_stored=1000)
    prompts = [[1000 * i + j for j in range(3)] for i in range(1, 6)]
    replies = [[1000 * i + 100 + j for j in range(20)] for i in range(1, 6)]
    for p, r in zip(prompts, replies, strict=True):
        remember(d, p, r)
        assert d.answers <= 3
    assert d.answers == 3
    assert d.propose(prompts[0], 4, G, RNG).tokens == []  # the two oldest are forgotten
    assert d.propose(prompts[1], 4, G, RNG).tokens == []
    assert d.propose(prompts[4], 4, G, RNG).tokens == replies[4][:4]

    d = AnswersDrafter(max_stored=50)  # 3 prompt + 20 answer tokens each: two fit
    for p, r in zip(prompts, replies, strict=True):
        remember(d, p, r)
        assert d.stored <= 50
    assert d.answers == 2 and d.propose(prompts[2], 4, G, RNG).tokens == []
    assert d.propose(prompts[3], 4, G, RNG).tokens == replies[3][:4]


def test_an_answer_longer_than_the_bound_keeps_its_start_with_the_lead_in():
    d = AnswersDrafter(max_stored=LEAD_IN + 10)
    prompt = list(range(500, 500 + 2 * LEAD_IN))
    reply = list(range(20, 60))
    remember(d, prompt, reply)
    assert d.stored == LEAD_IN + 10
    assert d.propose(prompt, 16, G, RNG).tokens == reply[:10]


runner = CliRunner()


def test_cli_accepts_draft_answers_and_lists_it(tiny_target):
    res = runner.invoke(app, ["run", "--help"])
    assert res.exit_code == 0 and "answers" in res.stdout
    res = runner.invoke(
        app,
        ["run", str(tiny_target), "--draft", "answers", "-p", "hi", "-n", "6", "--json", "--threads", "1",
         "--ctx-size", "256"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert 0 < doc["stats"]["generated_tokens"] <= 6
    assert doc["stats"]["drafted"] == 0  # one answer: nothing was remembered before it


def test_a_server_drafts_a_repeated_request_from_its_earlier_answer(tiny_target):
    """The case it is for: an agent sends the same request again and gets the same answer."""
    with loaded_engine(tiny_target, ("answers",)) as engine, serving(engine, k=3, max_tokens=24) as url:
        ask = client(url)

        def spec() -> dict[str, int]:
            reply = ask.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "list three fruits"}], temperature=0
            )
            return reply.model_extra["speculative"]  # type: ignore[index,return-value]

        first, again = spec(), spec()
    assert first["drafted"] == 0
    assert again["generated_tokens"] == first["generated_tokens"]
    assert again["accepted"] >= 0.6 * again["generated_tokens"]


def test_an_export_says_the_answers_drafter_is_left_out(tiny_target):
    for fmt in ("llama-server", "vllm"):
        res = runner.invoke(app, ["bench", str(tiny_target), "--draft", "answers", "--export", fmt])
        assert res.exit_code == 0, res.output
        assert "left out: answers" in res.stderr
