"""Drafters that come with the model (llama/mtp.py): a Qwen3.5-layout target's own NextN head and Gemma
4's MTP assistant, on tiny GGUFs of both layouts written at test time (tests/hybrid_models.py,
tests/gemma4_models.py). Through `specchat run` as a user runs it: the head drafts by default, its
tokens show as the model's own, and the output is the target's own token for token."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from specchat.cli import app
from specchat.decoding.registry import MTP
from specchat.models.heads import assistant_spec, has_own_drafter
from specchat.models.loader import LoadConfig, default_drafts, load
from specchat.models.registry import resolve
from specchat.models.registry_toml import load_registry

runner = CliRunner()
PROMPT = "Write a function that reverses a string, then explain how it works."


def run_json(*args: str) -> dict:
    res = runner.invoke(app, ["run", *args, "--json", "--threads", "1", "--ctx-size", "512", "-p", PROMPT])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_a_target_with_nextn_layers_drafts_with_its_head_by_default(qwen35_mtp: Path) -> None:
    """The default drafters include the head (the planner then decides per round whether it pays:
    on a model this small it seldom does), and whatever it decides the text is the target's own."""
    drafts = default_drafts(str(qwen35_mtp))
    assert drafts == (MTP, "ngram")
    loaded = load(LoadConfig(str(qwen35_mtp), drafts, ctx_size=512, threads=1, tree_width=4))
    try:
        assert [type(d).__name__ for d in loaded.drafters] == ["HeadDrafter", "NgramDrafter"]
        assert loaded.drafters[0].source.value == MTP
        # a recurrent target verifies chains: neither drafter builds token trees for it
        assert [d.tree_width for d in loaded.drafters] == [0, 0]
    finally:
        loaded.close()
    spec = run_json(str(qwen35_mtp), "-n", "48")
    plain = run_json(str(qwen35_mtp), "--no-draft", "-n", "48")
    assert spec["tokens"] == plain["tokens"]


def test_the_head_alone_at_a_fixed_depth_equals_plain_decoding(qwen35_mtp: Path) -> None:
    spec = run_json(str(qwen35_mtp), "--draft", MTP, "-k", "3", "--draft-p-min", "0", "-n", "48")
    plain = run_json(str(qwen35_mtp), "--no-draft", "-n", "48")
    assert spec["tokens"] == plain["tokens"]
    assert spec["stats"]["drafted"] > 20 and 0 < spec["stats"]["accepted"] < spec["stats"]["drafted"]


def test_gemma4_drafts_with_its_assistant_found_beside_it(
    gemma4_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    target, assistant = gemma4_pair
    folder = tmp_path / "g4"
    folder.mkdir()
    local = shutil.copy(target, folder / "gemma-4-tiny.gguf")
    shutil.copy(assistant, folder / "mtp-gemma-4-tiny.gguf")
    ref = resolve(str(local), load_registry())
    assert has_own_drafter(ref) and assistant_spec(ref, MTP) == str(folder / "mtp-gemma-4-tiny.gguf")
    spec = run_json(str(local), "--draft", MTP, "-k", "2", "--draft-p-min", "0", "-n", "40")
    plain = run_json(str(local), "--no-draft", "-n", "40")
    assert spec["tokens"] == plain["tokens"]
    assert 0 < spec["stats"]["accepted"] < spec["stats"]["drafted"]
    named = run_json(str(target), "--draft", f"{MTP}:assistant={assistant}", "-k", "2", "-n", "40")
    assert named["tokens"] == plain["tokens"]


def test_no_head_to_run_is_one_clear_line(
    qwen35_pair: tuple[Path, Path], gemma4_pair: tuple[Path, Path]
) -> None:
    target, _ = qwen35_pair
    assert default_drafts(str(target)) == ("ngram",)
    res = runner.invoke(app, ["run", str(target), "--draft", MTP, "-p", "hi", "-n", "4"])
    assert res.exit_code != 0 and "has no multi-token-prediction drafter" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(app, ["run", str(target), "--draft", f"{MTP}:assistant={gemma4_pair[1]}", "-p", "hi"])
    assert res.exit_code != 0 and "is no MTP assistant for" in res.output
    res = runner.invoke(app, ["run", str(target), "--draft", f"{MTP}:depth=3", "-p", "hi"])
    assert res.exit_code != 0 and "takes one option, assistant=PATH" in res.output


def test_pending_rows_are_kept_in_position_order_and_dropped_from_either_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PendingRows (the target's rows a head or block drafter has not read): a decode from `base`
    replaces what was kept from `base` on, reading drops the rows before a position, and past the
    cap the oldest go first."""
    from specchat.llama import head as head_mod

    rows = head_mod.PendingRows()
    rows.put(0, np.zeros((5, 2), dtype=np.float32))
    rows.put(3, np.ones((4, 2), dtype=np.float32))  # a cut back to 3, then 4 new tokens
    assert list(rows) == [0, 1, 2, 3, 4, 5, 6] and rows[2][0] == 0 and rows[3][0] == 1
    rows.drop_before(2)
    rows.drop_from(5)
    assert list(rows) == [2, 3, 4]
    monkeypatch.setattr(head_mod, "MAX_PENDING_STATES", 4)
    rows.put(5, np.full((3, 2), 2, dtype=np.float32))
    assert list(rows) == [4, 5, 6, 7]
