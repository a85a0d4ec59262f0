"""Rolling back recurrent and hybrid caches (specchat/llama/rollback.py; engine.LlamaModel.truncate).

The policy is tested with a fake state first (which way back each cut takes, what it leaves pending);
then on real hybrid GGUFs written at test time (qwen35: Gated DeltaNet + gated attention; lfm2: short
convolutions + attention): every row a rolled-back cache computes must equal, bit for bit, what a cache
that decoded the same tokens one at a time computes -- including the cut llama.cpp's own snapshots
would get wrong (a step back past the last decode call).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specchat.llama.rollback import ANCHOR_TOKENS, Checkpoint, Rollback, replay_chunks

# --- the policy, on a fake state --------------------------------------------------------------------


def fake_rollback(snapshots: int) -> tuple[Rollback, list[int]]:
    """A Rollback whose saves record the position; `restored` lists the positions restored."""
    restored: list[int] = []

    def save(pos: int) -> Checkpoint:
        return Checkpoint(pos, np.zeros(8, dtype=np.uint8))

    def restore(ckpt: Checkpoint) -> bool:
        restored.append(ckpt.pos)
        return True

    return Rollback(snapshots, save, restore), restored


def test_snapshots_reach_back_within_the_last_decode_only() -> None:
    rb, _ = fake_rollback(snapshots=4)
    rb.decoded(5, 105)
    assert rb.can_step_back(105, 101)  # 4 back: a snapshot of this decode
    assert not rb.can_step_back(105, 100)  # the state before the batch is no snapshot of it
    rb.decoded(1, 106)
    assert not rb.can_step_back(106, 104)  # two back, across two decode calls: the trap
    assert not rb.can_step_back(106, 105)  # a one-token decode has no earlier state either


def test_a_step_back_is_single_use_until_the_next_decode() -> None:
    rb, _ = fake_rollback(snapshots=4)
    rb.decoded(5, 105)
    rb.stepped_back(2)
    assert not rb.can_step_back(103, 102)
    rb.decoded(3, 106)
    assert rb.can_step_back(106, 104)


def test_checkpoints_before_batches_the_snapshots_cannot_undo() -> None:
    rb, _ = fake_rollback(snapshots=4)
    assert not rb.wants_checkpoint(1)
    assert not rb.wants_checkpoint(5)  # a verify batch keeps at least one row: 4 back at most
    assert rb.wants_checkpoint(6)
    no_snapshots, _ = fake_rollback(snapshots=0)
    assert no_snapshots.wants_checkpoint(2) and not no_snapshots.wants_checkpoint(1)


def test_going_back_restores_the_latest_checkpoint_at_or_before_the_cut() -> None:
    rb, restored = fake_rollback(snapshots=0)
    rb.checkpoint(40)
    rb.decoded(ANCHOR_TOKENS, 40 + ANCHOR_TOKENS)  # a prompt-size batch leaves an anchor at its end
    rb.checkpoint(120)  # the working checkpoint moves on: 40 is gone
    assert rb.go_back(130) == 120
    assert rb.go_back(110) == 40 + ANCHOR_TOKENS  # the working checkpoint is past the cut: dropped
    assert rb.working is None
    assert rb.go_back(50) == 0  # the anchor is past 50 too: nothing left, everything replays
    assert restored == [120, 40 + ANCHOR_TOKENS]
    empty, _ = fake_rollback(snapshots=0)
    assert empty.go_back(10) == 0  # nothing kept: the caller clears and replays everything


def test_a_draft_models_steps_take_it_back_with_nothing_to_replay() -> None:
    """A checkpoint before drafting keeps, where a copy is cheap, the state after each one-token
    step too: the target accepting 2 of 4 drafts takes the draft back to its second step, not to
    the start with 2 tokens to decode again. A batch ends the steps; those kept stay valid."""
    rb, restored = fake_rollback(snapshots=0)
    rb.cheap_steps = True
    rb.checkpoint(30, steps=True)
    for pos in range(31, 35):
        rb.decoded(1, pos)
    assert [c.pos for c in rb.steps] == [31, 32, 33, 34]
    assert rb.go_back(32) == 32 and restored == [32]
    assert [c.pos for c in rb.steps] == [31, 32] and not rb.stepping
    rb.checkpoint(32, steps=True)
    rb.decoded(1, 33)
    rb.decoded(3, 36)  # a batch: no step after it, nor after the next one-token decode
    rb.decoded(1, 37)
    assert [c.pos for c in rb.steps] == [33]
    assert rb.go_back(35) == 33  # the latest state at or before the cut: 2 tokens to replay
    dear, restored = fake_rollback(snapshots=0)  # a state too large to copy every step
    dear.checkpoint(30, steps=True)
    for pos in range(31, 35):
        dear.decoded(1, pos)
    assert dear.steps == [] and dear.go_back(32) == 30 and restored == [30]


def test_anchors_are_kept_at_prompt_ends_and_bounded() -> None:
    rb, _ = fake_rollback(snapshots=4)
    for i in range(1, 8):
        rb.decoded(ANCHOR_TOKENS, i * 1000)
    assert [a.pos for a in rb.anchors] == [6000, 7000]
    rb.decoded(3, 7003)
    assert len(rb.anchors) == 2  # verify batches leave none


def test_replayed_tokens_ride_in_front_of_the_next_batch_while_it_stays_exact() -> None:
    assert replay_chunks([1, 2, 3], 5) == ([], 3)
    chunks, front = replay_chunks(list(range(40)), 5, rows=32)
    assert front == 0 and [len(c) for c in chunks] == [32, 8]
    chunks, front = replay_chunks([1, 2, 3], 5, alone=True)
    assert chunks == [[1, 2, 3]] and front == 0


# --- the engine, on hybrid GGUFs ------------------------------------------------------------------


def _engine():  # type: ignore[no-untyped-def]
    pytest.importorskip("llama_cpp")
    from specchat.llama import engine

    return engine


@pytest.fixture(scope="module", params=["qwen35", "lfm2"])
def hybrid(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from .hybrid_models import write_lfm2, write_qwen35

    folder = tmp_path_factory.mktemp("hybrid")
    write = write_qwen35 if request.param == "qwen35" else write_lfm2
    return write(folder / f"{request.param}.gguf")


def _one_at_a_time(path: Path, tokens: list[int], start: int) -> dict[int, np.ndarray]:
    """Logits after each of tokens[start:], the cache having decoded them one token at a time."""
    engine = _engine()
    with engine.LlamaModel(path, engine.LoadOptions(n_ctx=512)) as ref:
        ref.decode(tokens[:start], [])
        return {i: np.array(ref.decode([tokens[i]], [0])[0], copy=True) for i in range(start, len(tokens))}


@pytest.mark.parametrize("snapshots", [0, 4])
def test_verify_rounds_roll_back_to_the_one_token_state(hybrid: Path, snapshots: int) -> None:
    """Rounds like the loop's: a verify batch, a rejection somewhere in it, the cut, the next batch.
    Every kept row equals one-token decoding's, by snapshots or by checkpoint and replay."""
    engine = _engine()
    tokens = [int(t) for t in np.random.default_rng(0).integers(8, 400, 140)]
    singles = _one_at_a_time(hybrid, tokens, 20)
    rng = np.random.default_rng(1)
    with engine.LlamaModel(hybrid, engine.LoadOptions(n_ctx=512, snapshots=snapshots)) as m:
        assert m.recurrent and m.can_roll_back
        m.decode(tokens[:20], [])
        pos = 20
        while pos < 120:
            k = int(rng.integers(0, 12))
            n_ok = int(rng.integers(0, k + 1))
            batch = tokens[pos : pos + n_ok + 1] + [5] * (k - n_ok)  # rejected drafts after n_ok
            rows = m.decode(batch, list(range(len(batch))))
            for j in range(n_ok + 1):
                assert np.array_equal(rows[j], singles[pos + j]), (pos, k, n_ok, j)
            m.truncate(pos + n_ok + 1)
            pos += n_ok + 1


def test_a_cut_across_decode_calls_goes_back_through_the_checkpoint(hybrid: Path) -> None:
    """A draft model's steps: checkpoint, single-token decodes, then a cut several calls back. The
    snapshots would say yes and leave a wrong state; the guard takes the checkpoint instead."""
    engine = _engine()
    tokens = [int(t) for t in np.random.default_rng(2).integers(8, 400, 80)]
    singles = _one_at_a_time(hybrid, tokens, 30)
    with engine.LlamaModel(hybrid, engine.LoadOptions(n_ctx=512, snapshots=4)) as m:
        m.decode(tokens[:30], [])
        m.checkpoint()
        for t in tokens[30:34]:
            m.decode([t], [0])
        m.truncate(31)
        assert np.array_equal(m.decode([tokens[31]], [0])[0], singles[31])
        m.decode(tokens[32:35], [])  # no checkpoint here: three back reaches the last one at 30
        m.truncate(32)
        assert np.array_equal(m.decode([tokens[32]], [0])[0], singles[32])


def test_a_draft_model_goes_back_to_its_step_state(hybrid: Path) -> None:
    """A draft model's round on a real hybrid: checkpoint, four one-token drafts, two accepted. It
    goes back to the state after its second draft: the next decode replays nothing and its row is
    one-token decoding's."""
    engine = _engine()
    tokens = [int(t) for t in np.random.default_rng(5).integers(8, 400, 60)]
    singles = _one_at_a_time(hybrid, tokens, 30)
    with engine.LlamaModel(hybrid, engine.LoadOptions(n_ctx=512)) as m:
        m.decode(tokens[:30], [])
        m.checkpoint()
        for t in tokens[30:34]:
            m.decode([t], [0])
        m.truncate(32)
        assert np.array_equal(m.decode(tokens[32:34], [0, 1])[1], singles[33])
        assert m.replayed == 0


def test_a_restored_conversation_goes_back_to_its_anchor(hybrid: Path) -> None:
    """The prompt cache's copy carries the anchors: a later turn that keeps only the prompt (a
    template that re-renders the answer) goes back to the prompt's end, not to the start."""
    engine = _engine()
    tokens = [int(t) for t in np.random.default_rng(3).integers(8, 400, 2 * ANCHOR_TOKENS + 40)]
    prompt = 2 * ANCHOR_TOKENS
    singles = _one_at_a_time(hybrid, tokens, prompt)
    with engine.LlamaModel(hybrid, engine.LoadOptions(n_ctx=512, snapshots=4)) as m:
        m.decode(tokens[:prompt], [])
        for t in tokens[prompt : prompt + 20]:
            m.decode([t], [])
        saved = m.save_state()
        assert [a.pos for a in saved.anchors] == [prompt]
        m.truncate(0)
        assert m.restore_state(saved) and len(m.tokens) == prompt + 20
        m.truncate(prompt)
        assert m._held == prompt  # restored from the anchor: nothing to replay
        assert np.array_equal(m.decode([tokens[prompt]], [0])[0], singles[prompt])


def test_a_batch_reports_the_tokens_it_replayed_first(hybrid: Path) -> None:
    """The rows a rollback through a checkpoint costs show up in the next decode: it reports how many
    kept tokens it decoded first (the loop books them to the rollback, the planner prices them), and
    none after a cut the snapshots took back; the reach is the snapshots'."""
    engine = _engine()
    tokens = [int(t) for t in np.random.default_rng(4).integers(8, 400, 60)]
    with engine.LlamaModel(hybrid, engine.LoadOptions(n_ctx=512, snapshots=4)) as m:
        assert m.rollback_reach == 4
        m.decode(tokens[:20], [])
        m.decode(tokens[20:29], [])  # 9 rows: a checkpoint before them
        m.truncate(22)  # 7 back: past the snapshots, so back to 20 with 2 kept to replay
        m.decode(tokens[22:27], [0])
        assert m.replayed == 2
        m.truncate(24)  # 3 back: the snapshots
        m.decode(tokens[24:26], [0])
        assert m.replayed == 0
    with engine.LlamaModel(hybrid, engine.LoadOptions(n_ctx=512, snapshots=0)) as m:
        assert m.rollback_reach == 0


def test_an_attention_cache_takes_any_cut_back_for_free(tmp_path: Path) -> None:
    from .tiny_models import write_tiny_llama

    engine = _engine()
    with engine.LlamaModel(write_tiny_llama(tmp_path / "tiny.gguf"), engine.LoadOptions(n_ctx=256)) as m:
        assert m.rollback_reach is None
        m.decode(list(range(10, 30)), [])
        m.truncate(12)
        m.decode([5, 6], [0])
        assert m.replayed == 0
