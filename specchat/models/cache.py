"""Where model files are, without any network: settings read at call time (HF_ENDPOINT, HF_TOKEN,
HF_HUB_OFFLINE), the cache folders (the Hugging Face cache, specchat's mirror cache), the cached file for a
reference and whether it still matches models.toml (size, sha256)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from rich.console import Console

from specchat import store
from specchat.errors import BadInput, ModelNotFound
from specchat.models.files import hash_with_progress
from specchat.models.registry import ModelRef, pick_quant_file

DEFAULT_ENDPOINT = "https://huggingface.co"


TRUE_VALUES = {"1", "true", "yes", "on"}


SHA256_RE = re.compile(r"[0-9a-f]{64}")


def hf_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/") or DEFAULT_ENDPOINT


def hf_token() -> str | None:
    # None lets huggingface_hub fall back to a stored `hf auth login` token.
    return os.environ.get("HF_TOKEN") or None


def is_offline(offline: bool | None = None) -> bool:
    """An explicit flag wins; otherwise HF_HUB_OFFLINE (the variable every HF tool honours)."""
    if offline is not None:
        return offline
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE_VALUES


def cache_dirs() -> dict[str, Path]:
    """Where models live, for `specchat doctor` and for this module.

    Keys: hf_home, hf_hub_cache (Hub downloads), specchat_home, mirror_models (mirror downloads).
    """
    xdg_cache = store.env_path("XDG_CACHE_HOME") or Path.home() / ".cache"  # huggingface_hub's rule
    hf_home = store.env_path("HF_HOME") or xdg_cache / "huggingface"
    hub_cache = store.env_path("HF_HUB_CACHE") or store.env_path("HUGGINGFACE_HUB_CACHE") or hf_home / "hub"
    home = store.home()
    return {
        "hf_home": hf_home,
        "hf_hub_cache": hub_cache,
        "specchat_home": home,
        "mirror_models": home / "models",
    }


def mirror_folder(repo: str) -> Path:
    return cache_dirs()["mirror_models"] / repo.replace("/", "--")


def cached_path(ref: ModelRef) -> Path | None:
    """The local file for `ref` if already on disk (HF cache or mirror cache); never uses the network."""
    if ref.path is not None:
        return ref.path if ref.path.is_file() else None
    assert ref.repo is not None
    if ref.file is not None:
        return _cached_hub_file(ref.repo, ref.file, ref.revision) or _existing(
            mirror_folder(ref.repo) / ref.file
        )
    # ORG/REPO:QUANT: choose among the files we already have for that repo.
    assert ref.quant is not None
    names = _cached_repo_files(ref.repo, ref.revision)
    mirror_dir = mirror_folder(ref.repo)
    if mirror_dir.is_dir():
        names += [p.name for p in mirror_dir.iterdir() if p.is_file() and p.suffix.lower() == ".gguf"]
    try:
        name = pick_quant_file(names, ref.quant, ref.repo)
    except (ModelNotFound, BadInput):
        return None
    return _cached_hub_file(ref.repo, name, ref.revision) or _existing(mirror_dir / name)


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


def hf_repo_dir(repo: str) -> Path:
    return cache_dirs()["hf_hub_cache"] / f"models--{repo.replace('/', '--')}"


def dangling_snapshot(ref: ModelRef) -> Path | None:
    """The HF cache link for `ref` when it is still there but its blob was deleted (else None)."""
    if ref.repo is None or ref.file is None:
        return None
    repo_dir = hf_repo_dir(ref.repo)
    ref_file = repo_dir / "refs" / ref.revision
    try:
        commit = ref_file.read_text().strip() if ref_file.is_file() else ref.revision
    except OSError:
        return None
    link = repo_dir / "snapshots" / commit / ref.file
    return link if link.is_symlink() and not link.exists() else None


def _describes_file(ref: ModelRef) -> bool:
    """Whether ref's registry entry is about exactly the file ref names (so its size and sha256 apply)."""
    entry = ref.entry
    return entry is not None and ref.repo == entry.repo and ref.file == entry.file


def registry_size(ref: ModelRef) -> int | None:
    return ref.entry.size if ref.entry is not None and _describes_file(ref) else None


def _expected_sha256(ref: ModelRef, path: Path) -> str | None:
    """The sha256 a cached file must have: models.toml's (or its mirror's), else, for a Hub LFS file, the
    name of its blob (the Hub names LFS blobs by their sha256)."""
    if ref.sha256:
        return ref.sha256
    mirror = ref.mirror
    if mirror is not None and path.parent == mirror_folder(ref.repo or ""):
        return mirror.sha256
    if path.is_symlink():
        name = path.resolve().name
        if SHA256_RE.fullmatch(name):
            return name
    return None


def pull_force_command(ref: ModelRef) -> str:
    return ref.pull_command().replace("specchat pull ", "specchat pull --force ", 1)


def cached_problem(ref: ModelRef, path: Path, console: Console) -> str | None:
    """Why a cached file cannot be used (wrong size, wrong sha256), or None when it checks out."""
    actual_size = path.stat().st_size
    expected_size = registry_size(ref)
    if expected_size is not None and actual_size != expected_size:
        return f"cached file {ref.display} is {actual_size:,} bytes, expected {expected_size:,}"
    expected = _expected_sha256(ref, path)
    if expected is None:
        return None
    actual = hash_with_progress(path, console, f"checking {ref.display}", actual_size)
    if actual != expected:
        return (
            f"cached file {ref.display} does not match its sha256 "
            f"(expected {expected[:16]}…, got {actual[:16]}…)"
        )
    return None


def discard_cached(path: Path) -> None:
    """Remove a bad cached file: for the HF cache both the snapshot link and the blob it points to."""
    blob = path.resolve()
    for victim in (path, blob):
        victim.unlink(missing_ok=True)
