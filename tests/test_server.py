"""`specchat serve`: the OpenAI-compatible API, driven by the official `openai` client.

In-process: uvicorn in a thread on 127.0.0.1 (a free port), over the tiny GGUF pair, or over a fake
backend whose decoding a test can hold still (queue overflow, hang-ups, shutdown mid-answer). The CLI
itself runs as a subprocess for Ctrl-C / SIGTERM. Wire-format rules (api.py, stops.py) are tested
directly.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import httpx
import openai
import pytest
from typer.testing import CliRunner

from specchat.cli import app as cli_app
from specchat.decoding.loop import FixedK
from specchat.decoding.sampling import SamplingParams
from specchat.errors import ContextFull
from specchat.server.api import ApiError, Defaults, parse_json, parse_request
from specchat.server.app import ServerThread, bind, create_app, is_loopback
from specchat.server.stops import StopFilter
from specchat.server.worker import Worker

from .fakes import FakeModel
from .serving import client, health, read_banner, serving, wait_until

SOURCES = {"draft", "ngram", "correction", "bonus", "target"}
HELLO = [{"role": "user", "content": "Tell me a story about a cat"}]


# --- a fake backend whose decoding a test controls ---------------------------------------------------------


class HeldModel(FakeModel):
    """A FakeModel whose decode waits for `gate` (and then takes `delay` seconds)."""

    def __init__(self, *args: object, delay: float = 0.0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate = threading.Event()
        self.gate.set()
        self.delay = delay

    def decode(self, tokens, logits_rows):  # type: ignore[no-untyped-def]
        assert self.gate.wait(20), "the test never opened the gate"
        if self.delay:
            time.sleep(self.delay)
        return super().decode(tokens, logits_rows)


class FakeBackend:
    """server.worker.Backend over a FakeModel: text -> ids by character, no drafters."""

    def __init__(self, *, n_ctx: int = 4096, delay: float = 0.0) -> None:
        self.target = HeldModel(40, seed=3, n_ctx=n_ctx, delay=delay)
        self.drafters: list[object] = []
        self.tie_margin = 0.0
        self.exact_rows = 0
        self.strict = False

    def render(
        self, messages: Sequence[dict[str, str]], tools: object = None, template_kwargs: object = None
    ) -> tuple[list[int], str | None]:
        return self.render_text("".join(m["content"] for m in messages))

    def render_text(self, text: str) -> tuple[list[int], str | None]:
        ids = [ord(c) % 32 for c in text] + [39]
        if len(ids) >= self.target.n_ctx:
            raise ContextFull(
                f"the prompt is {len(ids)} tokens but the context window is {self.target.n_ctx}"
            )
        return ids, None

    def planner(self, k: int | None, *, seed: int | None = None) -> FixedK:
        return FixedK(0)


# --- through the openai client, on the tiny pair ---------------------------------------------------------


def test_streamed_and_plain_answers_agree_and_carry_usage_and_speculative(tiny_url):
    c = client(tiny_url)
    plain = c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=24, temperature=0)
    text = plain.choices[0].message.content
    assert text and plain.choices[0].finish_reason == "length"
    assert plain.usage.completion_tokens == 24
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + 24
    spec = plain.model_extra["speculative"]
    for key in ("drafted", "accepted", "acceptance_rate", "target_passes", "tokens_per_pass", "k_history"):
        assert key in spec
    assert spec["accepted"] > 0 and spec["target_passes"] < 24  # the draft model is right most of the time
    assert [d["name"] for d in spec["drafters"]] and max(spec["k_history"]) == 3  # -k 3

    chunks = list(
        c.chat.completions.create(
            model="tiny",
            messages=HELLO,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == text
    pieces = [p for ch in chunks for p in (ch.model_extra or {}).get("pieces", [])]
    assert "".join(p["text"] for p in pieces) == text
    assert {p["source"] for p in pieces} <= SOURCES and "draft" in {p["source"] for p in pieces}
    finish = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    assert finish[0].model_extra["speculative"]["generated_tokens"] == 24
    last = chunks[-1]  # include_usage: the extra chunk with no choices
    assert last.choices == [] and last.usage.completion_tokens == 24 and "speculative" in last.model_extra


def test_completions_endpoint_streamed_and_plain_agree(tiny_url):
    c = client(tiny_url)
    plain = c.completions.create(model="tiny", prompt="def fibonacci(n):", max_tokens=16, temperature=0)
    assert plain.usage.completion_tokens == 16 and "speculative" in plain.model_extra
    stream = c.completions.create(
        model="tiny", prompt="def fibonacci(n):", max_tokens=16, temperature=0, stream=True
    )
    chunks = list(stream)
    assert "".join(ch.choices[0].text for ch in chunks) == plain.choices[0].text
    assert chunks[-1].usage.completion_tokens == 16  # the last chunk carries usage even unasked


def test_resent_conversation_decodes_only_the_new_tokens(tiny_url):
    c = client(tiny_url)
    first = c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0)
    turn2 = [
        *HELLO,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And then?"},
    ]
    second = c.chat.completions.create(model="tiny", messages=turn2, max_tokens=12, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens  # all of turn 1's prompt came from the KV cache
    spec = second.model_extra["speculative"]
    assert spec["prefill_tokens"] == second.usage.prompt_tokens - 1 - cached
    again = c.chat.completions.create(model="tiny", messages=turn2, max_tokens=12, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == second.choices[0].message.content


def test_three_concurrent_requests_are_all_answered(tiny_url):
    c = client(tiny_url)
    alone = c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=16, temperature=0)
    answers: list[str | None] = [None] * 3

    def ask(i: int) -> None:
        r = c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=16, temperature=0)
        answers[i] = r.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers == [alone.choices[0].message.content] * 3


def test_hang_up_mid_stream_does_not_hurt_the_next_request(tiny_url):
    c = client(tiny_url)
    before = c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=20, temperature=0)
    body = {"messages": HELLO, "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{tiny_url}/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # the role chunk; then hang up
    wait_until(lambda: not health(tiny_url)["busy"])
    after = c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=20, temperature=0)
    assert after.choices[0].message.content == before.choices[0].message.content


def test_stop_strings_cut_the_answer(tiny_url):
    c = client(tiny_url)
    args = {"model": "tiny", "prompt": "Once upon", "max_tokens": 24, "temperature": 0}
    full = c.completions.create(**args).choices[0].text
    stop = full[5:8]
    assert stop and stop not in full[:5]
    want = full[: full.index(stop)]
    cut = c.completions.create(**args, stop=[stop])
    assert cut.choices[0].text == want and cut.choices[0].finish_reason == "stop"
    chunks = list(c.completions.create(**args, stop=[stop], stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(tiny_url):
    c = client(tiny_url)
    args = {"model": "tiny", "messages": HELLO, "max_tokens": 16, "temperature": 0.9, "seed": 5}
    texts = {c.chat.completions.create(**args).choices[0].message.content for _ in range(2)}
    assert len(texts) == 1


BAD = [
    (b"not json", "invalid_json", None),
    (b"[1, 2]", "invalid_json", None),
    (b'{"model": "tiny"}', None, "messages"),
    (b'{"messages": "hi"}', None, "messages"),
    (b'{"messages": [{"role": "wizard", "content": "x"}]}', None, "messages[0].role"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}', None, "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_p": 2}', None, "top_p"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', None, "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stop": [1]}', None, "stop"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 9}', None, "n"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', None, "n"),
    (
        b'{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}',
        None,
        "top_logprobs",
    ),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}', None, "top_logprobs"),
    (b'{"messages": [{"role": "user", "content": "x"}], "logprobs": 5}', None, "logprobs"),
    (b'{"messages": [{"role": "user", "content": "x"}], "speculative": "off"}', None, "speculative"),
]


@pytest.mark.parametrize(("raw", "code", "param"), BAD)
def test_bad_input_is_a_400_with_an_openai_error(tiny_url, raw, code, param):
    r = httpx.post(f"{tiny_url}/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and (code is None or err["code"] == code)
    assert "Traceback" not in r.text


def test_a_prompt_beyond_the_context_is_a_400_also_when_streamed(tiny_url):
    c = client(tiny_url)
    long = [{"role": "user", "content": "word " * 700}]  # the tiny pair is loaded with ctx 512
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model="tiny", messages=long, max_tokens=4, stream=stream)
        assert info.value.status_code == 400
        assert info.value.body["code"] == "context_length_exceeded"
    ok = c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=4, extra_body={"frobnicate": 1})
    assert ok.usage.completion_tokens == 4  # unknown fields are ignored; the server is alive


def test_unknown_route_and_method_are_json(tiny_url):
    base = tiny_url.removesuffix("/v1")
    r = httpx.get(f"{base}/v1/embeddings")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(f"{tiny_url}/chat/completions")
    assert r.status_code == 405 and "error" in r.json()
    models = client(tiny_url).models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_api_key_is_required_when_set(tiny_engine):
    with serving(tiny_engine, api_key="s3cret") as url:
        with pytest.raises(openai.AuthenticationError) as info:
            client(url, "wrong").chat.completions.create(model="tiny", messages=HELLO, max_tokens=2)
        assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
        assert httpx.get(f"{url}/models").status_code == 401  # no key at all
        ok = client(url, "s3cret").chat.completions.create(model="tiny", messages=HELLO, max_tokens=2)
        assert ok.usage.completion_tokens == 2
        assert health(url)["status"] == "ok"  # the health check needs no key


# --- queue, hang-ups and shutdown, on a fake backend held still ---------------------------------------------


def _post(url: str, results: list, body: dict) -> None:
    results.append(httpx.post(f"{url}/completions", json=body, timeout=30))


def test_queue_overflow_is_a_503_with_retry_after():
    backend = FakeBackend()
    with serving(backend, queue=1) as url:
        backend.target.gate.clear()  # the first request will wait inside decode
        results: list[httpx.Response] = []
        body = {"prompt": "hello", "max_tokens": 3}
        first = threading.Thread(target=_post, args=(url, results, body))
        first.start()
        wait_until(lambda: health(url)["busy"])
        second = threading.Thread(target=_post, args=(url, results, body))
        second.start()
        wait_until(lambda: health(url)["waiting"] == 1)
        r = httpx.post(f"{url}/completions", json=body, timeout=10)
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "queue_full"
        backend.target.gate.set()
        first.join(30)
        second.join(30)
        assert [x.status_code for x in results] == [200, 200]
        assert all(x.json()["usage"]["completion_tokens"] == 3 for x in results)


def test_hang_up_stops_the_generation_within_a_round_and_keeps_the_cache_consistent():
    backend = FakeBackend(delay=0.01)
    with serving(backend) as url:
        body = {"prompt": "abc", "max_tokens": 2000, "stream": True}
        with httpx.stream("POST", f"{url}/completions", json=body, timeout=30) as r:
            lines = (ln for ln in r.iter_lines() if ln)
            assert '"pieces"' in next(lines) and '"pieces"' in next(lines)
        wait_until(lambda: not health(url)["busy"])
        target = backend.target
        decodes = len(target.decode_calls)
        assert decodes < 500  # stopped long before its 2000 tokens
        time.sleep(0.1)
        assert len(target.decode_calls) == decodes  # and stays stopped
        prompt = [ord(c) % 32 for c in "abc"] + [39]
        assert list(target.tokens[: len(prompt)]) == prompt  # the cache holds the prompt + a prefix
        again = httpx.post(f"{url}/completions", json={"prompt": "abc", "max_tokens": 5}, timeout=30).json()
        assert again["usage"]["completion_tokens"] == 5
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt) - 1


def test_shutdown_ends_the_current_answer_and_refuses_the_waiting():
    backend = FakeBackend()
    worker = Worker(backend, queue_size=4)  # type: ignore[arg-type]
    app = create_app(worker, model="fake", defaults=Defaults(max_tokens=50))
    http = ServerThread(app, bind("127.0.0.1", 0), graceful_seconds=5)
    worker.start()
    http.start()
    url = f"http://127.0.0.1:{http.port}/v1"
    try:
        backend.target.gate.clear()
        results: list[httpx.Response] = []
        body = {"prompt": "hello", "max_tokens": 50}
        threads = [threading.Thread(target=_post, args=(url, results, body)) for _ in range(2)]
        threads[0].start()
        wait_until(lambda: health(url)["busy"])
        threads[1].start()
        wait_until(lambda: health(url)["waiting"] == 1)
        worker.shutdown()
        backend.target.gate.set()
        for t in threads:
            t.join(30)
    finally:
        worker.shutdown()
        http.stop(timeout=10)
        assert worker.join(timeout=10)
    by_status = {r.status_code: r.json() for r in results}
    assert set(by_status) == {200, 503}
    assert by_status[503]["error"]["code"] == "shutting_down"
    done = by_status[200]
    assert done["choices"][0]["finish_reason"] == "length"
    assert done["speculative"]["stop_reason"] == "interrupted" and done["usage"]["completion_tokens"] < 50


def test_shutdown_during_the_first_of_n_answers_answers_with_all_n():
    backend = FakeBackend()
    worker = Worker(backend, queue_size=4)  # type: ignore[arg-type]
    app = create_app(worker, model="fake", defaults=Defaults(max_tokens=50))
    http = ServerThread(app, bind("127.0.0.1", 0), graceful_seconds=5)
    worker.start()
    http.start()
    url = f"http://127.0.0.1:{http.port}/v1"
    try:
        backend.target.gate.clear()
        results: list[httpx.Response] = []
        thread = threading.Thread(
            target=_post, args=(url, results, {"prompt": "hi", "max_tokens": 50, "n": 3})
        )
        thread.start()
        wait_until(lambda: health(url)["busy"])
        worker.shutdown()
        backend.target.gate.set()
        thread.join(30)
    finally:
        worker.shutdown()
        http.stop(timeout=10)
        assert worker.join(timeout=10)
    body = results[0].json()
    assert results[0].status_code == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in body["choices"])
    stats = [c["speculative"] for c in body["choices"]]
    assert stats[0]["generated_tokens"] < 50 and [s["generated_tokens"] for s in stats[1:]] == [0, 0]
    assert all(s["stop_reason"] == "interrupted" for s in stats)


# --- the wire format ----------------------------------------------------------------------------------------


def test_request_defaults_and_accepted_forms():
    d = Defaults(
        max_tokens=99, params=SamplingParams(temperature=0.3, top_k=7, top_p=0.8), seed=4, system="be brief"
    )
    body = {
        "model": "anything",
        "messages": [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None},
        ],
        "max_completion_tokens": 5,
        "stop": "END",
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "someone",  # a field this server does not use: ignored
    }
    req = parse_request("chat", body, d)
    assert req.messages == (
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": ""},
    )
    assert (req.max_tokens, req.params, req.seed) == (5, d.params, 4)
    assert req.stop == ("END",) and req.stream and req.include_usage
    plain = parse_request("chat", {"messages": [{"role": "user", "content": "x"}]}, d)
    assert plain.messages[0] == {"role": "system", "content": "be brief"}  # --system when none sent
    assert plain.max_tokens == 99 and not plain.stream
    assert parse_request("completion", {"prompt": ["one"]}, d).prompt == "one"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["a", 3]}, "prompt"),
        ({}, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x", "top_k": -1}, "top_k"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x", "seed": "1"}, "seed"),
        ({"prompt": "x", "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ],
)
def test_bad_completion_fields_name_the_field(body, param):
    with pytest.raises(ApiError) as info:
        parse_request("completion", body, Defaults(max_tokens=8))
    assert info.value.status == 400 and info.value.param == param


def test_parse_json_refuses_what_is_not_an_object():
    assert parse_json(b'{"a": 1}') == {"a": 1}
    for raw in (b"", b"{", b'"text"', b"\xff"):
        with pytest.raises(ApiError):
            parse_json(raw)


def test_stop_filter_holds_back_possible_starts_and_cuts_at_the_first_stop():
    f = StopFilter(["</end>", "STOP"])
    assert f.feed([("hello <", "draft")]) == [("hello ", "draft")]  # "<" may start "</end>"
    assert f.feed([("/e", "target")]) == []
    assert f.feed([("x", "bonus")]) == [("<", "draft"), ("/e", "target"), ("x", "bonus")]
    assert f.feed([("ab ST", "draft"), ("OP tail", "ngram")]) == [("ab ", "draft")]
    assert f.stopped and f.feed([("more", "target")]) == [] and f.flush() == []
    g = StopFilter(["ab"])
    assert g.feed([("xa", "target")]) == [("x", "target")]
    assert g.flush() == [("a", "target")]  # the end came: "a" was no stop string after all
    assert StopFilter().feed([("", "target"), ("t", "draft")]) == [("t", "draft")]


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.10") and not is_loopback("example.org")


# --- the command --------------------------------------------------------------------------------------------

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--port", "70000"], "--port"),
        (["--queue", "-1"], "--queue"),
        (["--api-key", " "], "--api-key"),
        (["--top-p", "2"], "--top-p"),
        (["--port", "0", "--logit-bias", "99999999=1"], "--logit-bias names token 99999999"),  # once loaded
    ],
)
def test_serve_bad_options_are_one_line(tiny_target, args, needle):
    res = runner.invoke(cli_app, ["serve", str(tiny_target), *args])
    assert res.exit_code == 2 and needle in res.stderr and "Traceback" not in res.output
    assert len(res.stderr.strip().splitlines()) == 1


def test_non_loopback_host_without_key_warns(tiny_target):
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: the bind fails right after the warning
    res = runner.invoke(cli_app, ["serve", str(tiny_target), "--host", "192.0.2.1", "--port", "0"])
    assert "without --api-key" in res.stderr and "cannot listen on 192.0.2.1" in res.stderr
    assert res.exit_code == 2


def test_a_port_in_use_is_one_line_before_loading(tiny_target):
    taken = bind("127.0.0.1", 0)
    taken.listen()
    try:
        port = str(taken.getsockname()[1])
        res = runner.invoke(cli_app, ["serve", str(tiny_target), "--port", port])
    finally:
        taken.close()
    assert res.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in res.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_prints_how_to_call_it_answers_and_exits_0_on_a_signal(tiny_target, tmp_path, sig):
    env = {**os.environ, "SPECCHAT_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "specchat", "serve", str(tiny_target), "--draft", "ngram", "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--threads", "1", "--ctx-size", "256"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        banner, url = read_banner(proc)
        assert "curl" in banner and "OpenAI(base_url=" in banner and "model" in banner
        page = re.search(r"page:\s+(http://127\.0\.0\.1:\d+/) ", banner)
        assert page and page.group(1) == url.removesuffix("v1")
        assert httpx.get(page.group(1), timeout=10).headers["content-type"].startswith("text/html")
        reply = client(url).chat.completions.create(model="x", messages=HELLO, max_tokens=5)
        assert reply.usage.completion_tokens == 5
        proc.send_signal(sig)
        assert proc.stderr is not None
        rest = proc.stderr.read()
        assert proc.wait(timeout=30) == 0, rest
        assert "stopped" in rest and "Traceback" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bench_export_vllm_speculative_config(tiny_pair):
    target, draft = (str(p) for p in tiny_pair)
    res = runner.invoke(cli_app, ["bench", target, "--draft", draft, "--export", "vllm"])
    assert res.exit_code == 0, res.output
    line = res.stdout.strip()
    assert line.startswith("vllm serve ") and "--speculative-config" in line
    cfg = json.loads(line.split("--speculative-config ", 1)[1].strip("'"))
    assert cfg["method"] == "draft_model" and cfg["num_speculative_tokens"] >= 1
    ng = runner.invoke(cli_app, ["bench", target, "--draft", "ngram", "--export", "vllm"])
    cfg = json.loads(ng.stdout.strip().split("--speculative-config ", 1)[1].strip("'"))
    assert cfg["method"] == "ngram" and cfg["prompt_lookup_min"] >= 1 and cfg["prompt_lookup_max"] >= 2


def test_serve_makes_every_llama_cpp_call_on_the_thread_that_loaded_the_models(tiny_pair, monkeypatch):
    """With a drafter, loading calibrates the target (decodes on the loading thread); a
    second thread generating made llama.cpp's OpenMP keep two thread teams, and with more OpenMP
    threads than cores every barrier sleeps in the kernel (0.67x of --no-draft serving). So serve
    generates on the thread that loaded: every decode, calibration's and the answer's, on one."""
    from specchat.llama.engine import LlamaModel

    seen: list[tuple[int, str]] = []
    phase = ["load"]
    original = LlamaModel.decode

    def recording(self, tokens, logits_rows):  # type: ignore[no-untyped-def]
        seen.append((threading.get_ident(), phase[0]))
        return original(self, tokens, logits_rows)

    monkeypatch.setattr(LlamaModel, "decode", recording)
    probe = bind("127.0.0.1", 0)
    port = probe.getsockname()[1]
    probe.close()
    target, draft = (str(p) for p in tiny_pair)
    replies: list[object] = []

    def drive() -> None:
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.05)
            phase[0] = "serve"
            reply = client(url + "/v1").chat.completions.create(model="x", messages=HELLO, max_tokens=8)
            replies.append(reply)
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: an orderly stop

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    res = runner.invoke(
        cli_app,
        ["serve", target, "--draft", draft, "--draft", "ngram", "--port", str(port), "--ctx-size", "256"],
    )
    driver.join(timeout=30)
    assert res.exit_code == 0, res.output
    assert replies and replies[0].usage.completion_tokens == 8  # type: ignore[attr-defined]
    phases = {p for _, p in seen}
    assert phases == {"load", "serve"}, phases  # calibration decoded while loading, then the answer
    assert {t for t, _ in seen} == {threading.get_ident()}


def test_an_idle_worker_on_the_main_thread_sees_a_ctrl_c_that_landed_on_another_thread():
    """The kernel may hand a process's SIGINT to any thread; Python then runs its handler only when
    the main thread runs bytecode again. `specchat serve` idles in Worker.run on the main thread, and
    an unbounded Condition.wait there never returned: serve ignored that Ctrl-C (and a CI run hung).
    Here the signal is sent to a helper thread on purpose; the handler must run and stop the worker."""
    worker = Worker(FakeBackend(), queue_size=4)  # type: ignore[arg-type]
    seen: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        seen.append(signum)
        worker.shutdown()

    previous = signal.signal(signal.SIGINT, on_signal)
    helper = threading.Thread(
        target=lambda: (time.sleep(0.3), signal.pthread_kill(threading.get_ident(), signal.SIGINT))
    )
    try:
        helper.start()
        started = time.monotonic()
        worker.run()  # returns once the handler has shut it down
        took = time.monotonic() - started
    finally:
        signal.signal(signal.SIGINT, previous)
        helper.join()
    assert seen == [signal.SIGINT]
    assert took < 5
