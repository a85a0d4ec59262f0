"""The llama.cpp build self-check: verdicts from a probe that crashes, computes wrong numbers or passes,
the rebuild command for this CPU, the install decision, the run-time refusal and doctor's report.

Nothing here rebuilds anything: probes are small child processes (or a fake runner), rebuilds a fake.
One test runs the real probe on this machine and expects it to pass.
"""

from __future__ import annotations

import json
import platform
import sys

import pytest
from typer.testing import CliRunner

from specchat.cli import app
from specchat.llama import build, buildcheck
from specchat.llama.buildcheck import CRASHED, NOT_RUN, PASS, WRONG, CheckResult

IDENT = {"key": "testbuild0000", "version": "0.3.99", "libraries": []}

AVX512 = "avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi avx512_vnni avx512_bf16"
AMX_FLAGS = f"fpu sse4_2 avx avx2 fma f16c bmi2 {AVX512} avx_vnni amx_tile"
CPUINFO_AMX = f"""processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: {AMX_FLAGS} amx_int8 amx_bf16
"""
CPUINFO_AVX2 = """processor\t: 0
model name\t: AMD Ryzen
flags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2
"""


def _case(qtype: str, max_abs: float, scale: float = 4.0, variant: str = "extra buffers, 16 rows"):
    return {"type": qtype, "variant": variant, "max_abs": max_abs, "scale": scale}


def _payload(*cases) -> str:
    return "step Q4_0, extra buffers off, 16 rows\n" + json.dumps({"cases": list(cases)}) + "\n"


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


# --- the verdict from what the child did ------------------------------------------------------------------


def test_a_child_killed_by_sigill_is_a_crash_named_with_its_last_step():
    out = "step Q4_0, extra buffers on, 16 rows\nstep Q4_K, extra buffers on, 16 rows\n"
    status, detail, _ = buildcheck.decide(-4, out, "")
    assert status == CRASHED
    assert detail == "killed by SIGILL during Q4_K, extra buffers on, 16 rows"
    assert buildcheck.decide(132, out, "")[0] == CRASHED  # a shell's 128 + SIGILL


def test_wrong_numbers_beyond_the_tolerance_name_the_type():
    status, detail, cases = buildcheck.decide(0, _payload(_case("Q4_0", 0.1), _case("Q4_K", 5.0)), "")
    assert status == WRONG
    assert detail.startswith("Q4_K extra buffers, 16 rows differs from the reference by 125%")
    assert len(cases) == 2
    status, detail, _ = buildcheck.decide(0, _payload(_case("Q8_0", float("nan"))), "")
    assert (status, detail.endswith("not finite")) == (WRONG, True)


def test_differences_within_the_tolerance_pass():
    status, detail, _ = buildcheck.decide(0, _payload(_case("Q4_0", 0.1), _case("Q4_K", 0.15)), "")
    assert status == PASS
    assert "Q4_0, Q4_K agree" in detail and "3.75%" in detail


def test_a_probe_that_fails_or_hangs_could_not_run():
    status, detail, _ = buildcheck.decide(1, "", "Traceback ...\nImportError: no llama_cpp\n")
    assert (status, detail) == (NOT_RUN, "the probe failed: ImportError: no llama_cpp")
    assert buildcheck.decide(None, "step Q4_0, extra buffers on, 1 row\n", "")[0] == NOT_RUN
    assert buildcheck.decide(0, "no json here\n", "")[0] == NOT_RUN


# --- real child processes: crash, wrong numbers, pass; the verdict is stored per build -------------------


def test_a_probe_that_dies_of_sigill_is_recorded_and_the_caller_survives():
    code = (
        "import os, signal; print('step Q4_K, extra buffers on, 16 rows', flush=True); "
        "os.kill(os.getpid(), signal.SIGILL)"
    )
    result = buildcheck.run_check(command=_child(code), identity=IDENT)
    assert result.status == CRASHED and result.bad
    assert "SIGILL during Q4_K" in result.detail
    assert buildcheck.stored_result(IDENT) == result
    assert buildcheck.stored_result({**IDENT, "key": "another-build"}) is None  # a rebuild is unchecked


@pytest.mark.parametrize(
    ("max_abs", "status"),
    [(9.0, WRONG), (0.04, PASS)],
)
def test_probe_numbers_decide_the_stored_verdict(max_abs, status):
    printed = json.dumps({"cases": [_case("Q4_K", max_abs)]})
    code = f"import sys; print('step Q4_K, extra buffers on, 16 rows'); print({printed!r})"
    result = buildcheck.run_check(command=_child(code), identity=IDENT)
    assert result.status == status
    assert buildcheck.stored_result(IDENT).status == status


def test_the_real_probe_passes_on_this_machine():
    result = buildcheck.run_check(store=False)
    assert result.status == PASS, result.detail
    types = {c["type"] for c in result.cases}
    assert types == set(buildcheck.PROBE_TYPES) == {"Q4_0", "Q8_0", "Q4_K", "Q6_K"}
    if platform.machine() in ("x86_64", "AMD64") and "avx2" in build.cpu_flags(build.read_cpuinfo()):
        assert "CPU_REPACK" in result.buffers  # the probe reached the repacked kernels


# --- the rebuild command ----------------------------------------------------------------------------------


def test_rebuild_flags_from_an_amx_cpu_never_enable_amx_and_keep_user_cmake_args():
    argv, env = buildcheck.rebuild_command(
        "0.3.36",
        cpuinfo=CPUINFO_AMX,
        cmake_args="-DGGML_CUDA=on -DGGML_NATIVE=ON -DGGML_AMX_INT8=ON -DCMAKE_CUDA_ARCHITECTURES=89",
        python="py",
    )
    assert argv == [
        "py", "-m", "pip", "install", "--no-cache-dir", "--force-reinstall", "--no-deps",
        "--no-binary", "llama-cpp-python", "llama-cpp-python==0.3.36",
    ]  # fmt: skip
    args = env["CMAKE_ARGS"].split()
    assert args[0] == "-DGGML_NATIVE=OFF"
    for on in ("AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"):
        assert f"-DGGML_{on}=ON" in args
    assert "-DGGML_AVX_VNNI=ON" in args
    assert not [a for a in args if a.startswith("-DGGML_AMX") and not a.endswith("=OFF")]
    assert "-DGGML_NATIVE=ON" not in args
    assert args[-2:] == ["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=89"]  # the user's, last


def test_rebuild_flags_without_avx512_or_amx():
    _, env = buildcheck.rebuild_command("0.3.36", cpuinfo=CPUINFO_AVX2, cmake_args="")
    args = env["CMAKE_ARGS"].split()
    assert "-DGGML_AVX2=ON" in args and "-DGGML_AVX512=OFF" in args and "-DGGML_AVX_VNNI=OFF" in args
    assert "-DGGML_AMX_TILE=OFF" in args
    # AVX512 needs F, CD, VL, DQ and BW (what -DGGML_AVX512 compiles for): a CPU with F alone gets OFF
    partial = CPUINFO_AVX2.replace("bmi2", "bmi2 avx512f avx512cd")
    assert "-DGGML_AVX512=OFF" in build.cmake_flags(partial)


def test_the_first_patched_build_on_an_amx_cpu_names_its_flags_and_leaves_amx_out():
    # AMX kernels are not batch-invariant and crash on VMs that list AMX: skip them from the start,
    # with the same flags (and so the same wheel-cache key) the self-check's rebuild would use
    first = build.first_build_args("-DGGML_CUDA=on", cpuinfo=CPUINFO_AMX, x86=True)
    _, env = buildcheck.rebuild_command("0.3.36+specchat.a", cpuinfo=CPUINFO_AMX, cmake_args="-DGGML_CUDA=on")
    assert first == env["CMAKE_ARGS"]
    assert "-DGGML_AMX_INT8=OFF" in first.split() and first.split()[-1] == "-DGGML_CUDA=on"
    # no AMX listed, another OS, or the user chose native/AMX: the user's CMAKE_ARGS go through as they are
    assert build.first_build_args("-DGGML_CUDA=on", cpuinfo=CPUINFO_AVX2, x86=True) == "-DGGML_CUDA=on"
    assert build.first_build_args("", cpuinfo=CPUINFO_AMX, x86=False) == ""
    assert build.first_build_args("-DGGML_NATIVE=ON", cpuinfo=CPUINFO_AMX, x86=True) == "-DGGML_NATIVE=ON"
    assert build.first_build_args("-DGGML_AMX_INT8=ON", cpuinfo=CPUINFO_AMX, x86=True) == "-DGGML_AMX_INT8=ON"


def test_every_patched_build_has_the_rpc_backend_unless_the_user_says_otherwise():
    # `specchat worker` and `--rpc` need ggml-rpc from the same patched build, on every platform
    assert build.with_rpc("") == "-DGGML_RPC=ON"
    assert build.with_rpc("-DGGML_CUDA=on") == "-DGGML_CUDA=on -DGGML_RPC=ON"
    assert build.with_rpc("-DGGML_RPC=OFF") == "-DGGML_RPC=OFF"
    assert build.with_rpc("-DGGML_RPC:BOOL=ON -DGGML_CUDA=on") == "-DGGML_RPC:BOOL=ON -DGGML_CUDA=on"
    first = build.build_args("-DGGML_CUDA=on")
    assert first.split()[-1] == "-DGGML_RPC=ON" and "-DGGML_CUDA=on" in first.split()
    # the self-check's rebuild of a patched build goes through `build install --force`, which adds RPC
    # to its CMAKE_ARGS the same way: the same flags as the first build, so the same wheel-cache key
    _, env = buildcheck.rebuild_command("0.3.36+specchat.a", cpuinfo=CPUINFO_AMX, cmake_args="-DGGML_CUDA=on")
    amx_first = build.with_rpc(build.first_build_args("-DGGML_CUDA=on", cpuinfo=CPUINFO_AMX, x86=True))
    assert build.build_args(env["CMAKE_ARGS"]) == amx_first


def test_a_cached_wheel_built_without_rpc_is_never_handed_to_a_build_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_BUILD_CACHE", str(tmp_path))
    patches: list = []
    old_key = build.build_key("0.3.36", patches, "", cpu="avx2")
    (tmp_path / "wheels" / old_key).mkdir(parents=True)
    (tmp_path / "wheels" / old_key / "llama_cpp_python-0.3.36+specchat.x-cp311-linux.whl").write_text("w")
    new_key = build.build_key("0.3.36", patches, build.with_rpc(""), cpu="avx2")
    assert new_key != old_key
    assert build.cached_wheel(old_key) is not None and build.cached_wheel(new_key) is None


# --- the install decision ---------------------------------------------------------------------------------


def _results(*statuses: str):
    queue = [CheckResult(s, f"detail {i}", key="k", version="0.3.36") for i, s in enumerate(statuses)]
    return lambda: queue.pop(0)


def _install(*statuses: str, rebuild_rc: int = 0, **kw):
    said: list[str] = []
    calls: list[tuple[list[str], dict[str, str]]] = []

    def rebuild(argv, env):
        calls.append((argv, env))
        return rebuild_rc

    rc = buildcheck.install(
        check=_results(*statuses), rebuild=rebuild, say=said.append, cpuinfo=CPUINFO_AMX,
        cmake_args="-DGGML_CUDA=on", **kw,
    )  # fmt: skip
    return rc, said, calls


def test_install_keeps_a_build_that_passes():
    rc, said, calls = _install(PASS, rebuildable=True)
    assert (rc, calls) == (0, [])
    assert said == ["llama.cpp build check: pass — detail 0"]


def test_install_rebuilds_a_crashing_build_once_and_checks_again():
    rc, said, calls = _install(CRASHED, PASS, rebuildable=True)
    assert rc == 0 and len(calls) == 1
    argv, env = calls[0]
    assert "--no-cache-dir" in argv and argv[-1] == "llama-cpp-python==0.3.36"
    assert "-DGGML_CUDA=on" in env["CMAKE_ARGS"] and "-DGGML_NATIVE=OFF" in env["CMAKE_ARGS"]
    assert len(said) == 3 and said[1].startswith("rebuilding llama-cpp-python 0.3.36 for this CPU")
    assert said[2] == "llama.cpp build check: pass — detail 1"


def test_install_says_what_to_do_when_the_rebuild_does_not_help():
    rc, said, _ = _install(WRONG, WRONG, rebuildable=True)
    assert rc == 1
    assert said[-1].startswith("the rebuilt llama.cpp still fails its check")
    assert "-DGGML_AVX512=OFF" in said[-1]
    rc, said, _ = _install(CRASHED, rebuild_rc=1, rebuildable=True)
    assert rc == 1 and "still fails" in said[-1]


def test_install_on_macos_only_checks():
    rc, said, calls = _install(CRASHED, rebuildable=False)
    assert (rc, calls) == (1, [])
    assert said[-1].startswith("specchat will refuse this build; rebuild llama-cpp-python")
    assert "CMAKE_ARGS=-DGGML_CUDA=on " in said[-1] and "GGML_AVX" not in said[-1]  # no x86 flags there


def test_install_dry_run_shows_the_decision_and_the_command_without_running_it():
    rc, said, calls = _install(CRASHED, rebuildable=True, dry_run=True)
    assert (rc, calls) == (1, [])
    assert said[-1].startswith("would rebuild llama-cpp-python 0.3.36") and "--no-cache-dir" in said[-1]
    rc, said, calls = _install(PASS, rebuildable=True, dry_run=True)
    assert (rc, calls) == (0, []) and said[-1].startswith("nothing to rebuild")


def test_only_x86_linux_rebuilds_automatically():
    assert buildcheck.can_rebuild("Linux", "x86_64")
    assert not buildcheck.can_rebuild("Darwin", "arm64")
    assert not buildcheck.can_rebuild("Linux", "aarch64")


# --- run time: refusal in the loader, the verdict in doctor -----------------------------------------------


def _record_current(status: str) -> CheckResult:
    ident = buildcheck.build_identity()
    result = CheckResult(status, "killed by SIGILL during Q4_K, extra buffers on, 16 rows", key=ident["key"],
                         version=ident["version"], checked_at=1.0, buffers=("AMX",))  # fmt: skip
    buildcheck.record(result)
    return result


def test_run_refuses_a_build_recorded_as_bad_with_one_line(tiny_target):
    _record_current(CRASHED)
    res = CliRunner().invoke(app, ["run", str(tiny_target), "--no-draft", "-p", "hi", "-n", "2"])
    assert res.exit_code == 1
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "failed its self-check (crashed: killed by SIGILL" in lines[0]
    # the fix rebuilds this build the way make install would: specchat's patched build anew, a stock
    # one from source without pip's wheel cache
    patched = "+specchat." in buildcheck.build_identity()["version"]
    rebuild = "specchat.llama.build install --force" if patched else "--no-cache-dir"
    assert "make install" in lines[0] and rebuild in lines[0]


def test_an_unchecked_or_passing_build_is_used(tiny_target):
    args = [
        "run",
        str(tiny_target),
        "--no-draft",
        "-p",
        "hi",
        "-n",
        "2",
        "--threads",
        "1",
        "--ctx-size",
        "128",
    ]
    assert CliRunner().invoke(app, args).exit_code == 0  # never checked
    _record_current(PASS)
    assert CliRunner().invoke(app, args).exit_code == 0


def test_doctor_shows_the_check_and_its_result():
    res = CliRunner().invoke(app, ["doctor", "--offline", "--json"])
    check = json.loads(res.stdout)["build_check"]
    assert check["status"] == "not checked" and check["name"] == buildcheck.CHECK_NAME
    _record_current(CRASHED)
    check = json.loads(CliRunner().invoke(app, ["doctor", "--offline", "--json"]).stdout)["build_check"]
    assert check["status"] == CRASHED and check["buffers"] == ["AMX"] and "make install" in check["fix"]
    text = CliRunner().invoke(app, ["doctor", "--offline"], env={"COLUMNS": "300"}).stdout
    assert "self-check" in text and "crashed · quantised-matmul self-check" in text


# --- a stock llama-cpp-python (pip install . outside the Makefile): used, with one line saying so --------


#: `run` with the tiny target (appended) at its quickest: no drafts, two tokens
RUN_TWO_TOKENS = ["run", "--no-draft", "-p", "hi", "-n", "2", "--threads", "1", "--ctx-size", "128"]


def _stock(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Make the installed build look like stock llama-cpp-python at the pinned release (the version is
    what tells them apart; a key of its own, as a reinstall would give)."""
    ident = {"key": "stockbuild00", "version": build.PINNED, "libraries": []}
    monkeypatch.setattr(buildcheck, "build_identity", lambda: ident)
    return ident


def test_a_stock_build_runs_with_one_warning_line_naming_the_fix(tiny_target, monkeypatch):
    """A warning, not a refusal, --strict included (why: installed.Installed.warning)."""
    _stock(monkeypatch)
    args = [*RUN_TWO_TOKENS, str(tiny_target)]
    for extra in ([], ["--strict"]):
        res = CliRunner().invoke(app, [*args, *extra], env={"COLUMNS": "400"})
        assert res.exit_code == 0, res.output
        said = [ln for ln in res.stderr.splitlines() if "llama-cpp-python" in ln]
        assert len(said) == 1, res.stderr
        stock = f"stock llama-cpp-python {build.PINNED} (no llama.cpp patch queue)"
        assert said[0].startswith(f"warning: {stock}: ")
        assert "make install" in said[0] and "Traceback" not in res.stderr


def test_the_patched_build_loads_without_a_word_about_it(tiny_target):
    if buildcheck.installed_build().kind != "patched":
        pytest.skip("this environment's llama-cpp-python is not this checkout's patched build")
    args = [*RUN_TWO_TOKENS, str(tiny_target)]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert "llama-cpp-python" not in res.stderr


def test_doctor_says_which_build_is_installed(monkeypatch):
    def shown() -> dict[str, object]:
        report = json.loads(CliRunner().invoke(app, ["doctor", "--offline", "--json"]).stdout)
        return report["build_check"]["build"]

    real = buildcheck.installed_build()
    said = shown()
    assert (said["kind"], said["version"], said["line"]) == (real.kind, real.version, real.line())
    _stock(monkeypatch)
    said = shown()
    assert (said["kind"], said["version"], said["queue"]) == ("stock", build.PINNED, None)
    assert "make install" in str(said["fix"])
    text = CliRunner().invoke(app, ["doctor", "--offline"], env={"COLUMNS": "300"}).stdout
    assert f"stock llama-cpp-python {build.PINNED} (no llama.cpp patch queue)" in text
    assert "python -m specchat.llama.build install" in text
