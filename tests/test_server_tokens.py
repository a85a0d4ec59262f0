"""`specchat serve`'s tokenizer endpoints (/tokenize, /detokenize, /tokenizer_info) in vLLM's and
llama-server's dialects, on the tiny GGUF models, and the worker's quick jobs behind them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specchat.decoding.sampling import SamplingParams
from specchat.server.api import ApiError, GenRequest
from specchat.server.tokens import parse_tokenize
from specchat.server.worker import Delta, Finished, Job, Worker

from .serving import loaded_engine, serving

TEXT = "Hello world, 媽 and 🤗"


def base(url: str) -> str:
    return url.removesuffix("/v1")


def post(url: str, path: str, body: object) -> httpx.Response:
    return httpx.post(base(url) + path, json=body, timeout=30)


@pytest.fixture(scope="module")
def spm_url(tiny_spm: Path) -> Iterator[str]:
    """A server over the SentencePiece tiny model, whose tokenizer adds a BOS."""
    with loaded_engine(tiny_spm) as engine, serving(engine) as url:
        yield url


def test_tokenize_and_detokenize_round_trip_in_both_dialects(tiny_url):
    vllm = post(tiny_url, "/tokenize", {"model": "tiny", "prompt": TEXT})
    assert vllm.status_code == 200, vllm.text
    body = vllm.json()
    ids = body["tokens"]
    assert body["count"] == len(ids) > 5 and body["max_model_len"] == 512
    assert all(isinstance(t, int) for t in ids) and body["token_strs"] is None
    llama = post(tiny_url, "/tokenize", {"content": TEXT})
    assert llama.json()["tokens"] == ids  # the gpt2-style tiny model adds no BOS either way
    back = post(tiny_url, "/detokenize", {"tokens": ids}).json()
    assert back["content"] == back["prompt"] == TEXT
    v1 = post(tiny_url, "/v1/tokenize", {"prompt": TEXT}).json()  # the /v1/ aliases answer the same
    assert v1["tokens"] == ids
    assert post(tiny_url, "/v1/detokenize", {"tokens": ids}).json()["prompt"] == TEXT


def test_special_tokens_are_parsed_and_written_back(tiny_url):
    ids = post(tiny_url, "/tokenize", {"prompt": "<|im_start|>user\nhi<|im_end|>"}).json()["tokens"]
    info = httpx.get(base(tiny_url) + "/tokenizer_info").json()
    assert ids[-1] == info["eos_token_id"]  # <|im_end|> is one control token, not its characters
    literal = post(tiny_url, "/tokenize", {"prompt": "<|im_end|>", "parse_special": False}).json()
    assert len(literal["tokens"]) > 1
    text = post(tiny_url, "/detokenize", {"tokens": ids}).json()["content"]
    assert text == "<|im_start|>user\nhi<|im_end|>"


def test_add_special_defaults_follow_the_dialect(spm_url):
    info = httpx.get(base(spm_url) + "/tokenizer_info").json()
    bos = info["bos_token_id"]
    assert info["bos_token"] == "<s>" and info["add_bos_token"] is True
    assert post(spm_url, "/tokenize", {"prompt": "abc"}).json()["tokens"][0] == bos  # vLLM: adds
    assert post(spm_url, "/tokenize", {"content": "abc"}).json()["tokens"][0] != bos  # llama-server: not
    assert post(spm_url, "/tokenize", {"content": "abc", "add_special": True}).json()["tokens"][0] == bos
    off = post(spm_url, "/tokenize", {"prompt": "abc", "add_special_tokens": False}).json()["tokens"]
    assert off[0] != bos


def test_with_pieces_and_token_strs(tiny_url):
    ids = post(tiny_url, "/tokenize", {"content": TEXT}).json()["tokens"]
    pieces = post(tiny_url, "/tokenize", {"content": TEXT, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert raw.decode() == TEXT
    assert any(isinstance(p["piece"], list) for p in pieces)  # bytes of 媽 split over byte tokens
    strs = post(tiny_url, "/tokenize", {"prompt": "Hello world", "return_token_strs": True}).json()
    assert "".join(strs["token_strs"]) == "Hello world"


def test_tokenizer_info_is_what_lm_eval_reads(tiny_url):
    info = httpx.get(base(tiny_url) + "/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and info["bos_token"] == "<|endoftext|>"
    assert info["pad_token"] == "<|endoftext|>" and info["pad_token_id"] == info["bos_token_id"]
    assert info["model_max_length"] == info["max_model_len"] == 512
    assert info["vocab_size"] == 512 and "<|im_start|>" in info["chat_template"]
    # lm-eval's RemoteTokenizer: eos_token_id = encode(eos_token)[0] with add_special_tokens false
    enc = post(tiny_url, "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False}).json()
    assert enc["tokens"] == [info["eos_token_id"]]
    assert httpx.get(base(tiny_url) + "/v1/tokenizer_info").json() == info


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/tokenize", {"content": ["a"]}, "content"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/tokenize", {"content": "a", "with_pieces": 1}, "with_pieces"),
        ("/detokenize", {}, "tokens"),
        ("/detokenize", {"tokens": "12"}, "tokens"),
        ("/detokenize", {"tokens": [1, -2]}, "tokens"),
        ("/detokenize", {"tokens": [1, 2.5]}, "tokens"),
        ("/detokenize", {"tokens": [1, 512]}, "tokens"),
    ],
)
def test_bad_tokenizer_input_is_a_400_naming_the_field(tiny_url, path, body, param):
    r = post(tiny_url, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    assert post(tiny_url, "/tokenize", {"prompt": "still serving"}).status_code == 200


def test_not_json_is_a_400(tiny_url):
    json_type = {"Content-Type": "application/json"}
    r = httpx.post(base(tiny_url) + "/tokenize", content=b"{nope", headers=json_type, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_parse_tokenize_dialects():
    assert parse_tokenize({"prompt": "x"}).add_special is True
    assert parse_tokenize({"content": "x"}).add_special is False
    assert parse_tokenize({"prompt": "x", "add_special": False}).add_special is False
    assert parse_tokenize({"content": "x", "add_special_tokens": True}).add_special is True


def test_a_quick_job_runs_between_rounds_of_a_generation(tiny_engine):
    """A tokenizer request sent while an answer generates is answered before the answer ends: the
    worker runs it at the next round, while the cache holds only part of the answer."""
    worker = Worker(tiny_engine, k=3)
    worker.start()
    req = GenRequest(
        kind="completion",
        prompt="Once upon a time",
        max_tokens=200,
        params=SamplingParams(temperature=0.0, top_p=1.0),
        seed=0,
    )

    async def scenario() -> tuple[int, int, list[object]]:
        job = Job(req, asyncio.get_running_loop())
        worker.submit(job)
        first = await job.out.get()
        while not isinstance(first, Delta):
            first = await job.out.get()
        cached = await asyncio.wrap_future(worker.call(lambda b: len(b.target.tokens)))
        rest: list[object] = []
        while not rest or not isinstance(rest[-1], Finished):
            rest.append(await job.out.get())
        final = rest[-1]
        assert isinstance(final, Finished)
        return cached, final.stats.prompt_tokens + final.stats.generated_tokens, rest

    try:
        cached, total, rest = asyncio.run(scenario())
    finally:
        worker.shutdown()
        assert worker.join(timeout=10)
    assert cached < total - 10  # ran mid-answer, not after it
    assert any(isinstance(m, Delta) for m in rest[:-1])


def test_quick_jobs_go_before_a_waiting_generation_and_their_errors_are_the_callers(tiny_engine):
    """Worker.call work queued beside a generation runs first (before that generation starts), and
    an error it raises goes to its caller only: the generation then runs as usual."""
    worker = Worker(tiny_engine, k=3)  # not started yet: everything below waits
    req = GenRequest(kind="completion", prompt="Once", max_tokens=4, params=SamplingParams(), seed=0)

    def refuse(_backend: object) -> None:
        raise ApiError("refused", param="x")

    async def scenario() -> tuple[bool, BaseException | None, object]:
        job = Job(req, asyncio.get_running_loop())
        worker.submit(job)
        busy = worker.call(lambda _b: worker.status()["busy"])
        failing = worker.call(refuse)
        worker.start()
        was_busy = await asyncio.wrap_future(busy)
        error: BaseException | None = None
        try:
            await asyncio.wrap_future(failing)
        except ApiError as exc:
            error = exc
        last = await job.out.get()
        while not isinstance(last, Finished):
            last = await job.out.get()
        return was_busy, error, last

    try:
        was_busy, error, last = asyncio.run(scenario())
    finally:
        worker.shutdown()
        assert worker.join(timeout=10)
    assert was_busy is False  # ran before the queued generation began
    assert isinstance(error, ApiError) and error.message == "refused"
    assert isinstance(last, Finished) and last.stats.generated_tokens == 4


def test_quick_jobs_waiting_at_shutdown_get_503(tiny_engine):
    worker = Worker(tiny_engine, k=3)  # never started: the job waits
    future = worker.call(lambda b: 1)
    worker.shutdown()
    err = future.exception(timeout=1)
    assert isinstance(err, ApiError) and err.status == 503
    with pytest.raises(ApiError):
        worker.call(lambda b: 1)
