"""The sampling settings' table (decoding/settings.py) and everything that reads it: each setting is
an option of run, chat and serve with its help and default, a checked HTTP field, and one range check.

The checks go over `SETTINGS`, so a setting added to the table is tested here without a new test."""

from __future__ import annotations

import json
import re

import httpx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st
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


NUMBERS = [s for s in SETTINGS if not s.per_token]
PER_TOKEN = [s for s in SETTINGS if s.per_token]
CASES = [(s, v) for s in NUMBERS for v in out_of_range(s)]
IDS = [f"{s.name}={v:g}" for s, v in CASES]


def test_the_table_is_the_params_fields_and_their_defaults():
    assert [s.name for s in SETTINGS] == ["temperature", "top_k", "top_p", *[s.name for s in SETTINGS[3:]]]
    defaults = SamplingParams()
    for s in SETTINGS:
        assert getattr(defaults, s.name) == s.default and isinstance(s.default, s.type)
        assert s.default == () if s.per_token else s.default in s.range, s.name
        assert s.flag.startswith("--") and s.help
    assert [s.name for s in PER_TOKEN] == ["logit_bias"]
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


def wrong_types(s: Setting) -> list[object]:
    """Values of the wrong type for the setting: a bool (an int to Python), a string, None, a list,
    and for an integer setting floats, a whole one included; for a per-token one, anything but a
    mapping (or pairs) from integer ids to numbers."""
    if s.per_token:
        return ["15=1", 5, None, {1: "x"}, {1: True}, {1.5: 1.0}, {True: 1.0}, [(1, 2, 3)]]
    common: list[object] = [True, False, "1", None, [1], {"x": 1}, b"1", complex(1, 0)]
    return [*common, 2.5, 2.0, float("nan")] if s.type is int else common


TYPE_CASES = [(s, v) for s in SETTINGS for v in wrong_types(s)]
TYPE_IDS = [f"{s.name}={v!r}" for s, v in TYPE_CASES]


@pytest.mark.parametrize(("setting", "value"), TYPE_CASES, ids=TYPE_IDS)
def test_params_refuse_a_value_of_the_wrong_type_naming_the_setting_and_what_it_takes(setting, value):
    """Over every setting of the table, so a new one is covered by adding it: a bool, a string, a
    float where an integer goes, ... are refused when the params are made, not deep in the sampler."""
    with pytest.raises(SettingError) as info:
        SamplingParams(**{setting.name: value})
    assert info.value.setting is setting
    takes = {int: "an integer", float: "a number", tuple: None}[setting.type]
    says = info.value.line(setting.name)
    assert says.startswith(f"{setting.name} ") and "must" in says and "\n" not in says
    if takes is not None:
        assert says == f"{setting.name} must be {takes} {setting.range} (got {value!r})"


@pytest.mark.parametrize("setting", NUMBERS, ids=[s.name for s in NUMBERS])
def test_nan_and_infinities_are_out_of_every_range(setting):
    for value in (float("nan"), float("inf"), -float("inf")):
        if setting.type is float:
            with pytest.raises(SettingError, match=f"must be {re.escape(str(setting.range))}"):
                SamplingParams(**{setting.name: value})


@pytest.mark.parametrize("setting", SETTINGS, ids=[s.name for s in SETTINGS])
def test_values_of_the_right_kind_are_held_as_the_settings_type(setting):
    """An int where a float goes, numpy scalars: taken, and held as the setting's own type, so equal
    settings compare and hash alike whatever their caller wrote."""
    if setting.per_token:
        params = SamplingParams(**{setting.name: {np.int64(3): np.float32(1.5), 2: 1}})
        held = getattr(params, setting.name)
        assert held == ((2, 1.0), (3, 1.5)) and all(type(t) is int and type(v) is float for t, v in held)
        return
    value = setting.default
    for kind in (setting.type, np.int64 if setting.type is int else np.float64):
        held = getattr(SamplingParams(**{setting.name: kind(value)}), setting.name)
        assert type(held) is setting.type and held == value
    if setting.type is float and float(int(value)) == value:
        assert type(getattr(SamplingParams(**{setting.name: int(value)}), setting.name)) is float


ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(0, 9), max_size=2),
    st.dictionaries(st.integers(-2, 9), st.one_of(st.floats(-200, 200), st.booleans(), st.text())),
)


@pytest.mark.parametrize("setting", SETTINGS, ids=[s.name for s in SETTINGS])
@examples(max_examples=60, deadline=None)
@given(value=ANYTHING)
def test_any_value_is_either_held_in_range_or_refused_naming_the_setting(setting, value):
    """The property every setting keeps, whatever it is given: either the params hold a value of its
    type within its range, or one SettingError names it (the Python API's ValueError)."""
    try:
        params = SamplingParams(**{setting.name: value})
    except SettingError as exc:
        assert exc.setting is setting and exc.line(setting.name).startswith(f"{setting.name} ")
        return
    held = getattr(params, setting.name)
    if setting.per_token:
        assert all(type(t) is int and t >= 0 and v in setting.range for t, v in held)
    else:
        assert type(held) is setting.type and held in setting.range


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_every_setting_with_its_help_and_default(command):
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    for s in SETTINGS:
        line = next((x for x in lines if x.startswith("│") and f" {s.flag} " in x), None)
        assert line is not None, (command, s.flag)
        assert s.help in line and (s.per_token or f"[default: {s.default}]" in line), line
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


# --- per-token settings (logit_bias): ID=VALUE pairs on the command line, a JSON object over HTTP --------


@pytest.mark.parametrize("setting", PER_TOKEN, ids=[s.name for s in PER_TOKEN])
def test_per_token_values_are_held_as_sorted_pairs_and_checked(setting):
    params = SamplingParams(**{setting.name: {7: 1, 3: -2.5}})
    assert getattr(params, setting.name) == ((3, -2.5), (7, 1.0)) and hash(params)
    assert setting.parse_pairs(["7=1,3=-2.5", "3=4"]) == ((3, 4.0), (7, 1.0))  # repeated: the last wins
    hi = setting.range.hi
    assert hi is not None
    for bad, says in (
        ({0: hi + 1}, f"values must be {setting.range} (got {hi + 1:g} for token 0)"),
        ({-1: 0.0}, "token ids must be integers >= 0 (got -1)"),
        ({"5": 1.0}, "token ids must be integers >= 0 (got '5')"),
        ({5: "x"}, "must map token ids to numbers"),
        ([1, 2], "must map token ids to numbers"),
    ):
        with pytest.raises(SettingError) as info:
            SamplingParams(**{setting.name: bad})
        assert info.value.line("x") == f"x {says}"
    with pytest.raises(SettingError) as info:
        params.check_vocab(5)
    assert info.value.line(setting.name) == f"{setting.name} names token 7, beyond the vocabulary (ids 0-4)"
    params.check_vocab(8)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0=101", "values must be in [-100, 100] (got 101 for token 0)"),
        ("5", "takes ID=VALUE pairs (got '5')"),
    ],
)
def test_a_bad_per_token_value_on_the_command_line_is_one_line(command, text, says):
    for s in PER_TOKEN:
        res = runner.invoke(app, [command, "no-such-model.gguf", s.flag, text])
        assert res.exit_code == 2, res.output
        lines = res.stderr.strip().splitlines()
        assert lines == [f"error: {s.flag} {says}"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"0": 101}, "values must be in [-100, 100] (got 101 for token 0)"),
        ({"x": 1}, "keys must be token ids (got 'x')"),
        ({"1": "x"}, "values must be numbers, not a string (token 1)"),
        ({"-3": 1}, "token ids must be integers >= 0 (got -3)"),
        ([1], "must be an object mapping token ids to numbers, not an array"),
    ],
)
def test_a_bad_per_token_field_in_a_request_is_a_400_naming_it(value, says):
    for s in PER_TOKEN:
        with pytest.raises(ApiError) as info:
            parse_request("completion", {"prompt": "x", s.name: value}, Defaults(max_tokens=8))
        assert info.value.status == 400 and info.value.param == s.name
        assert info.value.message == f"{s.name} {says}"
    req = parse_request("completion", {"prompt": "x", "logit_bias": {"9": -100, "2": 5}}, Defaults(8))
    assert req.params.logit_bias == ((2, 5.0), (9, -100.0))
