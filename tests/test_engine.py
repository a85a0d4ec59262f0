"""The llama.cpp engine on tiny real GGUF models written at test time."""

from __future__ import annotations

import numpy as np
import pytest

from specchat.decoding.drafters import ModelDrafter
from specchat.decoding.events import Done, Token
from specchat.decoding.loop import FixedK, Settings, generate
from specchat.errors import ContextFull, IncompatiblePair
from specchat.llama.engine import LlamaModel, LoadOptions
from specchat.models.pair import check_pair

OPTS = LoadOptions(n_ctx=256, threads=1)


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t = LlamaModel(tiny_pair[0], OPTS)
    d = LlamaModel(tiny_pair[1], OPTS)
    yield t, d
    t.close()
    d.close()


def test_batched_logits_equal_one_by_one(pair):
    t, _ = pair
    t.truncate(0)
    toks = t.tokenize("hello world, speculative decoding")
    batched = t.decode(toks, list(range(len(toks)))).copy()
    t.truncate(0)
    single = np.stack([t.decode([tok], [0])[0].copy() for tok in toks])
    np.testing.assert_allclose(batched, single, atol=1e-3, rtol=1e-3)
    assert list(t.tokens) == toks


def test_truncate_then_redecode_reproduces_logits(pair):
    t, _ = pair
    t.truncate(0)
    toks = t.tokenize("one two three four five six")
    first = t.decode(toks, [len(toks) - 1])[0].copy()
    t.truncate(3)
    assert list(t.tokens) == toks[:3]
    again = t.decode(toks[3:], [len(toks) - 4])[0].copy()
    np.testing.assert_allclose(first, again, atol=1e-4)


def test_logits_rows_in_requested_order(pair):
    t, _ = pair
    t.truncate(0)
    toks = t.tokenize("abc def ghi")
    rows = t.decode(toks, [2, 0]).copy()
    t.truncate(0)
    all_rows = t.decode(toks, list(range(len(toks)))).copy()
    np.testing.assert_allclose(rows, all_rows[[2, 0]], atol=1e-5)


def test_unicode_round_trip_and_pieces(pair):
    t, _ = pair
    text = "Tiếng Việt 中文 🎉 ok"
    toks = t.tokenize(text, add_special=False)
    assert t.detokenize(toks) == text
    assert b"".join(t.token_bytes(x) for x in toks).decode() == text


def test_decode_beyond_context_is_a_clear_error(pair):
    t, _ = pair
    t.truncate(0)
    with pytest.raises(ContextFull, match=r"--ctx-size|context"):
        t.decode([5] * 300, [])
    assert len(t.tokens) == 0


def test_vocab_facts_and_pair_checks(tiny_pair, tiny_incompatible, tiny_special_mismatch):
    with LlamaModel(tiny_pair[0], OPTS) as t, LlamaModel(tiny_pair[1], OPTS) as d:
        assert t.vocab_facts() == d.vocab_facts()
        assert check_pair(t, d) == []
        assert t.chat_template and "im_start" in t.chat_template
    with (
        LlamaModel(tiny_incompatible[0], OPTS) as t,
        LlamaModel(tiny_incompatible[1], OPTS) as d,
        pytest.raises(IncompatiblePair, match="different tokenizers: token"),
    ):
        check_pair(t, d)
    with LlamaModel(tiny_special_mismatch[0], OPTS) as t, LlamaModel(tiny_special_mismatch[1], OPTS) as d:
        warnings = check_pair(t, d)
        assert len(warnings) == 1 and "control/special" in warnings[0]


def test_speculative_equals_plain_on_real_engine(pair):
    t, d = pair
    prompt = t.tokenize("The quick brown fox")
    t.truncate(0)
    plain = [e.id for e in generate(t, prompt, settings=Settings(max_tokens=40)) if isinstance(e, Token)]
    t.truncate(0)
    d.truncate(0)
    events = list(
        generate(
            t,
            prompt,
            drafters=[ModelDrafter(d, p_min=0.0)],
            planner=FixedK(4),
            settings=Settings(max_tokens=40),
        )
    )
    spec = [e.id for e in events if isinstance(e, Token)]
    stats = events[-1].stats
    assert isinstance(events[-1], Done)
    # batched vs one-token evaluation may differ in the last float bits; the tiny models are peaked
    # enough that greedy paths agree token for token
    assert spec == plain
    assert stats.acceptance_rate > 0.5  # the close draft is mostly right
    assert list(t.tokens) == (prompt + spec)[: len(t.tokens)]


def test_verbose_load_routes_llama_cpp_log_to_stderr(tiny_pair, capfd):
    """--verbose used to crash: the binding rejects a NULL log callback."""
    m = LlamaModel(tiny_pair[0], LoadOptions(n_ctx=64, threads=1, verbose=True))
    m.close()
    assert "llama" in capfd.readouterr().err
    LlamaModel(tiny_pair[0], OPTS).close()  # and quiet again afterwards


def test_the_target_loads_the_same_with_and_without_drafters(tiny_pair):
    """One target, one output: `--no-draft` and speculative runs (auto or `-k N`: LoadConfig has no
    say in it) load the target with the same settings (V in bf16 on the CPU, repacked weights on)."""
    from specchat.llama.engine import GGML_TYPE_BF16
    from specchat.models import loader

    settings = []
    for drafts in [("ngram",), ()]:
        loaded = loader.load(loader.LoadConfig(target=str(tiny_pair[0]), drafts=drafts, ctx_size=256))
        try:
            settings.append((loaded.target.type_v, loaded.target.repack))
            if drafts:
                assert loaded.exact_rows >= 1
        finally:
            loaded.close()
    assert settings == [(GGML_TYPE_BF16, True)] * 2


def test_a_build_whose_libraries_do_not_load_is_one_line_not_a_traceback(tmp_path):
    """A CUDA build of llama-cpp-python on a machine without CUDA's libraries fails inside `import
    llama_cpp` (seen with a real CUDA wheel and no driver: "libcublas.so.13: cannot open shared object
    file"); every command then says so in one line with what to do."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    fake = tmp_path / "llama_cpp"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise RuntimeError(\"Failed to load shared library '/x/lib/libllama.so': "
        'libcublas.so.13: cannot open shared object file: No such file or directory")\n'
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}", "SPECCHAT_HOME": str(tmp_path / "h")}
    res = subprocess.run(
        [sys.executable, "-m", "specchat", "run", str(tmp_path / "x.gguf"), "-p", "hi"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert "libraries do not load: libcublas.so.13" in res.stderr
    assert "CUDA build" in res.stderr and "LD_LIBRARY_PATH" in res.stderr
