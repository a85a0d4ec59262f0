"""EAGLE-3 heads (llama/eagle3.py) on tiny GGUFs written at test time (tests/eagle3_models.py): a
llama-layout target and a Qwen3.5-layout (hybrid) one, each with a head that carries the family's
planted rule. Through `specchat run` as a user runs it: the head's drafts are accepted often, the
output is the target's own token for token, and a head that does not fit is one clear line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from specchat.cli import app
from specchat.decoding.model import sync_cache
from specchat.decoding.registry import EAGLE3, MTP
from specchat.errors import IncompatiblePair
from specchat.llama.eagle3 import Eagle3Head
from specchat.llama.engine import LlamaModel, LoadOptions
from specchat.models.loader import default_drafts
from specchat.models.registry import RegistryError
from specchat.models.registry_toml import parse_registry

from .eagle3_models import Eagle3Shape, LlamaShape, write_eagle3, write_llama
from .hybrid_models import write_qwen2
from .planted_gguf import tiny_family

runner = CliRunner()
PROMPT = "Write a function that reverses a string, then explain how it works."


def run_json(*args: str, n: int = 64) -> dict:
    res = runner.invoke(
        app,
        ["run", *args, "--json", "--threads", "1", "--ctx-size", "512", "-n", str(n), "-p", PROMPT],
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def drafting_equals_plain(target: Path, head: Path) -> dict:
    """Stats of a run drafting with `head` at a fixed depth, once its text is checked to be the
    target's own."""
    spec = run_json(str(target), "--draft", f"{EAGLE3}:head={head}", "-k", "3", "--draft-p-min", "0")
    plain = run_json(str(target), "--no-draft")
    assert spec["tokens"] == plain["tokens"]
    return spec["stats"]


def test_the_heads_drafts_are_accepted_and_the_text_is_the_targets(eagle3_pair: tuple[Path, Path]) -> None:
    stats = drafting_equals_plain(*eagle3_pair)
    assert stats["drafted"] > 20 and 0 < stats["accepted"] < stats["drafted"]
    assert [d["name"] for d in stats["drafters"]] == [EAGLE3]


def test_a_heads_rounds_may_be_token_trees(eagle3_pair: tuple[Path, Path]) -> None:
    """With --tree-width, the head's runners-up go into the verify batch as side nodes; the target's
    states for the chain still reach the head after a tree batch, and the text is the target's."""
    target, head = eagle3_pair
    args = ("--draft", f"{EAGLE3}:head={head}", "-k", "3", "--draft-p-min", "0")
    chains = run_json(str(target), *args, "--tree-width", "0")
    trees = run_json(str(target), *args, "--tree-width", "2")
    assert trees["tokens"] == chains["tokens"] == run_json(str(target), "--no-draft")["tokens"]
    assert trees["stats"]["drafted"] > chains["stats"]["drafted"]  # side nodes count as drafts
    assert trees["stats"]["accepted"] >= 0.9 * chains["stats"]["accepted"]


def test_each_entry_reads_the_targets_state_at_the_token_before(
    eagle3_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A head that knows the rule only through g: the target's layer 0 input at P (the embedding of
    the token at P) tells it the token two after P. Its first drafts are right as often as the target
    follows the rule twice, and never where an entry read the state of another position."""
    target, _ = eagle3_pair
    head = write_eagle3(tmp_path / "reads-g.gguf", reads="target", target_layers=(0, 1, 2), g_gain=1.0)
    spec = run_json(str(target), "--draft", f"{EAGLE3}:head={head}", "-k", "1", "--draft-p-min", "0")
    assert spec["tokens"] == run_json(str(target), "--no-draft")["tokens"]
    assert spec["stats"]["accepted"] > 0.4 * spec["stats"]["drafted"] > 10


def test_a_head_with_its_own_vocabulary_on_the_targets_embedding(tmp_path: Path) -> None:
    """A head trained on part of the vocabulary (its `d2t` maps its rows to the target's ids) that
    embeds tokens with the target's table (llama.cpp hands it over through ctx_other)."""
    target = write_llama(tmp_path / "llama.gguf")
    head = write_eagle3(
        tmp_path / "eagle3-llama.gguf",
        shape=Eagle3Shape(n_embd=64, n_head=4, n_head_kv=2),
        own_embedding=False,
        reduced_vocab=True,
    )
    stats = drafting_equals_plain(target, head)
    assert 0 < stats["accepted"] < stats["drafted"]


def test_on_a_hybrid_target(qwen35_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """Qwen3.5's layout (Gated DeltaNet and attention): the target takes rejected drafts back through
    its recurrent snapshots and replays, and the head still reads the states of what it holds."""
    head = write_eagle3(tmp_path / "eagle3-qwen35.gguf")
    stats = drafting_equals_plain(qwen35_pair[0], head)
    assert 0 < stats["accepted"] < stats["drafted"]


def test_a_head_beside_the_target_is_one_of_its_default_drafters(
    eagle3_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    target, head = eagle3_pair
    local = Path(shutil.copy(target, tmp_path / "model.gguf"))
    shutil.copy(head, tmp_path / "eagle3-model.gguf")
    assert default_drafts(str(local)) == (EAGLE3, "ngram")
    assert default_drafts(str(target)) == ("ngram",)  # nothing beside the fixture's target
    spec = run_json(str(local), "--draft", EAGLE3, "-k", "2", "--draft-p-min", "0")
    plain = run_json(str(local), "--no-draft")
    assert spec["tokens"] == plain["tokens"] and spec["stats"]["accepted"] > 0


def test_round_after_round_the_cache_is_the_one_a_fresh_head_builds(eagle3_pair: tuple[Path, Path]) -> None:
    """Drafts taken back, entries confirmed with the target's states once it has verified them: after
    rounds of drafting, the head predicts what a new head reading the same text at once predicts."""
    target_path, head_path = eagle3_pair
    opts = LoadOptions(n_ctx=512, threads=1, gpu_layers=0)
    with LlamaModel(target_path, opts) as target, LlamaModel(target_path, opts) as other:
        head = Eagle3Head(target, head_path)
        ctx = target.tokenize(PROMPT)
        ctx.append(int(np.argmax(target.decode(ctx, [len(ctx) - 1])[0])))
        for _ in range(12):
            drafts = [int(np.argmax(sync_cache(head, ctx, logits_row_last=True)))]
            drafts += [int(np.argmax(head.decode(drafts[-1:], [0])[0])) for _ in range(2)]
            logits = target.decode([ctx[-1], *drafts], range(4))
            picks = [int(np.argmax(row)) for row in logits]
            ok = next((i for i, (d, p) in enumerate(zip(drafts, picks, strict=False)) if d != p), 3)
            target.truncate(len(ctx) + ok)
            ctx += picks[: ok + 1]
        used = sync_cache(head, ctx, logits_row_last=True)
        head.close()
        fresh = Eagle3Head(other, head_path)
        other.decode(ctx[:-1], [])
        again = sync_cache(fresh, ctx, logits_row_last=True)
        fresh.close()
    assert used is not None and again is not None
    np.testing.assert_allclose(used, again, rtol=1e-3, atol=1e-3)


def test_text_the_head_never_saw_the_target_read_is_read_once(eagle3_pair: tuple[Path, Path]) -> None:
    """States the target computed before the head listened (as for a conversation the server restores
    from its prompt cache) are gone for good: the head reads that text once without them and builds
    on it, rather than reading it again every round."""
    target_path, head_path = eagle3_pair
    with LlamaModel(target_path, LoadOptions(n_ctx=512, threads=1, gpu_layers=0)) as target:
        ctx = target.tokenize(PROMPT)
        ctx.append(int(np.argmax(target.decode(ctx, [len(ctx) - 1])[0])))
        head = Eagle3Head(target, head_path)
        sync_cache(head, ctx, logits_row_last=True)
        assert list(head.tokens) == ctx
        head.close()


def _refused(*args: str) -> str:
    res = runner.invoke(app, ["run", *args, "-p", "hi", "-n", "4", "--ctx-size", "512"])
    assert res.exit_code != 0 and "Traceback" not in res.output, res.output
    return " ".join(res.output.split())


def test_a_head_that_does_not_fit_is_one_clear_line(eagle3_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, head = eagle3_pair
    t = str(target)
    assert "is no EAGLE-3 head (architecture llama" in _refused(t, "--draft", f"{EAGLE3}:head={target}")
    wide = write_eagle3(tmp_path / "wide.gguf", target=LlamaShape(n_embd=96))
    assert "is for a target of width 96, not" in _refused(t, "--draft", f"{EAGLE3}:head={wide}")
    deep = write_eagle3(tmp_path / "deep.gguf", target_layers=(2, 16, 29))
    assert "reads target layers [2, 16, 29], but" in _refused(t, "--draft", f"{EAGLE3}:head={deep}")
    n = tiny_family().vocab.n_vocab
    stray = write_eagle3(tmp_path / "stray.gguf", reduced_vocab=True, d2t=tiny_family().vocab.ordinary + n)
    assert "vocabulary map (d2t)" in _refused(t, "--draft", f"{EAGLE3}:head={stray}")
    qwen2 = write_qwen2(tmp_path / "qwen2.gguf")
    assert "no layer inputs of qwen2 models" in _refused(str(qwen2), "--draft", f"{EAGLE3}:head={head}")


def test_asking_for_a_head_wrongly_is_one_clear_line(eagle3_pair: tuple[Path, Path]) -> None:
    target, head = eagle3_pair
    t = str(target)
    assert "no EAGLE-3 head is known for" in _refused(t, "--draft", EAGLE3)
    assert "takes one option, head=PATH" in _refused(t, "--draft", f"{EAGLE3}:depth=3")
    both = _refused(t, "--draft", MTP, "--draft", f"{EAGLE3}:head={head}")
    assert "both read the target's hidden states" in both


def test_the_head_checks_its_target_before_llama_cpp_sees_them(
    eagle3_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Without the loader's header checks (the Python API), a mismatch is still an error, not an
    abort inside llama.cpp's graph code."""
    target, head = eagle3_pair
    opts = LoadOptions(n_ctx=256, threads=1, gpu_layers=0)
    qwen2 = LlamaModel(write_qwen2(tmp_path / "qwen2.gguf"), opts)
    with qwen2, pytest.raises(IncompatiblePair, match="no layer inputs of qwen2"):
        Eagle3Head(qwen2, head)
    with LlamaModel(target, opts) as llama:
        with pytest.raises(IncompatiblePair, match="reads target layers"):
            Eagle3Head(llama, write_eagle3(tmp_path / "deep.gguf", target_layers=(1, 2, 4)))
        with pytest.raises(IncompatiblePair, match="width 96"):
            Eagle3Head(llama, write_eagle3(tmp_path / "wide.gguf", target=LlamaShape(n_embd=96)))


ENTRIES = """\
schema = 1

[models."big"]
repo = "org/Big-GGUF"
file = "big-Q4_K_M.gguf"
params = "7B"
quant = "Q4_K_M"
size = 4000
family = "fam"
context = 4096
license = "mit"
eagle3 = "big-eagle3"

[models."big-eagle3"]
repo = "org/Big-EAGLE3-GGUF"
file = "eagle3-big-BF16.gguf"
params = "0.3B"
quant = "BF16"
size = 400
family = "fam"
context = 4096
license = "mit"

[models."other"]
repo = "org/Other-GGUF"
file = "other-Q4_K_M.gguf"
params = "1B"
quant = "Q4_K_M"
size = 200
family = "different"
context = 2048
license = "mit"
"""


def test_the_registry_names_a_models_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_registry(ENTRIES).models["big"].eagle3 == "big-eagle3"
    for alias, words in (("nope", "eagle3 'nope' is not another model"), ("other", "family 'different'")):
        with pytest.raises(RegistryError, match=words) as caught:
            parse_registry(ENTRIES.replace('eagle3 = "big-eagle3"', f'eagle3 = "{alias}"'))
        assert ":12:" in str(caught.value)  # the line of the key
    path = tmp_path / "models.toml"
    path.write_text(ENTRIES, encoding="utf-8")
    monkeypatch.setenv("SPECCHAT_MODELS", str(path))
    assert default_drafts("big") == (EAGLE3, "ngram")
