"""The `make test-aarch64` harness on the host, without building or emulating anything: the cross build's
options and cache key, the qemu command line, and what the runner does when its tools cannot be had."""

from __future__ import annotations

from pathlib import Path

import pytest

from specchat.llama import build, invariance

from . import cross_build, run, runtime


def test_the_toolchain_file_targets_aarch64_linux_with_the_cross_compilers():
    text = cross_build.toolchain_file()
    assert "set(CMAKE_SYSTEM_NAME Linux)" in text
    assert "set(CMAKE_SYSTEM_PROCESSOR aarch64)" in text
    assert f"set(CMAKE_CXX_COMPILER {cross_build.CXX})" in text
    assert "CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY" in text


def test_the_build_names_every_arm_extension_and_no_native_detection():
    args = cross_build.cmake_args(cross_build.SVE_ARCH)
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_CPU_ALL_VARIANTS=OFF" in args
    assert f"-DGGML_CPU_ARM_ARCH={cross_build.SVE_ARCH}" in args
    assert {"dotprod", "i8mm", "sve", "fp16"} <= set(cross_build.SVE_ARCH.split("+")[1:])
    assert "sve" not in cross_build.NEON_ARCH.split("+")
    assert "-DLLAMA_CURL=OFF" in args and "-DBUILD_SHARED_LIBS=ON" in args


def test_the_cache_key_changes_with_the_queue_the_arch_and_the_compiler(tmp_path: Path):
    one, two = tmp_path / "0001-a.patch", tmp_path / "0002-b.patch"
    one.write_text("a\n")
    two.write_text("b\n")
    key = cross_build.build_key([one], cross_build.SVE_ARCH, "gcc 12")
    assert key == cross_build.build_key([one], cross_build.SVE_ARCH, "gcc 12")
    others = {
        cross_build.build_key([one, two], cross_build.SVE_ARCH, "gcc 12"),
        cross_build.build_key([one], cross_build.NEON_ARCH, "gcc 12"),
        cross_build.build_key([one], cross_build.SVE_ARCH, "gcc 13"),
    }
    assert key not in others and len(others) == 3
    one.write_text("a, changed\n")
    assert cross_build.build_key([one], cross_build.SVE_ARCH, "gcc 12") != key


def test_the_queue_patches_the_arm_kernels_this_harness_checks():
    touched = "+++ b/ggml/src/ggml-cpu/arch/arm/repack.cpp"
    assert any(touched in p.read_text() for p in build.patch_queue()), [p.name for p in build.patch_queue()]


def test_the_cache_lives_outside_the_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.delenv("SPECCHAT_AARCH64_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cross_build.cache_root() == tmp_path / "specchat" / "aarch64"
    monkeypatch.setenv("SPECCHAT_AARCH64_CACHE", str(tmp_path / "elsewhere"))
    assert cross_build.cache_root() == tmp_path / "elsewhere"
    assert cross_build.cached("0" * 16) is None  # nothing built there


def test_the_qemu_command_runs_the_sysroots_python_with_the_site_first(tmp_path: Path):
    root, site = tmp_path / "sysroot", tmp_path / "site"
    cmd = runtime.qemu_command(root, site, ["-m", "x"], vector_bytes=32, extra_path=(tmp_path / "repo",))
    assert cmd[:5] == ["qemu-aarch64", "-cpu", "max,sve-default-vector-length=32", "-L", str(root)]
    assert f"PYTHONPATH={site}:{tmp_path / 'repo'}" in cmd
    assert cmd[-3:] == [str(root / "usr" / "bin" / "python3.11"), "-m", "x"]
    assert runtime.qemu_command(root, site, [])[2] == "max"


@pytest.mark.parametrize(("flag", "status"), [([], 2), (["--if-available"], 0)])
def test_without_its_tools_the_runner_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: list[str], status: int
):
    monkeypatch.setattr(run, "install_tools", lambda: ["qemu-aarch64"])
    assert run.main(flag) == status
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("note: cannot run the aarch64 checks: qemu-aarch64 missing")
    assert "qemu-user" in out[0]


def _steps(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, verdict: invariance.Invariance, greedy_rc: int
) -> None:
    """The runner with its build, runtime and emulated steps replaced by their outcomes."""
    monkeypatch.setattr(run, "install_tools", lambda: [])
    monkeypatch.setattr(run.tempfile, "mkdtemp", lambda prefix: str(tmp_path))  # the logs' folder
    monkeypatch.setattr(run, "build_libraries", lambda **_: tmp_path)
    monkeypatch.setattr(run, "sysroot", lambda **_: tmp_path)
    monkeypatch.setattr(run, "site_packages", lambda libs, **_: tmp_path)
    monkeypatch.setattr(run, "kernel_tests", lambda *_: True)
    monkeypatch.setattr(run, "probe", lambda *_: verdict)
    monkeypatch.setattr(run, "greedy", lambda *_: greedy_rc)


@pytest.mark.parametrize(("flag", "status"), [([], 1), (["--if-available"], 0)])
def test_a_probe_out_of_time_is_a_note_only_where_allowed(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flag: list[str],
    status: int,
):
    slow = invariance.Invariance("could not run", 0, "the probe did not finish within 60 s")
    _steps(monkeypatch, tmp_path, slow, 0)
    assert run.main([*flag, "--time-budget", "60"]) == status
    assert ("note: the emulated checks did not finish" in capsys.readouterr().out) == bool(flag)


def test_a_probe_that_parts_fails_even_where_slowness_is_allowed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    _steps(monkeypatch, tmp_path, invariance.Invariance("fail", 3, "Q4_K (repacked) from 4 rows"), 0)
    assert run.main(["--if-available"]) == 1
    _steps(monkeypatch, tmp_path, invariance.Invariance("fail", 3, "Q4_K (repacked) from 4 rows"), 124)
    assert run.main(["--if-available"]) == 1  # parted, then ran out of time: still a failure
    _steps(monkeypatch, tmp_path, invariance.Invariance("pass", 49), 1)  # the outputs differ
    assert run.main(["--if-available"]) == 1
    _steps(monkeypatch, tmp_path, invariance.Invariance("pass", 49), 0)
    assert run.main([]) == 0


def test_the_last_line_counts_the_steps(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    _steps(monkeypatch, tmp_path, invariance.Invariance("fail", 3, "Q4_K (repacked) from 4 rows"), 0)
    run.main([])
    assert capsys.readouterr().out.strip().splitlines()[-1] == "aarch64: 2 passed, 1 failed"
