"""Hub downloads against a local stand-in Hub: pull forms, cache hits without network, offline, resume,
checksums, and the `pull` / `models` commands. Nothing here reaches the real network."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from specchat.cli.models import human_size, register
from specchat.errors import DownloadError, ModelNotFound, OfflineError
from specchat.models import cache, hub, hub_download
from specchat.models.registry import resolve
from specchat.models.registry_toml import load_registry

from .standin_hub import COMMIT, Env, StandinHub, isolate, model_fields, tiny_gguf, write_registry

REPO = "tester/Tiny-GGUF"
Q4_1 = tiny_gguf(300_000, seed=1)
Q8_0 = tiny_gguf(200_000, seed=2)
DRAFT = tiny_gguf(50_000, seed=3)


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Env:
    env = isolate(monkeypatch, tmp_path)
    registry = write_registry(
        tmp_path / "models.toml",
        {
            "tiny": model_fields(REPO, "tiny-Q4_1.gguf", Q4_1, draft="tiny-draft"),
            "tiny-draft": model_fields("tester/Draft-GGUF", "draft-Q4_1.gguf", DRAFT),
            "elsewhere": model_fields("tester/Absent-GGUF", "absent-Q4_1.gguf", DRAFT),
        },
    )
    monkeypatch.setenv("SPECCHAT_MODELS", str(registry))
    return env


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandinHub]:
    with StandinHub() as fake:
        fake.add(REPO, "tiny-Q4_1.gguf", Q4_1)
        fake.add(REPO, "tiny-Q8_0.gguf", Q8_0)
        fake.add(REPO, "README.md", b"# tiny\n")
        fake.add("tester/Draft-GGUF", "draft-Q4_1.gguf", DRAFT)
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake


def quiet() -> Console:
    return Console(file=io.StringIO(), width=120)


def cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def invoke(*args: str) -> tuple[int, list[str], str]:
    result = CliRunner().invoke(cli(), list(args))
    return result.exit_code, result.stdout.splitlines(), result.stderr


# --- pull forms ---------------------------------------------------------------------------------------------


def test_pull_by_alias_lands_in_the_hf_cache(env: Env, standin: StandinHub) -> None:
    path = hub.pull(resolve("tiny", load_registry()), console=quiet())
    assert path.read_bytes() == Q4_1
    assert path == env.hub_cache / "models--tester--Tiny-GGUF" / "snapshots" / COMMIT / "tiny-Q4_1.gguf"
    assert cache.cached_path(resolve("tiny", load_registry())) == path


def test_pull_hf_reference_via_cli_prints_the_path_last(env: Env, standin: StandinHub) -> None:
    code, out, _ = invoke("pull", f"hf:{REPO}/tiny-Q8_0.gguf")
    assert code == 0
    assert len(out) == 1 and Path(out[0]).read_bytes() == Q8_0
    assert Path(out[0]).is_relative_to(env.hub_cache)


def test_pull_repo_quant_lists_the_repo_and_picks_the_file(env: Env, standin: StandinHub) -> None:
    code, out, _ = invoke("pull", f"{REPO}:q8_0")
    assert code == 0 and Path(out[-1]).read_bytes() == Q8_0
    assert any("/api/models/tester/Tiny-GGUF/tree/main" in r.path for r in standin.requests)
    # Cached now: the same reference resolves from the cache, with the stand-in gone.
    standin.stop()
    assert hub.locate(resolve(f"{REPO}:Q8_0", load_registry()), offline=True) == Path(out[-1])


def test_pull_repo_quant_ambiguous_or_missing_is_one_clear_line(standin: StandinHub) -> None:
    standin.add(REPO, "tiny-Q4_K_M.gguf", b"x")
    standin.add(REPO, "tiny-Q4_K_S.gguf", b"y")
    code, out, err = invoke("pull", f"{REPO}:Q4_K")
    assert code != 0 and out == []
    assert "2 files in tester/Tiny-GGUF match Q4_K: tiny-Q4_K_M.gguf, tiny-Q4_K_S.gguf" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = invoke("pull", f"{REPO}:Q2_K")
    assert code != 0 and "carries quantisation Q2_K" in err and "tiny-Q8_0.gguf" in err


def test_pull_with_draft_fetches_both(standin: StandinHub) -> None:
    code, out, _ = invoke("pull", "tiny", "--with-draft")
    assert code == 0
    assert [Path(p).read_bytes() for p in out] == [Q4_1, DRAFT]


def test_unknown_repo_and_file_are_model_not_found(standin: StandinHub) -> None:
    registry = load_registry()
    with pytest.raises(ModelNotFound, match="no model repo nobody/Nothing-GGUF"):
        hub.pull(resolve("hf:nobody/Nothing-GGUF/x.gguf", registry), console=quiet())
    with pytest.raises(ModelNotFound, match=r"no file nope\.gguf in tester/Tiny-GGUF"):
        hub.pull(resolve(f"hf:{REPO}/nope.gguf", registry), console=quiet())


# --- cache and offline --------------------------------------------------------------------------------------


def test_cached_model_is_used_without_the_network(standin: StandinHub) -> None:
    ref = resolve("tiny", load_registry())
    first = hub.pull(ref, console=quiet())
    standin.stop()  # connections are now refused: any network use would fail
    assert hub.locate(ref) == first
    assert hub.locate(ref, offline=True) == first
    assert hub.pull(ref, console=quiet()) == first


def test_offline_miss_names_the_pull_command_and_stays_off_the_network(
    monkeypatch: pytest.MonkeyPatch, standin: StandinHub
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError) as caught:
        hub.locate(resolve("tiny", load_registry()))
    assert "`specchat pull tiny`" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert standin.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    code, out, err = invoke("pull", "--offline", f"hf:{REPO}/tiny-Q8_0.gguf")
    assert code != 0 and out == []
    assert f"specchat pull hf:{REPO}/tiny-Q8_0.gguf" in err
    assert standin.requests == []


def test_unreachable_hub_without_mirror_fails_at_the_probe(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """One short probe decides: huggingface_hub, whose retries take minutes, is never asked."""

    def asked(*_a: object, **_k: object) -> None:
        raise AssertionError("huggingface_hub was asked although the Hub is unreachable")

    monkeypatch.setattr(hub_download, "file_metadata", asked)
    monkeypatch.setattr(hub_download, "pick_from_listing", asked)
    with pytest.raises(OfflineError, match="unreachable"):
        hub.pull(resolve("tiny", load_registry()), console=quiet())


# --- integrity ----------------------------------------------------------------------------------------------


def test_interrupted_download_resumes_from_the_received_bytes(standin: StandinHub) -> None:
    # A connection cut while the Hub still answers is resumed within the same pull, from every byte
    # received (specchat writes what arrives; see test_download_faults.py for a resume in a later pull).
    big = tiny_gguf(1 << 20, seed=4)
    standin.add(REPO, "big-Q4_1.gguf", big)
    cut = 300_000
    standin.cut_next_download_after(cut)
    path = hub.pull(resolve(f"hf:{REPO}/big-Q4_1.gguf", load_registry()), console=quiet())
    assert path.read_bytes() == big
    assert [r.range for r in standin.downloads()] == [None, f"bytes={cut}-"]
    assert standin.bytes_served == len(big)


def test_sha_mismatch_is_refused_and_the_file_removed(
    env: Env, monkeypatch: pytest.MonkeyPatch, standin: StandinHub
) -> None:
    bad = write_registry(
        env.root / "bad.toml", {"tiny": model_fields(REPO, "tiny-Q4_1.gguf", Q4_1, sha256="0" * 64)}
    )
    monkeypatch.setenv("SPECCHAT_MODELS", str(bad))
    ref = resolve("tiny", load_registry())
    with pytest.raises(DownloadError, match=r"sha256 mismatch for tiny.*the file was removed"):
        hub.pull(ref, console=quiet())
    assert cache.cached_path(ref) is None
    blobs = env.hub_cache / "models--tester--Tiny-GGUF" / "blobs"
    assert not any(blobs.iterdir())


def test_force_downloads_again(standin: StandinHub) -> None:
    ref = resolve("tiny", load_registry())
    hub.pull(ref, console=quiet())
    before = len(standin.downloads())
    assert hub.pull(ref, force=True, console=quiet()).read_bytes() == Q4_1
    assert len(standin.downloads()) == before + 1


# --- settings -----------------------------------------------------------------------------------------------


def test_settings_are_read_at_call_time(env: Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    dirs = cache.cache_dirs()
    assert dirs["hf_hub_cache"] == env.hub_cache
    assert dirs["specchat_home"] == env.specchat_home
    assert dirs["mirror_models"] == env.specchat_home / "models"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    assert cache.cache_dirs()["hf_hub_cache"] == tmp_path / "elsewhere" / "hub"
    assert cache.is_offline() is False
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cache.is_offline() is True and cache.is_offline(False) is False


def test_hub_reachable(standin: StandinHub, monkeypatch: pytest.MonkeyPatch) -> None:
    assert hub.hub_reachable() is True
    standin.stop()
    assert hub.hub_reachable(timeout=1) is False


# --- `specchat models` --------------------------------------------------------------------------------------


def test_models_json_reports_cache_state(standin: StandinHub) -> None:
    path = hub.pull(resolve("tiny", load_registry()), console=quiet())
    code, out, _ = invoke("models", "--json")
    assert code == 0
    rows = {row["alias"]: row for row in json.loads("\n".join(out))}
    assert set(rows) == {"tiny", "tiny-draft", "elsewhere"}
    assert rows["tiny"]["cached"] is True and rows["tiny"]["path"] == str(path)
    assert rows["tiny"]["size"] == len(Q4_1) and rows["tiny"]["draft"] == "tiny-draft"
    assert rows["elsewhere"]["cached"] is False and rows["elsewhere"]["path"] is None


def test_models_drafts_for_and_table(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = invoke("models", "--json", "--drafts-for", "tiny")
    assert code == 0
    assert [row["alias"] for row in json.loads("\n".join(out))] == ["tiny-draft", "elsewhere"]
    monkeypatch.setenv("COLUMNS", "200")  # Rich sizes the table to the terminal
    code, out, _ = invoke("models")
    assert code == 0
    table = "\n".join(out)
    assert "tiny-draft" in table and human_size(len(Q4_1)) in table and "300.1 kB" in table
    code, _, err = invoke("models", "--drafts-for", f"hf:{REPO}/x.gguf")
    assert code != 0 and "not a model in models.toml" in err


def test_human_size() -> None:
    assert [human_size(n) for n in (999, 1_117_320_768, 42_520_398_464, 2_000_000_000_000)] == [
        "999 B",
        "1.1 GB",
        "42.5 GB",
        "2.0 TB",
    ]
