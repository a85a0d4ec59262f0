"""Text fit to print on a terminal. A foundation: imports nothing of specchat."""

from __future__ import annotations

#: C0/C1 control characters (ESC above all) would let model output drive the terminal: show them as
#: visible escapes instead. Newline and tab are layout, not control, and stay.
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c not in (0x09, 0x0A)}


def terminal_safe(text: str) -> str:
    """Text fit to print on a terminal: control characters made visible, nothing else changed."""
    return text.translate(_CONTROL)
