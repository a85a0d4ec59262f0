"""What a probe child process reported: the `step ...` lines it printed before each evaluation (so a
crash names the step it died in) and the one JSON object it printed last. Shared by the build
self-check (buildcheck) and the batch-invariance probe (invariance), whose children speak alike."""

from __future__ import annotations

import json
from typing import Any


def last_step(stdout: str) -> str:
    """' during <the last step>' (or '' when the child named none), for a one-line verdict."""
    steps = [ln[5:] for ln in stdout.splitlines() if ln.startswith("step ")]
    return f" during {steps[-1]}" if steps else ""


def report(stdout: str) -> dict[str, Any] | None:
    """The last line that starts with '{' as a JSON object, or None when there is none or it is not."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None
