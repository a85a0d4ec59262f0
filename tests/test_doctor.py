"""`specchat doctor`: runs offline, reports every section, survives broken pieces, escapes file strings.

conftest points HF_ENDPOINT at 127.0.0.1:9 (nothing listens) and every cache at a temporary folder, so
these tests never touch the network or the user's caches.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specchat.cli import app, doctor
from specchat.models import cache, hub

from .tiny_models import write_tiny_llama

runner = CliRunner()

SECTIONS = {"specchat", "llama_cpp", "build_check", "system", "caches", "models", "hub", "versions"}
CUDA_INFO = (
    "CUDA : ARCHS = 500,610,700,750,800,860,890 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | "
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
    "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
)
METAL_INFO = (
    "Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | "
    "LLAMAFILE = 1 | ACCELERATE = 1 | REPACK = 1 |"
)


def doctor_json(*args: str) -> dict:
    res = runner.invoke(app, ["doctor", "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def mirror_file(repo: str, name: str) -> Path:
    """Where the mirror cache keeps `repo`/`name` under the test's SPECCHAT_HOME."""
    path = cache.cache_dirs()["mirror_models"] / repo.replace("/", "--") / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_json_has_every_section_and_the_facts_a_bug_report_needs():
    doc = doctor_json()
    assert set(doc) == SECTIONS
    build = doc["llama_cpp"]
    assert build["gpu_backend"] in {"CPU only", "CUDA", "Metal"} or build["gpu_offload"]
    assert isinstance(build["cpu_simd"], list) and "CPU" in build["backends"]
    system = doc["system"]
    assert system["logical_cores"] >= system["physical_cores"] >= 1
    assert system["ram_total_bytes"] >= system["ram_available_bytes"] > 0
    assert set(doc["caches"]) == {"hf_home", "hf_hub_cache", "specchat_home", "mirror_models"}
    versions = doc["versions"]
    for lib in ("python", "specchat", "llama-cpp-python", "huggingface_hub", "typer", "rich", "numpy"):
        assert versions[lib], lib
    assert doc["models"]["registry_models"] > 0 and doc["models"]["cached"] == []


def test_hub_probe_is_short_and_offline_is_respected(monkeypatch):
    hub_doc = doctor_json()["hub"]
    assert hub_doc["endpoint"] == "http://127.0.0.1:9"
    assert hub_doc["checked"] is True and hub_doc["reachable"] is False

    timeouts: list[float] = []

    def probe(*, timeout: float) -> bool:
        timeouts.append(timeout)
        return False

    monkeypatch.setattr(hub, "hub_reachable", probe)
    doctor_json()
    assert timeouts == [doctor.HUB_TIMEOUT]  # one probe, with the doctor's short timeout

    assert doctor_json("--offline")["hub"]["checked"] is False

    def no_network(*_a: object, **_k: object) -> bool:
        raise AssertionError("doctor probed the Hub while HF_HUB_OFFLINE=1")

    monkeypatch.setattr(hub, "hub_reachable", no_network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = doctor_json()["hub"]
    assert offline["offline"] is True and offline["reachable"] is None and "offline" in offline["note"]


def test_cached_models_registry_alias_and_stray_files(tiny_target, tiny_truncated):
    alias_path = mirror_file(
        "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    )
    shutil.copy(tiny_target, alias_path)
    snapshot = cache.cache_dirs()["hf_hub_cache"] / "models--someone--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    shutil.copy(tiny_truncated, snapshot / "cut.gguf")

    doc = doctor_json()
    rows = {Path(r["path"]).name: r for r in doc["models"]["cached"]}
    assert set(rows) == {alias_path.name, "cut.gguf"}
    known = rows[alias_path.name]
    assert known["alias"] == "qwen2.5-coder-0.5b"
    assert known["size_bytes"] == tiny_target.stat().st_size
    assert known["architecture"] == "llama" and known["name"].startswith("tiny-llama")
    assert known["truncated"] is False and known["error"] is None
    stray = rows["cut.gguf"]
    assert stray["alias"] is None and stray["truncated"] is True
    assert doc["caches"]["mirror_models"]["files"] == 1
    assert doc["caches"]["hf_hub_cache"]["size_bytes"] == tiny_truncated.stat().st_size

    table = runner.invoke(app, ["doctor", "--offline"], env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    assert "qwen2.5-coder-0.5b" in table.stdout and "(truncated)" in table.stdout


def test_hostile_metadata_is_shown_escaped(tmp_path):
    evil = "evil\x1b]0;owned\x07\x1b[2J[bold red]boom[/]\x9b"
    write_tiny_llama(mirror_file("org/evil", "evil.gguf"), seed=5, name=evil)
    mirror_file("org/junk", "junk.gguf").write_bytes(b"\x1b[31mnot a model\n")

    res = runner.invoke(app, ["doctor", "--offline"], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    out = res.stdout
    for raw in ("\x1b", "\x07", "\x9b"):
        assert raw not in out, repr(raw)
    assert "evil\\x1b]0;owned\\x07\\x1b[2J[bold red]boom[/]\\x9b" in out  # visible, markup not applied
    assert "not a GGUF file" in out  # the junk file is reported, not fatal

    doc = doctor_json("--offline")
    names = {r["name"] for r in doc["models"]["cached"]}
    assert evil in names  # JSON keeps the exact string; json.dumps escapes it
    assert "\x1b" not in runner.invoke(app, ["doctor", "--json", "--offline"]).stdout


def test_a_broken_section_is_reported_not_fatal(monkeypatch, tmp_path):
    import specchat.models.hardware

    def boom() -> dict:
        raise RuntimeError("psutil exploded")

    monkeypatch.setattr(specchat.models.hardware, "system_facts", boom)
    monkeypatch.setenv("SPECCHAT_MODELS", str(tmp_path / "nope.toml"))
    doc = doctor_json("--offline")
    assert doc["system"] == {"error": "RuntimeError: psutil exploded"}
    assert "nope.toml" in doc["models"]["registry_error"] and doc["models"]["registry"] is None
    assert doc["llama_cpp"]["backends"]  # the rest still came through

    res = runner.invoke(app, ["doctor", "--offline"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "psutil exploded" in res.stdout and "nope.toml" in res.stdout
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("info", "backends", "simd"),
    [
        (CUDA_INFO, ["CUDA", "CPU"], ["SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "AVX512"]),
        (METAL_INFO, ["Metal", "CPU"], ["NEON", "ARM_FMA", "FP16_VA", "DOTPROD"]),
        ("AVX = 1 | AVX2 = 1 | NEON = 0 | LLAMAFILE = 1 |", ["CPU"], ["AVX", "AVX2"]),
    ],
)
def test_parse_system_info_formats(monkeypatch, info, backends, simd):
    parsed = doctor.parse_system_info(info)
    assert list(parsed) == backends
    from specchat.llama import devices

    gpu = backends[0] != "CPU"
    monkeypatch.setattr(
        devices,
        "backend_info",
        lambda: {"llama_cpp_python": "x", "gpu_offload": gpu, "mmap": True, "system_info": info},
    )
    facts = doctor.llama_cpp_facts()
    assert facts["cpu_simd"] == simd
    assert facts["gpu_backend"] == (backends[0] if gpu else "CPU only")
    assert "LLAMAFILE" in facts["cpu_build_flags"] and "LLAMAFILE" not in facts["cpu_simd"]


def test_parse_system_info_keeps_values():
    parsed = doctor.parse_system_info(CUDA_INFO)
    assert parsed["CUDA"]["ARCHS"] == "500,610,700,750,800,860,890"
    assert parsed["CPU"]["AVX512"] == "1"
    assert doctor.parse_system_info("") == {}


def test_dir_usage_counts_each_file_once_and_stops_at_the_limit(tmp_path):
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "b1").write_bytes(b"x" * 100)
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "m.gguf").symlink_to(tmp_path / "blobs" / "b1")
    usage = doctor.dir_usage(tmp_path)
    assert usage == {"size_bytes": 100, "files": 1, "complete": True}
    for i in range(10):
        (tmp_path / f"f{i}").write_bytes(b"y")
    assert doctor.dir_usage(tmp_path, limit=5)["complete"] is False


def test_a_gpu_build_without_a_device_says_so(monkeypatch):
    """A CUDA build on a machine whose driver is missing or too old registers no CUDA device and runs
    on the CPU (checked on a real CUDA build with the toolkit's driver stub: tests/perf/device/
    cuda_smoke.sh); doctor names the build and says where to look, not just "CPU only"."""
    from specchat.llama import devices

    monkeypatch.setattr(
        devices,
        "backend_info",
        lambda: {"llama_cpp_python": "x", "gpu_offload": False, "mmap": True, "system_info": CUDA_INFO},
    )
    facts = doctor.llama_cpp_facts()
    assert facts["gpu_offload"] is False
    assert facts["gpu_backend"].startswith("none: this CUDA build found no usable device")
    assert facts["gpu_backend"].endswith("CPU only")
