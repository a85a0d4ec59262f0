"""Which multi-token-prediction (MTP) drafter a target ships with, found without loading it.

Two kinds exist: NextN layers inside the target's own GGUF (Qwen3.5 and later, Qwen3-Next, GLM,
MiMo: the registry's `mtp = true`, or the file header's `{arch}.nextn_predict_layers`), and a separate
assistant file beside it that reads the target's cache (Gemma 4's `mtp-gemma-4-*.gguf`, architecture
gemma4-assistant: the registry's `assistant`, a file given as `--draft mtp:assistant=PATH`, or one
named `mtp-*.gguf` in the target's folder). `--draft mtp` means whichever the target has; the loader
builds it (llama/mtp.py).
"""

from __future__ import annotations

from pathlib import Path

from ..decoding import registry as drafters
from ..errors import BadInput, ModelFileError
from .cache import cached_path
from .gguf import read_gguf
from .registry import ModelRef

#: the architecture llama.cpp gives Gemma 4's MTP assistant files, and the targets they draft for
ASSISTANT_ARCH = "gemma4-assistant"
ASSISTED_ARCHS = ("gemma4",)


def carries_nextn(ref: ModelRef) -> bool:
    """Whether the target's file keeps NextN layers: the registry entry says so, or the local (or
    already downloaded) file's header does. Never downloads anything."""
    if ref.entry is not None and ref.entry.mtp:
        return True
    path = cached_path(ref)
    if path is None:
        return False
    try:
        info = read_gguf(path)
    except ModelFileError:  # not a GGUF, or truncated: the loader says so in its own words
        return False
    return int(info.arch_get("nextn_predict_layers", 0) or 0) > 0


def sibling_assistant(target: Path) -> Path | None:
    """An MTP assistant file beside a local target: `mtp-*.gguf` in its folder whose header says
    gemma4-assistant, the one whose name shares most with the target's if there are several."""
    found = []
    for path in sorted(target.parent.glob("mtp-*.gguf")):
        try:
            if read_gguf(path).architecture == ASSISTANT_ARCH:
                found.append(path)
        except ModelFileError:
            continue
    stem = target.stem.lower()

    def shared(p: Path) -> int:
        name = p.stem.lower().removeprefix("mtp-")
        return next(
            (i for i, (a, b) in enumerate(zip(name, stem, strict=False)) if a != b), min(len(name), len(stem))
        )

    return max(found, key=shared) if found else None


def assistant_spec(target: ModelRef, head_spec: str) -> str | None:
    """What to load as the target's MTP assistant for `--draft mtp[:assistant=PATH]`: a path or the
    registry alias to fetch, or None where the target has none (then its NextN layers, if any)."""
    _, options = drafters.split(head_spec)
    unknown = set(options) - {"assistant"}
    if unknown:
        raise BadInput(
            f"--draft {head_spec}: `{drafters.MTP}` takes one option, assistant=PATH "
            f"(not {', '.join(sorted(unknown))})",
            f"write --draft {drafters.MTP} or --draft {drafters.MTP}:assistant=mtp-MODEL.gguf",
        )
    if options.get("assistant"):
        return options["assistant"]
    if carries_nextn(target):
        return None
    if target.entry is not None and target.entry.assistant:
        return target.entry.assistant
    path = cached_path(target)
    if path is None or _architecture(path) not in ASSISTED_ARCHS:
        return None
    sibling = sibling_assistant(path)
    return str(sibling) if sibling is not None else None


def _architecture(path: Path) -> str | None:
    try:
        return read_gguf(path).architecture
    except ModelFileError:
        return None


def has_own_drafter(target: ModelRef) -> bool:
    """Whether `--draft mtp` has something to run for this target (its NextN layers or an assistant)."""
    return carries_nextn(target) or assistant_spec(target, drafters.MTP) is not None
