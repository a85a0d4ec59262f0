"""`specchat serve`'s logprobs, n and `speculative: false`, through the official `openai` client on the
tiny GGUF pair, and the pieces behind them (token gate, per-choice seeds, totals) directly."""

from __future__ import annotations

import codecs
import math
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from specchat.decoding.events import DrafterStats, Stats
from specchat.decoding.logprobs import token_logprob
from specchat.decoding.sampling import SamplingParams
from specchat.server.api import Defaults, parse_request
from specchat.server.responses import combined
from specchat.server.stops import TokenGate
from specchat.server.worker import choice_seed

from .serving import client, loaded_engine, serve_here, serving

HELLO = [{"role": "user", "content": "Tell me a story about a cat"}]
#: rows of a batch beyond the exact size (the echoed prompt is re-read 64 rows at a time) and one-token
#: rows round differently in the last bits, so those logprobs agree to this, not bit for bit
ROUNDING = 1e-4


@pytest.fixture(scope="module")
def plain_url(tiny_pair: tuple[Path, Path]) -> Iterator[str]:
    """A server over the tiny target alone, as `specchat serve --no-draft` runs it."""
    with loaded_engine(tiny_pair[0]) as engine, serving(engine) as url:
        yield url


def text_of(entries: list) -> str:  # type: ignore[type-arg]
    """What the tokens' bytes decode to, as the loop's incremental detokenizer does (an incomplete
    character at the very end is not text yet)."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(
        b"".join(bytes(e.bytes) for e in entries)
    )


def chat_logprobs(url: str, **kw: object) -> tuple[openai.types.chat.ChatCompletion, list]:  # type: ignore[type-arg]
    reply = client(url).chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=24, temperature=0, logprobs=True, top_logprobs=5, **kw
    )
    return reply, reply.choices[0].logprobs.content


def streamed_tokens(chunks: list) -> list[str]:  # type: ignore[type-arg]
    """The tokens of a streamed completion's logprobs, in order."""
    return [
        t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens
    ]


# --- logprobs --------------------------------------------------------------------------------------------


def test_chat_logprobs_are_consistent_and_streamed_equals_plain(tiny_url):
    reply, content = chat_logprobs(tiny_url)
    assert len(content) == reply.usage.completion_tokens == 24
    assert text_of(content) == reply.choices[0].message.content
    for e in content:
        assert len(e.top_logprobs) == 5 and e.logprob <= 0.0
        top = e.top_logprobs[0]  # temperature 0: the chosen token is the likeliest
        assert (top.token, top.logprob, top.bytes) == (e.token, e.logprob, e.bytes)
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-6

    chunks = list(
        client(tiny_url).chat.completions.create(
            model="tiny",
            messages=HELLO,
            max_tokens=24,
            temperature=0,
            logprobs=True,
            top_logprobs=5,
            stream=True,
        )
    )
    streamed = [
        e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content
    ]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    for ch in chunks:  # every chunk's logprobs are for the text it carries
        if ch.choices and ch.choices[0].delta.content:
            assert ch.choices[0].logprobs is not None


def test_completions_logprobs_offsets_echo_and_stop(tiny_url):
    c = client(tiny_url)
    args = {"model": "tiny", "prompt": "Once upon", "max_tokens": 16, "temperature": 0, "logprobs": 3}
    plain = c.completions.create(**args)
    lp = plain.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 16
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 3 and top[tok] == value == max(top.values())
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    text = plain.choices[0].text
    for i, tok in enumerate(lp.tokens):
        if tok.isascii() and (i == 0 or lp.tokens[i - 1].isascii()):
            assert text[lp.text_offset[i] :].startswith(tok)

    echo = c.completions.create(**args, echo=True)
    assert echo.choices[0].text == "Once upon" + text
    echo_lp = echo.choices[0].logprobs  # the prompt's tokens come first (see the echo test below)
    assert echo_lp.tokens[-16:] == lp.tokens
    assert echo_lp.text_offset[-16:] == [o + len("Once upon") for o in lp.text_offset]
    chunks = list(c.completions.create(**args, echo=True, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == echo.choices[0].text
    streamed = [
        t for ch in chunks if ch.choices for t in getattr(ch.choices[0].logprobs, "tokens", None) or ()
    ]
    assert streamed == echo_lp.tokens

    stop = text[6:9]
    cut = c.completions.create(**args, stop=[stop])
    cut_lp = cut.choices[0].logprobs
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == text[: text.index(stop)]
    # tokens whose text reached the client, the one the stop string cut into included, and no more
    n = len(cut_lp.tokens)
    assert cut_lp.tokens == lp.tokens[:n] and lp.text_offset[n - 1] < len(cut.choices[0].text)
    assert n == len(lp.tokens) or lp.text_offset[n] >= len(cut.choices[0].text)


def test_echo_with_logprobs_scores_the_prompt_as_the_model_reads_it(tiny_engine):
    prompt = "Once upon a time"
    args = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 2}
    with serving(tiny_engine) as url:
        c = client(url)
        plain = c.completions.create(**args).choices[0].logprobs
        echo = c.completions.create(**args, echo=True)
        chunks = list(c.completions.create(**args, echo=True, stream=True))
    ids, _ = tiny_engine.render_text(prompt)  # the server has stopped: the models are the test's now
    n = len(ids)
    lp = echo.choices[0].logprobs
    assert echo.usage.prompt_tokens == n and len(lp.tokens) == len(lp.token_logprobs) == n + 4
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and lp.text_offset[0] == 0
    assert "".join(lp.tokens[:n]) == prompt and lp.text_offset[:n] == sorted(lp.text_offset[:n])
    assert lp.tokens[n:] == plain.tokens
    assert lp.token_logprobs[n:] == pytest.approx(plain.token_logprobs, abs=ROUNDING)
    assert lp.text_offset[n:] == [o + len(prompt) for o in plain.text_offset]
    assert echo.usage.prompt_tokens_details.cached_tokens == 0  # the prompt was read again, whole
    assert streamed_tokens(chunks) == lp.tokens

    target = tiny_engine.target  # the same numbers one token at a time (teacher forcing)
    target.truncate(0)
    for i in range(1, n):
        row = target.decode([ids[i - 1]], [0])[0]
        want = token_logprob(row, ids[i], SamplingParams(), 2)
        assert lp.token_logprobs[i] == pytest.approx(want.logprob, abs=ROUNDING)
        top = lp.top_logprobs[i]
        assert lp.tokens[i] not in top or top[lp.tokens[i]] == lp.token_logprobs[i]
    target.truncate(0)


def test_logprobs_equal_with_drafting_on_off_and_on_a_no_draft_server(tiny_engine, tiny_url, plain_url):
    """At temperature 0 logprobs are the model's own: verify batches stay within the size that is
    bit-identical to one-token decoding (the tiny pair's exact size is 1 on a CPU: no drafts then), so
    they equal `--no-draft` serving's bit for bit, not merely to rounding."""
    drafted, on = chat_logprobs(tiny_url)
    undrafted, off = chat_logprobs(tiny_url, extra_body={"speculative": False})
    no_draft, alone = chat_logprobs(plain_url)
    assert max(drafted.model_extra["speculative"]["k_history"]) <= max(0, tiny_engine.exact_rows - 1)
    assert (
        undrafted.model_extra["speculative"]["drafted"] == no_draft.model_extra["speculative"]["drafted"] == 0
    )
    assert [e.model_dump() for e in on] == [e.model_dump() for e in off] == [e.model_dump() for e in alone]
    same = client(tiny_url).chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=24, temperature=0
    )
    assert same.choices[0].message.content == drafted.choices[0].message.content  # the same answer,
    assert same.model_extra["speculative"]["accepted"] > 0  # which without logprobs is drafted as usual


def test_sampling_logprobs_are_of_the_filtered_distribution(tiny_url):
    reply = client(tiny_url).chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=24, temperature=0.8, top_p=1.0, seed=7, logprobs=True,
        top_logprobs=20, extra_body={"top_k": 3},
    )  # fmt: skip
    content = reply.choices[0].logprobs.content
    assert len(content) == 24
    assert reply.model_extra["speculative"]["accepted"] > 0  # sampling: the rows sampled from, drafted
    for e in content:
        assert 1 <= len(e.top_logprobs) <= 3  # top-k 3: the rest has probability 0 and is not listed
        assert sum(math.exp(t.logprob) for t in e.top_logprobs) == pytest.approx(1.0, abs=1e-6)
        top = {tuple(t.bytes): t.logprob for t in e.top_logprobs}  # texts of partial characters coincide
        assert top[tuple(e.bytes)] == e.logprob


# --- n ------------------------------------------------------------------------------------------------------


def test_n_answers_with_their_own_index_finish_and_stats_and_seeds_that_repeat(tiny_url):
    c = client(tiny_url)
    args = {"model": "tiny", "messages": HELLO, "max_tokens": 12, "temperature": 0.9, "seed": 5}
    reply = c.chat.completions.create(**args, n=3)
    assert [ch.index for ch in reply.choices] == [0, 1, 2]
    assert all(ch.finish_reason == "length" for ch in reply.choices)
    texts = [ch.message.content for ch in reply.choices]
    assert len(set(texts)) > 1  # seeds differ per choice
    stats = [ch.model_extra["speculative"] for ch in reply.choices]
    assert [s["generated_tokens"] for s in stats] == [12, 12, 12]
    assert [s["prefill_tokens"] for s in stats[1:]] == [0, 0]  # the prompt was decoded once
    assert reply.usage.completion_tokens == 36 and reply.usage.prompt_tokens == stats[0]["prompt_tokens"]
    assert reply.model_extra["speculative"]["generated_tokens"] == 36  # the top level has the totals
    assert [ch.message.content for ch in c.chat.completions.create(**args, n=3).choices] == texts
    assert c.chat.completions.create(**args).choices[0].message.content == texts[0]  # n=1 is choice 0

    chunks = list(c.chat.completions.create(**args, n=3, stream=True, stream_options={"include_usage": True}))
    by_index: dict[int, str] = defaultdict(str)
    finished = {}
    for ch in chunks:
        for choice in ch.choices:
            by_index[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished[choice.index] = (
                    choice.finish_reason,
                    ch.model_extra["speculative"]["generated_tokens"],
                )
    assert [by_index[i] for i in range(3)] == texts
    assert finished == {i: ("length", 12) for i in range(3)}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 36


def test_n_with_logprobs_on_completions(tiny_url):
    reply = client(tiny_url).completions.create(
        model="tiny", prompt="def fibonacci(n):", max_tokens=8, temperature=0, n=2, logprobs=1
    )
    assert [ch.index for ch in reply.choices] == [0, 1]
    a, b = (ch.logprobs for ch in reply.choices)
    assert reply.choices[0].text == reply.choices[1].text and a.tokens == b.tokens  # temperature 0
    assert a.token_logprobs == b.token_logprobs  # temperature 0: exact verify batches


def test_logprobs_and_n_when_generating_on_the_thread_that_loaded_the_models(tiny_engine):
    """As `specchat serve` runs (Worker.run on the loading thread, not a thread of its own)."""

    def drive(url: str) -> openai.types.chat.ChatCompletion:
        return client(url).chat.completions.create(
            model="tiny", messages=HELLO, max_tokens=6, temperature=0, n=2, logprobs=True, top_logprobs=2
        )

    reply = serve_here(tiny_engine, drive, k=3)
    assert [ch.index for ch in reply.choices] == [0, 1]
    assert all(len(ch.logprobs.content) == 6 for ch in reply.choices)
    assert reply.choices[0].message.content == reply.choices[1].message.content  # temperature 0


def test_the_openai_client_gets_400s_and_the_server_keeps_serving(tiny_url):
    c = client(tiny_url)
    bad = [
        {"n": 9},
        {"logprobs": True, "top_logprobs": 21},
        {"top_logprobs": 2},
        {"extra_body": {"speculative": "no"}},
    ]
    for kw in bad:
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2, **kw)
        assert info.value.status_code == 400 and info.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=21)
    assert info.value.body["param"] == "logprobs"
    ok = c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2, logprobs=False)
    assert ok.choices[0].logprobs is None and ok.usage.completion_tokens == 2


# --- the parts --------------------------------------------------------------------------------------------


def test_request_fields_and_their_defaults():
    d = Defaults(max_tokens=8)
    plain = parse_request("chat", {"messages": HELLO}, d)
    assert (plain.n, plain.logprobs, plain.echo, plain.draft) == (1, None, False, True)
    chat = parse_request(
        "chat", {"messages": HELLO, "n": 8, "logprobs": True, "top_logprobs": 20, "speculative": False}, d
    )
    assert (chat.n, chat.logprobs, chat.draft) == (8, 20, False)
    assert parse_request("chat", {"messages": HELLO, "logprobs": True}, d).logprobs == 0
    done = parse_request("completion", {"prompt": "x", "logprobs": 0, "echo": True}, d)
    assert (done.logprobs, done.echo) == (0, True)
    assert parse_request("chat", {"messages": HELLO, "echo": True}, d).echo is False  # chat has no echo


def test_token_gate_releases_records_with_their_text():
    gate: TokenGate[str] = TokenGate()
    for text, name in [("ab", "t1"), ("", "t2"), ("é", "t3"), ("cd", "t4")]:
        gate.add(len(text), name)
    assert gate.release(1) == []  # half of t1 sent
    assert gate.release(1) == ["t1"]  # t2 has no text: its character is t3's, not sent yet
    assert gate.release(1) == ["t2", "t3"]
    assert gate.finish(stopped=True) == []  # a stop string cut before t4
    cut: TokenGate[str] = TokenGate()
    cut.add(3, "a")
    cut.add(3, "b")
    assert cut.release(4) == ["a"] and cut.finish(stopped=True) == ["b"]  # the cut fell inside b
    rest: TokenGate[str] = TokenGate()
    rest.add(2, "x")
    rest.add(0, "y")
    assert rest.release(0) == [] and rest.finish(stopped=False) == ["x", "y"]


def test_choice_seeds_keep_the_first_and_differ_for_the_others():
    assert choice_seed(5, 0) == 5
    seeds = {choice_seed(5, i) for i in range(8)}
    assert len(seeds) == 8 and choice_seed(5, 3) == choice_seed(5, 3) != choice_seed(6, 3)


def test_totals_of_several_answers():
    def stats(generated: int, drafted: int, accepted: int, k: tuple[int, ...], reason: str) -> Stats:
        return Stats(
            prompt_tokens=10, prefill_tokens=9 if generated == 4 else 0, generated_tokens=generated,
            prefill_seconds=0.5, decode_seconds=1.0, drafted=drafted, accepted=accepted,
            target_passes=len(k), stop_reason=reason, accepted_by_position=(accepted,),
            drafted_by_position=(drafted,), drafters=(DrafterStats("d", len(k), drafted, accepted, 0.1),),
            k_history=k,
        )  # fmt: skip

    one = stats(4, 6, 3, (3, 3), "eog")
    assert combined([one]) is one
    total = combined([one, stats(5, 4, 4, (4,), "max_tokens")])
    assert (total.prompt_tokens, total.prefill_tokens, total.generated_tokens) == (10, 9, 9)
    assert (total.drafted, total.accepted, total.target_passes, total.k_history) == (10, 7, 3, (3, 3, 4))
    assert total.accepted_by_position == (7,) and total.drafters == (DrafterStats("d", 3, 10, 7, 0.2),)
    assert total.stop_reason == "mixed" and total.decode_seconds == 2.0


def test_no_logprobs_unless_asked(tiny_url):
    body = httpx.post(f"{tiny_url}/completions", json={"prompt": "abc", "max_tokens": 3}, timeout=30).json()
    assert body["choices"][0]["logprobs"] is None and body["choices"][0]["index"] == 0
