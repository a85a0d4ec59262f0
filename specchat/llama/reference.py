"""llama.cpp's own speculative modes as a reference, run on the same prompts as specchat's bench.

specchat must be at least as fast as llama.cpp's best n-gram mode on the same machine, so `specchat
bench --llama-cpp DIR` runs `llama-speculative-simple` from DIR as a subprocess beside its own
configurations, interleaved, and reports the ratios. Only this module knows that program's flags and
output format; it never imports llama_cpp (the reference is a separate build, run as its own
process, so the two never share threads).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput

PROGRAM = "llama-speculative-simple"

#: llama.cpp's model-free modes, with its defaults and with the settings its docs suggest for edits
REFERENCE_MODES: dict[str, tuple[str, ...]] = {
    "llama.cpp ngram-simple": ("--spec-type", "ngram-simple"),
    "llama.cpp ngram-mod": ("--spec-type", "ngram-mod"),
    "llama.cpp ngram-mod 8/2-16": (
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "8", "--spec-ngram-mod-n-min", "2",
        "--spec-ngram-mod-n-max", "16",
    ),
}  # fmt: skip

_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+)")
_ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")


@dataclass(frozen=True, slots=True)
class RefRun:
    """One run of the reference: decode speed (prompt processing excluded) and acceptance."""

    tokens_per_second: float
    acceptance_rate: float
    generated: int


def find_program(bin_dir: Path) -> Path:
    """The reference program in `bin_dir`, or one line saying how to get it."""
    exe = Path(bin_dir).expanduser() / PROGRAM
    if not exe.is_file():
        raise BadInput(
            f"no {PROGRAM} in {bin_dir}",
            "build llama.cpp's examples (e.g. cmake --build build --target llama-speculative-simple) and "
            "pass its bin folder to --llama-cpp",
        )
    return exe


def run_reference(
    exe: Path,
    target: Path,
    prompt_text: str,
    mode: Sequence[str],
    *,
    max_tokens: int,
    threads: int,
    ctx_size: int,
    timeout: float = 900.0,
) -> RefRun:
    """Generate greedily with llama.cpp's reference program on the same prompt text (already rendered
    with the chat template, special tokens included, as specchat decodes it)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as fh:
        fh.write(prompt_text)
        fh.flush()
        argv = [
            str(exe), "-m", str(target), "-f", fh.name, "-n", str(max_tokens), "--temp", "0", "-s", "1",
            "-t", str(threads), "-c", str(ctx_size), *mode,
        ]  # fmt: skip
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BadInput(f"{PROGRAM} could not run: {exc}", "check the --llama-cpp folder") from None
    speed = _DECODED.search(out.stderr)
    if out.returncode != 0 or speed is None:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise BadInput(f"{PROGRAM} failed (exit {out.returncode}): {last}", "run it by hand to see why")
    rate = _ACCEPT.search(out.stderr)
    return RefRun(
        tokens_per_second=float(speed.group(3)),
        acceptance_rate=float(rate.group(1)) / 100.0 if rate else 0.0,
        generated=int(speed.group(1)),
    )
