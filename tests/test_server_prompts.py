"""/v1/completions with prompt arrays (strings, token ids, arrays of them), through the official `openai`
client and raw HTTP on the tiny GGUF pair: one choice per prompt and answer at index i*n+j, echo and
logprobs per prompt, and the requests lm-eval's local-completions sends for log-likelihoods."""

from __future__ import annotations

import httpx
import pytest

from specchat.server.api import ApiError
from specchat.server.prompts import MAX_CHOICES, parse_prompts

from .serving import client

#: echoed prompt logprobs come from batches of 64 rows and one-token rows: they agree to rounding
ROUNDING = 1e-4
PROMPTS = ["Once upon a time", "def fibonacci(n):"]


def complete(url: str, **body: object) -> dict:  # type: ignore[type-arg]
    r = httpx.post(f"{url}/completions", json={"model": "tiny", "temperature": 0, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def tokenize(url: str, text: str) -> list[int]:
    return httpx.post(url.removesuffix("/v1") + "/tokenize", json={"prompt": text}, timeout=10).json()[
        "tokens"
    ]


def test_parse_prompts_forms():
    assert parse_prompts("a") == ("a",)
    assert parse_prompts(["a", "b"]) == ("a", "b")
    assert parse_prompts([1, 2, 3]) == ((1, 2, 3),)
    assert parse_prompts([[1, 2], [3]]) == ((1, 2), (3,))
    assert parse_prompts(["a", [4]]) == ("a", (4,))


@pytest.mark.parametrize(
    "value", [None, "", [], [[]], [""], [1, "a"], [[1, -1]], [[1, 2.5]], {"a": 1}, 3, [None], ["a"] * 65]
)
def test_parse_prompts_refuses_naming_prompt(value):
    with pytest.raises(ApiError) as info:
        parse_prompts(value)
    assert info.value.param == "prompt" and info.value.status == 400


def test_an_array_of_strings_gets_n_choices_per_prompt_in_openai_order(tiny_url):
    c = client(tiny_url)
    batch = c.completions.create(model="tiny", prompt=PROMPTS, n=2, max_tokens=8, temperature=0)
    assert [ch.index for ch in batch.choices] == [0, 1, 2, 3]
    alone = [c.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0) for p in PROMPTS]
    for i, single in enumerate(alone):
        for j in range(2):  # greedy: both answers of prompt i are its own answer
            assert batch.choices[i * 2 + j].text == single.choices[0].text
    assert batch.choices[0].text != batch.choices[2].text
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in alone)
    assert batch.usage.completion_tokens == 4 * 8
    assert batch.model_extra["speculative"]["generated_tokens"] == 32


def test_token_id_prompts_are_decoded_as_given_and_echo_their_text(tiny_url):
    ids = [tokenize(tiny_url, p) for p in PROMPTS]
    by_ids = complete(tiny_url, prompt=ids, max_tokens=6, echo=True)
    by_text = complete(tiny_url, prompt=PROMPTS, max_tokens=6, echo=True)
    assert [ch["text"] for ch in by_ids["choices"]] == [ch["text"] for ch in by_text["choices"]]
    assert by_ids["choices"][1]["text"].startswith(PROMPTS[1])
    one = complete(tiny_url, prompt=ids[0], max_tokens=6)  # a flat array is one prompt of ids
    assert len(one["choices"]) == 1 and by_ids["choices"][0]["text"] == PROMPTS[0] + one["choices"][0]["text"]
    assert one["usage"]["prompt_tokens"] == len(ids[0])


def test_lm_eval_loglikelihood_requests(tiny_url):
    """lm-eval's local-completions: tokenized context+continuation, echo, logprobs 1, max_tokens 1; it
    reads token_logprobs[ctxlen:-1] of each choice (sorted by index)."""
    contexts = [tokenize(tiny_url, p) for p in PROMPTS]
    conts = [tokenize(tiny_url, " there was"), tokenize(tiny_url, " return n")]
    batch = [ctx + cont for ctx, cont in zip(contexts, conts, strict=True)]
    body = {"prompt": batch, "max_tokens": 1, "logprobs": 1, "echo": True, "seed": 1234}
    out = complete(tiny_url, **body)
    assert [ch["index"] for ch in out["choices"]] == [0, 1]
    for ch, ids in zip(out["choices"], batch, strict=True):
        lp = ch["logprobs"]
        assert len(lp["token_logprobs"]) == len(ids) + 1  # the prompt's tokens, then the one generated
        assert lp["token_logprobs"][0] is None and all(v <= 0 for v in lp["token_logprobs"][1:])
        assert all(len(top) >= 1 for top in lp["top_logprobs"][1:])
    for ids, ch in zip(batch, out["choices"], strict=True):  # each prompt scored as when sent alone
        single = complete(tiny_url, **{**body, "prompt": ids})["choices"][0]["logprobs"]["token_logprobs"]
        assert ch["logprobs"]["token_logprobs"][1:] == pytest.approx(single[1:], abs=ROUNDING)
    # max_tokens 0 with echo (OpenAI allows it): the prompt scored, nothing generated
    zero = complete(tiny_url, **{**body, "max_tokens": 0})
    for ch, ids, full in zip(zero["choices"], batch, out["choices"], strict=True):
        assert len(ch["logprobs"]["token_logprobs"]) == len(ids) and ch["finish_reason"] == "length"
        assert ch["logprobs"]["token_logprobs"][1:] == full["logprobs"]["token_logprobs"][1 : len(ids)]
    assert zero["usage"]["completion_tokens"] == 0


def test_a_streamed_batch_carries_every_choice_and_the_summed_usage(tiny_url):
    c = client(tiny_url)
    args = {"model": "tiny", "prompt": PROMPTS, "n": 2, "max_tokens": 6, "temperature": 0, "echo": True}
    plain = c.completions.create(**args, logprobs=1)
    chunks = list(
        c.completions.create(**args, logprobs=1, stream=True, stream_options={"include_usage": True})
    )
    texts: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    for ch in chunks:
        for choice in ch.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.logprobs is not None:
                tokens.setdefault(choice.index, []).extend(choice.logprobs.tokens)
    assert texts == {ch.index: ch.text for ch in plain.choices}
    assert tokens == {ch.index: ch.logprobs.tokens for ch in plain.choices}
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == 24


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"prompt": [[1, 2, 512]]}, None),  # beyond the tiny vocabulary
        ({"prompt": [[1, 2], [3] * 600]}, "context_length_exceeded"),  # the second does not fit
        ({"prompt": ["a"] * 33, "n": 2}, None),  # 66 choices
        ({"prompt": [[1, 2]], "max_tokens": 0}, None),  # max_tokens 0 needs echo
    ],
)
def test_bad_prompt_arrays_are_a_400_before_anything_is_generated(tiny_url, body, code):
    r = httpx.post(f"{tiny_url}/completions", json={"model": "tiny", **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] in ("prompt", "n", "max_tokens") and err["code"] == code
    assert MAX_CHOICES < 33 * 2
    assert complete(tiny_url, prompt="still here", max_tokens=2)["choices"][0]["text"]
