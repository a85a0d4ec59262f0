"""The fit check before any download (`run`, `chat`, `bench` through loader.load, and `pull`), and the
machine's memory as llama.cpp reports it (GPU memory, Apple Silicon's unified memory).

Sizes come from models.toml or the stand-in Hub's metadata; the stand-in counts the file bytes it
serves, so "refused before downloading a byte" is checked, not assumed. RAM is faked (24 GB).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from specchat.cli import app
from specchat.errors import NotEnoughMemory
from specchat.llama.devices import DeviceMemory, device_memory
from specchat.models import hardware
from specchat.models.hardware import GIB, MIB, Footprint, estimate_from_size, fit_check, machine_memory

from .standin_hub import StandinHub, isolate, model_fields, tiny_gguf, write_registry

REPO = "tester/Big-GGUF"
SMALL = tiny_gguf(100_000, seed=4)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def ram_24gb(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 24 GB machine with 20 GB available, whatever this one has."""
    fake = SimpleNamespace(total=24 * GIB, available=20 * GIB, percent=16.7, used=4 * GIB, free=20 * GIB)
    monkeypatch.setattr(hardware.psutil, "virtual_memory", lambda: fake)


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandinHub]:
    with StandinHub() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("using the recommended")]
    assert len(lines) == 1, stderr
    return lines[0]


# --- the user's case: a 42.5 GB pair on a 24 GB machine -------------------------------------------------


def test_run_70b_with_its_draft_is_refused_before_a_byte_is_downloaded(
    ram_24gb: None, standin: StandinHub
) -> None:
    res = invoke("run", "llama3-70b", "--draft", "llama3.2-1b", "-p", "hi")
    assert res.exit_code == 1
    line = one_line(res.stderr)
    assert "not enough memory: the model and its draft need about 4" in line
    assert "estimated from the file sizes, before downloading" in line
    assert "only 20.0 GB of RAM available (this machine: 24.0 GB RAM" in line
    assert "smaller quantisation" in line and "--force to download and try anyway" in line
    assert standin.bytes_served == 0 and standin.downloads() == []


def test_pull_70b_is_refused_before_downloading_and_force_downloads_anyway(
    ram_24gb: None, standin: StandinHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = invoke("pull", "llama3-70b")
    assert res.exit_code == 1
    assert "this model needs about 4" in one_line(res.stderr)
    assert standin.bytes_served == 0
    # --force: a registry entry that claims 40 GB for a small file on the stand-in is downloaded anyway
    registry = {"big": model_fields(REPO, "big-Q4_K_M.gguf", SMALL, size=40 * GIB, params="70B")}
    monkeypatch.setenv("SPECCHAT_MODELS", str(write_registry(tmp_path / "models.toml", registry)))
    standin.add(REPO, "big-Q4_K_M.gguf", SMALL)
    assert invoke("pull", "big").exit_code == 1 and standin.bytes_served == 0
    res = invoke("pull", "big", "--force")
    assert res.exit_code == 0, res.stderr
    assert standin.bytes_served == len(SMALL)


def test_pull_with_draft_checks_the_pair_and_each_model_alone_otherwise(
    ram_24gb: None, standin: StandinHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = {
        "t": model_fields(REPO, "t-Q4_K_M.gguf", SMALL, size=12 * GIB, params="20B", draft="d"),
        "d": model_fields(REPO, "d-Q4_K_M.gguf", SMALL, size=9 * GIB, params="14B"),
    }
    monkeypatch.setenv("SPECCHAT_MODELS", str(write_registry(tmp_path / "models.toml", registry)))
    standin.add(REPO, "t-Q4_K_M.gguf", SMALL)
    standin.add(REPO, "d-Q4_K_M.gguf", SMALL)
    res = invoke("pull", "t", "--with-draft")
    assert res.exit_code == 1 and "the model and its draft need" in one_line(res.stderr)
    assert standin.bytes_served == 0
    # each alone fits in 20 GB (the download then stops at the size models.toml claims: not our point)
    invoke("pull", "t", "d")
    assert standin.bytes_served > 0


# --- Hub references: sizes from the Hub's metadata ------------------------------------------------------


@pytest.mark.parametrize("spec", [f"hf:{REPO}/big-Q8_0.gguf", f"{REPO}:Q8_0"])
def test_hub_references_are_sized_from_the_hubs_metadata(
    spec: str, standin: StandinHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin.add(REPO, "big-Q8_0.gguf", SMALL)
    standin.add(REPO, "README.md", b"# big\n")
    monkeypatch.setattr(
        hardware.psutil, "virtual_memory", lambda: SimpleNamespace(total=GIB, available=200 * MIB)
    )
    res = invoke("run", spec, "--no-draft", "-p", "hi")
    assert res.exit_code == 1
    line = one_line(res.stderr)
    assert "this model needs about" in line and "before downloading" in line and "200 MB of RAM" in line
    assert standin.bytes_served == 0 and standin.downloads() == []
    assert standin.requests  # the size was asked for (HEAD of the file, or the repo listing)


def test_an_unreachable_hub_leaves_the_decision_to_the_download(ram_24gb: None, standin: StandinHub) -> None:
    standin.stop()
    res = invoke("run", f"hf:{REPO}/big-Q8_0.gguf", "--no-draft", "-p", "hi")
    assert res.exit_code != 0
    assert "not enough memory" not in res.stderr and "cannot download" in res.stderr


def test_files_on_disk_count_with_their_headers(ram_24gb: None, tiny_target: Path) -> None:
    from specchat.models.loader import fit_before_download
    from specchat.models.registry import resolve
    from specchat.models.registry_toml import load_registry

    reg = load_registry()
    with pytest.raises(NotEnoughMemory, match=r"the model and its draft need about 4\d\.\d GB"):
        fit_before_download([resolve(str(tiny_target), reg), resolve("llama3-70b", reg)], ctx_size=4096)
    fit_before_download([resolve(str(tiny_target), reg)], ctx_size=4096)  # nothing to download: no check
    fit_before_download([resolve("llama3-70b", reg)], ctx_size=4096, force=True)


# --- estimates without a header -------------------------------------------------------------------------


def test_kv_estimate_from_size_is_near_the_real_models() -> None:
    # (file size, params, real KV bytes per token: n_layer x n_head_kv x head_dim x 2 x 2)
    for size, params, real in (
        (42_520_398_464, 70e9, 80 * 8 * 128 * 4),
        (4_920_739_232, 8e9, 32 * 8 * 128 * 4),
        (807_694_464, 1.2e9, 16 * 8 * 64 * 4),
    ):
        est = estimate_from_size("m.gguf", size, 4096, params=params)
        assert 0.75 * real <= est.kv_bytes_per_token <= 1.5 * real
        assert est.weights_bytes == size
    # without a parameter count: from the size and the quantisation in the name
    by_name = estimate_from_size("Llama-3.3-70B-Instruct-Q4_K_M.gguf", 42_520_398_464, 4096)
    assert by_name.kv_bytes_per_token == pytest.approx(80 * 8 * 128 * 4, rel=0.25)
    assert hardware.bits_per_weight("model-q8_0.gguf") == 8.5
    assert hardware.parse_params("270M") == 270e6 and hardware.parse_params("about 7B") is None


# --- the machine's memory -------------------------------------------------------------------------------


def _fp(total_gib: float) -> Footprint:
    model = estimate_from_size("m.gguf", int(total_gib * GIB), 512, params=1e9)
    return Footprint(models=(model,), n_ctx=512, estimated=True)


def test_a_cuda_gpu_is_planned_with_its_free_memory() -> None:
    devices = [
        DeviceMemory("CPU", "EPYC", "cpu", 60 * GIB, 64 * GIB),
        DeviceMemory("CUDA0", "RTX 4090", "gpu", 22 * GIB, 24 * GIB),
    ]
    mem = machine_memory(
        devices, system="Linux", machine="x86_64", ram_available=60 * GIB, ram_total=64 * GIB
    )
    assert (mem.gpu_free, mem.gpu_total, mem.unified) == (22 * GIB, 24 * GIB, False)
    fit_check(_fp(20), gpu_offload=True, vram_bytes=None, force=False, memory=mem)
    with pytest.raises(
        NotEnoughMemory, match=r"only 22\.0 GB of GPU memory free .*24\.0 GB GPU memory \(CUDA0\)"
    ):
        fit_check(_fp(30), gpu_offload=True, vram_bytes=None, force=False, memory=mem)
    fit_check(_fp(30), gpu_offload=False, vram_bytes=None, force=False, memory=mem)  # --gpu-layers 0: RAM


def test_apple_silicon_counts_unified_memory_once() -> None:
    metal = [DeviceMemory("Metal", "Apple M2", "gpu", 21 * GIB, 21 * GIB)]
    mem = machine_memory(metal, system="Darwin", machine="arm64", ram_available=26 * GIB, ram_total=32 * GIB)
    assert mem.unified and "shared with the GPU" in mem.describe()
    fit_check(_fp(18), gpu_offload=True, vram_bytes=None, force=False, memory=mem)
    # 24 GB is within RAM available but beyond what Metal may use of it; never RAM + GPU (47 GB)
    with pytest.raises(NotEnoughMemory, match=r"only 21\.0 GB of unified memory available"):
        fit_check(_fp(24), gpu_offload=True, vram_bytes=None, force=False, memory=mem)


def test_no_gpu_means_ram_only() -> None:
    mem = machine_memory(
        [DeviceMemory("CPU", "EPYC", "cpu", 20 * GIB, 24 * GIB)], ram_available=20 * GIB, ram_total=24 * GIB
    )
    assert mem.gpu_total is None and "no GPU memory" in mem.describe()


def test_llama_cpp_reports_its_devices() -> None:
    devices = device_memory()
    assert devices, "the build exports ggml_backend_dev_* (bound with ctypes in engine.py)"
    cpu = [d for d in devices if d.kind == "cpu"]
    assert cpu and cpu[0].total_bytes > 0
