"""Where the real default pair (Qwen2.5-Coder 1.5B target, 0.5B draft) is on this machine, for the slow
tests: the user's specchat cache, or where the dev fetch script puts it. Tests skip without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DEV_DIR = Path.home() / ".cache" / "specchat-dev" / "models"
FILES = {
    "target": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "draft": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}


def _find(name: str) -> Path | None:
    """The file in the user's real specchat cache, or where the dev fetch script puts it."""
    home = Path(os.environ.get("REAL_SPECCHAT_HOME", Path.home() / ".cache" / "specchat"))
    for p in (*home.glob(f"models/*/{name}"), DEV_DIR / name):
        if p.is_file():
            return p
    return None


@pytest.fixture(scope="module")
def real_pair() -> tuple[Path, Path]:
    target, draft = _find(FILES["target"]), _find(FILES["draft"])
    if target is None or draft is None:
        pytest.skip("the real default pair is not downloaded")
    return target, draft
