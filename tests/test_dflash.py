"""DFlash block drafters (llama/dflash.py, decoding/block.py) on tiny GGUFs written at test time
(tests/dflash_models.py): a Qwen3-layout target and a drafter that carries the family's planted rule
one block offset per head. Through `specchat run` as a user runs it: blocks are partly accepted, the
output is the target's own token for token, and a drafter that does not fit is one clear line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from specchat.cli import app
from specchat.decoding.block import BlockDrafter, walk_lattice
from specchat.decoding.registry import DFLASH, DSPARK, EAGLE3
from specchat.decoding.sampling import probs
from specchat.decoding.settings import SamplingParams
from specchat.errors import IncompatiblePair, ModelFileError
from specchat.llama.dflash import DFlashBlock
from specchat.llama.engine import LlamaModel, LoadOptions

from .dflash_models import DFlashShape, Qwen3Shape, write_dflash
from .eagle3_models import write_eagle3
from .hybrid_models import write_qwen2

runner = CliRunner()
PROMPT = "Write a function that reverses a string, then explain how it works."


def run_json(*args: str, n: int = 64) -> dict:
    res = runner.invoke(
        app,
        ["run", *args, "--json", "--threads", "1", "--ctx-size", "512", "-n", str(n), "-p", PROMPT],
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_blocks_are_partly_accepted_and_the_text_is_the_targets(dflash_pair: tuple[Path, Path]) -> None:
    target, drafter = dflash_pair
    spec = run_json(str(target), "--draft", f"{DFLASH}:model={drafter}", "-k", "7", "--draft-p-min", "0")
    plain = run_json(str(target), "--no-draft")
    assert spec["tokens"] == plain["tokens"]
    stats = spec["stats"]
    assert [d["name"] for d in stats["drafters"]] == [DFLASH]
    assert stats["drafted"] > 20 and 0 < stats["accepted"] < stats["drafted"]
    # one pass proposes several tokens, and later positions of a block are accepted too
    assert stats["tokens_per_pass"] > 2
    assert stats["accepted_by_position"][3] > 0


def test_a_dspark_drafter_fills_its_whole_block(dflash_pair: tuple[Path, Path], dspark_drafter: Path) -> None:
    """DSpark's anchor-first layout: row 0 of a block is already a guess, so a block of block_size
    rows proposes block_size tokens (DFlash's proposes one fewer), and its Markov head carries each
    position on from the token before."""
    target, _ = dflash_pair
    spec = run_json(
        str(target), "--draft", f"{DSPARK}:model={dspark_drafter}", "-k", "8", "--draft-p-min", "0"
    )
    assert spec["tokens"] == run_json(str(target), "--no-draft")["tokens"]
    stats = spec["stats"]
    assert [d["name"] for d in stats["drafters"]] == [DSPARK]
    assert stats["drafted"] > 20 and stats["accepted"] > 0.5 * stats["drafted"]
    assert len(stats["drafted_by_position"]) == 8 and stats["accepted_by_position"][7] > 0


def test_sampling_with_a_block_drafter(dflash_pair: tuple[Path, Path]) -> None:
    target, drafter = dflash_pair
    args = ("--draft", f"{DFLASH}:model={drafter}", "-k", "7", "--draft-p-min", "0", "--temp", "0.7")
    spec = run_json(str(target), *args, "--seed", "3")
    assert spec["stats"]["generated_tokens"] == 64 and spec["stats"]["accepted"] > 0
    assert spec["tokens"] == run_json(str(target), *args, "--seed", "3")["tokens"]  # a seed repeats


def test_a_drafter_beside_the_target_is_found(dflash_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, drafter = dflash_pair
    local = Path(shutil.copy(target, tmp_path / "model.gguf"))
    shutil.copy(drafter, tmp_path / "dflash-model.gguf")
    spec = run_json(str(local), "--draft", DFLASH, "-k", "4", "--draft-p-min", "0")
    assert spec["stats"]["accepted"] > 0


def test_round_after_round_the_cache_is_the_one_a_fresh_drafter_builds(
    dflash_pair: tuple[Path, Path],
) -> None:
    """Features injected for drafts the target then rejected are taken out again: after rounds of
    drafting and verifying, a block is what a new drafter reading the same text at once proposes."""
    target_path, drafter_path = dflash_pair
    opts = LoadOptions(n_ctx=512, threads=1, gpu_layers=0)
    with LlamaModel(target_path, opts) as target, LlamaModel(target_path, opts) as other:
        block = DFlashBlock(target, drafter_path)
        ctx = target.tokenize(PROMPT)
        ctx.append(int(np.argmax(target.decode(ctx, [len(ctx) - 1])[0])))
        rejected = 0
        for _ in range(10):
            drafts = [int(np.argmax(row)) for row in block.block(ctx, 5)]
            logits = target.decode([ctx[-1], *drafts], range(6))
            picks = [int(np.argmax(row)) for row in logits]
            ok = next((i for i, (d, p) in enumerate(zip(drafts, picks, strict=False)) if d != p), 5)
            rejected += ok < 5
            target.truncate(len(ctx) + ok)
            ctx += picks[: ok + 1]
        used = block.block(ctx, 5)
        assert list(block.injected) == ctx[:-1]
        block.close()
        fresh = DFlashBlock(other, drafter_path)
        other.decode(ctx[:-1], [])
        again = fresh.block(ctx, 5)
        fresh.close()
    assert rejected > 0  # the rounds did take drafts back
    np.testing.assert_allclose(used, again, rtol=1e-3, atol=1e-3)


class _FixedBlock:
    """A block model whose every block has the same rows (the drafter's reading of them is tested)."""

    name = "fixed"
    max_drafts = 3
    n_ctx = 64
    injected: Sequence[int] = ()
    selector_top_k = 0
    lattice = None

    def __init__(self, rows: np.ndarray, confidence: np.ndarray | None = None) -> None:
        self.rows = rows
        self.confidence = confidence

    def sync(self, context: Sequence[int]) -> None:
        return None

    def block(self, context: Sequence[int], n: int) -> np.ndarray:
        return self.rows[:n]

    def truncate(self, n: int) -> None:
        return None

    def is_eog(self, token: int) -> bool:
        return False


def test_each_sampled_token_is_drawn_from_the_row_handed_over_as_q() -> None:
    """Exact verification needs q to be what each token was drawn from: every position's token,
    counted over many proposals, follows its own row, whatever was drawn before it."""
    rows = np.log(np.array([[0.6, 0.3, 0.1, 1e-9], [0.2, 0.2, 0.5, 0.1], [0.25, 0.25, 0.25, 0.25]]))
    drafter = BlockDrafter(_FixedBlock(rows.astype(np.float32)), p_min=0.0)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    rng = np.random.default_rng(5)
    n = 4000
    counts = np.zeros((3, 4))
    for _ in range(n):
        prop = drafter.propose([1, 2], 3, params, rng)
        assert prop.q is not None and len(prop.q) == len(prop.tokens) == 3
        for i, (tok, q) in enumerate(zip(prop.tokens, prop.q, strict=True)):
            np.testing.assert_allclose(q, probs(rows[i], params), rtol=1e-5)
            counts[i, tok] += 1
    for i in range(3):
        expected = probs(rows[i], params)
        assert np.abs(counts[i] / n - expected).max() < 4 * np.sqrt(0.25 / n)


def test_the_budget_cuts_a_block_where_confidence_runs_out() -> None:
    rows = np.log(np.array([[0.9, 0.1, 1e-9, 1e-9], [0.3, 0.3, 0.4, 1e-9], [0.97, 0.01, 0.01, 0.01]]))
    drafter = BlockDrafter(_FixedBlock(rows.astype(np.float32)), p_min=0.5)
    prop = drafter.propose([1], 3, SamplingParams(), np.random.default_rng(0))
    assert prop.tokens == [0] and prop.confidence[0] == pytest.approx(0.9, abs=1e-3)


def test_a_confidence_head_is_the_stopping_rule_where_the_drafter_has_one() -> None:
    """Where the block model estimates acceptance itself (DSpark's confidence head), the block is cut
    on that estimate, not on the rows' peaks: sure-looking rows are cut where the head says no."""
    rows = np.log(np.array([[0.97, 0.01, 0.01, 0.01]] * 3))
    drafter = BlockDrafter(_FixedBlock(rows.astype(np.float32), np.array([0.9, 0.8, 0.3])), p_min=0.5)
    prop = drafter.propose([1], 3, SamplingParams(), np.random.default_rng(0))
    assert prop.tokens == [0, 0] and prop.confidence == pytest.approx([0.9, 0.8])


def test_a_dspark_confidence_head_is_read_and_cuts_its_blocks(dflash_pair: tuple[Path, Path]) -> None:
    """A DSpark file with a confidence head: llama.cpp's estimate for every position comes through
    (a head that always says 0.8 here), blocks stop where it falls below --draft-p-min, and the
    text is the target's own either way."""
    target, drafter = dflash_pair
    sure = write_dflash(drafter.parent / "dspark-conf-0.8.gguf", dspark=True, confidence=0.8)
    with LlamaModel(target, LoadOptions(n_ctx=256, threads=1, gpu_layers=0)) as model:
        block = DFlashBlock(model, sure, dspark=True)
        try:
            assert block.has_confidence
            ctx = model.tokenize(PROMPT)
            model.decode(ctx[:-1], [])
            block.block(ctx, 5)
            assert block.confidence is not None
            np.testing.assert_allclose(block.confidence, np.full(5, 0.8), atol=1e-4)
        finally:
            block.close()
    plain = run_json(str(target), "--no-draft")
    drafting = run_json(str(target), "--draft", f"{DSPARK}:model={sure}", "-k", "6", "--draft-p-min", "0.5")
    cut = run_json(str(target), "--draft", f"{DSPARK}:model={sure}", "-k", "6", "--draft-p-min", "0.9")
    assert drafting["tokens"] == plain["tokens"] == cut["tokens"]
    assert drafting["stats"]["drafted"] > 20
    assert cut["stats"]["drafted"] == 0


def test_the_dflash2_path_follows_the_selectors_transitions() -> None:
    """llama.cpp's walk of a DFlash2 lattice: the first position scores its candidates after the
    anchor (row 0 of its matrix), each later one after the candidate chosen before it, so the path
    can leave a position's best-scoring candidate when the transition says so."""
    lattice = np.array(
        [
            [5, 7, 1.0, 3.0, 9.0, 9.0],  # candidates 5, 7; after the anchor: 7 (3.0 > 1.0)
            [8, 9, 5.0, 0.0, 0.0, 2.0],  # after 7 (candidate 1): 9, though 8 scores best after 5
            [4, 6, 2.0, 2.0, 0.0, 1.0],  # after 9 (candidate 1): 6
        ],
        dtype=np.float32,
    )
    tokens, confidence = walk_lattice(lattice, 2)
    assert tokens == [7, 9, 6]
    assert confidence == pytest.approx(
        [1 / (1 + np.exp(-2.0)), 1 / (1 + np.exp(-2.0)), 1 / (1 + np.exp(-1.0))]
    )


def test_a_dflash2_drafter_walks_its_selector_and_the_text_is_the_targets(
    dflash_pair: tuple[Path, Path],
) -> None:
    """A DFlash2 file (identity convolutions, a selector whose transitions are all 0, so its path is
    each position's argmax): the lattice read back gives the DFlash drafter's own greedy block, its
    blocks are partly accepted through `specchat run --draft dflash`, greedy and sampled."""
    target, drafter = dflash_pair
    second = write_dflash(drafter.parent / "dflash2-qwen3.gguf", dflash2=True)
    opts = LoadOptions(n_ctx=256, threads=1, gpu_layers=0)
    with LlamaModel(target, opts) as model, LlamaModel(target, opts) as other:
        one, two = DFlashBlock(model, drafter), DFlashBlock(other, second)
        try:
            assert two.selector_top_k > 0 and one.selector_top_k == 0
            ctx = model.tokenize(PROMPT)
            model.decode(ctx[:-1], [])
            other.decode(ctx[:-1], [])
            greedy = [int(np.argmax(row)) for row in one.block(ctx, 6)]
            two.block(ctx, 6)
            assert two.lattice is not None and two.lattice.shape[0] == 6
            assert walk_lattice(two.lattice, two.selector_top_k)[0] == greedy
        finally:
            one.close()
            two.close()
    spec = run_json(str(target), "--draft", f"{DFLASH}:model={second}", "-k", "7", "--draft-p-min", "0")
    assert spec["tokens"] == run_json(str(target), "--no-draft")["tokens"]
    assert spec["stats"]["drafted"] > 20 and spec["stats"]["tokens_per_pass"] > 2
    sampled = ("--draft", f"{DFLASH}:model={second}", "-k", "7", "--temp", "0.7", "--seed", "4")
    first = run_json(str(target), *sampled)
    assert first["stats"]["accepted"] > 0
    assert first["tokens"] == run_json(str(target), *sampled)["tokens"]


def test_block_rounds_may_be_token_trees_and_the_text_is_the_targets(dflash_pair: tuple[Path, Path]) -> None:
    """With --tree-width, a block's least sure positions put their rows' runners-up in the same verify
    batch; the target's layer inputs for the chain still reach the drafter (a tree batch hands them
    on like a chain's), so blocks stay as good as in chain rounds, and the text is the target's."""
    target, drafter = dflash_pair
    args = ("--draft", f"{DFLASH}:model={drafter}", "-k", "7", "--draft-p-min", "0")
    chains = run_json(str(target), *args, "--tree-width", "0")
    trees = run_json(str(target), *args, "--tree-width", "3")
    assert trees["tokens"] == chains["tokens"] == run_json(str(target), "--no-draft")["tokens"]
    # side nodes are counted with the drafts: a tree round drafts more than the chain it holds
    assert trees["stats"]["drafted"] > chains["stats"]["drafted"]
    assert trees["stats"]["tokens_per_pass"] >= 0.9 * chains["stats"]["tokens_per_pass"]


def test_a_tree_batch_hands_the_chains_layer_inputs_to_the_drafter(dflash_pair: tuple[Path, Path]) -> None:
    """After a token tree is verified (a chain with a side node) and its chain kept, the drafter's
    next block is the one it gives after the same chain decoded as a chain: the tree batch handed on
    the chain's layer inputs, not nothing (which would leave rows of zeros in the drafter's cache)."""
    from specchat.decoding.tree import tree_batch

    target_path, drafter_path = dflash_pair
    opts = LoadOptions(n_ctx=512, threads=1, gpu_layers=0, tree_branches=2)
    with LlamaModel(target_path, opts) as tree_side, LlamaModel(target_path, opts) as chain_side:
        grown, plain = DFlashBlock(tree_side, drafter_path), DFlashBlock(chain_side, drafter_path)
        try:
            ctx = tree_side.tokenize(PROMPT)
            tree_side.decode(ctx[:-1], [])
            chain_side.decode(ctx[:-1], [])
            d = [int(np.argmax(row)) for row in grown.block(ctx, 3)]
            tokens, shape = tree_batch(ctx[-1], d, [(1, (d[1] + 1) % tree_side.n_vocab)])
            tree_side.decode_tree(tokens, shape, range(len(tokens)))
            tree_side.keep_path(shape, [0, 1, 2, 3])
            chain_side.decode([ctx[-1], *d], [])
            after = [*ctx, *d]
            np.testing.assert_allclose(grown.block(after, 5), plain.block(after, 5), rtol=1e-3, atol=1e-3)
        finally:
            grown.close()
            plain.close()


def _refused(*args: str) -> str:
    res = runner.invoke(app, ["run", *args, "-p", "hi", "-n", "4", "--ctx-size", "512"])
    assert res.exit_code != 0 and "Traceback" not in res.output, res.output
    return " ".join(res.output.split())


def test_a_drafter_that_does_not_fit_is_one_clear_line(
    dflash_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    target, drafter = dflash_pair
    t = str(target)
    assert "is no DFlash drafter (architecture qwen3" in _refused(t, "--draft", f"{DFLASH}:model={target}")
    eagle = write_eagle3(tmp_path / "eagle3.gguf")
    assert "is no DFlash drafter (architecture eagle3" in _refused(t, "--draft", f"{DFLASH}:model={eagle}")
    other = write_dflash(tmp_path / "fork.gguf", arch="dflash-draft")
    assert "is no DFlash drafter (architecture dflash-draft" in _refused(
        t, "--draft", f"{DFLASH}:model={other}"
    )
    deep = write_dflash(tmp_path / "deep.gguf", target_layers=(2, 16, 29))
    assert "reads target layers [2, 16, 29], but" in _refused(t, "--draft", f"{DFLASH}:model={deep}")
    narrow = Qwen3Shape(n_embd=128, n_head=4, n_head_kv=2)
    thin = write_dflash(tmp_path / "thin.gguf", target=narrow, shape=DFlashShape(n_head=4, block_size=4))
    assert "width 128) does not fit" in _refused(t, "--draft", f"{DFLASH}:model={thin}")
    qwen2 = write_qwen2(tmp_path / "qwen2.gguf")
    assert "no layer inputs of qwen2 models" in _refused(str(qwen2), "--draft", f"{DFLASH}:model={drafter}")


def test_dflash_and_dspark_files_are_told_apart(dflash_pair: tuple[Path, Path], dspark_drafter: Path) -> None:
    """Their blocks are laid out differently, so each is run only under its own name."""
    target, drafter = dflash_pair
    t = str(target)
    wrong = _refused(t, "--draft", f"{DFLASH}:model={dspark_drafter}")
    assert "is a DSpark drafter (a Markov head)" in wrong and f"--draft {DSPARK}:model=" in wrong
    wrong = _refused(t, "--draft", f"{DSPARK}:model={drafter}")
    assert "is a DFlash drafter without a Markov head" in wrong and f"--draft {DFLASH}:model=" in wrong
    assert "no DSpark drafter is known for" in _refused(t, "--draft", DSPARK)


def test_asking_for_a_drafter_wrongly_is_one_clear_line(dflash_pair: tuple[Path, Path]) -> None:
    target, drafter = dflash_pair
    t = str(target)
    assert "no DFlash drafter is known for" in _refused(t, "--draft", DFLASH)
    assert "takes one option, model=PATH" in _refused(t, "--draft", f"{DFLASH}:head={drafter}")
    both = _refused(t, "--draft", EAGLE3, "--draft", f"{DFLASH}:model={drafter}")
    assert "both read the target's hidden states" in both


def test_the_drafter_checks_its_target_before_llama_cpp_sees_them(
    dflash_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Without the loader's header checks (the Python API), a mismatch is still an error, not an
    abort inside llama.cpp's graph code."""
    target, drafter = dflash_pair
    opts = LoadOptions(n_ctx=256, threads=1, gpu_layers=0)
    qwen2 = LlamaModel(write_qwen2(tmp_path / "qwen2.gguf"), opts)
    with qwen2, pytest.raises(IncompatiblePair, match="no layer inputs of qwen2"):
        DFlashBlock(qwen2, drafter)
    with LlamaModel(target, opts) as qwen3:
        with pytest.raises(IncompatiblePair, match="reads target layers"):
            DFlashBlock(qwen3, write_dflash(tmp_path / "deep.gguf", target_layers=(1, 2, 4)))
        with pytest.raises(ModelFileError, match="is no DFlash drafter"):
            DFlashBlock(qwen3, target)


def test_a_block_pass_is_priced_by_the_weights_its_rows_run_through(dflash_pair: tuple[Path, Path]) -> None:
    """block_pass_share: the drafter's bytes per row over the target's, the embedding table left out
    (a row looks it up) unless it is the output layer too, and a drafter without an output layer
    charged its target's; the loader hands it to the drafter, which the planner prices with it."""
    from dataclasses import replace

    from specchat.models.gguf import read_gguf
    from specchat.models.heads import EMBED_TENSOR, OUTPUT_TENSOR, block_pass_share

    target_path, drafter_path = dflash_pair
    target, drafter = read_gguf(target_path), read_gguf(drafter_path)

    def row_bytes(info, skip=(EMBED_TENSOR,)):
        return sum(t.nbytes for t in info.tensors if t.name not in skip)

    output = next(t.nbytes for t in target.tensors if t.name == OUTPUT_TENSOR)
    share = block_pass_share(drafter, target)
    assert share == pytest.approx(row_bytes(drafter) / row_bytes(target))
    borrowing = replace(
        drafter, tensors=tuple(t for t in drafter.tensors if t.name not in (EMBED_TENSOR, OUTPUT_TENSOR))
    )
    assert block_pass_share(borrowing, target) == pytest.approx(
        (row_bytes(borrowing) + output) / row_bytes(target)
    )
    # the embedding table listed first and of another size than the output layer: the output is borrowed
    small_embd = replace(
        target,
        tensors=tuple(replace(t, ggml_type=1) if t.name == EMBED_TENSOR else t for t in target.tensors),
    )  # F16 instead of F32: half the bytes
    assert [t.name for t in small_embd.tensors].index(EMBED_TENSOR) < [
        t.name for t in small_embd.tensors
    ].index(OUTPUT_TENSOR)
    assert block_pass_share(borrowing, small_embd) == pytest.approx(
        (row_bytes(borrowing) + output) / row_bytes(small_embd)
    )
    tied = replace(target, tensors=tuple(t for t in target.tensors if t.name != OUTPUT_TENSOR))
    assert block_pass_share(drafter, tied) == pytest.approx(row_bytes(drafter) / row_bytes(tied, skip=()))

    from specchat.models.loader import LoadConfig, load

    cfg = LoadConfig(
        target=str(target_path),
        drafts=(f"{DFLASH}:model={drafter_path}", "ngram"),
        ctx_size=256,
        threads=1,
        tree_width=3,
    )
    loaded = load(cfg)
    try:
        assert [d.pass_share for d in loaded.drafters] == [pytest.approx(share), 0.0]
        # an attention target makes room for trees: the block drafter and the lookup both offer them
        assert [d.tree_width for d in loaded.drafters] == [3, 3]
    finally:
        loaded.close()
