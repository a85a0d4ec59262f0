"""Where specchat keeps its own files (calibration, build-check verdicts, chat history, mirrored
model downloads), and how its small state files are read and written: best effort, because each
only saves a re-measurement.

`SPECCHAT_HOME`, else the platform's per-user cache folder + `specchat` (`$XDG_CACHE_HOME` or
`~/.cache` on Linux, `~/Library/Caches` on macOS, `%LOCALAPPDATA%` on Windows). models/cache.py's
`cache_dirs()["specchat_home"]` is this folder.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def env_path(name: str) -> Path | None:
    """An environment variable naming a folder, with `~` and `$VARS` expanded; None when unset."""
    value = os.environ.get(name)
    return Path(os.path.expandvars(value)).expanduser() if value else None


def user_cache_dir() -> Path:
    """The platform's per-user cache folder (what platformdirs would say, without the dependency)."""
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches"
    return env_path("XDG_CACHE_HOME") or Path.home() / ".cache"


def home() -> Path:
    """specchat's own cache folder (not created here)."""
    return env_path("SPECCHAT_HOME") or user_cache_dir() / "specchat"


def read_json(path: Path) -> dict[str, Any]:
    """A state file's object; a missing, damaged or foreign file reads as empty."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace a state file atomically (write a sibling, then rename); a read-only disk is ignored."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError:
        pass
