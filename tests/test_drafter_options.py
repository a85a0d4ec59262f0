"""Configuring a model-free drafter where it is named (`--draft ngram:max_n=12,min_n=3`), the default
drafters read from the registry's table, and FixedK's use of every drafter it is given."""

from __future__ import annotations

import json
from types import MappingProxyType

import numpy as np
import pytest
from typer.testing import CliRunner

from specchat.cli import app
from specchat.decoding import registry
from specchat.decoding.drafters import ModelDrafter
from specchat.decoding.events import Token
from specchat.decoding.loop import NO_DRAFT, FixedK, Plan, Settings, generate
from specchat.decoding.ngram import NgramDrafter
from specchat.errors import BadInput
from specchat.models import loader

from .fakes import FakeModel, plain_greedy

runner = CliRunner()


def test_a_spec_with_options_builds_the_drafter_with_them_and_names_it_by_the_spec():
    d = registry.make("ngram:max_n=12, min_n=3,follow=false")
    assert isinstance(d, NgramDrafter) and (d.max_n, d.min_n, d.follow) == (12, 3, False)
    assert d.name == "ngram:max_n=12, min_n=3,follow=false"  # apart from a plain `ngram` in the stats
    assert registry.make("ngram").name == "ngram" and registry.is_model_free("ngram:max_n=4")
    assert registry.MODEL_FREE["answers"].make(max_answers="3").max_answers == 3  # text, as --draft gives it
    assert registry.MODEL_FREE["ngram"].options() == {
        "max_n": 8, "min_n": 2, "follow": True, "learn_edits": True, "resync": True
    }  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("ngram:max=12", "drafter ngram has no option 'max'"),
        ("ngram:name=x", "drafter ngram has no option 'name'"),
        ("ngram:tree_width=2", "drafter ngram has no option 'tree_width'"),  # --tree-width sets it
        ("ngram:max_n=many", "drafter ngram: max_n must be an integer (got 'many')"),
        ("ngram:follow=maybe", "drafter ngram: follow must be true or false (got 'maybe')"),
        ("ngram:min_n=9", "drafter ngram: min_n and max_n must satisfy 1 <= min_n <= max_n"),
        ("answers:min_n=0", "drafter answers: max_answers, max_stored and min_n must be positive"),
        ("ngram:max_n", "'max_n' is not key=value"),
    ],
)
def test_a_bad_option_is_one_line_naming_the_drafter_and_the_form(spec, says):
    with pytest.raises(BadInput) as info:
        registry.make(spec)
    assert says in info.value.message and "NAME:key=value" in (info.value.hint or "")


def test_on_the_command_line_a_bad_option_is_one_line_before_anything_loads():
    res = runner.invoke(app, ["run", "no-such-model.gguf", "--draft", "ngram:max_n=x", "-p", "hi"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: drafter ngram: max_n must be an integer")
    assert "ngram:max_n=12,min_n=3" in runner.invoke(app, ["run", "--help"], env={"COLUMNS": "300"}).stdout


def test_a_configured_drafter_runs_and_the_answer_is_the_targets(tiny_target):
    def run(*draft: str) -> dict:
        args = ["run", str(tiny_target), "-p", "Once upon a time", "-n", "24", "--json", "--threads", "1"]
        res = runner.invoke(app, [*args, "--ctx-size", "256", "-k", "3", *draft])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    plain = run("--no-draft")
    drafted = run("--draft", "ngram:max_n=3,min_n=1")
    assert drafted["tokens"] == plain["tokens"]
    assert drafted["drafts"] == ["ngram:max_n=3,min_n=1"]


def test_the_defaults_come_from_the_registry_table(monkeypatch, tiny_target):
    local = str(tiny_target)  # outside the registry: no recommended draft model
    assert loader.default_drafts(local) == registry.defaults() == ("ngram",)
    assert loader.default_drafts("qwen2.5-coder-1.5b") == ("qwen2.5-coder-0.5b", "ngram")
    entries = {
        **registry.MODEL_FREE,
        "answers": registry.ModelFree("answers", "answers:AnswersDrafter", "earlier answers", default=True),
    }
    monkeypatch.setattr(registry, "MODEL_FREE", MappingProxyType(entries))
    assert loader.default_drafts(local) == ("ngram", "answers")
    from specchat.cli.bench import bench_drafts

    assert bench_drafts(local) == ("ngram", "answers")


class Lookup:
    """A model-free drafter that has a proposal only after `after` (a route) and records prepare."""

    def __init__(self, name: str, after: int, proposal: list[int]) -> None:
        self.name, self.after, self.proposal = name, after, proposal
        self.source = NgramDrafter.source
        self.model, self.prior, self.route_priors, self.p_min = None, (1.0, 1.0), {}, None
        self.per_pass = False
        self.pass_share = 0.0
        self.prepared: list[int] = []

    def route(self, context):
        return "here" if context[-1] == self.after else None

    def propose(self, context, k, params, rng, *, budget=None, processor=None):
        from specchat.decoding.drafters import Proposal

        return Proposal(tokens=self.proposal[:k])

    def lag(self, context):
        return 0

    def prepare(self, context):
        self.prepared.append(len(context))

    def settle(self, context):
        return None

    def reset(self):
        return None


def test_fixed_k_drafts_with_the_first_drafter_that_has_a_proposal_and_prepares_them_all():
    planner = FixedK(3)
    assert planner.plan(8, [None, "model", "here"]) == Plan(1, 3)
    assert planner.plan(8, ["here", "model"]) == Plan(0, 3)
    assert planner.plan(8, [None, None]) == NO_DRAFT and FixedK(0).plan(8, ["here"]) == NO_DRAFT
    assert planner.begin_answer([0, 5, 0], 100) == [True, True, True]
    assert FixedK(0).begin_answer([0, 5], 100) == [False, False]

    target = FakeModel(seed=5, n_vocab=16)
    prompt = [1, 2, 3, 4]
    want = plain_greedy(target, prompt, 30)
    first = Lookup("first", after=-1, proposal=[])  # never has a proposal
    second = Lookup("second", after=prompt[-1], proposal=want[:3])  # has one for the first round
    draft = FakeModel(seed=5, n_vocab=16, table=target.table)
    events = list(
        generate(target, prompt, drafters=[first, second, ModelDrafter(draft, p_min=0.0)],
                 planner=planner, settings=Settings(max_tokens=30), rng=np.random.default_rng(0))
    )  # fmt: skip
    tokens = [e for e in events if isinstance(e, Token)]
    assert [t.id for t in tokens] == want
    assert first.prepared == second.prepared == [len(prompt) - 1]  # every drafter it may use
    assert {t.drafter for t in tokens} >= {"second", "fake"}  # the lookup where it had one, the model else
