"""`make test-aarch64`: the patch queue's promise checked for ARM CPUs, on this x86 machine, under
qemu-aarch64 user emulation (`-cpu max`: dotprod, i8mm, SVE, fp16).

    python -m tests.aarch64.run [--vector-bits 256] [--min-rows 16] [--if-available] [--time-budget S]

Steps: install Debian's aarch64 cross compilers and qemu-user when they are missing (apt-get, once);
cross-compile llama.cpp with the queue (cross_build, cached); set up an aarch64 CPython with numpy and
llama_cpp (runtime, cached); then, emulated:
  1. the ARM kernel tests (test_arm_kernels.py) at 128-, 256- and 512-bit SVE vectors;
  2. specchat's batch-invariance probe (`python -m specchat.llama.invariance probe`, unchanged), whose
     verdict line is printed as it is: 'verify batches: bit-exact up to N rows (...)';
  3. greedy_equal.py on the tiny test models: the defaults and forced verify widths against plain
     decoding, token for token.
Exit status 0 when every step passed and the probe showed at least --min-rows rows exact; 1 otherwise;
2 when the tools cannot be had. With --if-available (CI) what this machine cannot do is a note and
exit status 0, never a failure: no apt-get or qemu, no arm64 packages, or a build and emulated steps
that do not finish within --time-budget (a slow machine); a kernel test, probe or output that parts
still fails, and so does a queue that does not compile for aarch64.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from specchat.llama import invariance

from .cross_build import ARCHES, CXX, BuildTimeout, CrossBuildError, build_libraries
from .runtime import RuntimeSetupError, qemu_command, site_packages, sysroot

ROOT = Path(__file__).resolve().parents[2]
#: Debian packages that provide the tools (cross compilers with their arm64 libc, qemu-aarch64)
APT_PACKAGES = ("gcc-aarch64-linux-gnu", "g++-aarch64-linux-gnu", "qemu-user")
TOOLS = (CXX, "qemu-aarch64", "cmake", "dpkg", "apt-get")
#: SVE vector lengths the kernel tests run at, in bytes (Neoverse V2 / Graviton4, V1 / Graviton3, qemu's own)
KERNEL_VECTORS = (16, 32, 64)
#: wall-clock limits for the emulated steps (qemu runs the probe ~20-50x slower than the host would):
#: the probe and the greedy check together, and each kernel-test run
PROBE_TIMEOUT = 5400.0
STEP_TIMEOUT = 1800.0


def say(text: str) -> None:
    print(text, flush=True)


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def install_tools() -> list[str]:
    """apt-get install the cross compilers and qemu-user when missing (as root, or with sudo -n);
    returns what is still missing."""
    if not missing_tools():
        return []
    sudo: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            return missing_tools()
        sudo = ["sudo", "-n"]
    if shutil.which("apt-get") is not None:
        say(f"installing {' '.join(APT_PACKAGES)} (apt-get, once)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env, "check": False}
        if shutil.which(CXX) is None or shutil.which("qemu-aarch64") is None:
            subprocess.run([*sudo, "apt-get", "update", "-qq"], **quiet)  # type: ignore[call-overload]
        subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", *APT_PACKAGES], **quiet)  # type: ignore[call-overload]
    return missing_tools()


def _emulated(
    root: Path,
    site: Path,
    argv: Sequence[str],
    *,
    vector_bytes: int,
    timeout: float,
    log: Path,
    progress: str = "",
) -> tuple[int, str]:
    """Run `python3.11 argv` under qemu-aarch64 from the repository root; (exit status, its stdout; 124
    when it ran past `timeout` and was stopped). Everything it prints goes to `log`; with `progress`,
    its `step ...` lines are shown as they come, so an emulated run of half an hour says where it is."""
    cmd = qemu_command(root, site, argv, vector_bytes=vector_bytes, extra_path=(ROOT,))
    start = time.monotonic()
    lines: list[str] = []
    with log.open("w") as handle:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=handle, text=True)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None  # a pipe was asked for
            for line in proc.stdout:
                lines.append(line)
                if progress and line.startswith("step "):
                    say(f"  {progress} {time.monotonic() - start:5.0f} s: {line[5:].rstrip()}")
            rc = proc.wait()
        finally:
            timer.cancel()
        handle.write("\n--- stdout ---\n" + "".join(lines))
    timed_out = rc != 0 and time.monotonic() - start >= timeout
    return (124 if timed_out else rc), "".join(lines)


def _last_line(text: str, prefix: str = "") -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.startswith(prefix)]
    return lines[-1] if lines else ""


def kernel_tests(root: Path, site: Path, logs: Path) -> bool:
    ok = True
    for vb in KERNEL_VECTORS:
        argv = [
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            "tests/aarch64",
            "-c",
            os.devnull,
            "--confcutdir",
            "tests/aarch64",
            "tests/aarch64/test_arm_kernels.py",
        ]
        start = time.monotonic()
        rc, out = _emulated(
            root, site, argv, vector_bytes=vb, timeout=STEP_TIMEOUT, log=logs / f"kernels-{vb * 8}.log"
        )
        summary = _last_line(out) or f"exit status {rc}"
        say(f"kernel tests, {vb * 8}-bit SVE: {summary} ({time.monotonic() - start:.0f} s)")
        ok = ok and rc == 0
    return ok


def probe(root: Path, site: Path, logs: Path, vector_bytes: int, timeout: float) -> invariance.Invariance:
    start = time.monotonic()
    argv = ["-m", "specchat.llama.invariance", "probe"]
    rc, out = _emulated(
        root, site, argv, vector_bytes=vector_bytes, timeout=timeout, log=logs / "probe.log", progress="probe"
    )
    if rc == 124:
        result = invariance.Invariance("could not run", 0, f"the probe did not finish within {timeout:.0f} s")
    else:
        result = invariance.from_output(rc, out, "")
    say(f"probe ({vector_bytes * 8}-bit SVE, {time.monotonic() - start:.0f} s):")
    say(result.line())
    return result


def greedy(root: Path, site: Path, logs: Path, vector_bytes: int, verified: int, timeout: float) -> int:
    """greedy_equal.py's exit status (124: it did not finish within `timeout`)."""
    from tests.tiny_models import CLOSE_DRAFT_EPS, TARGET_SEED, write_tiny_llama

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specchat-aarch64-models-") as tmp:
        target = write_tiny_llama(Path(tmp) / "target.gguf", seed=TARGET_SEED)
        draft = write_tiny_llama(
            Path(tmp) / "draft.gguf", seed=2, perturb_from=(TARGET_SEED, CLOSE_DRAFT_EPS)
        )
        argv = ["-m", "tests.aarch64.greedy_equal", str(target), str(draft), "--verified", str(verified)]
        rc, out = _emulated(
            root, site, argv, vector_bytes=vector_bytes, timeout=timeout, log=logs / "greedy.log"
        )
    for line in out.strip().splitlines():
        say(f"  {line}")
    verdict = {0: "yes", 124: f"not checked (did not finish within {timeout:.0f} s)"}.get(rc, "NO")
    say(f"default equals --no-draft on the tiny models: {verdict} ({time.monotonic() - start:.0f} s)")
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="specchat's ARM exactness checks under qemu-aarch64")
    parser.add_argument(
        "--vector-bits",
        type=int,
        default=256,
        choices=(128, 256, 512),
        help="SVE vector length of the emulated CPU for the probe and the greedy check",
    )
    parser.add_argument(
        "--arch",
        default="sve",
        choices=sorted(ARCHES),
        help="the build's extensions: sve (dotprod, i8mm, SVE, fp16), neon (no SVE), dotprod (no i8mm, SVE)",
    )
    parser.add_argument(
        "--min-rows", type=int, default=16, help="fail unless the probe shows this many rows exact"
    )
    parser.add_argument(
        "--if-available",
        action="store_true",
        help="a note and exit status 0, not a failure, when apt-get, qemu or the aarch64 packages cannot "
        "be had or the build and the emulated steps do not finish within --time-budget (CI)",
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=PROBE_TIMEOUT,
        help="seconds for the emulated steps, all together",
    )
    args = parser.parse_args(argv)
    missing = install_tools()
    if missing:
        say(
            f"note: cannot run the aarch64 checks: {', '.join(missing)} missing; install "
            f"{' '.join(APT_PACKAGES)} (Debian/Ubuntu) and run `make test-aarch64` again"
        )
        return 0 if args.if_available else 2
    vector_bytes = args.vector_bits // 8
    start = time.monotonic()
    deadline = start + args.time_budget
    try:
        libs = build_libraries(arch=ARCHES[args.arch], timeout=args.time_budget, say=say)
        root = sysroot(say=say)
        site = site_packages(libs, say=say)
    except BuildTimeout as exc:
        say(f"{'note' if args.if_available else 'error'}: {exc}")
        return 0 if args.if_available else 1
    except CrossBuildError as exc:  # the queue does not build for aarch64: a failure wherever it runs
        say(f"error: {exc}")
        return 1
    except RuntimeSetupError as exc:
        say(f"{'note' if args.if_available else 'error'}: cannot set up the aarch64 runtime: {exc}")
        return 0 if args.if_available else 1
    logs = Path(tempfile.mkdtemp(prefix="specchat-aarch64-logs-"))
    say(f"aarch64 build and runtime ready ({time.monotonic() - start:.0f} s); emulated logs in {logs}")
    kernels_ok = kernel_tests(root, site, logs)
    result = probe(root, site, logs, vector_bytes, max(1.0, deadline - time.monotonic()))
    out_of_time = result.status == "could not run" and "did not finish" in result.breaks
    exact = result.exact_rows if result.status in ("pass", "fail") else 0
    greedy_rc = (
        124
        if out_of_time
        else greedy(root, site, logs, vector_bytes, exact, max(1.0, deadline - time.monotonic()))
    )
    out_of_time = out_of_time or greedy_rc == 124
    parted = not kernels_ok or result.status == "fail" or greedy_rc not in (0, 124)
    if out_of_time and args.if_available and not parted:
        say(
            f"note: the emulated checks did not finish within {args.time_budget:.0f} s on this machine: "
            "not checked (run `make test-aarch64` without a budget)"
        )
        return 0
    if exact < args.min_rows:
        say(f"the probe showed {exact} rows exact; at least {args.min_rows} are required")
    steps = (kernels_ok, exact >= args.min_rows, greedy_rc == 0)
    say(f"aarch64 checks done in {time.monotonic() - start:.0f} s (kernel tests, probe, greedy equality)")
    say(f"aarch64: {sum(steps)} passed, {len(steps) - sum(steps)} failed")
    return 0 if all(steps) else 1


if __name__ == "__main__":
    sys.exit(main())
