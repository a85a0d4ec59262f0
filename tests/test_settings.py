"""The sampling settings' table (decoding/settings.py) and everything that reads it: each setting is
an option of run, chat and serve with its help and default, a checked HTTP field, and one range check.

The checks go over `SETTINGS`, so a setting added to the table is tested here without a new test."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from specchat.cli import app
from specchat.decoding.settings import SETTINGS, Range, SamplingParams, Setting, SettingError
from specchat.server.api import ApiError, Defaults, parse_request

runner = CliRunner()
COMMANDS = ("run", "chat", "serve")


def out_of_range(s: Setting) -> list[int | float]:
    """Values just outside the setting's range, on each side it has."""
    r = s.range
    bad: list[int | float] = [r.lo if r.lo_open else r.lo - 1]
    if r.hi is not None:
        bad.append(r.hi if r.hi_open else r.hi + 1)
    return [s.type(v) for v in bad]


CASES = [(s, v) for s in SETTINGS for v in out_of_range(s)]
IDS = [f"{s.name}={v:g}" for s, v in CASES]


def test_the_table_is_the_params_fields_and_their_defaults():
    assert [s.name for s in SETTINGS] == ["temperature", "top_k", "top_p", *[s.name for s in SETTINGS[3:]]]
    defaults = SamplingParams()
    for s in SETTINGS:
        assert getattr(defaults, s.name) == s.default and isinstance(s.default, s.type)
        assert s.default in s.range, s.name
        assert s.flag.startswith("--") and s.help
    assert SETTINGS[0].flag == "--temp"  # the one flag that is not --the-name


def test_range_words_and_bounds():
    assert str(Range(0.0)) == ">= 0" and str(Range(0.0, lo_open=True)) == "> 0"
    assert str(Range(0.0, 1.0, lo_open=True)) == "in (0, 1]"
    assert str(Range(0.0, 1.0, hi_open=True)) == "in [0, 1)"
    r = Range(0.0, 1.0, lo_open=True)
    assert 1.0 in r and 0.5 in r and 0.0 not in r and 1.5 not in r
    assert float("nan") not in Range(0.0) and float("inf") not in Range(0.0)


@pytest.mark.parametrize(("setting", "value"), CASES, ids=IDS)
def test_params_refuse_out_of_range_naming_the_setting(setting, value):
    with pytest.raises(SettingError) as info:
        SamplingParams(**{setting.name: value})
    assert info.value.setting is setting
    assert str(info.value).startswith(f"{setting.flag} must be {setting.range}")
    assert info.value.line("x").startswith("x must be")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_every_setting_with_its_help_and_default(command):
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    for s in SETTINGS:
        line = next((x for x in lines if x.startswith("│") and f" {s.flag} " in x), None)
        assert line is not None, (command, s.flag)
        assert s.help in line and f"[default: {s.default}]" in line, line
        if command == "serve":  # there they are the defaults of requests that leave them out
            assert f"send no `{s.name}`" in line


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("setting", "value"), CASES, ids=IDS)
def test_a_bad_value_on_the_command_line_is_one_line(command, setting, value):
    """Checked before anything loads (the target does not exist), as one line naming the flag."""
    res = runner.invoke(app, [command, "no-such-model.gguf", setting.flag, str(value)])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: {setting.flag} must be {setting.range} (got {value:g})"
    )


@pytest.mark.parametrize(("setting", "value"), CASES, ids=IDS)
def test_a_bad_value_in_a_request_is_a_400_naming_the_field(setting, value):
    for kind, body in (
        ("chat", {"messages": [{"role": "user", "content": "x"}]}),
        ("completion", {"prompt": "x"}),
    ):
        with pytest.raises(ApiError) as info:
            parse_request(kind, {**body, setting.name: value}, Defaults(max_tokens=8))  # type: ignore[arg-type]
        assert info.value.status == 400 and info.value.param == setting.name
        assert info.value.message.startswith(f"{setting.name} must be {setting.range}")


@pytest.mark.parametrize("setting", SETTINGS, ids=[s.name for s in SETTINGS])
def test_a_request_field_of_the_wrong_type_is_a_400(setting):
    for wrong in ("1", True, [1]):
        with pytest.raises(ApiError) as info:
            parse_request("completion", {"prompt": "x", setting.name: wrong}, Defaults(max_tokens=8))
        assert info.value.param == setting.name


def test_a_request_takes_what_it_sends_and_the_server_defaults_for_the_rest():
    served = SamplingParams(temperature=0.5, top_k=3)
    req = parse_request("completion", {"prompt": "x", "top_p": 0.5, "top_k": 2.0}, Defaults(8, served))
    assert req.params == SamplingParams(temperature=0.5, top_k=2, top_p=0.5)
    assert isinstance(req.params.top_k, int)
    assert parse_request("completion", {"prompt": "x"}, Defaults(8, served)).params == served


def test_command_line_settings_reach_the_sampler(tiny_target):
    """top-k 1 leaves only the top token whatever the temperature: the answer is the greedy one."""

    def tokens(*extra: str) -> list[int]:
        args = ["run", str(tiny_target), "--no-draft", "-p", "Once", "-n", "12", "--json", "--threads", "1"]
        res = runner.invoke(app, [*args, "--ctx-size", "256", *extra])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["tokens"]

    assert tokens("--temp", "1.5", "--top-k", "1", "--seed", "3") == tokens("--temp", "0")


def test_request_settings_reach_the_sampler(tiny_url):
    """min_p 0.999 leaves only the likeliest token (bar exact ties), so sampling hot gives the greedy
    answer: the field went from the body through the worker to the sampler."""

    def text(**fields: object) -> str:
        body = {"prompt": "Once upon a time", "max_tokens": 12, "speculative": False, **fields}
        r = httpx.post(f"{tiny_url}/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    assert text(temperature=1.5, min_p=0.999, seed=3) == text(temperature=0)
