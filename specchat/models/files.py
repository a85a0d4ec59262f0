"""Writing model files safely: disk space checked before a download (and ENOSPC while writing said the
same way), the buffered writes the download tests fill part way, sha256 with a progress bar, human sizes."""

from __future__ import annotations

import errno
import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
)

from specchat.errors import DownloadError
from specchat.models.registry import ModelRef

HASH_BLOCK = 8 << 20


_WRITE_BUFFER = 1 << 20


_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def human_size(size: int) -> str:
    """Bytes as people read file sizes (decimal units, like the Hub's file listing)."""
    if size < 1000:
        return f"{size} B"
    value = float(size)
    for unit in ("kB", "MB", "GB"):
        value /= 1000
        if value < 1000:
            return f"{value:.1f} {unit}"
    return f"{value / 1000:.1f} TB"


def free_bytes(folder: Path) -> int | None:
    """Free space where `folder` is (or would be created): the nearest existing ancestor's disk."""
    for candidate in (folder, *folder.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def ensure_space(need: int, folder: Path, ref: ModelRef, setting: str) -> None:
    """Refuse before writing a byte when the disk under `folder` cannot take `need` more bytes."""
    free = free_bytes(folder)
    if need <= 0 or free is None or free >= need:
        return
    raise DownloadError(
        f"not enough disk space for {ref.display}: {human_size(need)} needed, "
        f"{human_size(free)} free in {folder}",
        hint=f"free {human_size(need - free)} or point {setting} at a bigger disk, "
        f"then run `{ref.pull_command()}`",
    )


def is_disk_full(err: OSError) -> bool:
    return err.errno in _DISK_FULL


def open_for_write(path: Path, mode: str) -> BinaryIO:
    """Open a download or join target; a seam for the tests that fill the disk part way."""
    return open(path, mode, buffering=_WRITE_BUFFER)  # callers close it (with)


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    """Hex sha256 of a file, read in 8 MiB blocks so multi-GB models do not sit in memory."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(HASH_BLOCK):
            digest.update(block)
            if progress is not None:
                progress(len(block))
    return digest.hexdigest()


def hash_with_progress(path: Path, console: Console, label: str, total: int) -> str:
    """sha256_file with a transient bar: hashing a multi-GB model takes seconds, worth showing."""
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), console=console, transient=True
    ) as progress:
        task = progress.add_task(label, total=total)
        return sha256_file(path, progress=lambda n: progress.advance(task, n))
