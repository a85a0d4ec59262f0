"""`chat_template_kwargs`: the chat template's extra variables (Qwen3's `enable_thinking`, ...) reach the
Jinja render through every front end (`run`, `chat`, `serve`, the Python API), on a tiny GGUF written
here with a template that branches on them; bad ones are one line (CLI), a 400 naming the field
(server) or a ValueError naming the keyword (API), before anything loads; and KV reuse stays right
when the variables change between requests (the rendered tokens differ: prefix matching sees it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

import specchat
from specchat.cli import app
from specchat.cli.options import parse_template_kwargs
from specchat.decoding.template_vars import RESERVED, TemplateVarsError, check_template_vars
from specchat.errors import BadInput
from specchat.llama.template import render_chat
from specchat.models import loader
from specchat.server.api import Defaults, parse_request
from specchat.server.fields import ApiError
from tests.serving import client, loaded_engine, serving
from tests.tiny_models import TARGET_SEED, write_tiny_llama

#: Qwen3's way, cut down: an empty think block when `enable_thinking` is false, and one more variable
#: of our own (`persona`) to show that any variable gets through, not only the one everyone sends.
THINKING = (
    "{% if persona is defined %}{{ '<|im_start|>system\\n' + persona + '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% endif %}{% endif %}"
)
OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
ON = "<|im_start|>assistant\n"
runner = CliRunner()


@pytest.fixture(scope="module")
def thinking_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target's weights under the thinking template (the tiny draft still fits it)."""
    path = tmp_path_factory.mktemp("thinking") / "thinking.gguf"
    return write_tiny_llama(path, seed=TARGET_SEED, chat_template=THINKING)


@pytest.fixture
def rendered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every prompt the chat template renders from now on, as text (the one render all front ends use)."""
    texts: list[str] = []

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        texts.append(render_chat(*args, **kwargs))
        return texts[-1]

    monkeypatch.setattr(loader, "render_chat", spy)
    return texts


# --- the checks, and the render itself ---------------------------------------------------------------------


def test_the_variables_reach_the_jinja_render():
    messages = [{"role": "user", "content": "hi"}]
    plain = render_chat(THINKING, messages, bos="", eos="<|im_end|>")
    assert plain.endswith("user\nhi<|im_end|>\n" + ON)
    off = render_chat(
        THINKING, messages, bos="", eos="", variables={"enable_thinking": False, "persona": "P"}
    )
    assert off.startswith("<|im_start|>system\nP<|im_end|>\n") and off.endswith(OFF)
    assert render_chat(THINKING, messages, bos="", eos="", variables={"enable_thinking": True}) == plain


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("x", "must be an object mapping template variables to values"),
        ([("enable_thinking", False)], "must be an object mapping"),
        ({"enable_thinking": "false"}, "`enable_thinking` must be true or false, not the string 'false'"),
        ({"enable_thinking": 0}, "`enable_thinking` must be true or false, not the number 0"),
        ({"messages": []}, "cannot set `messages`: specchat gives the template that variable itself"),
        ({"add_generation_prompt": False}, "cannot set `add_generation_prompt`"),
        ({1: True}, "variable names must be non-empty strings"),
        ({"": True}, "variable names must be non-empty strings"),
        ({"persona": object()}, "`persona` must be a JSON value"),
        ({"persona": {1: "x"}}, "`persona` must be a JSON value"),
    ],
)
def test_variables_specchat_cannot_hand_on_are_refused_naming_where_they_came_from(value, says):
    with pytest.raises(TemplateVarsError) as info:
        check_template_vars(value, "NAME")
    assert str(info.value).startswith("NAME") and says in str(info.value)
    assert isinstance(info.value, ValueError)


def test_json_values_pass_as_they_are():
    given = {"enable_thinking": None, "persona": "P", "n": 2.5, "tags": ["a", {"b": [None, True]}]}
    assert check_template_vars(given, "x") == given
    assert check_template_vars(None, "x") == {}
    assert {"messages", "tools", "bos_token", "eos_token", "add_generation_prompt"} <= RESERVED


def test_the_command_line_reads_json_then_key_value_pairs_over_it():
    assert parse_template_kwargs(None, None) == {}
    got = parse_template_kwargs(
        '{"enable_thinking": true, "persona": "a"}',
        ["enable_thinking=false", "depth=3", "persona=pirate", "tags=[1, 2]", "note=a=b"],
    )
    assert got == {"enable_thinking": False, "persona": "pirate", "depth": 3, "tags": [1, 2], "note": "a=b"}
    for given, pairs, says in (
        ("{bad", None, "--chat-template-kwargs is not valid JSON"),
        ('["enable_thinking"]', None, "--chat-template-kwargs must be an object mapping"),
        (None, ["enable_thinking"], "--chat-template-kwarg takes KEY=VALUE (got 'enable_thinking')"),
        (None, ["=1"], "--chat-template-kwarg takes KEY=VALUE"),
        (None, ["enable_thinking=False"], "--chat-template-kwarg: `enable_thinking` must be true or false"),
        (None, ["tools=[]"], "--chat-template-kwarg cannot set `tools`"),
    ):
        with pytest.raises(BadInput) as info:
            parse_template_kwargs(given, pairs)
        assert str(info.value).startswith(says), str(info.value)


@pytest.mark.parametrize("command", ["run", "chat", "serve"])
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--chat-template-kwargs", "{not json"], "error: --chat-template-kwargs is not valid JSON"),
        (["--chat-template-kwarg", "enable_thinking=no"], "`enable_thinking` must be true or false"),
    ],
)
def test_a_bad_variable_is_one_line_before_anything_loads(command, args, says):
    """The model named does not exist: the variables are refused first, in one line, no traceback."""
    prompt = ["-p", "hi"] if command == "run" else []
    res = runner.invoke(app, [command, "no-such-model.gguf", *args, *prompt])
    assert res.exit_code == 2, res.output
    assert says in res.output and "Traceback" not in res.output
    assert len([line for line in res.output.splitlines() if line.startswith("error:")]) == 1


# --- through each front end, on the tiny model -------------------------------------------------------------


def test_run_hands_the_variables_to_the_template(thinking_target, rendered):
    base = ["run", str(thinking_target), "--no-draft", "-n", "2", "--json", "--threads", "1", "-c", "256"]
    plain = runner.invoke(app, [*base, "-p", "hi"])
    off = runner.invoke(
        app,
        [*base, "-p", "hi", "--chat-template-kwargs", '{"enable_thinking": true, "persona": "P"}',
         "--chat-template-kwarg", "enable_thinking=false"],
    )  # fmt: skip
    assert plain.exit_code == 0 and off.exit_code == 0, plain.output + off.output
    assert rendered[0].endswith(ON) and rendered[1].endswith(OFF) and "system\nP<|im_end|>" in rendered[1]
    added = len(json.loads(off.stdout)["prompt_tokens"]) - len(json.loads(plain.stdout)["prompt_tokens"])
    assert added > 0  # the think block and the persona are in the prompt that was decoded


def test_chat_hands_the_variables_to_the_template_every_turn(thinking_target, rendered):
    res = runner.invoke(
        app,
        ["chat", str(thinking_target), "--no-draft", "-n", "2", "--threads", "1", "-c", "256",
         "--chat-template-kwarg", "enable_thinking=false"],
        input="hello\nagain\n",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert len(rendered) == 2 and all(text.endswith(OFF) for text in rendered)
    assert "user\nagain<|im_end|>" in rendered[1]


def test_the_python_api_takes_them_at_load_and_per_answer(thinking_target, rendered):
    with specchat.load(
        str(thinking_target),
        draft=(),
        threads=1,
        ctx_size=256,
        chat_template_kwargs={"enable_thinking": False},
    ) as model:
        first = specchat.generate(model, "hi", max_tokens=2)
        specchat.generate(model, "hi", max_tokens=2, chat_template_kwargs={"enable_thinking": True})
        specchat.generate(model, "hi", max_tokens=2, chat_template_kwargs={"persona": "P"})
        with pytest.raises(
            ValueError, match=r"^chat_template_kwargs: `enable_thinking` must be true or false"
        ):
            specchat.generate(model, "hi", chat_template_kwargs={"enable_thinking": "no"})
        with pytest.raises(ValueError, match=r"^chat_template_kwargs must be an object mapping"):
            specchat.stream(model, "hi", chat_template_kwargs="enable_thinking=false")  # type: ignore[arg-type]
    assert [t.endswith(OFF) for t in rendered] == [True, False, True]  # the answer's own over load's
    assert rendered[2].startswith("<|im_start|>system\nP<|im_end|>")
    assert first.stats.prompt_tokens > 0


def test_load_refuses_bad_variables_before_anything_loads():
    with pytest.raises(ValueError, match=r"^chat_template_kwargs cannot set `messages`"):
        specchat.load("no-such-model.gguf", chat_template_kwargs={"messages": []})


# --- the server -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def thinking_engine(thinking_target, tiny_pair) -> Iterator[loader.LoadedEngine]:
    """The thinking target with the tiny draft and n-gram lookup, as `serve` loads them."""
    with loaded_engine(thinking_target, (str(tiny_pair[1]), "ngram")) as engine:
        yield engine


def chat(url: str, **fields: object) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0, **fields}
    return httpx.post(f"{url}/chat/completions", json=body, timeout=60)


def test_the_server_hands_the_request_variables_over_its_own_to_the_template(thinking_engine, rendered):
    with serving(thinking_engine, k=3) as url:
        plain = chat(url)
        off = chat(url, chat_template_kwargs={"enable_thinking": False, "persona": "P"})
    assert plain.status_code == off.status_code == 200, plain.text + off.text
    assert rendered[0].endswith(ON) and rendered[1].endswith(OFF) and "system\nP" in rendered[1]
    tokens = thinking_engine.tokenize(rendered[1], add_special=True)
    assert off.json()["usage"]["prompt_tokens"] == len(tokens) > plain.json()["usage"]["prompt_tokens"]


def test_the_command_line_variables_are_the_default_under_the_request_s():
    defaults = Defaults(max_tokens=8, template_kwargs={"enable_thinking": False, "persona": "P"})
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse_request("chat", body, defaults).template_kwargs == {"enable_thinking": False, "persona": "P"}
    mine = parse_request("chat", {**body, "chat_template_kwargs": {"enable_thinking": True}}, defaults)
    assert mine.template_kwargs == {"enable_thinking": True, "persona": "P"}
    assert parse_request("completion", {"prompt": "hi"}, defaults).template_kwargs == {}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (
            "enable_thinking=false",
            "chat_template_kwargs must be an object mapping template variables to values",
        ),
        ([{"enable_thinking": False}], "not an array"),
        ({"enable_thinking": "false"}, "`enable_thinking` must be true or false, not the string 'false'"),
        ({"messages": []}, "cannot set `messages`"),
    ],
)
def test_bad_chat_template_kwargs_are_a_400_naming_the_field(value, says):
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": value}
    with pytest.raises(ApiError) as info:
        parse_request("chat", body, Defaults(max_tokens=8))
    assert info.value.status == 400 and info.value.param == "chat_template_kwargs"
    assert says in info.value.message


def test_a_bad_field_is_a_400_over_http(tiny_url):
    r = chat(tiny_url, chat_template_kwargs={"enable_thinking": "no"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "chat_template_kwargs"
    assert "enable_thinking" in r.json()["error"]["message"]


@pytest.mark.parametrize("cache_bytes", [None, 64 << 20], ids=["kv-only", "prompt-cache"])
def test_changing_the_variables_between_requests_reuses_only_the_common_prefix(thinking_engine, cache_bytes):
    """Thinking off, on, off, on for one conversation: the prompts differ only in the think block at the
    end, so each request finds the other's prefix in the cache and decodes the rest; the answers to the
    same prompt are the same every time, and equal to answers without drafting."""
    messages = [{"role": "user", "content": "Tell me about rivers. " * 6}]

    def ask(c, thinking: bool, speculative: bool = True):  # type: ignore[no-untyped-def]
        r = c.chat.completions.create(
            model="tiny", messages=messages, max_tokens=12, temperature=0,
            extra_body={"chat_template_kwargs": {"enable_thinking": thinking}, "speculative": speculative},
        )  # fmt: skip
        return (
            r.choices[0].message.content,
            r.usage.prompt_tokens_details.cached_tokens,
            r.usage.prompt_tokens,
        )

    with serving(thinking_engine, k=3, cache_bytes=cache_bytes) as url:
        c = client(url)
        off0, on0, off1, on1 = ask(c, False), ask(c, True), ask(c, False), ask(c, True)
        plain_off, plain_on = ask(c, False, speculative=False), ask(c, True, speculative=False)
    assert off0[2] > on0[2]  # the think block: more prompt tokens
    assert on0[1] < on0[2] and off1[1] < off1[2]  # each change decodes what differs, not a stale cache
    assert on0[1] > 0.5 * on0[2]  # ... and reuses the conversation both share
    assert off0[0] == off1[0] == plain_off[0] and on0[0] == on1[0] == plain_on[0]


def test_serve_s_options_are_the_requests_default(thinking_target, monkeypatch):
    """From `specchat serve --chat-template-kwarg ...` to the Defaults every request is parsed with
    (the server itself is not started: creating its app ends the command here)."""
    import specchat.server.app as server_app

    seen: list[Defaults] = []

    def stop_at_create_app(worker, *, defaults, **_kw):  # type: ignore[no-untyped-def]
        seen.append(defaults)
        raise BadInput("stopped before serving")

    monkeypatch.setattr(server_app, "create_app", stop_at_create_app)
    res = runner.invoke(
        app,
        ["serve", str(thinking_target), "--no-draft", "--port", "0", "--threads", "1", "-c", "256",
         "--chat-template-kwargs", '{"persona": "P"}', "--chat-template-kwarg", "enable_thinking=false"],
    )  # fmt: skip
    assert "stopped before serving" in res.output, res.output
    assert seen[0].template_kwargs == {"persona": "P", "enable_thinking": False}
