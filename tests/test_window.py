"""A draft model's attention window (specchat/llama/window.py, engine.LlamaModel with `window`).

The policy first, as bookkeeping; then on real GGUFs written at test time (an attention-only pair and
the two hybrid layouts): a windowed cache drops exactly the positions between the sinks and the window
(its next row equals a full cache's with those cells removed by hand, and differs from the full
cache's own), and a windowed draft keeps speculative decoding's output equal to plain decoding.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from specchat.llama.window import SINKS, STEP, AttentionWindow

# --- the policy --------------------------------------------------------------------------------------


def test_nothing_is_dropped_until_the_context_passes_the_window_by_a_step() -> None:
    w = AttentionWindow(keep=100)
    assert w.slide(SINKS + 100) is None
    assert w.slide(SINKS + 100 + STEP - 1) is None
    assert w.slide(SINKS + 100 + STEP) == SINKS + STEP  # drop [SINKS, SINKS + STEP)
    assert w.cut == SINKS + STEP


def test_the_window_moves_a_step_at_a_time_and_keeps_the_recent_tokens() -> None:
    w = AttentionWindow(keep=100)
    cuts = [c for held in range(0, 1000) if (c := w.slide(held)) is not None]
    assert cuts == sorted(cuts) and len(cuts) > 5
    assert all(b - a == STEP for a, b in itertools.pairwise(cuts))
    assert 999 - w.cut < 100 + STEP  # never more than a step beyond the window is attended


def test_a_long_prompt_is_cut_once_and_a_cut_back_starts_over_from_there() -> None:
    w = AttentionWindow(keep=100)
    assert w.slide(2000) == 1900
    w.truncated(1500)  # a new conversation that shares 1,500 tokens
    assert w.cut == 1500
    assert w.slide(1550) is None  # its next tokens are within the window of what is left
    assert w.slide(1500 + 100 + STEP) == 1500 + STEP
    w.truncated(2)
    assert w.cut == SINKS  # cut back into the sinks: nothing is gone
    w.cut = 700
    w.forget()
    assert w.cut == SINKS
    w.forget(700)  # a restored cache that had dropped [SINKS, 700)
    assert w.cut == 700


def test_a_cut_into_the_dropped_range_lands_on_the_sinks() -> None:
    """llama.cpp takes a next token only right after the last position it holds: a cache cut back to
    a position whose predecessor is gone must go back to the sinks and catch up from there."""
    w = AttentionWindow(keep=100)
    w.cut = 700
    assert w.reach(SINKS) == SINKS and w.reach(2) == 2
    assert [w.reach(n) for n in (SINKS + 1, 300, 700)] == [SINKS] * 3
    assert w.reach(701) == 701  # position 700 is held


# --- the engine, on GGUFs --------------------------------------------------------------------------


def _engine():  # type: ignore[no-untyped-def]
    pytest.importorskip("llama_cpp")
    from specchat.llama import engine

    return engine


@pytest.fixture(scope="module", params=["attention", "qwen35", "lfm2"])
def model_file(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_pair: tuple[Path, Path]
) -> Path:
    from .hybrid_models import write_lfm2, write_qwen35

    if request.param == "attention":
        return tiny_pair[0]
    write = write_qwen35 if request.param == "qwen35" else write_lfm2
    return write(tmp_path_factory.mktemp("window") / f"{request.param}.gguf")


def test_a_windowed_cache_drops_exactly_the_middle(model_file: Path) -> None:
    """Decode one token at a time past the window: the first cut happens at SINKS + keep + STEP
    positions. The row after it equals that of a whole-context cache from which [SINKS, cut) was
    removed by hand, and differs from the whole-context cache's own row."""
    engine = _engine()
    from specchat.llama.lib import llama_cpp

    keep = 24
    first_cut = SINKS + keep + STEP
    tokens = [int(t) for t in np.random.default_rng(3).integers(8, 400, first_cut + 1)]
    opts = engine.LoadOptions(n_ctx=256, threads=1)
    with (
        engine.LlamaModel(model_file, engine.LoadOptions(n_ctx=256, threads=1, window=keep)) as win,
        engine.LlamaModel(model_file, opts) as cut_by_hand,
        engine.LlamaModel(model_file, opts) as full,
    ):
        for m in (win, cut_by_hand, full):
            m.decode(tokens[:30], [])
            for t in tokens[30:first_cut]:
                m.decode([t], [0])
        assert list(win.tokens) == tokens[:first_cut]  # the window changes the cache, not the tokens
        assert llama_cpp.llama_memory_seq_rm(cut_by_hand._mem, 0, SINKS, first_cut - keep)
        rows = [np.array(m.decode([tokens[first_cut]], [0])[0], copy=True) for m in (win, cut_by_hand, full)]
    assert np.array_equal(rows[0], rows[1])
    assert not np.allclose(rows[0], rows[2])


def test_a_windowed_draft_keeps_the_output_of_plain_decoding(tiny_pair: tuple[Path, Path]) -> None:
    """A draft whose window is far shorter than the answer: its drafts are still partly accepted, and
    the output is the target's own (the target attends to the whole context)."""
    engine = _engine()
    from specchat.decoding.drafters import ModelDrafter
    from specchat.decoding.events import Done, Token
    from specchat.decoding.loop import FixedK, Settings, generate

    with (
        engine.LlamaModel(tiny_pair[0], engine.LoadOptions(n_ctx=512, threads=1)) as t,
        engine.LlamaModel(tiny_pair[1], engine.LoadOptions(n_ctx=512, threads=1, window=16)) as d,
    ):
        prompt = t.tokenize("The quick brown fox jumps over the lazy dog. " * 12)
        settings = Settings(max_tokens=120)
        plain = [e.id for e in generate(t, prompt, settings=settings) if isinstance(e, Token)]
        t.truncate(0)
        drafters = [ModelDrafter(d, p_min=0.0)]
        events = list(generate(t, prompt, drafters=drafters, planner=FixedK(4), settings=settings))
        assert d._window is not None and d._window.cut > SINKS  # the draft's window moved
    done = events[-1]
    assert isinstance(done, Done)
    assert [e.id for e in events if isinstance(e, Token)] == plain
    assert done.stats.accepted > 0


def test_a_cut_into_the_dropped_range_catches_up_from_the_sinks(model_file: Path) -> None:
    """A new conversation sharing only part of the dropped range (the server's next request): the
    cache goes back to its first four tokens, and decoding the rest again works and gives what a
    cache that decoded them afresh gives."""
    engine = _engine()
    tokens = [int(t) for t in np.random.default_rng(4).integers(8, 400, 160)]
    opts = engine.LoadOptions(n_ctx=256, threads=1, window=24)
    with engine.LlamaModel(model_file, opts) as m, engine.LlamaModel(model_file, opts) as fresh:
        m.decode(tokens, [])
        assert m._window is not None and m._window.cut > 50
        m.truncate(50)
        assert list(m.tokens) == tokens[:SINKS]
        other = tokens[:50] + tokens[100:130]
        row = m.decode(other[SINKS:], [len(other) - SINKS - 1])[0].copy()
        # a recurrent state that was cleared replays the sinks as a batch of their own, which rounds
        # its recurrence apart from one batch of all (exact where it matters: a target never has a window)
        np.testing.assert_allclose(row, fresh.decode(other, [len(other) - 1])[0], rtol=1e-4, atol=1e-4)
