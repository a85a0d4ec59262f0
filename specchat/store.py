"""Where specchat keeps its own small state files (calibration, build-check verdicts), and how they
are read and written: best effort, because each only saves a re-measurement.

`SPECCHAT_HOME`, else `$XDG_CACHE_HOME/specchat`, else `~/.cache/specchat` (hub.py puts mirrored
model files under the same folder).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def home() -> Path:
    """specchat's own cache folder (not created here)."""
    return Path(
        os.environ.get("SPECCHAT_HOME")
        or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specchat")
    )


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
