"""Shared test set-up: every test gets private cache/home directories and no network by default."""

from __future__ import annotations

import pytest

from .dflash_models import dflash_pair, dspark_drafter  # noqa: F401  (re-exported fixtures)
from .eagle3_models import eagle3_pair  # noqa: F401  (re-exported fixtures)
from .hybrid_models import (  # noqa: F401  (re-exported fixtures)
    gemma4_pair,
    hybrid_models_dir,
    lfm2_pair,
    qwen35_mtp,
    qwen35_pair,
)
from .real_models import real_pair  # noqa: F401  (re-exported fixtures)
from .serving import tiny_engine, tiny_url  # noqa: F401  (re-exported fixtures)
from .tiny_models import (  # noqa: F401  (re-exported fixtures)
    not_a_gguf,
    tiny_incompatible,
    tiny_models_dir,
    tiny_pair,
    tiny_pair_unrelated,
    tiny_special_mismatch,
    tiny_spm,
    tiny_target,
    tiny_truncated,
)


@pytest.fixture(autouse=True)
def _private_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point every cache specchat or huggingface_hub could write at a temporary directory."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("SPECCHAT_HOME", str(home / "specchat"))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hf" / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: no real network
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
