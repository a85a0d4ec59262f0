"""The planted-pattern models of today's layouts (tests/hybrid_models.py): llama.cpp loads each one as
the architecture it claims, and the families behave as their fixtures promise: drafts and MTP heads
agree with their target part of the time, through the shared rule, while the target's text stays
varied enough that prompt lookup finds little of it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest

from specchat.errors import EngineError
from specchat.llama.engine import LlamaModel, LoadOptions
from specchat.llama.vocab import LlamaVocab

from .hybrid_models import Qwen35Shape, write_lfm2_draft, write_qwen2, write_qwen35
from .planted_gguf import Family, Vocab, tiny_family
from .planted_measure import PROMPT, greedy, lookup_rate, measure_pair, planted_rate
from .tiny_models import write_tiny_llama

pytest.importorskip("llama_cpp")

PROMPTS = (PROMPT, "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n")
N_TOKENS = 48
OPTS = LoadOptions(n_ctx=256, threads=1)


@pytest.fixture
def loaded() -> Iterator[list[LlamaModel]]:
    """Models loaded by a test, closed after it."""
    models: list[LlamaModel] = []
    yield models
    for m in models:
        m.close()


def load(path: Path, loaded: list[LlamaModel]) -> LlamaModel:
    model = LlamaModel(path, OPTS)
    loaded.append(model)
    return model


def arch(path: Path) -> str:
    reader = gguf.GGUFReader(str(path))
    return str(reader.fields["general.architecture"].contents())


@pytest.mark.parametrize(
    ("fixture", "index", "expected", "n_layer"),
    [
        ("qwen35_pair", 0, "qwen35", 4),
        ("qwen35_pair", 1, "qwen2", 2),
        ("qwen35_mtp", None, "qwen35", 4),
        ("lfm2_pair", 0, "lfm2", 4),
        ("lfm2_pair", 1, "lfm2", 3),
        ("gemma4_pair", 0, "gemma4", 4),
    ],
)
def test_each_file_loads_and_decodes(
    request: pytest.FixtureRequest, fixture: str, index: int | None, expected: str, n_layer: int, loaded: list
) -> None:
    value = request.getfixturevalue(fixture)
    path = value if index is None else value[index]
    assert arch(path) == expected
    model = load(path, loaded)
    assert model.n_layer == n_layer
    prompt = model.tokenize(PROMPT)
    logits = model.decode(prompt, [len(prompt) - 1])
    assert logits.shape == (1, 512) and np.isfinite(logits).all()
    out = greedy(model, prompt, 8)
    assert len(out) == 8 and not any(model.is_eog(t) for t in out)


def test_the_qwen35_target_is_three_deltanet_layers_to_one_attention_layer(qwen35_pair: tuple) -> None:
    fields = gguf.GGUFReader(str(qwen35_pair[0])).fields
    assert list(fields["qwen35.attention.recurrent_layers"].contents()) == [True, True, True, False]
    assert fields["qwen35.full_attention_interval"].contents() == 4
    assert "qwen35.nextn_predict_layers" not in fields


def test_the_nextn_block_follows_the_trunk_and_is_not_a_trunk_layer(qwen35_mtp: Path, loaded: list) -> None:
    reader = gguf.GGUFReader(str(qwen35_mtp))
    names = {t.name for t in reader.tensors}
    nextn = {"eh_proj", "enorm", "hnorm", "shared_head_norm"}
    assert {f"blk.4.nextn.{n}.weight" for n in nextn} <= names
    assert {"blk.4.attn_q.weight", "blk.4.ffn_down.weight"} <= names  # the block's own attention + FFN
    assert not any(n.startswith("blk.5.") for n in names)
    model = load(qwen35_mtp, loaded)
    assert model.meta("qwen35.block_count") == "5"
    assert model.meta("qwen35.nextn_predict_layers") == "1"
    assert model.n_layer == 4  # llama.cpp: n_layer = block_count - nextn_predict_layers


def test_the_nextn_block_can_carry_its_own_embedding_and_head(tmp_path: Path, loaded: list) -> None:
    path = write_qwen35(tmp_path / "own-head.gguf", nextn=1, nextn_head=True)
    names = {t.name for t in gguf.GGUFReader(str(path)).tensors}
    assert {"blk.4.nextn.embed_tokens.weight", "blk.4.nextn.shared_head_head.weight"} <= names
    assert load(path, loaded).n_layer == 4


@pytest.mark.parametrize("fixture", ["qwen35_pair", "lfm2_pair"])
def test_the_draft_agrees_with_its_target_part_of_the_time(
    request: pytest.FixtureRequest, fixture: str, loaded: list
) -> None:
    target_path, draft_path = request.getfixturevalue(fixture)
    target, draft = load(target_path, loaded), load(draft_path, loaded)
    succ = tiny_family().succ()
    reports = [measure_pair(target, draft, target.tokenize(p), succ, N_TOKENS) for p in PROMPTS]
    agreement = np.mean([r.agreement for r in reports])
    # measured 0.54-0.63 on an AVX512 CPU; the band leaves room for other CPUs' rounding
    assert 0.3 <= agreement <= 0.85
    assert all(0.5 <= r.target_rate <= 0.95 for r in reports)  # the target misses the rule sometimes
    assert all(r.lookup < 0.3 for r in reports)  # and its text is not a copy of itself
    assert all(r.distinct > 0.6 for r in reports)


def test_a_draft_of_another_rule_does_not_agree(qwen35_pair: tuple, tmp_path: Path, loaded: list) -> None:
    """The agreement comes from the shared rule: the same draft with another pattern seed has none."""
    other = Family(tiny_family().vocab, pattern_seed=99)
    target = load(qwen35_pair[0], loaded)
    draft = load(write_qwen2(tmp_path / "other-rule.gguf", family=other), loaded)
    prompt = target.tokenize(PROMPT)
    assert measure_pair(target, draft, prompt, tiny_family().succ(), N_TOKENS).agreement < 0.15


def test_the_nextn_head_agrees_with_the_next_next_token_partly(qwen35_mtp: Path, loaded: list) -> None:
    from .mtp_probe import mtp_agreement

    prompt = load(qwen35_mtp, loaded).tokenize(PROMPT)
    agreement, out = mtp_agreement(qwen35_mtp, prompt, N_TOKENS)
    assert 0.25 <= agreement <= 0.85  # measured 0.50-0.56
    assert 0.5 <= planted_rate([prompt[-1], *out], tiny_family().succ()) <= 0.95


def test_the_gemma4_assistant_agrees_with_the_target_partly(gemma4_pair: tuple, loaded: list) -> None:
    from .mtp_probe import mtp_agreement

    target, assistant = gemma4_pair
    prompt = load(target, loaded).tokenize(PROMPT)
    agreement, out = mtp_agreement(target, prompt, N_TOKENS, assistant=assistant)
    assert 0.25 <= agreement <= 0.85  # measured 0.38-0.50
    assert lookup_rate(prompt, out) < 0.3


def test_the_gemma4_assistant_shares_the_vocab_but_runs_only_beside_its_target(gemma4_pair: tuple) -> None:
    """It is a drafter, not a model: llama.cpp refuses a context without the target's (`ctx_other`)."""
    target, assistant = gemma4_pair
    with LlamaVocab(target) as t, LlamaVocab(assistant) as a:
        assert a.vocab_facts() == t.vocab_facts()
    assert arch(assistant) == "gemma4-assistant"
    with pytest.raises(EngineError):
        LlamaModel(assistant, OPTS)


@pytest.mark.parametrize("qtype", ["f16", "q8_0"])
def test_the_weight_types_of_the_benchmark_files_load(tmp_path: Path, qtype: str, loaded: list) -> None:
    path = write_qwen35(tmp_path / f"{qtype}.gguf", nextn=1, qtype=qtype)  # type: ignore[arg-type]
    f32 = write_qwen35(tmp_path / "f32.gguf", nextn=1)
    assert path.stat().st_size < f32.stat().st_size * (0.6 if qtype == "f16" else 0.35)
    model = load(path, loaded)
    prompt = model.tokenize(PROMPT)
    rate = planted_rate([prompt[-1], *greedy(model, prompt, N_TOKENS)], tiny_family().succ())
    assert 0.4 <= rate <= 1.0  # rounding moves the noise a little, not the rule


def test_files_are_a_function_of_their_arguments(tmp_path: Path) -> None:
    a = write_lfm2_draft(tmp_path / "a.gguf")
    b = write_lfm2_draft(tmp_path / "b.gguf")
    c = write_lfm2_draft(tmp_path / "c.gguf", seed=8)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_the_tokenizer_can_come_from_another_gguf(tmp_path: Path, loaded: list) -> None:
    source = write_tiny_llama(tmp_path / "source.gguf", tokenizer="llama")  # SentencePiece, 512 tokens
    vocab = Vocab.from_gguf(source)
    path = write_qwen35(tmp_path / "borrowed.gguf", family=Family(vocab), shape=Qwen35Shape(n_layer=4))
    with LlamaVocab(source) as s, LlamaVocab(path) as p:
        assert p.vocab_facts() == s.vocab_facts()
        assert [p.token_text(i) for i in range(512)] == [s.token_text(i) for i in range(512)]
    assert set(vocab.ordinary) < set(range(512))  # control tokens are outside the rule


def test_a_gguf_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(tmp_path / "empty.gguf", "llama")
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="no tokenizer"):
        Vocab.from_gguf(tmp_path / "empty.gguf")


def test_the_benchmark_script_names_a_missing_tokenizer_file(tmp_path: Path) -> None:
    script = Path(__file__).parent / "perf" / "hybrid_models.py"
    missing = tmp_path / "nowhere.gguf"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out"), "--tokenizer-from", str(missing)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and str(missing) in done.stderr and "--synthetic-vocab" in done.stderr
    assert not (tmp_path / "out").exists()
